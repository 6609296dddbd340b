"""Tests of the isotropic Gaussian likelihood against scipy and Monte Carlo."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import streamtree  # noqa: F401  (configures the numba cache before the kernels compile)
from streamtree.likelihoods import gaussian


def test_log_density_matches_scipy():
    rng = np.random.default_rng(0)
    p = 7
    X = rng.normal(size=(20, p)) * 3
    mean = rng.normal(size=p)
    var = 2.7
    ref = stats.multivariate_normal(mean, var * np.eye(p)).logpdf(X)
    np.testing.assert_allclose(gaussian.log_density(X, mean, var), ref, rtol=1e-12)
    one = gaussian.log_density(X[0], mean, var)
    assert one.shape == (1,) and one[0] == pytest.approx(ref[0], rel=1e-12)
    with pytest.raises(ValueError):
        gaussian.log_density(X, mean, 0.0)
    with pytest.raises(ValueError):
        gaussian.log_density(X, mean[:3], 1.0)


def test_new_node_marginal_matches_scipy_from_inner_products():
    rng = np.random.default_rng(1)
    p, n, k = 5, 9, 4
    X = rng.normal(size=(n, p))
    theta = rng.normal(size=(k, p)) * 2
    prior_var = np.array([0.5, 1.0, 2.0, 4.0])  # per candidate parent (e.g. by depth)
    noise_var = 0.3
    out = gaussian.log_new_node_marginal(
        (X * X).sum(1)[:, None],
        X @ theta.T,
        (theta * theta).sum(1)[None, :],
        p,
        prior_var,
        noise_var,
    )
    assert out.shape == (n, k)
    for j in range(k):
        cov = (prior_var[j] + noise_var) * np.eye(p)
        ref = stats.multivariate_normal(theta[j], cov).logpdf(X)
        np.testing.assert_allclose(out[:, j], ref, rtol=1e-11)
        for i in range(n):
            nb = gaussian.log_new_node_marginal_nb(
                float(X[i] @ X[i]), float(X[i] @ theta[j]), float(theta[j] @ theta[j]),
                float(p), prior_var[j], noise_var,
            )
            assert nb == pytest.approx(out[i, j], rel=1e-13)
    scalar = gaussian.log_new_node_marginal(1.0, 0.5, 2.0, 3, 1.0, 1.0)
    assert isinstance(scalar, float)
    assert scalar == pytest.approx(-0.5 * 3 * np.log(2 * np.pi * 2.0) - 0.5 * 2.0 / 2.0)
    # x equal to the mean up to rounding: 1 - 2(1 + 1e-15) + 1 < 0 is floored at 0.
    at_mean = gaussian.log_new_node_marginal(1.0, 1.0 + 1e-15, 1.0, 3, 1.0, 1.0)
    assert at_mean == -0.5 * 3 * np.log(2 * np.pi * 2.0)
    assert gaussian.log_new_node_marginal_nb(1.0, 1.0 + 1e-15, 1.0, 3.0, 1.0, 1.0) == at_mean
    with pytest.raises(ValueError):
        gaussian.log_new_node_marginal(1.0, 0.5, 2.0, 3, 0.0, 0.0)


def test_new_node_marginal_is_the_integral_over_the_node_mean():
    # N(x; m, (s2 + v) I) = int N(x; theta, v I) N(theta; m, s2 I) d theta, by Monte Carlo at p = 2.
    rng = np.random.default_rng(2)
    m, s2, v = np.array([0.5, -1.0]), 0.8, 0.4
    x = np.array([1.2, -0.3])
    thetas = m + np.sqrt(s2) * rng.normal(size=(400000, 2))
    mc = np.mean(np.exp(gaussian.log_density(thetas, x, v)))  # N(x; theta, v) = N(theta; x, v)
    exact = np.exp(gaussian.log_new_node_marginal(x @ x, x @ m, m @ m, 2, s2, v))
    assert mc == pytest.approx(exact, rel=0.01)


def test_estimate_noise_variance_exact_small_case():
    rng = np.random.default_rng(3)
    p = 4
    groups = [rng.normal(size=(n, p)) for n in (2, 5, 9)]
    sum_x = np.stack([g.sum(0) for g in groups])
    sum_sq = np.array([(g * g).sum() for g in groups])
    n = np.array([len(g) for g in groups])
    est = gaussian.estimate_noise_variance(sum_x, sum_sq, n, p)
    ref = [np.var(g, axis=0, ddof=1).mean() for g in groups]
    np.testing.assert_allclose(est, ref, rtol=1e-12)


def test_estimate_noise_variance_is_unbiased_monte_carlo():
    rng = np.random.default_rng(4)
    k, n, p, sigma2 = 20000, 3, 6, 2.5
    X = rng.normal(size=(k, n, p)) * np.sqrt(sigma2) + rng.normal(size=(k, 1, p)) * 10
    est = gaussian.estimate_noise_variance(X.sum(1), (X * X).sum((1, 2)), np.full(k, n), p)
    # Each estimate is sigma2 * chi2_{p(n-1)} / (p(n-1)): sd = sigma2 sqrt(2 / (p(n-1))).
    se = sigma2 * np.sqrt(2.0 / (p * (n - 1))) / np.sqrt(k)
    assert abs(est.mean() - sigma2) < 4 * se
    assert est.std() == pytest.approx(sigma2 * np.sqrt(2.0 / (p * (n - 1))), rel=0.05)


def test_estimate_noise_variance_fallback_and_floor():
    p = 3
    sum_x = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [2.0, 4.0, 6.0], [1.0, 1.0, 1.0]])
    sum_sq = np.array([14.0, 0.0, 28.0, 5.0])
    n = np.array([1, 0, 2, 3])
    est = gaussian.estimate_noise_variance(sum_x, sum_sq, n, p, fallback=[7.0, 8.0, 9.0, 10.0])
    assert est[0] == 7.0 and est[1] == 8.0
    assert est[2] == 1e-8  # two identical points: zero spread, floored at var_min
    assert est[3] == pytest.approx((5.0 - 3.0 / 3.0) / (3 * 2))
    est_nan = gaussian.estimate_noise_variance(sum_x, sum_sq, n, p, min_count=3)
    assert np.isnan(est_nan[:3]).all() and np.isfinite(est_nan[3])
    with pytest.raises(ValueError):
        gaussian.estimate_noise_variance(sum_x[:, :2], sum_sq, n, p)
