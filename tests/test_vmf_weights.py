"""Weighted vMF documents: a row of norm ``w`` is a unit direction with concentration
``beta w`` at a node of concentration ``beta``. Unit rows are the model as before."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.preprocessing import normalize

from streamtree.inference.enumerated import VMF, Candidates, score_rows
from streamtree.likelihoods import vmf
from streamtree.likelihoods.base import DocumentSet, RowBlock
from streamtree.model import DTSSBP
from streamtree.variants import resolve_variant

P = 7


def _lik(kappa0: float = 5.0) -> vmf.VonMisesFisher:
    variant = resolve_variant("dtssbp", window=2, max_depth=2, gamma=0.5, xi=0.001)
    return vmf.VonMisesFisher(variant, P, kappa0=kappa0, kappa1=1.0, a=0.0, min_node_docs=2,
                              concentration_bounds=(1e-3, 1e6), document_weights=True)


def _rows(rng, n: int, weights) -> sp.csr_matrix:
    U = normalize(rng.standard_normal((n, P)))
    return sp.csr_matrix(np.asarray(weights, dtype=float)[:, None] * U)


def _unit(v):
    v = np.asarray(v, dtype=float)
    return v / np.linalg.norm(v)


def test_unit_weight_check():
    """Rows count as unit documents when every squared norm is within tolerance of 1 (none
    given, or none at all, too); one weighted or NaN row makes them weighted."""
    from streamtree.inference.enumerated import WEIGHT_TOL, row_weights_are_unit

    assert row_weights_are_unit(None) and row_weights_are_unit(np.array([]))
    assert row_weights_are_unit([1.0, 1.0 + WEIGHT_TOL / 2, 1.0 - WEIGHT_TOL / 2])
    assert row_weights_are_unit(np.ones((3, 1))) and row_weights_are_unit(np.ones(4, dtype=np.int64))
    assert not row_weights_are_unit(np.array([1.0, 1.0 + 2 * WEIGHT_TOL]))
    assert not row_weights_are_unit(np.array([0.25, 1.0])) and not row_weights_are_unit(np.array([1.0, np.nan]))


def test_set_normalizer_sums_each_documents_own():
    w2 = np.array([0.25, 4.0, 1.0, 4.0, 9.0])
    want = sum(vmf.log_normalizer(P, 3.0 * np.sqrt(q)) for q in w2)
    assert vmf.set_log_normalizer(P, 5.0, 3.0, w2) == pytest.approx(want, rel=1e-13)
    # unit documents: n log C_p(beta), the formula of unweighted sets, to the bit
    assert vmf.set_log_normalizer(P, 5.0, 3.0, np.ones(5)) == 5.0 * vmf.log_normalizer_nb(float(P), 3.0)
    assert vmf.set_log_normalizer(P, 5.0, 3.0, None) == 5.0 * vmf.log_normalizer_nb(float(P), 3.0)


@pytest.mark.usefixtures("threads_always")
@pytest.mark.parametrize("p", [7, 2000])
def test_compiled_normalizers_match_the_vectorised_ones(p):
    """``log_normalizers`` (compiled, per entry, on the fitting threads when long) agrees with
    ``log_normalizer`` in every regime: the series at small kappa, the Debye expansion, and the
    backward ratio walk of small orders; so do the table and the set sum built on it."""
    from streamtree.inference.threads import fitting_threads

    rng = np.random.default_rng(3)
    kappa = np.concatenate([[0.0, 1e-6, 0.5, 3.0, 30.0, 300.0, 5e3, 1e5, 1e6],
                            np.exp(rng.uniform(-3.0, 13.0, size=vmf._THREADED_NORMALIZERS + 7))])
    want = vmf.log_normalizer(p, kappa)
    serial = vmf.log_normalizers(p, kappa)
    assert np.allclose(serial, want, rtol=1e-13, atol=1e-9)
    with fitting_threads(2):  # long enough for the threads (where numba has two): the same values
        assert np.array_equal(vmf.log_normalizers(p, kappa.reshape(-1, 8)).ravel(), serial)
    sq = rng.uniform(0.01, 9.0, size=40) ** 2
    table = vmf.log_normalizer_table(p, [2.0, 700.0], sq)
    assert np.allclose(table, vmf.log_normalizer(p, np.sqrt(sq)[:, None] * np.array([2.0, 700.0])),
                       rtol=1e-13, atol=1e-9)
    assert vmf.set_log_normalizer(p, 40.0, 700.0, sq) == pytest.approx(table[:, 1].sum(), rel=1e-13)
    with pytest.raises(ValueError, match="dimension"):
        vmf.log_normalizers(1, kappa)
    for bad in (-1.0, np.inf, np.nan):
        with pytest.raises(ValueError, match="finite and non-negative"):
            vmf.log_normalizers(p, np.array([1.0, bad]))


def test_weighted_marginal_is_likelihood_times_prior_over_posterior():
    """Bayes' rule at any direction: the collapsed marginal of weighted documents equals
    likelihood x prior / posterior, the posterior being vMF with natural parameter
    ``kappa mu + beta sum_i w_i x_i``."""
    rng = np.random.default_rng(0)
    X = _rows(rng, 4, [0.3, 1.0, 2.5, 4.0])
    sq = np.asarray(X.multiply(X).sum(axis=1)).ravel()
    s = np.asarray(X.sum(axis=0)).ravel()
    mu = _unit(rng.standard_normal(P))
    beta, kappa = 2.5, 6.0
    eta = kappa * mu + beta * s
    for _ in range(3):
        theta = _unit(rng.standard_normal(P))
        lik = vmf.group_log_likelihood(4.0, s, theta, beta, P, sq)
        prior = vmf.log_normalizer(P, kappa) + kappa * mu @ theta
        post = vmf.log_normalizer(P, np.linalg.norm(eta)) + eta @ theta
        assert vmf.group_log_marginal(4.0, s, mu, kappa, beta, P, sq) == pytest.approx(lik + prior - post, rel=1e-12)


def test_row_and_set_likelihoods_agree_on_weighted_rows():
    rng = np.random.default_rng(1)
    lik = _lik()
    X = _rows(rng, 6, [0.5, 1.0, 1.5, 2.0, 3.0, 0.2])
    theta = _unit(rng.standard_normal(P))
    rows = np.array([5, 1, 3], dtype=np.int64)
    per_row = lik.block_log_likelihood(RowBlock(X, rows), theta, 4.0)
    assert np.allclose(per_row, lik.row_log_likelihood(X[rows], theta, 4.0), rtol=1e-13)
    sub = X[rows]
    docs = DocumentSet(3.0, np.asarray(sub.sum(axis=0)).ravel(), float(sub.multiply(sub).sum()),
                       np.asarray(sub.multiply(sub).sum(axis=1)).ravel())
    assert lik.log_likelihood(docs, theta, 4.0) == pytest.approx(per_row.sum(), rel=1e-12)
    # a weighted set without its rows' norms cannot be scored: an error, not a wrong value
    with pytest.raises(ValueError, match="squared norms"):
        lik.log_likelihood(DocumentSet(3.0, docs.s, docs.sumsq), theta, 4.0)


def test_kernel_scores_weighted_rows_exactly():
    """score_rows on weighted rows: every column is log mass plus the document's log density at
    concentration beta w (live) or its collapsed new-node marginal at b w (placeholders)."""
    rng = np.random.default_rng(2)
    X = _rows(rng, 5, [0.4, 1.0, 2.0, 3.5, 0.8])
    K = 3
    theta = normalize(rng.standard_normal((K, P)))
    conc = np.array([2.0, 5.0, 9.0])
    log_mass = np.log(np.array([0.5, 0.3, 0.1]))
    ph_parent = np.array([0, 2], dtype=np.int64)
    log_res = np.log(np.array([0.06, 0.04]))
    prior = np.array([4.0, 7.0])
    b = conc[ph_parent]
    cand = Candidates(VMF, np.ascontiguousarray(theta.T), log_mass + vmf.log_normalizer(P, conc), conc, np.zeros(K),
                      ph_parent, log_res + vmf.log_normalizer(P, prior) + vmf.log_normalizer(P, b), b, prior)
    u = rng.random(5)
    own, adjust = np.array([1, -1, 0, -1, 2]), np.array([2.0, 0.0, -1.5, 0.0, 0.7])
    labels, lognorm = score_rows(X, cand, u, own=own, adjust=adjust)
    raw = Candidates(VMF, cand.coef_T, log_mass, conc, np.zeros(K), ph_parent, log_res + vmf.log_normalizer(P, prior),
                     b, prior, normalized=False)
    _, lognorm_raw = score_rows(X, raw, None)
    D = X.toarray()
    for i in range(D.shape[0]):
        w = np.linalg.norm(D[i])
        x = D[i] / w
        cols = [log_mass[k] + vmf.log_normalizer(P, conc[k] * w) + conc[k] * w * theta[k] @ x for k in range(K)]
        cols += [log_res[j] + vmf.log_new_node_marginal(theta[ph_parent[j]] @ x, P, b[j] * w, prior[j])
                 for j in range(2)]
        cols = np.array(cols)
        if own[i] >= 0:
            cols[own[i]] += adjust[i]
        assert lognorm[i] == pytest.approx(np.logaddexp.reduce(cols), rel=1e-12)
        weights = np.cumsum(np.exp(cols - cols.max()))
        assert labels[i] == np.argmax(weights > u[i] * weights[-1])
        # without the normalisers: exp(beta theta . (w x)) live, the marginal's other terms new
        unnorm = [log_mass[k] + conc[k] * w * theta[k] @ x for k in range(K)]
        unnorm += [log_res[j] + vmf.log_normalizer(P, prior[j])
                   - vmf.log_normalizer(P, np.linalg.norm(b[j] * w * x + prior[j] * theta[ph_parent[j]]))
                   for j in range(2)]
        assert lognorm_raw[i] == pytest.approx(np.logaddexp.reduce(unnorm), rel=1e-12)
    # rows taken in blocks (distinct weights too many for one table): the same values and draws
    import streamtree.inference.enumerated as enumerated

    saved = enumerated._WEIGHT_TABLE_ENTRIES
    try:
        enumerated._WEIGHT_TABLE_ENTRIES = 2 * (K + 2)  # blocks of two rows
        blocked = score_rows(X, cand, u, own=own, adjust=adjust)
    finally:
        enumerated._WEIGHT_TABLE_ENTRIES = saved
    assert np.array_equal(blocked[0], labels) and np.array_equal(blocked[1], lognorm)
    # unit rows keep the compiled kernel, whose values the weighted path reproduces
    U = normalize(X)
    _, compiled = score_rows(U, cand, None)
    _, numpy_path = score_rows(sp.vstack([U, X[:1]]).tocsr(), cand, None)
    assert np.allclose(numpy_path[:-1], compiled, rtol=1e-9, atol=1e-9)


def test_weighted_pairs_estimate_the_rms_weight_concentration():
    """Unit nodes keep the unweighted pair cosine to the bit; a weighted node's is in units of
    its mean squared weight."""
    rng = np.random.default_rng(3)
    U = normalize(rng.standard_normal((4, P)))
    s = U.sum(axis=0)[None, :]
    counts = np.array([4.0])
    unit = vmf.pair_cosine(counts, s)
    assert vmf.pair_cosine(counts, s, np.array([float(np.sum(U * U))]))[0][0] == unit[0][0]
    w = np.array([1.0, 2.0, 2.0, 1.0])
    Xw = w[:, None] * U
    got, _ = vmf.pair_cosine(counts, Xw.sum(axis=0)[None, :], np.array([float(np.sum(w * w))]))
    G = U @ U.T
    pairs = sum(w[i] * w[j] * G[i, j] for i in range(4) for j in range(4) if i != j)
    assert got[0] == pytest.approx(max(pairs / (4 * 3 * np.mean(w * w)), 0.0), rel=1e-12)


def test_row_norms_are_weights_by_default_and_must_be_positive():
    """By default (``document_weights="auto"``) and with ``True`` a row's norm is its document's
    weight, which must be positive; with ``False`` a row of norm other than 1 is an input error
    (unnormalised rows by mistake). Other families ignore ``"auto"`` and refuse ``True``."""
    X = _rows(np.random.default_rng(4), 3, [0.5, 2.0, 1.0])
    assert DTSSBP().document_weights == "auto"
    with pytest.raises(ValueError, match="needs L2-normalised rows.*document_weights='auto'"):
        vmf.VonMisesFisher.check_input(X, document_weights=False)
    for setting in ("auto", True):
        assert vmf.VonMisesFisher.check_input(X, document_weights=setting).shape == (3, P)
        params = DTSSBP(likelihood="vmf", document_weights=setting).get_params()
        variant = resolve_variant("dtssbp", window=2, max_depth=2, gamma=0.5, xi=0.001)
        assert vmf.VonMisesFisher.from_params(params, variant, P).document_weights is True
    bad = sp.csr_matrix(np.vstack([X.toarray(), np.zeros(P)]))
    with pytest.raises(ValueError, match="row 3"):
        vmf.VonMisesFisher.check_input(bad, document_weights="auto")
    with pytest.raises(ValueError, match="applies to the vmf likelihood"):
        DTSSBP(likelihood="multinomial", document_weights=True).partial_fit(sp.csr_matrix(np.eye(3)))
    m = DTSSBP(likelihood="multinomial", n_sweeps=2, random_state=0).partial_fit(sp.csr_matrix(np.eye(3) * 2.0))
    assert m.trees_[-1].assignments.shape == (3,)


def test_weights_far_from_one_are_taken_for_unnormalised_rows_and_warned():
    """Rows whose norms are read as weights but whose median is far from 1 (raw counts, say)
    fit as weights, with a warning that says how to get unit rows instead; a few rows (scoring
    a couple of short documents) or weights around 1 do not warn."""
    import warnings

    rng = np.random.default_rng(6)
    X = _rows(rng, vmf.WEIGHT_WARNING_MIN_ROWS, rng.uniform(5.0, 12.0, size=vmf.WEIGHT_WARNING_MIN_ROWS))
    with pytest.warns(UserWarning, match="median norm is beyond 4 times.*document_weights=False"):
        assert vmf.VonMisesFisher.check_input(X, document_weights="auto").shape == X.shape
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vmf.VonMisesFisher.check_input(X[:3], document_weights="auto")  # too few rows to say
        around_one = _rows(rng, 40, rng.uniform(0.3, 3.0, size=40))
        vmf.VonMisesFisher.check_input(around_one, document_weights="auto")


@pytest.mark.usefixtures("threads_always")
def test_weighted_fit_is_reproducible_and_the_same_on_two_threads():
    rng = np.random.default_rng(5)
    centres = normalize(rng.standard_normal((3, P)))
    D = normalize(centres[rng.integers(3, size=90)] * 4.0 + rng.standard_normal((90, P)))
    X = sp.csr_matrix(rng.uniform(0.3, 3.0, size=90)[:, None] * D)
    fits = []
    for n_jobs in (1, 1, 2):
        m = DTSSBP(likelihood="vmf", document_weights=True, max_depth=2, n_sweeps=8, random_state=0, n_jobs=n_jobs)
        m.partial_fit(X[:45], epoch=0).partial_fit(X[45:], epoch=1)
        fits.append([(t.assignments.tolist(), t.node_ids.tolist(), t.parent.tolist()) for t in m.trees_])
        assert np.all(np.isfinite(m.score_samples(X)))
        m.close()
    assert fits[0] == fits[1] == fits[2]
