"""Stick-breaking masses, the stick sampler and windowed counts against closed forms.

Every node mass is a product of independent Beta factors (nu, 1 - nu, psi, 1 - psi of distinct
sticks), so its prior mean and variance are products of Beta(1, b) moments; Monte Carlo averages
are compared within 5 exact standard errors.
"""

import math

import numpy as np
import pytest
from scipy.special import digamma, polygamma

from streamtree.inference.sticks import (
    StickParams,
    Sticks,
    alpha_at_depth,
    log_masses,
    mean_sticks,
    sample_sticks,
    stick_params,
)
from streamtree.tree import ROOT, TSSBTree
from streamtree.window import WindowedCounts

ALPHA0, LAM, GAMMA = 1.7, 0.6, 0.8


def build(max_depth, shape):
    """shape maps a path tuple to its number of children, e.g. {(): 3, (0,): 2}."""
    tree = TSSBTree(max_depth)
    node_at = {(): ROOT}
    for path in sorted(shape, key=len):
        for i in range(shape[path]):
            node_at[path + (i,)] = tree.add_child(node_at[path])
    return tree, node_at


def prior_params(tree, *, root_holds_data=True):
    arrays = tree.arrays()
    params = stick_params(arrays, np.zeros(arrays.size), alpha0=ALPHA0, lam=LAM, gamma=GAMMA,
                          max_depth=tree.max_depth, root_holds_data=root_holds_data)
    return arrays, params


def many_draws(params, n, rng):
    """n independent draws of all sticks in one call (the sampler is elementwise), shape (n, K)."""
    tiled = StickParams(*(np.tile(getattr(params, f), n) for f in ("a_nu", "b_nu", "a_psi", "b_psi", "nu_fixed")))
    s = sample_sticks(tiled, rng)
    K = params.a_nu.shape[0]
    out = Sticks(*(getattr(s, f).reshape(n, K) for f in ("log_nu", "log1m_nu", "log_psi", "log1m_psi")))
    out.log_psi[:, 0], out.log1m_psi[:, 0] = 0.0, -np.inf  # tiling made later copies' roots ordinary nodes
    return out


def batched_masses(arrays, s):
    """pi and residuals of every draw, by the same top-down recurrence as log_masses, per column."""
    n, K = s.log_nu.shape
    M = np.zeros((n, K))
    run = np.zeros((n, K))
    for k in range(1, K):
        par = arrays.parent_index[k]
        M[:, k] = M[:, par] + s.log1m_nu[:, par] + s.log_psi[:, k] + run[:, par]
        run[:, par] += s.log1m_psi[:, k]
    with np.errstate(invalid="ignore"):
        res = M + s.log1m_nu + run
    return np.exp(M + s.log_nu), np.exp(np.nan_to_num(res, nan=-np.inf))


def total_mass(log_pi, log_res):
    return np.exp(log_pi).sum() + np.exp(log_res[np.isfinite(log_res)]).sum()


# ------------------------------------------------------------------------------ log_masses
@pytest.mark.parametrize("max_depth,root_holds_data", [(None, True), (2, True), (3, True), (1, False), (2, False)])
def test_masses_and_residuals_sum_to_one(max_depth, root_holds_data):
    rng = np.random.default_rng(0)
    shape = {(): 4} if max_depth == 1 else {(): 4, (0,): 3, (2,): 1}
    if max_depth is None or max_depth >= 3:
        shape.update({(0, 1): 2, (2, 0): 3})
    tree, _ = build(max_depth, shape)
    arrays, params = prior_params(tree, root_holds_data=root_holds_data)
    for _ in range(20):
        log_pi, log_res = log_masses(arrays, sample_sticks(params, rng))
        assert total_mass(log_pi, log_res) == pytest.approx(1.0, abs=1e-12)
        if max_depth is not None:
            capped = arrays.depth >= max_depth
            assert np.all(np.isneginf(log_res[capped])) and np.all(np.isfinite(log_res[~capped]))
        if not root_holds_data:
            assert log_pi[0] == -np.inf


def test_masses_match_a_hand_computation():
    tree, node = build(None, {(): 2, (1,): 1})
    arrays = tree.arrays()
    row = arrays.row_of()
    nu = {(): 0.2, (0,): 0.5, (1,): 0.3, (1, 0): 0.9}
    psi = {(0,): 0.6, (1,): 0.25, (1, 0): 0.7}
    order = sorted(nu, key=lambda p: row[node[p]])
    sticks = Sticks(np.array([math.log(nu[p]) for p in order]), np.array([math.log1p(-nu[p]) for p in order]),
                    np.array([math.log(psi[p]) if p else 0.0 for p in order]),
                    np.array([math.log1p(-psi[p]) if p else -np.inf for p in order]))
    log_pi, log_res = log_masses(arrays, sticks)
    pi = {p: math.exp(log_pi[row[node[p]]]) for p in order}
    res = {p: math.exp(log_res[row[node[p]]]) for p in order}
    assert pi[()] == pytest.approx(0.2)
    assert pi[(0,)] == pytest.approx(0.8 * 0.6 * 0.5)
    assert pi[(1,)] == pytest.approx(0.8 * 0.4 * 0.25 * 0.3)
    assert pi[(1, 0)] == pytest.approx(0.8 * 0.4 * 0.25 * 0.7 * 0.7 * 0.9)
    assert res[()] == pytest.approx(0.8 * 0.4 * 0.75)
    assert res[(0,)] == pytest.approx(0.8 * 0.6 * 0.5)  # no children: all of (1 - nu)
    assert res[(1,)] == pytest.approx(0.8 * 0.4 * 0.25 * 0.7 * 0.3)
    assert res[(1, 0)] == pytest.approx(0.8 * 0.4 * 0.25 * 0.7 * 0.7 * 0.1)


# ------------------------------------------------------------------------------ prior moments
def beta1_moments(b):
    """E and E[.^2] of X ~ Beta(1, b) and of 1 - X."""
    return (1 / (1 + b), 2 / ((1 + b) * (2 + b))), (b / (1 + b), b / (2 + b))


def expected_mass(path, max_depth):
    """(E pi, E pi^2) of the node at ``path`` under the TSSB prior, as a product of factors."""
    m1, m2 = 1.0, 1.0
    for d in range(len(path) + 1):
        a = ALPHA0 * LAM ** d
        (nu1, nu2), (q1, q2) = beta1_moments(a)
        if d > 0:  # the branch sticks of this level: psi_i and (1 - psi_j), j < i
            (p1, p2), (r1, r2) = beta1_moments(GAMMA)
            i = path[d - 1]
            m1 *= p1 * r1 ** i
            m2 *= p2 * r2 ** i
        at_cap = max_depth is not None and d >= max_depth
        if d == len(path):
            if not at_cap:
                m1, m2 = m1 * nu1, m2 * nu2
        else:
            m1, m2 = m1 * q1, m2 * q2
    return m1, m2


@pytest.mark.parametrize("max_depth", [None, 2])
def test_prior_node_masses_match_closed_form_expectations(max_depth):
    shape = {(): 3, (0,): 2, (2,): 1}
    tree, node = build(max_depth, shape)
    arrays, params = prior_params(tree)
    row = arrays.row_of()
    rng = np.random.default_rng(1)
    n = 100_000
    s = many_draws(params, n, rng)
    draws, _ = batched_masses(arrays, s)
    for i in range(50):  # the batched recurrence is log_masses
        one = Sticks(s.log_nu[i], s.log1m_nu[i], s.log_psi[i], s.log1m_psi[i])
        assert np.allclose(np.exp(log_masses(arrays, one)[0]), draws[i], rtol=1e-12, atol=0)
    # the closed forms stated in the model description
    assert expected_mass((), max_depth)[0] == pytest.approx(1 / (1 + ALPHA0))
    assert expected_mass((0,), max_depth)[0] == pytest.approx(
        ALPHA0 / (1 + ALPHA0) / (1 + GAMMA) / (1 + ALPHA0 * LAM))
    for path, nid in node.items():
        m1, m2 = expected_mass(path, max_depth)
        se = math.sqrt((m2 - m1 ** 2) / n)
        est = draws[:, row[nid]].mean()
        assert abs(est - m1) < 5 * se, (path, est, m1, se)
    if max_depth == 2:  # nu = 1 at the cap: the grandchild takes its whole subtree mass
        capped = arrays.depth >= 2
        assert np.all(s.log_nu[:, capped] == 0.0) and np.all(np.isneginf(s.log1m_nu[:, capped]))
        (p1, _), (r1, _) = beta1_moments(GAMMA)
        e_sub = ALPHA0 / (1 + ALPHA0) * p1 * ALPHA0 * LAM / (1 + ALPHA0 * LAM) * p1 * r1
        assert expected_mass((0, 1), 2)[0] == pytest.approx(e_sub)


def test_residual_mass_of_the_root_matches_its_expectation():
    tree, _ = build(None, {(): 3})
    arrays, params = prior_params(tree)
    rng = np.random.default_rng(2)
    n = 100_000
    s = many_draws(params, n, rng)
    res = batched_masses(arrays, s)[1][:, 0]
    one = Sticks(s.log_nu[0], s.log1m_nu[0], s.log_psi[0], s.log1m_psi[0])
    assert math.exp(log_masses(arrays, one)[1][0]) == pytest.approx(res[0], rel=1e-12)
    (_, _), (q1, q2) = beta1_moments(ALPHA0)
    (_, _), (r1, r2) = beta1_moments(GAMMA)
    m1, m2 = q1 * r1 ** 3, q2 * r2 ** 3
    assert abs(res.mean() - m1) < 5 * math.sqrt((m2 - m1 ** 2) / n)


# ------------------------------------------------------------------------------ posterior
def known_tree():
    tree, node = build(3, {(): 3, (0,): 2})
    own = {(): 3, (0,): 2, (1,): 0, (2,): 5, (0, 0): 4, (0, 1): 1}
    arrays = tree.arrays()
    row = arrays.row_of()
    counts = np.zeros(arrays.size)
    for path, c in own.items():
        counts[row[node[path]]] = c
    return tree, node, arrays, row, counts


def test_stick_params_from_counts_by_hand():
    tree, node, arrays, row, counts = known_tree()
    params = stick_params(arrays, counts, alpha0=ALPHA0, lam=LAM, gamma=GAMMA, max_depth=3)
    a1, a2 = ALPHA0 * LAM, ALPHA0 * LAM ** 2
    # subtree totals: (0,0)=4, (0,1)=1, (0)=7, (1)=0, (2)=5, root=15
    expect = {  # path: (a_nu, b_nu, a_psi, b_psi)
        (): (4, ALPHA0 + 12, None, None),
        (0,): (3, a1 + 5, 8, GAMMA + 0 + 5),
        (1,): (1, a1 + 0, 1, GAMMA + 5),
        (2,): (6, a1 + 0, 6, GAMMA),
        (0, 0): (5, a2, 5, GAMMA + 1),
        (0, 1): (2, a2, 2, GAMMA),
    }
    for path, (anu, bnu, apsi, bpsi) in expect.items():
        k = row[node[path]]
        assert params.a_nu[k] == pytest.approx(anu) and params.b_nu[k] == pytest.approx(bnu)
        if apsi is not None:
            assert params.a_psi[k] == pytest.approx(apsi) and params.b_psi[k] == pytest.approx(bpsi)
    assert np.all(np.isnan(params.nu_fixed))
    assert np.allclose(alpha_at_depth(arrays.depth, ALPHA0, LAM), ALPHA0 * LAM ** arrays.depth)
    with pytest.raises(ValueError, match="own_counts"):
        stick_params(arrays, counts[:-1], alpha0=ALPHA0, lam=LAM, gamma=GAMMA, max_depth=3)


def test_stick_sampler_matches_beta_posterior_moments():
    tree, node, arrays, row, counts = known_tree()
    params = stick_params(arrays, counts, alpha0=ALPHA0, lam=LAM, gamma=GAMMA, max_depth=3)
    rng = np.random.default_rng(3)
    n = 100_000
    s = many_draws(params, n, rng)
    for name, a, b, skip_root in (("nu", params.a_nu, params.b_nu, False), ("psi", params.a_psi, params.b_psi, True)):
        lx = getattr(s, f"log_{name}")
        l1mx = getattr(s, f"log1m_{name}")
        sl = slice(1, None) if skip_root else slice(None)
        a, b, lx, l1mx = a[sl], b[sl], lx[:, sl], l1mx[:, sl]
        x = np.exp(lx)
        assert np.allclose(x + np.exp(l1mx), 1.0, atol=1e-12)
        mean = a / (a + b)
        var = a * b / ((a + b) ** 2 * (a + b + 1))
        assert np.all(np.abs(x.mean(0) - mean) < 5 * np.sqrt(var / n)), name
        assert np.all(np.abs(x.var(0) / var - 1) < 0.06), name
        # log moments: E log X = digamma(a) - digamma(a + b), Var log X = trigamma(a) - trigamma(a + b)
        elog = digamma(a) - digamma(a + b)
        vlog = polygamma(1, a) - polygamma(1, a + b)
        assert np.all(np.abs(lx.mean(0) - elog) < 5 * np.sqrt(vlog / n)), name
    m = mean_sticks(params)
    assert np.allclose(np.exp(m.log_nu), params.a_nu / (params.a_nu + params.b_nu))


def test_fixed_sticks_at_the_cap_and_dp_root():
    tree, node = build(1, {(): 3})
    arrays = tree.arrays()
    counts = np.array([0.0, 4.0, 0.0, 2.0])
    params = stick_params(arrays, counts, alpha0=ALPHA0, lam=LAM, gamma=1.0, max_depth=1, root_holds_data=False)
    s = sample_sticks(params, np.random.default_rng(4))
    assert s.log_nu[0] == -np.inf and s.log1m_nu[0] == 0.0
    assert np.all(s.log_nu[1:] == 0.0) and np.all(np.isneginf(s.log1m_nu[1:]))
    log_pi, log_res = log_masses(arrays, s)
    assert log_pi[0] == -np.inf
    assert total_mass(log_pi, log_res) == pytest.approx(1.0, abs=1e-12)
    # DP: psi_i ~ Beta(1 + n_i, 1 + n_{>i})
    assert params.a_psi[1:].tolist() == [5.0, 1.0, 3.0]
    assert params.b_psi[1:].tolist() == [3.0, 3.0, 1.0]


# ------------------------------------------------------------------------------ windows
EPOCHS = [{0: 2, 1: 3}, {0: 1, 2: 4}, {1: 5, 3: 0}, {0: 7, 2: 1}, {3: 2}]


@pytest.mark.parametrize("h", [0, 1, 3, None])
def test_window_counts_and_beta_parameters_over_epochs(h):
    tree, node = build(None, {(): 2, (0,): 1})  # ids: root 0, children 1, 2; grandchild 3 under 1
    arrays = tree.arrays()
    ids = arrays.ids
    w = WindowedCounts(h)
    for t, live in enumerate(EPOCHS):
        # the prior at epoch t uses epochs max(0, t - h) .. t - 1
        first = 0 if h is None else max(0, t - h)
        expected = np.array([sum(EPOCHS[s].get(int(i), 0) for s in range(first, t)) for i in ids])
        past = w.counts(ids)
        assert np.array_equal(past, expected), (h, t)
        # Gibbs conditional: past window plus the live epoch
        own = past + np.array([live.get(int(i), 0) for i in ids])
        params = stick_params(arrays, own, alpha0=ALPHA0, lam=LAM, gamma=GAMMA, max_depth=None)
        row = arrays.row_of()
        S1 = own[row[1]] + own[row[3]]
        S2 = own[row[2]]
        assert params.a_nu[row[0]] == 1 + own[row[0]]
        assert params.b_nu[row[0]] == pytest.approx(ALPHA0 + S1 + S2)
        assert params.b_nu[row[1]] == pytest.approx(ALPHA0 * LAM + own[row[3]])
        assert params.a_psi[row[1]] == 1 + S1 and params.b_psi[row[1]] == pytest.approx(GAMMA + S2)
        assert params.a_psi[row[2]] == 1 + S2 and params.b_psi[row[2]] == pytest.approx(GAMMA)
        w.commit(live)
    if h == 0:
        assert len(w.history) == 0 and not w.total
    else:
        assert len(w.history) == (len(EPOCHS) if h is None else min(h, len(EPOCHS)))
        assert all(v != 0 for snap in w.history for v in snap.values())  # zero counts are not stored
    restored = WindowedCounts.from_state(w.state())
    assert np.array_equal(restored.counts(ids), w.counts(ids))
    w.forget([2])
    assert w.counts(np.array([2]))[0] == 0 and all(2 not in snap for snap in w.history)


@pytest.mark.parametrize("bad", [-1, 1.5, "3"])
def test_window_rejects_invalid_sizes(bad):
    with pytest.raises(ValueError, match="window"):
        WindowedCounts(bad)
