"""The local collapsed-prior difference of a move equals the difference of full evaluations."""

from __future__ import annotations

import numpy as np
import pytest

from streamtree.inference.merge import CollapsedPrior, collapsed_log_prior
from streamtree.tree import ROOT, TSSBTree


def _random_tree(rng, max_depth, n_nodes):
    t = TSSBTree(max_depth)
    while len(t) < n_nodes:
        hosts = [c for c in t.parent if not t.at_cap(c)]
        par = hosts[int(rng.integers(len(hosts)))]
        t.add_child(par, position=int(rng.integers(len(t.children[par]) + 1)))
    return t


def _full(tree, past, now, kw):
    arr = tree.arrays()
    return collapsed_log_prior(arr, np.array([past.get(int(i), 0) for i in arr.ids], dtype=float),
                               np.array([now.get(int(i), 0) for i in arr.ids], dtype=float), **kw)


def _counts(rng, tree, scale):
    past = {i: int(rng.integers(0, scale)) if rng.random() < 0.6 else 0 for i in tree.parent}
    now = {i: int(rng.integers(0, scale)) if rng.random() < 0.7 else 0 for i in tree.parent}
    return past, now


def _move(d, src, dst, n):
    d[src] = d.get(src, 0) - n
    d[dst] = d.get(dst, 0) + n


def _random_move(rng, tree, past, now, edit):
    """Apply one random move to ``tree``/``past``/``now`` and record it in ``edit``."""
    kind = rng.choice(["docs", "insert", "lift", "relocate", "merge"])
    nodes = list(tree.parent)
    if kind == "docs":
        a, b = (int(x) for x in rng.choice(nodes, 2))
        n = now.get(a, 0)
        k = int(rng.integers(0, n + 1))
        edit.move(a, b, 0, k)
        _move(now, a, b, k)
    elif kind == "insert":
        hosts = [c for c in nodes if not tree.at_cap(c)]
        par = int(hosts[int(rng.integers(len(hosts)))])
        pos = int(rng.integers(len(tree.children[par]) + 1))
        m = 0
        while pos + m < len(tree.children[par]) and rng.random() < 0.5 and (
                tree.max_depth is None or max(tree.depth[g] for g in tree.subtree(tree.children[par][pos + m]))
                < tree.max_depth):
            m += 1
        nid = tree.next_id
        edit.insert(nid, par, pos, m)
        assert tree.add_parent_of_block(par, pos, m) == nid
        a = int(rng.choice(list(tree.parent)))
        k = int(rng.integers(0, now.get(a, 0) + 1))
        edit.move(a, nid, 0, k)
        _move(now, a, nid, k)
    elif kind in ("lift", "merge"):
        cands = [c for c in nodes if c != ROOT and (kind == "merge" or not past.get(c, 0))]
        if not cands:
            return
        c = int(cands[int(rng.integers(len(cands)))])
        par = tree.parent[c]
        pc = past.get(c, 0)  # 0 for a lift: only current documents move
        edit.move(c, par, pc, now.get(c, 0))
        _move(past, c, par, pc)
        _move(now, c, par, now.get(c, 0))
        edit.lift(c)
        tree.merge_into_parent(c)
    else:
        leaves = [c for c in nodes if c != ROOT and not tree.children[c] and not past.get(c, 0)]
        if not leaves:
            return
        b = int(leaves[int(rng.integers(len(leaves)))])
        n = now.get(b, 0)
        p1 = tree.parent[b]
        edit.add(b, 0, -n)
        edit.lift(b)
        tree.children[p1].remove(b)
        hosts = [c for c in tree.parent if c != b and not tree.at_cap(c)]
        p2 = int(hosts[int(rng.integers(len(hosts)))])
        k2 = int(rng.integers(len(tree.children[p2]) + 1))
        edit.insert(b, p2, k2, 0)
        edit.add(b, 0, n)
        tree.children[p2].insert(k2, b)
        tree.parent[b] = p2
        tree.depth[b] = tree.depth[p2] + 1


@pytest.mark.parametrize("max_depth", [2, 3, None])
@pytest.mark.parametrize("root_holds_data", [True, False])
def test_local_delta_equals_full_difference(max_depth, root_holds_data):
    rng = np.random.default_rng(7 + (max_depth or 0) + 10 * root_holds_data)
    for trial in range(60):
        tree = _random_tree(rng, max_depth, int(rng.integers(1, 25)))
        past, now = _counts(rng, tree, scale=[3, 40, 2000][trial % 3])
        kw = dict(alpha0=float(rng.uniform(0.1, 5)), lam=float(rng.uniform(0.2, 1)),
                  gamma=float(rng.uniform(0.1, 5)), max_depth=max_depth, root_holds_data=root_holds_data)
        prior = CollapsedPrior(tree, past, now)
        before = _full(tree, past, now, kw)
        work = tree.copy()
        edit = prior.edit()
        for _ in range(int(rng.integers(1, 4))):
            _random_move(rng, work, past, now, edit)
        full = _full(work, past, now, kw) - before
        local = prior.delta(edit, **kw)
        assert local == pytest.approx(full, rel=1e-12, abs=1e-10), (trial, max_depth)
        assert work.preorder() == [x for x in _preorder(edit)]
        prior.tree = work
        prior.apply(edit)
        fresh = CollapsedPrior(work, past, now)
        assert prior.own == fresh.own and prior.sub == fresh.sub


def _preorder(edit):
    out, stack = [], [ROOT]
    while stack:
        x = stack.pop()
        out.append(x)
        stack.extend(reversed(edit.children(x)))
    return out
