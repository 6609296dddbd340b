"""The result of one epoch: the dTSSBP tree after inference at epoch t."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import scipy.sparse as sp

from streamtree.events import Events
from streamtree.window import subtree_sums
from streamtree.wording import counted


@dataclass(frozen=True)
class EpochTree:
    """One epoch's topic tree.

    All per-node arrays are aligned: entry ``k`` of each describes node ``node_ids[k]``.
    Nodes are listed in depth-first pre-order with children in stick order, so the root
    is first and a parent always precedes its children.

    Attributes
    ----------
    epoch : int
        Index of the epoch (0, 1, 2, ... in the order epochs were fitted).
    node_ids : ndarray of int64, shape (K,)
        Persistent node ids; an id is never reused for another node. Ids follow content: a
        node whose content changed beyond recognition gets a new id (the old one dies), and an
        id moves to the node now holding most of its documents when the moves took them
        elsewhere (the identity rule, README "Inference, per epoch").
    parent : ndarray of int64, shape (K,)
        Parent node id, ``-1`` for the root.
    depth : ndarray of int64, shape (K,)
        Depth of each node, root at 0.
    mass : ndarray of float64, shape (K,)
        Stick-breaking mass pi of each node (posterior-mean sticks at the end of the epoch).
        Sums to at most 1; the rest is the mass of not-yet-seen nodes.
    counts : ndarray of int64, shape (K,)
        Documents of this epoch assigned to the node itself.
    subtree_counts : ndarray of int64, shape (K,)
        Documents of this epoch assigned to the node or any descendant.
    window_counts : ndarray of int64, shape (K,)
        Documents at the node summed over the stick window (past epochs plus this one), as the
        model fitted them: where repeated texts are fitted once and their copies published
        (:meth:`with_copies`), each text once, so fewer than :attr:`counts` can hold.
    theta : ndarray of float64, shape (K, p)
        Node parameters: unit mean directions (vMF), means (Gaussian) or word distributions
        (multinomial).
    concentration : ndarray of float64, shape (K,)
        Per-node vMF concentration beta; for the Gaussian likelihood the observation
        precision 1 / sigma_x**2; for the multinomial the node's parent-link strength.
    born : ndarray of int64, shape (K,)
        Epoch in which each node was created.
    assignments : ndarray of int64, shape (n_documents,)
        Node id of each row of the epoch's input matrix.
    died : ndarray of int64
        Ids of nodes alive at the previous epoch that are gone after this one, those that merged
        into another included (the data model: they are gone from the tree); the views count a
        merge as the node's end, not also as a death (:attr:`merged`, :attr:`died_unmerged`).
    label : str or None
        Optional human label of the epoch (e.g. ``"1790s"``).
    events : Events
        The epoch's events (:mod:`streamtree.events`): births, deaths and parent changes
        against the previous epoch's tree, and the splits and merges the sampler accepted
        that the trees show (a node of this tree split from another; a node of the previous
        tree merged into another).
    """

    epoch: int
    node_ids: np.ndarray
    parent: np.ndarray
    depth: np.ndarray
    mass: np.ndarray
    counts: np.ndarray
    subtree_counts: np.ndarray
    window_counts: np.ndarray
    theta: np.ndarray
    concentration: np.ndarray
    born: np.ndarray
    assignments: np.ndarray
    died: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    label: str | None = None
    events: Events = field(default_factory=Events.empty)

    @property
    def n_nodes(self) -> int:
        return int(self.node_ids.shape[0])

    @property
    def n_occupied(self) -> int:
        """Nodes holding documents of this epoch, themselves or below them. The others are
        alive only through the stick window's past documents and die when those leave it."""
        return int(np.count_nonzero(self.subtree_counts))

    @property
    def merged(self) -> dict[int, int]:
        """The nodes of the previous tree that merged into another in this epoch, each with the
        node it merged into (from :attr:`events`: none when they hold no merges)."""
        merges = self.events.event == "merged_into"
        return dict(zip(self.events.node_id[merges].tolist(), self.events.other_id[merges].tolist()))

    @property
    def died_unmerged(self) -> np.ndarray:
        """:attr:`died` less the nodes that merged into another: the deaths the views count
        (``streamtree show``, the report, :meth:`format`), a merge being the node's end."""
        merged = self.merged
        if not merged:
            return self.died
        return self.died[np.fromiter((int(n) not in merged for n in self.died.tolist()), dtype=bool, count=self.died.size)]

    def with_copies(self, source: np.ndarray) -> "EpochTree":
        """This tree over more documents, each a copy of one it was fitted on: document ``r`` of
        the result is at the node of this tree's document ``source[r]``. :attr:`counts` and
        :attr:`subtree_counts` count every document of the result; the fit's own figures
        (:attr:`mass`, :attr:`window_counts`, the parameters) are this tree's."""
        assignments = np.asarray(self.assignments)[np.asarray(source, dtype=np.int64)]
        counts = np.bincount(self._rows(assignments, "documents are at"), minlength=self.n_nodes).astype(np.int64)
        parent_index = np.full(self.n_nodes, -1, dtype=np.int64)
        has_parent = self.parent >= 0
        parent_index[has_parent] = self._rows(self.parent[has_parent], "nodes have as parents")
        return replace(self, assignments=assignments, counts=counts,
                       subtree_counts=subtree_sums(parent_index, counts).astype(np.int64))

    def index_of(self, node_id: int) -> int:
        """Row of ``node_id`` in the per-node arrays (KeyError if absent)."""
        hits = np.flatnonzero(self.node_ids == node_id)
        if hits.size == 0:
            raise KeyError(f"node {node_id} is not in the tree of epoch {self.epoch}")
        return int(hits[0])

    def children(self, node_id: int) -> np.ndarray:
        """Ids of the children of ``node_id`` in stick order."""
        return self.node_ids[self.parent == node_id]

    def top_words(self, vocabulary: np.ndarray, n: int = 10) -> list[list[str]]:
        """The ``n`` vocabulary entries with the largest theta weight, per node."""
        vocabulary = np.asarray(vocabulary)
        if vocabulary.shape[0] != self.theta.shape[1]:
            raise ValueError(
                f"vocabulary has {vocabulary.shape[0]} entries but theta has {self.theta.shape[1]} columns"
            )
        n = min(n, self.theta.shape[1])
        top = np.argsort(-self.theta, axis=1, kind="stable")[:, :n]
        return [list(vocabulary[row]) for row in top]

    def _rows(self, node_ids, what: str) -> np.ndarray:
        """The rows of ``node_ids`` in the per-node arrays (a ValueError naming any the tree
        does not hold, and ``what`` refers to them)."""
        ids = np.asarray(node_ids, dtype=np.int64).ravel()
        by_id = np.argsort(self.node_ids)
        rows = by_id[np.minimum(np.searchsorted(self.node_ids, ids, sorter=by_id), self.n_nodes - 1)]
        held = self.node_ids[rows] == ids
        if not held.all():
            unknown = sorted(set(ids[~held].tolist()))
            raise ValueError(f"epoch {self.epoch}: {what} {len(unknown)} node ids the tree does not hold, "
                             f"e.g. {unknown[:5]}")
        return rows.astype(np.int64, copy=False)

    def _below(self, at: np.ndarray, weights: np.ndarray | None = None) -> sp.csr_matrix:
        """(K, len(at)): entry (k, i) is ``weights[i]`` (default 1) when item ``i``, at row
        ``at[i]``, sits at node ``k`` or below it."""
        n_items = at.size
        parent_row = np.full(self.n_nodes, -1, dtype=np.int64)
        has_parent = self.parent >= 0
        parent_row[has_parent] = self._rows(self.parent[has_parent], "nodes have as parents")
        node_rows, item_cols = [], []
        items = np.arange(n_items)
        while at.size:  # each item at its own node, then at each ancestor in turn
            node_rows.append(at)
            item_cols.append(items)
            keep = parent_row[at] >= 0
            at, items = parent_row[at][keep], items[keep]
        rows = np.concatenate(node_rows) if node_rows else np.zeros(0, dtype=np.int64)
        cols = np.concatenate(item_cols) if item_cols else np.zeros(0, dtype=np.int64)
        values = np.ones(cols.size) if weights is None else np.asarray(weights, dtype=np.float64)[cols]
        return sp.csr_matrix((values, (rows, cols)), shape=(self.n_nodes, n_items))

    def _documents_below(self, n_documents: int) -> sp.csr_matrix:
        """(K, n_documents) 0/1: whether document ``i`` sits at node ``k`` or below it."""
        if n_documents != self.assignments.shape[0]:
            raise ValueError(f"X has {n_documents} rows but the tree assigns {self.assignments.shape[0]} documents")
        return self._below(self._rows(self.assignments, "documents are assigned to"))

    def subtree_row_sums(self, X) -> sp.csr_matrix:
        """Per node, the sum of the rows of ``X`` (this epoch's input, one row per document)
        assigned to the node or below it: a sparse (K, p) matrix."""
        X = sp.csr_matrix(X)
        out = sp.csr_matrix(self._documents_below(X.shape[0]) @ X)
        out.sort_indices()
        return out

    def _leaf_thetas(self) -> np.ndarray:
        """Per node, the parameters of the leaves at or below it averaged with their window
        counts as weights (equal weights where those are all 0)."""
        leaves = np.flatnonzero(~np.isin(self.node_ids, self.parent))
        theta = np.asarray(self.theta, dtype=np.float64)[leaves]
        equal = self._below(leaves)  # every node has a leaf at or below it
        out = (equal @ theta) / np.asarray(equal.sum(axis=1)).ravel()[:, None]
        weighted = self._below(leaves, np.asarray(self.window_counts, dtype=np.float64)[leaves])
        total = np.asarray(weighted.sum(axis=1)).ravel()
        counted = total > 0
        out[counted] = (weighted @ theta)[counted] / total[counted, None]
        return out

    def label_words(self, vocabulary: np.ndarray, X, n: int = 10) -> list[list[str]]:
        """Per node, the ``n`` terms that weigh most in this epoch's documents in its subtree:
        the largest column sums of their rows of ``X`` (:meth:`subtree_row_sums`; term counts
        for word distributions); fewer than ``n`` when those documents hold fewer terms.
        Ties go to the term more of those documents hold, then more of the epoch's documents
        (a one-document node lists its common terms first, as a larger node does), then the
        first in vocabulary order: the label is a function of the documents alone, so a node
        and its only child over the same documents read alike. A node whose subtree holds none
        of the epoch's documents (one the stick window keeps) has the largest entries of its
        ``theta`` if it is a leaf, else of the mean ``theta`` of the leaves below it, weighted
        by their window counts.

        These label a node for readers. A word distribution with children is flattened by
        their Dirichlet links: with a link strength below the vocabulary size its mode sits
        near uniform, and where its children also link to their previous-epoch selves its
        small tilt can turn to the terms they lack, so its largest entries are rare terms that
        say nothing of the documents below it (BENCHMARKS.md, "Node labels"). Replay and serve
        publish these for families whose links flatten their nodes
        (``Likelihood.labels_from_documents``)."""
        vocabulary = np.asarray(vocabulary)
        theta = np.asarray(self.theta)
        if vocabulary.shape[0] != theta.shape[1]:
            raise ValueError(f"vocabulary has {vocabulary.shape[0]} entries but theta has {theta.shape[1]} columns")
        X = sp.csr_matrix(X, copy=True)
        X.eliminate_zeros()
        member = self._documents_below(X.shape[0])
        sums = sp.csr_matrix(member @ X)
        held = X.copy()
        held.data = (held.data > 0).astype(np.float64)
        docs = sp.csr_matrix(member @ held)  # documents holding each term, per subtree
        in_epoch = np.asarray(held.sum(axis=0)).ravel()  # and in the whole epoch
        sums.sort_indices()
        docs.sort_indices()
        has_kids = np.isin(self.node_ids, self.parent)
        leaf_thetas = None
        out = []
        for k in range(self.n_nodes):
            lo, hi = sums.indptr[k], sums.indptr[k + 1]
            vals, terms = sums.data[lo:hi], sums.indices[lo:hi]
            keep = vals > 0
            if not keep.any():
                if leaf_thetas is None:
                    leaf_thetas = self._leaf_thetas()
                fallback = leaf_thetas[k] if has_kids[k] else theta[k]
                out.append(list(vocabulary[np.argsort(-fallback, kind="stable")[:n]]))
                continue
            vals, terms = vals[keep], terms[keep]
            d_lo, d_hi = docs.indptr[k], docs.indptr[k + 1]
            d_terms, d_vals = docs.indices[d_lo:d_hi], docs.data[d_lo:d_hi]
            n_docs = d_vals[np.searchsorted(d_terms, terms)]  # every summed term is held by a document
            order = np.lexsort((terms, -in_epoch[terms], -n_docs, -vals))[:n]  # the last key sorts first
            out.append(list(vocabulary[terms[order]]))
        return out

    def format(self, vocabulary: np.ndarray | None = None, top_words: int = 8, min_count: int = 0,
               X=None) -> str:
        """An indented text rendering in the style of the dTSSBP paper's figures.

        Each line: indentation by depth, node id, documents in the subtree, documents at the
        node, mass, and (with a vocabulary) words: each node's :meth:`label_words` given the
        epoch's input ``X`` (as a store shows word distributions), else its theta's largest
        entries (as a store shows vMF directions). ``*`` marks nodes born in this epoch. The
        nodes of the previous epoch that are gone end the text: ``merged: 2 -> 1`` for those
        merged into another, ``died:`` for the others (a merged node is not listed as died too).
        """
        words = None
        if vocabulary is not None:
            words = self.top_words(vocabulary, top_words) if X is None else self.label_words(vocabulary, X, top_words)
        lines = [f"epoch {self.epoch}" + (f" ({self.label})" if self.label else "")
                 + f": {counted(self.n_nodes, 'node')}, {counted(int(self.assignments.shape[0]), 'document')}"]
        for k in range(self.n_nodes):
            if self.subtree_counts[k] < min_count and self.parent[k] != -1:
                continue
            mark = "*" if self.born[k] == self.epoch else " "
            text = (f"{'  ' * int(self.depth[k])}{mark}[{int(self.node_ids[k])}] "
                    f"n={int(self.subtree_counts[k])} own={int(self.counts[k])} mass={self.mass[k]:.3f}")
            if words is not None:
                text += "  " + " ".join(words[k])
            lines.append(text)
        merged, died = self.merged, self.died_unmerged
        if merged:
            lines.append("merged: " + ", ".join(f"{a} -> {b}" for a, b in merged.items()))
        if died.size:
            lines.append("died: " + ", ".join(str(int(i)) for i in died))
        return "\n".join(lines)
