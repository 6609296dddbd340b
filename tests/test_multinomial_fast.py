"""The fast multinomial paths compute what the reference paths compute.

* The node MAP's joint Newton (with warm starts and frozen terms) against the safeguarded
  multiplier search and against the KKT conditions evaluated with SciPy's digamma.
* The dense set marginal of the split-merge moves against the sparse route, bit for bit.
* ``Multinomial.update_theta`` with its incremental node updates against re-solving every node
  from the solver's own start.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import digamma

from streamtree.likelihoods import multinomial_math as mm
from streamtree.likelihoods.multinomial import Multinomial
from streamtree.tree import TreeArrays
from streamtree.variants import resolve_variant


def node_problem(rng, V, J, n_tokens=400):
    """Inputs shaped like a text node's: sparse counts, small Dirichlet parameters, children
    that are near the node."""
    c = np.zeros(V)
    np.add.at(c, rng.integers(0, V // 3, n_tokens), 1.0)
    base = rng.dirichlet(np.full(V, 0.3))
    alpha = 300.0 * base + 0.01
    s = rng.uniform(50.0, 1000.0, J)
    L = np.log(np.array([rng.dirichlet(200.0 * base + 0.05) for _ in range(J)]) + 1e-300)
    L = np.maximum(L, -700.0)
    O = rng.gamma(0.3, 0.05, size=(J, V)) + 0.01
    return c, alpha, L, s, O


def kkt_spread(phi, c, alpha, L, s, O):
    """max_w |h_w(phi_w) - mean| / |mean| with h_w(t) = b_w / t + g_w'(t) (SciPy's digamma):
    every term has the same h at the optimum (softmax basis, all b_w > 0)."""
    b = c + alpha
    h = b / phi + (s[:, None] * (L - digamma(s[:, None] * phi + O))).sum(axis=0)
    lam = np.sum(phi * h)
    return float(np.max(np.abs(h - lam)) / abs(lam))


def reference_map(monkeypatch, *args):
    """The safeguarded multiplier search alone (no joint Newton steps), from the default start."""
    with monkeypatch.context() as m:
        m.setattr(mm, "_JOINT_MAX_ITER", 0)
        return mm.map_phi_with_children(*args)


@pytest.mark.parametrize("seed", range(3))
def test_joint_newton_matches_safeguarded_search_and_kkt(monkeypatch, seed):
    rng = np.random.default_rng(seed)
    V, J = 3000, 1 + seed
    c, alpha, L, s, O = node_problem(rng, V, J)
    ref = reference_map(monkeypatch, c, alpha, L, s, O)
    assert kkt_spread(ref, c, alpha, L, s, O) < 1e-9
    cold = mm.map_phi_with_children(c, alpha, L, s, O)
    np.testing.assert_allclose(cold, ref, rtol=1e-10, atol=0)
    # Warm starts near the optimum (as between sweeps) and far from it give the same optimum.
    for scale in (1e-4, 1e-2, 0.3):
        start = ref * np.exp(scale * rng.normal(size=V))
        warm = mm.map_phi_with_children(c, alpha, L, s, O, phi_init=start / start.sum())
        np.testing.assert_allclose(warm, ref, rtol=1e-10, atol=0)
        assert kkt_spread(warm, c, alpha, L, s, O) < 1e-9
    # A start where the joint steps cannot work (almost all mass on one term) falls back.
    bad = np.full(V, 1e-12)
    bad[0] = 1.0
    np.testing.assert_allclose(mm.map_phi_with_children(c, alpha, L, s, O, phi_init=bad), ref,
                               rtol=1e-10, atol=0)


@pytest.mark.parametrize("seed", range(3))
def test_start_far_below_the_optimum_restarts_the_joint_steps(monkeypatch, seed):
    """A warm start with terms decades below their optimum (a child gained words its parent had
    all but lost) stops the joint steps at their first step; one coordinate solve and the joint
    steps from there reach the safeguarded search's optimum."""
    rng = np.random.default_rng(seed)
    V, J = 2000, 1 + seed
    c, alpha, L, s, O = node_problem(rng, V, J)
    ref = reference_map(monkeypatch, c, alpha, L, s, O)
    start = ref.copy()
    start[rng.choice(V, V // 4, replace=False)] *= 1e-15
    start /= start.sum()
    b = c + alpha
    first = start.copy()
    assert not mm._joint_newton_nb(b, s, O, L, first, mm._JOINT_MAX_ITER, mm._JOINT_TOL, mm._JOINT_FREEZE)
    # the search from where the joint steps stopped, as map_phi_with_children takes it
    searched = np.empty(V)
    n_solves = mm._multiplier_search_nb(b, s, O, L, np.ones(V, dtype=bool), V, first / first.sum(), True,
                                        mm._JOINT_MAX_ITER, mm._JOINT_TOL, mm._JOINT_FREEZE,
                                        mm._COORDINATE_MAX_ITER, searched)
    assert n_solves == 1  # the restart converged: no multiplier search
    phi = mm.map_phi_with_children(c, alpha, L, s, O, phi_init=start)
    assert np.array_equal(phi, searched)
    np.testing.assert_allclose(phi, ref, rtol=1e-10, atol=0)
    assert kkt_spread(phi, c, alpha, L, s, O) < 1e-9


def test_joint_newton_small_vocabulary_objective(monkeypatch):
    """On a tiny vocabulary the optimum is also a maximum of the objective along every feasible
    direction, and the search agrees with it."""
    rng = np.random.default_rng(11)
    V = 6
    c = rng.poisson(1.5, V).astype(float)
    alpha = rng.gamma(0.5, 1.0, V) + 1e-3
    L = np.log(rng.dirichlet(np.full(V, 0.8), size=2))
    s = rng.uniform(0.5, 40.0, 2)
    O = rng.gamma(0.5, 0.5, size=(2, V)) + 1e-3
    phi = mm.map_phi_with_children(c, alpha, L, s, O, phi_init=np.full(V, 1.0 / V))
    np.testing.assert_allclose(phi, reference_map(monkeypatch, c, alpha, L, s, O), rtol=1e-10)
    assert kkt_spread(phi, c, alpha, L, s, O) < 1e-12
    best = mm.node_log_objective(phi, c, alpha, L, s, O)
    for _ in range(20):
        d = rng.normal(size=V) * phi
        d -= d.sum() * phi
        for step in (1e-4, -1e-4):
            assert mm.node_log_objective(phi + step * d, c, alpha, L, s, O) < best


def test_phi_init_is_checked():
    c, alpha, L, s, O = node_problem(np.random.default_rng(0), 50, 1, n_tokens=20)
    with pytest.raises(ValueError, match="phi_init"):
        mm.map_phi_with_children(c, alpha, L, s, O, phi_init=np.ones(49) / 49)
    with pytest.raises(ValueError, match="phi_init"):
        mm.map_phi_with_children(c, alpha, L, s, O, phi_init=np.full(50, np.nan))


def test_digamma_trigamma_pair_matches_scipy():
    from scipy.special import polygamma

    for x in np.concatenate([np.logspace(-8, 3, 400), np.linspace(0.01, 12.0, 400)]):
        d, t = mm._digamma_trigamma_nb(x)
        assert d == pytest.approx(digamma(x), rel=1e-13, abs=1e-13)
        assert t == pytest.approx(polygamma(1, x), rel=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_dense_set_marginal_is_the_sparse_one_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    V = 500
    c = rng.poisson(0.2, V).astype(float)
    c[rng.integers(0, V)] = 37.0  # a long product and a Stirling-free large count
    alpha = 1e3 * rng.dirichlet(np.full(V, 0.2)) + 0.01
    dense = mm.log_dm_marginal_set(c, c.sum(), alpha, log_coef_sum=1.25)
    sparse = mm.log_dm_marginal_set(sp.csr_matrix(c), [c.sum()], alpha, log_coef_sum=[1.25])
    assert isinstance(dense, float)
    assert dense == sparse[0]


def test_dense_set_marginal_rejects_bad_counts():
    alpha = np.full(4, 0.5)
    for bad in ([1.0, -1.0, 0.0, 2.0], [1.0, np.nan, 0.0, 0.0], [np.inf, 0.0, 0.0, 0.0]):
        with pytest.raises(ValueError, match="non-negative"):
            mm.log_dm_marginal_set(np.array(bad), 2.0, alpha)
    with pytest.raises(ValueError, match="n_tokens"):
        mm.log_dm_marginal_set(np.array([1.0, 2.0, 0.0, 0.0]), 4.0, alpha)
    with pytest.raises(ValueError, match="terms"):
        mm.log_dm_marginal_set(np.array([1.0, 2.0, 0.0]), 3.0, alpha)


def test_incremental_update_theta_matches_re_solving_every_node(monkeypatch):
    """A depth-3 tree of 7 nodes with data and previous-epoch links: the update from current
    parameters, skipping nodes whose inputs did not change, gives the parameters that
    re-solving every node from the solver's start gives (both with a standalone solve's
    tolerances); with the fit's looser node tolerances it stays within 1e-6 of them. With a
    budget of one joint Newton step per node and pass it gets as close to the converged
    parameters per pass as full solves do (the passes' alternation, not the solves, limits the
    convergence) and within 1e-6 of them in 20 passes."""
    from streamtree.likelihoods import multinomial as multinomial_module

    rng = np.random.default_rng(5)
    V = 800
    config = resolve_variant("dtssbp", window=2, max_depth=3, gamma=0.5, xi=0.001)
    lik = Multinomial(config, V, kappa0=500.0, kappa1=1.0, a=0.0, min_node_docs=2)
    parent_index = np.array([-1, 0, 1, 1, 0, 4, 4])
    depth = np.array([0, 1, 2, 2, 1, 2, 2])
    arrays = TreeArrays(np.arange(7, dtype=np.int64), parent_index, depth, np.zeros(7, dtype=np.int64))
    anchor = rng.dirichlet(np.full(V, 0.5))
    theta = np.array([rng.dirichlet(400.0 * anchor + 0.05) for _ in range(7)])
    sums = np.zeros((7, V))
    for k in range(7):
        np.add.at(sums[k], rng.choice(V, 300, p=theta[k]), 1.0)
    counts = np.full(7, 10.0)
    prev = np.array([rng.dirichlet(800.0 * t + 0.05) for t in theta])
    has_prev = np.array([True, True, False, True, True, False, True])
    update = np.ones(7, dtype=bool)
    # start from perturbed parameters, as after a sweep moved documents
    start = theta * np.exp(0.05 * rng.normal(size=theta.shape))
    start /= start.sum(axis=1, keepdims=True)
    args = (arrays, start, sums, counts, np.ones(7), prev, has_prev, anchor, update)
    with monkeypatch.context() as m:
        m.setattr(Multinomial, "incremental_map", False)
        converged = lik.update_theta(*args, 200)

    def error(x):
        return float(np.max(np.abs(x / converged - 1.0)))

    for n_iter in (1, 3, 20):
        shipped = lik.update_theta(*args, n_iter)
        with monkeypatch.context() as m:
            m.setattr(multinomial_module, "_BLOCK_MAX_ITER", 1)
            one_step = lik.update_theta(*args, n_iter)
            m.setattr(multinomial_module, "_BLOCK_MAX_ITER", mm._JOINT_MAX_ITER)
            m.setattr(multinomial_module, "_BLOCK_TOL", mm._JOINT_TOL)
            m.setattr(multinomial_module, "_BLOCK_FREEZE", mm._JOINT_FREEZE)
            fast = lik.update_theta(*args, n_iter)
            m.setattr(Multinomial, "incremental_map", False)
            ref = lik.update_theta(*args, n_iter)
        np.testing.assert_allclose(fast, ref, rtol=1e-9, atol=0)
        np.testing.assert_allclose(shipped, ref, rtol=1e-6, atol=0)
        assert error(one_step) <= 1.5 * error(ref) + 1e-6
    np.testing.assert_allclose(one_step, converged, rtol=1e-6, atol=0)
    assert error(start) > 1.0 and not np.allclose(fast, start, rtol=1e-3)  # the update did something
