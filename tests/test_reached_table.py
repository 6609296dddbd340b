"""The z-kernel's vMF new-node table built only over the knots the documents reach gives the
same values and draws as the whole table."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import scipy.sparse as sp

from streamtree.inference.enumerated import (TABLE_INTERVALS, VMF, Candidates, interval_knots, range_knots,
                                             score_rows)
from streamtree.likelihoods.vmf import _TABLE_CACHE, new_node_table
from streamtree.synthetic import sparse_corpus


def spans(lo, hi, intervals=TABLE_INTERVALS):
    grid = np.arange(intervals + 1)
    return (grid >= np.asarray(lo)[:, None]) & (grid <= np.asarray(hi)[:, None])


def test_asked_knots_equal_the_whole_table_and_extend_in_the_cache():
    b = np.array([40.0, 900.0, 40.0, 5000.0])
    c = np.array([300.0, 300.0, 300.0, 0.0])
    full = new_node_table(2000, b, c)
    _TABLE_CACHE.clear()
    knots = spans([500, 10, 700, 0], [600, 20, 800, 1024])
    part = new_node_table(2000, b, c, TABLE_INTERVALS, knots)
    # rows 0 and 2 share (b, c): each holds the knots asked for either
    held = knots | knots[[2, 1, 0, 3]]
    assert np.array_equal(part[held], full[held])
    assert np.all(np.isnan(part[~held]))  # nothing else was computed
    # a wider request reuses the cached knots and adds the rest: the same numbers again
    assert np.array_equal(new_node_table(2000, b, c), full)
    _TABLE_CACHE.clear()


def test_range_knots_hold_every_knot_the_interpolation_reads():
    rng = np.random.default_rng(1)
    n = TABLE_INTERVALS
    for _ in range(200):
        low, high = np.sort(rng.uniform(-1.2, 1.2, 2))
        knots = range_knots(np.array([low]), np.array([high]))[0]
        for t in np.concatenate([rng.uniform(low, high, 50), [low, high]]):
            i = min(max(int((min(max(t, -1.0), 1.0) + 1.0) / (2.0 / n)), 0), n - 1)
            assert knots[i] and knots[i + 1]
    assert not range_knots(np.array([np.inf]), np.array([-np.inf])).any()
    touched = np.zeros((1, n), dtype=bool)
    touched[0, [0, 7, n - 1]] = True
    assert np.flatnonzero(interval_knots(touched)[0]).tolist() == [0, 1, 7, 8, n - 1, n]


def vmf_candidates(rng, p, K, table):
    theta = np.abs(rng.normal(size=(K, p)))  # non-negative directions, as for text
    theta /= np.linalg.norm(theta, axis=1, keepdims=True)
    beta = rng.uniform(20, 400, size=K)
    ph = np.arange(0, K, 2)
    prior = np.full(ph.size, 300.0)
    return Candidates(VMF, np.ascontiguousarray(theta.T), rng.normal(size=K), beta, np.zeros(K), ph,
                      rng.normal(size=ph.size) + 5.0, beta[ph], prior,
                      new_node_table(p, beta[ph], prior) if table else None)


@pytest.mark.usefixtures("threads_always")
@pytest.mark.parametrize("dense", [False, True])
def test_reached_table_gives_the_same_weights_and_draws(dense, monkeypatch):
    rng = np.random.default_rng(4)
    X = sparse_corpus(rng, n_docs=2501, p=300, nnz_per_row=15, n_topics=6, topic_words=40).X
    X = X.toarray() if dense else X
    whole = vmf_candidates(np.random.default_rng(7), 300, 9, table=True)
    reached = vmf_candidates(np.random.default_rng(7), 300, 9, table=False)
    assert reached.ph_table is None
    u = rng.random(X.shape[0])
    ref = score_rows(X, whole, u)
    _TABLE_CACHE.clear()
    got = score_rows(X, reached, u)
    assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])
    assert np.all(np.isfinite(got[1]))
    # row blocks (the table grows between them) and threads change nothing
    monkeypatch.setattr("streamtree.inference.enumerated._SCORE_BLOCK_ENTRIES", 9 * 700)
    _TABLE_CACHE.clear()
    with ThreadPoolExecutor(2) as pool:
        got = score_rows(X, reached, u, pool=pool, n_threads=2)
    assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])
    _TABLE_CACHE.clear()
