"""The vMF concentration update under its Gamma prior, against brute-force maximisation."""

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from streamtree.likelihoods.vmf import (VonMisesFisher, concentration_posterior_mode, concentration_prior,
                                        log_concentration_posterior, mean_resultant_length, sample_vmf)
from streamtree.variants import resolve_variant


@pytest.mark.parametrize("p,n,t_frac", [(3, 2, 0.99), (50, 5, 0.5), (500, 40, 0.3), (2000, 3, 0.999)])
def test_posterior_mode_matches_brute_force(p, n, t_frac):
    shape, rate = concentration_prior(p, 80.0)
    t = t_frac * n
    mode = concentration_posterior_mode(np.array([n]), np.array([t]), p, shape, rate, 1e-3, 1e6)[0]
    res = minimize_scalar(lambda lb: -log_concentration_posterior(np.exp(lb), n, t, p, shape, rate),
                          bounds=(np.log(1e-3), np.log(1e6)), method="bounded", options={"xatol": 1e-10})
    assert mode == pytest.approx(np.exp(res.x), rel=1e-5)
    # and it is a maximum of the exact log posterior
    for f in (0.99, 1.01):
        assert log_concentration_posterior(mode, n, t, p, shape, rate) >= log_concentration_posterior(
            mode * f, n, t, p, shape, rate)


def test_prior_has_the_stated_mode_and_weight():
    p, beta_bar = 100, 40.0
    shape, rate = concentration_prior(p, beta_bar, n_docs=10.0)
    assert (shape - 1.0) / rate == pytest.approx(beta_bar)
    a = mean_resultant_length(p, beta_bar)
    fisher = 10.0 * (1.0 - a * a - (p - 1.0) * a / beta_bar)
    assert (shape - 1.0) / beta_bar ** 2 == pytest.approx(fisher)


def test_a_node_with_two_identical_documents_stays_off_the_cap():
    """The issue's failure: a node with 1-2 documents of its own sat at the upper bound."""
    rng = np.random.default_rng(0)
    p = 200
    variant = resolve_variant("dtssbp", window=2, max_depth=3, gamma=0.5, xi=0.001)
    lik = VonMisesFisher(variant, p, kappa0=1e4, kappa1=1.0, a=0.0, min_node_docs=2,
                         concentration_bounds=(1e-3, 1e6))
    mus = sample_vmf(np.eye(p)[0], 5.0, 4, rng)
    big = [sample_vmf(mu, 300.0, 200, rng) for mu in mus[:3]]
    x = sample_vmf(mus[3], 300.0, 1, rng)[0]
    small = np.stack([x, x])  # two identical documents
    groups = big + [small]
    sums = np.stack([g.sum(axis=0) for g in groups])
    theta = sums / np.linalg.norm(sums, axis=1, keepdims=True)
    counts = np.array([g.shape[0] for g in groups], dtype=float)
    beta = lik.update_concentration(counts, sums, np.zeros(4), theta, np.full(4, 1.0))
    assert beta[3] < 1e4  # far from the 1e6 cap
    assert beta[:3] == pytest.approx(300.0, rel=0.25)  # big nodes follow their own data


def test_small_nodes_are_not_read_as_tight():
    """Fitted to its own few documents, a node's direction matches them far better than the true
    one does (in p = 2,000 two documents at concentration 300 have cosine 0.02 with each other but
    0.7 with their mean): the update must not read that as a high concentration, which made
    new small nodes ever more attractive. Nodes of 2-4 documents recover the true value."""
    rng = np.random.default_rng(1)
    p, beta_true = 2000, 300.0
    variant = resolve_variant("dtssbp", window=2, max_depth=3, gamma=0.5, xi=0.001)
    lik = VonMisesFisher(variant, p, kappa0=1e3, kappa1=1.0, a=0.0, min_node_docs=2,
                         concentration_bounds=(1e-3, 1e6))
    mus = sample_vmf(np.eye(p)[0], 1.0, 300, rng)
    groups = [sample_vmf(mu, beta_true, int(rng.integers(2, 5)), rng) for mu in mus]
    sums = np.stack([g.sum(axis=0) for g in groups])
    theta = sums / np.linalg.norm(sums, axis=1, keepdims=True)
    counts = np.array([g.shape[0] for g in groups], dtype=float)
    beta = lik.update_concentration(counts, sums, np.zeros(len(groups)), theta, np.full(len(groups), 1.0))
    assert np.median(beta) == pytest.approx(beta_true, rel=0.15)
    assert np.all(beta < 2.0 * beta_true)
