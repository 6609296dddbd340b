"""Bursty (Dirichlet-compound-multinomial) documents through table counts: exact checks.

The Antoniak draws against Stirling-number probabilities, the document concentration's
conditional against quadrature, the augmentation summed over its table counts against the DCM
likelihood (at a node, and collapsed under the parent link), and the sampler's wiring: engine-
and thread-invariant seeded fits, and fits without the option that never draw tables.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy import integrate, stats
from scipy.special import gammaln, logsumexp

from streamtree.engines.local import LocalEngine
from streamtree.likelihoods.base import DocumentSet
from streamtree.likelihoods.document_tables import (CONCENTRATION_RANGE, draw_tables, length_groups,
                                                    log_concentration_density, polya_concentration,
                                                    sample_concentration)
from streamtree.likelihoods.multinomial import Multinomial
from streamtree.model import DTSSBP
from streamtree.tree import TreeArrays
from streamtree.variants import resolve_variant
from test_zsweep_threads import row_ranges  # tests/ is on the path under pytest

VARIANT = resolve_variant("dtssbp", window=2, max_depth=3, gamma=0.5, xi=0.001)


def log_stirling1(n: int) -> np.ndarray:
    """log of the unsigned Stirling numbers of the first kind S(n, t), t = 0..n (exact integers)."""
    row = [1]  # S(0, 0)
    for m in range(n):  # S(m + 1, t) = m S(m, t) + S(m, t - 1)
        row = [(m * (row[t] if t < len(row) else 0)) + (row[t - 1] if t >= 1 else 0) for t in range(m + 2)]
    return np.array([np.log(float(v)) if v else -np.inf for v in row])


def log_dcm(x: np.ndarray, a: np.ndarray) -> float:
    """log DCM(x | a) without the multinomial coefficient."""
    return float(gammaln(a.sum()) - gammaln(a.sum() + x.sum()) + np.sum(gammaln(a + x) - gammaln(a)))


def test_stirling_numbers():
    assert np.allclose(np.exp(log_stirling1(4)), [0, 6, 11, 6, 1])
    # sum_t S(n, t) a^t is the rising factorial a (a + 1) ... (a + n - 1)
    a = 0.7
    assert np.isclose(logsumexp(log_stirling1(6) + np.arange(7) * np.log(a)), gammaln(a + 6) - gammaln(a))


@pytest.mark.parametrize("x,a", [(2, 0.3), (5, 1.7), (8, 0.05), (6, 20.0), (12, 3.0)])
def test_antoniak_draws_match_stirling_probabilities(x, a):
    n = 20000
    rng = np.random.default_rng(int(100 * a) + x)
    # n one-entry rows of count x in one word, each at a node with phi = (1,): a = s phi = s
    X = sp.csr_matrix((np.full(n, float(x)), np.zeros(n, dtype=np.int64), np.arange(n + 1)), shape=(n, 1))
    T = draw_tables(X, np.ones((1, 1)), np.zeros(n, dtype=np.int64), a, rng)
    assert np.array_equal(T.indices, X.indices) and np.array_equal(T.indptr, X.indptr)
    t = T.data.astype(np.int64)
    assert t.min() >= 1 and t.max() <= x
    logp = log_stirling1(x)[1:] + np.arange(1, x + 1) * np.log(a) - (gammaln(a + x) - gammaln(a))
    expected = n * np.exp(logp)
    observed = np.bincount(t - 1, minlength=x).astype(float)
    # pool the cells expected to hold fewer than 5 draws into their neighbours
    keep = expected >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] < 5:
        obs, exp = obs[:-1], exp[:-1]
        obs[-1] += observed[~keep].sum()
        exp[-1] += expected[~keep].sum()
    assert np.isclose(exp.sum(), n)
    assert stats.chisquare(obs, exp).pvalue > 1e-3


def test_counts_of_one_give_one_table_without_random_numbers():
    X = sp.csr_matrix(np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]))
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    T = draw_tables(X, np.full((1, 3), 1 / 3), np.zeros(2, dtype=np.int64), 0.01, rng)
    assert np.array_equal(T.toarray(), X.toarray())
    assert rng.bit_generator.state == state


def test_stored_zeros_give_no_tables():
    X = sp.csr_matrix((np.array([0.0, 3.0, 0.0]), np.array([0, 1, 2]), np.array([0, 3])), shape=(1, 3))
    assert X.nnz == 3  # the zeros are stored entries
    T = draw_tables(X, np.full((1, 3), 1 / 3), np.zeros(1, dtype=np.int64), 5.0, np.random.default_rng(0))
    assert T.data[0] == 0.0 and T.data[2] == 0.0 and 1.0 <= T.data[1] <= 3.0


def test_tables_read_each_document_at_its_own_node():
    # a word with phi ~ 1 at the node opens a table for nearly every repeat, phi ~ 0 almost never
    X = sp.csr_matrix(np.array([[50.0, 0.0], [50.0, 0.0]]))
    theta = np.array([[1 - 1e-9, 1e-9], [1e-9, 1 - 1e-9]])
    T = draw_tables(X, theta, np.array([0, 1]), 1e6, np.random.default_rng(1))
    assert T[0, 0] == 50 and T[1, 0] == 1


def test_tables_are_drawn_entry_by_entry_from_the_uniforms_in_storage_order():
    """Rows are drawn in the order of their nodes, yet each entry reads the uniforms it would
    read in storage order: the tables equal a plain loop over the entries with the same
    generator's uniforms (nodes interleaved, so the two orders differ)."""
    rng = np.random.default_rng(5)
    counts = rng.poisson(1.5, size=(30, 12)).astype(float)
    counts[4] = 0.0
    X = sp.csr_matrix(counts)
    theta = rng.dirichlet(np.ones(12), size=3)
    nodes = np.array([2, 0, 1] * 10)
    s = 2.0
    T = draw_tables(X, theta, nodes, s, np.random.default_rng(9))
    u = np.random.default_rng(9).random(int(np.maximum(X.data - 1, 0).sum()))
    expected, pos = np.empty_like(X.data), 0
    for r in range(X.shape[0]):
        for k in range(X.indptr[r], X.indptr[r + 1]):
            a = s * theta[nodes[r], X.indices[k]]
            expected[k] = 1 + sum(u[pos + i - 1] * (a + i) < a for i in range(1, int(X.data[k])))
            pos += int(X.data[k]) - 1
    assert np.array_equal(T.data, expected)


@pytest.mark.parametrize("bad", [2.5, np.nan, np.inf])
def test_table_draws_refuse_counts_that_are_not_integers(bad):
    X = sp.csr_matrix(np.array([[3.0, 1.0], [bad, 2.0]]))
    with pytest.raises(ValueError, match="integer counts"):
        draw_tables(X, np.full((1, 2), 0.5), np.zeros(2, dtype=np.int64), 1.0, np.random.default_rng(0))


def augmented_terms(x: np.ndarray, s: float):
    """Every table-count vector t of counts x (1 <= t_w <= x_w where x_w > 0), with
    log[Gamma(s) / Gamma(s + n) prod_w S(x_w, t_w) s^t_w], the node-free part of p(x, t | phi, s)."""
    words = np.flatnonzero(x)
    grids = np.meshgrid(*[np.arange(1, int(x[w]) + 1) for w in words], indexing="ij")
    ts = np.zeros((grids[0].size, x.size))
    for j, w in enumerate(words):
        ts[:, w] = grids[j].ravel()
    logs = {w: log_stirling1(int(x[w])) for w in words}
    free = np.array([gammaln(s) - gammaln(s + x.sum())
                     + sum(logs[w][int(t[w])] + t[w] * np.log(s) for w in words) for t in ts])
    return ts, free


def test_augmented_multinomial_scores_sum_to_the_dcm_likelihood():
    """sum_t p(x, t | phi, s), the node's part scored by the multinomial family's row
    likelihood, is DCM(x | s phi): the augmentation is exact at a live node."""
    lik = Multinomial(VARIANT, 4, kappa0=5.0, kappa1=1.0, a=0.0, min_node_docs=2)
    phi = np.array([0.1, 0.5, 0.15, 0.25])
    for x, s in [(np.array([2.0, 0.0, 3.0, 1.0]), 0.8), (np.array([4.0, 1.0, 0.0, 2.0]), 25.0)]:
        ts, free = augmented_terms(x, s)
        node = lik.row_log_likelihood(sp.csr_matrix(ts), phi, 0.0)
        assert np.isclose(logsumexp(free + node), log_dcm(x, s * phi), rtol=0, atol=1e-10)


def test_augmented_collapsed_marginal_is_the_dcm_under_the_parent_link():
    """sum_t of the node-free part times the family's collapsed marginal of t (a new node: phi
    integrated out under Dir(kappa0 phi_parent + eps)) is E_phi[DCM(x | s phi)], by quadrature
    over the two-word simplex: the new-node columns and the split-merge marginals are exact."""
    lik = Multinomial(VARIANT, 2, kappa0=5.0, kappa1=1.0, a=0.0, min_node_docs=2)
    parent = np.array([0.3, 0.7])
    alpha = lik._prior(lik.new_node_prior(1), parent)
    x, s = np.array([3.0, 2.0]), 1.5
    ts, free = augmented_terms(x, s)
    collapsed = np.array([lik.log_marginal(DocumentSet(1.0, t), parent, 0.0, 1) for t in ts])

    def integrand(p1: float) -> float:
        phi = np.array([p1, 1.0 - p1])
        return float(np.exp(log_dcm(x, s * phi)) * stats.beta.pdf(p1, alpha[0], alpha[1]))

    exact, _ = integrate.quad(integrand, 0.0, 1.0, epsabs=0, epsrel=1e-11, limit=200)
    assert np.isclose(logsumexp(free + collapsed), np.log(exact), rtol=0, atol=1e-8)


def test_concentration_density_is_the_joint_in_s():
    """log_concentration_density differs from sum_d log p(x_d, t_d | phi, s) by a constant in s."""
    rng = np.random.default_rng(2)
    phi = rng.dirichlet(np.ones(5))
    X = sp.csr_matrix(rng.multinomial(9, phi, size=4).astype(float))
    T = draw_tables(X, phi[None], np.zeros(4, dtype=np.int64), 2.0, rng)
    lengths, weights = length_groups(X)

    def joint(s: float) -> float:
        out = 0.0
        for d in range(4):
            x, t = X[d].toarray().ravel(), T[d].toarray().ravel()
            w = np.flatnonzero(x)
            out += gammaln(s) - gammaln(s + x.sum()) + sum(
                log_stirling1(int(x[v]))[int(t[v])] + t[v] * np.log(s * phi[v]) for v in w)
        return out

    diffs = [log_concentration_density(s, T.data.sum(), lengths, weights) - joint(s) for s in (0.1, 1.0, 7.0, 300.0)]
    assert np.allclose(diffs, diffs[0], rtol=0, atol=1e-9)


def test_concentration_slice_sampler_matches_quadrature():
    """The chain of slice updates of s has the conditional, computed by quadrature on log s
    (log-uniform prior), as its stationary law: Kolmogorov-Smirnov on thinned draws."""
    lengths, weights, tables = np.array([3.0, 5.0, 2.0]), np.array([2.0, 1.0, 1.0]), 8.0
    lo, hi = np.log(CONCENTRATION_RANGE[0]), np.log(CONCENTRATION_RANGE[1])
    grid = np.linspace(lo, hi, 200001)
    logd = np.array([log_concentration_density(np.exp(v), tables, lengths, weights) for v in grid[::50]])
    dens = np.exp(np.interp(grid, grid[::50], logd) - logd.max())
    cdf = np.concatenate([[0.0], np.cumsum(0.5 * (dens[1:] + dens[:-1]) * np.diff(grid))])
    cdf /= cdf[-1]
    rng = np.random.default_rng(5)
    s, draws = 1.0, []
    for i in range(30000):
        s = sample_concentration(s, tables, lengths, weights, rng, n_steps=1)
        if i >= 100 and i % 10 == 0:
            draws.append(np.log(s))
    res = stats.kstest(draws, lambda v: np.interp(v, grid, cdf))
    assert res.pvalue > 1e-3


def test_polya_start_recovers_a_planted_concentration():
    rng = np.random.default_rng(3)
    f = rng.dirichlet(np.ones(200))
    s_true = 40.0
    X = sp.csr_matrix(np.array([rng.multinomial(60, rng.dirichlet(s_true * f)) for _ in range(3000)], dtype=float))
    s_hat = polya_concentration(X, f)
    assert 0.85 * s_true < s_hat < 1.15 * s_true


def test_polya_start_is_the_same_on_any_thread_count_and_maximises_the_evidence():
    """The evidence's per-non-zero terms are evaluated in ranges on the fitting threads: the
    search's answer is the same to the bit in one range or two, about one distribution or
    about each document's node, and it is the maximiser of the evidence written with
    ``lgamma`` (the product form differs from it by rounding only)."""
    from streamtree.likelihoods.base import argmax_log_scale

    rng = np.random.default_rng(5)
    F = rng.dirichlet(np.ones(50), size=3)
    counts = np.array([rng.multinomial(rng.integers(5, 40), rng.dirichlet(30.0 * F[d % 3])) for d in range(301)],
                      dtype=float)
    counts[0, 0] = 40.0  # a count above the product form's range
    X = sp.csr_matrix(counts)
    node_of_row = np.arange(301) % 3
    n_docs = np.asarray(X.sum(axis=1)).ravel()
    for freq, nodes in ((F[0], None), (F, node_of_row)):
        f_nz = freq[X.indices] if nodes is None else freq[np.repeat(nodes, np.diff(X.indptr)), X.indices]

        def evidence(s):
            a = s * f_nz
            return float(np.sum(gammaln(s) - gammaln(s + n_docs)) + np.sum(gammaln(a + X.data) - gammaln(a)))

        expected = argmax_log_scale(evidence, *CONCENTRATION_RANGE)
        found = [polya_concentration(X, freq, nodes)]
        with row_ranges(2):
            found.append(polya_concentration(X, freq, nodes))
        assert found[0] == found[1]
        assert found[0] == pytest.approx(expected, rel=1e-8)


def test_table_draws_own_node_adjustments_and_polya_start_are_the_same_in_any_number_of_ranges():
    """Each range of rows reads its own stretch of the uniforms (tables), writes its own rows
    (own-node adjustments) or terms (the Polya start): the one-range values, to the bit, in
    2, 3 and 7 ranges; with empty rows, rows without repeats, stored zeros and no rows."""
    rng = np.random.default_rng(8)
    V = 40
    lik = Multinomial(VARIANT, V, kappa0=30.0, kappa1=1.0, a=0.0, min_node_docs=2)
    theta = rng.dirichlet(np.ones(V), size=4)
    counts = rng.poisson(0.6, size=(23, V)).astype(float)
    counts[3] = 0.0  # no terms
    counts[5] = (rng.random(V) < 0.3).astype(float)  # ones only: no uniforms
    X = sp.csr_matrix(counts)
    X.data[:2] = 0.0  # stored zeros
    nodes = rng.integers(0, 4, size=23)
    own = np.where(rng.random(23) < 0.7, nodes, -1)
    arrays = TreeArrays(np.arange(4), np.array([-1, 0, 0, 1]), np.array([0, 1, 1, 2]), np.array([0, 0, 1, 0]))
    sums = np.abs(rng.normal(50.0, 5.0, size=(4, V)))

    def run():
        tables = draw_tables(X, theta, nodes, 3.0, np.random.default_rng(0))
        empty = draw_tables(X[:0], theta, nodes[:0], 3.0, np.random.default_rng(0))
        adjust = lik.own_node_adjustment(X, own, arrays, theta, sums, sums.sum(axis=1), None, theta,
                                         np.zeros(4, dtype=bool), theta[0])
        return tables.data, empty.data, adjust, polya_concentration(X, theta, nodes)

    one = run()
    for n in (2, 3, 7):
        with row_ranges(n):
            got = run()
        for a, b in zip(one, got):
            assert np.array_equal(np.asarray(a).view(np.int64), np.asarray(b).view(np.int64))


@pytest.mark.parametrize("a", [1e-9, 3e-4, 0.37, 2.5, 40.0, 1e4, 9.9e6])
def test_polya_terms_are_log_rising_factorials(a):
    """Each non-zero's term, in the product form (counts up to 16) and through the sum or
    ``lgamma`` beyond, against mpmath's ``log Gamma(a + x) - log Gamma(a)``."""
    import mpmath

    from streamtree.likelihoods.document_tables import _polya_terms_nb

    x = np.array([0, 1, 2, 3, 7, 16, 17, 40, 300], dtype=np.float64)
    f = np.full(x.size, 0.5)
    prod, out = np.empty(x.size), np.empty(x.size)
    _polya_terms_nb(f, x, 2.0 * a, int(np.searchsorted(x, 16, side="right")), 0, x.size, prod, out)
    with mpmath.workdps(40):
        exact = [float(mpmath.loggamma(mpmath.mpf(a) + int(n)) - mpmath.loggamma(mpmath.mpf(a))) for n in x]
    np.testing.assert_allclose(out, exact, rtol=1e-13, atol=1e-13)


# ---------------------------------------------------------------------------- the sampler


def bursty_epochs(rng: np.random.Generator, n_epochs: int = 2) -> list[sp.csr_matrix]:
    V = 60
    topics = rng.dirichlet(np.full(V, 0.1), size=4)
    out = []
    for _ in range(n_epochs):
        rows = [rng.multinomial(rng.integers(20, 60), rng.dirichlet(5.0 * topics[k] + 1e-3))
                for k in range(4) for _ in range(30)]
        out.append(sp.csr_matrix(np.array(rows, dtype=np.float64)))
    return out


FIELDS = ("node_ids", "parent", "depth", "counts", "theta", "assignments", "born")


def same_trees(a: DTSSBP, b: DTSSBP) -> bool:
    return all(np.array_equal(getattr(ta, f), getattr(tb, f)) for ta, tb in zip(a.trees_, b.trees_) for f in FIELDS)


@pytest.mark.usefixtures("threads_always")
def test_bursty_fit_samples_s_and_does_not_depend_on_threads():
    epochs = bursty_epochs(np.random.default_rng(0))
    params = dict(likelihood="multinomial", document_concentration="auto", n_sweeps=6, max_depth=2, n_shards=2,
                  random_state=4)
    a = DTSSBP(**params, n_jobs=1).fit(epochs)
    b = DTSSBP(**params, n_jobs=2).fit(epochs)
    assert same_trees(a, b)
    s = a.state_.hyper["document_concentration"]
    assert CONCENTRATION_RANGE[0] < s < 100.0  # documents drawn from Dir(5 topic): bursty
    fixed = DTSSBP(**{**params, "document_concentration": 3.0}).fit(epochs)
    assert fixed.state_.hyper["document_concentration"] == 3.0
    with pytest.raises(ValueError, match="document_concentration"):
        DTSSBP(likelihood="multinomial", document_concentration=-1.0).fit(epochs)


class RecordingEngine(LocalEngine):
    """The local engine, keeping the values it was sent."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.sent: list[np.ndarray] = []

    def set_values(self, data):
        self.sent.append(np.array(data))
        super().set_values(data)


def test_table_draws_do_not_depend_on_the_shards():
    """The tables come from the coordinator's stream: a shard split changes which shard holds
    a value, not the values (the first sweep's draw at a fixed ``s``, before the shards' own
    streams act)."""
    epochs = bursty_epochs(np.random.default_rng(1), n_epochs=1)
    sent = []
    for n_shards in (1, 3):
        engine = RecordingEngine(n_shards=n_shards)
        DTSSBP(likelihood="multinomial", document_concentration=30.0, n_sweeps=1, max_depth=2, engine=engine,
               n_shards=n_shards, random_state=4).fit(epochs)
        sent.append(engine.sent[0])
        # the shards hold exactly the values sent
        assert np.array_equal(np.concatenate([x.data for x in engine._shards]), engine.sent[-1])
    assert np.array_equal(sent[0], sent[1])
    assert not np.array_equal(sent[0], epochs[0].data)  # repeats were folded into tables


class LoadRecordingEngine(RecordingEngine):
    """The local engine, noting whether its one shard reads the loaded matrix's own arrays."""

    def load(self, X, seeds) -> None:
        super().load(X, seeds)
        x = self._shards[0]
        self.shared = np.shares_memory(x.data, X.data) and np.shares_memory(x.indices, X.indices)


def test_one_shard_reads_the_corpus_without_a_copy_and_leaves_it_as_it_was():
    """The default single shard is built from views of the epoch's matrix (no second copy of
    the corpus), and the tables sent each sweep replace the shard's values rather than being
    written into them: the caller's matrix ends the fit as it began."""
    X = bursty_epochs(np.random.default_rng(3), n_epochs=1)[0]
    kept = X.copy()
    engine = LoadRecordingEngine(n_shards=1)
    DTSSBP(likelihood="multinomial", document_concentration="auto", n_sweeps=4, max_depth=2, engine=engine,
           random_state=0).fit([X])
    assert engine.shared
    assert len(engine.sent) == 3 and not np.array_equal(engine.sent[-1], X.data)  # tables were sent
    assert np.array_equal(engine._shards[0].data, engine.sent[-1])
    for name in ("data", "indices", "indptr"):
        assert np.array_equal(getattr(X, name), getattr(kept, name))

def test_without_the_option_no_tables_are_drawn():
    epochs = bursty_epochs(np.random.default_rng(2))
    engine = RecordingEngine(n_shards=1)
    a = DTSSBP(likelihood="multinomial", document_concentration=None, n_sweeps=4, max_depth=2, engine=engine,
               random_state=1).fit(epochs)
    b = DTSSBP(likelihood="multinomial", document_concentration=None, n_sweeps=4, max_depth=2,
               random_state=1).fit(epochs)
    assert engine.sent == [] and "document_concentration" not in a.state_.hyper
    assert same_trees(a, b)


def test_auto_starts_after_a_first_sweep_of_the_counts(monkeypatch):
    """Under ``"auto"`` the chain's first sweep reads the counts (no tables, no ``s``); the
    first tables are drawn at the next sweep with ``s`` started at the Polya maximum-likelihood
    value about each document's node. A later epoch's first sweep draws its tables about the
    root (its documents have no node yet) and leaves ``s`` as it is: ``s`` is sampled once per
    later sweep, given tables drawn at the documents' nodes."""
    import streamtree.likelihoods.multinomial as multinomial

    epochs = bursty_epochs(np.random.default_rng(2), n_epochs=2)
    starts, updates = [], []

    def spy_start(X, frequencies, node_of_row=None, real=multinomial.polya_concentration):
        starts.append((X.shape[0], node_of_row))
        return real(X, frequencies, node_of_row)

    def spy_update(s, *args, real=multinomial.sample_concentration, **kw):
        updates.append(s)
        return real(s, *args, **kw)

    monkeypatch.setattr(multinomial, "polya_concentration", spy_start)
    monkeypatch.setattr(multinomial, "sample_concentration", spy_update)
    engine = RecordingEngine(n_shards=1)
    model = DTSSBP(likelihood="multinomial", n_sweeps=3, max_depth=2, engine=engine, random_state=1)
    model.partial_fit(epochs[0])
    assert len(engine.sent) == 2 and len(updates) == 2  # sweeps 1 and 2 of 3
    assert len(starts) == 1 and starts[0][0] == epochs[0].shape[0] and starts[0][1] is not None
    s = model.state_.hyper["document_concentration"]
    assert 0 < s < np.inf
    model.partial_fit(epochs[1])
    assert len(engine.sent) == 5 and len(starts) == 1  # every sweep of a later epoch draws tables
    assert len(updates) == 4 and updates[2] == s  # its first sweep left s as the last epoch did


def test_auto_with_one_sweep_starts_s_after_it():
    """A one-sweep first epoch under ``"auto"`` ends with ``s`` started (from the sweep's
    nodes), so the model scores documents and fits the next epoch."""
    epochs = bursty_epochs(np.random.default_rng(4), n_epochs=2)
    model = DTSSBP(likelihood="multinomial", n_sweeps=1, max_depth=2, random_state=0).partial_fit(epochs[0])
    assert 0 < model.state_.hyper["document_concentration"] < np.inf
    assert np.all(np.isfinite(model.score_samples(epochs[0])))
    model.partial_fit(epochs[1])
    assert model.predict(epochs[1]).shape == (epochs[1].shape[0],)


def test_checkpoint_carries_the_document_concentration():
    import json

    epochs = bursty_epochs(np.random.default_rng(3), n_epochs=3)
    params = dict(likelihood="multinomial", document_concentration="auto", n_sweeps=4, max_depth=2,
                  random_state=7)
    whole = DTSSBP(**params).fit(epochs)
    first = DTSSBP(**params).fit(epochs[:2])
    arrays, meta = first.get_checkpoint()
    restored = DTSSBP.from_checkpoint(arrays, json.loads(json.dumps(meta)))
    restored.partial_fit(epochs[2])
    assert restored.state_.hyper["document_concentration"] == whole.state_.hyper["document_concentration"]
    assert all(np.array_equal(getattr(whole.trees_[-1], f), getattr(restored.trees_[-1], f)) for f in FIELDS)


def test_document_concentration_is_refused_for_families_without_it():
    X = np.abs(np.random.default_rng(0).normal(size=(6, 4)))
    with pytest.raises(ValueError, match="document_concentration.*multinomial"):
        DTSSBP(likelihood="vmf", document_concentration=50.0, n_sweeps=1).partial_fit(X)
    # the default, "auto", leaves a family without a document model as it is
    X = X / np.linalg.norm(X, axis=1, keepdims=True)
    auto = DTSSBP(likelihood="vmf", n_sweeps=2, random_state=0).partial_fit(X)
    plain = DTSSBP(likelihood="vmf", document_concentration=None, n_sweeps=2, random_state=0).partial_fit(X)
    assert auto.get_params()["document_concentration"] == "auto" and "document_concentration" not in auto.state_.hyper
    assert same_trees(auto, plain)
