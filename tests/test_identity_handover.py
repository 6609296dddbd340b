"""Ids follow documents: a carried node emptied into a new node hands that node its id."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import streamtree.inference.epoch_sampler as epoch_sampler
from streamtree.model import DTSSBP
from streamtree.synthetic import planted_topic_mixture
from streamtree.tree import ROOT, TSSBTree


def _check_tree(t: TSSBTree) -> None:
    for nid, kids in t.children.items():
        for k in kids:
            assert t.parent[k] == nid and t.depth[k] == t.depth[nid] + 1
    assert sorted(t.preorder()) == sorted(t.parent)
    t.arrays()


def test_swap_places_of_a_parent_and_its_child():
    t = TSSBTree(max_depth=4)
    a = t.add_child(ROOT, born=0)
    b = t.add_child(a, born=1)
    c = t.add_child(b, born=0)
    d = t.add_child(a, born=0)
    e = t.add_child(ROOT, born=0)
    t.swap_places(a, b)
    assert t.children[ROOT] == [b, e] and t.children[b] == [a, d] and t.children[a] == [c]
    assert (t.depth[b], t.depth[a], t.depth[c]) == (1, 2, 3)
    assert (t.born[a], t.born[b]) == (0, 1)  # births go with the ids
    _check_tree(t)


def test_swap_places_of_unrelated_nodes_and_back():
    t = TSSBTree(max_depth=4)
    a = t.add_child(ROOT)
    b = t.add_child(a)
    c = t.add_child(ROOT)
    d = t.add_child(c)
    g = t.add_child(d)
    before = (dict(t.parent), {k: list(v) for k, v in t.children.items()}, dict(t.depth))
    t.swap_places(b, d)
    assert t.parent[b] == c and t.parent[d] == a and t.children[b] == [g] and t.children[d] == []
    assert t.depth[b] == 2 and t.depth[g] == 3
    _check_tree(t)
    t.swap_places(b, d)
    assert (dict(t.parent), {k: list(v) for k, v in t.children.items()}, dict(t.depth)) == before
    with pytest.raises(ValueError, match="root"):
        t.swap_places(ROOT, a)


def _kept(seed: int) -> tuple[int, int, DTSSBP]:
    """Surviving true leaves whose majority model node keeps its id from epoch 0 to 1, on
    long documents (where the moves empty carried nodes into new ones most)."""
    c = planted_topic_mixture(np.random.default_rng(seed), n_features=1500, n_documents=600, n_epochs=2,
                              n_branches=3, leaves_per_branch=2, median_length=300, words_per_topic=30)
    model = DTSSBP(max_depth=3, random_state=seed, n_sweeps=20)
    maps = []
    for t, X in enumerate(c.counts):
        model.partial_fit(X, epoch=t)
        z = np.asarray(model.trees_[-1].assignments)
        maps.append({int(k): collections.Counter(z[c.labels[t] == k]).most_common(1)[0][0]
                     for k in np.unique(c.labels[t])})
    survivors = [k for k in maps[0] if k in maps[1]]
    return sum(maps[0][k] == maps[1][k] for k in survivors), len(survivors), model


def test_ids_follow_their_documents_into_new_nodes(monkeypatch):
    kept, survivors, model = _kept(0)
    assert survivors == 5 and kept == 5
    tree = model.trees_[-1]
    # the node holding a kept id's documents is where its past counts are, and the state is whole
    st = model.state_
    assert set(st.signatures) == set(st.tree.preorder())
    for nid, n in zip(tree.node_ids, tree.counts):
        if n >= epoch_sampler.IDENTITY_MIN_DOCS and tree.born[tree.index_of(int(nid))] == 0:
            assert st.window.total.get(int(nid), 0) > n  # its epoch-0 documents too
    restored = DTSSBP.from_checkpoint(*model.get_checkpoint())
    np.testing.assert_array_equal(restored.trees_[-1].node_ids, tree.node_ids)
    # power: without the hand-over the same runs keep hardly any id
    monkeypatch.setattr(epoch_sampler.EpochSampler, "_hand_over_ids", lambda self, X, epoch, current: None)
    assert _kept(0)[0] <= 1
