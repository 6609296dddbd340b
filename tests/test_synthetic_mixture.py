"""The planted topic-mixture tree (documents at the leaves only), the second planted family."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from streamtree.synthetic import planted_topic_mixture


@pytest.fixture(scope="module")
def corpus():
    return planted_topic_mixture(np.random.default_rng(3), n_features=400, n_documents=2000, n_epochs=3,
                                 n_branches=3, leaves_per_branch=2, words_per_topic=20)


def test_shapes_and_documents_at_the_leaves(corpus):
    assert corpus.n_features == 400
    for X, labels, ids, m, W in zip(corpus.counts, corpus.labels, corpus.node_ids, corpus.masses,
                                    corpus.word_dists):
        assert X.shape == (2000, 400) and X.dtype == np.int64
        assert np.asarray(X.sum(axis=1)).ravel().min() >= 5
        assert np.all(corpus.depth[ids] == 2) and np.isin(labels, ids).all()
        assert m.shape == ids.shape and m.sum() == pytest.approx(1.0)
        np.testing.assert_allclose(W.sum(axis=1), 1.0)
    ids0 = corpus.node_ids[0]
    assert ids0.size == 6 and corpus.parent[0] == -1
    assert np.all(corpus.depth[corpus.parent[ids0]] == 1) and np.all(corpus.parent[corpus.parent[ids0]] == 0)
    assert sorted(corpus.born[0].tolist()) == list(range(10))  # root, 3 branches, 6 leaves


def test_lengths_are_log_normal_around_the_median():
    c = planted_topic_mixture(np.random.default_rng(0), n_features=300, n_documents=4000, n_epochs=1,
                              median_length=60.0, length_sigma=0.5, words_per_topic=20)
    lengths = np.asarray(c.counts[0].sum(axis=1)).ravel()
    # floor of a log-normal (plus the at-least-5 floor, out of reach here): test log(length + 0.5)
    assert stats.kstest(np.log(lengths + 0.5), "norm", args=(np.log(60.0), 0.5)).pvalue > 1e-3


def test_leaves_mix_background_branch_and_own_words(corpus):
    """Siblings share their branch's words; leaves of other branches share only the background."""
    W, ids = corpus.word_dists[0], corpus.node_ids[0]
    overlap = np.minimum(W[:, None, :], W[None, :, :]).sum(axis=2)
    same = corpus.parent[ids][:, None] == corpus.parent[ids][None, :]
    off = ~np.eye(ids.size, dtype=bool)
    assert overlap[same & off].min() > overlap[~same].max()
    assert overlap[~same].min() >= 0.3 - 1e-9  # the shared Zipf background weighs 0.3


def test_one_death_and_one_birth_per_later_epoch(corpus):
    for t in (1, 2):
        prev, now = set(corpus.node_ids[t - 1].tolist()), set(corpus.node_ids[t].tolist())
        assert prev - now == set(corpus.died[t].tolist()) and len(corpus.died[t]) == 1
        assert now - prev == set(corpus.born[t].tolist()) and len(corpus.born[t]) == 1
        new = int(corpus.born[t][0])
        assert corpus.depth[new] == 2 and np.isin(new, corpus.labels[t])
        assert not np.isin(corpus.labels[t], corpus.died[t]).any()


def test_drift_is_small_next_to_sibling_differences(corpus):
    W0, W1 = corpus.word_dists[0], corpus.word_dists[1]
    ids0, ids1 = corpus.node_ids[0].tolist(), corpus.node_ids[1].tolist()
    drift = [0.5 * np.abs(W0[ids0.index(n)] - W1[ids1.index(n)]).sum() for n in ids0 if n in ids1]
    sib = [0.5 * np.abs(W0[a] - W0[b]).sum() for a in range(len(ids0)) for b in range(a + 1, len(ids0))
           if corpus.parent[ids0[a]] == corpus.parent[ids0[b]]]
    assert max(drift) < min(sib)


def test_seeded_and_validated():
    a = planted_topic_mixture(np.random.default_rng(1), n_features=60, n_documents=50, n_epochs=2,
                              words_per_topic=10)
    b = planted_topic_mixture(np.random.default_rng(1), n_features=60, n_documents=50, n_epochs=2,
                              words_per_topic=10)
    assert all((x != y).nnz == 0 for x, y in zip(a.counts, b.counts))
    assert all(np.array_equal(x, y) for x, y in zip(a.labels, b.labels))
    rng = np.random.default_rng(1)
    with pytest.raises(ValueError, match="background"):
        planted_topic_mixture(rng, background=0.6, branch_share=0.5)
    with pytest.raises(ValueError, match="words_per_topic"):
        planted_topic_mixture(rng, n_features=20, words_per_topic=40)
    with pytest.raises(ValueError, match="drift"):
        planted_topic_mixture(rng, drift=1.5)
    with pytest.raises(ValueError, match="n_epochs"):
        planted_topic_mixture(rng, n_epochs=0)
