"""The collapsed TSSB prior of an epoch's assignments (sticks integrated out).

Shared by the exact split-merge moves (:mod:`streamtree.inference.split_merge`), the
hyperparameter sampler (:mod:`streamtree.inference.hyper`) and the heat-bath merge of internal
nodes that the epoch sampler keeps as a search heuristic.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
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


class CollapsedPrior:
    """Per-node counts of :func:`collapsed_log_prior` on a live tree, for local differences.

    The collapsed prior is a sum of one Beta-function ratio per node (its ``nu`` stick: its own
    documents against those below it) and one per sibling group (the ``psi`` sticks of a
    parent's ordered children: each child's subtree total against its later siblings'). A move
    changes the counts on a few paths and the children of a few parents, so its prior ratio
    needs only those terms: O(depth x branching) instead of O(K) (:meth:`delta` of a
    :class:`PriorEdit`). ``own[i]`` and ``sub[i]`` hold ``(past, past + now)`` documents at node
    ``i`` and in its subtree; the tree is read, never changed (the caller changes it and then
    :meth:`apply` the same edit).
    """

    def __init__(self, tree: TSSBTree, past: Mapping[int, int], now: Mapping[int, int]) -> None:
        self.tree = tree
        self.own: dict[int, tuple[float, float]] = {}
        self.sub: dict[int, tuple[float, float]] = {}
        for i in reversed(tree.preorder()):  # children before parents
            p = float(past.get(i, 0))
            t = p + float(now.get(i, 0))
            self.own[i] = (p, t)
            sp_, st_ = p, t
            for c in tree.children[i]:
                cp, ct = self.sub[c]
                sp_ += cp
                st_ += ct
            self.sub[i] = (sp_, st_)

    def edit(self) -> "PriorEdit":
        """An empty edit of this state (its lookups read the state itself)."""
        return PriorEdit(self)

    def delta(self, edit: "PriorEdit", *, alpha0: float, lam: float, gamma: float, max_depth: int | None,
              root_holds_data: bool) -> float:
        """``collapsed_log_prior(after edit) - collapsed_log_prior(now)``, from the changed terms only."""
        tree = self.tree
        # Only terms whose inputs change: above the moved nodes' lowest common ancestor the
        # subtree totals are back to their old values, so those nodes and groups drop out.
        nodes = [x for x in edit.nodes if not (x in tree.parent and edit.exists(x) and self._same(edit, x)
                                               and edit.depth(x) == tree.depth[x])]
        groups = set(edit.groups)
        for x in nodes:
            if x in tree.parent:
                groups.add(tree.parent[x])
            if edit.exists(x):
                groups.add(edit.parent(x))
        groups.discard(-1)
        kw = (alpha0, lam, gamma, max_depth, root_holds_data)
        terms: list[list[float]] = [[], [], [], [], []]  # sign, a_post, b_post, a_prior, b_prior
        base = PriorEdit(self)
        _collect(base, nodes, -1.0, kw, terms)
        _collect(edit, nodes, 1.0, kw, terms)
        changed = set(nodes)
        for g in groups:
            kb = tree.children[g] if g in tree.parent else None
            ka = edit.children(g) if edit.exists(g) else None
            cut_b, cut_a = len(kb or ()), len(ka or ())
            if kb is not None and ka is not None:
                # a psi term reads its child's subtree total and its later siblings' only: the
                # trailing children that the edit leaves alone keep their terms
                while cut_b and cut_a and kb[cut_b - 1] == ka[cut_a - 1] and kb[cut_b - 1] not in changed:
                    cut_b -= 1
                    cut_a -= 1
            if cut_b:
                _collect_group(base, g, kb[:cut_b], -1.0, gamma, terms)
            if cut_a:
                _collect_group(edit, g, ka[:cut_a], 1.0, gamma, terms)
        if not terms[0]:
            return 0.0
        sign, a1, b1, a0, b0 = (np.asarray(v) for v in terms)
        return float(np.sum(sign * (betaln(a1, b1) - betaln(a0, b0))))

    def _same(self, edit: "PriorEdit", x: int) -> bool:
        return edit.own(x) == self.own[x] and edit.sub(x) == self.sub[x]

    def apply(self, edit: "PriorEdit") -> None:
        """Take the edit's counts as the state (after the caller made its change to the tree)."""
        self.own.update(edit.own_over)
        self.sub.update(edit.sub_over)
        for x in edit.gone:
            del self.own[x], self.sub[x]


class PriorEdit:
    """A move's changes to a :class:`CollapsedPrior` state, held beside it (nothing is copied).

    Lookups (:meth:`children`, :meth:`parent`, :meth:`depth`, :meth:`own`, :meth:`sub`) give the
    state after the edits; ``nodes`` are the nodes whose ``nu`` term may change and ``groups``
    the parents whose children's ``psi`` terms may change.
    """

    def __init__(self, prior: CollapsedPrior) -> None:
        self.prior = prior
        self.tree = prior.tree
        self.kids_over: dict[int, list[int]] = {}
        self.parent_over: dict[int, int] = {}
        self.depth_over: dict[int, int] = {}
        self.own_over: dict[int, tuple[float, float]] = {}
        self.sub_over: dict[int, tuple[float, float]] = {}
        self.gone: set[int] = set()
        self.nodes: set[int] = set()
        self.groups: set[int] = set()

    # ------------------------------------------------------------------ the state after the edits
    def exists(self, x: int) -> bool:
        return x not in self.gone and (x in self.parent_over or x in self.tree.parent)

    def children(self, x: int) -> list[int]:
        kids = self.kids_over.get(x)
        return self.tree.children[x] if kids is None else kids

    def parent(self, x: int) -> int:
        p = self.parent_over.get(x)
        return self.tree.parent[x] if p is None else p

    def depth(self, x: int) -> int:
        d = self.depth_over.get(x)
        return self.tree.depth[x] if d is None else d

    def own(self, x: int) -> tuple[float, float]:
        v = self.own_over.get(x)
        return self.prior.own[x] if v is None else v

    def sub(self, x: int) -> tuple[float, float]:
        v = self.sub_over.get(x)
        return self.prior.sub[x] if v is None else v

    # ------------------------------------------------------------------ edits
    def add(self, x: int, d_past: float, d_now: float) -> None:
        """``d_past`` more past and ``d_now`` more current documents at node ``x``."""
        if not (d_past or d_now):
            return
        p, t = self.own(x)
        self.own_over[x] = (p + d_past, t + d_past + d_now)
        while x != -1:
            p, t = self.sub(x)
            self.sub_over[x] = (p + d_past, t + d_past + d_now)
            self.nodes.add(x)
            x = self.parent(x) if x != 0 else -1

    def move(self, src: int, dst: int, d_past: float, d_now: float) -> None:
        """Move documents from node ``src`` to node ``dst``."""
        self.add(src, -d_past, -d_now)
        self.add(dst, d_past, d_now)

    def _shift_depth(self, x: int, by: int) -> None:
        stack = [x]
        while stack:
            g = stack.pop()
            self.depth_over[g] = self.depth(g) + by
            self.nodes.add(g)
            stack.extend(self.children(g))

    def insert(self, nid: int, parent: int, position: int, adopt: int = 0) -> None:
        """A new empty node ``nid`` at ``position`` among ``parent``'s children, adopting the next
        ``adopt`` of them (their subtrees one level lower)."""
        kids = list(self.children(parent))
        block = kids[position:position + adopt]
        kids[position:position + adopt] = [nid]
        self.kids_over[parent] = kids
        self.kids_over[nid] = block
        self.parent_over[nid] = parent
        self.gone.discard(nid)
        self.depth_over[nid] = self.depth(parent) + 1
        self.own_over[nid] = (0.0, 0.0)
        sp_, st_ = 0.0, 0.0
        for c in block:
            self.parent_over[c] = nid
            self._shift_depth(c, 1)
            cp, ct = self.sub(c)
            sp_ += cp
            st_ += ct
        self.sub_over[nid] = (sp_, st_)
        self.nodes.add(nid)
        self.groups.update((parent, nid))

    def lift(self, x: int) -> None:
        """Delete the empty node ``x``; its children take its place under its parent, one level up."""
        if self.own(x) != (0.0, 0.0):
            raise ValueError(f"node {x} still holds documents: move them before lifting it")
        par = self.parent(x)
        kids = list(self.children(par))
        pos = kids.index(x)
        block = list(self.children(x))
        kids[pos:pos + 1] = block
        self.kids_over[par] = kids
        self.kids_over[x] = []
        for c in block:
            self.parent_over[c] = par
            self._shift_depth(c, -1)
        self.gone.add(x)
        self.nodes.add(x)
        self.groups.update((par, x))


def _collect(view: PriorEdit, nodes, sign: float, kw: tuple, terms: list[list[float]]) -> None:
    """Append the Beta-function arguments of ``nodes``' nu terms in ``view`` to ``terms``."""
    alpha0, lam, gamma, max_depth, root_holds_data = kw
    s, a1, b1, a0, b0 = terms
    for x in nodes:
        if not view.exists(x):
            continue
        d = view.depth(x)
        if (max_depth is not None and d >= max_depth) or (x == 0 and not root_holds_data):
            continue  # nu fixed: no term
        alpha = alpha0 * lam ** float(d)
        (op, ot), (sp_, st_) = view.own(x), view.sub(x)
        a1.append(1.0 + ot)
        b1.append(alpha + st_ - ot)
        a0.append(1.0 + op)
        b0.append(alpha + sp_ - op)
    s.extend([sign] * (len(a1) - len(s)))


def _collect_group(view: PriorEdit, g: int, kids: list[int], sign: float, gamma: float,
                   terms: list[list[float]]) -> None:
    """Append the psi terms' arguments of ``kids``, the leading children of ``g`` in ``view``."""
    s, a1, b1, a0, b0 = terms
    (tp, tt), (op, ot) = view.sub(g), view.own(g)
    later_p, later_t = tp - op, tt - ot  # all of g's children (integers: exact)
    over, base = view.sub_over, view.prior.sub  # view.sub inlined: the hot loop of a move
    for c in kids:
        v = over.get(c)
        cp, ct = base[c] if v is None else v
        later_p -= cp
        later_t -= ct
        a1.append(1.0 + ct)
        b1.append(gamma + later_t)
        a0.append(1.0 + cp)
        b0.append(gamma + later_p)
    s.extend([sign] * (len(a1) - len(s)))
