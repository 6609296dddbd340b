"""The enumerated z-kernel samples the exact categorical over its candidate columns.

Column log weights are recovered from the kernel itself (by masking every other column with
-inf, so the returned log normaliser is that column's weight) and compared with independent
computations: closed forms of the vMF normaliser in p = 3, SciPy's Bessel functions and Gaussian
densities, and the new-node marginals of the likelihood modules. Draws are checked with
chi-square tests against the exact probabilities. Finally, on a tiny tree with a residual
placeholder, the enumerated distribution over "nodes" (placeholder = some new child) equals the
stationary distribution of the reference slice sampler aggregated the same way.
"""

import math

import numpy as np
import pytest
import scipy.sparse as sp
from scipy import stats
from scipy.special import gammaln, ive, logsumexp

from streamtree.inference import enumerated
from streamtree.inference.enumerated import DIRICHLET, LINEAR, VMF, Candidates, score_rows, sweep_rows
from streamtree.inference.slice_sampler import SliceState, StickPrior, prune_trailing_empty, slice_z
from streamtree.likelihoods import gaussian, vmf
from streamtree.tree import ROOT, TSSBTree


def unit(v):
    v = np.asarray(v, dtype=float)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def log_c3(kappa):
    """log C_3(kappa) = log(kappa / (4 pi sinh kappa)), exactly (1 / (4 pi) at kappa = 0)."""
    k = np.asarray(kappa, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log(k) - math.log(2 * math.pi) - k - np.log1p(-np.exp(-2 * k))
    return np.where(k == 0, -math.log(4 * math.pi), out)


def log_cp_scipy(p, kappa):
    """log C_p(kappa) through scipy's exponentially scaled Bessel function (moderate kappa only)."""
    nu = p / 2 - 1
    k = np.asarray(kappa, dtype=float)
    return nu * np.log(k) - (p / 2) * math.log(2 * math.pi) - (np.log(ive(nu, k)) + k)


def column_weights(x, cand):
    """Each column's log weight for one row, read off the kernel by masking the others."""
    X = np.atleast_2d(x)
    out = np.empty(cand.n_columns)
    for col in range(cand.n_columns):
        la = np.full(cand.n_live, -np.inf)
        pa = np.full(cand.n_placeholders, -np.inf)
        if col < cand.n_live:
            la[col] = cand.live_a[col]
        else:
            pa[col - cand.n_live] = cand.ph_a[col - cand.n_live]
        masked = Candidates(cand.kind, cand.coef_T, la, cand.live_b, cand.live_c, cand.ph_parent, pa,
                            cand.ph_b, cand.ph_c, cand.ph_table)
        out[col] = score_rows(X, masked, None)[1][0]
    return out


def chi2_pvalue(labels, probs):
    counts = np.bincount(labels, minlength=probs.size)
    assert counts.size == probs.size
    expected = labels.size * probs
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        assert obs[-1] == 0
        obs, exp = obs[:-1], exp[:-1]
    return stats.chisquare(obs, exp).pvalue


# ------------------------------------------------------------------------------ vMF
def vmf_case(p, seed):
    """Five live nodes (root, 2 children, 2 grandchildren) and three placeholders."""
    rng = np.random.default_rng(seed)
    theta = unit(rng.normal(size=(5, p)))
    beta = np.array([8.0, 15.0, 30.0, 12.0, 25.0])
    log_pi = np.log(np.array([0.2, 0.15, 0.1, 0.05, 0.08]))
    ph_parent = np.array([0, 1, 2])
    log_res = np.log(np.array([0.25, 0.12, 0.05]))
    prior = np.array([3.0, 20.0, 0.0])  # includes a uniform (kappa = 0) new-node prior
    logc = vmf.log_normalizer(p, beta)
    b = beta[ph_parent]
    cand = Candidates(VMF, np.ascontiguousarray(theta.T), log_pi + logc, beta, np.zeros(5), ph_parent,
                      log_res + vmf.log_normalizer(p, b) + vmf.log_normalizer(p, prior), b, prior)
    x = unit(theta[1] + 0.6 * rng.normal(size=p))
    return cand, theta, beta, log_pi, log_res, prior, x


@pytest.mark.parametrize("p", [3, 40])
def test_vmf_column_weights_match_independent_computation(p):
    cand, theta, beta, log_pi, log_res, prior, x = vmf_case(p, p)
    w = column_weights(x, cand)
    logc = log_c3(beta) if p == 3 else log_cp_scipy(p, beta)
    live = log_pi + logc + beta * (theta @ x)
    assert np.allclose(w[:5], live, rtol=0, atol=1e-9)
    t = theta[cand.ph_parent] @ x
    b = beta[cand.ph_parent]
    ph = log_res + vmf.log_new_node_marginal(t, p, b, prior)
    assert np.allclose(w[5:], ph, rtol=0, atol=1e-9)
    if p == 3:
        # C_p(b) C_p(k) / C_p(||b x + k mu||) in closed form
        rho = np.sqrt(b ** 2 + prior ** 2 + 2 * b * prior * t)
        assert np.allclose(w[5:], log_res + log_c3(b) + log_c3(prior) - log_c3(rho), rtol=0, atol=1e-9)
    lognorm = score_rows(x[None], cand, None)[1][0]
    assert lognorm == pytest.approx(logsumexp(np.concatenate([live, ph])), abs=1e-9)


def test_vmf_new_node_marginal_by_quadrature_on_the_sphere():
    """m(x) = int vMF(x; theta, b) vMF(theta; mu, k) dtheta on S^2, by a product rule."""
    p, b, k = 3, 6.0, 4.0
    mu = np.array([0.0, 0.0, 1.0])
    x = unit([0.3, -0.2, 0.5])
    c, wc = np.polynomial.legendre.leggauss(200)  # cos(polar angle)
    phi = np.linspace(0, 2 * np.pi, 400, endpoint=False)
    cc, pp = np.meshgrid(c, phi, indexing="ij")
    s = np.sqrt(1 - cc ** 2)
    th = np.stack([s * np.cos(pp), s * np.sin(pp), cc], axis=-1)
    dens = np.exp(log_c3(b) + b * th @ x + log_c3(k) + k * th @ mu)
    m = np.sum(dens * wc[:, None]) * (2 * np.pi / phi.size)
    assert vmf.log_new_node_marginal(mu @ x, p, b, k) == pytest.approx(math.log(m), abs=1e-10)


def test_vmf_draws_follow_the_exact_categorical():
    cand, theta, beta, log_pi, log_res, prior, x = vmf_case(3, 7)
    rng = np.random.default_rng(0)
    rows = [x, unit(theta[3] + 0.3 * rng.normal(size=3))]
    for xr in rows:
        live = log_pi + log_c3(beta) + beta * (theta @ xr)
        ph = log_res + vmf.log_new_node_marginal(theta[cand.ph_parent] @ xr, 3, beta[cand.ph_parent], prior)
        w = np.concatenate([live, ph])
        probs = np.exp(w - logsumexp(w))
        n = 200_000
        labels, lognorm = score_rows(np.tile(xr, (n, 1)), cand, rng.random(n))
        assert np.allclose(lognorm, logsumexp(w), atol=1e-9)
        assert chi2_pvalue(labels, probs) > 1e-3
        assert probs[5:].sum() > 0.01  # placeholders are really exercised


# ------------------------------------------------------------------------------ Gaussian
def gaussian_case(p, seed):
    rng = np.random.default_rng(seed)
    theta = rng.normal(scale=1.5, size=(4, p))
    var = np.array([0.8, 1.2, 0.5, 2.0])  # per-node noise variances
    log_pi = np.log(np.array([0.1, 0.3, 0.15, 0.1]))
    ph_parent = np.array([0, 1, 3])
    log_res = np.log(np.array([0.2, 0.1, 0.05]))
    prior_var = np.array([2.0, 1.0, 0.3])
    sq = np.einsum("ij,ij->i", theta, theta)
    v = prior_var + var[ph_parent]
    cand = Candidates(LINEAR, np.ascontiguousarray(theta.T),
                      log_pi - sq / (2 * var) - 0.5 * p * np.log(2 * np.pi * var), 1 / var, -0.5 / var,
                      ph_parent, log_res - sq[ph_parent] / (2 * v) - 0.5 * p * np.log(2 * np.pi * v),
                      1 / v, -0.5 / v)
    return cand, theta, var, log_pi, log_res, prior_var, rng


def gaussian_weights(x, theta, var, log_pi, log_res, ph_parent, prior_var):
    p = theta.shape[1]
    live = log_pi + np.array([stats.multivariate_normal(theta[k], var[k] * np.eye(p)).logpdf(x)
                              for k in range(theta.shape[0])])
    ph = log_res + np.array([stats.multivariate_normal(theta[j], (prior_var[i] + var[j]) * np.eye(p)).logpdf(x)
                             for i, j in enumerate(ph_parent)])
    return live, ph


def test_gaussian_column_weights_match_independent_computation():
    p = 4
    cand, theta, var, log_pi, log_res, prior_var, rng = gaussian_case(p, 1)
    for x in (theta[1] + rng.normal(size=p), 3 * rng.normal(size=p)):
        w = column_weights(x, cand)
        live, ph = gaussian_weights(x, theta, var, log_pi, log_res, cand.ph_parent, prior_var)
        assert np.allclose(w[:4], live, rtol=0, atol=1e-9)
        assert np.allclose(w[4:], ph, rtol=0, atol=1e-9)
        par = theta[cand.ph_parent]
        via_module = log_res + gaussian.log_new_node_marginal(x @ x, par @ x, np.einsum("ij,ij->i", par, par), p,
                                                              prior_var, var[cand.ph_parent])
        assert np.allclose(w[4:], via_module, rtol=0, atol=1e-9)
        assert score_rows(x[None], cand, None)[1][0] == pytest.approx(logsumexp(np.concatenate([live, ph])),
                                                                      abs=1e-9)


def test_gaussian_sweep_draws_and_statistics():
    p = 4
    cand, theta, var, log_pi, log_res, prior_var, rng = gaussian_case(p, 2)
    x = theta[0] + 1.5 * rng.normal(size=p)
    live, ph = gaussian_weights(x, theta, var, log_pi, log_res, cand.ph_parent, prior_var)
    w = np.concatenate([live, ph])
    probs = np.exp(w - logsumexp(w))
    n = 200_000
    X = np.tile(x, (n, 1))
    labels, st = sweep_rows(X, cand, np.random.default_rng(5))
    assert chi2_pvalue(labels, probs) > 1e-3
    assert probs[4:].sum() > 0.05
    assert np.array_equal(st.counts, np.bincount(labels, minlength=cand.n_columns))
    assert np.array_equal(st.occupied, np.flatnonzero(st.counts))
    assert np.allclose(st.sums, st.counts[st.occupied, None] * x[None, :])
    assert np.allclose(st.sumsq, st.counts * (x @ x))
    assert st.loglik == pytest.approx(n * logsumexp(w), rel=1e-12)
    # the same uniforms through score_rows give the same labels; CSR input gives the same draws
    u = np.random.default_rng(5).random(n)
    assert np.array_equal(score_rows(X, cand, u)[0], labels)
    labels_sp, st_sp = sweep_rows(sp.csr_matrix(X[:5000]), cand, np.random.default_rng(5))
    assert np.array_equal(labels_sp, labels[:5000])
    assert np.allclose(st_sp.sums, sweep_rows(X[:5000], cand, np.random.default_rng(5))[1].sums)


def test_sweep_rows_takes_two_uniforms_per_row_from_its_stream():
    """A sweep draws a uniform per row for its draws and one more per row that seeded runs have
    always taken (it once drew the seed rows): the stream after a sweep must stay where it was,
    or every seeded tree would change."""
    cand, *_ = gaussian_case(4, 2)
    X = np.random.default_rng(3).normal(size=(37, 4))
    rng = np.random.default_rng(9)
    sweep_rows(X, cand, rng)
    fresh = np.random.default_rng(9)
    fresh.random(2 * X.shape[0])
    assert rng.bit_generator.state == fresh.bit_generator.state

def test_mixed_rows_each_follow_their_own_conditional():
    """Distinct rows in one call: the label of row i depends only on x_i and u_i."""
    p = 3
    cand, theta, var, log_pi, log_res, prior_var, rng = gaussian_case(p, 3)
    xs = np.stack([theta[k] + rng.normal(size=p) for k in range(4)])
    n = 50_000
    X = np.repeat(xs, n, axis=0)
    labels, _ = score_rows(X, cand, rng.random(X.shape[0]))
    for i, x in enumerate(xs):
        w = np.concatenate(gaussian_weights(x, theta, var, log_pi, log_res, cand.ph_parent, prior_var))
        assert chi2_pvalue(labels[i * n:(i + 1) * n], np.exp(w - logsumexp(w))) > 1e-3


# ------------------------------------------------------------------------------ vs slice sampler
SIGMA2 = 1.0
TAU2 = 2.25


def tiny_world():
    """Depth cap 1: a root with two children; the root's residual holds all new children."""
    tree = TSSBTree(max_depth=1)
    state = SliceState(tree)
    state.log_nu[ROOT], state.log1m_nu[ROOT] = math.log(0.3), math.log(0.7)
    state.log_psi[ROOT], state.log1m_psi[ROOT] = 0.0, -math.inf
    state.theta[ROOT] = 0.0
    for psi, th in ((0.4, -1.0), (0.3, 2.0)):
        c = tree.add_child(ROOT)
        state.log_psi[c], state.log1m_psi[c] = math.log(psi), math.log1p(-psi)
        state.log_nu[c], state.log1m_nu[c] = 0.0, -math.inf
        state.theta[c] = th
    prior = StickPrior(alpha0=1.0, lam=0.5, gamma=1.5)

    def draw_theta(parent, depth, rng):
        return state.theta[parent] + math.sqrt(TAU2) * rng.normal()

    def loglik(x, node):
        d = x - state.theta[node]
        return -0.5 * d * d / SIGMA2 - 0.5 * math.log(2 * math.pi * SIGMA2)

    return state, prior, draw_theta, loglik


def test_enumerated_placeholder_equals_aggregated_slice_sampler_stationary_law():
    """p(root), p(child 1), p(child 2), p(some new child) for one document.

    Exact: pi_e f(x | theta_e) for live nodes and residual * E_theta[f(x | theta)] with
    theta ~ N(theta_root, TAU2), i.e. N(x; theta_root, TAU2 + SIGMA2), for the new children.
    The slice chain alternates a slice step with pruning trailing empty created nodes (an exact
    Gibbs refresh of the unrepresented part), so its z-marginal is exactly this law.
    """
    state, prior, draw_theta, loglik = tiny_world()
    x = 3.2
    live_ids = [int(i) for i in state.tree.arrays().ids]
    ids, log_pi, log_res = state.log_masses()
    live = log_pi + np.array([loglik(x, i) for i in live_ids])
    new = log_res[0] + stats.norm(0.0, math.sqrt(TAU2 + SIGMA2)).logpdf(x)
    exact = np.exp(np.append(live, new) - logsumexp(np.append(live, new)))
    assert exact[3] > 0.2

    # enumerated kernel, placeholder under the root
    th = np.array([[state.theta[i]] for i in live_ids])
    v = TAU2 + SIGMA2
    cand = Candidates(LINEAR, np.ascontiguousarray(th.T), log_pi - th[:, 0] ** 2 / (2 * SIGMA2)
                      - 0.5 * math.log(2 * math.pi * SIGMA2), np.full(3, 1 / SIGMA2), np.full(3, -0.5 / SIGMA2),
                      np.array([0]), np.array([log_res[0] - 0.5 * math.log(2 * math.pi * v)]),
                      np.array([1 / v]), np.array([-0.5 / v]))
    rng = np.random.default_rng(0)
    n = 100_000
    labels, _ = score_rows(np.full((n, 1), x), cand, rng.random(n))
    assert chi2_pvalue(labels, exact) > 1e-3

    # slice sampler chain with pruning of empty created children
    steps = 60_000
    z = ROOT
    cat = np.empty(steps, dtype=np.int64)
    pos = {i: k for k, i in enumerate(live_ids)}
    for s in range(steps):
        z = slice_z(x, z, state, prior, loglik, draw_theta, rng)
        prune_trailing_empty(state, [z], protected=live_ids)
        cat[s] = pos.get(z, 3)
    n_b = 60
    ind = cat[:, None] == np.arange(4)[None, :]
    emp = ind.mean(axis=0)
    se = np.maximum(ind.reshape(n_b, -1, 4).mean(axis=1).std(axis=0, ddof=1) / math.sqrt(n_b),
                    np.sqrt(exact * (1 - exact) / steps))
    assert np.all(np.abs(emp - exact) < 5 * se), (emp, exact, se)


# ------------------------------------------------------------------------------ Dirichlet
@pytest.mark.parametrize("table_max", [1 << 14, 3])
def test_dirichlet_placeholders_on_csr_rows_match_the_dirichlet_multinomial(monkeypatch, table_max):
    """The CSR kernel reads a placeholder's Dirichlet-multinomial marginal from column-major
    tables (log alpha for counts of one, a table of normalisers by document length). Its value
    must be the marginal itself (scipy's gammaln) and bit-equal to the row-wise computation of
    the dense path, for counts of one, small counts, counts past the product form (> 8),
    non-integer counts, a stored zero and documents longer than the normaliser table."""
    monkeypatch.setattr(enumerated, "_RISING_TABLE_MAX", table_max)
    rng = np.random.default_rng(3)
    p, K = 30, 4
    dense = np.zeros((6, p))
    dense[0, [1, 4, 7]] = 1.0
    dense[1, [2, 3]] = [2.0, 5.0]
    dense[2, [0, 9, 11]] = [9.0, 1.0, 12.0]
    dense[3, [5, 6]] = [1.5, 1.0]
    dense[4, :] = rng.poisson(2.0, size=p) + 1.0
    dense[5, [8]] = 1.0
    logphi = np.log(rng.dirichlet(np.ones(p), size=K))
    ph = np.array([0, 1, 3], dtype=np.int64)
    alpha = rng.uniform(0.01, 3.0, size=(ph.size, p))
    # only the placeholders: every live column masked out
    cand = Candidates(DIRICHLET, np.ascontiguousarray(logphi.T), np.full(K, -np.inf), np.ones(K), np.zeros(K), ph,
                      np.zeros(ph.size), alpha.sum(axis=1), np.zeros(ph.size), ph_alpha=alpha)
    X = sp.csr_matrix(dense)
    # a stored zero (sparse arithmetic leaves them) counts for nothing
    X = sp.csr_matrix((np.append(X.data, 0.0), np.append(X.indices, 20), np.append(X.indptr[:-1], X.nnz + 1)),
                      shape=X.shape)
    assert X.nnz == np.count_nonzero(dense) + 1
    csr = score_rows(X, cand, None)[1]
    rowwise = score_rows(dense, cand, None)[1]
    assert np.array_equal(csr, rowwise)
    # one row alone builds tables over its own terms and length only: the same values
    assert np.array_equal(score_rows(X[2], cand, None)[1], csr[2:3])
    a_sum = alpha.sum(axis=1)
    dm = np.array([[gammaln(a_sum[j]) - gammaln(a_sum[j] + x.sum()) + np.sum(gammaln(alpha[j] + x) - gammaln(alpha[j]))
                    for j in range(ph.size)] for x in dense])
    np.testing.assert_allclose(csr, logsumexp(dm, axis=1), rtol=1e-12, atol=1e-9)


def test_count_structure_follows_new_values_on_the_same_pattern():
    """Redrawn counts replace a loaded matrix's values array every sweep: the lengths must be
    those of the new values, while the terms (a function of the pattern) are kept."""
    rng = np.random.default_rng(4)
    X = sp.random(40, 25, density=0.2, format="csr", random_state=5)
    X.data = rng.integers(1, 6, size=X.nnz).astype(np.float64)
    first = enumerated._count_structure(X, 25)
    X.data = rng.integers(1, 6, size=X.nnz).astype(np.float64)  # a new array, as set_values does
    second = enumerated._count_structure(X, 25)
    assert second[0] is first[0] and second[1] is first[1]
    fresh = sp.csr_matrix((X.data.copy(), X.indices.copy(), X.indptr.copy()), shape=X.shape)
    for got, want in zip(second, enumerated._count_structure(fresh, 25)):
        assert np.array_equal(got, want)
    totals = np.asarray(X.sum(axis=1)).ravel()
    assert np.array_equal(second[2], np.unique(totals).astype(np.int64))
    assert np.array_equal(second[0], np.unique(X.indices))


def _random_sparse(rng, n, p, density, fmt="csr", dtype=np.float64):
    X = sp.random(n, p, density=density, format=fmt, random_state=int(rng.integers(1 << 30)),
                  data_rvs=lambda k: rng.standard_normal(k) * 3.0, dtype=dtype)
    return X


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_row_sums_and_squared_norms_equal_scipy_bit_for_bit(fmt, dtype):
    """The sweep's row sums and squared norms skip SciPy's per-call overhead but must keep its
    values exactly (the trees depend on every bit): empty rows, float32 and non-CSR input too."""
    rng = np.random.default_rng(11)
    for n, density in [(1, 0.02), (7, 0.0), (40, 0.005), (60, 0.05), (120, 0.1), (300, 0.3)]:
        X = _random_sparse(rng, n, 200, density, fmt, dtype)
        assert same_bits(enumerated.row_sums(X), np.asarray(X.sum(axis=1)).ravel())
        assert same_bits(enumerated.row_sq_norms(X), np.asarray(X.multiply(X).sum(axis=1)).ravel())


def test_row_squared_norms_add_duplicate_entries_before_squaring():
    X = sp.csr_matrix((np.array([1.0, 2.0, 4.0]), np.array([3, 3, 0]), np.array([0, 2, 3])), shape=(2, 5))
    assert not X.has_canonical_format
    assert np.array_equal(enumerated.row_sq_norms(X), [9.0, 16.0])


def test_as_csr_keeps_a_csr_matrix_and_converts_others():
    rng = np.random.default_rng(12)
    X = _random_sparse(rng, 60, 90, 0.05)
    assert enumerated.as_csr(X) is X
    assert enumerated.as_csr(X.tocsc()).format == "csr"


def test_one_part_statistics_combine_as_the_general_path():
    """One shard's statistics are taken as they are; adding an empty shard sends the same
    statistics through the general merge, which must give the same sums."""
    rng = np.random.default_rng(13)
    X = _random_sparse(rng, 50, 30, 0.2)
    labels = rng.integers(0, 6, 50)
    sq = enumerated.row_sq_norms(X)
    part = enumerated.sweep_statistics(X, labels, 8, sq, -3.5, dense_sums=True)
    empty = enumerated.sweep_statistics(X[:0], labels[:0], 8, sq[:0], 0.0, dense_sums=True)
    one, two = enumerated.SweepStats.combine([part]), enumerated.SweepStats.combine([part, empty])
    assert np.array_equal(one.counts, two.counts) and np.array_equal(one.occupied, two.occupied)
    assert np.array_equal(one.sums, two.sums) and np.array_equal(one.sumsq, two.sumsq)
    assert one.loglik == two.loglik == -3.5
    for c, col in enumerate(one.occupied):  # each column's sum is the sum of its rows
        assert np.allclose(one.sums[c], np.asarray(X[labels == col].sum(axis=0)).ravel(), rtol=1e-12, atol=0)

@pytest.mark.parametrize("P", [1, 3, 40])
def test_dirichlet_placeholder_tables_give_the_direct_scores_bit_for_bit(P):
    # the tables' vector logarithms and the side-by-side sums of counts 2-8 against the
    # term-by-term rising factorials of _dirichlet_row, for counts 1-9, fractional and large
    rng = np.random.default_rng(P)
    V, R = 300, 200
    X = sp.random(R, V, density=0.05, format="csr", random_state=P)
    X.data = rng.choice([1.0, 1.0, 2.0, 3.0, 5.0, 8.0, 9.0, 2.5, 30.0], size=X.nnz)
    alpha = np.exp(rng.uniform(np.log(1e-3), np.log(50.0), size=(P, V)))
    alpha_sum = alpha.sum(axis=1)
    tables = enumerated.dirichlet_tables(alpha, alpha_sum, X)
    indptr, indices = X.indptr.astype(np.int64), X.indices.astype(np.int64)
    direct, tabled, work = np.empty(P), np.empty(P), np.empty(P)
    for i in range(R):
        enumerated._dirichlet_row(indptr, indices, X.data, i, alpha, alpha_sum, direct)
        alpha_T, log_T, rising, column_of, length_of = tables
        enumerated._joint_row_T(indptr, indices, X.data, i, log_T, 0, alpha_T, rising, column_of, length_of,
                                alpha_sum, np.empty(0), tabled, work)
        assert np.array_equal(direct, tabled), i
    row = X[0].toarray()[0]  # and the value itself, against SciPy
    expected = (np.sum(gammaln(alpha + row) - gammaln(alpha), axis=1)
                - (gammaln(alpha_sum + row.sum()) - gammaln(alpha_sum)))
    enumerated._dirichlet_row(indptr, indices, X.data, 0, alpha, alpha_sum, direct)
    np.testing.assert_allclose(direct, expected, rtol=1e-10)


@pytest.mark.parametrize("K, P", [(0, 5), (1, 1), (7, 3), (33, 40)])
def test_joint_table_rows_give_the_one_by_one_sums_bit_for_bit(K, P):
    # the four-at-a-time live product and the joint table's placeholder terms against one pass
    # per non-zero in storage order (the order every sum must keep), for rows whose lengths
    # leave 0-3 non-zeros after the blocks of four and for counts 0 (stored), 1, 2-9, 2.5, 30
    rng = np.random.default_rng(K + 10 * P)
    V, R = 120, 80
    X = sp.random(R, V, density=0.08, format="csr", random_state=K + P)
    X.data = rng.choice([1.0, 1.0, 1.0, 1.0, 0.0, 2.0, 3.0, 8.0, 9.0, 2.5, 30.0], size=X.nnz)
    X.data[rng.random(X.nnz) < 0.5] = 1.0  # runs of four ones take the blocked placeholder sum
    coef_T = rng.normal(size=(V, K)) * 10.0
    alpha = np.exp(rng.uniform(np.log(1e-3), np.log(50.0), size=(P, V)))
    alpha_sum = alpha.sum(axis=1)
    alpha_T, joint_T, rising, column_of, length_of = enumerated.dirichlet_tables(alpha, alpha_sum, X, coef_T)
    _, log_T, *_ = enumerated.dirichlet_tables(alpha, alpha_sum, X)
    assert joint_T.shape[1] == K + P and np.array_equal(joint_T[:, K:], log_T)
    indptr, indices, data = X.indptr.astype(np.int64), X.indices.astype(np.int64), X.data
    scores, blocked, out, direct, work = np.empty(K), np.empty(K), np.empty(P), np.empty(P), np.empty(P)
    for i in range(R):
        expected = np.zeros(K)
        for q in range(indptr[i], indptr[i + 1]):  # one non-zero at a time
            expected = expected + data[q] * coef_T[indices[q]]
        enumerated._joint_row_T(indptr, indices, data, i, joint_T, K, alpha_T, rising, column_of, length_of,
                                alpha_sum, scores, out, work)
        enumerated._csr_row_scores(indptr, indices, data, i, coef_T, blocked)
        enumerated._dirichlet_row(indptr, indices, data, i, alpha, alpha_sum, direct)
        assert np.array_equal(scores, expected) and np.array_equal(blocked, expected), i
        assert np.array_equal(out, direct), i
    # a kernel that dropped a block's fourth non-zero, or took the ones of a block with a
    # larger count among them as ones, would fail here: the rows hold both kinds of block
    lengths = np.diff(indptr)
    assert np.any(lengths % 4 != 0) and np.any(lengths >= 4)


@pytest.mark.parametrize("spread", [3.0, 300.0, 30000.0])
def test_column_weights_and_draws_match_numpy_for_flat_and_peaked_rows(spread):
    # flat rows take the kernel's all-columns exponential loop, peaked ones (most columns more
    # than 708 nats down) its listed columns; both must give the categorical NumPy gives
    rng = np.random.default_rng(int(spread))
    R, K, P = 400, 150, 20
    scores = rng.normal(size=(R, K)) * spread
    ph_parent = rng.integers(0, K, P).astype(np.int64)
    ph_a = rng.normal(size=P) * spread
    cand = Candidates(LINEAR, np.eye(K), np.zeros(K), np.ones(K), np.zeros(K), ph_parent, ph_a, np.ones(P),
                      np.zeros(P))
    u = rng.random(R)
    labels, lognorm = score_rows(scores, cand, u, np.ones(R))
    logw = np.concatenate([scores, ph_a + scores[:, ph_parent]], axis=1)
    np.testing.assert_allclose(lognorm, logsumexp(logw, axis=1), rtol=1e-13, atol=1e-13)
    p = np.exp(logw - lognorm[:, None])
    expected = np.array([int(np.searchsorted(np.cumsum(p[i]), u[i] * p[i].sum(), side="right"))
                         for i in range(R)])
    assert np.array_equal(labels, expected)
