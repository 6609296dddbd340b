"""A prior edit that creates more nodes than the state has spare rows for grows its arrays and
still gives the full difference; lifting a node that holds documents is refused."""

from __future__ import annotations

import numpy as np
import pytest

from streamtree.inference.merge import CollapsedPrior, collapsed_log_prior
from streamtree.tree import ROOT, TSSBTree

KW = dict(alpha0=1.3, lam=0.6, gamma=0.8, max_depth=None, root_holds_data=True)


def _full(tree, past, now):
    arr = tree.arrays()
    return collapsed_log_prior(arr, np.array([past.get(int(i), 0) for i in arr.ids], dtype=float),
                               np.array([now.get(int(i), 0) for i in arr.ids], dtype=float), **KW)


def test_many_new_nodes_in_one_edit():
    rng = np.random.default_rng(5)
    tree = TSSBTree(None)
    for _ in range(4):
        tree.add_child(ROOT)
    past = {i: int(rng.integers(0, 20)) for i in tree.parent}
    now = {i: int(rng.integers(0, 50)) for i in tree.parent}
    prior = CollapsedPrior(tree, past, now)
    before = _full(tree, past, now)
    work, edit = tree.copy(), prior.edit()
    for _ in range(30):  # a chain and a fan of new nodes, each taking documents from the root
        par = int(rng.choice(list(work.parent)))
        pos = int(rng.integers(len(work.children[par]) + 1))
        nid = work.next_id
        edit.insert(nid, par, pos)
        assert work.add_parent_of_block(par, pos, 0) == nid
        k = int(rng.integers(0, now[ROOT] + 1))
        edit.move(ROOT, nid, 0, k)
        now[ROOT] -= k
        now[nid] = k
    assert prior.delta(edit, **KW) == pytest.approx(_full(work, past, now) - before, rel=1e-12, abs=1e-10)
    prior.tree = work
    prior.apply(edit)
    fresh = CollapsedPrior(work, past, now)
    assert prior.own == fresh.own and prior.sub == fresh.sub
    assert prior.delta(prior.edit(), **KW) == 0.0


def test_lifting_a_node_with_documents_is_refused():
    tree = TSSBTree(3)
    c = tree.add_child(ROOT)
    prior = CollapsedPrior(tree, {c: 2}, {c: 1})
    edit = prior.edit()
    with pytest.raises(ValueError, match="still holds documents"):
        edit.lift(c)
    edit.move(c, ROOT, 2, 1)
    edit.lift(c)
    assert not edit.exists(c) and edit.children(ROOT) == []


def test_lifting_the_root_is_refused():
    # the root has no parent to take its children: an error, not a search that never ends
    tree = TSSBTree(3)
    tree.add_child(ROOT)
    edit = CollapsedPrior(tree, {}, {}).edit()
    with pytest.raises(ValueError, match="no parent"):
        edit.lift(ROOT)
