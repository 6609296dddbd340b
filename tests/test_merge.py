"""Pieces of the merge move: group marginals, collapsed stick prior, tree surgery."""

import numpy as np
import pytest
from scipy import integrate
from scipy.special import betaln

from streamtree.inference.merge import collapsed_log_prior
from streamtree.likelihoods.gaussian import group_log_likelihood as gaussian_group_log_likelihood
from streamtree.likelihoods.gaussian import group_log_marginal as gaussian_group_log_marginal
from streamtree.likelihoods.vmf import group_log_marginal as vmf_group_log_marginal
from streamtree.inference.sticks import sample_sticks, stick_params, log_masses
from streamtree.likelihoods.vmf import log_normalizer
from streamtree.tree import TSSBTree
from streamtree.window import WindowedCounts


def test_gaussian_group_marginal_matches_quadrature_1d():
    x = np.array([0.3, -0.2, 1.1])
    mu, v, s2 = 0.5, 2.0, 0.7

    def integrand(theta):
        lik = np.prod(np.exp(-(x - theta) ** 2 / (2 * s2)) / np.sqrt(2 * np.pi * s2))
        return lik * np.exp(-(theta - mu) ** 2 / (2 * v)) / np.sqrt(2 * np.pi * v)

    val, _ = integrate.quad(integrand, -30, 30, epsabs=1e-14)
    ours = gaussian_group_log_marginal(3, np.array([x.sum()]), float(x @ x), np.array([mu]), v, s2)
    assert ours == pytest.approx(np.log(val), abs=1e-9)
    ll = gaussian_group_log_likelihood(3, np.array([x.sum()]), float(x @ x), np.array([0.1]), s2)
    direct = np.sum(-0.5 * np.log(2 * np.pi * s2) - (x - 0.1) ** 2 / (2 * s2))
    assert ll == pytest.approx(direct, abs=1e-12)


def test_vmf_group_marginal_matches_quadrature_on_the_circle():
    p = 2
    rng = np.random.default_rng(0)
    ang = rng.uniform(0, 2 * np.pi, size=3)
    X = np.column_stack([np.cos(ang), np.sin(ang)])
    mu = np.array([1.0, 0.0])
    kappa, beta = 1.5, 2.0

    def integrand(phi):
        th = np.array([np.cos(phi), np.sin(phi)])
        return np.exp(3 * log_normalizer(p, beta) + beta * (X @ th).sum() + log_normalizer(p, kappa) + kappa * th @ mu)

    val, _ = integrate.quad(integrand, 0, 2 * np.pi, epsabs=1e-14)
    assert vmf_group_log_marginal(3, X.sum(axis=0), mu, kappa, beta, p) == pytest.approx(np.log(val), abs=1e-9)


def _enumerate_prior_by_sampling(tree, now, n_draws, rng, **kw):
    """Monte Carlo E_sticks[prod_n pi_{z_n}] for an ordered assignment with counts ``now``."""
    arrays = tree.arrays()
    params = stick_params(arrays, np.zeros(arrays.size), **kw)
    vals = []
    for _ in range(n_draws):
        log_pi, _ = log_masses(arrays, sample_sticks(params, rng))
        vals.append(np.sum(now * log_pi))
    vals = np.array(vals)
    m = vals.max()
    return m + np.log(np.mean(np.exp(vals - m)))


@pytest.mark.slow
def test_collapsed_prior_equals_expected_product_of_masses():
    tree = TSSBTree(2)
    a = tree.add_child(0)
    tree.add_child(0)
    tree.add_child(a)
    arrays = tree.arrays()
    now = np.array([2.0, 1.0, 1.0, 1.0])
    kw = dict(alpha0=1.0, lam=0.5, gamma=0.5, max_depth=2, root_holds_data=True)
    exact = collapsed_log_prior(arrays, np.zeros(4), now, **kw)
    mc = _enumerate_prior_by_sampling(tree, now, 200_000, np.random.default_rng(0), **kw)
    assert exact == pytest.approx(mc, abs=0.03)
    # a single node tree: the root's stick Beta(1, alpha0) with 3 documents
    single = TSSBTree(0)
    v = collapsed_log_prior(single.arrays(), np.zeros(1), np.array([3.0]), **{**kw, "max_depth": 0})
    assert v == 0.0  # nu = 1 at the cap: every document is at the root with probability one
    root_only = TSSBTree(3)
    v = collapsed_log_prior(root_only.arrays(), np.zeros(1), np.array([3.0]), **kw)
    assert v == pytest.approx(betaln(4.0, 1.0) - betaln(1.0, 1.0))


def test_merge_into_parent_keeps_order_and_depths():
    tree = TSSBTree(4)
    a = tree.add_child(0)
    b = tree.add_child(0)
    a1 = tree.add_child(a)
    a2 = tree.add_child(a)
    a11 = tree.add_child(a1)
    assert tree.merge_into_parent(a) == 0
    assert tree.children[0] == [a1, a2, b]
    assert tree.depth[a1] == 1 and tree.depth[a11] == 2 and tree.parent[a2] == 0
    assert a not in tree


def test_window_merge_moves_past_counts():
    w = WindowedCounts(2)
    w.commit({1: 3, 2: 4})
    w.commit({1: 1})
    w.merge(1, 2)
    assert w.total == {2: 8}
    assert [dict(s) for s in w.history] == [{2: 7}, {2: 1}]
