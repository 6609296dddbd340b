"""NPMI coherence: a hand-computed corpus and a brute-force loop over documents."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.sparse as sp

from streamtree.coherence import mean_npmi, npmi_matrix, topic_npmi

# 4 documents over 5 words; words 3 and 4 are in every document.
DOCS = [{0, 1, 3, 4}, {0, 1, 3, 4}, {0, 2, 3, 4}, {2, 3, 4}]


def _matrix(docs, n_words, counts=False):
    rows = [i for i, d in enumerate(docs) for _ in d]
    cols = [w for d in docs for w in sorted(d)]
    data = [2.0 + w if counts else 1.0 for d in docs for w in sorted(d)]
    return sp.csr_matrix((data, (rows, cols)), shape=(len(docs), n_words))


def _brute_npmi(docs, w, v, eps=0.0):
    n = len(docs)
    pw = sum(w in d for d in docs) / n
    pv = sum(v in d for d in docs) / n
    pwv = sum(w in d and v in d for d in docs) / n
    if eps > 0:
        return math.log((pwv + eps) / (pw * pv)) / -math.log(pwv + eps)
    if pwv == 0:
        return -1.0
    if pwv == 1:
        return 1.0
    return math.log(pwv / (pw * pv)) / -math.log(pwv)


def _brute_topic(docs, words, eps=0.0):
    pairs = list(itertools.combinations(words, 2))
    return sum(_brute_npmi(docs, a, b, eps) for a, b in pairs) / len(pairs)


def test_hand_computed_pairs():
    X = _matrix(DOCS, 5, counts=True)  # counts: only presence may matter
    table = npmi_matrix(X, [0, 1, 2, 3, 4])
    # P(0)=3/4, P(1)=1/2, P(0,1)=1/2: log((1/2)/(3/8)) / log 2 = log(4/3)/log(2)
    assert table[0, 1] == pytest.approx(math.log(4 / 3) / math.log(2))
    # P(0,2)=1/4, P(2)=1/2: log((1/4)/(3/8)) / log 4
    assert table[0, 2] == pytest.approx(math.log(2 / 3) / math.log(4))
    assert table[1, 2] == -1.0  # never together
    assert table[0, 3] == pytest.approx(0.0)  # word 3 is everywhere: independent of anything
    assert table[3, 4] == 1.0  # both in every document
    np.testing.assert_allclose(table, table.T)
    topic = topic_npmi([[0, 1, 2]], X)
    expected = (math.log(4 / 3) / math.log(2) + math.log(2 / 3) / math.log(4) - 1.0) / 3
    assert topic[0] == pytest.approx(expected)
    assert topic[0] == pytest.approx(-0.2924812503605781)


def test_word_absent_from_corpus_scores_minus_one():
    X = _matrix(DOCS, 6)  # word 5 occurs nowhere
    assert topic_npmi([[0, 5]], X)[0] == -1.0
    with pytest.raises(ValueError, match="occur in no document"):
        topic_npmi([[0, 5]], X, eps=1e-12)


@pytest.mark.parametrize("eps", [0.0, 1e-12])
def test_matches_brute_force_on_random_corpus(eps):
    rng = np.random.default_rng(3)
    n_docs, n_words = 60, 40
    dense = rng.random((n_docs, n_words)) < rng.uniform(0.05, 0.6, size=n_words)
    dense[:, 0] = True  # one word in every document
    dense[:, 1] = False  # one absent word (only used with eps=0)
    docs = [set(np.flatnonzero(r).tolist()) for r in dense]
    counts = dense * rng.integers(1, 5, size=dense.shape)
    usable = np.arange(n_words) if eps == 0 else np.arange(2, n_words)
    topics = np.stack([rng.choice(usable, size=8, replace=False) for _ in range(25)])
    if eps == 0:
        topics[0, :2] = [0, 1]
    expected = [_brute_topic(docs, t.tolist(), eps) for t in topics]
    for X in (sp.csr_matrix(counts), counts, sp.csc_matrix(counts.astype(float))):
        got = topic_npmi(topics, X, eps=eps)
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert mean_npmi(topics, sp.csr_matrix(counts), eps=eps) == pytest.approx(np.mean(expected))


def test_explicit_zeros_do_not_count_as_presence():
    X = _matrix(DOCS, 5)
    X = X.tolil()
    X[3, 0] = 0.0
    X = X.tocsr()
    X.data[X.indices == 1] = 0.0  # stored zeros for word 1
    table = npmi_matrix(X, [0, 1])
    assert table[0, 1] == -1.0  # word 1 has no real occurrence left
    assert table[1, 1] == -1.0


def test_a_pair_in_every_document_scores_one_with_smoothing_too():
    X = np.array([[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]])
    for eps in (0.0, 1e-12, 0.5):
        assert npmi_matrix(X, [0, 1], eps=eps)[0, 1] == 1.0


def test_an_entry_stored_twice_is_one_document():
    # CSR arrays as given: document 0 stores term 0 twice (a COO matrix would sum them first)
    dup = sp.csr_matrix((np.ones(6), np.array([0, 0, 1, 1, 0, 1]), np.array([0, 2, 4, 6])), shape=(3, 2))
    assert not dup.has_canonical_format
    once = sp.csr_matrix(np.array([[1, 0], [0, 1], [1, 1]]))
    assert np.array_equal(npmi_matrix(dup, [0, 1]), npmi_matrix(once, [0, 1]))


def test_bounds_and_input_errors():
    rng = np.random.default_rng(0)
    X = sp.random(200, 30, density=0.2, random_state=1, format="csr")
    topics = np.stack([rng.choice(30, size=10, replace=False) for _ in range(12)])
    scores = topic_npmi(topics, X)
    assert np.all(scores >= -1.0) and np.all(scores <= 1.0)
    with pytest.raises(ValueError, match="repeats a word"):
        topic_npmi([[1, 2, 1]], X)
    with pytest.raises(ValueError, match="at least two"):
        topic_npmi([[1], [2]], X)
    with pytest.raises(ValueError, match=r"must lie in \[0, 30\)"):
        topic_npmi([[1, 30]], X)
    with pytest.raises(ValueError, match="2-D"):
        topic_npmi([1, 2, 3], X)
    assert topic_npmi(np.zeros((0, 10), dtype=int), X).shape == (0,)
    assert math.isnan(mean_npmi(np.zeros((0, 10), dtype=int), X))
