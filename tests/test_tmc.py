"""Tests of the time-marginalised coalescent: prior, messages, conditionals, sampler, prediction."""

from __future__ import annotations

import itertools
from collections import Counter
from fractions import Fraction
from math import comb, factorial, lgamma, log

import numpy as np
import pytest
from numpy.polynomial.legendre import leggauss
from scipy import integrate, stats

from streamtree.static import tmc_kernels as K
from streamtree.static.tmc import (
    TimeMarginalizedCoalescent,
    TreeState,
    _slice_positive,
    log_alpha_beta_posterior,
    sample_sigma2,
    sigma2_posterior,
    tree_predictive_log_density,
)
from streamtree.static.tmc_prior import internal_counts_from_linkage, log_tmc_prior_linkage

# ------------------------------------------------------------------------------------------
# helpers: trees as nested tuples ``(time, left, right)`` with integer leaves
# ------------------------------------------------------------------------------------------


def all_topologies(labels):
    """Every rooted binary tree (unordered children) on ``labels``, as nested frozensets."""
    labels = tuple(labels)
    if len(labels) == 1:
        return [labels[0]]
    first, rest = labels[0], labels[1:]
    out = []
    for r in range(0, len(rest)):
        for comb_ in itertools.combinations(rest, r):
            A = (first,) + comb_
            B = tuple(x for x in rest if x not in comb_)
            for ta in all_topologies(A):
                for tb in all_topologies(B):
                    out.append(frozenset([ta, tb]))
    return out


def ranked_history_topologies(n):
    """Topologies of all ranked coalescent histories (every sequence of pair joins)."""
    out = Counter()

    def rec(clusters):
        if len(clusters) == 1:
            out[clusters[0]] += 1
            return
        for i, j in itertools.combinations(range(len(clusters)), 2):
            merged = frozenset([clusters[i], clusters[j]])
            rec([c for k, c in enumerate(clusters) if k not in (i, j)] + [merged])

    rec(list(range(n)))
    return out


def topo_to_linkage(topo, n):
    rows, ids = [], {}

    def rec(node):
        if isinstance(node, int):
            return node, 1
        a, b = tuple(node)
        (ia, sa), (ib, sb) = rec(a), rec(b)
        rows.append([ia, ib, len(rows) + 1.0, sa + sb])
        return n + len(rows) - 1, sa + sb

    rec(topo)
    return np.array(rows, dtype=float)


def state_to_nested(st: TreeState, v=None):
    v = st.root if v is None else v
    if st.ch[v, 0] < 0:
        return int(v)
    return (float(st.t[v]), state_to_nested(st, st.ch[v, 0]), state_to_nested(st, st.ch[v, 1]))


def nested_to_state(tree, n) -> TreeState:
    """TreeState from nested ``(time, left, right)`` tuples (internal ids in post-order)."""
    N = 2 * n - 1
    parent = np.full(N, -1, dtype=np.int64)
    ch = np.full((N, 2), -1, dtype=np.int64)
    t = np.zeros(N)
    m = np.zeros(N, dtype=np.int64)
    nxt = [n]

    def rec(node):
        if isinstance(node, int):
            return node
        tv, a, b = node
        ia, ib = rec(a), rec(b)
        v = nxt[0]
        nxt[0] += 1
        ch[v] = (ia, ib)
        parent[ia] = parent[ib] = v
        t[v] = tv
        m[v] = m[ia] + m[ib] + 1
        return v

    root = rec(tree)
    return TreeState(parent, ch, t, m, root)


def attach_nested(tree, target, new, tt):
    """Insert subtree ``new`` above the subtree equal to ``target`` at time ``tt``."""
    if tree == target:
        return (tt, tree, new)
    if isinstance(tree, int):
        return tree
    tv, a, b = tree
    return (tv, attach_nested(a, target, new, tt), attach_nested(b, target, new, tt))


def subtree_of(st: TreeState, v):
    return state_to_nested(st, v)


def random_state_tree(n, rng) -> TreeState:
    """A random tree with strictly decreasing times (root at 1)."""
    clusters = list(range(n))
    rows = []
    sizes = {i: 1 for i in range(n)}
    while len(clusters) > 1:
        i, j = sorted(rng.choice(len(clusters), 2, replace=False))
        a, b = clusters[j], clusters[i]
        new = n + len(rows)
        sizes[new] = sizes[a] + sizes[b]
        rows.append([a, b, 0.0, sizes[new]])
        clusters = [c for k, c in enumerate(clusters) if k not in (i, j)] + [new]
    Z = np.array(rows, dtype=float)
    times = np.sort(rng.uniform(0.05, 0.95, n - 1))
    times[-1] = 1.0
    return TreeState.from_linkage(Z, times)


def flat_root_loglik_direct(X, st: TreeState, sigma2):
    """log of the integral over the root location of the leaves' multivariate normal density.

    Leaf covariance ``sigma2 * (1 - t_lca(i, j))`` (shared path below the root at time 1).
    """
    n, d = X.shape
    nested = state_to_nested(st)
    S = np.zeros((n, n))

    def rec(node):
        if isinstance(node, int):
            return [node]
        tv, a, b = node
        la, lb = rec(a), rec(b)
        for i in la:
            for j in lb:
                S[i, j] = S[j, i] = 1.0 - tv
        return la + lb

    rec(nested)
    np.fill_diagonal(S, 1.0)
    S *= sigma2
    Si = np.linalg.inv(S)
    one = np.ones(n)
    q = one @ Si @ one
    _, logdet = np.linalg.slogdet(S)
    total = 0.0
    for k in range(d):
        x = X[:, k]
        quad = x @ Si @ x - (one @ Si @ x) ** 2 / q
        total += -0.5 * (n - 1) * log(2 * np.pi) - 0.5 * logdet - 0.5 * log(q) - 0.5 * quad
    return total


def log_joint(st: TreeState, X, sigma2, a, b):
    return st.log_prior(a, b) + st.log_likelihood(X, sigma2)


# ------------------------------------------------------------------------------------------
# prior over topologies
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_prior_sums_to_one_and_matches_ranked_history_counts(n):
    topos = all_topologies(range(n))
    assert len(topos) == factorial(2 * n - 2) // (2 ** (n - 1) * factorial(n - 1))  # (2n-3)!!
    counts = ranked_history_topologies(n)
    total_histories = 1
    for i in range(2, n + 1):
        total_histories *= comb(i, 2)
    assert sum(counts.values()) == total_histories
    assert set(counts) == set(topos)
    total = 0.0
    for topo in topos:
        Z = topo_to_linkage(topo, n)
        p = np.exp(log_tmc_prior_linkage(Z))
        # closed form, evaluated independently in exact rational arithmetic
        m = internal_counts_from_linkage(Z)
        closed = Fraction(factorial(n - 1), int(np.prod(m))) / total_histories
        assert closed == Fraction(counts[topo], total_histories)
        assert p == pytest.approx(float(closed), rel=1e-12)
        total += p
    assert total == pytest.approx(1.0, abs=1e-12)


def test_prior_prefers_balanced_trees():
    bal = np.array([[0, 1, 1, 2], [2, 3, 1, 2], [4, 5, 2, 4]], dtype=float)
    cat = np.array([[0, 1, 1, 2], [2, 4, 2, 3], [3, 5, 3, 4]], dtype=float)
    assert np.exp(log_tmc_prior_linkage(bal)) == pytest.approx(2 / 18)
    assert np.exp(log_tmc_prior_linkage(cat)) == pytest.approx(1 / 18)


# ------------------------------------------------------------------------------------------
# Brownian message passing
# ------------------------------------------------------------------------------------------


def test_message_passing_matches_direct_mvn():
    rng = np.random.default_rng(1)
    for n, d in [(2, 1), (3, 2), (6, 3), (9, 2)]:
        st = random_state_tree(n, rng)
        X = rng.normal(size=(n, d)) * 2.0
        sigma2 = 0.7
        ll = st.log_likelihood(X, sigma2)
        assert ll == pytest.approx(flat_root_loglik_direct(X, st, sigma2), rel=1e-10, abs=1e-10)
        # proper root prior N(0, tau2 I): p_tau(X) = p_flat(X) * N(yhat_root; 0, sigma2 nu + tau2)
        tau2 = 3.0
        umean, uvar = st.messages(X)
        lp_tau = ll + stats.norm.logpdf(umean[st.root], 0, np.sqrt(sigma2 * uvar[st.root] + tau2)).sum()
        nested = state_to_nested(st)
        S = np.zeros((n, n))

        def rec(node):
            if isinstance(node, int):
                return [node]
            tv, a, b = node
            la, lb = rec(a), rec(b)
            for i in la:
                for j in lb:
                    S[i, j] = S[j, i] = sigma2 * (1 - tv)
            return la + lb

        rec(nested)
        np.fill_diagonal(S, sigma2)
        cov = S + tau2
        direct = sum(stats.multivariate_normal(np.zeros(n), cov).logpdf(X[:, k]) for k in range(d))
        assert lp_tau == pytest.approx(direct, rel=1e-10)


def test_outside_messages_give_same_likelihood_at_every_node():
    """Collecting at any internal node (two children + outside message) gives p(X | tree)."""
    rng = np.random.default_rng(2)
    n, d, sigma2 = 8, 3, 1.3
    st = random_state_tree(n, rng)
    X = rng.normal(size=(n, d))
    umean, uvar = st.messages(X)
    omean, ovar = np.zeros_like(umean), np.zeros(2 * n - 1)
    order = np.empty(2 * n - 1, dtype=np.int64)
    K.outside_all(st.parent, st.ch, st.t, st.root, umean, uvar, omean, ovar, order)
    ll = st.log_likelihood(X, sigma2)
    checked = 0
    for v in range(2 * n - 1):
        if v == st.root or st.parent[v] == st.root:
            continue
        # p(X) = p(X outside v) * [factors inside v] * N(yhat_v; outside prediction, ...)
        inside = K.log_likelihood(st.ch, st.t, v, umean, uvar, sigma2)[0] if v >= n else 0.0
        var = uvar[v] + ovar[v] + st.t[st.parent[v]] - st.t[v]
        top = stats.norm.logpdf(umean[v] - omean[v], 0, np.sqrt(sigma2 * var)).sum()
        # outside data alone: the tree with v and its parent removed (Brownian marginalisation)
        rest_st = st.copy()
        K._detach(v, rest_st.parent, rest_st.ch, rest_st.m)
        um2, uv2 = umean.copy(), uvar.copy()
        K.upward_all(rest_st.ch, rest_st.t, rest_st.root, um2, uv2)
        rest = K.log_likelihood(rest_st.ch, rest_st.t, rest_st.root, um2, uv2, sigma2)[0]
        assert inside + top + rest == pytest.approx(ll, rel=1e-10)
        checked += 1
    assert checked >= 5


# ------------------------------------------------------------------------------------------
# conditionals used by the Gibbs moves, against brute-force joint densities
# ------------------------------------------------------------------------------------------


def test_attachment_density_matches_full_joint():
    rng = np.random.default_rng(3)
    n, d, sigma2, a, b = 8, 2, 0.8, 2.5, 1.7
    lb = lgamma(a) + lgamma(b) - lgamma(a + b)
    X = rng.normal(size=(n, d))
    st = random_state_tree(n, rng)
    checked = 0
    for l in range(2 * n - 1):
        if st.parent[l] < 0 or st.parent[l] == st.root:
            continue
        work = st.copy()
        S_l = subtree_of(work, l)
        umean, uvar = work.messages(X)
        p, s = K._detach(l, work.parent, work.ch, work.m)
        K.upward_path(work.parent[s], work.parent, work.ch, work.t, umean, uvar)
        rest = state_to_nested(work)
        omean, ovar = np.zeros_like(umean), np.zeros(2 * n - 1)
        order = np.empty(2 * n - 1, dtype=np.int64)
        tab = K.attachment_tables(l, work.parent, work.ch, work.t, work.m, work.root, umean, uvar,
                                  omean, ovar, order, a, b, lb)
        nodes, lo, hi = tab[0], tab[6], tab[7]
        diffs = []
        for j in range(nodes.size):
            if hi[j] <= lo[j]:
                continue
            target = subtree_of(work, nodes[j])
            for frac in (0.2, 0.5, 0.9):
                tt = lo[j] + frac * (hi[j] - lo[j])
                f = K._branch_logf(j, tt, l, *tab[:6], work.parent, work.ch, work.t, uvar, ovar,
                                   d, sigma2, a, b, lb)
                full = nested_to_state(attach_nested(rest, target, S_l, tt), n)
                diffs.append(f - log_joint(full, X, sigma2, a, b))
        assert len(diffs) >= 3
        assert np.ptp(diffs) < 1e-9
        checked += 1
    assert checked >= 3


def test_height_density_matches_full_joint():
    rng = np.random.default_rng(4)
    n, d, sigma2, a, b = 7, 3, 1.1, 1.8, 2.6
    lb = lgamma(a) + lgamma(b) - lgamma(a + b)
    X = rng.normal(size=(n, d))
    st = random_state_tree(n, rng)
    umean, uvar = st.messages(X)
    omean, ovar = np.zeros_like(umean), np.zeros(2 * n - 1)
    for j in range(n, 2 * n - 1):
        if j == st.root:
            continue
        K.outside_path(j, st.parent, st.ch, st.t, umean, uvar, omean, ovar)
        ca, cb = st.ch[j]
        Dab = np.sum((umean[ca] - umean[cb]) ** 2)
        Ao = np.sum((umean[ca] - omean[j]) ** 2)
        Bo = np.sum((umean[cb] - omean[j]) ** 2)
        Co = np.dot(umean[ca] - omean[j], umean[cb] - omean[j])
        lo, hi = max(st.t[ca], st.t[cb]), st.t[st.parent[j]]
        diffs = []
        for frac in (0.1, 0.4, 0.8):
            tt = lo + frac * (hi - lo)
            f = K._height_logf(tt, hi, st.t[ca], st.t[cb], uvar[ca], uvar[cb], ovar[j], Dab, Ao, Bo,
                               Co, d, sigma2, st.ch[ca, 0] >= 0, st.ch[cb, 0] >= 0, a, b, lb)
            moved = st.copy()
            moved.t[j] = tt
            diffs.append(f - log_joint(moved, X, sigma2, a, b))
        assert np.ptp(diffs) < 1e-9


# ------------------------------------------------------------------------------------------
# hyperparameters
# ------------------------------------------------------------------------------------------


def test_sigma2_posterior_is_inverse_gamma_closed_form():
    rng = np.random.default_rng(5)
    n, d = 6, 2
    X = rng.normal(size=(n, d)) * 1.5
    st = random_state_tree(n, rng)
    prior = (2.0, 1.5)
    umean, uvar = st.messages(X)
    ssq = K.log_likelihood(st.ch, st.t, st.root, umean, uvar, 1.0)[1]
    shape, scale = sigma2_posterior(float(ssq), n, d, prior)
    assert shape == 2.0 + (n - 1) * d / 2

    def unnorm(s2):
        return np.exp(stats.invgamma.logpdf(s2, prior[0], scale=prior[1])
                      + flat_root_loglik_direct(X, st, s2) - 0.0)

    ref = stats.invgamma(shape, scale=scale)
    pts = ref.ppf([0.001, 0.05, 0.3, 0.5, 0.7, 0.95, 0.999])
    # same shape: log(prior x direct-MVN likelihood) - log closed form is constant in sigma2
    logratio = [np.log(unnorm(s2)) - ref.logpdf(s2) for s2 in pts]
    assert np.ptp(logratio) < 1e-9
    # and the closed form is normalised where the product is integrated numerically
    Zc = sum(integrate.quad(unnorm, lo, hi, epsrel=1e-12, epsabs=0)[0]
             for lo, hi in zip(np.r_[0.0, pts], np.r_[pts, np.inf]))
    for s2 in pts:
        assert unnorm(s2) / Zc == pytest.approx(ref.pdf(s2), rel=1e-7)
    draws = np.array([sample_sigma2(float(ssq), n, d, prior, rng) for _ in range(4000)])
    assert stats.kstest(draws, ref.cdf).pvalue > 0.01


def test_alpha_beta_conditional_and_slice_sampler():
    rng = np.random.default_rng(6)
    fr = stats.beta(3.0, 1.5).rvs(size=25, random_state=rng)
    slog_b, slog_1mb = np.log(fr).sum(), np.log1p(-fr).sum()
    prior = (1.5, 0.5)
    # formula == sum of Beta log-pdfs + Gamma log-priors, up to an additive constant
    diffs = []
    for a_, b_ in [(1.5, 2.0), (3.0, 1.2), (5.0, 4.0)]:
        exact = (stats.beta(a_, b_).logpdf(fr).sum() + stats.gamma(prior[0], scale=1 / prior[1]).logpdf(a_ - 1)
                 + stats.gamma(prior[0], scale=1 / prior[1]).logpdf(b_ - 1))
        diffs.append(log_alpha_beta_posterior(a_, b_, slog_b, slog_1mb, fr.size, prior) - exact)
    assert np.ptp(diffs) < 1e-9
    # slice-sampled alpha | beta matches the numerically normalised conditional
    beta = 1.5

    def logp(x):
        return log_alpha_beta_posterior(x, beta, slog_b, slog_1mb, fr.size, prior)

    mode = max(np.linspace(1.01, 20, 2000), key=logp)
    Zc, _ = integrate.quad(lambda x: np.exp(logp(x) - logp(mode)), 1.0, 60.0, points=[mode], limit=200)

    def cdf(x):
        return np.array([integrate.quad(lambda z: np.exp(logp(z) - logp(mode)), 1.0, xi, points=[min(mode, xi)])[0]
                         for xi in np.atleast_1d(x)]) / Zc

    x, draws = 2.0, []
    for it in range(6000):
        x = _slice_positive(logp, x, 1.0, rng)
        if it % 4 == 0:
            draws.append(x)
    assert stats.kstest(draws, cdf).pvalue > 0.01


# ------------------------------------------------------------------------------------------
# the sampler's stationary distribution over topologies, n = 4
# ------------------------------------------------------------------------------------------

X4 = np.array([[0.0, 0.0], [0.5, -0.2], [1.4, 1.1], [1.1, 0.4]])


def exact_topology_posterior(X, sigma2, a, b, n_nodes=60):
    """p(psi | X) for fixed sigma2, alpha, beta by Gauss-Legendre quadrature over the two
    non-root branch fractions (the time density is Beta x Beta in those coordinates)."""
    n = X.shape[0]
    gx, gw = leggauss(n_nodes)
    B = 0.5 * (gx + 1)
    W = 0.5 * gw * stats.beta(a, b).pdf(B)
    post = {}
    for topo in all_topologies(range(n)):
        Z = topo_to_linkage(topo, n)
        st0 = TreeState.from_linkage(Z)
        inner = [v for v in np.argsort(-st0.t) if v >= n and v != st0.root]  # top-down
        total = 0.0
        for (b1, w1), (b2, w2) in itertools.product(zip(B, W), repeat=2):
            st = st0.copy()
            for v, frac in zip(inner, (b1, b2)):
                st.t[v] = st.t[st.parent[v]] * (1 - frac)
            total += w1 * w2 * np.exp(flat_root_loglik_direct(X, st, sigma2))
        post[topo] = np.exp(log_tmc_prior_linkage(Z)) * total
    zsum = sum(post.values())
    return {k: v / zsum for k, v in post.items()}


def topology_key(parent, ch, n):
    clades = set()

    def leaves(v):
        if ch[v, 0] < 0:
            return frozenset([int(v)])
        s = leaves(ch[v, 0]) | leaves(ch[v, 1])
        clades.add(s)
        return s

    root = int(np.flatnonzero(parent < 0)[0])
    leaves(root)
    return frozenset(clades)


def topo_clades(topo):
    clades = set()

    def rec(node):
        if isinstance(node, int):
            return frozenset([node])
        a, b = tuple(node)
        s = rec(a) | rec(b)
        clades.add(s)
        return s

    rec(topo)
    return frozenset(clades)


@pytest.mark.slow
def test_sampler_matches_exact_topology_posterior_n4():
    sigma2, a, b = 0.6, 2.0, 3.0
    exact = {topo_clades(k): v for k, v in exact_topology_posterior(X4, sigma2, a, b).items()}
    assert len(exact) == 15
    # quadrature converged: a coarser rule agrees to 1e-6
    coarse = {topo_clades(k): v for k, v in exact_topology_posterior(X4, sigma2, a, b, 40).items()}
    assert max(abs(exact[k] - coarse[k]) for k in exact) < 1e-6
    prior = {topo_clades(t): np.exp(log_tmc_prior_linkage(topo_to_linkage(t, 4)))
             for t in all_topologies(range(4))}

    n_keep = 30000
    model = TimeMarginalizedCoalescent(alpha=a, beta=b, sigma2=sigma2, sample_hyperparameters=False,
                                       n_sweeps=n_keep + 200, burn_in=200, random_state=11)
    model.fit(X4)
    counts = Counter(topology_key(s.parent, s.ch, 4) for s in model.samples_)
    freq = {k: counts.get(k, 0) / n_keep for k in exact}
    tv = 0.5 * sum(abs(freq[k] - exact[k]) for k in exact)
    # Expected TV of n_keep independent draws: 0.5 * sum_k sqrt(2 p_k (1 - p_k) / (pi n_keep))
    # (about 0.008 here); the chain resamples the topology nearly every sweep, so allowing 2.5x
    # that for autocorrelation gives 0.02. The posterior is far from the prior (TV > 0.1), so a
    # sampler ignoring the likelihood -- or using a wrong one -- fails the bound.
    expected_iid = 0.5 * sum(np.sqrt(2 * p * (1 - p) / (np.pi * n_keep)) for p in exact.values())
    assert expected_iid < 0.01
    assert 0.5 * sum(abs(prior[k] - exact[k]) for k in exact) > 0.1
    assert tv < 0.02, (tv, freq, exact)


def test_sampler_short_run_n4_is_close_to_exact_posterior():
    """A cheaper version of the stationary-distribution test for the default suite."""
    sigma2, a, b = 0.6, 2.0, 3.0
    exact = {topo_clades(k): v for k, v in exact_topology_posterior(X4, sigma2, a, b, 30).items()}
    n_keep = 6000
    model = TimeMarginalizedCoalescent(alpha=a, beta=b, sigma2=sigma2, sample_hyperparameters=False,
                                       n_sweeps=n_keep + 100, burn_in=100, random_state=5).fit(X4)
    counts = Counter(topology_key(s.parent, s.ch, 4) for s in model.samples_)
    tv = 0.5 * sum(abs(counts.get(k, 0) / n_keep - exact[k]) for k in exact)
    # expected iid TV is ~0.018 at 6000 draws; 0.045 allows 2.5x for autocorrelation
    assert tv < 0.045


# ------------------------------------------------------------------------------------------
# prediction
# ------------------------------------------------------------------------------------------


def test_tree_predictive_matches_brute_force_integral():
    rng = np.random.default_rng(7)
    n, d, sigma2, a, b = 5, 1, 0.9, 2.0, 2.5
    X = rng.normal(size=(n, d))
    st = random_state_tree(n, rng)
    nested = state_to_nested(st)
    base_ll = st.log_likelihood(X, sigma2)
    base_prior = st.log_prior(a, b)
    gx, gw = leggauss(64)
    for x_new in (-0.3, 1.7):
        Xa = np.vstack([X, [[x_new]]])
        num = den = 0.0
        for v in range(2 * n - 1):
            if v == st.root:
                continue
            lo, hi = st.t[v], st.t[st.parent[v]]
            target = state_to_nested(st, v)

            def weight(tt):
                full = nested_to_state(attach_nested(nested, target, n, tt), n + 1)
                return np.exp(full.log_prior(a, b) - base_prior), full

            def num_f(tt):
                w, full = weight(tt)
                return w * np.exp(full.log_likelihood(Xa, sigma2) - base_ll)

            num += integrate.quad(num_f, lo, hi, epsabs=1e-13, epsrel=1e-11)[0]
            den += integrate.quad(lambda tt: weight(tt)[0], lo, hi, epsabs=1e-13, epsrel=1e-11)[0]
        got = tree_predictive_log_density(st, X, np.array([[x_new]]), sigma2, a, b, gx, gw)[0]
        assert got == pytest.approx(np.log(num / den), abs=1e-6)


def test_predictive_density_is_normalised_and_prefers_data_region():
    rng = np.random.default_rng(8)
    X = np.concatenate([rng.normal(-3, 0.3, (6, 1)), rng.normal(3, 0.3, (6, 1))])
    model = TimeMarginalizedCoalescent(n_sweeps=30, burn_in=10, random_state=0).fit(X)
    # the mixture has very narrow components next to the data: refine the grid there
    near = (X[:, :1] + np.concatenate([-np.geomspace(1e-7, 2, 300), np.geomspace(1e-7, 2, 300)])[None, :]).ravel()
    grid = np.unique(np.concatenate([np.linspace(-60, 60, 12001), near]))
    dens = np.exp(model.predictive_log_density(grid[:, None], max_samples=3))
    assert integrate.simpson(dens, x=grid) == pytest.approx(1.0, abs=1e-6)
    lp = model.predictive_log_density(np.array([[-3.0], [3.0], [0.0], [12.0]]))
    assert lp[0] > lp[2] and lp[1] > lp[2] and lp[2] > lp[3]


# ------------------------------------------------------------------------------------------
# estimator behaviour
# ------------------------------------------------------------------------------------------


def test_fit_recovers_separated_clusters():
    rng = np.random.default_rng(9)
    centers = np.array([[0.0] * 5, [8.0] * 5, [0.0, 8.0, 0.0, 8.0, 0.0]])
    X = np.concatenate([c + rng.normal(size=(12, 5)) for c in centers])
    labels = np.repeat(np.arange(3), 12)
    model = TimeMarginalizedCoalescent(n_sweeps=40, burn_in=20, random_state=1).fit(X)
    clusters = {frozenset(c.tolist()) for c in model.dendrogram_.clusters_of()}
    for k in range(3):
        assert frozenset(np.flatnonzero(labels == k).tolist()) in clusters
    assert model.linkage_.shape == (35, 4)
    assert model.log_posterior_trace_.shape == (40,)
    assert np.all(np.isfinite(model.log_posterior_trace_))
    assert len(model.samples_) == 20
    assert model.alpha_ > 1 and model.beta_ > 1 and model.sigma2_ > 0
    # the representative is the highest-posterior retained state
    best = max(model.samples_, key=lambda s: s.log_posterior)
    np.testing.assert_allclose(best.to_dendrogram().linkage, model.linkage_)
    assert np.all(np.diff(model.dendrogram_.heights) >= 0) and model.dendrogram_.heights[-1] == 1.0


def test_fit_is_reproducible_and_keeps_tree_valid():
    rng = np.random.default_rng(10)
    X = rng.normal(size=(15, 3))
    m1 = TimeMarginalizedCoalescent(n_sweeps=8, burn_in=2, random_state=3).fit(X)
    m2 = TimeMarginalizedCoalescent(n_sweeps=8, burn_in=2, random_state=3).fit(X)
    np.testing.assert_array_equal(m1.log_posterior_trace_, m2.log_posterior_trace_)
    st = m1.state_
    for v in range(2 * 15 - 1):
        if v != st.root:
            assert st.t[st.parent[v]] > st.t[v]
    m = np.zeros_like(st.m)
    for v in np.argsort(st.t, kind="stable"):
        if st.ch[v, 0] >= 0:
            m[v] = m[st.ch[v, 0]] + m[st.ch[v, 1]] + 1
    np.testing.assert_array_equal(m, st.m)


def test_validation_errors():
    X = np.zeros((5, 2))
    with pytest.raises(ValueError, match="2-d"):
        TimeMarginalizedCoalescent().fit(np.zeros(5))
    with pytest.raises(ValueError, match="at least 2"):
        TimeMarginalizedCoalescent().fit(np.zeros((1, 2)))
    with pytest.raises(ValueError, match="NaN"):
        TimeMarginalizedCoalescent().fit(np.array([[0.0, np.nan], [1.0, 1.0]]))
    with pytest.raises(ValueError, match="exceed 1"):
        TimeMarginalizedCoalescent(alpha=0.5).fit(X)
    with pytest.raises(ValueError, match="n_sweeps"):
        TimeMarginalizedCoalescent(n_sweeps=0).fit(X)
    with pytest.raises(ValueError, match="sigma2_prior"):
        TimeMarginalizedCoalescent(sigma2_prior=(1.0, -1.0)).fit(X)
    with pytest.raises(ValueError, match="not fitted"):
        TimeMarginalizedCoalescent().predictive_log_density(X)
    model = TimeMarginalizedCoalescent(n_sweeps=2, burn_in=0, random_state=0).fit(
        np.random.default_rng(0).normal(size=(5, 2)))
    with pytest.raises(ValueError, match="features"):
        model.predictive_log_density(np.zeros((3, 4)))


# ------------------------------------------------------------------------------------------
# the full sampler (tree, times, sigma2, alpha, beta) on n = 3
# ------------------------------------------------------------------------------------------

X3 = np.array([[0.0, 0.3], [0.6, -0.1], [1.6, 1.0]])


def exact_joint_n3(X, s2_prior, ab_prior, n_nodes):
    """Posterior over the 3 topologies and posterior means of sigma2 and alpha, with every
    hyperparameter integrated: sigma2 in closed form (conjugate), the branch fraction and
    alpha, beta by Gauss-Legendre quadrature (alpha - 1, beta - 1 in prior-quantile coordinates).
    """
    n, d = X.shape
    k = (n - 1) * d / 2
    a0, b0 = s2_prior
    gx, gw = leggauss(n_nodes)
    u, w = 0.5 * (gx + 1), 0.5 * gw
    ab = 1.0 + stats.gamma(ab_prior[0], scale=1 / ab_prior[1]).ppf(u)
    Bq = u
    mass = {}
    s2_mean = {}
    alpha_mean = {}
    for topo in all_topologies(range(n)):
        Z = topo_to_linkage(topo, n)
        st = TreeState.from_linkage(Z)
        inner = [v for v in range(n, 2 * n - 1) if v != st.root][0]
        m0 = m1 = m2 = 0.0
        for Bv, wB in zip(Bq, w):
            st.t[inner] = 1.0 - Bv
            L1 = flat_root_loglik_direct(X, st, 1.0)
            L2 = flat_root_loglik_direct(X, st, 2.0)
            ssq = 4.0 * (L2 - L1 + k * log(2.0))
            # integral over sigma2 of IG(a0, b0) x likelihood
            lm = (L1 + ssq / 2 + a0 * log(b0) - lgamma(a0) + lgamma(a0 + k) - (a0 + k) * log(b0 + ssq / 2))
            s2m = (b0 + ssq / 2) / (a0 + k - 1)
            beta_pdf = stats.beta.pdf(Bv, ab[:, None], ab[None, :])  # alpha rows, beta columns
            ww = wB * np.exp(lm) * (w[:, None] * w[None, :]) * beta_pdf
            m0 += ww.sum()
            m1 += ww.sum() * s2m
            m2 += (ww.sum(axis=1) * ab).sum()
        mass[topo_clades(topo)] = np.exp(log_tmc_prior_linkage(Z)) * m0
        s2_mean[topo_clades(topo)] = np.exp(log_tmc_prior_linkage(Z)) * m1
        alpha_mean[topo_clades(topo)] = np.exp(log_tmc_prior_linkage(Z)) * m2
    total = sum(mass.values())
    return ({t: v / total for t, v in mass.items()}, sum(s2_mean.values()) / total,
            sum(alpha_mean.values()) / total)


@pytest.mark.slow
def test_full_sampler_with_hyperparameters_matches_exact_joint_n3():
    s2_prior, ab_prior = (3.0, 1.0), (2.0, 1.0)
    post, s2_mean, a_mean = exact_joint_n3(X3, s2_prior, ab_prior, 48)
    post_c, s2_c, a_c = exact_joint_n3(X3, s2_prior, ab_prior, 32)
    assert max(abs(post[t] - post_c[t]) for t in post) < 1e-5
    # quadrature error (alpha's heavy prior tail converges slowest) is far below the MC error
    assert s2_mean == pytest.approx(s2_c, rel=1e-5) and a_mean == pytest.approx(a_c, rel=1e-3)
    n_keep = 20000
    model = TimeMarginalizedCoalescent(alpha=2.0, beta=2.0, n_sweeps=n_keep + 200, burn_in=200,
                                       sigma2_prior=s2_prior, alpha_beta_prior=ab_prior,
                                       random_state=4).fit(X3)
    counts = Counter(topology_key(s.parent, s.ch, 3) for s in model.samples_)
    tv = 0.5 * sum(abs(counts.get(t, 0) / n_keep - p) for t, p in post.items())
    s2 = np.array([s.sigma2 for s in model.samples_])
    al = np.array([s.alpha for s in model.samples_])
    # Monte Carlo standard errors from batch means (50 batches), bounds at 4 standard errors
    def mcse(x):
        return x.reshape(50, -1).mean(axis=1).std(ddof=1) / np.sqrt(50)

    assert abs(s2.mean() - s2_mean) < 4 * mcse(s2), (s2.mean(), s2_mean, mcse(s2))
    assert abs(al.mean() - a_mean) < 4 * mcse(al), (al.mean(), a_mean, mcse(al))
    # expected iid TV with 3 categories and 20000 draws is ~0.004; 0.015 allows autocorrelation
    assert tv < 0.015, (tv, post, counts)
