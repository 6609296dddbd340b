"""Split-merge moves with an exact Metropolis-Hastings acceptance (after Jain and Neal).

A move shuffles the current epoch's documents between a node ``a`` and a node ``b``:

* ``b`` *new*: a leaf born in this epoch (no past window counts, no previous-epoch parameter),
  a child of ``a`` or of ``a``'s parent at any position among their children; a split of
  ``a`` creates it, the reverse merge removes it. This covers splits creating a child or a
  sibling and merges into the parent or into a sibling.
* ``b`` *kept*: a child or sibling of ``a`` that the window keeps alive (past counts) and that
  holds no current documents in the merged state; a split refills it, a merge empties it.

A split-merge move always moves a document, so it can neither create nor remove a node that
holds none. :meth:`SplitMerge.lift` does: it inserts an empty new node above a block of
siblings or removes an empty new internal node, its children rising (reversible jump, the same
target; an internal node whose documents have all left only joins its children).
:meth:`SplitMerge.lift_carried` does the same for a carried internal node without documents of
its own, past or current: removed, it waits out of the tree with its id and its time link, and
may come back above a block of siblings. A carried node's parameter has two links, to its
parent and to its own previous-epoch parameter, and the target's link factor for it is their
normalised product (:meth:`Likelihood.log_link` with ``theta_prev``, the prior that
:meth:`Likelihood.log_marginal` integrates against). :meth:`SplitMerge.rehang` moves a new leaf
at the depth cap below another host through a fresh chain of empty nodes down to the cap,
removing those above it: a new topic's branch of its own, which the other moves can build
only one level at a time, each level off the cap costing every document of the leaf.

Target. The joint posterior of the epoch's assignments ``z``, the tree's shape and the node
parameters given the parameters of every node the move does not create and the past window
counts,

    pi(z, tree, theta) = p(z_window | tree) x prod_links p(theta_c | theta_parent) x prod_x f(x | theta_z(x)),

with the sticks integrated out of the first factor
(:func:`streamtree.inference.merge.collapsed_log_prior` with no past). ``z_window`` is the
window's assignments, past and current: the past documents are observed assignments attached
to their node ids (no move changes them, and they have no likelihood: their data are gone), and
the tree they hang in is part of the state. A move that changes the tree's shape (a new node
inserted before carried siblings or adopting a block of children, a merge lifting a node's
children, a relocation) changes the probability of the past documents below and beside it,
and the prior ratio counts that change. This is the hyperparameter sampler's target (and the
internal merge's); conditioning on the past, p(z | past counts, tree), would let such moves
shift the past documents for free.

A split that creates ``b`` draws its parameter from its exact conditional given its documents
and parent (:meth:`Likelihood.sample_node_theta`) and a merge drops it (reversible jump with
the conditional as proposal), so the acceptance ratio only holds the collapsed marginal
(:meth:`Likelihood.log_marginal`) of ``b``'s documents against their likelihood at ``a``
(``f`` factorises over documents), plus the link changes of the children ``b`` adopts:
O(nnz) of the moved documents plus O(p). A ``b`` that adopts no children leaves its parameter
out of the ratio, so its draw waits until the split is accepted (the same kernel: the draw is
independent of the acceptance test).

With ``integrate_split_node`` (``DTSSBP(split_node="integrated")``) the split node ``a``'s
parameter is treated the same way where the family can integrate it out
(:meth:`SplitMerge.collapses`): the ratio holds the marginal of ``a``'s documents in the split
state minus in the merged state instead of the moved documents' likelihood at ``a``, and the
accepted move draws ``a``'s parameter afresh from its conditional. When ``b`` becomes ``a``'s
child, ``a``'s split-state parameter is drawn first (from its conditional without ``b``) and
``b``'s documents are scored below that draw; the merge draws ``a``'s merged-state parameter
before its reverse launch reads it.

The root is treated so too when the state gives its parent-link target
(:attr:`MoveState.anchor`, the epoch's root anchor where the family links the root to it):
its parameter is then part of the state, linked to the anchor at depth 0 as any node is to its
parent. Without an anchor it is held.

Proposal (one attempt). With probability 1/2 draw a document ``i`` uniformly and ``j``
uniformly among the other documents of ``i``'s node ``a``; else draw an occupied node ``b``
uniformly, a partner ``a`` uniformly among ``b``'s parent and siblings (empty or not), ``j``
uniformly in ``b`` and ``i`` uniformly among the other documents of ``a`` and ``b`` (nothing
happens if ``i`` is in ``b``). The probabilities of both draws, in the merged and the
split state, enter the acceptance ratio; drawing nodes rather than documents makes merges of
small nodes as frequent as those of large ones.

* a split draw: propose a split of ``a``. Choose a place allowed in the current state: a
  kind uniformly (a new child of ``a``, if ``a`` is below the depth cap; a new child of
  ``a``'s parent; each empty kept child or sibling, a kind of its own), then a place of that
  kind uniformly (each position and adopted block of a new node: :class:`SplitPlaces`);
  ``i`` stays, ``j`` moves. For a new node, a *launch* allocation of ``a``'s other documents
  is drawn from per-document probabilities comparing ``a``'s parameter with a seed parameter
  (:meth:`Likelihood.seed_child_theta` of ``x_j``). Then :attr:`Likelihood.launch_scans` restricted
  scans (Jain and Neal's intermediate scans): each gives the two groups, ``j`` with the
  launched documents and ``i`` with the others, their posterior modes as new children of the
  place's parent and redraws the launch from the per-document odds between them
  (:meth:`FixedNode.launch_scan`). The last groups' modes give the per-document
  probabilities from which the split is drawn. For a kept node, the probabilities compare the
  two nodes' parameters.
* a merge draw, ``b`` new or kept in one of ``a``'s places once merged: propose the merge
  (deterministic). Its reverse-proposal probability repeats the launch from
  the merged state (an auxiliary variable that depends only on the merged state, ``i`` and
  ``j``, drawn afresh as in Jain and Neal) and scores the actual split. That probability is
  at most 1, so a merge whose ratio without it already rejects at the drawn uniform skips the
  launch (its uniforms are still drawn, so the random stream is the same).
* anything else: nothing happens.

The *subset* proposal (``attempt(..., proposal="subset")``) is a second kernel with the same
draws, places and target; only the allocation of ``a``'s other documents differs: a size ``k``
uniform on ``l..m`` (``m`` other documents; ``l + 1 =`` :data:`SUBSET_MIN_DOCS` move with
``j``; no split where ``m < l``, no merge of a node of fewer), then a uniform subset of that
size, probability ``1 / ((m - l + 1) C(m, k))`` (:func:`subset_log_q`). Its splits are blind and nearly always
rejected. Its merges are what it is for: where two nodes hold one cluster, every document goes
either way at even odds under the launch, which gives the reverse split about ``2^-n``, while
the collapsed prior of a given partition of ``n`` documents into ``k`` and ``n - k`` is about
``1 / C(n, k)`` below the merged state's. The subset's reverse probability is of that size, so
such a merge is accepted on its likelihood ratio.

Per-document probabilities are clipped to ``[EPS, 1 - EPS]`` so that every split has positive
proposal probability. An attempt costs O(nnz) of the documents of ``a`` and ``b`` plus a few
O(p) marginals and one O(depth x branching) prior difference
(:class:`~streamtree.inference.merge.CollapsedPrior`): the documents of each node and the
prior's counts are indexed once per :class:`MoveState` and follow the accepted moves, and a
rejected proposal copies neither the tree nor the labels.

Nothing here depends on the observation family: all of it goes through the
:class:`~streamtree.likelihoods.base.Likelihood`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import streamtree  # noqa: F401  (configures the numba cache directory)
import numpy as np
from numba import njit

from streamtree.inference.merge import CollapsedPrior, PriorEdit
from streamtree.likelihoods.base import (DocumentSet, FixedNode, Likelihood, RowBlock, clipped_expit, document_set,
                                        launch_probabilities)
from streamtree.tree import ROOT, TSSBTree

#: the root's parent in a tree (:attr:`TSSBTree.parent`), which the moves read as the root's
#: parent-link target :attr:`MoveState.anchor`
ANCHOR = -1

#: floor on every per-document allocation probability of a split proposal
EPS = 1e-3
#: how a split allocates the split node's other documents (:meth:`SplitMerge.attempt`)
PROPOSALS = ("launch", "subset")
#: the fewest documents a subset split moves (and a subset merge joins). Smaller groups are the
#: z-sweep's, which moves documents one at a time, and the launch's, whose reverse split of a
#: duplicate costs about ``n log 2``, under 7 nats below 10 documents. Chosen with the
#: small-epoch test in view (60-document epochs: without a floor its two seeds fell below its
#: bounds); over more seeds no floor does as well there and slightly better on the other
#: benches (BENCHMARKS.md, "Subset split proposals")
SUBSET_MIN_DOCS = 10
#: the share of a rehung leaf's documents that the lowest relay of its new chain is proposed
#: from (:meth:`SplitMerge.rehang`; relay ``k`` of ``L``, counted from the top, from the
#: ``k / L`` part of it): relays proposed between the host and the leaf rather than at either
#: end. On the scripted-event stream's new topic (83 documents, word distributions at
#: ``kappa0 = 1000``, two relays below the root) the log ratio of the move out of an unrelated
#: branch was -1,164 nats with relays drawn from their links alone, -385 from 2 and 6 of its
#: documents, +81 from 8 and 25 (this share gives 12 and 25) and +66 from 16 and 40
#: (BENCHMARKS.md, "A new topic's own branch")
RELAY_SHARE = 0.3


@dataclass
class MoveState:
    """What a move reads and changes: the tree, the documents' nodes and the node parameters.

    ``labels[r]`` is the node id of row ``r`` of ``X``; ``past`` holds past window counts by
    node id; ``theta`` and ``concentration`` map node ids to parameters; ``carried`` holds the
    ids of nodes with a previous-epoch parameter (never new). Change it only through the moves
    once they have run on it: they keep an index of it (:class:`DocumentIndex`).
    """

    tree: TSSBTree
    labels: np.ndarray
    X: object
    past: dict[int, int]
    theta: dict[int, np.ndarray]
    concentration: dict[int, float]
    carried: set[int] = field(default_factory=set)
    #: what each carried node, alive now or not, had at the end of the previous epoch (its time
    #: link's target; a carried node that left the tree may come back with it)
    previous: "dict[int, Previous]" = field(default_factory=dict)
    #: the root's parent-link target (:meth:`Likelihood.root_parent` of the epoch's root
    #: anchor), or ``None``: given, moves that integrate the split node's parameter out
    #: integrate the root's against it too where they can (:meth:`SplitMerge.collapses`).
    #: Constant once the moves have indexed the state (their memos read it)
    anchor: np.ndarray | None = None
    index: "DocumentIndex | None" = field(default=None, init=False, repr=False)


@dataclass(frozen=True)
class Previous:
    """A carried node at the end of the previous epoch: its parameter (the target of its time
    link), its concentration and the epoch its id was born."""

    theta: np.ndarray
    concentration: float
    born: int


_NO_ROWS = np.zeros(0, dtype=np.int64)

# The acceptance ratios take the logs of small counts (documents, places, nodes) several
# times per attempt. NumPy's log of a Python number spends ~0.7 us converting it; the same
# log of the same float64 values, computed once into a table and looked up, gives the same
# numbers in a tenth of the time.
_log_counts = np.zeros(0)


def _place_kind(place: tuple) -> tuple:
    """A place's kind: ``("new", P)``, a new child of ``P`` at any position and with any block
    of adopted children, or the place itself, an empty kept node (each its own kind)."""
    return place[:2] if place[0] == "new" else place


class SplitPlaces:
    """The places a split may send documents to, grouped by kind (:func:`_place_kind`) in the
    order the kinds first appear. A kind is drawn uniformly, then a place of that kind
    uniformly: drawn uniformly over places, a split would go mostly to new siblings (a parent's
    every position and block of adopted children) and rarely to a new child of the split node
    itself, which is how a topic's sub-topic is found (2 of 13 draws on a planted tree's depth-1
    nodes); each empty kept node is a kind of its own, so it keeps a share of its own.

    A node with ``c`` adoptable children has O(c^2) new-child places; the groups are held as
    given (the cached lists of the move index: do not change them), so a draw, a probability and
    a membership test cost O(number of kinds), not O(number of places). Each group holds the
    places of one kind, sorted, and no two groups share a kind (not checked)."""

    __slots__ = ("groups", "_at")

    def __init__(self, groups: Iterable[Sequence[tuple]]) -> None:
        #: one sequence of places per kind, each sorted (a new child's places are listed by
        #: position, then block size); empty ones are left out
        self.groups: tuple[Sequence[tuple], ...] = tuple(g for g in groups if len(g))
        self._at = {_place_kind(g[0]): n for n, g in enumerate(self.groups)}

    @classmethod
    def grouped(cls, places: Iterable[tuple]) -> SplitPlaces:
        """The places of a flat sequence, grouped by kind in order of first appearance, each
        group sorted (as :meth:`SplitMerge.places` lists a new child's places)."""
        kinds: dict[tuple, list[tuple]] = {}
        for place in places:
            kinds.setdefault(_place_kind(place), []).append(place)
        return cls([sorted(g) for g in kinds.values()])

    def __iter__(self) -> Iterator[tuple]:
        for g in self.groups:
            yield from g

    def __len__(self) -> int:
        return sum(len(g) for g in self.groups)

    def __bool__(self) -> bool:
        return bool(self.groups)

    def __contains__(self, place: object) -> bool:
        n = self._at.get(_place_kind(place))
        if n is None:
            return False
        g = self.groups[n]
        at = bisect.bisect_left(g, place)
        return at < len(g) and g[at] == place

    def draw(self, rng: np.random.Generator) -> tuple:
        """A place: a kind uniformly, then a place of that kind uniformly."""
        g = self.groups[int(rng.integers(len(self.groups)))]
        return g[int(rng.integers(len(g)))]

    def log_prob(self, place: tuple) -> float:
        """log of the probability that :meth:`draw` draws ``place`` (one of the places)."""
        return -math.log(len(self.groups) * len(self.groups[self._at[_place_kind(place)]]))


def _log_count(n: int) -> float:
    """``np.log(n)`` of a count ``n >= 0`` (``-inf`` at 0), from a table of NumPy's logs."""
    global _log_counts
    if n < 0:
        return np.log(n)
    if n >= _log_counts.size:
        with np.errstate(divide="ignore"):
            _log_counts = np.log(np.arange(max(n + 1, 2 * _log_counts.size, 1024), dtype=np.float64))
    return _log_counts[n]


def subset_log_q(n_others: int, k: int, low: int = 0) -> float:
    """log probability that the subset proposal sends exactly a given ``k`` of ``n_others``
    documents to the split-off node: a size uniform on ``low..n_others``, then a uniform subset
    of that size, ``-log(n_others - low + 1) - log C(n_others, k)``."""
    if not 0 <= low <= k <= n_others:
        raise ValueError(f"subset_log_q needs 0 <= low <= k <= n_others, got low={low}, k={k}, n_others={n_others}")
    return -(math.log(n_others - low + 1) + math.lgamma(n_others + 1) - math.lgamma(k + 1)
             - math.lgamma(n_others - k + 1))


def relay_documents(rows: np.ndarray, k: int, n_relays: int) -> np.ndarray:
    """The rows of a leaf (``rows``, ascending) that relay ``k`` of ``n_relays`` above it is
    proposed from (:meth:`SplitMerge.rehang`): ``RELAY_SHARE * k / n_relays`` of them, rounded,
    evenly spaced. A function of the rows alone, so a move and its reverse read the same."""
    n = int(round(RELAY_SHARE * k / n_relays * rows.size))
    return rows[(np.arange(n) * rows.size) // n] if n else rows[:0]


def _log_uniform(rng: np.random.Generator) -> float:
    """``np.log(rng.random())``: the same draw and NumPy's same log, passed as a NumPy scalar
    (cheaper for the ufunc to take than a Python float)."""
    return np.log(np.float64(rng.random()))


class DocumentIndex:
    """The rows of each node (ascending) and the collapsed prior's counts of a :class:`MoveState`."""

    def __init__(self, st: MoveState) -> None:
        labels = np.asarray(st.labels, dtype=np.int64)
        order = np.argsort(labels, kind="stable")
        ids, starts = np.unique(labels[order], return_index=True)
        self.rows: dict[int, np.ndarray] = {
            int(i): order[a:b] for i, a, b in zip(ids, starts, list(starts[1:]) + [labels.size])}
        # the target's prior is p(z_window | tree): past and current documents alike are
        # observed assignments (see the module docstring), so the past counts go in as counts
        windowed = self.counts()
        for i, k in st.past.items():
            if k:
                windowed[i] = windowed.get(i, 0) + k
        self.prior = CollapsedPrior(st.tree, {}, windowed)
        self.tree = st.tree
        self._past, self._carried = st.past, st.carried
        self._order: list[int] | None = None
        self._new_leaves: list[int] | None = None
        self._hosts: tuple[list[int], dict[int, int]] | None = None
        #: new internal nodes without current documents (cached by :meth:`SplitMerge.empty_inner`)
        self.empty_inner: list[int] | None = None
        self._docs: dict[int, DocumentSet] = {}  # document_set of each node's rows (see documents)
        self._occupied: np.ndarray | None = None  # see occupied
        #: link log densities by (likelihood, child, parent, depth) of nodes' current parameters,
        #: a fifth key ``True`` for a carried child scored under its time link too
        #: (:meth:`SplitMerge._link`). A density depends on the two parameters and the depth,
        #: not on the tree: a node's entries go when its parameter does (:meth:`forget`).
        self.links: dict[tuple, float] = {}
        self._reach: dict[int, int] | None = None  # see reach
        self._fresh: dict[int, bool] | None = None  # see fresh
        self._removable: list[int] | None = None  # see SplitMerge.removable_carried
        self._dormant: list[int] | None = None  # see SplitMerge.dormant
        #: :meth:`SplitMerge._new_places` in the live tree by (parent, excluded child or -1), in
        #: the live tree with one node lifted by (parent, excluded child or -1, lifted node),
        #: :meth:`SplitMerge._blocks` by (parent, -2); cleared like :meth:`preorder`
        self.places: dict[tuple, list[tuple]] = {}
        #: collapsed log marginals of a node's documents as a new child of a parent, by
        #: (likelihood, node, parent, depth) (:meth:`SplitMerge._marginal`); a node's entries go
        #: when its documents or its parameter do (:meth:`move`, :meth:`forget`)
        self.marginals: dict[tuple, float] = {}
        #: each node's parameters as the likelihood scores at them (:meth:`Likelihood.fixed_node`),
        #: and the scores of the node's own rows there, by node: a node's entries go when its
        #: parameter does (:meth:`forget`), its scores also when its rows change (:meth:`move`)
        self.fixed: dict[int, FixedNode] = {}
        self.own_scores: dict[int, np.ndarray] = {}

    def preorder(self) -> list[int]:
        """The tree's nodes in pre-order (cached until a move changes the tree: :meth:`changed`)."""
        if self._order is None:
            self._order = self.tree.preorder()
        return self._order

    def new_leaves(self) -> list[int]:
        """The leaves a relocation may move: born in this epoch (no past counts, no
        previous-epoch parameter), the root excepted (cached like :meth:`preorder`)."""
        if self._new_leaves is None:
            kids, past, carried = self.tree.children, self._past, self._carried
            self._new_leaves = [c for c in self.tree.parent
                                if not kids[c] and c != ROOT and not past.get(c, 0) and c not in carried]
        return self._new_leaves

    def hosts(self) -> tuple[list[int], dict[int, int]]:
        """The nodes below the depth cap in pre-order and each one's position among them
        (cached like :meth:`preorder`)."""
        if self._hosts is None:
            cap, depth = self.tree.max_depth, self.tree.depth
            below = [c for c in self.preorder() if cap is None or depth[c] < cap]
            self._hosts = below, {c: k for k, c in enumerate(below)}
        return self._hosts

    def reach(self) -> dict[int, int]:
        """The depth of the deepest node in each node's subtree (cached like :meth:`preorder`)."""
        if self._reach is None:
            self._subtree_flags()
        return self._reach

    def fresh(self) -> dict[int, bool]:
        """Whether every node in each node's subtree is born in this epoch (no past counts, no
        previous-epoch parameter; cached like :meth:`preorder`)."""
        if self._fresh is None:
            self._subtree_flags()
        return self._fresh

    def _subtree_flags(self) -> None:
        depth, kids, past, carried = self.tree.depth, self.tree.children, self._past, self._carried
        reach: dict[int, int] = {}
        fresh: dict[int, bool] = {}
        for g in reversed(self.preorder()):  # children before their parent
            r, f = depth[g], not past.get(g, 0) > 0 and g not in carried
            for c in kids[g]:
                if reach[c] > r:
                    r = reach[c]
                f = f and fresh[c]
            reach[g], fresh[g] = r, f
        self._reach, self._fresh = reach, fresh

    def changed(self) -> None:
        self._order = self._new_leaves = self._hosts = self.empty_inner = None
        self._reach = self._fresh = self._removable = self._dormant = None
        self.places.clear()

    def forget(self, node: int) -> None:
        """Drop the memos' entries that read ``node``'s parameter or concentration: a move
        has given it new ones, or removed it."""
        for memo in (self.links, self.marginals):
            for key in [k for k in memo if k[1] == node or k[2] == node]:
                del memo[key]
        self.fixed.pop(node, None)
        self.own_scores.pop(node, None)

    def of(self, node: int) -> np.ndarray:
        return self.rows.get(node, _NO_ROWS)

    def documents(self, node: int, X, terms: bool) -> DocumentSet:
        """:func:`document_set` of the node's rows of ``X`` (kept until a move changes them)."""
        docs = self._docs.get(node)
        if docs is None:
            docs = self._docs[node] = document_set(X, self.of(node), terms)
        return docs

    def count(self, node: int) -> int:
        r = self.rows.get(node)
        return 0 if r is None else int(r.size)

    def counts(self) -> dict[int, int]:
        return {i: int(r.size) for i, r in self.rows.items()}

    def occupied(self) -> np.ndarray:
        """Ids of the nodes holding documents, ascending (kept until a move empties or fills a node)."""
        if self._occupied is None:
            self._occupied = np.array(sorted(self.rows), dtype=np.int64)
        return self._occupied

    def move(self, src: int, dst: int, rows: np.ndarray) -> None:
        """``rows`` (all at ``src``) now belong to ``dst``."""
        self.empty_inner = self._removable = None
        for key in [k for k in self.marginals if k[1] == src or k[1] == dst]:
            del self.marginals[key]
        self._docs.pop(src, None)
        self._docs.pop(dst, None)
        self.own_scores.pop(src, None)
        self.own_scores.pop(dst, None)
        self._occupied = None
        left = np.setdiff1d(self.rows[src], rows, assume_unique=True)
        if left.size:
            self.rows[src] = left
        else:
            del self.rows[src]
        self.rows[dst] = np.union1d(self.of(dst), rows)


class EditedTree:
    """The tree after a :class:`~streamtree.inference.merge.PriorEdit`, read like a
    :class:`TSSBTree` (``parent``, ``children``, ``depth``, ``at_cap``, ``subtree``)."""

    def __init__(self, edit: PriorEdit) -> None:
        self.max_depth = edit.tree.max_depth
        self.parent = _Get(edit.parent)
        self.children = _Get(edit.children)
        self.depth = _Get(edit.depth)
        #: the node whose lift is the edit's only change of shape (its subtree one level up), else None
        changes = edit.shape_changes
        self.lifted: int | None = changes[0][1] if len(changes) == 1 and changes[0][0] == "lift" else None

    def at_cap(self, x: int) -> bool:
        return self.max_depth is not None and self.depth[x] >= self.max_depth

    def subtree(self, x: int) -> list[int]:
        out, stack = [], [x]
        while stack:
            g = stack.pop()
            out.append(g)
            stack.extend(reversed(self.children[g]))
        return out


class _Get:
    """``obj[x]`` as ``get(x)``."""

    __slots__ = ("get",)

    def __init__(self, get: Callable[[int], object]) -> None:
        self.get = get

    def __getitem__(self, x: int):
        return self.get(x)


def _is_ancestor(parent: dict[int, int], x: int, y: int) -> bool:
    """Whether ``x`` is a proper ancestor of ``y`` (``parent``: a tree's parent map)."""
    up = parent.get(y, -1)
    while up >= 0:
        if up == x:
            return True
        up = parent.get(up, -1)
    return False


@njit(cache=True, nogil=True)
def _log_allocation_nb(log_odds, to_new, eps):
    """log q of an allocation: each document's log-probability of the side it went to, with
    P(new side) = expit(log_odds) clipped to [eps, 1 - eps]; one pass, one log per document."""
    out = 0.0
    for i in range(log_odds.shape[0]):
        p = clipped_expit(log_odds[i], eps)
        out += math.log(p) if to_new[i] else math.log1p(-p)
    return out


@njit(cache=True)
def _kth_of_union(A, B, skip, k):
    """Element ``k`` of the ascending union of the disjoint ascending ``A`` and ``B`` without
    ``skip``: ``np.union1d(A, B)`` with ``skip`` removed, indexed, without building it."""
    ia = ib = seen = 0
    while True:
        if ib >= B.size or (ia < A.size and A[ia] < B[ib]):
            x = A[ia]
            ia += 1
        else:
            x = B[ib]
            ib += 1
        if x == skip:
            continue
        if seen == k:
            return x
        seen += 1


@njit(cache=True)
def _union_without(A, B, i, j):
    """The ascending union of the disjoint ascending ``A`` and ``B`` without ``i`` and ``j``
    (``np.union1d`` then two masks, in one pass)."""
    out = np.empty(A.size + B.size, dtype=np.int64)
    ia = ib = n = 0
    while ia < A.size or ib < B.size:
        if ib >= B.size or (ia < A.size and A[ia] < B[ib]):
            x = A[ia]
            ia += 1
        else:
            x = B[ib]
            ib += 1
        if x != i and x != j:
            out[n] = x
            n += 1
    return out[:n]


@dataclass(frozen=True)
class MoveResult:
    """An accepted move: ``kind`` is ``"split"``, ``"merge"``, ``"relocate"`` (``other``: the new
    parent), ``"rehang"`` (``other``: the new host; ``added`` and ``removed``: the relays),
    ``"insert"`` or ``"lift"`` (an empty node added below or removed into ``other``, no rows),
    ``"restore"`` (a removed carried node back below ``other``, no rows); ``node`` the node that
    received or gave away the documents, ``other`` the node it split from or merged into,
    ``rows`` the moved rows."""

    kind: str
    node: int
    other: int
    rows: np.ndarray
    #: nodes whose parameter the move drew afresh (their new value is in the state's ``theta``)
    redrawn: tuple[int, ...] = ()
    #: empty nodes the move made (their parameters and concentrations are in the state's) and
    #: removed (a ``"rehang"``'s new and old relays)
    added: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()


class SplitMerge:
    """Exact split-merge attempts on a :class:`MoveState`.

    Parameters
    ----------
    likelihood : Likelihood
    stick_kwargs : dict
        ``alpha0, lam, gamma, max_depth, root_holds_data`` of the stick prior.
    launch_scans : int, optional
        Restricted scans of a new node's launch; by default the family's
        (:attr:`Likelihood.launch_scans`).
    freeze_carried : bool
        Carried nodes keep their parameters (parameters frozen after their birth epoch): a
        split or merge never draws a carried node's parameter afresh (:meth:`collapses`).
    integrate_split_node : bool
        Splits and merges integrate the split node's own parameter out where they can
        (:meth:`collapses`); otherwise they hold it at its current value.
    subset_min_docs : int
        The fewest documents the subset proposal moves (:data:`SUBSET_MIN_DOCS`).
    """

    def __init__(self, likelihood: Likelihood, stick_kwargs: dict, launch_scans: int | None = None,
                 freeze_carried: bool = False, integrate_split_node: bool = False,
                 subset_min_docs: int = SUBSET_MIN_DOCS) -> None:
        if launch_scans is None:
            launch_scans = likelihood.launch_scans
        if launch_scans < 0:
            raise ValueError(f"launch_scans must be >= 0, got {launch_scans}")
        self.lik = likelihood
        self.kw = stick_kwargs
        self.launch_scans = launch_scans
        self.freeze_carried = freeze_carried
        self.integrate_split_node = integrate_split_node
        self._same: dict[int, bool] = {}  # _same_links by depth
        #: merges skip the reverse launch where the ratio without it already rejects (the same
        #: decisions and random stream; False runs every launch, which the tests compare with)
        self.skip_hopeless_launches = True
        if subset_min_docs < 1:
            raise ValueError(f"subset_min_docs must be >= 1, got {subset_min_docs}")
        self.subset_min_docs = subset_min_docs

    @staticmethod
    def index(st: MoveState) -> DocumentIndex:
        """The state's document index (built on first use, then kept by the moves)."""
        if st.index is None:
            st.index = DocumentIndex(st)
        return st.index

    # ------------------------------------------------------------------ node kinds
    def adoptable(self, st: MoveState, tree, c: int, lower: int = 1) -> bool:
        """Whether a new node may take ``c``'s subtree below it: every node in it is born in this
        epoch (no past counts, no previous-epoch parameter, so no time link whose strength
        depends on depth) and it stays within the depth cap ``lower`` levels lower (1 in the
        merged state, where the adoption is still to come; 0 in the split state, where the
        subtree already hangs below the node that adopted it)."""
        cap = tree.max_depth
        if tree is st.tree:  # the live tree: from the index's per-subtree flags
            idx = self.index(st)
            return idx.fresh()[c] and (cap is None or idx.reach()[c] + lower <= cap)
        stack = [c]
        while stack:
            g = stack.pop()
            if st.past.get(g, 0) > 0 or g in st.carried or (cap is not None and tree.depth[g] + lower > cap):
                return False
            stack.extend(tree.children[g])
        return True

    def _adoptable_after_lift(self, st: MoveState, tree: EditedTree, c: int) -> bool:
        """:meth:`adoptable` (one level lower) in a tree that differs from the live one only by
        the lift of ``tree.lifted``, from the index's per-subtree flags: a descendant of the
        lifted node keeps its subtree one level higher, a node off the lifted node's path to the
        root keeps its subtree as it is; an ancestor of the lifted node loses it from its
        subtree and is walked."""
        live, lifted = st.tree, tree.lifted
        if _is_ancestor(live.parent, c, lifted):
            return self.adoptable(st, tree, c)
        idx, cap = self.index(st), tree.max_depth
        reach = idx.reach()[c] - _is_ancestor(live.parent, lifted, c)
        return idx.fresh()[c] and (cap is None or reach < cap)

    def is_new(self, st: MoveState, tree, b: int) -> bool:
        """A node born in this epoch whose children a merge may lift to its parent: a split can
        create it (adopting those children) and a merge remove it. ``tree`` is the state in
        which ``b`` exists, so its children are already one level below where a split adopts
        them from."""
        return (b != ROOT and st.past.get(b, 0) == 0 and b not in st.carried
                and all(self.adoptable(st, tree, c, lower=0) for c in tree.children[b]))

    @staticmethod
    def kept(st: MoveState, b: int) -> bool:
        """A node the window keeps alive without current documents (it may be emptied and
        refilled; its parameter stays)."""
        return b != ROOT and st.past.get(b, 0) > 0

    def _new_places(self, st: MoveState, tree, P: int, a: int) -> list[tuple]:
        """The places ``("new", P, k, m)`` of a new child of ``P`` adopting its next ``m``
        children, each adoptable and not ``a`` (kept in the index for the live tree and for
        the live tree with one node lifted: do not change the list)."""
        if tree is st.tree:
            key = (P, a if tree.parent.get(a) == P else -1)  # a matters only among P's children
        elif getattr(tree, "lifted", None) is not None:
            # the live tree with one node lifted: a function of the live tree and that node
            key = (P, a if a in tree.children[P] else -1, tree.lifted)
        else:
            return self._places_of(st, tree, P, a)
        places = self.index(st).places
        out = places.get(key)
        if out is None:
            out = places[key] = self._places_of(st, tree, P, a)
        return out

    def _places_of(self, st: MoveState, tree, P: int, a: int) -> list[tuple]:
        kids = tree.children[P]
        if tree is st.tree:  # adoptable (one level lower) from the index's per-subtree flags
            idx, cap = self.index(st), tree.max_depth
            fresh, reach = idx.fresh(), idx.reach()
            ok = [c != a and fresh[c] and (cap is None or reach[c] < cap) for c in kids]
        elif getattr(tree, "lifted", None) is not None:
            ok = [c != a and self._adoptable_after_lift(st, tree, c) for c in kids]
        else:
            ok = [c != a and self.adoptable(st, tree, c) for c in kids]  # a stays a partner of the new node
        out = []
        for k in range(len(kids) + 1):
            out.append(("new", P, k, 0))
            m = 1
            while k + m <= len(kids) and ok[k + m - 1]:
                out.append(("new", P, k, m))
                m += 1
        return out

    def places(self, st: MoveState, tree, held: Callable[[int], bool], a: int) -> SplitPlaces:
        """Where a split of ``a`` in the merged state ``tree`` (``held(b)``: whether node ``b``
        holds current documents there) may send documents:
        ``("new", P, k, m)``, a new child of ``P`` at position ``k`` adopting ``P``'s next ``m``
        children (each adoptable, ``a`` excepted), for ``P`` = ``a`` (below the depth cap) and
        ``a``'s parent;
        ``("old", b)`` for each kept child or sibling ``b`` of ``a`` without current documents."""
        groups: list[Sequence[tuple]] = []
        if not tree.at_cap(a):
            groups.append(self._new_places(st, tree, a, a))
        if a != ROOT:
            groups.append(self._new_places(st, tree, tree.parent[a], a))
        near = list(tree.children[a]) + ([c for c in tree.children[tree.parent[a]] if c != a] if a != ROOT else [])
        groups.extend([("old", b)] for b in near if self.kept(st, b) and not held(b))
        return SplitPlaces(groups)

    @staticmethod
    def _insert(tree: TSSBTree, place: tuple, born: int) -> int:
        """Create the new node of ``place`` in ``tree`` (adopting its block of children)."""
        _, P, k, m = place
        return tree.add_parent_of_block(P, k, m, born=born)

    def _log_adoption(self, st: MoveState, split, b: int, theta_b: np.ndarray) -> float:
        """Parent-link log densities of ``b``'s adopted subtrees in the split state minus those
        in the merged state (one level higher, the adopted children linked to ``b``'s parent)."""
        out = 0.0
        P = split.parent[b]
        link = self._link
        known = theta_b is st.theta.get(b)  # b's own parameter (a merge), not a proposed one
        proposed = None if known else self.lik.fixed_node(theta_b, None)  # read for its links only
        for c in split.children[b]:
            d = split.depth[c]
            at_b = link(st, c, b, d) if known else proposed.log_link_below(self._fixed(st, c), d)
            out += at_b - link(st, c, P, d - 1)
            for g in split.subtree(c)[1:]:
                dg, pg = split.depth[g], split.parent[g]
                out += link(st, g, pg, dg) - link(st, g, pg, dg - 1)
        return out

    def _link(self, st: MoveState, c: int, P: int, depth: int, prev: np.ndarray | None = None) -> float:
        """``log_link`` of node ``c``'s parameter below node ``P``'s at ``depth`` (and under its
        time link to ``prev``, ``c``'s previous-epoch parameter, when given), remembered until a
        move changes either parameter (:meth:`DocumentIndex.forget`): the attempts of a sweep
        rescore the same links again and again."""
        memo = self.index(st).links
        key = (self.lik, c, P, depth) if prev is None else (self.lik, c, P, depth, True)
        v = memo.get(key)
        if v is None:
            v = memo[key] = self._fixed(st, P).log_link_below(self._fixed(st, c), depth, prev)
        return v

    # ------------------------------------------------------------------ target pieces
    def _new_node(self, st: MoveState, P: int) -> tuple[np.ndarray, float, int]:
        """Parent parameter, concentration and depth of a new child of ``P`` (``P``'s depth is
        the same in the merged and the split state)."""
        depth = st.tree.depth[P] + 1
        return st.theta[P], self.lik.new_node_concentration(st.concentration[P], depth), depth

    # ------------------------------------------------------------------ proposal
    def _documents(self, st: MoveState, node: int) -> DocumentSet:
        """The document set of ``node``'s rows (kept in the index until a move changes them)."""
        return self.index(st).documents(node, st.X, self.lik.sets_need_terms)

    def _fixed(self, st: MoveState, node: int) -> FixedNode:
        """The likelihood's scorer at ``node``'s current parameters (kept in the index until a
        move changes them)."""
        fixed = self.index(st).fixed
        out = fixed.get(node)
        if out is None:
            theta, conc = (st.anchor, None) if node == ANCHOR else (st.theta[node], st.concentration[node])
            out = fixed[node] = self.lik.fixed_node(theta, conc)
        return out

    def _own_scores(self, st: MoveState, node: int) -> np.ndarray:
        """Log likelihood of each of ``node``'s rows (ascending) at its parameters (kept in the
        index until a move changes its rows or its parameter; a row's score does not depend
        on the other rows scored with it)."""
        idx = self.index(st)
        out = idx.own_scores.get(node)
        if out is None:
            out = idx.own_scores[node] = self._fixed(st, node).rows(RowBlock(st.X, idx.of(node)))
        return out

    def _allocation(self, st: MoveState, a: int, place: tuple, i: int, j: int, others: np.ndarray,
                    rng: np.random.Generator, base: np.ndarray | None = None,
                    theta_a: np.ndarray | None = None, uniforms: np.ndarray | None = None) -> np.ndarray:
        """Log-odds that each of ``others`` goes to the split-off node with ``j`` rather than
        stay with ``i`` (a function of the merged state, ``i``, ``j`` and a fresh launch);
        ``base``, when given, holds their scores at ``a``.

        A kept node: its parameter against ``a``'s. A new node: the launch draws each document
        from its odds between a seed parameter (:meth:`Likelihood.seed_child_theta` of ``x_j``)
        and ``a``'s; then ``launch_scans`` restricted scans each give the two groups (``j``
        with the launched documents, ``i`` with the rest) their posterior modes as new children
        of the place's parent (:meth:`Likelihood.new_node_theta`) and redraw the launch from
        the odds between the two; the last groups' modes give the returned odds.

        ``theta_a``, when given, is ``a``'s parameter in the merged state where it differs from
        the live one (a merge that draws it afresh: :meth:`_merge`). ``uniforms``, when given,
        are the launch's draws (:meth:`_launch_uniforms`), made by the caller."""
        fixed_a = self._fixed(st, a) if theta_a is None else self.lik.fixed_node(theta_a, st.concentration[a])
        if place[0] == "old":
            Xo = RowBlock(st.X, others)
            if base is None:
                base = fixed_a.rows(Xo)
            return self._fixed(st, place[1]).rows(Xo) - base
        _, conc_c, depth_c = self._new_node(st, place[1])
        host = fixed_a if place[1] == a else self._fixed(st, place[1])
        scan = host.launch_scan(st.X, others, j, i, conc_c, depth_c)
        if base is None:
            base = fixed_a.rows(scan.block)  # the scans' slice, where a family slices
        # the draws of one scan after another, in one call
        seed_at = st.theta[a] if theta_a is None else theta_a
        if uniforms is None:
            uniforms = self._launch_uniforms(place, others.size, rng)
        return scan.run(scan.seed_scores(seed_at) - base, uniforms, EPS)

    def _launch_uniforms(self, place: tuple, n_others: int, rng: np.random.Generator) -> np.ndarray | None:
        """The uniforms a launch to ``place`` over ``n_others`` documents draws: one per document
        for the launch and for each scan (a kept node's allocation draws none)."""
        return None if place[0] == "old" else rng.random((self.launch_scans + 1, n_others))

    @staticmethod
    def _log_q(log_odds: np.ndarray, to_new: np.ndarray) -> float:
        return float(_log_allocation_nb(np.ascontiguousarray(log_odds, dtype=np.float64),
                                        np.ascontiguousarray(to_new, dtype=np.bool_), EPS))

    def _log_ratio(self, st: MoveState, split, a: int, b: int, place: tuple, docs: DocumentSet,
                   log_prior: float, log_place: float, log_q: float, theta_b: np.ndarray | None = None,
                   own: float | None = None, host: FixedNode | None = None,
                   conc_b: float | None = None) -> float:
        """log of pi(split) q(merge | split) / (pi(merged) q(split | merged)), with a new node's
        parameter ``theta_b`` drawn from its conditional given its documents ``docs`` and parent:
        the documents' collapsed marginal, plus the link changes of adopted subtrees;
        ``log_prior`` is the collapsed prior's log ratio, ``split`` the split state's tree and
        ``log_place`` the log probability that the split draws ``place`` (:meth:`SplitPlaces.log_prob`).

        ``own``, when given, is the split node's term with its parameter integrated out too
        (:meth:`_own_marginal` of its documents in the split state minus in the merged state),
        in place of ``docs``'s likelihood at its parameter; ``host`` is then the split state's
        ``a`` when ``b`` is its child (its parameter drawn before the test).

        ``conc_b``, when given, is an existing new node's own concentration (a merge): the
        split state is the current one, so ``b``'s documents are scored as the target scores
        them, at the concentration the chain's update gave ``b``, not at the one a new child
        of its parent would start with."""
        if place[0] == "new":
            theta_P, conc_c, depth_c = self._new_node(st, place[1])
            at_b = (host or self._fixed(st, place[1])).log_marginal_below(
                docs, conc_c if conc_b is None else conc_b, depth_c)
            if place[3]:
                at_b += self._log_adoption(st, split, b, theta_b)
        else:
            at_b = self._fixed(st, b).documents(docs)
        data = at_b + own if own is not None else at_b - self._fixed(st, a).documents(docs)
        return log_prior + data - log_place - log_q

    # ------------------------------------------------------------------ the split node's own parameter
    def collapses(self, st: MoveState, merged, a: int, place: tuple) -> bool:
        """Whether a split of ``a`` to ``place`` (or the merge that undoes it) integrates
        ``a``'s own parameter out as well as the new node's.

        With ``integrate_split_node`` it does unless ``a`` is the root and the state gives no
        parent-link target for it (:attr:`MoveState.anchor`), its parameter is frozen
        (``freeze_carried`` and ``a`` carried), the new node adopts some of ``a``'s children,
        or ``a`` has children in the merged state ``merged`` and the family cannot integrate a
        parameter against them (:attr:`Likelihood.integrates_children`; a carried child's two
        links are not conjugate to its parent's parameter either). Then ``a``'s
        parameter has the same links in both states, apart from a new child ``b`` drawn below
        it, and the ratio compares like with like: both groups' documents under integrated
        parameters. Holding ``a`` at its
        parameter instead compares the new node's marginal with a likelihood at a point fitted
        to the same documents; a mode beats a typical posterior draw by about half the
        parameter's dimension in nats, which held back every split of a large node.

        The root matters most: it starts the first epoch's chain holding every document, and
        held at their blend it credits a split with nothing for the documents it keeps.
        Integrating only the root, with other nodes held, was measured as a default and not adopted
        (BENCHMARKS.md, "The root integrated against its anchor")."""
        if not self.integrate_split_node or (a == ROOT and st.anchor is None) or (
                self.freeze_carried and a in st.carried):
            return False
        if place[0] == "new" and place[1] == a and place[3]:
            return False
        kids = merged.children[a]
        return not kids or (self.lik.integrates_children and not any(c in st.carried for c in kids))

    def _own_links(self, st: MoveState, a: int, exclude: int) -> tuple[int, int, np.ndarray | None, np.ndarray | None]:
        """``a``'s parent (:data:`ANCHOR` for the root), depth, previous-epoch parameter
        (carried) and children's parameters (``exclude`` left out), as :meth:`_own_marginal` and
        :meth:`_draw_own` read them."""
        t = st.tree
        kids = [c for c in t.children[a] if c != exclude]
        children = np.stack([st.theta[c] for c in kids]) if kids else None
        was = st.previous.get(a) if a in st.carried else None
        return t.parent[a], t.depth[a], None if was is None else was.theta, children

    def _own_marginal(self, st: MoveState, a: int, docs: DocumentSet | None = None, exclude: int = -1) -> float:
        """Log marginal of ``docs`` (by default ``a``'s current documents) at node ``a`` with
        its parameter integrated out under its parent link, its time link when carried and its
        children's links (``exclude`` left out), at ``a``'s concentration. A leaf's value for its
        current documents is remembered."""
        P, depth, prev, children = self._own_links(st, a, exclude)
        if children is not None:
            docs = self._documents(st, a) if docs is None else docs
            return self.lik.linked_log_marginal(docs, self._fixed(st, P).theta, st.concentration[a], depth, prev,
                                                children)
        if docs is not None:
            return self._fixed(st, P).log_marginal_below(docs, st.concentration[a], depth, prev)
        key = (self.lik, a, P, depth, "own", prev is not None)
        return self._remembered_marginal(st, key, a, P, st.concentration[a], depth, prev)

    def _draw_own(self, st: MoveState, a: int, docs: DocumentSet, rng: np.random.Generator,
                  exclude: int = -1) -> np.ndarray:
        """A draw of ``a``'s parameter from its conditional given ``docs`` and its links."""
        P, depth, prev, children = self._own_links(st, a, exclude)
        return self.lik.sample_linked_theta(self._fixed(st, P).theta, st.concentration[a], depth, docs, rng, prev,
                                            children)

    def _set_own(self, st: MoveState, a: int, theta: np.ndarray) -> None:
        st.theta[a] = theta
        self.index(st).forget(a)

    # ------------------------------------------------------------------ selection
    def partners(self, st: MoveState, tree, b: int) -> list[int]:
        """Nodes ``b`` could merge into: its parent and its siblings."""
        P = tree.parent[b]
        return [P] + [c for c in tree.children[P] if c != b]

    @staticmethod
    def _log_select_split(n: int, n_a: int) -> float:
        """log P(draw i, then j at the same node) in the merged state (``n`` documents, ``n_a``
        at the node): i uniform, j uniform among the other documents of i's node."""
        return -_log_count(n) - _log_count(n_a - 1)

    @staticmethod
    def _log_select_merge(n_occupied: int, n_partners: int, n_b: int, n_a: int) -> float:
        """log P(draw node b, partner a, j in b, then i among the other documents of a and b) in
        the split state (``n_occupied`` nodes hold documents; ``n_b`` and ``n_a`` at b and a)."""
        return -_log_count(n_occupied) - _log_count(n_partners) - _log_count(n_b) - _log_count(n_b + n_a - 1)

    # ------------------------------------------------------------------ one attempt
    def attempt(self, st: MoveState, rng: np.random.Generator, *, born: int = 0,
                proposal: str = "launch") -> MoveResult | None:
        """One attempt (see the module docstring); the accepted move, if any, is applied to ``st``.

        ``proposal`` is how a split allocates the split node's other documents, and so the
        reverse-split probability a merge pays: ``"launch"`` (the launch and its restricted
        scans) or ``"subset"`` (a uniform size, then a uniform subset of that size;
        :func:`subset_log_q`). Each is an exact kernel on its own."""
        if proposal not in PROPOSALS:
            raise ValueError(f"proposal must be one of {PROPOSALS}, got {proposal!r}")
        n = st.labels.size
        if n < 2:
            return None
        idx = self.index(st)
        if rng.random() < 0.5:  # a split: two documents of one node
            i = int(rng.integers(n))
            a = int(st.labels[i])
            rows_a = idx.of(a)
            if rows_a.size < 2:
                return None
            # j uniform among rows_a without i (ascending, i at position p): the k-th of them
            k = int(rng.integers(rows_a.size - 1))
            j = int(rows_a[k + (k >= int(np.searchsorted(rows_a, i)))])
            return self._split(st, a, i, j, rng, born, proposal)
        occupied = idx.occupied()  # a merge: a node, a partner, a document of each group
        b = int(occupied[rng.integers(occupied.size)])
        if b == ROOT:
            return None
        partners = self.partners(st, st.tree, b)
        a = partners[int(rng.integers(len(partners)))]
        rows_b = idx.of(b)
        j = int(rows_b[rng.integers(rows_b.size)])
        rows_a = idx.of(a)
        n_pool = rows_a.size + rows_b.size - 1  # the documents of a and b (disjoint) but j
        if n_pool == 0:
            return None
        i = int(_kth_of_union(rows_a, rows_b, j, rng.integers(n_pool)))
        if st.labels[i] == b:
            return None  # a split keeps i at a: this draw cannot reverse one
        return self._merge(st, a, b, i, j, rng, proposal)

    # ------------------------------------------------------------------ relocation
    def relocate(self, st: MoveState, rng: np.random.Generator) -> MoveResult | None:
        """Move a new node to another parent and position (reversible jump, exact).

        Draw ``b`` uniformly among the new nodes, a parent ``P2`` uniformly among the nodes
        below the depth cap other than ``b``, and a position uniformly among ``P2``'s
        ``len(children) + 1`` slots. ``b``'s parameter is redrawn from its conditional under
        ``P2``, so the ratio holds the collapsed marginals of ``b``'s documents under the old
        and new parent, the prior ratio and the ratio of the draw probabilities. ``b`` keeps
        its own concentration (both marginals are read at it), so the move back is the same
        move in reverse."""
        t = st.tree
        idx = self.index(st)
        new_nodes = idx.new_leaves()
        if not new_nodes:
            return None
        b = new_nodes[int(rng.integers(len(new_nodes)))]
        below, at = idx.hosts()  # P2 uniform among them, b excepted
        k = int(rng.integers(len(below) - (b in at)))
        P2 = below[k + 1] if b in at and k >= at[b] else below[k]
        P1 = t.parent[b]
        if P1 != P2 and t.children[P1] == [b] and P1 != ROOT and P1 not in idx.rows and not st.past.get(P1, 0):
            return None  # P1 would hold nothing in its subtree: it would leave the tree, no move back
        k1 = t.children[P1].index(b)
        slots2 = len(t.children[P2]) + (0 if P2 == P1 else 1)
        k2 = int(rng.integers(slots2))
        if P2 == P1 and k2 == k1:
            return None
        rows_b = idx.of(b)
        edit = idx.prior.edit()  # detach b (with its documents) and re-attach it under P2
        edit.add(b, 0.0, -float(rows_b.size))
        edit.lift(b)
        edit.insert(b, P2, k2)
        edit.add(b, 0.0, float(rows_b.size))
        slots1 = len(t.children[P1])  # P1's slots once b has left
        # new leaves afterwards: P1 may become one, P2 stops being one (b stays one)
        n_new_after = len(new_nodes)
        if P2 != P1:
            left_leaf = (t.children[P1] == [b] and P1 != ROOT and st.past.get(P1, 0) == 0
                         and P1 not in st.carried)
            n_new_after += int(left_leaf) - int(P2 in new_nodes)
        th2, _, d2 = self._new_node(st, P2)
        at_2 = self._marginal(st, b, P2)
        at_1 = at_2 if P2 == P1 else self._marginal(st, b, P1)  # a move among siblings
        log_a = (idx.prior.delta(edit, **self.kw) + at_2 - at_1
                 + _log_count(len(new_nodes)) - _log_count(n_new_after) + _log_count(slots2) - _log_count(slots1))
        if _log_uniform(rng) >= log_a:
            return None
        # keep b's id: detach and re-attach it
        t.children[P1].remove(b)
        t.children[P2].insert(k2, b)
        t.parent[b] = P2
        t.depth[b] = t.depth[P2] + 1
        idx.prior.apply(edit)
        idx.changed()
        idx.forget(b)
        st.theta[b] = self.lik.sample_node_theta(th2, st.concentration[b], d2, self._documents(st, b), rng)
        return MoveResult("relocate", b, P2, rows_b)

    def relays_above(self, st: MoveState, b: int) -> list[int]:
        """The relays above ``b``, top first: its nearest ancestors, upwards, that were born in
        this epoch and hold nothing but the one child on the way to ``b`` (no documents, past
        or current, and no other child)."""
        t, idx = st.tree, self.index(st)
        out = []
        c, p = b, t.parent[b]
        while (p != ROOT and t.children[p] == [c] and p not in idx.rows and not st.past.get(p, 0)
               and p not in st.carried):
            out.append(p)
            c, p = p, t.parent[p]
        out.reverse()
        return out

    def _relay_sets(self, st: MoveState, rows_b: np.ndarray, n_relays: int) -> list[DocumentSet]:
        """The document sets a chain of ``n_relays`` relays above a leaf with rows ``rows_b``
        draws its parameters from, top first (:func:`relay_documents`)."""
        return [document_set(st.X, relay_documents(rows_b, k, n_relays), self.lik.sets_need_terms)
                for k in range(1, n_relays + 1)]

    def _relay_terms(self, st: MoveState, sets: list[DocumentSet], host: int, thetas: list[np.ndarray],
                     conc_b: float) -> float:
        """``sum_k log link(theta_k | theta_{k-1}) - log q(theta_k)`` over a chain of relays
        below ``host`` with parameters ``thetas`` (top first), where ``q`` draws relay ``k`` of
        ``L`` from its parent's link and the ``k / L`` part of :data:`RELAY_SHARE` of the leaf's
        documents, ``sets[k - 1]`` (:meth:`_relay_sets`): by Bayes, each term is the documents'
        marginal below the relay's parent minus their likelihood at the relay."""
        out, parent, depth = 0.0, st.theta[host], st.tree.depth[host]
        for k, (theta, docs) in enumerate(zip(thetas, sets, strict=True), 1):
            out += (self.lik.log_marginal(docs, parent, conc_b, depth + k)
                    - self.lik.log_likelihood(docs, theta, conc_b))
            parent = theta
        return out

    def rehang(self, st: MoveState, rng: np.random.Generator, *, born: int = 0) -> MoveResult | None:
        """Move a new leaf at the depth cap below another host, through a fresh chain of relays
        down to the cap (reversible jump, exact).

        A topic that appears in an epoch whose tree already reaches the cap can only start as
        a child of a node one level above it, inside some unrelated branch: a branch of its
        own needs empty internal nodes above it (relays), and neither the split-merge moves
        nor :meth:`relocate` (which keeps a leaf's depth only among parents one level above
        the cap) nor :meth:`lift` (which inserts one relay at a time, the leaf first lifted
        off the cap) make them in one step. This move does.

        Draw ``b`` uniformly among the new leaves at the cap; its chain is
        :meth:`relays_above` it, hung below ``T``. Draw a depth uniformly among those of the
        nodes below the cap outside that chain, a host ``P2`` uniformly among those nodes at
        that depth (so that the few shallow hosts, the root among them, are drawn as often as
        the many deep ones) and a position uniformly among ``P2``'s children once the chain
        has left. The proposal removes ``b``'s relays and hangs
        ``b`` below ``P2`` through ``cap - depth(P2) - 1`` new relays, each parameter drawn
        from its parent link and a part of ``b``'s documents (:func:`relay_documents`). The
        ratio holds the collapsed prior's change, ``b``'s collapsed marginal below its new
        and its old parent, and for each relay made or removed its link against its proposal
        density (:meth:`_relay_terms`). The leaves at the cap and the hosts outside the chain
        are the same before and after, so the draw probabilities differ only in the counts
        of hosts at ``P2``'s and ``T``'s depths and of positions. A move that would leave
        ``T`` as an empty leaf, or leave ``P2`` holding nothing but the new chain (so that the
        chain would run on above it), is not proposed: its reverse could not be drawn. ``b``'s
        parameter is redrawn below its new parent, as :meth:`relocate` does."""
        t = st.tree
        cap = t.max_depth
        if cap is None:
            return None
        idx = self.index(st)
        leaves = [c for c in idx.new_leaves() if t.depth[c] == cap]
        if not leaves:
            return None
        b = leaves[int(rng.integers(len(leaves)))]
        relays = self.relays_above(st, b)
        top = relays[0] if relays else b
        T = t.parent[top]
        out = set(relays)
        by_depth: dict[int, list[int]] = {}
        for h in idx.hosts()[0]:
            if h not in out:
                by_depth.setdefault(t.depth[h], []).append(h)
        depths = sorted(by_depth)
        hosts = by_depth[depths[int(rng.integers(len(depths)))]]
        P2 = hosts[int(rng.integers(len(hosts)))]
        k1 = t.children[T].index(top)
        slots2 = len(t.children[P2]) + (0 if P2 == T else 1)
        k2 = int(rng.integers(slots2))
        if P2 == T and k2 == k1:
            return None

        def holds_nothing(x: int) -> bool:
            return x != ROOT and x not in idx.rows and not st.past.get(x, 0)

        if P2 != T and ((t.children[T] == [top] and holds_nothing(T))  # T left an empty leaf
                        or (not t.children[P2] and holds_nothing(P2))):  # P2 would become a relay
            return None
        rows_b = idx.of(b)
        conc_b = st.concentration[b]
        n_new = cap - t.depth[P2] - 1
        new_ids = list(range(t.next_id, t.next_id + n_new))  # bottom first, as inserted below
        edit = idx.prior.edit()
        edit.add(b, 0.0, -float(rows_b.size))
        edit.lift(b)
        for r in reversed(relays):
            edit.lift(r)
        edit.insert(b, P2, k2)
        for c in new_ids:
            edit.insert(c, P2, k2, 1)
        edit.add(b, 0.0, float(rows_b.size))
        thetas, parent = [], st.theta[P2]
        new_sets = self._relay_sets(st, rows_b, n_new)
        for k, docs in enumerate(new_sets, 1):  # top first
            parent = self.lik.sample_node_theta(parent, conc_b, t.depth[P2] + k, docs, rng)
            thetas.append(parent)
        bottom_old = relays[-1] if relays else T
        old_sets = new_sets if len(relays) == n_new else self._relay_sets(st, rows_b, len(relays))
        at_new = (self.lik.log_marginal(self._documents(st, b), thetas[-1], conc_b, cap) if thetas
                  else self._marginal(st, b, P2))
        log_a = (idx.prior.delta(edit, **self.kw) + at_new - self._marginal(st, b, bottom_old)
                 + self._relay_terms(st, new_sets, P2, thetas, conc_b)
                 - self._relay_terms(st, old_sets, T, [st.theta[r] for r in relays], conc_b)
                 + _log_count(len(hosts)) - _log_count(len(by_depth[t.depth[T]]))
                 + _log_count(slots2) - _log_count(len(t.children[T])))  # T's positions once the chain has left
        if _log_uniform(rng) >= log_a:
            return None
        t.children[t.parent[b]].remove(b)
        if relays:
            t.remove_subtree(top)
        for r in relays:
            del st.theta[r], st.concentration[r]
            idx.forget(r)
        t.children[P2].insert(k2, b)
        t.parent[b] = P2
        t.depth[b] = t.depth[P2] + 1
        for c in new_ids:
            t.add_parent_of_block(P2, k2, 1, born=born, node_id=None)
        for k, c in enumerate(reversed(new_ids), 1):  # top first
            st.theta[c] = thetas[k - 1]
            st.concentration[c] = self.lik.new_node_concentration(st.concentration[t.parent[c]], t.depth[c])
        idx.prior.apply(edit)
        idx.changed()
        idx.forget(b)
        parent_b = t.parent[b]
        st.theta[b] = self.lik.sample_node_theta(st.theta[parent_b], conc_b, cap, self._documents(st, b), rng)
        return MoveResult("rehang", b, P2, rows_b, added=tuple(new_ids), removed=tuple(relays))

    def _marginal(self, st: MoveState, b: int, P: int) -> float:
        """The collapsed log marginal of ``b``'s documents as a new child of ``P`` (at ``P``'s
        depth and ``b``'s own concentration), remembered until a move changes ``b``'s documents
        or either node's parameter (a sweep's relocations draw the same few new leaves again and
        again)."""
        depth = st.tree.depth[P] + 1
        return self._remembered_marginal(st, (self.lik, b, P, depth), b, P, st.concentration[b], depth)

    def _remembered_marginal(self, st: MoveState, key: tuple, b: int, P: int, conc: float,
                             depth: int, prev: np.ndarray | None = None) -> float:
        """``log_marginal`` of ``b``'s documents below node ``P``'s parameter, kept in the
        index's memo under ``key``, whose second and third entries are ``b`` and ``P`` (so
        that :meth:`DocumentIndex.forget` and :meth:`DocumentIndex.move` drop it)."""
        idx = self.index(st)
        v = idx.marginals.get(key)
        if v is None:
            v = idx.marginals[key] = self._fixed(st, P).log_marginal_below(self._documents(st, b), conc, depth, prev)
        return v

    # ------------------------------------------------------------------ empty internal nodes
    def empty_inner(self, st: MoveState) -> list[int]:
        """New internal nodes without current documents, in pre-order: those :meth:`lift` may
        remove (cached in the index until a move changes the tree or the documents)."""
        idx = self.index(st)
        if idx.empty_inner is None:
            t = st.tree
            idx.empty_inner = [c for c in idx.preorder()
                               if t.children[c] and c not in idx.rows and self.is_new(st, t, c)]
        return idx.empty_inner

    def _blocks(self, st: MoveState, tree, P: int) -> list[tuple]:
        """The places ``("new", P, k, m)`` of a new child of ``P`` adopting ``m >= 1`` of its
        children (each adoptable) in the merged state ``tree`` (kept in the index for the live
        tree, beside :meth:`_new_places`: do not change the list)."""
        if tree is st.tree:
            memo = self.index(st).places
            out = memo.get((P, -2))
            if out is None:
                out = memo[(P, -2)] = [pl for pl in self._new_places(st, tree, P, -1) if pl[3] > 0]
            return out
        return [pl for pl in self._new_places(st, tree, P, -1) if pl[3] > 0]

    def lift(self, st: MoveState, rng: np.random.Generator, *, born: int = 0) -> MoveResult | None:
        """Insert an empty new node above a block of siblings, or remove an empty new node and
        lift its children (reversible jump, exact).

        The split-merge moves always move a document, so they can neither create nor remove a
        node that holds none; an internal node whose documents have all left (it only joins
        its children) duplicates its parent and is removed here. With probability 1/2 draw a
        host ``P`` uniformly among the nodes below the depth cap and a block uniformly among
        its runs of ``m >= 1`` consecutive adoptable children (:meth:`adoptable`), and propose
        a new node ``c`` adopting them, its parameter drawn from its parent link
        (:meth:`Likelihood.sample_node_theta` of no documents: the exact conditional of a node
        without documents); else draw ``c`` uniformly among :meth:`empty_inner` and propose
        to remove it, its children taking its place. ``c`` has no documents, so its collapsed
        marginal is 1 and its parameter's link cancels against its proposal: the ratio holds
        the collapsed prior's change, the link changes of the adopted subtrees (their parents'
        parameters and their depths, :meth:`_log_adoption`) and the draw probabilities.
        """
        t = st.tree
        idx = self.index(st)
        empty = self.empty_inner(st)
        hosts, _ = idx.hosts()
        if rng.random() < 0.5:  # insert
            P = hosts[int(rng.integers(len(hosts)))]
            blocks = self._blocks(st, t, P)
            if not blocks:
                return None
            place = blocks[int(rng.integers(len(blocks)))]
            theta_P, conc_c, depth_c = self._new_node(st, P)
            none = DocumentSet(0.0, np.zeros_like(np.asarray(theta_P, dtype=np.float64)), 0.0)
            theta_c = self.lik.sample_node_theta(theta_P, conc_c, depth_c, none, rng)
            c = t.next_id  # the id the insertion below will give it
            edit = idx.prior.edit()
            edit.insert(c, P, place[2], place[3])
            log_a = (idx.prior.delta(edit, **self.kw) + self._log_adoption(st, EditedTree(edit), c, theta_c)
                     - _log_count(len(empty) + 1) + _log_count(len(hosts)) + _log_count(len(blocks)))
            if _log_uniform(rng) >= log_a:
                return None
            c = self._insert(t, place, born)
            return self._added(st, "insert", c, theta_c, conc_c, edit)
        if not empty:
            return None
        c = empty[int(rng.integers(len(empty)))]
        P = t.parent[c]
        edit = idx.prior.edit()
        edit.lift(c)
        blocks = self._blocks(st, EditedTree(edit), P)
        n_hosts = self._hosts_after_lift(t, c, len(hosts), idx.reach())
        log_a = (idx.prior.delta(edit, **self.kw) - self._log_adoption(st, t, c, st.theta[c])
                 + _log_count(len(empty)) - _log_count(n_hosts) - _log_count(len(blocks)))
        if _log_uniform(rng) >= log_a:
            return None
        return self._remove(st, c, edit)

    @staticmethod
    def _hosts_after_lift(t, c: int, n_hosts: int, reach: dict[int, int] | None = None) -> int:
        """The count of nodes below the depth cap once ``c`` is lifted: ``c`` leaves them (if
        below the cap), and its subtree's nodes at the cap join them one level higher
        (``reach``: :meth:`DocumentIndex.reach`, which says when there are none)."""
        cap = t.max_depth
        if cap is None:
            return n_hosts - 1
        if reach is not None and reach[c] < cap:
            return n_hosts - int(t.depth[c] < cap)
        return n_hosts - int(t.depth[c] < cap) + sum(1 for g in t.subtree(c)[1:] if t.depth[g] >= cap)

    def _added(self, st: MoveState, kind: str, c: int, theta: np.ndarray, concentration: float,
               edit) -> MoveResult:
        """Finish an accepted insertion or return of the empty node ``c``, already in the tree:
        its parameter and concentration, and the prior's counts."""
        idx = self.index(st)
        idx.forget(c)
        st.theta[c] = theta
        st.concentration[c] = concentration
        idx.prior.apply(edit)
        idx.changed()
        return MoveResult(kind, c, st.tree.parent[c], _NO_ROWS)

    def _remove(self, st: MoveState, c: int, edit) -> MoveResult:
        """Carry out an accepted lift of the empty node ``c`` (its children rise to its parent)."""
        t, idx = st.tree, self.index(st)
        P = t.parent[c]
        t.merge_into_parent(c)
        del st.theta[c], st.concentration[c]
        idx.forget(c)
        idx.prior.apply(edit)
        idx.changed()
        return MoveResult("lift", c, P, _NO_ROWS)

    # ------------------------------------------------------------------ carried internal nodes
    def removable_carried(self, st: MoveState) -> list[int]:
        """Carried internal nodes without documents of their own, past or current, in pre-order:
        those :meth:`lift_carried` may remove."""
        idx = self.index(st)
        if idx._removable is None:
            t, prev = st.tree, st.previous
            idx._removable = [c for c in idx.preorder() if c != ROOT and t.children[c] and c in prev
                              and not st.past.get(c, 0) and c not in idx.rows]
        return idx._removable

    def dormant(self, st: MoveState) -> list[int]:
        """Carried nodes out of the tree without past documents, ascending: those
        :meth:`lift_carried` may bring back."""
        idx = self.index(st)
        if idx._dormant is None:
            idx._dormant = sorted(i for i in st.previous if i not in st.tree.parent and not st.past.get(i, 0))
        return idx._dormant

    def _deeper_blocks(self, st: MoveState, P: int, lifted: int | None = None) -> list[tuple[int, int]]:
        """The runs ``(k, m)`` of ``m >= 1`` consecutive children of ``P`` from position ``k``
        whose subtrees stay within the depth cap one level lower (any nodes, carried or new),
        in the live tree or once its child ``lifted`` is lifted (its children in its place,
        their subtrees one level higher)."""
        t = st.tree
        kids, cap = t.children[P], t.max_depth
        if cap is None:
            ok = [True] * (len(kids) if lifted is None else len(kids) - 1 + len(t.children[lifted]))
        else:
            reach = self.index(st).reach()
            ok = [reach[c] < cap for c in kids]
            if lifted is not None:
                pos = kids.index(lifted)
                ok[pos:pos + 1] = [reach[c] - 1 < cap for c in t.children[lifted]]
        out = []
        n = len(ok)
        for k in range(n):
            m = 1
            while k + m <= n and ok[k + m - 1]:
                out.append((k, m))
                m += 1
        return out

    def _log_relink(self, st: MoveState, tree, x: int, theta_x: np.ndarray) -> tuple[float, list[int]]:
        """The target's change below ``x`` in ``tree`` (where ``x`` exists) when ``x`` is lifted
        (its children linked to ``x``'s parent instead of ``x``, every node below one level
        higher: link strengths depend on depth), as (log of with ``x`` minus without, the
        children of ``x`` that are leaves).

        A leaf child's parameter is drawn afresh by the move from its conditional given its
        documents and its new parent (:meth:`_redraw`), so it enters through the collapsed
        marginal of its documents (:meth:`Likelihood.log_marginal`): the ratio does not judge
        a parameter fitted to one parent under another. Every other node keeps its parameter
        and enters through its link densities. A carried node is scored under both its links,
        parent and time (its previous parameter), a node born in this epoch under its parent
        link. Values at the nodes' current parameters come from the index's memos
        (:meth:`_link`, :meth:`_leaf_marginal`); ``theta_x`` counts as current when it is
        ``x``'s own parameter."""
        lik, link, out, leaves = self.lik, self._link, 0.0, []
        up = tree.parent[x]
        known = theta_x is st.theta.get(x)  # x's own parameter (a removal), not a proposed one
        proposed = None if known else lik.fixed_node(theta_x, None)  # read for its links only
        cap = tree.max_depth
        for c in tree.children[x]:
            d = tree.depth[c]
            if not tree.children[c]:
                prev = st.previous.get(c)
                prev = None if prev is None else prev.theta
                if known:
                    now = self._leaf_marginal(st, c, x, d, prev)
                else:
                    now = proposed.log_marginal_below(self._documents(st, c), st.concentration[c], d, prev)
                out += now - self._leaf_marginal(st, c, up, d - 1, prev)
                leaves.append(c)
                continue
            # below c, each node keeps its parent: its two densities differ only by the
            # strengths at its depth and one level higher, often the same (kappa1 = 1)
            deeper = cap is None or not all(self._same_links(e) for e in range(d + 1, cap + 1))
            for g in tree.subtree(c) if deeper else (c,):
                if g != c:
                    d = tree.depth[g]
                    if self._same_links(d):
                        continue  # same parent, same strengths: the two densities are one number
                prev = st.previous.get(g)
                prev = None if prev is None else prev.theta
                if g == c:
                    now = link(st, g, x, d, prev) if known else proposed.log_link_below(self._fixed(st, g), d, prev)
                    out += now - link(st, g, up, d - 1, prev)
                else:
                    pg = tree.parent[g]
                    out += link(st, g, pg, d, prev) - link(st, g, pg, d - 1, prev)
        return out, leaves

    def _leaf_marginal(self, st: MoveState, c: int, P: int, depth: int, prev: np.ndarray | None) -> float:
        """The collapsed log marginal of leaf ``c``'s documents below node ``P`` at ``depth``,
        under its time link to ``prev`` too when given, at ``c``'s own concentration;
        remembered like :meth:`_marginal` (its own key: the concentration differs)."""
        return self._remembered_marginal(st, (self.lik, c, P, depth, "leaf", prev is not None), c, P,
                                         st.concentration[c], depth, prev)

    def _redraw(self, st: MoveState, leaves: list[int], rng: np.random.Generator) -> tuple[int, ...]:
        """Draw each of ``leaves`` a parameter from its conditional given its documents, its
        parent's parameter and its time link, in the state's current tree (the proposal whose
        density the collapsed marginals in :meth:`_log_relink` cancel)."""
        t, idx = st.tree, self.index(st)
        for c in leaves:
            prev = st.previous.get(c)
            st.theta[c] = self.lik.sample_node_theta(st.theta[t.parent[c]], st.concentration[c], t.depth[c],
                                                     self._documents(st, c), rng,
                                                     theta_prev=None if prev is None else prev.theta)
            idx.forget(c)  # its link densities and marginals read the old parameter
        return tuple(leaves)

    def _same_links(self, depth: int) -> bool:
        """Whether a node's links are as strong at ``depth`` as one level higher (``kappa1 = 1``,
        the default): a link density depends on depth only through these strengths (the
        likelihood's strengths are fixed while a :class:`SplitMerge` is in use; the sampler
        makes one per sweep)."""
        same = self._same.get(depth)
        if same is None:
            par, tim = self.lik.link_strengths(np.array([depth, depth - 1]))
            same = self._same[depth] = bool(par[0] == par[1] and tim[0] == tim[1])
        return same

    def lift_carried(self, st: MoveState, rng: np.random.Generator) -> MoveResult | None:
        """Remove a carried internal node without documents of its own, lifting its children,
        or bring a removed one back above a block of siblings (reversible jump, exact).

        A carried node keeps its id and its time link to its previous-epoch parameter: removed,
        it waits out of the tree (:meth:`dormant`) and may return anywhere. With probability
        1/2 draw ``d`` uniformly among the dormant nodes, a host ``P`` uniformly among the
        nodes below the depth cap and a block uniformly among the runs of ``m >= 1``
        consecutive children of ``P`` that fit one level lower (:meth:`_deeper_blocks`), and
        propose ``d`` adopting them, its parameter drawn from its prior under both links
        (:meth:`Likelihood.sample_node_theta` of no documents with its previous parameter);
        else draw ``c`` uniformly among :meth:`removable_carried` and propose to remove it.
        ``c`` holds no documents, so its own link density cancels against the draw of its
        parameter: the ratio holds the collapsed prior's change (the past documents below
        ``c`` rise with their nodes), the lifted subtree's terms under both links (leaf
        children drawn afresh, through their documents' marginals; others through their link
        densities: :meth:`_log_relink`) and the draw probabilities.
        """
        t = st.tree
        idx = self.index(st)
        hosts, _ = idx.hosts()
        removable = self.removable_carried(st)
        dormant = self.dormant(st)
        if rng.random() < 0.5:  # bring a dormant node back
            if not dormant:
                return None
            d = dormant[int(rng.integers(len(dormant)))]
            P = hosts[int(rng.integers(len(hosts)))]
            blocks = self._deeper_blocks(st, P)
            if not blocks:
                return None
            k, m = blocks[int(rng.integers(len(blocks)))]
            prev = st.previous[d]
            depth_d = t.depth[P] + 1
            none = DocumentSet(0.0, np.zeros_like(np.asarray(prev.theta, dtype=np.float64)), 0.0)
            theta_d = self.lik.sample_node_theta(st.theta[P], prev.concentration, depth_d, none, rng,
                                                 theta_prev=prev.theta)
            edit = idx.prior.edit()
            edit.insert(d, P, k, m)
            relink, leaves = self._log_relink(st, EditedTree(edit), d, theta_d)
            log_a = (idx.prior.delta(edit, **self.kw) + relink
                     - _log_count(len(removable) + 1) + _log_count(len(dormant)) + _log_count(len(hosts))
                     + _log_count(len(blocks)))
            if _log_uniform(rng) >= log_a:
                return None
            t.add_parent_of_block(P, k, m, born=prev.born, node_id=d)
            res = self._added(st, "restore", d, theta_d, prev.concentration, edit)
            return replace(res, redrawn=self._redraw(st, leaves, rng))
        if not removable:
            return None
        c = removable[int(rng.integers(len(removable)))]
        P = t.parent[c]
        edit = idx.prior.edit()
        edit.lift(c)
        blocks = self._deeper_blocks(st, P, lifted=c)
        n_hosts = self._hosts_after_lift(t, c, len(hosts), idx.reach())
        relink, leaves = self._log_relink(st, t, c, st.theta[c])
        log_a = (idx.prior.delta(edit, **self.kw) - relink
                 + _log_count(len(removable)) - _log_count(len(dormant) + 1) - _log_count(n_hosts)
                 - _log_count(len(blocks)))
        if _log_uniform(rng) >= log_a:
            return None
        res = self._remove(st, c, edit)
        return replace(res, redrawn=self._redraw(st, leaves, rng))

    def _split(self, st: MoveState, a: int, i: int, j: int, rng: np.random.Generator,
               born: int, proposal: str = "launch") -> MoveResult | None:
        idx = self.index(st)
        places = self.places(st, st.tree, lambda x: x in idx.rows, a)
        if not places:
            return None
        place = places.draw(rng)
        rows_a = idx.of(a)
        keep = (rows_a != i) & (rows_a != j)
        others = rows_a[keep]
        if proposal == "subset":
            low = self.subset_min_docs - 1  # j moves too
            if others.size < low:
                return None
            to_new = np.zeros(others.size, dtype=np.bool_)
            to_new[rng.permutation(others.size)[:int(rng.integers(low, others.size + 1))]] = True
            log_q = subset_log_q(others.size, int(np.count_nonzero(to_new)), low)
        else:
            lo = self._allocation(st, a, place, i, j, others, rng, self._own_scores(st, a)[keep])
            to_new = rng.random(others.size) < launch_probabilities(lo, EPS)
            log_q = self._log_q(lo, to_new)
        rows_b = np.concatenate([[j], others[to_new]]).astype(np.int64)
        docs = document_set(st.X, rows_b, self.lik.sets_need_terms)
        own = host = theta_a = docs_rest = None
        if self.collapses(st, st.tree, a, place):
            docs_rest = document_set(st.X, np.concatenate([[i], others[~to_new]]).astype(np.int64),
                                     self.lik.sets_need_terms)
            own = self._own_marginal(st, a, docs_rest) - self._own_marginal(st, a)
            if place[0] == "new" and place[1] == a:
                # b below a: a's parameter in the split state is drawn first (given its other
                # documents and links), and b's documents are scored below that draw
                theta_a = self._draw_own(st, a, docs_rest, rng)
                host = self.lik.fixed_node(theta_a, st.concentration[a])
        edit = idx.prior.edit()
        theta_b = None
        if place[0] == "new":
            theta_P, conc_c, depth_c = self._new_node(st, place[1])
            if host is not None:
                theta_P = theta_a
            if place[3]:  # adopted children's links are scored at the drawn parameter
                theta_b = self.lik.sample_node_theta(theta_P, conc_c, depth_c, docs, rng)
            b = st.tree.next_id  # the id the insertion below will give it
            edit.insert(b, place[1], place[2], place[3])
        else:
            b = place[1]
        edit.move(a, b, 0.0, float(rows_b.size))
        split = EditedTree(edit)
        n_a = idx.count(a)
        # b's partners in the split state: its parent's children (a new b among P's children
        # once it has adopted its block; a kept b where it is)
        t = st.tree
        n_partners = (len(t.children[place[1]]) - place[3] + 1 if place[0] == "new"
                      else len(t.children[t.parent[b]]))
        log_a = (self._log_ratio(st, split, a, b, place, docs, idx.prior.delta(edit, **self.kw),
                                 places.log_prob(place),
                                 log_q, theta_b, own, host)
                 + self._log_select_merge(len(idx.rows) + 1, n_partners, rows_b.size, n_a - rows_b.size)
                 - self._log_select_split(st.labels.size, n_a))
        if _log_uniform(rng) >= log_a:
            return None
        if own is not None:  # a's parameter from its conditional in the split state
            self._set_own(st, a, theta_a if theta_a is not None else self._draw_own(st, a, docs_rest, rng))
        if place[0] == "new":
            if theta_b is None:
                # A childless new node's ratio is free of its parameter (the collapsed marginal):
                # drawing it after the acceptance test is the same kernel, and a rejected split
                # (most of them) skips the draw.
                theta_b = self.lik.sample_node_theta(theta_P, conc_c, depth_c, docs, rng)
            b = self._insert(st.tree, place, born)
            idx.forget(b)
            st.theta[b] = theta_b
            st.concentration[b] = conc_c
        st.labels[rows_b] = b
        idx.prior.apply(edit)
        idx.changed()
        idx.move(a, b, rows_b)
        return MoveResult("split", b, a, rows_b, redrawn=(a,) if own is not None else ())

    def _merge(self, st: MoveState, a: int, b: int, i: int, j: int, rng: np.random.Generator,
               proposal: str = "launch") -> MoveResult | None:
        t = st.tree
        new = self.is_new(st, t, b)
        if not (new or self.kept(st, b)) or (a == ROOT and not self.kw["root_holds_data"]):
            return None
        idx = self.index(st)
        rows_b = idx.of(b)
        if proposal == "subset" and rows_b.size < self.subset_min_docs:
            return None  # no subset split makes a node this small (a function of the state)
        edit = idx.prior.edit()
        edit.move(b, a, 0.0, float(rows_b.size))
        merged = t
        if new:
            P = t.parent[b]
            place = ("new", P, t.children[P].index(b), len(t.children[b]))
            edit.lift(b)
            merged = EditedTree(edit)
        else:
            place = ("old", b)
        places = self.places(st, merged, lambda x: x != b and x in idx.rows, a)
        if place not in places:
            return None  # no split of a could have made this state
        others = _union_without(idx.of(a), rows_b, i, j)
        own = theta_a = None
        if self.collapses(st, merged, a, place):
            # a's parameter in the merged state, drawn from its conditional there before the
            # reverse launch reads it (the split this merge undoes starts from that state); a new
            # b is no neighbour of a there, a kept child b stays linked to a in both states
            gone = b if new else -1
            docs_all = document_set(st.X, np.union1d(idx.of(a), rows_b).astype(np.int64), self.lik.sets_need_terms)
            theta_a = self._draw_own(st, a, docs_all, rng, exclude=gone)
            own = self._own_marginal(st, a, exclude=gone) - self._own_marginal(st, a, docs_all, exclude=gone)
        n_a = idx.count(a)
        # log_a = -((ratio - log q) + select_merge - select_split), with ratio the log ratio
        # without the reverse launch's log q <= 0 (a product of probabilities): so log_a is at most
        # the bound below (rounding is monotone, so also in floating point), and a uniform at or
        # above it rejects whatever the launch gives. The launch's uniforms and then the
        # acceptance uniform are drawn in their usual order, the launch itself (the dearest part of
        # a merge) runs only when the bound leaves it a chance, and log_a is summed in the order it
        # always was: the same decisions from the same random stream, bit for bit.
        ratio = self._log_ratio(st, t, a, b, place, self._documents(st, b), -idx.prior.delta(edit, **self.kw),
                                places.log_prob(place), 0.0, st.theta[b], own,
                                conc_b=st.concentration[b] if new else None)
        select_merge = self._log_select_merge(len(idx.rows), len(self.partners(st, t, b)), rows_b.size, n_a)
        select_split = self._log_select_split(st.labels.size, n_a + rows_b.size)
        if proposal == "subset":  # the reverse split's probability needs no draws
            log_q = subset_log_q(others.size, rows_b.size - 1, self.subset_min_docs - 1)
            if _log_uniform(rng) >= -(ratio - log_q + select_merge - select_split):
                return None
        else:
            uniforms = self._launch_uniforms(place, others.size, rng)
            log_u = _log_uniform(rng)
            if log_u >= -(ratio + select_merge - select_split) and self.skip_hopeless_launches:
                return None
            lo = self._allocation(st, a, place, i, j, others, rng, theta_a=theta_a, uniforms=uniforms)
            if log_u >= -(ratio - self._log_q(lo, st.labels[others] == b) + select_merge - select_split):
                return None
        if own is not None:
            self._set_own(st, a, theta_a)
        st.labels[rows_b] = a
        if new:
            t.merge_into_parent(b)
            del st.theta[b], st.concentration[b]
            idx.forget(b)
        idx.prior.apply(edit)
        idx.changed()
        idx.move(b, a, rows_b)
        return MoveResult("merge", b, a, rows_b, redrawn=(a,) if own is not None else ())
