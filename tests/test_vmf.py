"""Tests of the vMF likelihood numerics against mpmath, closed forms and numerical integration."""

from __future__ import annotations

import math
import tracemalloc

import mpmath as mp
import numpy as np
import pytest
from scipy import integrate, stats

import streamtree  # noqa: F401  (configures the numba cache before the kernels compile)
from streamtree.likelihoods import vmf

DPS = 40
GRID_P = (3, 100, 2636, 36901, 100000)
GRID_KAPPA = (1e-3, 1.0, 100.0, 1e4, 1e5)
EXTRA_KAPPA = (0.0, 1e-6, 1e6)
# mpmath's besseli sums 0F1 term by term: for these (p, kappa) it takes seconds to minutes, so
# the default tests use the integral representation there (cross-checked in a slow test).
_BESSELI_SLOW = {(36901, 1e5), (100000, 1e5), (36901, 1e6), (100000, 1e6)}


def _mp_log_cp_besseli(p: int, kappa: float):
    with mp.workdps(DPS):
        nu = mp.mpf(p) / 2 - 1
        if kappa == 0:
            return mp.loggamma(mp.mpf(p) / 2) - mp.log(2) - mp.mpf(p) / 2 * mp.log(mp.pi)
        k = mp.mpf(kappa)
        return (
            nu * mp.log(k)
            - (nu + 1) * mp.log(2 * mp.pi)
            - mp.log(mp.besseli(nu, k, maxterms=10**7))
        )


def _mp_log_cp_integral(p: int, kappa: float):
    """log C_p from the integral representation of I_nu:

    I_nu(x) = (x/2)^nu / (sqrt(pi) Gamma(nu+1/2)) int_{-1}^1 (1-t^2)^(nu-1/2) e^(xt) dt.

    The integrand is scaled by its peak value and the quadrature is split around the peak.
    """
    with mp.workdps(DPS):
        nu = mp.mpf(p) / 2 - 1
        x = mp.mpf(kappa)
        a = nu - mp.mpf(1) / 2

        def g(t):
            return a * mp.log1p(-t * t) + x * t

        tstar = (-a + mp.sqrt(a * a + x * x)) / x
        g0 = g(tstar)
        width = 1 / mp.sqrt(2 * a * (1 + tstar**2) / (1 - tstar**2) ** 2)
        pts = [-1]
        around = [tstar + j * width for j in (-40, -10, -3, 0, 3, 10, 40)]
        pts += [t for t in around if -1 < t < 1]
        pts += [1]
        val = mp.quad(lambda t: mp.exp(g(t) - g0), pts)
        log_iv = (
            nu * mp.log(x / 2)
            - mp.log(mp.sqrt(mp.pi))
            - mp.loggamma(nu + mp.mpf(1) / 2)
            + g0
            + mp.log(val)
        )
        return nu * mp.log(x) - (nu + 1) * mp.log(2 * mp.pi) - log_iv


@pytest.fixture(scope="module")
def reference_log_cp() -> dict[tuple[int, float], float]:
    """mpmath references, computed once per module."""
    ref = {}
    for p in GRID_P:
        for kappa in GRID_KAPPA + EXTRA_KAPPA:
            if (p, kappa) in _BESSELI_SLOW:
                ref[p, kappa] = float(_mp_log_cp_integral(p, kappa))
            else:
                ref[p, kappa] = float(_mp_log_cp_besseli(p, kappa))
    return ref


# ---------------------------------------------------------------------------------------------
# log normaliser
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", GRID_P)
def test_log_normalizer_matches_mpmath(p, reference_log_cp):
    for kappa in GRID_KAPPA + EXTRA_KAPPA:
        ref = reference_log_cp[p, kappa]
        got = vmf.log_normalizer(p, kappa)
        got_nb = vmf.log_normalizer_nb(float(p), float(kappa))
        assert abs(got - ref) < 1e-8, (p, kappa, got, ref)
        assert abs(got_nb - ref) < 1e-8, (p, kappa, got_nb, ref)


@pytest.mark.slow
def test_integral_reference_agrees_with_besseli_at_expensive_points():
    for p, kappa in [(36901, 1e5), (100000, 1e5)]:
        a = _mp_log_cp_besseli(p, kappa)
        b = _mp_log_cp_integral(p, kappa)
        assert abs(float(a - b)) < 1e-20
        assert abs(vmf.log_normalizer(p, kappa) - float(a)) < 1e-8


def test_integral_reference_agrees_with_besseli_at_cheap_points():
    for p, kappa in [(2636, 1e4), (100000, 1e4), (100, 1e5)]:
        assert abs(float(_mp_log_cp_besseli(p, kappa) - _mp_log_cp_integral(p, kappa))) < 1e-25


def test_log_normalizer_region_boundaries_against_mpmath():
    # Orders on both sides of the Debye switch (nu = 49, 49.5, 50, 50.5) and arguments on both
    # sides of the series switch x = 2 sqrt(nu + 1); also the smallest orders.
    for p in (2, 3, 4, 7, 100, 101, 102, 103):
        nu = p / 2 - 1
        edge = 2.0 * math.sqrt(nu + 1.0)
        for kappa in (edge * (1 - 1e-9), edge * (1 + 1e-9), 0.5 * edge, 3 * edge, 40.0, 317.0):
            ref = float(_mp_log_cp_besseli(p, kappa))
            assert abs(vmf.log_normalizer(p, kappa) - ref) < 1e-10, (p, kappa)
            assert abs(vmf.log_normalizer_nb(p, kappa) - ref) < 1e-10, (p, kappa)


@pytest.mark.parametrize("p", [2, 3, 5, 100, 101, 2636, 36901, 100000])
def test_log_normalizer_kappa_zero_is_log_inverse_sphere_area(p):
    log_area = math.log(2.0) + (p / 2) * math.log(math.pi) - math.lgamma(p / 2)
    assert vmf.log_normalizer(p, 0.0) == pytest.approx(-log_area, abs=1e-9, rel=1e-15)
    assert vmf.log_normalizer_nb(p, 0.0) == pytest.approx(-log_area, abs=1e-9, rel=1e-15)
    # The limit is approached continuously.
    assert abs(vmf.log_normalizer(p, 1e-12) + log_area) < 1e-9


def test_closed_forms_p2_p3():
    kappas = np.array([1e-6, 1e-3, 0.3, 1.0, 2.0, 7.5, 30.0, 100.0, 1e3, 1e4, 1e5, 1e6])
    with mp.workdps(DPS):
        ref2 = [float(-mp.log(2 * mp.pi * mp.besseli(0, mp.mpf(k)))) for k in kappas]
        # p = 3: C = kappa / (4 pi sinh kappa)
        ref3 = [float(mp.log(mp.mpf(k) / (4 * mp.pi * mp.sinh(mp.mpf(k))))) for k in kappas]
    np.testing.assert_allclose(vmf.log_normalizer(2, kappas), ref2, rtol=1e-15, atol=1e-10)
    np.testing.assert_allclose(vmf.log_normalizer(3, kappas), ref3, rtol=1e-15, atol=1e-10)
    for k, r2, r3 in zip(kappas, ref2, ref3):
        assert abs(vmf.log_normalizer_nb(2.0, k) - r2) < 1e-9
        assert abs(vmf.log_normalizer_nb(3.0, k) - r3) < 1e-9


@pytest.mark.parametrize("p", [2, 3, 57, 100, 102, 2636, 100000])
def test_log_normalizer_vectorised_equals_scalar_calls(p):
    rng = np.random.default_rng(p)
    kappas = np.concatenate([[0.0, 1e-6, 1e6], 10.0 ** rng.uniform(-6, 6, size=60)])
    kappas = kappas.reshape(3, 21)
    out = vmf.log_normalizer(p, kappas)
    assert out.shape == kappas.shape
    scalar = np.array([[vmf.log_normalizer(p, float(k)) for k in row] for row in kappas])
    np.testing.assert_array_equal(out, scalar)
    nb = np.array([[vmf.log_normalizer_nb(float(p), float(k)) for k in row] for row in kappas])
    np.testing.assert_allclose(out, nb, rtol=1e-13, atol=1e-10)
    assert isinstance(vmf.log_normalizer(p, 2.0), float)
    # Decreasing in kappa (log C_p' = -A_p < 0) and finite everywhere.
    flat = np.sort(kappas.ravel())
    vals = vmf.log_normalizer(p, flat)
    assert np.all(np.isfinite(vals))
    assert np.all(np.diff(vals) <= 0)


def test_log_normalizer_rejects_bad_input():
    with pytest.raises(ValueError):
        vmf.log_normalizer(3, -1.0)
    with pytest.raises(ValueError):
        vmf.log_normalizer(1, 1.0)


def test_log_bessel_iv_against_mpmath():
    nus = [0.0, 0.5, 1.0, 7.3, 49.0, 49.9, 50.0, 120.5, 5000.0]
    xs = [1e-5, 0.1, 1.0, 5.0, 14.9, 15.1, 80.0, 1e3, 1e5]
    got = vmf.log_bessel_iv(np.array(nus)[:, None], np.array(xs)[None, :])
    assert got.shape == (len(nus), len(xs))
    with mp.workdps(DPS):
        for i, nu in enumerate(nus):
            for j, x in enumerate(xs):
                if nu * x > 1e8:
                    continue  # besseli needs ~1e5 series terms there; covered via log C_p tests
                ref = float(mp.log(mp.besseli(nu, x, maxterms=10**6)))
                tol = 1e-10 * max(1.0, abs(ref))
                assert abs(got[i, j] - ref) < tol, (nu, x, got[i, j], ref)
                assert abs(vmf.log_bessel_iv_nb(nu, x) - ref) < tol, (nu, x)
    assert vmf.log_bessel_iv(0.0, 0.0) == 0.0
    assert vmf.log_bessel_iv(2.0, 0.0) == -np.inf
    assert vmf.log_bessel_iv_nb(2.0, 0.0) == -np.inf


# ---------------------------------------------------------------------------------------------
# Mean resultant length
# ---------------------------------------------------------------------------------------------


def test_mean_resultant_length_against_mpmath_ratio():
    with mp.workdps(DPS):
        for p in (2, 3, 10, 100, 101, 102, 2636, 20000):
            for kappa in (1e-6, 1e-2, 1.0, 3.0, 30.0, 300.0, 5e3, 1e4):
                nu = mp.mpf(p) / 2 - 1
                ref = mp.besseli(nu + 1, kappa, maxterms=10**6) / mp.besseli(
                    nu, kappa, maxterms=10**6
                )
                got = vmf.mean_resultant_length(p, kappa)
                got_nb = vmf.mean_resultant_length_nb(float(p), kappa)
                assert got == pytest.approx(float(ref), rel=1e-11), (p, kappa)
                assert got_nb == pytest.approx(float(ref), rel=1e-11), (p, kappa)
                # 1 - A keeps its relative accuracy too (matters for Newton near A = 1).
                assert 1.0 - got == pytest.approx(float(1 - ref), rel=1e-7), (p, kappa)


def test_mean_resultant_length_closed_form_p3_and_limits():
    kappas = np.array([1e-3, 0.5, 2.0, 10.0, 100.0, 1e4, 1e6])
    np.testing.assert_allclose(
        vmf.mean_resultant_length(3, kappas), 1.0 / np.tanh(kappas) - 1.0 / kappas, rtol=1e-9
    )
    for p in (2, 3, 2636, 100000):
        assert vmf.mean_resultant_length(p, 1e-9) == pytest.approx(1e-9 / p, rel=1e-9)
        assert vmf.mean_resultant_length(p, 0.0) == 0.0
        ks = np.logspace(-6, 6, 1500)
        a = vmf.mean_resultant_length(p, ks)
        assert np.all(np.diff(a) > 0), p
        assert np.all((a > 0) & (a < 1))
    assert vmf.mean_resultant_length(3, 1e6) == pytest.approx(1 - 1e-6, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# Concentration estimate
# ---------------------------------------------------------------------------------------------


def _unit(rng, p):
    v = rng.standard_normal(p)
    return v / np.linalg.norm(v)


@pytest.mark.parametrize("kappa", [2000.0, 20000.0])
def test_estimate_concentration_recovers_kappa_high_dimension(kappa):
    # Tolerance: within 5% for n = 200 documents at p = 20,000 (the sampling sd is < 1%).
    rng = np.random.default_rng(int(kappa))
    p, n = 20000, 200
    mu = _unit(rng, p)
    X = vmf.sample_vmf(mu, kappa, n, rng)
    r = np.linalg.norm(X.sum(axis=0))
    est = vmf.estimate_concentration(np.array([r]), np.array([n]), p)
    assert est.shape == (1,)
    assert abs(est[0] / kappa - 1.0) < 0.05


def test_estimate_concentration_small_n_bias_correction():
    # n = 3 documents at p = 20,000: the plain rbar = ||S||/n is biased up by (1 - A^2)/n in
    # rbar^2 and the Banerjee estimate from it is ~85% too high; the bias-corrected one is not.
    rng = np.random.default_rng(7)
    p, n, kappa, reps = 20000, 3, 20000.0, 15
    mu = _unit(rng, p)
    draws = [vmf.sample_vmf(mu, kappa, n, rng) for _ in range(reps)]
    r = np.array([np.linalg.norm(x.sum(axis=0)) for x in draws])
    est = vmf.estimate_concentration(r, np.full(reps, n), p)
    assert abs(est.mean() / kappa - 1.0) < 0.03
    assert np.all(np.abs(est / kappa - 1.0) < 0.10)
    rbar = r / n
    naive = rbar * (p - rbar**2) / (1 - rbar**2)
    assert naive.mean() / kappa > 1.5


def test_estimate_concentration_newton_solves_exactly():
    # Feed the expected resultant ||S||^2 = n + n(n-1) A^2 exactly: the estimate must invert A_p.
    for p in (3, 100, 2636, 100000):
        kappas = np.array([0.5, 5.0, 50.0, 500.0, 5e3, 5e4])
        n = np.full(kappas.shape, 1000.0)
        a = vmf.mean_resultant_length(p, kappas)
        r = np.sqrt(n + n * (n - 1) * a * a)
        est = vmf.estimate_concentration(r, n, p, kappa_min=1e-6, newton_steps=6)
        np.testing.assert_allclose(est, kappas, rtol=1e-7)
        # Banerjee alone is already close in high dimension.
        if p >= 2636:
            est0 = vmf.estimate_concentration(r, n, p, kappa_min=1e-6, newton_steps=0)
            np.testing.assert_allclose(est0, kappas, rtol=1e-3)


def test_estimate_concentration_fallback_and_clipping():
    p = 50
    r = np.array([0.0, 1.0, 4.0, 2.0, 2.5])
    n = np.array([0, 1, 4, 4, 3])
    fb = np.array([10.0, 11.0, 12.0, 13.0, 14.0])
    est = vmf.estimate_concentration(r, n, p, fallback=fb, kappa_min=0.01, kappa_max=1e5)
    assert est[0] == 10.0 and est[1] == 11.0  # n < min_count: fallback values as given
    assert est[2] == 1e5  # four identical vectors: ||S|| = n -> kappa_max
    assert est[3] == 0.01  # ||S||^2 = n: bias-corrected rbar = 0 -> kappa_min
    assert 0.01 < est[4] < 1e5
    scalar_fb = vmf.estimate_concentration(r, n, p)
    assert np.isnan(scalar_fb[:2]).all() and np.isfinite(scalar_fb[2:]).all()
    # min_count=1 lets a singleton through: plain rbar = 1 -> kappa_max.
    single = vmf.estimate_concentration([1.0], [1], p, min_count=1, kappa_max=1e5)
    assert single[0] == 1e5


# ---------------------------------------------------------------------------------------------
# Wood sampler
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "p,kappa", [(3, 0.0), (3, 0.7), (3, 25.0), (3, 1e6), (2, 4.0), (2636, 100.0), (2636, 1e4)]
)
def test_sample_vmf_mean_cosine_matches_mean_resultant_length(p, kappa):
    rng = np.random.default_rng(11)
    mu = _unit(rng, p)
    size = 4000 if p < 100 else 1500
    X = vmf.sample_vmf(mu, kappa, size, rng)
    assert X.shape == (size, p)
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1.0, atol=1e-12)
    w = X @ mu
    a = vmf.mean_resultant_length(p, kappa)
    var = 1.0 - a * a - (p - 1) * a / kappa if kappa > 0 else 1.0 / p  # Var(mu.x) = A'(kappa)
    assert abs(w.mean() - a) < 5.0 * math.sqrt(var / size), (w.mean(), a)
    if p == 3 and kappa > 0:
        assert a == pytest.approx(1.0 / math.tanh(kappa) - 1.0 / kappa, rel=1e-12)


@pytest.mark.parametrize("kappa", [0.0, 0.5, 4.0, 300.0])
def test_sample_vmf_p3_cosine_distribution_ks(kappa):
    # At p = 3 the cosine w = mu.x has density proportional to exp(kappa w) on [-1, 1].
    rng = np.random.default_rng(5)
    mu = np.array([0.3, -0.4, 0.5])
    w = vmf.sample_vmf(mu, kappa, 4000, rng) @ (mu / np.linalg.norm(mu))

    def cdf(x):
        x = np.clip(x, -1.0, 1.0)
        if kappa == 0.0:
            return (x + 1.0) / 2.0
        return np.exp(kappa * (x - 1.0)) * -np.expm1(-kappa * (x + 1.0)) / -np.expm1(-2.0 * kappa)

    assert stats.kstest(w, cdf).pvalue > 1e-3


def test_sample_vmf_p3_direction_is_uniform_around_mu():
    # The tangent component must be isotropic: its angle around mu is uniform.
    rng = np.random.default_rng(3)
    X = vmf.sample_vmf(np.array([0.0, 0.0, 1.0]), 2.0, 4000, rng)
    phi = np.arctan2(X[:, 1], X[:, 0])
    assert stats.kstest(phi, stats.uniform(loc=-np.pi, scale=2 * np.pi).cdf).pvalue > 1e-3


def test_sample_vmf_high_dimension_memory_is_linear_in_p():
    p, size = 100000, 8
    rng = np.random.default_rng(1)
    mu = _unit(rng, p)
    for kappa in (0.0, 1e3, 1e6):
        tracemalloc.start()
        X = vmf.sample_vmf(mu, kappa, size, rng)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert X.shape == (size, p)
        np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1.0, atol=1e-12)
        assert peak < 4 * size * p * 8 + 2**20  # a few (size, p) arrays, nowhere near p x p
    # Very high concentration: draws hug mu with E[1 - mu.x] ~ (p-1)/(2 kappa).
    X = vmf.sample_vmf(mu, 1e6, size, rng)
    assert np.all(1.0 - X @ mu < 0.2)


def test_sample_vmf_is_reproducible_and_validates():
    mu = np.array([1.0, 2.0, 2.0])
    a = vmf.sample_vmf(mu, 3.0, 10, np.random.default_rng(0))
    b = vmf.sample_vmf(mu, 3.0, 10, np.random.default_rng(0))
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError):
        vmf.sample_vmf(np.zeros(3), 1.0, 2, np.random.default_rng(0))
    with pytest.raises(ValueError):
        vmf.sample_vmf(mu, -1.0, 2, np.random.default_rng(0))
    assert vmf.sample_vmf(mu, 1.0, 0, np.random.default_rng(0)).shape == (0, 3)


# ---------------------------------------------------------------------------------------------
# New-node marginal
# ---------------------------------------------------------------------------------------------


def _marginal_by_quadrature_p3(t: float, beta: float, kappa: float) -> float:
    """int_{S^2} C(beta) e^{beta theta.x} C(kappa) e^{kappa theta.mu} d theta, mu = e_z."""
    x = np.array([math.sqrt(1 - t * t), 0.0, t])

    def c3(k):
        return 1.0 / (4 * math.pi) if k == 0 else k / (4 * math.pi * math.sinh(k))

    def integrand(phi, th):
        theta = np.array([math.sin(th) * math.cos(phi), math.sin(th) * math.sin(phi), math.cos(th)])
        return math.exp(beta * theta @ x + kappa * (theta[2] - 1.0)) * math.sin(th)

    val, _ = integrate.dblquad(integrand, 0.0, math.pi, 0.0, 2 * math.pi, epsabs=0, epsrel=1e-11)
    # exp(kappa (theta_z - 1)) keeps the integrand O(1); put exp(kappa) back in log space.
    return math.log(c3(beta)) + math.log(c3(kappa)) + kappa + math.log(val)


@pytest.mark.parametrize(
    "t,beta,kappa", [(0.3, 3.0, 5.0), (-0.8, 2.0, 2.0), (0.95, 10.0, 0.5), (0.0, 0.0, 4.0)]
)
def test_new_node_marginal_p3_matches_sphere_integral(t, beta, kappa):
    ref = _marginal_by_quadrature_p3(t, beta, kappa)
    assert vmf.log_new_node_marginal(t, 3, beta, kappa) == pytest.approx(ref, abs=1e-8)
    assert vmf.log_new_node_marginal_nb(t, 3.0, beta, kappa) == pytest.approx(ref, abs=1e-8)


def test_new_node_marginal_limits_broadcasting_and_numba_twin():
    rng = np.random.default_rng(2)
    for p in (3, 2636, 100000):
        log_c0 = vmf.log_normalizer(p, 0.0)
        t = rng.uniform(-1, 1, size=(6, 4))
        beta = 10.0 ** rng.uniform(0, 5, size=4)
        # kappa = 0: the uniform density whatever x.
        np.testing.assert_allclose(vmf.log_new_node_marginal(t, p, beta, 0.0), log_c0, atol=1e-9)
        kappa = np.array([[0.0], [1.0], [100.0], [1e3], [1e4], [1e6]])
        out = vmf.log_new_node_marginal(t, p, beta, kappa)
        assert out.shape == (6, 4)
        assert np.all(np.isfinite(out))
        for i in range(6):
            for j in range(4):
                nb = vmf.log_new_node_marginal_nb(t[i, j], float(p), beta[j], kappa[i, 0])
                assert nb == pytest.approx(out[i, j], rel=1e-12, abs=1e-9)
        # Increasing in t: documents aligned with the prior mean are more probable.
        tt = np.linspace(-1, 1, 50)
        assert np.all(np.diff(vmf.log_new_node_marginal(tt, p, 500.0, 300.0)) > 0)
        # Antipodal with beta = kappa: rho = 0 exactly, no cancellation NaN.
        val = vmf.log_new_node_marginal(-1.0, p, 50.0, 50.0)
        assert val == pytest.approx(2 * vmf.log_normalizer(p, 50.0) - log_c0, abs=1e-9)
    assert isinstance(vmf.log_new_node_marginal(0.1, 3, 1.0, 2.0), float)


def test_log_normalizer_derivative_is_minus_mean_resultant_length():
    # d log C_p / d kappa = -A_p(kappa): ties the two code paths together in high dimension.
    for p in (2, 3, 100, 2636, 100000):
        for kappa in (0.5, 50.0, 5e3, 5e4):
            h = 1e-3 * kappa
            fd = (vmf.log_normalizer(p, kappa + h) - vmf.log_normalizer(p, kappa - h)) / (2 * h)
            # Rounding of log C_p (a few ulp of its magnitude) divided by the step.
            rounding = 8 * np.finfo(float).eps * max(1.0, abs(vmf.log_normalizer(p, kappa))) / h
            a = vmf.mean_resultant_length(p, kappa)
            assert abs(fd + a) < 1e-6 * a + rounding, (p, kappa, fd, a)


def test_numba_kernels_are_callable_from_other_kernels():
    from numba import njit

    @njit
    def total(ts, p, beta, kappa):
        acc = 0.0
        for t in ts:
            acc += vmf.log_new_node_marginal_nb(t, p, beta, kappa)
        return acc + vmf.log_normalizer_nb(p, kappa) + vmf.mean_resultant_length_nb(p, kappa)

    ts = np.linspace(-1.0, 1.0, 7)
    p, beta, kappa = 2636.0, 300.0, 40.0
    expect = (
        vmf.log_new_node_marginal(ts, 2636, beta, kappa).sum()
        + vmf.log_normalizer(2636, kappa)
        + vmf.mean_resultant_length(2636, kappa)
    )
    assert total(ts, p, beta, kappa) == pytest.approx(expect, rel=1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_block_log_likelihood_reads_csr_rows_in_place_with_the_same_values(dtype):
    """The split proposals' row scores from CSR rows in place equal those of the sliced rows
    bit for bit (the seeded chains must not change), for any stored dtype and row order."""
    import scipy.sparse as sp

    from streamtree.likelihoods.base import RowBlock
    from streamtree.variants import resolve_variant

    rng = np.random.default_rng(3)
    p = 300
    X = sp.random(80, p, density=0.05, format="csr", random_state=4, dtype=dtype)
    lik = vmf.VonMisesFisher(resolve_variant("dtssbp", window=2, max_depth=3, gamma=0.5, xi=0.001), p,
                             kappa0=10.0, kappa1=1.0, a=0.0, min_node_docs=2, concentration_bounds=(1e-3, 1e6))
    theta = rng.standard_normal(p)
    theta /= np.linalg.norm(theta)
    rows = np.array([7, 3, 3, 70, 0, 41], dtype=np.int64)
    want = lik.row_log_likelihood(X[rows], theta, 123.4)
    got = lik.block_log_likelihood(RowBlock(X, rows), theta, 123.4)
    assert np.array_equal(got, want)
    assert np.array_equal(lik.block_log_likelihood(RowBlock(X.toarray(), rows), theta, 123.4),
                          lik.row_log_likelihood(X.toarray()[rows], theta, 123.4))
