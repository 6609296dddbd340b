"""Slice sampling of alpha0, lam, gamma against their exact posteriors (quadrature) on tiny trees."""

import numpy as np
import pytest
from scipy import integrate

from streamtree.inference.hyper import HYPER_PRIORS, log_hyper_likelihood, sample_hyperparameters, slice_step
from streamtree.tree import TSSBTree


def _tiny():
    t = TSSBTree(3)
    a = t.add_child(0)
    t.add_child(0)
    t.add_child(a)
    arr = t.arrays()
    counts = np.array([3.0, 5.0, 2.0, 4.0])[: arr.size]
    return arr, counts


@pytest.mark.parametrize("name", ["alpha0", "lam", "gamma"])
def test_slice_sampler_matches_the_exact_conditional(name):
    arr, counts = _tiny()
    fixed = dict(alpha0=2.0, lam=0.6, gamma=0.8)
    low, high, log_scale = HYPER_PRIORS[name]

    def dens(u):  # density on the sampling scale (log value for log-scale parameters)
        v = np.exp(u) if log_scale else u
        return np.exp(log_hyper_likelihood(arr, counts, **{**fixed, name: v}, max_depth=3, root_holds_data=True))

    lo, hi = (np.log(low), np.log(high)) if log_scale else (low, high)
    z = integrate.quad(dens, lo, hi, limit=200)[0]
    exact_mean = integrate.quad(lambda u: u * dens(u), lo, hi, limit=200)[0] / z
    exact_sq = integrate.quad(lambda u: u * u * dens(u), lo, hi, limit=200)[0] / z
    sd = np.sqrt(exact_sq - exact_mean ** 2)
    rng = np.random.default_rng(0)
    hyper = dict(fixed)
    draws = []
    for _ in range(6000):
        hyper = sample_hyperparameters(arr, counts, hyper, max_depth=3, root_holds_data=True, rng=rng, names=(name,))
        draws.append(np.log(hyper[name]) if log_scale else hyper[name])
    draws = np.asarray(draws)
    # the mean within 4 Monte Carlo standard errors (draws are nearly independent: slice on the
    # whole support), and the spread within 10%
    assert abs(draws.mean() - exact_mean) < 4 * sd / np.sqrt(len(draws) / 3)
    assert draws.std() == pytest.approx(sd, rel=0.1)


def test_slice_step_keeps_a_known_density():
    rng = np.random.default_rng(1)
    x, xs = 0.5, []
    for _ in range(20000):
        x = slice_step(x, lambda u: 2.0 * np.log(u), 0.0, 1.0, rng)  # Beta(3, 1)
        xs.append(x)
    assert np.mean(xs) == pytest.approx(0.75, abs=0.01)


@pytest.mark.parametrize("max_depth, root_holds_data", [(3, True), (3, False), (None, True), (2, True)])
def test_hyper_target_is_the_collapsed_prior(max_depth, root_holds_data):
    """The slice sampler's target, as its nu and psi factors, is the collapsed stick prior."""
    from streamtree.inference.hyper import HyperTarget

    rng = np.random.default_rng(3)
    t = TSSBTree(max_depth)
    ids = [0]
    for _ in range(12):
        ids.append(t.add_child(int(rng.choice([i for i in ids if not t.at_cap(i)]))))
    arr = t.arrays()
    counts = rng.integers(0, 6, arr.size).astype(float)
    target = HyperTarget(arr, counts, max_depth=max_depth, root_holds_data=root_holds_data)
    for alpha0, lam, gamma in [(2.0, 0.6, 0.8), (0.05, 0.01, 40.0), (90.0, 1.0, 0.02)]:
        exact = log_hyper_likelihood(arr, counts, alpha0=alpha0, lam=lam, gamma=gamma, max_depth=max_depth,
                                     root_holds_data=root_holds_data)
        assert target.log_nu(alpha0, lam) + target.log_psi(gamma) == pytest.approx(exact, rel=1e-12, abs=1e-12)
