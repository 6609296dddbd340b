"""The collapsed TSSB prior of an epoch's assignments (sticks integrated out).

Shared by the exact split-merge moves and lifts (:mod:`streamtree.inference.split_merge`), the
hyperparameter sampler (:mod:`streamtree.inference.hyper`) and the heat-bath merge that the
epoch sampler keeps, for carried nodes only, as a search heuristic for what the exact moves
cannot do yet (retiring a carried leaf's documents, removing a carried internal node; see
``EpochSampler._merge_internal``).

A move's prior ratio is on the hot path of those moves (tens of thousands per epoch), so the
live state (:class:`CollapsedPrior`) and a move's changes to it (:class:`PriorEdit`) are small
arrays read and changed by numba kernels; only the Beta functions themselves go through SciPy,
in one call per move, so that every term has SciPy's value.
"""

from __future__ import annotations

from collections.abc import Mapping

import streamtree  # noqa: F401  (configures the numba cache directory)
import numpy as np
from numba import njit
from scipy.special import betaln

from streamtree.inference.sticks import stick_params
from streamtree.tree import TreeArrays, TSSBTree


def collapsed_log_prior(arrays: TreeArrays, past: np.ndarray, now: np.ndarray, *, alpha0: float, lam: float,
                        gamma: float, max_depth: int | None, root_holds_data: bool) -> float:
    """log p(z_t | counts of the window) with every stick integrated out (given child order).

    Parameters
    ----------
    past, now : ndarray (K,)
        Documents at each node in the window's past epochs and in the current epoch.
    """
    kw = dict(alpha0=alpha0, lam=lam, gamma=gamma, max_depth=max_depth, root_holds_data=root_holds_data)
    prior = stick_params(arrays, past, **kw)
    post = stick_params(arrays, past + now, **kw)
    free = np.isnan(post.nu_fixed)
    out = np.sum(betaln(post.a_nu[free], post.b_nu[free]) - betaln(prior.a_nu[free], prior.b_nu[free]))
    out += np.sum(betaln(post.a_psi[1:], post.b_psi[1:]) - betaln(prior.a_psi[1:], prior.b_psi[1:]))
    return float(out)


# Columns of the state arrays. Rows are nodes (the root is row 0); links hold rows, -1 for none.
OWN_P, OWN_T, SUB_P, SUB_T = 0, 1, 2, 3  # float: (past, past + now) documents at / below a node
PARENT, DEPTH, FIRST, NEXT, ALIVE, NODE, GROUP = 0, 1, 2, 3, 4, 5, 6  # int; children as linked lists
_N_INT = 7
#: spare rows for the nodes a move creates (more grow the edit's arrays)
_SPARE = 8


class CollapsedPrior:
    """Per-node counts of :func:`collapsed_log_prior` on a live tree, for local differences.

    The collapsed prior is a sum of one Beta-function ratio per node (its ``nu`` stick: its own
    documents against those below it) and one per sibling group (the ``psi`` sticks of a
    parent's ordered children: each child's subtree total against its later siblings'). A move
    changes the counts on a few paths and the children of a few parents, so its prior ratio
    needs only those terms: O(depth x branching) Beta-function evaluations instead of O(K)
    (:meth:`delta` of a :class:`PriorEdit`); an edit still copies the state and scans its rows
    for the changed ones, O(K) array work in numba per move.

    The state is two arrays with one row per node (pre-order at construction; nodes a move
    creates get new rows): ``(past, past + now)`` documents at the node and in its subtree, and
    its parent, depth, first child and next sibling (children as linked lists, so that a move
    splices them without copying lists). :attr:`own` and :attr:`sub` give the counts by node
    id. The tree is read at construction, never changed (the caller changes it and then
    :meth:`apply` the same edit).
    """

    def __init__(self, tree: TSSBTree, past: Mapping[int, int], now: Mapping[int, int]) -> None:
        self.tree = tree
        ids = tree.preorder()
        self._ids: list[int] = ids
        self._slot: dict[int, int] = {i: k for k, i in enumerate(ids)}
        n = len(ids)
        F = np.zeros((n + _SPARE, 4))
        I = np.zeros((n + _SPARE, _N_INT), dtype=np.int64)
        I[:, PARENT:NEXT + 1] = -1
        slot, children = self._slot, tree.children
        parent = [-1] * n
        first = [-1] * n
        nxt = [-1] * n
        for k, i in enumerate(ids):
            kids = children[i]
            if kids:
                prev = first[k] = slot[kids[0]]
                parent[prev] = k
                for c in kids[1:]:
                    s = slot[c]
                    parent[s] = k
                    nxt[prev] = prev = s
        I[:n, PARENT] = parent
        I[:n, DEPTH] = [tree.depth[i] for i in ids]
        I[:n, FIRST] = first
        I[:n, NEXT] = nxt
        I[:n, ALIVE] = 1
        p = np.array([float(past.get(i, 0)) for i in ids])
        F[:n, OWN_P] = p
        F[:n, OWN_T] = p + np.array([float(now.get(i, 0)) for i in ids])
        _subtree_totals(F, I, n)
        self._F, self._I = F, I

    @property
    def own(self) -> dict[int, tuple[float, float]]:
        """``(past, past + now)`` documents at each node, by id (a copy, for inspection)."""
        return self._by_id(OWN_P)

    @property
    def sub(self) -> dict[int, tuple[float, float]]:
        """``(past, past + now)`` documents in each node's subtree, by id (a copy, for inspection)."""
        return self._by_id(SUB_P)

    def _by_id(self, col: int) -> dict[int, tuple[float, float]]:
        F, alive = self._F, self._I[:, ALIVE]
        return {i: (float(F[k, col]), float(F[k, col + 1])) for k, i in enumerate(self._ids) if alive[k]}

    def edit(self) -> "PriorEdit":
        """An empty edit of this state."""
        return PriorEdit(self)

    def delta(self, edit: "PriorEdit", *, alpha0: float, lam: float, gamma: float, max_depth: int | None,
              root_holds_data: bool) -> float:
        """``collapsed_log_prior(after edit) - collapsed_log_prior(now)``, from the changed terms only."""
        sign, a, b = _changed_terms(self._F, self._I, edit._F, edit._I, float(alpha0), float(lam), float(gamma),
                                    -1 if max_depth is None else int(max_depth), bool(root_holds_data))
        if sign.size == 0:
            return 0.0
        return _signed_sum(sign, betaln(a, b))  # one SciPy call: every term has SciPy's value

    def apply(self, edit: "PriorEdit") -> None:
        """Take the edit's counts and links as the state (after the caller made its change to the tree)."""
        self._F = edit._F.copy()
        self._I = edit._I.copy()
        self._I[:, NODE:] = 0
        for i in edit._new_ids:
            self._slot[i] = len(self._ids)
            self._ids.append(i)


class PriorEdit:
    """A move's changes to a :class:`CollapsedPrior` state, on a copy of its (small) arrays.

    Lookups (:meth:`exists`, :meth:`children`, :meth:`parent`, :meth:`depth`, :meth:`own`,
    :meth:`sub`) give the state after the edits. Each row carries two flags: whether the node's
    ``nu`` term may have changed, and whether its children's ``psi`` terms may have.
    """

    def __init__(self, prior: CollapsedPrior) -> None:
        self.prior = prior
        self.tree = prior.tree
        self._F = prior._F.copy()
        self._I = prior._I.copy()
        self._new: dict[int, int] = {}  # rows of the nodes this edit creates, by id
        self._new_ids: list[int] = []
        #: the edit's changes of the tree's shape, in order: ``("insert", nid, parent, position,
        #: adopt)`` and ``("lift", x)`` (document moves leave the shape alone)
        self.shape_changes: list[tuple] = []

    def _row(self, x: int) -> int | None:
        s = self.prior._slot.get(x)
        return self._new.get(x) if s is None else s

    def _id(self, s: int) -> int:
        ids = self.prior._ids
        return ids[s] if s < len(ids) else self._new_ids[s - len(ids)]

    def _known_row(self, x: int) -> int:
        """``x``'s row (a node the edit deleted keeps its last values); KeyError if unknown."""
        s = self._row(x)
        if s is None:
            raise KeyError(x)
        return s

    def _live_row(self, x: int) -> int:
        s = self._row(x)
        if s is None or not self._I[s, ALIVE]:
            raise KeyError(x)
        return s

    # ------------------------------------------------------------------ the state after the edits
    def exists(self, x: int) -> bool:
        s = self._row(x)
        return s is not None and bool(self._I[s, ALIVE])

    def children(self, x: int) -> list[int]:
        s = self._known_row(x)
        I, out = self._I, []
        c = int(I[s, FIRST])
        while c >= 0:
            out.append(self._id(c))
            c = int(I[c, NEXT])
        return out

    def parent(self, x: int) -> int:
        p = int(self._I[self._known_row(x), PARENT])
        return -1 if p < 0 else self._id(p)

    def depth(self, x: int) -> int:
        return int(self._I[self._known_row(x), DEPTH])

    def own(self, x: int) -> tuple[float, float]:
        s = self._known_row(x)
        return float(self._F[s, OWN_P]), float(self._F[s, OWN_T])

    def sub(self, x: int) -> tuple[float, float]:
        s = self._known_row(x)
        return float(self._F[s, SUB_P]), float(self._F[s, SUB_T])

    # ------------------------------------------------------------------ edits
    def add(self, x: int, d_past: float, d_now: float) -> None:
        """``d_past`` more past and ``d_now`` more current documents at node ``x``."""
        if not (d_past or d_now):
            return
        _add(self._F, self._I, self._live_row(x), float(d_past), float(d_now))

    def move(self, src: int, dst: int, d_past: float, d_now: float) -> None:
        """Move documents from node ``src`` to node ``dst``."""
        self.add(src, -d_past, -d_now)
        self.add(dst, d_past, d_now)

    def insert(self, nid: int, parent: int, position: int, adopt: int = 0) -> None:
        """A new empty node ``nid`` at ``position`` among ``parent``'s children, adopting the next
        ``adopt`` of them (their subtrees one level lower)."""
        s = self._row(nid)
        if s is None:
            s = len(self.prior._ids) + len(self._new_ids)
            self._new[nid] = s
            self._new_ids.append(nid)
            if s >= self._F.shape[0]:
                self._grow(s + 1)
        elif self._I[s, ALIVE]:
            raise ValueError(f"node {nid} is already in the tree")
        _insert(self._F, self._I, s, self._live_row(parent), int(position), int(adopt))
        self.shape_changes.append(("insert", nid, parent, int(position), int(adopt)))

    def _grow(self, rows: int) -> None:
        extra = max(rows, 2 * self._F.shape[0]) - self._F.shape[0]
        F = np.zeros((extra, 4))
        I = np.zeros((extra, _N_INT), dtype=np.int64)
        I[:, PARENT:NEXT + 1] = -1
        self._F = np.concatenate([self._F, F])
        self._I = np.concatenate([self._I, I])

    def lift(self, x: int) -> None:
        """Delete the empty node ``x``; its children take its place under its parent, one level up."""
        row = self._live_row(x)
        if self._I[row, PARENT] < 0:
            raise ValueError(f"node {x} has no parent to lift its children into")
        if not _lift(self._F, self._I, row):
            raise ValueError(f"node {x} still holds documents: move them before lifting it")
        self.shape_changes.append(("lift", x))


# ---------------------------------------------------------------------- kernels
@njit(cache=True)
def _subtree_totals(F, I, n):
    """Subtree totals from the own counts (rows in pre-order: children after their parent)."""
    F[:n, SUB_P] = F[:n, OWN_P]
    F[:n, SUB_T] = F[:n, OWN_T]
    for s in range(n - 1, 0, -1):
        p = I[s, PARENT]
        F[p, SUB_P] += F[s, SUB_P]
        F[p, SUB_T] += F[s, SUB_T]


@njit(cache=True)
def _add(F, I, s, d_past, d_now):
    F[s, OWN_P] += d_past
    F[s, OWN_T] = F[s, OWN_T] + d_past + d_now
    while s >= 0:
        F[s, SUB_P] += d_past
        F[s, SUB_T] = F[s, SUB_T] + d_past + d_now
        I[s, NODE] = 1
        s = I[s, PARENT]


@njit(cache=True)
def _shift_depth(I, s, by):
    stack = np.empty(I.shape[0], dtype=np.int64)
    stack[0] = s
    top = 1
    while top:
        top -= 1
        g = stack[top]
        I[g, DEPTH] += by
        I[g, NODE] = 1
        c = I[g, FIRST]
        while c >= 0:
            stack[top] = c
            top += 1
            c = I[c, NEXT]


@njit(cache=True)
def _insert(F, I, s, par, position, adopt):
    prev = -1
    c = I[par, FIRST]
    k = 0
    while k < position and c >= 0:
        prev = c
        c = I[c, NEXT]
        k += 1
    block, last = c, -1
    sub_p = 0.0
    sub_t = 0.0
    m = 0
    while m < adopt and c >= 0:
        I[c, PARENT] = s
        _shift_depth(I, c, 1)
        sub_p += F[c, SUB_P]
        sub_t += F[c, SUB_T]
        last = c
        c = I[c, NEXT]
        m += 1
    if last >= 0:
        I[last, NEXT] = -1
        I[s, FIRST] = block
    else:
        I[s, FIRST] = -1
    I[s, NEXT] = c
    if prev < 0:
        I[par, FIRST] = s
    else:
        I[prev, NEXT] = s
    I[s, PARENT] = par
    I[s, DEPTH] = I[par, DEPTH] + 1
    I[s, ALIVE] = 1
    F[s, OWN_P] = 0.0
    F[s, OWN_T] = 0.0
    F[s, SUB_P] = sub_p
    F[s, SUB_T] = sub_t
    I[s, NODE] = 1
    I[s, GROUP] = 1
    I[par, GROUP] = 1


@njit(cache=True)
def _lift(F, I, s):
    if F[s, OWN_P] != 0.0 or F[s, OWN_T] != 0.0:
        return False
    par = I[s, PARENT]
    prev = -1
    c = I[par, FIRST]
    while c != s:
        prev = c
        c = I[c, NEXT]
    after = I[s, NEXT]
    head = I[s, FIRST]
    if head < 0:
        head = after
    else:
        c, last = head, -1
        while c >= 0:
            I[c, PARENT] = par
            _shift_depth(I, c, -1)
            last = c
            c = I[c, NEXT]
        I[last, NEXT] = after
    if prev < 0:
        I[par, FIRST] = head
    else:
        I[prev, NEXT] = head
    I[s, FIRST] = -1
    I[s, NEXT] = -1
    I[s, ALIVE] = 0
    I[s, NODE] = 1
    I[s, GROUP] = 1
    I[par, GROUP] = 1
    return True


@njit(cache=True)
def _nu_term(F, I, s, sign, alpha0, lam, max_depth, root_holds_data, out, n):
    """Append row ``s``'s nu term (none where nu is fixed) to ``out`` at column ``n``."""
    d = I[s, DEPTH]
    if (max_depth >= 0 and d >= max_depth) or (s == 0 and not root_holds_data):
        return n
    alpha = alpha0 * lam ** float(d)
    out[0, n] = sign
    out[1, n] = 1.0 + F[s, OWN_T]
    out[2, n] = alpha + F[s, SUB_T] - F[s, OWN_T]
    out[3, n] = 1.0 + F[s, OWN_P]
    out[4, n] = alpha + F[s, SUB_P] - F[s, OWN_P]
    return n + 1


@njit(cache=True)
def _psi_terms(F, g, kids, cut, sign, gamma, out, n):
    """Append the psi terms of ``g``'s first ``cut`` children ``kids`` to ``out`` at column ``n``."""
    later_p = F[g, SUB_P] - F[g, OWN_P]  # all of g's children (integers: exact)
    later_t = F[g, SUB_T] - F[g, OWN_T]
    for k in range(cut):
        c = kids[k]
        later_p -= F[c, SUB_P]
        later_t -= F[c, SUB_T]
        out[0, n] = sign
        out[1, n] = 1.0 + F[c, SUB_T]
        out[2, n] = gamma + later_t
        out[3, n] = 1.0 + F[c, SUB_P]
        out[4, n] = gamma + later_p
        n += 1
    return n


@njit(cache=True)
def _kid_rows(I, g, out):
    n = 0
    c = I[g, FIRST]
    while c >= 0:
        out[n] = c
        n += 1
        c = I[c, NEXT]
    return n


@njit(cache=True)
def _signed_sum(sign, ln_beta):
    """sum_k sign[k] (ln_beta[k] - ln_beta[n + k]) for n terms (after the edit, then before)."""
    n = sign.size
    out = 0.0
    for k in range(n):
        out += sign[k] * (ln_beta[k] - ln_beta[n + k])
    return out


@njit(cache=True)
def _changed_terms(F0, I0, F1, I1, alpha0, lam, gamma, max_depth, root_holds_data):
    """The terms an edit changes as (sign, a, b): term k is ``sign[k]`` times the difference of
    ``ln B(a[k], b[k])`` (after the edit's counts) and ``ln B(a[n + k], b[n + k])`` (before).
    ``F0, I0`` is the state, ``F1, I1`` the edited copy (possibly with more rows: nodes the
    edit creates)."""
    n0, n1 = F0.shape[0], F1.shape[0]
    out = np.empty((5, 4 * n1))  # at most 2 nu terms per row and 1 psi term per row and side
    changed = np.zeros(n1, dtype=np.bool_)
    group = np.zeros(n1, dtype=np.bool_)
    n = 0
    for s in range(n1):
        if I1[s, GROUP]:
            group[s] = True
        if not I1[s, NODE]:
            continue
        before = s < n0 and I0[s, ALIVE] == 1
        after = I1[s, ALIVE] == 1
        # above the moved nodes' lowest common ancestor the counts are back to their old
        # values: those nodes and their groups drop out
        if (before and after and I0[s, DEPTH] == I1[s, DEPTH] and F0[s, OWN_P] == F1[s, OWN_P]
                and F0[s, OWN_T] == F1[s, OWN_T] and F0[s, SUB_P] == F1[s, SUB_P]
                and F0[s, SUB_T] == F1[s, SUB_T]):
            continue
        changed[s] = True
        if before:
            n = _nu_term(F0, I0, s, -1.0, alpha0, lam, max_depth, root_holds_data, out, n)
            if I0[s, PARENT] >= 0:
                group[I0[s, PARENT]] = True
        if after:
            n = _nu_term(F1, I1, s, 1.0, alpha0, lam, max_depth, root_holds_data, out, n)
            if I1[s, PARENT] >= 0:
                group[I1[s, PARENT]] = True
    kids_b = np.empty(n1, dtype=np.int64)
    kids_a = np.empty(n1, dtype=np.int64)
    for g in range(n1):
        if not group[g]:
            continue
        cut_b = _kid_rows(I0, g, kids_b) if g < n0 and I0[g, ALIVE] == 1 else 0
        cut_a = _kid_rows(I1, g, kids_a) if I1[g, ALIVE] == 1 else 0
        # a psi term reads its child's subtree total and its later siblings' only: the
        # trailing children that the edit leaves alone keep their terms
        while cut_b and cut_a and kids_b[cut_b - 1] == kids_a[cut_a - 1] and not changed[kids_b[cut_b - 1]]:
            cut_b -= 1
            cut_a -= 1
        n = _psi_terms(F0, g, kids_b, cut_b, -1.0, gamma, out, n)
        n = _psi_terms(F1, g, kids_a, cut_a, 1.0, gamma, out, n)
    a = np.empty(2 * n)
    b = np.empty(2 * n)
    a[:n] = out[1, :n]
    a[n:] = out[3, :n]
    b[:n] = out[2, :n]
    b[n:] = out[4, :n]
    return out[0, :n].copy(), a, b
