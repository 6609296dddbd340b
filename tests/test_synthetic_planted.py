"""The planted hierarchical-Dirichlet evolving tree used by the quality benchmarks."""

from __future__ import annotations

import numpy as np
import pytest

from streamtree.synthetic import planted_dirichlet_tree


@pytest.fixture(scope="module")
def corpus():
    return planted_dirichlet_tree(np.random.default_rng(7), n_features=300, n_documents=1500, n_epochs=3)


def test_shapes_counts_and_lengths(corpus):
    assert len(corpus.counts) == len(corpus.labels) == len(corpus.node_ids) == 3
    for X, labels, ids, m, W in zip(corpus.counts, corpus.labels, corpus.node_ids, corpus.masses,
                                    corpus.word_dists):
        assert X.shape == (1500, 300) and X.dtype == np.int64
        lengths = np.asarray(X.sum(axis=1)).ravel()
        assert lengths.min() >= 30 and lengths.max() <= 100
        assert np.isin(labels, ids).all()
        assert m.shape == ids.shape and m.sum() == pytest.approx(1.0)
        assert W.shape == (ids.size, 300)
        np.testing.assert_allclose(W.sum(axis=1), 1.0)
    assert corpus.n_features == 300


def test_initial_tree_is_31_nodes_of_depth_3(corpus):
    ids0 = corpus.node_ids[0]
    assert ids0.size == 31
    assert corpus.parent[0] == -1
    assert np.bincount(corpus.depth[ids0]).tolist() == [1, 3, 9, 18]
    # a parent is always one level up
    kids = ids0[1:]
    assert np.all(corpus.depth[corpus.parent[kids]] == corpus.depth[kids] - 1)


def test_one_death_and_one_birth_per_later_epoch(corpus):
    for t in (1, 2):
        prev, now = set(corpus.node_ids[t - 1].tolist()), set(corpus.node_ids[t].tolist())
        assert prev - now == set(corpus.died[t].tolist()) and len(corpus.died[t]) == 1
        assert now - prev == set(corpus.born[t].tolist()) and len(corpus.born[t]) == 1
        dead, new = int(corpus.died[t][0]), int(corpus.born[t][0])
        assert corpus.depth[dead] == 3 and not np.any(corpus.parent[list(now)] == dead)  # a leaf
        assert corpus.parent[new] in prev and corpus.depth[new] <= 3
        assert not np.isin(corpus.labels[t], list(corpus.died[t])).any()
        assert np.isin(new, corpus.labels[t])  # the newborn emits documents


def test_drift_is_small_next_to_sibling_differences(corpus):
    """A node stays closer to itself across epochs than to its siblings (so identity is
    recoverable), and closer to its parent than siblings are to each other."""
    def tv(a, b):
        return 0.5 * np.abs(a - b).sum()

    W0, W1 = corpus.word_dists[0], corpus.word_dists[1]
    ids0, ids1 = corpus.node_ids[0].tolist(), corpus.node_ids[1].tolist()
    drift, sibling = [], []
    for nid in ids0:
        if nid in ids1:
            drift.append(tv(W0[ids0.index(nid)], W1[ids1.index(nid)]))
    for par in range(13):  # internal nodes of the initial tree
        kids = [ids0.index(k) for k in np.flatnonzero(corpus.parent == par) if k in ids0]
        sibling += [tv(W0[a], W0[b]) for i, a in enumerate(kids) for b in kids[i + 1:]]
    assert np.max(drift) < np.min(sibling)


def test_seeded_and_validated():
    a = planted_dirichlet_tree(np.random.default_rng(1), n_features=50, n_documents=40, n_epochs=2)
    b = planted_dirichlet_tree(np.random.default_rng(1), n_features=50, n_documents=40, n_epochs=2)
    assert all((x != y).nnz == 0 for x, y in zip(a.counts, b.counts))
    assert all(np.array_equal(x, y) for x, y in zip(a.labels, b.labels))
    with pytest.raises(ValueError, match="doc_length"):
        planted_dirichlet_tree(np.random.default_rng(1), doc_length=(10, 5))
    with pytest.raises(ValueError, match="n_epochs"):
        planted_dirichlet_tree(np.random.default_rng(1), n_epochs=0)
