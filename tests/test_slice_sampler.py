"""The reference slice sampler leaves p(z | sticks, theta) oc pi_e f(x | theta_e) invariant.

Worlds are small depth-capped trees with a 1-D Gaussian likelihood (cheap to evaluate) and
new-node parameters theta ~ N(theta_parent, tau^2). Exact answers come from enumerating pi * f
over the nodes that exist, with the tree expanded until the unrepresented stick mass is negligible
(or bounded explicitly). Chains are compared with batch-means standard errors, since successive
states are correlated; iid checks start from exact draws of the target.
"""

import math

import numpy as np
import pytest
from scipy import stats

from streamtree.inference.slice_sampler import (
    SliceState,
    StickPrior,
    find_node,
    new_child,
    pre_expand,
    prune_trailing_empty,
    slice_sweep,
    slice_z,
)
from streamtree.tree import ROOT, TSSBTree

SIGMA = 1.0
TAU = 1.5
LOG_NORM = -0.5 * math.log(2 * math.pi * SIGMA ** 2)


def gaussian_world(max_depth, seed, *, root_nu=0.3, alpha0=1.0, lam=0.5, gamma=0.5):
    """A root-only state, the stick prior, theta ~ N(theta_parent, TAU^2) and f = N(x; theta, SIGMA^2)."""
    rng = np.random.default_rng(seed)
    prior = StickPrior(alpha0=alpha0, lam=lam, gamma=gamma)
    state = SliceState(TSSBTree(max_depth))
    state.log_nu[ROOT], state.log1m_nu[ROOT] = math.log(root_nu), math.log1p(-root_nu)
    state.log_psi[ROOT], state.log1m_psi[ROOT] = 0.0, -math.inf
    state.theta[ROOT] = 0.0

    def draw_theta(parent, depth, rng):
        return state.theta[parent] + TAU * rng.normal()

    def loglik(x, node):
        d = x - state.theta[node]
        return -0.5 * d * d / SIGMA ** 2 + LOG_NORM

    return state, prior, draw_theta, loglik, rng


def exact_target(state, loglik, x):
    """Node ids in pre-order and p(e) oc pi_e f(x | theta_e) over the existing nodes."""
    ids, log_pi, _ = state.log_masses()
    w = log_pi + np.array([loglik(x, int(i)) for i in ids])
    p = np.exp(w - w.max())
    return ids, p / p.sum()


def unrepresented_bound(state, loglik, x):
    """Upper bound on the target mass of nodes that do not exist: residual stick mass times
    sup f, over the normaliser of the existing part (a lower bound of the full one)."""
    ids, log_pi, log_res = state.log_masses()
    z_live = np.exp(log_pi + np.array([loglik(x, int(i)) for i in ids])).sum()
    return float(np.exp(log_res[np.isfinite(log_res)]).sum() * math.exp(LOG_NORM) / z_live)


def batch_means_z(record, ids, p, n_batches=100):
    """z-scores of the empirical frequencies against p, with batch-means standard errors
    (floored at the iid value, which only widens the tolerance)."""
    n = record.shape[0] - record.shape[0] % n_batches
    ind = record[:n, None] == ids[None, :]
    emp = ind.mean(axis=0)
    batches = ind.reshape(n_batches, -1, ids.shape[0]).mean(axis=1)
    se = np.maximum(batches.std(axis=0, ddof=1) / math.sqrt(n_batches), np.sqrt(p * (1 - p) / n))
    return (emp - p) / se, emp


def run_chain(x, z0, n_steps, state, prior, loglik, draw_theta, rng):
    record = np.empty(n_steps, dtype=np.int64)
    z = z0
    for i in range(n_steps):
        z = slice_z(x, z, state, prior, loglik, draw_theta, rng)
        record[i] = z
    return record


def interval_layout(state):
    """Pre-order layout of [0, 1): each node's own interval and its residual (new-children) gap."""
    ids, log_pi, log_res = state.log_masses()
    row = {int(i): k for k, i in enumerate(ids)}
    own, gap = {}, {}
    pos = 0.0

    def visit(node):
        nonlocal pos
        k = row[node]
        own[node] = (pos, pos + math.exp(log_pi[k]))
        pos = own[node][1]
        for c in state.tree.children[node]:
            visit(c)
        if np.isfinite(log_res[k]):
            gap[node] = (pos, pos + math.exp(log_res[k]))
            pos = gap[node][1]

    visit(ROOT)
    return own, gap, pos


def grown_world(max_depth, seed, sizes):
    """A world whose root has sizes[0] children, each with sizes[1] children, ... (prior sticks)."""
    state, prior, draw_theta, loglik, rng = gaussian_world(max_depth, seed)

    frontier = [ROOT]
    for k in sizes:
        nxt = []
        for node in frontier:
            for _ in range(k):
                nxt.append(new_child(node, state, prior, draw_theta, rng))
        frontier = nxt
    return state, prior, draw_theta, loglik, rng


# ------------------------------------------------------------------------------ FIND_NODE
def test_find_node_returns_the_node_whose_interval_holds_u():
    state, prior, draw_theta, _, rng = grown_world(2, 0, (3, 2))
    own, gap, total = interval_layout(state)
    assert total == pytest.approx(1.0, abs=1e-12)
    n_nodes = len(state.tree)
    for node, (a, b) in own.items():
        for frac in (0.5, 1e-3, 1 - 1e-3):
            assert find_node(a + frac * (b - a), state, prior, draw_theta, rng) == node
    assert len(state.tree) == n_nodes  # nothing created inside existing intervals


def test_find_node_creates_children_lazily_in_residual_gaps():
    state, prior, draw_theta, _, rng = grown_world(2, 1, (2, 1))
    _, gap, _ = interval_layout(state)
    for parent, (a, b) in gap.items():
        before = list(state.tree.children[parent])
        node = find_node(0.5 * (a + b), state, prior, draw_theta, rng)
        assert node not in before
        # the found node lies in the new part of parent's subtree: its ancestor among parent's
        # children is a freshly appended one
        anc = node
        while state.tree.parent[anc] != parent:
            anc = state.tree.parent[anc]
        assert anc in state.tree.children[parent] and anc not in before
        assert state.tree.depth[node] <= 2
        for d in (state.log_nu, state.log1m_nu, state.log_psi, state.log1m_psi, state.theta):
            assert node in d
        if state.tree.at_cap(node):
            assert state.log_nu[node] == 0.0 and state.log1m_nu[node] == -math.inf


def test_find_node_is_monotone_in_u_and_hits_nodes_with_probability_pi():
    state, prior, draw_theta, _, rng = grown_world(2, 2, (4, 3))
    pre_expand(state, prior, draw_theta, rng, tol=1e-12)
    u = (np.arange(50_000) + 0.5) / 50_000
    nodes = np.array([find_node(float(v), state, prior, draw_theta, rng) for v in u])
    change = np.flatnonzero(nodes[1:] != nodes[:-1])
    paths = [state.tree.path(int(n)) for n in nodes[np.append(0, change + 1)]]
    assert all(a < b for a, b in zip(paths, paths[1:]))  # each node is one contiguous run
    ids, log_pi, _ = state.log_masses()
    freq = np.array([np.count_nonzero(nodes == i) for i in ids]) / u.size
    # a uniform grid of step h hits an interval of length L between L/h - 1 and L/h + 1 times
    assert np.max(np.abs(freq - np.exp(log_pi))) <= 1.0 / u.size + 1e-12


def test_pre_expand_bounds_the_residual_and_rejects_uncapped_trees():
    state, prior, draw_theta, _, rng = gaussian_world(2, 3)
    pre_expand(state, prior, draw_theta, rng, tol=1e-4)
    ids, log_pi, log_res = state.log_masses()
    arrays = state.tree.arrays()
    # residual relative to each node's branching mass R(e) = M(e) + log(1 - nu_e)
    inner = arrays.depth < 2
    log_m = log_pi - np.array([state.log_nu[int(i)] for i in ids])
    rel = log_res[inner] - (log_m + np.array([state.log1m_nu[int(i)] for i in ids]))[inner]
    assert np.all(rel < math.log(1e-4))
    assert np.all(np.isneginf(log_res[arrays.depth == 2]))
    assert np.exp(log_pi).sum() + np.exp(log_res[np.isfinite(log_res)]).sum() == pytest.approx(1.0, abs=1e-12)
    uncapped, *_ = gaussian_world(None, 3)
    with pytest.raises(ValueError, match="depth cap"):
        pre_expand(uncapped, prior, draw_theta, rng, tol=1e-4)


# ------------------------------------------------------------------------------ invariance
def test_one_step_from_the_exact_target_stays_exact_and_is_reversible():
    """z0 ~ pi f exactly, z1 = slice_z(z0): z1 ~ pi f (chi-square), (z0, z1) is symmetric in law
    (the node chain is reversible), and the kernel does move."""
    state, prior, draw_theta, loglik, rng = gaussian_world(2, 4)
    pre_expand(state, prior, draw_theta, rng, tol=1e-10)
    x = 1.2
    ids, p = exact_target(state, loglik, x)
    assert unrepresented_bound(state, loglik, x) < 1e-8
    n = 60_000
    z0 = ids[rng.choice(ids.size, size=n, p=p)]
    z1 = np.array([slice_z(x, int(a), state, prior, loglik, draw_theta, rng) for a in z0])
    assert np.all(np.isin(z1, ids))  # lazy creation is negligible at this tolerance
    counts = np.array([np.count_nonzero(z1 == i) for i in ids])
    expected = n * p
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    assert stats.chisquare(obs, exp).pvalue > 1e-3
    # reversibility: N(a -> b) and N(b -> a) are Binomial halves of their sum
    row = {int(i): k for k, i in enumerate(ids)}
    pairs = np.zeros((ids.size, ids.size), dtype=np.int64)
    np.add.at(pairs, (np.array([row[int(a)] for a in z0]), np.array([row[int(b)] for b in z1])), 1)
    up = pairs[np.triu_indices(ids.size, 1)]
    down = pairs.T[np.triu_indices(ids.size, 1)]
    m = up + down
    keep = m >= 10
    stat = np.sum((up[keep] - down[keep]) ** 2 / m[keep])
    assert keep.sum() >= 20
    assert stats.chi2.sf(stat, keep.sum()) > 1e-3
    assert np.mean(z0 != z1) > 0.3


def test_chain_on_pre_expanded_tree_matches_pi_f():
    """1e5 single-document updates on a depth-2 tree with little unrepresented mass."""
    state, prior, draw_theta, loglik, rng = gaussian_world(2, 5)
    pre_expand(state, prior, draw_theta, rng, tol=1e-6)
    x = 1.2
    record = run_chain(x, ROOT, 100_000, state, prior, loglik, draw_theta, rng)
    ids, p = exact_target(state, loglik, x)
    assert unrepresented_bound(state, loglik, x) < 1e-4
    z, emp = batch_means_z(record, ids, p)
    assert np.max(np.abs(z)) < 5.0, (np.max(np.abs(z)), ids[np.argmax(np.abs(z))])
    assert 0.5 * np.abs(emp - p).sum() < 0.02


def _lazy_chain_check(seed, n_steps):
    state, prior, draw_theta, loglik, rng = gaussian_world(2, seed, gamma=1.0)
    x = 1.5
    record = run_chain(x, ROOT, n_steps, state, prior, loglik, draw_theta, rng)
    ids, p = exact_target(state, loglik, x)
    bound = unrepresented_bound(state, loglik, x)
    z, emp = batch_means_z(record, ids, p)
    # the chain really grew the tree, and the grown part carries most of the target mass
    assert ids.size > 30
    assert p[ids != ROOT].sum() > 0.5
    assert bound < 1e-3
    # frequencies of nodes created on the way agree with pi f over the final tree; the mass of
    # still-unrepresented nodes (<= bound) can only shift the reference by that much
    slack = bound / np.maximum(np.sqrt(p * (1 - p) / record.size), 1e-12)
    assert np.all(np.abs(z) < 5.0 + slack), np.max(np.abs(z))
    return np.max(np.abs(emp - p))


def test_chain_with_lazy_creation_from_a_root_only_tree_matches_pi_f():
    err = _lazy_chain_check(6, 100_000)
    assert err < 1e-2


@pytest.mark.slow
def test_long_chain_with_lazy_creation_matches_pi_f():
    err = _lazy_chain_check(7, 300_000)
    assert err < 6e-3


# ------------------------------------------------------------------------------ sweeps, pruning
def test_slice_sweep_equals_successive_slice_z_and_checks_lengths():
    X = np.array([-2.0, 0.3, 1.5, 4.0])
    s1, prior, draw1, ll1, _ = gaussian_world(2, 8)
    s2, _, draw2, ll2, _ = gaussian_world(2, 8)
    out = slice_sweep(X, [ROOT] * 4, s1, prior, ll1, draw1, np.random.default_rng(11))
    rng = np.random.default_rng(11)
    ref = [slice_z(x, ROOT, s2, prior, ll2, draw2, rng) for x in X]
    assert out.tolist() == ref
    assert s1.tree.arrays().ids.tolist() == s2.tree.arrays().ids.tolist()
    with pytest.raises(ValueError, match="one entry per row"):
        slice_sweep(X, [ROOT] * 3, s1, prior, ll1, draw1, rng)
    with pytest.raises(KeyError):
        slice_z(0.0, 10_000, s1, prior, ll1, draw1, rng)


def test_prune_removes_only_trailing_empty_leaves():
    state, prior, draw_theta, _, rng = grown_world(2, 9, (3, 2))
    kids = list(state.tree.children[ROOT])
    grand = state.tree.children[kids[0]]
    occupied = {grand[0]}
    removed = prune_trailing_empty(state, occupied, protected=[kids[1]])
    # kids[2]'s subtree goes entirely (trailing, empty); kids[1] is protected so its children
    # are trailing leaves and go; kids[0] keeps its occupied first child and loses the last one
    assert set(state.tree.parent) == {ROOT, kids[0], kids[1], grand[0]}
    assert set(removed).isdisjoint(state.tree.parent)
    for d in (state.log_nu, state.log_psi, state.theta):
        assert set(d) == set(state.tree.parent)


def test_sweeps_over_many_documents_sample_each_documents_target():
    """N identical documents swept repeatedly: given the (shared) sticks, documents are
    independent, so after burn-in the final assignments are iid draws of pi f."""
    state, prior, draw_theta, loglik, rng = gaussian_world(2, 12)
    pre_expand(state, prior, draw_theta, rng, tol=1e-8)
    x = -0.8
    ids, p = exact_target(state, loglik, x)
    n = 4000
    z0 = ids[rng.choice(ids.size, size=n, p=p)]  # start at the target: no burn-in bias
    z = z0
    for _ in range(3):
        z = slice_sweep(np.full(n, x), z, state, prior, loglik, draw_theta, rng)
    counts = np.array([np.count_nonzero(z == i) for i in ids])
    big = n * p >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(n * p[big], n * p[~big].sum())
    assert stats.chisquare(obs, exp).pvalue > 1e-3
    assert np.mean(z != z0) > 0.3


def test_lazily_created_sticks_follow_their_priors():
    state, prior, _, _, rng = gaussian_world(2, 13, alpha0=2.0, lam=0.5, gamma=0.7)
    calls = []

    def draw_theta(parent, depth, rng):
        calls.append((parent, depth))
        return 0.0

    kids = [new_child(ROOT, state, prior, draw_theta, rng) for _ in range(3000)]
    grand = [new_child(kids[0], state, prior, draw_theta, rng) for _ in range(50)]
    assert calls == [(ROOT, 1)] * 3000 + [(kids[0], 2)] * 50
    psi = np.exp([state.log_psi[k] for k in kids])
    nu = np.exp([state.log_nu[k] for k in kids])
    assert np.allclose(psi + np.exp([state.log1m_psi[k] for k in kids]), 1.0)
    assert stats.kstest(psi, stats.beta(1, 0.7).cdf).pvalue > 1e-3
    assert stats.kstest(nu, stats.beta(1, 2.0 * 0.5).cdf).pvalue > 1e-3
    assert all(state.log_nu[g] == 0.0 and state.log1m_nu[g] == -math.inf for g in grand)  # at the cap
    assert state.tree.children[ROOT] == kids  # appended last, in creation order
    with pytest.raises(ValueError):
        StickPrior(alpha0=0.0, lam=0.5, gamma=1.0)
    with pytest.raises(ValueError):
        find_node(1.0, state, prior, draw_theta, rng)


@pytest.mark.slow
def test_pruned_chain_matches_the_marginal_over_unrepresented_subtrees():
    """Depth cap 2, fixed live nodes root > a > a1. With trailing empty created nodes pruned after
    every step, the chain targets p(z) with the unrepresented sticks and thetas integrated out:

    * live e: pi_e f(x | theta_e);
    * new children of a (at the cap): R_a N(x; theta_a, TAU^2 + SIGMA^2);
    * new children of the root and their subtrees: R_root [E nu N(x; theta_root, TAU^2 + SIGMA^2)
      + E(1 - nu) N(x; theta_root, 2 TAU^2 + SIGMA^2)], with E nu = 1 / (1 + alpha(1)).

    The enumerated kernel's placeholder under the root uses R_root N(x; theta_root, TAU^2 + SIGMA^2)
    for the whole region (no document lands two levels below a live node in one sweep); the
    exact value differs, which is why this checks the slice sampler against the formula above.
    """
    state, prior, draw_theta, loglik, rng = gaussian_world(2, 14, root_nu=0.25, alpha0=4.0, lam=0.5)
    a = state.tree.add_child(ROOT)
    state.log_psi[a], state.log1m_psi[a] = math.log(0.5), math.log(0.5)
    state.log_nu[a], state.log1m_nu[a] = math.log(0.4), math.log(0.6)
    state.theta[a] = -1.0
    a1 = state.tree.add_child(a)
    state.log_psi[a1], state.log1m_psi[a1] = math.log(0.6), math.log(0.4)
    state.log_nu[a1], state.log1m_nu[a1] = 0.0, -math.inf
    state.theta[a1] = -2.0
    live = [ROOT, a, a1]
    x = 0.0
    ids, log_pi, log_res = state.log_masses()
    row = {int(i): k for k, i in enumerate(ids)}
    e_nu = 1.0 / (1.0 + prior.alpha(1))
    m1 = stats.norm(0.0, math.sqrt(TAU ** 2 + SIGMA ** 2)).pdf(x)
    m2 = stats.norm(0.0, math.sqrt(2 * TAU ** 2 + SIGMA ** 2)).pdf(x)
    w = np.array([math.exp(log_pi[row[i]] + loglik(x, i)) for i in live]
                 + [math.exp(log_res[row[a]]) * stats.norm(-1.0, math.sqrt(TAU ** 2 + SIGMA ** 2)).pdf(x),
                    math.exp(log_res[row[ROOT]]) * (e_nu * m1 + (1 - e_nu) * m2)])
    exact = w / w.sum()
    assert exact[4] > 0.25

    steps = 120_000
    cat = np.empty(steps, dtype=np.int64)
    z = ROOT
    for s in range(steps):
        z = slice_z(x, z, state, prior, loglik, draw_theta, rng)
        prune_trailing_empty(state, [z], protected=live)
        if z in live:
            cat[s] = live.index(z)
        else:
            top = z
            while state.tree.parent[top] not in (ROOT, a):
                top = state.tree.parent[top]
            cat[s] = 3 if state.tree.parent[top] == a else 4
    n_b = 100
    ind = cat[:, None] == np.arange(5)[None, :]
    emp = ind.mean(axis=0)
    se = np.maximum(ind.reshape(n_b, -1, 5).mean(axis=1).std(axis=0, ddof=1) / math.sqrt(n_b),
                    np.sqrt(exact * (1 - exact) / steps))
    assert np.all(np.abs(emp - exact) < 5 * se), (emp, exact, se)
    # the one-level placeholder approximation is visibly different here
    w_ph = w.copy()
    w_ph[4] = math.exp(log_res[row[ROOT]]) * m1
    assert abs(w_ph[4] / w_ph.sum() - exact[4]) > 8 * se[4]
