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


def test_a_sweep_of_all_three_keeps_the_joint_posterior():
    """A sweep updates alpha0, then lam, then gamma; lam's conditional must read the alpha0 just
    drawn (and alpha0's the current lam). Each conditional alone is checked above; here the
    chain of whole sweeps is checked against the exact joint posterior of (log alpha0, lam),
    found by 2-D quadrature (gamma enters a separate factor), through both means and their
    correlation, which a conditional reading a stale value of the other parameter shifts."""
    t = TSSBTree(3)
    a = t.add_child(0)
    t.add_child(0)
    c = t.add_child(a)
    t.add_child(c)
    arr = t.arrays()
    counts = np.array([2.0, 12.0, 0.0, 10.0, 1.0])[: arr.size]
    kw = dict(max_depth=3, root_holds_data=True)
    U = np.linspace(np.log(HYPER_PRIORS["alpha0"][0]), np.log(HYPER_PRIORS["alpha0"][1]), 400)
    L = np.linspace(HYPER_PRIORS["lam"][0], HYPER_PRIORS["lam"][1], 400)
    lp = np.array([[log_hyper_likelihood(arr, counts, alpha0=np.exp(u), lam=lam, gamma=1.0, **kw) for lam in L]
                   for u in U])
    w = np.exp(lp - lp.max())
    w /= w.sum()
    mean_u, mean_l = (w.sum(axis=1) * U).sum(), (w.sum(axis=0) * L).sum()
    sd_u = np.sqrt((w.sum(axis=1) * (U - mean_u) ** 2).sum())
    sd_l = np.sqrt((w.sum(axis=0) * (L - mean_l) ** 2).sum())
    corr = (w * np.outer(U - mean_u, L - mean_l)).sum() / (sd_u * sd_l)
    rng = np.random.default_rng(0)
    hyper = dict(alpha0=1.0, lam=0.5, gamma=1.0)
    us, ls = [], []
    for _ in range(20000):
        hyper = sample_hyperparameters(arr, counts, hyper, rng=rng, **kw)
        us.append(np.log(hyper["alpha0"]))
        ls.append(hyper["lam"])
    us, ls = np.asarray(us[200:]), np.asarray(ls[200:])

    def z(x, m, n_batches=50):  # batch means: successive sweeps are correlated
        b = x[: len(x) // n_batches * n_batches].reshape(n_batches, -1).mean(axis=1)
        return (x.mean() - m) / (b.std(ddof=1) / np.sqrt(n_batches))

    assert abs(z(us, mean_u)) < 4.0
    assert abs(z(ls, mean_l)) < 4.0
    assert np.corrcoef(us, ls)[0, 1] == pytest.approx(corr, abs=0.05)
