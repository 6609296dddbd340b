"""Slice sampling of alpha0, lam, gamma against their exact posteriors (quadrature) on tiny trees,
and the priors that keep those posteriors proper on degenerate trees."""

import math

import numpy as np
import pytest
from scipy import integrate, stats

from streamtree.inference.hyper import (PRIOR_SHAPE, HyperPrior, hyper_priors, log_hyper_likelihood,
                                        sample_hyperparameters, slice_step)
from streamtree.tree import TSSBTree

PRIORS = hyper_priors(alpha0=1.0, gamma=0.5)


def _tiny():
    t = TSSBTree(3)
    a = t.add_child(0)
    t.add_child(0)
    t.add_child(a)
    arr = t.arrays()
    counts = np.array([3.0, 5.0, 2.0, 4.0])[: arr.size]
    return arr, counts


def _root_only(n_docs=200.0):
    return TSSBTree(3).arrays(), np.array([n_docs])


def _chain():
    """Single children down to the cap, documents at the leaf only: flat in alpha0 at infinity
    and in gamma at 0."""
    t = TSSBTree(3)
    a = t.add_child(0)
    b = t.add_child(a)
    t.add_child(b)
    return t.arrays(), np.array([0.0, 0.0, 0.0, 40.0])


def _exact_moments(arr, counts, fixed, name, priors):
    """Mean and sd of the sampling coordinate under the exact conditional, by quadrature."""
    prior = priors[name]
    lo, hi = prior.support()
    ref = max((prior.log_density(x) + log_hyper_likelihood(arr, counts, **{**fixed, name: prior.value(x)},
                                                           max_depth=3, root_holds_data=True))
              for x in np.linspace(lo, hi, 2001))

    def dens(x):
        return np.exp(prior.log_density(x) + log_hyper_likelihood(arr, counts, **{**fixed, name: prior.value(x)},
                                                                  max_depth=3, root_holds_data=True) - ref)

    z = integrate.quad(dens, lo, hi, limit=400)[0]
    mean = integrate.quad(lambda u: u * dens(u), lo, hi, limit=400)[0] / z
    sq = integrate.quad(lambda u: u * u * dens(u), lo, hi, limit=400)[0] / z
    return mean, np.sqrt(sq - mean ** 2)


@pytest.mark.parametrize("tree,name", [(_tiny, "alpha0"), (_tiny, "lam"), (_tiny, "gamma"), (_root_only, "alpha0"),
                                       (_chain, "alpha0"), (_chain, "gamma")])
def test_slice_sampler_matches_the_exact_conditional(name, tree):
    arr, counts = tree()
    fixed = dict(alpha0=2.0, lam=0.6, gamma=0.8)
    exact_mean, sd = _exact_moments(arr, counts, fixed, name, PRIORS)
    rng = np.random.default_rng(0)
    hyper = dict(fixed)
    draws = []
    for _ in range(6000):
        hyper = sample_hyperparameters(arr, counts, hyper, priors=PRIORS, max_depth=3, root_holds_data=True,
                                       rng=rng, names=(name,))
        draws.append(PRIORS[name].coordinate(hyper[name]))
    draws = np.asarray(draws)
    # the mean within 4 Monte Carlo standard errors (draws are nearly independent: slice on the
    # whole support), and the spread within 10%
    assert abs(draws.mean() - exact_mean) < 4 * sd / np.sqrt(len(draws) / 3)
    assert draws.std() == pytest.approx(sd, rel=0.1)


def test_gamma_prior_is_the_gamma_density_on_the_log_scale():
    prior = HyperPrior.gamma(0.5)
    assert prior.shape == PRIOR_SHAPE and prior.shape / prior.rate == pytest.approx(0.5)
    us = np.linspace(-6.0, 3.0, 7)
    # density of u = log h is the Gamma density of h times the Jacobian h
    want = stats.gamma(PRIOR_SHAPE, scale=0.5 / PRIOR_SHAPE).logpdf(np.exp(us)) + us
    got = np.array([prior.log_density(u) for u in us])
    assert np.allclose(got - got[0], want - want[0])
    # the cut of the support holds a negligible share of the prior
    assert stats.gamma(PRIOR_SHAPE, scale=0.5 / PRIOR_SHAPE).cdf(prior.low) < 1e-7
    assert stats.gamma(PRIOR_SHAPE, scale=0.5 / PRIOR_SHAPE).sf(prior.high) < 1e-7


@pytest.mark.parametrize("tree,name,end", [(_root_only, "alpha0", "low"), (_chain, "alpha0", "high"),
                                           (_chain, "gamma", "low")])
def test_degenerate_trees_have_a_proper_posterior(tree, name, end):
    """The failure of small epochs: the collapsed likelihood of a root-only tree is flat in alpha0
    near 0 (of a chain, in gamma near 0 and in alpha0 near infinity), so under a scale-free prior
    the posterior was improper and its value set by the support's cut-off. Under the Gamma
    priors it does not depend on the cut-off and stays on the prior's scale."""
    arr, counts = tree()
    fixed = dict(alpha0=1.0, lam=0.5, gamma=0.5)
    mean = {"alpha0": 1.0, "gamma": 0.5}[name]
    # the likelihood really is flat at that end (ratio over four decades within 2%)
    far, farther = (1e-6, 1e-10) if end == "low" else (1e6, 1e10)
    ll = [log_hyper_likelihood(arr, counts, **{**fixed, name: v * mean}, max_depth=3, root_holds_data=True)
          for v in (far, farther)]
    assert abs(ll[0] - ll[1]) < 0.02
    # a scale-free prior: the posterior mean of log h moves with the cut-off (by about half the
    # extension, the likelihood being flat there) ...
    def scale_free(low, high):
        return _exact_moments(arr, counts, fixed, name, {name: _LogUniform(math.log(low), math.log(high))})[0]

    wide = (1e-6, 1e6)
    narrow = (1e-2, 1e2)
    assert abs(scale_free(*wide) - scale_free(*narrow)) > 2.0
    # ... the Gamma prior's does not, and it stays within a decade of the prior's mean
    gamma_wide = _exact_moments(arr, counts, fixed, name,
                                {name: HyperPrior(mean * 1e-8, mean * 1e8, True, PRIOR_SHAPE, PRIOR_SHAPE / mean)})[0]
    gamma_default = _exact_moments(arr, counts, fixed, name, PRIORS)[0]
    assert gamma_wide == pytest.approx(gamma_default, abs=1e-3)
    assert abs(gamma_default - math.log(mean)) < math.log(10.0)


class _LogUniform(HyperPrior):
    """A log-uniform prior on [exp(lo), exp(hi)] (the former default), for comparison only."""

    def __init__(self, lo: float, hi: float) -> None:
        object.__setattr__(self, "low", math.exp(lo))
        object.__setattr__(self, "high", math.exp(hi))
        object.__setattr__(self, "log_scale", True)
        object.__setattr__(self, "shape", 0.0)
        object.__setattr__(self, "rate", 0.0)

    def log_density(self, x: float) -> float:
        return 0.0


def test_priors_reject_bad_values():
    with pytest.raises(ValueError, match="mean"):
        HyperPrior.gamma(0.0)
    with pytest.raises(ValueError, match="support"):
        HyperPrior(1.0, 0.5, False)
    with pytest.raises(ValueError, match="shape"):
        HyperPrior(0.1, 10.0, True)


def test_slice_step_keeps_a_known_density():
    rng = np.random.default_rng(1)
    x, xs = 0.5, []
    for _ in range(20000):
        x = slice_step(x, lambda u: 2.0 * np.log(u), 0.0, 1.0, rng)  # Beta(3, 1)
        xs.append(x)
    assert np.mean(xs) == pytest.approx(0.75, abs=0.01)
