"""Multinomial / Dirichlet-multinomial maths against exact answers on tiny vocabularies."""

from __future__ import annotations

import itertools
import math

import mpmath
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import minimize
from scipy.special import digamma, gammaln, polygamma

from streamtree.likelihoods import multinomial_math as mm


def compositions(n: int, V: int):
    """All count vectors of length V summing to n."""
    for cut in itertools.combinations(range(n + V - 1), V - 1):
        bounds = (-1,) + cut + (n + V - 1,)
        yield [bounds[i + 1] - bounds[i] - 1 for i in range(V)]


def simplex3_integral(f) -> float:
    """Integral of f(phi) over the 2-simplex with mpmath (tanh-sinh copes with edge singularities)."""
    mpmath.mp.dps = 20

    def g(u, v):
        p1 = u
        p2 = (1 - u) * v
        return f(p1, p2, 1 - p1 - p2) * (1 - u)

    return float(mpmath.quad(g, [0, 1], [0, 1]))


def mult_dir_integrand(docs, alpha):
    alpha = [mpmath.mpf(a) for a in alpha]
    log_norm = mpmath.loggamma(sum(alpha)) - sum(mpmath.loggamma(a) for a in alpha)
    coefs = [
        mpmath.factorial(sum(x)) / mpmath.fprod(mpmath.factorial(v) for v in x) for x in docs
    ]

    def f(*phi):
        val = mpmath.exp(log_norm) * mpmath.fprod(p ** (a - 1) for p, a in zip(phi, alpha))
        for x, coef in zip(docs, coefs):
            val *= coef * mpmath.fprod(p**v for p, v in zip(phi, x))
        return val

    return f


# ----------------------------------------------------------------------------- special functions
def test_log_rising_factorial_matches_mpmath():
    mpmath.mp.dps = 40
    for a in [1e-9, 0.3, 5.0, 9.99, 10.0, 57.0, 1e3, 1e6]:
        for x in [0.0, 1.0, 2.0, 7.0, 100.0, 1e4]:
            ref = float(mpmath.loggamma(mpmath.mpf(a) + x) - mpmath.loggamma(mpmath.mpf(a)))
            for got in (mm.log_rising_factorial(a, x), mm._log_rising_nb(a, x)):
                assert abs(float(got) - ref) <= 1e-13 * max(1.0, abs(ref))


def test_numba_digamma_trigamma_match_scipy():
    for x in np.logspace(-10, 6, 101):
        assert mm._digamma_nb(x) == pytest.approx(digamma(x), rel=1e-13, abs=1e-13)
        assert mm._trigamma_nb(x) == pytest.approx(polygamma(1, x), rel=1e-12)


def test_log_multinomial_coef_exact():
    X = np.array([[2, 0, 3], [0, 0, 0], [1, 1, 1], [0, 5, 0]])
    want = [
        math.log(math.factorial(sum(r)) / math.prod(math.factorial(v) for v in r)) for r in X
    ]
    np.testing.assert_allclose(mm.log_multinomial_coef(sp.csr_matrix(X)), want, atol=1e-12)
    np.testing.assert_allclose(mm.log_multinomial_coef(X), want, atol=1e-12)


# ----------------------------------------------------------------------------- DM marginals
@pytest.mark.parametrize(
    "x, alpha",
    [([2, 0, 3], [0.7, 1.3, 2.5]), ([1, 4, 0], [0.2, 0.5, 0.9]), ([0, 0, 0], [1.0, 2.0, 3.0])],
)
def test_dm_marginal_matches_quadrature(x, alpha):
    want = math.log(simplex3_integral(mult_dir_integrand([x], alpha)))
    got = mm.log_dm_marginal_rows(sp.csr_matrix([x], dtype=float), alpha)[0]
    assert got == pytest.approx(want, abs=1e-8)
    no_coef = mm.log_dm_marginal_rows(np.array([x]), alpha, include_coef=False)[0]
    assert got - no_coef == pytest.approx(mm.log_multinomial_coef(np.array([x]))[0], abs=1e-12)


@pytest.mark.parametrize("V, n", [(3, 5), (4, 4), (2, 9)])
def test_dm_pmf_sums_to_one(V, n):
    rng = np.random.default_rng(V * 10 + n)
    alpha = rng.gamma(0.7, 1.0, V) + 0.05
    X = np.array(list(compositions(n, V)), dtype=float)
    total = np.exp(mm.log_dm_marginal_rows(sp.csr_matrix(X), alpha)).sum()
    assert total == pytest.approx(1.0, abs=1e-12)


def test_set_marginal_matches_quadrature():
    alpha = [0.6, 1.4, 2.2]
    x1, x2 = [2, 0, 1], [1, 3, 0]
    want = math.log(simplex3_integral(mult_dir_integrand([x1, x2], alpha)))
    X = np.array([x1, x2], dtype=float)
    coef_sum = mm.log_multinomial_coef(X).sum()
    c = X.sum(axis=0)
    got = mm.log_dm_marginal_set(c, c.sum(), alpha, log_coef_sum=coef_sum)
    assert isinstance(got, float)
    assert got == pytest.approx(want, abs=1e-8)
    # The DM pmf of the summed counts is a different quantity (other coefficient).
    summed_pmf = mm.log_dm_marginal_rows(c[None, :], alpha)[0]
    assert abs(summed_pmf - want) > 0.1
    # Sparse input and several sets at once.
    many = mm.log_dm_marginal_set(
        sp.csr_matrix(np.vstack([c, X[0]])), [c.sum(), X[0].sum()], alpha
    )
    assert many[0] == pytest.approx(got - coef_sum, abs=1e-12)
    with pytest.raises(ValueError, match="n_tokens"):
        mm.log_dm_marginal_set(c, c.sum() + 1, alpha)


def test_new_node_marginal_matches_rowwise_and_dense():
    rng = np.random.default_rng(3)
    n, V, P = 7, 40, 3
    dense = rng.poisson(0.3, size=(n, V)).astype(float)
    dense[2] = 0.0  # an empty document
    alphas = rng.gamma(0.3, 1.0, size=(P, V)) + 1e-3
    alphas[1] *= 1e4  # large parameters take the Stirling route
    X = sp.csr_matrix(dense)
    got = mm.new_node_log_marginal(X, alphas)
    for p in range(P):
        np.testing.assert_allclose(got[:, p], mm.log_dm_marginal_rows(dense, alphas[p]), rtol=1e-13)
        # Direct formula on the dense rows.
        a, A = alphas[p], alphas[p].sum()
        want = (
            gammaln(A)
            - gammaln(A + dense.sum(1))
            + (gammaln(a + dense) - gammaln(a)).sum(1)
            + mm.log_multinomial_coef(dense)
        )
        np.testing.assert_allclose(got[:, p], want, rtol=1e-10, atol=1e-9)
    assert got[2] == pytest.approx(np.zeros(P))
    # Explicitly stored zeros change nothing.
    Z = X.copy().tolil()
    Z[0, 0] = 0.0
    Z = sp.csr_matrix(Z)
    Z.data[Z.data == 0] = 0.0
    np.testing.assert_allclose(mm.new_node_log_marginal(Z, alphas), got)


def test_large_sparse_vocabulary_runs():
    V = 100_000
    rng = np.random.default_rng(0)
    X = sp.random(5, V, density=1e-4, format="csr", random_state=1) * 10
    X.data = np.ceil(X.data)
    alphas = rng.gamma(0.1, 1e-2, size=(2, V)) + 1e-6
    out = mm.new_node_log_marginal(X, alphas)
    assert out.shape == (5, 2) and np.all(np.isfinite(out))


# ----------------------------------------------------------------------------- likelihood & predictive
def test_log_likelihood_matrix_matches_dense_formula():
    rng = np.random.default_rng(5)
    dense = rng.poisson(0.8, size=(6, 9)).astype(float)
    phi = rng.dirichlet(np.ones(9), size=4)
    got = mm.log_likelihood_matrix(sp.csr_matrix(dense), np.log(phi))
    want = dense @ np.log(phi).T + mm.log_multinomial_coef(dense)[:, None]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    no_coef = mm.log_likelihood_matrix(dense, np.log(phi), include_coef=False)
    np.testing.assert_allclose(no_coef, dense @ np.log(phi).T, rtol=1e-12)
    # phi_w = 0: -inf only for documents that use w, never NaN (also with stored zeros).
    phi0 = phi.copy()
    phi0[0, 0] = 0.0
    X = sp.csr_matrix(dense)
    X.data[0] = 0.0 if X.indices[0] == 0 else X.data[0]
    with np.errstate(divide="ignore"):
        out = mm.log_likelihood_matrix(X, np.log(phi0))
    assert not np.isnan(out).any()
    uses0 = X.toarray()[:, 0] > 0
    assert np.all(np.isneginf(out[uses0, 0])) and np.all(np.isfinite(out[~uses0, 0]))


@pytest.mark.parametrize("with_new", [False, True])
def test_log_predictive_sums_to_one(with_new):
    rng = np.random.default_rng(11)
    V, n, K = 3, 6, 3
    phi = rng.dirichlet(np.ones(V), size=K)
    w = rng.dirichlet(np.ones(K + 2))
    X = sp.csr_matrix(np.array(list(compositions(n, V)), dtype=float))
    if with_new:
        alphas = rng.gamma(0.8, 1.0, size=(2, V)) + 0.05
        lp = mm.log_predictive(
            X, np.log(phi), np.log(w[:K]), new_node_alphas=alphas, new_node_log_weights=np.log(w[K:])
        )
    else:
        lp = mm.log_predictive(X, np.log(phi), np.log(w[:K] / w[:K].sum()))
    assert np.exp(lp).sum() == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="together"):
        mm.log_predictive(X, np.log(phi), np.log(w[:K]), new_node_alphas=np.ones((1, V)))


# ----------------------------------------------------------------------------- MAP updates
def softmax(z):
    z = z - z.max()
    e = np.exp(z)
    return e / e.sum()


def maximise_softmax(objective, V, rng, restarts=4):
    """Numerical maximiser of objective(phi) over the simplex via a softmax parametrisation."""
    best = None
    for k in range(restarts):
        z0 = np.zeros(V) if k == 0 else rng.normal(size=V)
        res = minimize(
            lambda z: -objective(softmax(z)),
            z0,
            method="L-BFGS-B",
            options={"ftol": 1e-15, "gtol": 1e-11, "maxiter": 20000},
        )
        if best is None or res.fun < best.fun:
            best = res
    return softmax(best.x), -best.fun


def maximise_truncated(objective, V, delta, rng, restarts=10):
    """Numerical maximiser over the truncated simplex {phi >= delta, sum phi = 1}, exactly
    feasible through phi = delta + (1 - V delta) softmax(z); best of several starts (the
    objective is not concave when some c_w + alpha_w < 1)."""
    return maximise_softmax(
        lambda q: objective(delta + (1.0 - V * delta) * q), V, rng, restarts=restarts
    )


def test_map_phi_softmax_is_posterior_mean_and_optimal():
    rng = np.random.default_rng(2)
    c = np.array([3.0, 0.0, 1.0, 5.0, 0.0])
    alpha = np.array([0.2, 0.05, 1.5, 0.7, 2.0])
    phi = mm.map_phi(c, alpha)
    np.testing.assert_allclose(phi, (c + alpha) / (c + alpha).sum(), rtol=1e-14)
    obj = lambda p: mm.node_log_objective(p, c, alpha, basis="softmax")  # noqa: E731
    num, best = maximise_softmax(obj, 5, rng)
    assert obj(phi) >= best - 1e-9 * abs(best)
    np.testing.assert_allclose(phi, num, rtol=1e-5)
    # Sparse count row accepted.
    np.testing.assert_allclose(mm.map_phi(sp.csr_matrix(c), alpha), phi)


def test_map_phi_simplex_interior_and_boundary():
    rng = np.random.default_rng(4)
    # All c + alpha > 1: the usual mode, checked against the optimiser.
    c = np.array([3.0, 1.0, 2.0, 4.0])
    alpha = np.array([0.5, 1.2, 0.9, 2.0])
    phi = mm.map_phi(c, alpha, basis="simplex")
    np.testing.assert_allclose(phi, (c + alpha - 1) / (c + alpha - 1).sum(), rtol=1e-14)
    obj = lambda p: mm.node_log_objective(p, c, alpha, basis="simplex")  # noqa: E731
    num, _ = maximise_softmax(obj, 4, rng)
    np.testing.assert_allclose(phi, num, rtol=1e-5)
    # Some c + alpha < 1: the limit of the truncated-simplex maximisers as delta -> 0.
    c = np.array([3.0, 0.0, 2.0, 0.0])
    alpha = np.array([0.5, 0.3, 0.9, 0.8])
    phi = mm.map_phi(c, alpha, basis="simplex")
    np.testing.assert_allclose(phi, [2.5 / 4.4, 0.0, 1.9 / 4.4, 0.0], rtol=1e-14)
    obj = lambda p: mm.node_log_objective(p, c, alpha, basis="simplex")  # noqa: E731
    for delta in (1e-2, 1e-4):
        q, best = maximise_truncated(obj, 4, delta, rng, restarts=3)
        num = delta + (1.0 - 4 * delta) * q
        np.testing.assert_allclose(num, phi, atol=4 * delta)  # converges to ours as delta -> 0
    with pytest.raises(ValueError, match="not unique"):
        mm.map_phi(np.zeros(4), alpha, basis="simplex")


def random_children(rng, V, J, offset_scale=0.5):
    log_phi = np.log(rng.dirichlet(np.full(V, 0.8), size=J))
    strength = rng.uniform(0.5, 40.0, size=J)
    offset = rng.gamma(0.5, offset_scale, size=(J, V)) + 1e-3
    return log_phi, strength, offset


@pytest.mark.parametrize("seed", range(4))
def test_map_phi_with_children_softmax_matches_optimiser(seed):
    rng = np.random.default_rng(100 + seed)
    V, J = 6, 1 + seed % 3
    c = rng.poisson(1.5, V).astype(float)
    alpha = rng.gamma(0.5, 1.0, V) + 1e-3
    L, s, O = random_children(rng, V, J)
    phi = mm.map_phi_with_children(c, alpha, L, s, O)
    assert phi.sum() == pytest.approx(1.0, abs=1e-14) and phi.min() > 0

    def obj(p):
        return mm.node_log_objective(p, c, alpha, L, s, O)

    num, best = maximise_softmax(obj, V, rng)
    ours = obj(phi)
    assert ours >= best - 1e-6 * abs(best)
    assert abs(ours - best) <= 1e-6 * abs(best)
    np.testing.assert_allclose(phi, num, rtol=1e-5, atol=1e-8)


def test_map_phi_with_children_simplex_matches_optimiser():
    rng = np.random.default_rng(7)
    V = 5
    # Every c + alpha > 1: interior maximiser of a concave objective.
    c = np.array([2.0, 1.0, 3.0, 1.0, 4.0])
    alpha = rng.gamma(2.0, 0.5, V) + 0.5
    L, s, O = random_children(rng, V, 2)
    phi = mm.map_phi_with_children(c, alpha, L, s, O, basis="simplex")
    obj = lambda p: mm.node_log_objective(p, c, alpha, L, s, O, basis="simplex")  # noqa: E731
    num, best = maximise_softmax(obj, V, rng)
    assert abs(obj(phi) - best) <= 1e-6 * abs(best)
    np.testing.assert_allclose(phi, num, rtol=1e-5, atol=1e-8)
    # alpha_w = 1 and c_w = 0 gives b_w = 0: phi_w is set by the children alone and may sit on
    # the boundary (KKT with phi_w = 0). The objective is finite on the closed simplex here.
    c = np.array([3.0, 0.0, 2.0, 0.0, 1.0])
    alpha = np.ones(V)
    L = np.log(np.array([[0.3, 0.3, 0.2, 1e-12, 0.2], [0.25, 0.35, 0.2, 1e-12, 0.2]]))
    s = np.array([20.0, 15.0])
    O = np.full((2, V), 0.5)
    phi = mm.map_phi_with_children(c, alpha, L, s, O, basis="simplex")
    obj = lambda p: mm.node_log_objective(p, c, alpha, L, s, O, basis="simplex")  # noqa: E731
    num, best = maximise_truncated(obj, V, 0.0, rng, restarts=3)
    assert phi[1] > 0.05 and phi[3] == 0.0  # one zero-count term pulled up, one left at 0
    assert abs(obj(phi) - best) <= 1e-6 * abs(best) and obj(phi) >= best - 1e-9
    # The optimiser over the whole simplex reaches phi_3 = 0 only in the limit (its softmax
    # coordinate runs off to -inf), so where it stops depends on its stopping rule. On the
    # face phi_3 = 0 the maximiser is interior: compare with the optimiser there, and check
    # that moving mass onto term 3 loses (the KKT condition at the boundary).
    face = [0, 1, 2, 4]

    def on_face(q):
        p = np.zeros(V)
        p[face] = q
        return p

    num_face, best_face = maximise_softmax(lambda q: obj(on_face(q)), len(face), rng)
    assert obj(phi) >= best_face - 1e-9
    np.testing.assert_allclose(phi, on_face(num_face), atol=1e-7)
    for eps in (1e-8, 1e-6, 1e-4):
        assert obj((1.0 - eps) * phi + eps * np.eye(V)[3]) < obj(phi)


def test_map_phi_with_children_reduces_to_map_phi():
    rng = np.random.default_rng(9)
    c = rng.poisson(2.0, 8).astype(float)
    alpha = rng.gamma(0.5, 1.0, 8) + 1e-2
    L, s, O = random_children(rng, 8, 2)
    np.testing.assert_allclose(mm.map_phi_with_children(c, alpha), mm.map_phi(c, alpha))
    np.testing.assert_allclose(
        mm.map_phi_with_children(c, alpha, L, np.zeros(2), O), mm.map_phi(c, alpha)
    )


def test_map_phi_with_children_large_sparse_vocabulary():
    """V = 10^4 with tiny parameters: stays on the simplex, strictly positive, and optimal
    along random feasible directions."""
    rng = np.random.default_rng(1)
    V, J = 10_000, 3
    c = np.zeros(V)
    np.add.at(c, rng.integers(0, V, 300), 1.0)
    alpha = 50.0 * rng.dirichlet(np.full(V, 0.1)) + 1e-6
    L = np.log(rng.dirichlet(np.full(V, 0.5), size=J) + 1e-12)
    s = rng.uniform(1.0, 300.0, J)
    O = rng.gamma(0.1, 0.01, size=(J, V)) + 1e-6
    phi = mm.map_phi_with_children(c, alpha, L, s, O)
    assert phi.sum() == pytest.approx(1.0, abs=1e-12) and phi.min() > 0
    base = mm.node_log_objective(phi, c, alpha, L, s, O)
    for _ in range(5):
        d = rng.normal(size=V) * phi
        d -= d.sum() * phi / phi.sum()
        for step in (1e-3, -1e-3):
            assert mm.node_log_objective(phi + step * d, c, alpha, L, s, O) <= base + 1e-9


# ----------------------------------------------------------------------------- strength update
def test_map_strength_matches_grid():
    rng = np.random.default_rng(12)
    V, J = 6, 4
    base = rng.dirichlet(np.ones(V), size=J)
    true_s = 15.0
    offset = np.full((J, V), 0.1)
    children = np.array([rng.dirichlet(true_s * base[j] + offset[j]) for j in range(J)])
    L = np.log(children)
    for shape, rate in [(1.0, 0.0), (2.0, 0.1)]:
        s_hat = mm.map_strength(L, base, offset, shape, rate)
        # Brute force: a coarse log grid, then a fine grid around its best point.
        grid = np.exp(np.linspace(np.log(1e-2), np.log(1e4), 1001))
        dens = [mm.log_strength_density(g, L, base, offset, shape, rate) for g in grid]
        k = int(np.argmax(dens))
        grid = np.linspace(grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)], 2001)
        dens = [mm.log_strength_density(g, L, base, offset, shape, rate) for g in grid]
        g_best = grid[int(np.argmax(dens))]
        assert s_hat == pytest.approx(g_best, rel=1e-4)
        assert mm.log_strength_density(s_hat, L, base, offset, shape, rate) >= max(dens) - 1e-9
    # A uniform-looking child pushes the strength to its lower bound.
    assert mm.map_strength(L, base, offset, 1.0, 1e6) == pytest.approx(1e-3)


# ----------------------------------------------------------------------------- input checks
def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="non-negative"):
        mm.log_multinomial_coef(np.array([[1.0, -1.0]]))
    with pytest.raises(ValueError, match="strictly positive"):
        mm.log_dm_marginal_rows(np.array([[1.0, 2.0]]), [1.0, 0.0])
    with pytest.raises(ValueError, match="basis"):
        mm.map_phi([1.0, 2.0], [1.0, 1.0], basis="logit")
    with pytest.raises(ValueError, match="terms"):
        mm.new_node_log_marginal(np.ones((2, 3)), np.ones((1, 4)))
    with pytest.raises(ValueError, match="strictly positive"):
        mm.map_phi_with_children([1.0, 0.0], [1.0, 1.0], [[0.0, -np.inf]], [1.0], [[1.0, 1.0]])
    with pytest.raises(ValueError, match="eps"):
        mm.link_prior([0.5, 0.5], 1.0, None, 0.0, 0.0)
    np.testing.assert_allclose(
        mm.link_prior([0.5, 0.5], 2.0, [0.2, 0.8], 10.0, 1e-3), [3.001, 9.001]
    )


# ----------------------------------------------------------------------------- sets by their terms
@pytest.mark.parametrize("p", [1, 13, 64, 301])
def test_document_set_support_and_the_marginal_over_it_match_the_dense_forms(p):
    # the support a set's builder finds (a byte per term read a word at a time) against
    # np.flatnonzero of its dense sum, for widths that leave 0-7 terms after the last whole
    # word, stored zeros and values that cancel; then the marginal over that support against
    # the dense scan's, bit for bit, and the invalid counts the dense scan rejects
    from streamtree.likelihoods.base import document_set

    rng = np.random.default_rng(p)
    X = sp.random(40, p, density=min(1.0, 4.0 / p), format="csr", random_state=p)
    X.data = rng.choice([0.0, 1.0, 1.0, 2.0, 3.0, 7.0, 12.0, 0.5], size=X.nnz)
    alpha = np.exp(rng.uniform(np.log(1e-3), np.log(30.0), size=p))
    for rows in (np.arange(40), np.arange(0, 40, 7), np.array([3]), np.zeros(0, dtype=np.int64)):
        docs = document_set(X, rows, True)
        assert document_set(X, rows).terms is None  # only when asked for
        assert docs.terms.dtype == np.int64 and np.array_equal(docs.terms, np.flatnonzero(docs.s))
        dense = mm._dm_set_dense_nb(docs.s, alpha, alpha.sum())
        sparse = mm._dm_set_sparse_nb(docs.terms, docs.s, alpha, alpha.sum())
        assert sparse == dense  # the same value and token total, to the bit
        assert mm._dm_set_dense(docs.s, alpha, None, docs.terms) == mm._dm_set_dense(docs.s, alpha)
        every = np.arange(p, dtype=np.int64)  # terms with zeros among them add nothing
        assert mm._dm_set_sparse_nb(every, docs.s, alpha, alpha.sum()) == dense
    # a held term that cancels, a stored zero and a negative sum (which both forms reject)
    signed = sp.csr_matrix((np.array([1.0, 0.0, 2.0, -1.0, -3.0]), np.array([0, 1, 2, 0, 3]), np.array([0, 3, 5])),
                           shape=(2, 4))
    docs = document_set(signed, np.arange(2), True)
    assert np.array_equal(docs.terms, [2, 3]) and np.array_equal(docs.terms, np.flatnonzero(docs.s))
    assert all(np.isnan(v) for v in mm._dm_set_sparse_nb(docs.terms, docs.s, np.ones(4), 4.0))
    with pytest.raises(ValueError, match="non-negative"):
        mm._dm_set_dense(docs.s, np.ones(4), None, docs.terms)
