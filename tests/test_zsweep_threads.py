"""Threads and transport never change results: the z-kernel over row ranges, sparse shard
statistics, and ``n_jobs`` on every likelihood family give bit-identical output."""

import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import pytest
import scipy.sparse as sp

from streamtree import DTSSBP
from streamtree.inference.enumerated import (DIRICHLET, LINEAR, VMF, Candidates, SweepStats, score_rows,
                                             sweep_rows, sweep_statistics)
from streamtree.inference import threads
from streamtree.inference.threads import dealt_by_cost, fitting_threads, in_row_ranges
from streamtree.likelihoods.vmf import _TABLE_CACHE, new_node_table
from streamtree.synthetic import gaussian_evolving_tree, sparse_corpus, vmf_tree_corpus

# every parallel region on the threads, however small (the fitting code runs small ones in the
# calling thread, where these tests would check nothing)
pytestmark = pytest.mark.usefixtures("threads_always")

TREE_FIELDS = ("node_ids", "parent", "depth", "mass", "counts", "theta", "concentration", "born",
               "assignments", "died")


@contextmanager
def row_ranges(n_threads: int):
    """:func:`in_row_ranges` with ``n_threads`` ranges on a pool of that many threads whatever
    the machine (:func:`fitting_threads` caps the count at the CPUs this process may use, so on
    a one-CPU machine it would run one range)."""
    with ThreadPoolExecutor(n_threads) as pool:
        token = threads._FITTING_POOL.set((pool, n_threads))
        try:
            yield
        finally:
            threads._FITTING_POOL.reset(token)


def vmf_candidates(rng, p, K=7):
    theta = rng.normal(size=(K, p))
    theta /= np.linalg.norm(theta, axis=1, keepdims=True)
    beta = rng.uniform(20, 200, size=K)
    ph = np.arange(0, K, 2)
    return Candidates(VMF, np.ascontiguousarray(theta.T), rng.normal(size=K), beta, np.zeros(K), ph,
                      rng.normal(size=ph.size), beta[ph], np.full(ph.size, 300.0))


def dirichlet_candidates(rng, p, K=5):
    logphi = np.log(rng.dirichlet(np.ones(p), size=K))
    ph = np.array([0, 2], dtype=np.int64)
    alpha = rng.uniform(0.1, 2.0, size=(ph.size, p))
    return Candidates(DIRICHLET, np.ascontiguousarray(logphi.T), rng.normal(size=K), np.ones(K), np.zeros(K), ph,
                      rng.normal(size=ph.size), alpha.sum(axis=1), np.zeros(ph.size), ph_alpha=alpha)


def linear_candidates(rng, p, K=6):
    theta = rng.normal(size=(K, p))
    ph = np.array([1, 3], dtype=np.int64)
    return Candidates(LINEAR, np.ascontiguousarray(theta.T), rng.normal(size=K), rng.uniform(0.5, 2, K),
                      -rng.uniform(0.1, 1, K), ph, rng.normal(size=2), rng.uniform(0.1, 1, 2), -rng.uniform(0.1, 1, 2))


@pytest.mark.parametrize("kind", ["vmf", "dirichlet", "linear"])
def test_row_ranges_on_threads_give_the_same_draws(kind):
    rng = np.random.default_rng(0)
    if kind == "vmf":
        X = sparse_corpus(rng, n_docs=3001, p=400, nnz_per_row=12, n_topics=5).X
        cand = vmf_candidates(rng, 400)
    elif kind == "dirichlet":
        X = sp.csr_matrix(rng.poisson(0.3, size=(1501, 60)).astype(float))
        cand = dirichlet_candidates(rng, 60)
    else:
        X = rng.normal(size=(2500, 8))
        cand = linear_candidates(rng, 8)
    u = rng.random(X.shape[0])
    ref_labels, ref_lognorm = score_rows(X, cand, u, block_rows=333)
    assert np.all(ref_labels >= 0) and np.all(np.isfinite(ref_lognorm))
    with ThreadPoolExecutor(3) as pool:
        for n_threads in (2, 3, 7):
            labels, lognorm = score_rows(X, cand, u, pool=pool, n_threads=n_threads, block_rows=333)
            assert np.array_equal(labels, ref_labels)
            assert np.array_equal(lognorm, ref_lognorm)
    if sp.issparse(X):
        # the fused sparse kernel scores exactly what the dense path scores
        dense_labels, dense_lognorm = score_rows(X.toarray(), cand, u)
        assert np.array_equal(dense_labels, ref_labels)
        assert np.allclose(dense_lognorm, ref_lognorm, rtol=0, atol=1e-10)



@pytest.mark.parametrize("kind", ["vmf", "vmf-table", "dirichlet", "linear"])
def test_scoring_order_gives_the_same_draws(kind):
    """Rows taken in any order (the engines take them by their last node) give the same
    labels and normalisers, bit for bit, on one thread and on several."""
    rng = np.random.default_rng(3)
    if kind.startswith("vmf"):
        X = sparse_corpus(rng, n_docs=2501, p=400, nnz_per_row=12, n_topics=5).X
        cand = vmf_candidates(rng, 400)
        if kind == "vmf-table":  # a given table: the fused kernel instead of stored score blocks
            cand = Candidates(**{**cand.__dict__, "ph_table": new_node_table(400, cand.ph_b, cand.ph_c)})
    elif kind == "dirichlet":
        X = sp.csr_matrix(rng.poisson(0.3, size=(1501, 60)).astype(float))
        cand = dirichlet_candidates(rng, 60)
    else:
        X = sp.csr_matrix(rng.normal(size=(2000, 8)) * (rng.random((2000, 8)) < 0.5))
        cand = linear_candidates(rng, 8)
    u = rng.random(X.shape[0])
    ref_labels, ref_lognorm = score_rows(X, cand, u)
    by_node = np.argsort(ref_labels, kind="stable")
    with ThreadPoolExecutor(2) as pool:
        for order, n_threads in ((rng.permutation(X.shape[0]), 1), (by_node, 1), (by_node, 2),
                                 (np.arange(X.shape[0])[::-1], 2)):
            labels, lognorm = score_rows(X, cand, u, pool=pool, n_threads=n_threads, order=order)
            assert np.array_equal(labels, ref_labels)
            assert np.array_equal(lognorm, ref_lognorm)
        _, scored = score_rows(X, cand, None, order=by_node)  # scoring only
        assert np.array_equal(scored, ref_lognorm)



def test_dense_sums_equal_the_sparse_sums_on_any_thread_count():
    """A single shard's sums summed straight into a dense matrix (the local engine's path)
    are the sparse product's sums bit for bit, on one thread and on several."""
    rng = np.random.default_rng(4)
    X = sparse_corpus(rng, n_docs=1700, p=500, nnz_per_row=11, n_topics=6).X
    X.data *= rng.choice([-1.0, 1.0], size=X.data.size) * rng.uniform(0.1, 3.0, size=X.data.size)
    cand = vmf_candidates(rng, 500, K=9)
    labels, ref = sweep_rows(X, cand, np.random.default_rng(7))
    expect = SweepStats.combine([ref])
    with ThreadPoolExecutor(3) as pool:
        for n_threads in (1, 2, 3):
            got_labels, got = sweep_rows(X, cand, np.random.default_rng(7), pool=pool if n_threads > 1 else None,
                                         n_threads=n_threads, dense_sums=True)
            assert np.array_equal(got_labels, labels)
            assert isinstance(got.row_sums, np.ndarray)
            assert np.array_equal(got.row_sums, ref.sums)
            merged = SweepStats.combine([got])
            assert np.array_equal(merged.sums, expect.sums)
            assert np.array_equal(merged.occupied, expect.occupied)
            assert np.array_equal(merged.sumsq, expect.sumsq)


def test_sparse_shard_statistics_combine_to_the_dense_sums():
    rng = np.random.default_rng(1)
    X = sparse_corpus(rng, n_docs=900, p=600, nnz_per_row=10, n_topics=4).X
    cand = vmf_candidates(rng, 600)
    parts, dense_parts = [], []
    for s, (a, b) in enumerate([(0, 250), (250, 600), (600, 900)]):
        labels, st = sweep_rows(X[a:b], cand, np.random.default_rng(s))
        assert sp.issparse(st.row_sums)  # a shard sends sparse sums
        assert st.row_sums.nnz <= X[a:b].nnz
        # the same statistics from dense rows
        sq = np.asarray(X[a:b].multiply(X[a:b]).sum(axis=1)).ravel()
        dense = sweep_statistics(X[a:b].toarray(), labels, cand.n_columns, sq, st.loglik)
        assert np.array_equal(st.sums, dense.sums)
        back = pickle.loads(pickle.dumps(st))
        assert back._dense is None and np.array_equal(back.sums, st.sums)
        parts.append(st)
        dense_parts.append(dense)
    merged = SweepStats.combine(parts)
    labels_all = np.concatenate([sweep_rows(X[a:b], cand, np.random.default_rng(s))[0]
                                 for s, (a, b) in enumerate([(0, 250), (250, 600), (600, 900)])])
    occ = np.flatnonzero(np.bincount(labels_all, minlength=cand.n_columns))
    expect = np.stack([np.asarray(X[labels_all == c].sum(axis=0)).ravel() for c in occ])
    assert np.array_equal(merged.occupied, occ)
    assert np.allclose(merged.sums, expect, rtol=1e-12, atol=1e-12)
    assert np.array_equal(merged.sums, SweepStats.combine(dense_parts).sums)


def test_new_node_table_cache_returns_the_freshly_built_values():
    b = np.array([50.0, 120.0, 50.0])
    c = np.array([300.0, 300.0, 300.0])
    _TABLE_CACHE.clear()
    first = new_node_table(500, b, c)
    assert len(_TABLE_CACHE) == 2  # duplicates are built once
    again = new_node_table(500, b[::-1], c)
    assert np.array_equal(again, first[::-1])
    _TABLE_CACHE.clear()
    assert np.array_equal(new_node_table(500, b[::-1], c), again)


def fit_trees(make, epochs, n_jobs):
    model = make(n_jobs)
    for X in epochs:
        model.partial_fit(X)
    model.close()
    return model.trees_


@pytest.mark.parametrize("family", ["vmf", "gaussian", "multinomial"])
def test_n_jobs_does_not_change_trees(family):
    rng = np.random.default_rng(3)
    if family == "vmf":
        epochs = [vmf_tree_corpus(rng, p=200, branching=(3, 2), kappa=20.0, beta=300.0, docs_per_node=40).X
                  for _ in range(2)]

        def make(n_jobs):
            return DTSSBP(likelihood="vmf", kappa0=100.0, max_depth=2, n_sweeps=6, n_jobs=n_jobs, random_state=4)
    elif family == "gaussian":
        epochs = [e.X for e in gaussian_evolving_tree(rng)[:2]]

        def make(n_jobs):
            # a seed whose chain ends with more than the root (about 40% of seeds do here)
            return DTSSBP(likelihood="gaussian", max_depth=2, n_sweeps=6, n_jobs=n_jobs, random_state=9)
    else:
        phi = rng.dirichlet(np.full(80, 0.1), size=4)
        epochs = [sp.csr_matrix(np.array([rng.multinomial(60, phi[i % 4]) for i in range(240)], dtype=float))
                  for _ in range(2)]

        def make(n_jobs):
            return DTSSBP(likelihood="multinomial", max_depth=2, n_sweeps=6, n_jobs=n_jobs, random_state=4)
    ref = fit_trees(make, epochs, None)
    assert ref[-1].n_nodes >= 2
    for n_jobs in (2, -1, 3):
        trees = fit_trees(make, epochs, n_jobs)
        for a, b in zip(ref, trees):
            for f in TREE_FIELDS:
                assert np.array_equal(getattr(a, f), getattr(b, f)), (family, n_jobs, f)


def test_rows_dealt_by_cost_split_evenly_over_the_fitting_threads():
    """The multinomial node update deals a block's rows to the threads by cost: each contiguous
    range :func:`in_row_ranges` hands out gets the same number of costly rows, and the rows
    are a permutation of the block (without a pool they stay as they are)."""
    rows = np.arange(10, dtype=np.int64)
    cost = np.array([5, 0, 0, 0, 0, 3, 0, 0, 4, 2])  # the four costly rows first in index order
    assert np.array_equal(dealt_by_cost(rows, cost), rows)
    with row_ranges(2):
        dealt = dealt_by_cost(rows, cost)
        assert sorted(dealt.tolist()) == rows.tolist()
        halves = []
        in_row_ranges(dealt.size, lambda a, z: halves.append(dealt[a:z]) or 0.0)
    assert len(halves) == 2
    assert sorted((cost[h] > 0).sum() for h in halves) == [2, 2]


def test_regions_too_small_for_the_threads_run_in_the_calling_thread(monkeypatch):
    """A parallel region goes to the threads only when its rows are predicted to take at least
    ``MIN_PARALLEL_SECONDS`` on one thread, from the time a row its code took at its last run
    (every closure made at one place shares it); until then, and below that, it runs once, in
    the calling thread, over all the rows."""
    monkeypatch.setattr(threads, "MIN_PARALLEL_SECONDS", 0.05)
    monkeypatch.setattr(threads, "_SECONDS_A_ROW", {})
    calls = []

    def region(seconds):
        def run(a, z):
            time.sleep(seconds)
            calls.append((a, z, threading.get_ident()))
            return float(z - a)
        return run

    here = threading.get_ident()
    with row_ranges(2):
        assert in_row_ranges(10, region(0.1)) == 10.0  # not timed yet: here, once
        assert calls == [(0, 10, here)]
        calls.clear()
        assert in_row_ranges(10, region(0.0)) == 5.0  # 0.1 s for ten rows last time: the threads
        assert sorted(c[:2] for c in calls) == [(0, 5), (5, 10)] and all(c[2] != here for c in calls)
        calls.clear()
        in_row_ranges(10, region(0.0))  # that run took next to nothing: here again
        assert calls == [(0, 10, here)]
        calls.clear()
        monkeypatch.setattr(threads, "MIN_PARALLEL_SECONDS", 0.0)  # 0: always the threads
        in_row_ranges(10, region(0.0))
        assert len(calls) == 2 and all(c[2] != here for c in calls)


def test_row_logs_on_the_fitting_threads_are_numpys():
    """The multinomial node update takes its children's ``log phi`` in ranges of rows on the
    fitting threads: NumPy's log of each listed row, at the row's place in its child-major
    array, the other places untouched."""
    from streamtree.likelihoods.multinomial import _log_rows

    rng = np.random.default_rng(0)
    theta = rng.dirichlet(np.full(3000, 0.3), size=9)
    rows = np.array([0, 2, 3, 6, 8], dtype=np.int64)
    at = rng.permutation(9)
    for n_ranges in (1, 2, 3):
        out = np.zeros_like(theta)
        with row_ranges(n_ranges):
            _log_rows(theta, rows, out, at)
        assert np.array_equal(out[at[rows]], np.log(theta[rows]))
        assert not np.delete(out, at[rows], axis=0).any()


def test_fitting_caps_blas_at_one_thread_every_time_and_restores_it():
    """The BLAS cap inside fitting (its library list kept between fits) holds on every entry,
    and the caller's setting comes back after each."""
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads() -> set[int]:
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    assert blas_threads(), "NumPy's BLAS should be loaded and visible to threadpoolctl"
    with threadpool_limits(limits=2, user_api="blas"):
        for _ in range(3):
            with fitting_threads(1):
                assert blas_threads() == {1}
            assert blas_threads() == {2}
