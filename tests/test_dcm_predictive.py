"""The predictive density of bursty (Dirichlet-compound-multinomial) documents: exact checks.

A new node's expected DCM against enumeration of the table counts and Monte Carlo over its
word distribution, a live node's DCM against its closed form, the limit of a large document
concentration against the multinomial predictive, and the fitted model's density summing to one
over every count vector of a given length.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import gammaln, logsumexp

from streamtree.likelihoods.document_tables import dcm_log_mixture, log_stirling_table
from streamtree.model import DTSSBP


def exact_log_stirling(n: int) -> np.ndarray:
    """log S(x, t) for 0 <= t <= x <= n from exact integers."""
    rows = [[1]]
    for m in range(n):
        prev = rows[-1]
        rows.append([(m * (prev[t] if t < len(prev) else 0)) + (prev[t - 1] if t >= 1 else 0) for t in range(m + 2)])
    out = np.full((n + 1, n + 1), -np.inf)
    for x, row in enumerate(rows):
        for t, v in enumerate(row):
            if v:
                out[x, t] = np.log(float(v))
    return out


def log_rising(a, t):
    return gammaln(a + t) - gammaln(a)


def enumerated_new_node(x: np.ndarray, alpha: np.ndarray, s: float) -> float:
    """log E_{phi ~ Dir(alpha)} DCM(x | s phi) without the coefficient, summing over every
    table-count vector t (1 <= t_w <= x_w where x_w > 0)."""
    LS = exact_log_stirling(int(x.max()))
    nz = np.flatnonzero(x)
    A, n = alpha.sum(), x.sum()
    terms = []
    for t in itertools.product(*[range(1, int(x[w]) + 1) for w in nz]):
        t = np.array(t)
        terms.append(np.sum(LS[x[nz], t] + t * np.log(s) + log_rising(alpha[nz], t)) - log_rising(A, t.sum()))
    return float(logsumexp(terms) + gammaln(s) - gammaln(s + n))


def closed_form_dcm(x: np.ndarray, phi: np.ndarray, s: float) -> float:
    a = s * phi
    return float(gammaln(s) - gammaln(s + x.sum()) + np.sum(gammaln(a + x) - gammaln(a)))


def row(x) -> sp.csr_matrix:
    return sp.csr_matrix(np.asarray(x, dtype=np.float64)[None, :])


def test_stirling_table_is_exact():
    assert np.allclose(log_stirling_table(12), exact_log_stirling(12), rtol=1e-13, atol=0)
    assert np.array_equal(np.isinf(log_stirling_table(12)), np.isinf(exact_log_stirling(12)))


DOCS = [np.array([3, 1, 0, 2, 0]), np.array([1, 1, 1, 0, 1]), np.array([0, 6, 0, 0, 0]),
        np.array([2, 2, 2, 1, 3]), np.array([0, 0, 1, 0, 0])]


@pytest.mark.parametrize("x", DOCS, ids=lambda x: "-".join(map(str, x)))
@pytest.mark.parametrize("s", [0.3, 4.0, 250.0])
def test_new_node_is_the_sum_over_table_counts(x, s):
    alpha = np.array([0.7, 1.3, 0.02, 2.0, 5.0])
    got = dcm_log_mixture(row(x), np.zeros((0, 5)), np.zeros(0), alpha[None], np.zeros(1), s)[0]
    assert got == pytest.approx(enumerated_new_node(x, alpha, s), abs=1e-10)


def test_stored_zeros_leave_the_mixture_as_it_is():
    """A CSR row may store zero counts (the family accepts them); each is a factor of one at a
    new node as at a live one, so the density equals that of the row without them."""
    rng = np.random.default_rng(4)
    theta = rng.dirichlet(np.ones(6), size=2)
    alpha = np.array([[0.7, 1.3, 0.02, 2.0, 5.0, 0.4]])
    clean = row([3, 0, 1, 0, 2, 0])
    stored = sp.csr_matrix((np.array([3.0, 0.0, 1.0, 0.0, 2.0, 0.0]), np.arange(6), np.array([0, 6])), shape=(1, 6))
    assert stored.nnz == 6
    for live, ph in ((np.log([0.5, 0.3]), np.log([0.2])), (np.zeros(0), np.zeros(1))):
        th = theta[:live.size]
        want = dcm_log_mixture(clean, th, live, alpha, ph, 5.0)
        assert np.isfinite(want).all()
        assert np.array_equal(dcm_log_mixture(stored, th, live, alpha, ph, 5.0), want)


def _long_rows(V: int, rng) -> sp.csr_matrix:
    """Long documents of three shapes: topical counts (300-1,500 tokens, words repeated up to
    60 times), one heavy word among many words seen once, and a few heavy words alone."""
    topical = [rng.multinomial(n, rng.dirichlet(np.full(V, 0.05))) for n in (300, 800, 1500)]
    singles = np.zeros(V)
    singles[:189] = 1
    singles[200] = 113
    few = np.zeros(V)
    few[[10, 20]] = 119
    rows = np.array(topical + [singles, few], dtype=float)
    rows[0, :3] = [60, 1, 0]
    return sp.csr_matrix(rows)


@pytest.mark.parametrize("scale,s", [(0.185, 110.0), (0.207, 11.1), (0.5, 0.7), (30.0, 4.0), (1000.0, 50.0),
                                     (1000.0, 2000.0), (1e4, 5.0)])
def test_long_documents_drop_only_coefficients_that_cannot_matter(scale, s):
    """The new-node term of long documents with the partial products' negligible coefficients
    dropped: at the default cut it equals the full product (to 1e-12 nats), and at a cut of -20
    it loses at most what the cut promises, n x repeated words x exp(-20) of the density.
    Prior totals below one with many singletons or a few heavy words are where a wrong rate
    (one without the singletons, or one measured from the top of the band) loses most."""
    rng = np.random.default_rng(int(scale * 1000) + int(s))
    V = 400
    alpha = scale * np.vstack([np.full(V, 1.0 / V), rng.dirichlet(np.full(V, 0.3))]) + 1e-9
    X = _long_rows(V, rng)
    counts = X.toarray()
    args = (X, np.zeros((0, V)), np.zeros(0), alpha, np.log([0.5, 0.5]), s)
    full = dcm_log_mixture(*args, log_eps=-np.inf)
    assert np.isfinite(full).all()
    assert np.max(np.abs(dcm_log_mixture(*args) - full)) < 1e-12
    promised = counts.sum(axis=1) * (counts >= 2).sum(axis=1) * np.exp(-20.0)
    loss = -np.expm1(dcm_log_mixture(*args, log_eps=-20.0) - full)  # the share of the density dropped
    assert np.all(loss >= -1e-12) and np.all(loss <= promised + 1e-12)


def test_new_node_is_the_expected_dcm_over_phi():
    """Monte Carlo over phi ~ Dir(alpha), within four standard errors."""
    rng = np.random.default_rng(5)
    x = np.array([4, 0, 1, 2, 0, 3])
    alpha = np.array([0.5, 2.0, 1.0, 0.3, 1.5, 0.8])
    s = 3.0
    phi = rng.dirichlet(alpha, size=400_000)
    lik = np.exp([closed_form_dcm(x, p, s) for p in phi[:1]] + list(
        gammaln(s) - gammaln(s + x.sum()) + np.sum(gammaln(s * phi[1:] + x) - gammaln(s * phi[1:]), axis=1)))
    got = np.exp(dcm_log_mixture(row(x), np.zeros((0, 6)), np.zeros(0), alpha[None], np.zeros(1), s)[0])
    assert abs(got - lik.mean()) < 4 * lik.std() / np.sqrt(lik.size)


def test_live_nodes_and_mixture_are_the_closed_form():
    rng = np.random.default_rng(2)
    V = 30
    theta = rng.dirichlet(np.full(V, 0.5), size=4)
    alpha = 5.0 * theta[:2] + 0.01
    X = sp.csr_matrix(rng.multinomial(9, rng.dirichlet(np.full(V, 0.2)), size=6).astype(np.float64))
    live = np.array([np.log(0.4), np.log(0.3), np.log(0.1), -np.inf])  # a node without mass is skipped
    ph = np.log([0.15, 0.05])
    s = 7.5
    got = dcm_log_mixture(X, theta, live, alpha, ph, s)
    assert X.max() >= 3  # some words repeat
    for r in range(X.shape[0]):
        x = X[r].toarray().ravel().astype(int)
        terms = [live[k] + closed_form_dcm(x, theta[k], s) for k in range(3)]
        terms += [ph[p] + enumerated_new_node(x, alpha[p], s) for p in range(2)]
        assert got[r] == pytest.approx(logsumexp(terms), abs=1e-10)
    # a long document with large counts (lgamma for the rising factorials) at a live node
    x = np.r_[120, 40, 7, np.zeros(V - 3)]
    alone = dcm_log_mixture(row(x), theta[:1], np.zeros(1), np.zeros((0, V)), np.zeros(0), s)[0]
    assert alone == pytest.approx(closed_form_dcm(x, theta[0], s), rel=1e-12)
    assert np.isfinite(dcm_log_mixture(row(x), theta, live, alpha, ph, s)).all()


def fitted(rng: np.random.Generator, V: int, **params) -> tuple[DTSSBP, list[sp.csr_matrix]]:
    topics = rng.dirichlet(np.full(V, 0.3), size=3)
    epochs = [sp.csr_matrix(np.array([rng.multinomial(rng.integers(5, 30), rng.dirichlet(4.0 * topics[k] + 0.05))
                                      for k in range(3) for _ in range(20)], dtype=np.float64)) for _ in range(2)]
    return DTSSBP(likelihood="multinomial", n_sweeps=5, max_depth=2, random_state=3, **params).fit(epochs), epochs


def test_large_concentration_recovers_the_multinomial_predictive():
    model, epochs = fitted(np.random.default_rng(0), 25, document_concentration=None)
    plain = model.score_samples(epochs[-1])
    plain_unnormalized = model.score_samples(epochs[-1], normalized=False)
    model.likelihood_.document_concentration = 1e10
    bursty = model.score_samples(epochs[-1])
    assert np.allclose(bursty, plain, rtol=0, atol=1e-5)
    assert np.allclose(model.score_samples(epochs[-1], normalized=False), plain_unnormalized, rtol=0, atol=1e-5)
    model.likelihood_.document_concentration = 2.0  # bursty documents: a different density
    assert np.all(np.abs(model.score_samples(epochs[-1]) - plain) > 1e-3)


@pytest.mark.parametrize("setting", [None, "auto"])
def test_fitted_density_sums_to_one_over_documents_of_a_length(setting):
    """Over every count vector of length n on V = 4 words the predictive (coefficient included)
    sums to one, for multinomial and bursty documents alike: the two are densities of the same
    counts and compare."""
    model, _ = fitted(np.random.default_rng(1), 4, document_concentration=setting)
    if setting == "auto":
        assert 0 < model.state_.hyper["document_concentration"] < np.inf
    for n in (1, 3, 6):
        docs = np.array([c for c in itertools.product(range(n + 1), repeat=4) if sum(c) == n], dtype=np.float64)
        total = np.exp(logsumexp(model.score_samples(sp.csr_matrix(docs))))
        assert total == pytest.approx(1.0, abs=1e-9)


def test_bursty_predictive_reads_the_sampled_concentration():
    model, epochs = fitted(np.random.default_rng(4), 25, document_concentration="auto")
    s = model.state_.hyper["document_concentration"]
    got = model.score_samples(epochs[-1])
    model.likelihood_.document_concentration = s  # the same value, fixed
    assert np.array_equal(model.score_samples(epochs[-1]), got)
    model.likelihood_.document_concentration = "auto"
    with pytest.raises(ValueError, match="fit the model"):
        model.likelihood_.log_predictive(epochs[-1], None, None, None, None, None, hyper={})


def test_transform_and_predict_weigh_nodes_by_the_bursty_documents():
    """Under bursty documents a node's posterior weight of a document is its log mass plus
    ``log DCM(x | s phi)``, the document model of the fit and of ``score_samples``; the live
    part of the predictive mixture is the same sum."""
    rng = np.random.default_rng(1)
    topics = rng.dirichlet(np.full(25, 0.1), size=3)
    X = sp.csr_matrix(np.array([rng.multinomial(rng.integers(10, 40), rng.dirichlet(20.0 * topics[k] + 0.05))
                                for k in range(3) for _ in range(30)], dtype=np.float64))
    # s fixed at the generating value: sampled ("auto") on these 90 documents it falls to about
    # 3 and reads the three topics as burstiness, leaving 1-4 nodes by the seed (with documents
    # scored at their own node as they stand too); the weighting checked here is the same
    model = DTSSBP(likelihood="multinomial", n_sweeps=10, max_depth=2, random_state=3,
                   document_concentration=20.0).fit([X])
    s = model.state_.hyper["document_concentration"]
    tree = model.trees_[-1]
    assert tree.n_nodes >= 3
    log_mass = model.predictive_.live_a
    dense = X.toarray()
    want = np.array([[log_mass[k] + closed_form_dcm(x, tree.theta[k], s) for k in range(tree.n_nodes)]
                     for x in dense])
    post = np.exp(want - logsumexp(want, axis=1, keepdims=True))
    np.testing.assert_allclose(model.transform(X), post, rtol=1e-9, atol=1e-12)
    assert np.array_equal(model.predict(X), tree.node_ids[np.argmax(want, axis=1)])
    # the multinomial weighting of the same tree gives other log posteriors
    model.likelihood_.document_concentration = None
    plain = model._live_log_weights(X)
    plain = plain - logsumexp(plain, axis=1, keepdims=True)
    assert np.max(np.abs(plain - (want - logsumexp(want, axis=1, keepdims=True)))) > 1e-2
