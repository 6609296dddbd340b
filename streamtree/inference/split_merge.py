"""Split-merge moves with an exact Metropolis-Hastings acceptance (after Jain and Neal).

A move shuffles the current epoch's documents between a node ``a`` and a node ``b``:

* ``b`` *new*: a leaf born in this epoch (no past window counts, no previous-epoch parameter),
  a child of ``a`` or of ``a``'s parent at any position among their children; a split of
  ``a`` creates it, the reverse merge removes it. This covers splits creating a child or a
  sibling and merges into the parent or into a sibling.
* ``b`` *kept*: a child or sibling of ``a`` that the window keeps alive (past counts) and that
  holds no current documents in the merged state; a split refills it, a merge empties it.

Target. The joint posterior of the epoch's assignments ``z`` and the node parameters given the
parameters of every node the move does not create, the past window counts and the tree,

    pi(z, theta) = p(z | past counts, tree) x prod_links p(theta_c | theta_parent) x prod_x f(x | theta_z(x)),

with the sticks integrated out of the first factor
(:func:`streamtree.inference.merge.collapsed_log_prior`). A split that creates ``b`` draws its
parameter from its exact conditional given its documents and parent
(:meth:`Likelihood.sample_node_theta`) and a merge drops it (reversible jump with the
conditional as proposal), so the acceptance ratio only holds the collapsed marginal
(:meth:`Likelihood.log_marginal`) of ``b``'s documents against their likelihood at ``a``
(``f`` factorises over documents): O(nnz) of the moved documents plus O(p).

Proposal (one attempt). With probability 1/2 draw a document ``i`` uniformly and ``j``
uniformly among the other documents of ``i``'s node ``a``; else draw an occupied node ``b``
uniformly, a partner ``a`` uniformly among ``b``'s parent and siblings (empty or not), ``j``
uniformly in ``b`` and ``i`` uniformly among the other documents of ``a`` and ``b`` (nothing
happens if ``i`` is in ``b``). The probabilities of both draws, in the merged and the
split state, enter the acceptance ratio; drawing nodes rather than documents makes merges of
small nodes as frequent as those of large ones.

* a split draw: propose a split of ``a``. Choose uniformly among the places
  allowed in the current state (new child of ``a`` at each position if ``a`` is below the
  depth cap, new child of ``a``'s parent at each position, each empty kept child or sibling);
  ``i`` stays, ``j`` moves. For a new node, a *launch* allocation of ``a``'s other documents
  is drawn from per-document probabilities comparing ``a``'s parameter with a seed parameter
  (:meth:`Likelihood.seed_child_theta` of ``x_j``); the launch group's posterior mode
  (:meth:`Likelihood.new_node_theta`) then gives the per-document probabilities from which the
  split is drawn. For a kept node, the probabilities compare the two nodes' parameters.
* a merge draw, ``b`` new or kept in one of ``a``'s places once merged: propose the merge
  (deterministic). Its reverse-proposal probability repeats the launch from
  the merged state (an auxiliary variable that depends only on the merged state, ``i`` and
  ``j``, drawn afresh as in Jain and Neal) and scores the actual split.
* anything else: nothing happens.

Per-document probabilities are clipped to ``[EPS, 1 - EPS]`` so that every split has positive
proposal probability. An attempt costs O(nnz) of the documents of ``a`` and ``b`` plus a few
O(p) marginals, two O(K) prior evaluations and O(n) label scans.

Nothing here depends on the observation family: all of it goes through the
:class:`~streamtree.likelihoods.base.Likelihood`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from scipy.special import expit

from streamtree.inference.merge import collapsed_log_prior
from streamtree.likelihoods.base import DocumentSet, Likelihood
from streamtree.tree import ROOT, TSSBTree

#: floor on every per-document allocation probability of a split proposal
EPS = 1e-3


@dataclass
class MoveState:
    """What a move reads and changes: the tree, the documents' nodes and the node parameters.

    ``labels[r]`` is the node id of row ``r`` of ``X``; ``past`` holds past window counts by
    node id; ``theta`` and ``concentration`` map node ids to parameters; ``carried`` holds the
    ids of nodes with a previous-epoch parameter (never new).
    """

    tree: TSSBTree
    labels: np.ndarray
    X: object
    past: dict[int, int]
    theta: dict[int, np.ndarray]
    concentration: dict[int, float]
    carried: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class MoveResult:
    """An accepted move: ``kind`` is ``"split"`` or ``"merge"``; ``node`` the node that received
    or gave away the documents, ``other`` the node it split from or merged into, ``rows`` the
    moved rows."""

    kind: str
    node: int
    other: int
    rows: np.ndarray


def _docs(X, rows: np.ndarray) -> DocumentSet:
    sub = X[rows]
    if sp.issparse(sub):
        s = np.asarray(sub.sum(axis=0)).ravel()
        sumsq = float(sub.multiply(sub).sum())
    else:
        sub = np.asarray(sub, dtype=np.float64)
        s = sub.sum(axis=0)
        sumsq = float(np.einsum("ij,ij->", sub, sub))
    return DocumentSet(float(rows.size), s, sumsq)


def _dense_row(X, r: int) -> np.ndarray:
    x = X[r]
    return np.asarray(x.toarray()).ravel() if sp.issparse(x) else np.asarray(x, dtype=np.float64).ravel()


def _places(tree: TSSBTree, a: int) -> list[int]:
    """Parents a new collapsible node split from ``a`` may hang under: ``a`` and ``a``'s parent."""
    out = []
    if not tree.at_cap(a):
        out.append(a)
    if a != ROOT:
        out.append(tree.parent[a])
    return out


class SplitMerge:
    """Exact split-merge attempts on a :class:`MoveState`.

    Parameters
    ----------
    likelihood : Likelihood
    stick_kwargs : dict
        ``alpha0, lam, gamma, max_depth, root_holds_data`` of the stick prior.
    """

    def __init__(self, likelihood: Likelihood, stick_kwargs: dict) -> None:
        self.lik = likelihood
        self.kw = stick_kwargs

    # ------------------------------------------------------------------ node kinds
    def adoptable(self, st: MoveState, tree: TSSBTree, c: int) -> bool:
        """Whether a new node may take ``c``'s subtree below it: every node in it is born in this
        epoch (no past counts, no previous-epoch parameter, so no time link whose strength
        depends on depth) and it stays within the depth cap one level lower."""
        sub = tree.subtree(c)
        if any(st.past.get(g, 0) > 0 or g in st.carried for g in sub):
            return False
        return tree.max_depth is None or max(tree.depth[g] for g in sub) + 1 <= tree.max_depth

    def is_new(self, st: MoveState, tree: TSSBTree, b: int) -> bool:
        """A node born in this epoch whose children a merge may lift to its parent: a split can
        create it (adopting those children) and a merge remove it."""
        return (b != ROOT and st.past.get(b, 0) == 0 and b not in st.carried
                and all(self.adoptable(st, tree, c) for c in tree.children[b]))

    @staticmethod
    def kept(st: MoveState, b: int) -> bool:
        """A node the window keeps alive without current documents (it may be emptied and
        refilled; its parameter stays)."""
        return b != ROOT and st.past.get(b, 0) > 0

    def _new_places(self, st: MoveState, tree: TSSBTree, P: int, a: int) -> list[tuple]:
        kids = tree.children[P]
        ok = [c != a and self.adoptable(st, tree, c) for c in kids]  # a stays a partner of the new node
        out = []
        for k in range(len(kids) + 1):
            out.append(("new", P, k, 0))
            m = 1
            while k + m <= len(kids) and ok[k + m - 1]:
                out.append(("new", P, k, m))
                m += 1
        return out

    def places(self, st: MoveState, tree: TSSBTree, labels: np.ndarray, a: int) -> list[tuple]:
        """Where a split of ``a`` in the merged state ``tree, labels`` may send documents:
        ``("new", P, k, m)``, a new child of ``P`` at position ``k`` adopting ``P``'s next ``m``
        children (each adoptable, ``a`` excepted), for ``P`` = ``a`` (below the depth cap) and
        ``a``'s parent;
        ``("old", b)`` for each kept child or sibling ``b`` of ``a`` without current documents."""
        out: list[tuple] = []
        if not tree.at_cap(a):
            out.extend(self._new_places(st, tree, a, a))
        if a != ROOT:
            out.extend(self._new_places(st, tree, tree.parent[a], a))
        near = list(tree.children[a]) + ([c for c in tree.children[tree.parent[a]] if c != a] if a != ROOT else [])
        near = [b for b in near if self.kept(st, b)]
        if near:
            held = set(np.unique(labels).tolist())
            out.extend(("old", b) for b in near if b not in held)
        return out

    @staticmethod
    def _insert(tree: TSSBTree, place: tuple, born: int) -> int:
        """Create the new node of ``place`` in ``tree`` (adopting its block of children)."""
        _, P, k, m = place
        nid = tree.add_child(P, born=born, position=k)
        kids = tree.children[P][k + 1:k + 1 + m]
        del tree.children[P][k + 1:k + 1 + m]
        tree.children[nid] = kids
        for c in kids:
            tree.parent[c] = nid
            for g in tree.subtree(c):
                tree.depth[g] += 1
        return nid

    def _log_adoption(self, st: MoveState, split: TSSBTree, b: int, theta_b: np.ndarray) -> float:
        """Parent-link log densities of ``b``'s adopted subtrees in the split state minus those
        in the merged state (one level higher, the adopted children linked to ``b``'s parent)."""
        out = 0.0
        P = split.parent[b]
        for c in split.children[b]:
            d = split.depth[c]
            out += self.lik.log_link(st.theta[c], theta_b, d) - self.lik.log_link(st.theta[c], st.theta[P], d - 1)
            for g in split.subtree(c)[1:]:
                dg, tp = split.depth[g], st.theta[split.parent[g]]
                out += self.lik.log_link(st.theta[g], tp, dg) - self.lik.log_link(st.theta[g], tp, dg - 1)
        return out

    # ------------------------------------------------------------------ target pieces
    def _log_prior(self, tree: TSSBTree, labels: np.ndarray, past: dict[int, int]) -> float:
        arr = tree.arrays()
        now = dict(zip(*np.unique(labels, return_counts=True)))
        return collapsed_log_prior(arr, np.array([past.get(int(i), 0) for i in arr.ids], dtype=np.float64),
                                   np.array([now.get(int(i), 0) for i in arr.ids], dtype=np.float64), **self.kw)

    def _new_node(self, st: MoveState, tree: TSSBTree, P: int) -> tuple[np.ndarray, float, int]:
        depth = tree.depth[P] + 1
        return st.theta[P], self.lik.new_node_concentration(st.concentration[P], depth), depth

    # ------------------------------------------------------------------ proposal
    def _allocation(self, st: MoveState, merged: TSSBTree, a: int, place: tuple, j: int, others: np.ndarray,
                    rng: np.random.Generator) -> np.ndarray:
        """Log-odds that each of ``others`` goes to the split-off node (a function of the merged
        state and of a fresh launch)."""
        lik = self.lik
        theta_a, conc_a = st.theta[a], st.concentration[a]
        Xo = st.X[others]
        base = lik.row_log_likelihood(Xo, theta_a, conc_a)
        if place[0] == "old":
            b = place[1]
            return lik.row_log_likelihood(Xo, st.theta[b], st.concentration[b]) - base
        theta_P, conc_c, depth_c = self._new_node(st, merged, place[1])
        seed = lik.seed_child_theta(theta_a, _dense_row(st.X, j))
        lo = lik.row_log_likelihood(Xo, seed, conc_c) - base
        launch = rng.random(others.size) < np.clip(expit(lo), EPS, 1 - EPS)
        rows_c = np.concatenate([[j], others[launch]]).astype(np.int64)
        theta_l = lik.new_node_theta(theta_P, conc_c, depth_c, _docs(st.X, rows_c))
        return lik.row_log_likelihood(Xo, theta_l, conc_c) - base

    @staticmethod
    def _log_q(log_odds: np.ndarray, to_new: np.ndarray) -> float:
        p_new = np.clip(expit(log_odds), EPS, 1 - EPS)
        return float(np.sum(np.where(to_new, np.log(p_new), np.log1p(-p_new))))

    def _log_ratio(self, st: MoveState, merged: TSSBTree, split: TSSBTree, a: int, b: int, place: tuple,
                   labels_merged: np.ndarray, labels_split: np.ndarray, n_places: int, log_q: float,
                   theta_b: np.ndarray | None = None) -> float:
        """log of pi(split) q(merge | split) / (pi(merged) q(split | merged)), with a new node's
        parameter ``theta_b`` drawn from its conditional given its documents and parent: the
        documents' collapsed marginal, plus the link changes of adopted subtrees."""
        docs = _docs(st.X, np.flatnonzero(labels_split == b))
        if place[0] == "new":
            theta_P, conc_c, depth_c = self._new_node(st, merged, place[1])
            at_b = self.lik.log_marginal(docs, theta_P, conc_c, depth_c)
            if place[3]:
                at_b += self._log_adoption(st, split, b, theta_b)
        else:
            at_b = self.lik.log_likelihood(docs, st.theta[b], st.concentration[b])
        data = at_b - self.lik.log_likelihood(docs, st.theta[a], st.concentration[a])
        prior = self._log_prior(split, labels_split, st.past) - self._log_prior(merged, labels_merged, st.past)
        return prior + data + np.log(n_places) - log_q

    # ------------------------------------------------------------------ selection
    def partners(self, st: MoveState, tree: TSSBTree, b: int) -> list[int]:
        """Nodes ``b`` could merge into: its parent and its siblings."""
        P = tree.parent[b]
        return [P] + [c for c in tree.children[P] if c != b]

    def _log_select_split(self, labels: np.ndarray, a: int) -> float:
        """log P(draw i, then j at the same node) in the merged state: i uniform, j uniform among
        the other documents of i's node."""
        return -np.log(labels.size) - np.log(np.count_nonzero(labels == a) - 1)

    def _log_select_merge(self, st: MoveState, tree: TSSBTree, labels: np.ndarray, a: int, b: int) -> float:
        """log P(draw node b, partner a, j in b, then i among the other documents of a and b) in
        the split state."""
        occupied, n_at = np.unique(labels, return_counts=True)
        at = dict(zip(occupied.tolist(), n_at.tolist()))
        return (-np.log(occupied.size) - np.log(len(self.partners(st, tree, b))) - np.log(at[b])
                - np.log(at[b] + at.get(a, 0) - 1))

    # ------------------------------------------------------------------ one attempt
    def attempt(self, st: MoveState, rng: np.random.Generator, *, born: int = 0) -> MoveResult | None:
        """One attempt (see the module docstring); the accepted move, if any, is applied to ``st``."""
        n = st.labels.size
        if n < 2:
            return None
        if rng.random() < 0.5:  # a split: two documents of one node
            i = int(rng.integers(n))
            a = int(st.labels[i])
            rows_a = np.flatnonzero(st.labels == a)
            if rows_a.size < 2:
                return None
            j = int(rng.choice(rows_a[rows_a != i]))
            return self._split(st, a, i, j, rng, born)
        occupied = np.unique(st.labels)  # a merge: a node, a partner, a document of each group
        b = int(occupied[rng.integers(occupied.size)])
        if b == ROOT:
            return None
        partners = self.partners(st, st.tree, b)
        a = partners[int(rng.integers(len(partners)))]
        rows_b = np.flatnonzero(st.labels == b)
        j = int(rows_b[rng.integers(rows_b.size)])
        pool = np.flatnonzero((st.labels == a) | (st.labels == b))
        pool = pool[pool != j]
        if pool.size == 0:
            return None
        i = int(pool[rng.integers(pool.size)])
        if st.labels[i] == b:
            return None  # a split keeps i at a: this draw cannot reverse one
        return self._merge(st, a, b, i, j, rng)

    # ------------------------------------------------------------------ relocation
    def relocate(self, st: MoveState, rng: np.random.Generator) -> MoveResult | None:
        """Move a new node to another parent and position (reversible jump, exact).

        Draw ``b`` uniformly among the new nodes, a parent ``P2`` uniformly among the nodes
        below the depth cap other than ``b``, and a position uniformly among ``P2``'s
        ``len(children) + 1`` slots. ``b``'s parameter is redrawn from its conditional under
        ``P2``, so the ratio holds the collapsed marginals of ``b``'s documents under the old
        and new parent, the prior ratio and the ratio of the draw probabilities."""
        t = st.tree
        new_nodes = [c for c in t.parent if not t.children[c] and self.is_new(st, t, c)]
        if not new_nodes:
            return None
        b = new_nodes[int(rng.integers(len(new_nodes)))]
        hosts = [c for c in t.preorder() if c != b and not t.at_cap(c)]
        P2 = hosts[int(rng.integers(len(hosts)))]
        P1 = t.parent[b]
        k1 = t.children[P1].index(b)
        slots2 = len(t.children[P2]) + (0 if P2 == P1 else 1)
        k2 = int(rng.integers(slots2))
        if P2 == P1 and k2 == k1:
            return None
        moved = t.copy()
        moved.remove_subtree(b)
        slots1 = len(moved.children[P1]) + 1
        nb = moved.add_child(P2, born=t.born[b], position=k2)
        labels_moved = st.labels.copy()
        rows_b = np.flatnonzero(st.labels == b)
        labels_moved[rows_b] = nb
        docs = _docs(st.X, rows_b)
        th1, c1, d1 = self._new_node(st, t, P1)
        th2, c2, d2 = self._new_node(st, moved, P2)
        n_new_after = sum(1 for c in moved.parent if not moved.children[c] and self.is_new(st, moved, c))
        log_a = (self._log_prior(moved, labels_moved, st.past) - self._log_prior(t, st.labels, st.past)
                 + self.lik.log_marginal(docs, th2, c2, d2) - self.lik.log_marginal(docs, th1, c1, d1)
                 + np.log(len(new_nodes)) - np.log(n_new_after) + np.log(slots2) - np.log(slots1))
        if np.log(rng.random()) >= log_a:
            return None
        # keep b's id: detach and re-attach it
        t.children[P1].remove(b)
        t.children[P2].insert(k2, b)
        t.parent[b] = P2
        t.depth[b] = t.depth[P2] + 1
        st.theta[b] = self.lik.sample_node_theta(th2, c2, d2, docs, rng)
        st.concentration[b] = c2
        return MoveResult("relocate", b, P2, rows_b)

    def _split(self, st: MoveState, a: int, i: int, j: int, rng: np.random.Generator,
               born: int) -> MoveResult | None:
        places = self.places(st, st.tree, st.labels, a)
        if not places:
            return None
        place = places[int(rng.integers(len(places)))]
        rows_a = np.flatnonzero(st.labels == a)
        others = rows_a[(rows_a != i) & (rows_a != j)]
        lo = self._allocation(st, st.tree, a, place, j, others, rng)
        to_new = rng.random(others.size) < np.clip(expit(lo), EPS, 1 - EPS)
        rows_b = np.concatenate([[j], others[to_new]]).astype(np.int64)
        split = st.tree.copy()
        theta_b = None
        if place[0] == "new":
            theta_P, conc_c, depth_c = self._new_node(st, st.tree, place[1])
            theta_b = self.lik.sample_node_theta(theta_P, conc_c, depth_c, _docs(st.X, rows_b), rng)
            b = self._insert(split, place, born)
        else:
            b = place[1]
        labels_split = st.labels.copy()
        labels_split[rows_b] = b
        log_a = (self._log_ratio(st, st.tree, split, a, b, place, st.labels, labels_split, len(places),
                                 self._log_q(lo, to_new), theta_b)
                 + self._log_select_merge(st, split, labels_split, a, b) - self._log_select_split(st.labels, a))
        if np.log(rng.random()) >= log_a:
            return None
        if place[0] == "new":
            b = self._insert(st.tree, place, born)
            st.theta[b] = theta_b
            st.concentration[b] = conc_c
        st.labels[rows_b] = b
        return MoveResult("split", b, a, rows_b)

    def _merge(self, st: MoveState, a: int, b: int, i: int, j: int, rng: np.random.Generator) -> MoveResult | None:
        t = st.tree
        new = self.is_new(st, t, b)
        if not (new or self.kept(st, b)) or (a == ROOT and not self.kw["root_holds_data"]):
            return None
        merged = t
        if new:
            P = t.parent[b]
            place = ("new", P, t.children[P].index(b), len(t.children[b]))
            merged = t.copy()
            merged.merge_into_parent(b)
        else:
            place = ("old", b)
        rows_b = np.flatnonzero(st.labels == b)
        labels_merged = st.labels.copy()
        labels_merged[rows_b] = a
        places = self.places(st, merged, labels_merged, a)
        if place not in places:
            return None  # no split of a could have made this state
        pooled = np.flatnonzero(labels_merged == a)
        others = pooled[(pooled != i) & (pooled != j)]
        lo = self._allocation(st, merged, a, place, j, others, rng)
        to_new = st.labels[others] == b
        log_a = -(self._log_ratio(st, merged, t, a, b, place, labels_merged, st.labels, len(places),
                                  self._log_q(lo, to_new), st.theta[b])
                  + self._log_select_merge(st, t, st.labels, a, b) - self._log_select_split(labels_merged, a))
        if np.log(rng.random()) >= log_a:
            return None
        st.labels[rows_b] = a
        if new:
            t.merge_into_parent(b)
            del st.theta[b], st.concentration[b]
        return MoveResult("merge", b, a, rows_b)
