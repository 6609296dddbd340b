"""Tests of Kingman's coalescent clustering against exact answers on tiny problems."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from scipy import integrate, optimize
from scipy.cluster.hierarchy import is_monotonic, is_valid_linkage
from sklearn.exceptions import NotFittedError

import streamtree  # noqa: F401
from streamtree.static import KingmanCoalescent
from streamtree.static.coalescent import llr_flat_clusters
from streamtree.static.coalescent_hyper import (
    brownian_log_objective,
    brownian_map_update,
    mutation_newton_update,
    mutation_site_loglik,
)
from streamtree.static.coalescent_inference import smc, upward
from streamtree.static.coalescent_messages import BrownianMessages, MutationMessages
from streamtree.static.dendrogram import Dendrogram

THREE = np.array([-3.1416, 2.1718, 1.618])
# Tests against exact answers for given hyperparameters pass n_hyper_iter=0: the estimator
# re-estimates them by default.


# --------------------------------------------------------------------------- helpers
def random_tree(n: int, rng: np.random.Generator):
    """A draw from the n-coalescent: merges in SciPy numbering and heights."""
    ids = list(range(n))
    left, right, heights = [], [], []
    h = 0.0
    for k in range(n - 1):
        m = len(ids)
        h += rng.exponential(1.0 / (m * (m - 1) / 2))
        i, j = sorted(rng.choice(m, size=2, replace=False))
        left.append(ids[i])
        right.append(ids[j])
        heights.append(h)
        del ids[j], ids[i]
        ids.append(n + k)
    return np.array(left), np.array(right), np.array(heights)


def lca_heights(left, right, heights, n):
    """Matrix of the height of the most recent common ancestor of each pair of leaves."""
    members = [{i} for i in range(n)]
    H = np.zeros((n, n))
    for k in range(n - 1):
        A, B = members[left[k]], members[right[k]]
        for i in A:
            for j in B:
                H[i, j] = H[j, i] = heights[k]
        members.append(A | B)
    return H


def flat_root_log_density(x: np.ndarray, C: np.ndarray) -> float:
    """log of the integral over a flat root value y of N(x; y 1, C)."""
    k = x.size
    Ci = np.linalg.inv(C)
    one = np.ones(k)
    a, b, c = one @ Ci @ one, one @ Ci @ x, x @ Ci @ x
    return float(-0.5 * (k - 1) * math.log(2 * math.pi) - 0.5 * np.linalg.slogdet(C)[1] - 0.5 * math.log(a)
                 - 0.5 * (c - b * b / a))


def direct_brownian_loglik(X, left, right, heights, lam):
    """log p(X | tree) from the multivariate normal of the observed leaves, dimension by dimension."""
    n = X.shape[0]
    H = lca_heights(left, right, heights, n)
    root = heights[-1]
    C = root - H
    np.fill_diagonal(C, root)
    tot = 0.0
    for d in range(X.shape[1]):
        o = ~np.isnan(X[:, d])
        tot += flat_root_log_density(X[o, d], lam[d] * C[np.ix_(o, o)])
    return tot


def _flat_root_density3(x, C):
    """flat_root_log_density for 3 points in plain floats (cofactor inverse), exponentiated."""
    (a, b, c), (_, e, f), (_, _, i) = C
    A, B, Cc = e * i - f * f, -(b * i - c * f), b * f - c * e
    E, F, I = a * i - c * c, -(a * f - b * c), a * e - b * b
    det = a * A + b * B + c * Cc
    inv = ((A, B, Cc), (B, E, F), (Cc, F, I))
    one_inv_one = sum(sum(r) for r in inv) / det
    one_inv_x = sum(inv[r][k] * x[k] for r in range(3) for k in range(3)) / det
    x_inv_x = sum(x[r] * inv[r][k] * x[k] for r in range(3) for k in range(3)) / det
    return math.exp(-0.5 * (x_inv_x - one_inv_x**2 / one_inv_one)) / (2 * math.pi * math.sqrt(det * one_inv_one))


def three_point_integrand(x, lam=1.0):
    """exp(-3 d1 - d2) * sum over the 3 topologies of p(x | tree), via leaf covariances."""
    xs = [float(v) for v in x]

    def integrand(d2, d1):
        tot = 0.0
        for i, j in ((0, 1), (0, 2), (1, 2)):
            C = [[0.0] * 3 for _ in range(3)]  # root height minus LCA height
            C[i][j] = C[j][i] = lam * d2
            for k in range(3):
                C[k][k] = lam * (d1 + d2)
            tot += _flat_root_density3(xs, C)
        return math.exp(-3.0 * d1 - d2) * tot  # rates C(3,2) = 3 then C(2,2) = 1, pair prob 1/3

    return integrand


def exact_three_point_marginal(x: np.ndarray, lam: float = 1.0) -> float:
    """p(x) for three 1-D points: sum over the 3 topologies, integral over both durations."""
    val, _ = integrate.dblquad(three_point_integrand(x, lam), 0, np.inf, 0, np.inf, epsabs=1e-15, epsrel=1e-10)
    return val


def brute_force_mutation_loglik(X, left, right, heights, lam, q):
    """log p(X | tree) by summing over every assignment of internal (and missing leaf) states."""
    n, D = X.shape
    K = q.shape[1]
    hgt = np.concatenate([np.zeros(n), heights])
    parent = {}
    for k in range(n - 1):
        parent[int(left[k])] = n + k
        parent[int(right[k])] = n + k
    root = 2 * n - 2
    total = 0.0
    for d in range(D):
        free = [v for v in range(n, 2 * n - 1)] + [i for i in range(n) if np.isnan(X[i, d])]
        site = 0.0
        for states in itertools.product(range(K), repeat=len(free)):
            s = {v: st for v, st in zip(free, states)}
            for i in range(n):
                if not np.isnan(X[i, d]):
                    s[i] = int(X[i, d])
            p = q[d, s[root]]
            for c, par in parent.items():
                e = math.exp(-lam[d] * (hgt[par] - hgt[c]))
                p *= e * (s[c] == s[par]) + (1 - e) * q[d, s[c]]
            site += p
        total += math.log(site) if site > 0 else -math.inf
    return total


# --------------------------------------------------------------------------- exact marginal
@pytest.fixture(scope="module")
def three_point_exact():
    return exact_three_point_marginal(THREE)


def test_three_point_exact_marginal_matches_message_passing(three_point_exact):
    # The supplement plots errors against the exact value but does not print it. We check the
    # integrand built from leaf covariances against the upward messages, and the integral
    # against the general flat-root formula.
    alg = BrownianMessages(np.ones(1))
    X = THREE[:, None]
    direct = three_point_integrand(THREE)
    rng = np.random.default_rng(0)
    for d1, d2 in rng.exponential(0.7, size=(25, 2)):
        tot = 0.0
        for i, j in ((0, 1), (0, 2), (1, 2)):
            k = 3 - i - j
            tree = upward(alg, X, [i, k], [j, 3], [d1, d1 + d2])
            tot += math.exp(tree.log_z.sum())
            C = np.zeros((3, 3))
            C[i, j] = C[j, i] = d2
            np.fill_diagonal(C, d1 + d2)
            assert tree.log_z.sum() == pytest.approx(flat_root_log_density(THREE, C), rel=1e-10)
        assert math.exp(-3 * d1 - d2) * tot == pytest.approx(direct(d2, d1), rel=1e-10)
    assert three_point_exact == pytest.approx(math.exp(-7.644160659570804), rel=1e-7)


@pytest.mark.parametrize("proposal,S,rel", [("priorprior", 20000, 0.08), ("priorpost", 8000, 0.08),
                                            ("postpost", 4000, 0.05)])
def test_smc_estimators_converge_to_exact_marginal(three_point_exact, proposal, S, rel):
    alg = BrownianMessages(np.ones(1))
    res = smc(alg, THREE[:, None], proposal, S, np.random.default_rng(7), resample=False)
    est = math.exp(res.log_marginal)
    w = S * est * np.exp(res.log_weights)  # per-particle unbiased weights (no resampling)
    se = w.std() / math.sqrt(S)
    assert abs(est - three_point_exact) < 4 * se
    assert abs(est / three_point_exact - 1) < rel


@pytest.mark.parametrize("method", ["smc-priorprior", "smc-priorpost", "smc-postpost"])
def test_smc_estimator_api_mean_over_seeds(three_point_exact, method):
    # With resampling active the estimate of p(x) stays unbiased: average it over seeds and
    # compare within four standard errors of that average (and 12% at most).
    ests = np.array([math.exp(KingmanCoalescent(n_hyper_iter=0, method=method, n_particles=2000, random_state=s)
                              .fit(THREE[:, None]).log_likelihood_) for s in range(10)])
    se = ests.std(ddof=1) / math.sqrt(ests.size)
    assert abs(ests.mean() - three_point_exact) < 4 * se + 1e-12
    assert abs(ests.mean() / three_point_exact - 1) < 0.12


MUT_X = np.array([[0.0, 1.0], [0.0, np.nan], [1.0, 1.0]])


def mutation_three_point_alg():
    return MutationMessages(np.array([0.8, 1.5]), np.array([[0.6, 0.4], [0.3, 0.7]]))


@pytest.fixture(scope="module")
def mutation_three_point_exact():
    # the per-tree likelihood is the upward pass, checked against brute-force enumeration above
    alg, X = mutation_three_point_alg(), MUT_X
    const = alg.leaf_log_const(X)

    def integrand(d2, d1):
        tot = 0.0
        for i, j in ((0, 1), (0, 2), (1, 2)):
            tree = upward(alg, X, [i, 3 - i - j], [j, 3], [d1, d1 + d2])
            tot += math.exp(tree.log_z.sum() + const)
        return math.exp(-3.0 * d1 - d2) * tot

    return integrate.dblquad(integrand, 0, np.inf, 0, np.inf, epsabs=1e-12, epsrel=1e-8)[0]


@pytest.mark.parametrize("proposal,S", [("priorprior", 20000), ("priorpost", 8000), ("postpost", 4000)])
def test_smc_mutation_process_converges_to_exact_marginal(mutation_three_point_exact, proposal, S):
    # three binary points on two sites, one entry missing
    res = smc(mutation_three_point_alg(), MUT_X, proposal, S, np.random.default_rng(3), resample=False)
    est = math.exp(res.log_marginal)
    w = S * est * np.exp(res.log_weights)
    se = w.std() / math.sqrt(S)
    assert abs(est - mutation_three_point_exact) < 4 * se
    assert abs(est / mutation_three_point_exact - 1) < 0.05


def test_smc_reproducible_and_resamples():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(25, 2))
    a = KingmanCoalescent(n_hyper_iter=0, method="smc-priorpost", n_particles=20, random_state=11).fit(X)
    b = KingmanCoalescent(n_hyper_iter=0, method="smc-priorpost", n_particles=20, random_state=11).fit(X)
    np.testing.assert_array_equal(a.linkage_, b.linkage_)
    assert a.log_likelihood_ == b.log_likelihood_
    assert a.n_resample_ > 0
    c = KingmanCoalescent(n_hyper_iter=0, method="smc-priorpost", n_particles=20, random_state=12).fit(X)
    assert c.log_likelihood_ != a.log_likelihood_


# --------------------------------------------------------------------------- messages
def test_brownian_messages_match_direct_mvn():
    rng = np.random.default_rng(0)
    n, D = 7, 3
    X = rng.normal(size=(n, D)) * 2
    X[rng.random((n, D)) < 0.3] = np.nan
    X[0] = [0.1, np.nan, 1.0]
    X[:, 2] = np.where(np.isnan(X[:, 2]), 0.3, X[:, 2])
    lam = np.array([0.5, 2.0, 1.3])
    left, right, heights = random_tree(n, rng)
    tree = upward(BrownianMessages(lam), X, left, right, heights)
    assert tree.log_z.sum() == pytest.approx(direct_brownian_loglik(X, left, right, heights, lam), rel=1e-10)


@pytest.mark.parametrize("K,n", [(2, 3), (2, 4), (3, 4)])
def test_mutation_messages_match_brute_force(K, n):
    rng = np.random.default_rng(K * 10 + n)
    D = 2
    X = rng.integers(K, size=(n, D)).astype(float)
    X[1, 0] = np.nan
    lam = np.array([0.7, 1.9])
    q = rng.dirichlet(np.ones(K), size=D)
    left, right, heights = random_tree(n, rng)
    alg = MutationMessages(lam, q)
    tree = upward(alg, X, left, right, heights)
    msg = tree.log_z.sum() + alg.leaf_log_const(X)
    assert msg == pytest.approx(brute_force_mutation_loglik(X, left, right, heights, lam, q), rel=1e-10)
    assert mutation_site_loglik(X, tree, lam, q).sum() == pytest.approx(msg, rel=1e-10)


def test_pair_optimum_brownian_closed_form_and_missing():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(4, 5))
    X[0, 1] = np.nan  # makes the per-dimension variances of the merged node unequal
    lam = np.array([1.0, 0.5, 2.0, 1.0, 3.0])
    alg = BrownianMessages(lam)
    tree = upward(alg, X, [0, 2], [1, 3], [0.3, 0.45])
    for a, b, rate, floor in [(4, 5, 1.0, 0.0), (4, 5, 3.0, 0.6), (0, 1, 6.0, 0.0), (4, 2, 1.0, 0.5)]:
        (h,), _ = alg.opt_pairs(tree.msgs, tree.hgt, np.array([a]), np.array([b]), rate, floor)
        lb = max(tree.hgt[a], tree.hgt[b], floor)

        def neg(hh):
            return -(-rate * (hh - lb) + alg.logz_pairs(tree.msgs, tree.hgt, np.array([a]), np.array([b]),
                                                         np.array([hh]))[0])

        ref = optimize.minimize_scalar(neg, bounds=(lb + 1e-9, lb + 50), method="bounded",
                                       options={"xatol": 1e-12})
        assert neg(h) <= ref.fun + 1e-9
        assert h >= lb


def test_pair_optimum_mutation():
    rng = np.random.default_rng(2)
    X = rng.integers(2, size=(4, 6)).astype(float)
    X[2, :2] = np.nan
    alg = MutationMessages(np.full(6, 0.8), np.full((6, 2), 0.5))
    tree = upward(alg, X, [0, 2], [1, 3], [0.2, 0.3])
    for a, b, rate, floor in [(0, 1, 1.0, 0.0), (4, 5, 1.0, 0.3), (4, 5, 10.0, 0.35)]:
        (h,), _ = alg.opt_pairs(tree.msgs, tree.hgt, np.array([a]), np.array([b]), rate, floor)
        lb = max(tree.hgt[a], tree.hgt[b], floor)

        def neg(hh):
            return -(-rate * (hh - lb) + alg.logz_pairs(tree.msgs, tree.hgt, np.array([a]), np.array([b]),
                                                         np.array([hh]))[0])

        grid = lb + np.linspace(1e-9, 20, 20001)
        vals = -rate * (grid - lb) + alg.logz_pairs(tree.msgs, tree.hgt, np.full(grid.size, a),
                                                    np.full(grid.size, b), grid)
        assert neg(h) <= -vals.max() + 1e-7


# --------------------------------------------------------------------------- greedy
@pytest.mark.parametrize("method", ["greedy-rate1", "greedy-maxprob", "greedy-minduration"])
@pytest.mark.parametrize("likelihood", ["brownian", "binary", "multinomial"])
def test_greedy_returns_valid_trees(method, likelihood):
    rng = np.random.default_rng(5)
    n, D = 40, 6
    if likelihood == "brownian":
        X = rng.normal(size=(n, D))
        X[:10] = X[10:20]  # exact duplicates must not break anything
    else:
        X = rng.integers(2 if likelihood == "binary" else 4, size=(n, D)).astype(float)
    X[rng.random((n, D)) < 0.25] = np.nan
    X[0] = np.nan
    X[0, 0] = 1.0
    est = KingmanCoalescent(n_hyper_iter=0, likelihood=likelihood, method=method).fit(X)
    Z = est.linkage_
    assert is_valid_linkage(Z) and is_monotonic(Z)
    # (a pair sharing no observed feature has its optimum at duration 0)
    assert np.all(np.diff(est.coalescent_times_) >= 0) and est.coalescent_times_[0] >= 0
    assert sorted(est.dendrogram_.leaves_order()) == list(range(n))
    assert np.all(np.isfinite(est.dendrogram_.stats["log_z"]))
    assert np.isfinite(est.log_likelihood_) and np.isfinite(est.log_joint_)
    assert est.labels_.shape == (n,) and est.labels_.min() == 0


def test_greedy_log_likelihood_is_that_of_its_tree():
    rng = np.random.default_rng(9)
    X = rng.normal(size=(15, 3))
    X[rng.random(X.shape) < 0.2] = np.nan
    lam = np.array([0.5, 1.0, 2.0])
    est = KingmanCoalescent(n_hyper_iter=0, diffusion_variance=lam).fit(X)
    Z = est.linkage_
    direct = direct_brownian_loglik(X, Z[:, 0].astype(int), Z[:, 1].astype(int), Z[:, 2], lam)
    assert est.log_likelihood_ == pytest.approx(direct, rel=1e-9)


def test_greedy_rate1_recovers_separated_clusters_and_llr_labels():
    rng = np.random.default_rng(4)
    centers = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    y = np.repeat(np.arange(3), 15)
    X = centers[y] + 0.03 * rng.normal(size=(45, 2))
    est = KingmanCoalescent(n_hyper_iter=0).fit(X)
    # the three clusters are the three last merges' subtrees
    tops = est.dendrogram_.clusters_of()[-3:-1]
    for members in tops:
        assert len(set(y[members])) == 1 or len(members) == 30
    from sklearn.metrics import adjusted_rand_score

    assert adjusted_rand_score(y, est.labels_) == 1.0


def test_llr_rule_on_hand_built_tree():
    # ((0,1),(2,3)) then root; LLRs: merge0 = +1, merge1 = -1, root = -2
    d = Dendrogram.from_merges([0, 2, 4], [1, 3, 5], [0.1, 0.2, 0.5], 4)
    assert llr_flat_clusters(d, np.array([1.0, -1.0, -2.0])).tolist() == [0, 0, 1, 2]
    assert llr_flat_clusters(d, np.array([1.0, -1.0, 3.0])).tolist() == [0, 0, 0, 0]
    assert llr_flat_clusters(d, np.array([1.0, 2.0, -2.0]), threshold=1.5).tolist() == [0, 1, 2, 2]


# --------------------------------------------------------------------------- hyperparameters
def test_brownian_map_update_is_exact_maximiser_and_increases_objective():
    rng = np.random.default_rng(6)
    X = rng.normal(size=(30, 3)) * np.array([0.5, 1.0, 3.0])
    X[rng.random(X.shape) < 0.2] = np.nan
    lam0 = np.ones(3)
    alg = BrownianMessages(lam0)
    from streamtree.static.coalescent_inference import greedy_rate1

    tree = greedy_rate1(alg, X)
    a, b = 1.1, 1.1
    lam1 = brownian_map_update(tree, a, b)
    assert brownian_log_objective(tree, lam1, a, b) > brownian_log_objective(tree, lam0, a, b)
    for d in range(3):
        def neg(loglam, d=d):
            lam = lam1.copy()
            lam[d] = math.exp(loglam)
            return -brownian_log_objective(tree, lam, a, b)

        ref = optimize.minimize_scalar(neg, bounds=(-8, 8), method="bounded", options={"xatol": 1e-10})
        assert math.log(lam1[d]) == pytest.approx(ref.x, abs=1e-5)
    # the objective used by the estimator's history is non-decreasing in the Lambda steps
    est = KingmanCoalescent(n_hyper_iter=4).fit(X)
    assert est.objective_history_[-1] > est.objective_history_[0]


def simulate_brownian_coalescent(n, lam, rng, tree=None):
    left, right, heights = random_tree(n, rng) if tree is None else tree
    D = lam.size
    val = {2 * n - 2: np.zeros(D)}
    hgt = np.concatenate([np.zeros(n), heights])
    for k in range(n - 2, -1, -1):
        p = n + k
        for c in (left[k], right[k]):
            val[c] = val[p] + rng.normal(size=D) * np.sqrt(lam * (hgt[p] - hgt[c]))
    return np.array([val[i] for i in range(n)])


def test_hyperparameter_reestimation_recovers_lambda():
    rng = np.random.default_rng(8)
    lam = np.array([0.2, 5.0])
    n = 300
    left, right, heights = random_tree(n, rng)
    X = simulate_brownian_coalescent(n, lam, rng, tree=(left, right, heights))
    # given the generating tree the conditional MAP recovers Lambda
    true_tree = upward(BrownianMessages(np.ones(2)), X, left, right, heights)
    ratio = brownian_map_update(true_tree, 1.1, 1.1) / lam
    assert np.all((ratio > 0.85) & (ratio < 1.15)), ratio
    # alternating with Greedy-Rate1 trees from an isotropic start moves towards the true
    # anisotropy and raises the objective (the overall scale is only weakly identified)
    est = KingmanCoalescent(n_hyper_iter=10).fit(X)
    lr = np.log(est.diffusion_variance_[1] / est.diffusion_variance_[0])
    assert 0.5 * np.log(lam[1] / lam[0]) < lr < 1.5 * np.log(lam[1] / lam[0])
    assert est.objective_history_[-1] > est.objective_history_[0]


def test_binary_newton_update_maximises_site_likelihood():
    rng = np.random.default_rng(10)
    X = (rng.random((40, 4)) < np.array([0.2, 0.5, 0.7, 0.4])).astype(float)
    X[:20, 0] = 1.0  # a clade-like pattern makes the rate identifiable
    X[rng.random(X.shape) < 0.1] = np.nan
    lam0, q0 = np.ones(4), np.full((4, 2), 0.5)
    alg = MutationMessages(lam0, q0)
    from streamtree.static.coalescent_inference import greedy_rate1

    tree = greedy_rate1(alg, X)
    lam1, q1 = mutation_newton_update(X, tree, lam0, q0, n_steps=12)
    f0 = mutation_site_loglik(X, tree, lam0, q0)
    f1 = mutation_site_loglik(X, tree, lam1, q1)
    assert np.all(f1 >= f0 - 1e-12)
    for d in range(4):
        def neg(th, d=d):
            lam = lam1.copy()
            q = q1.copy()
            lam[d] = math.exp(th[1])
            q[d, 1] = 1 / (1 + math.exp(-th[0]))
            q[d, 0] = 1 - q[d, 1]
            return -mutation_site_loglik(X, tree, lam, q)[d]

        ref = optimize.minimize(neg, [0.0, 0.0], method="Nelder-Mead", options={"xatol": 1e-8, "fatol": 1e-10})
        assert -f1[d] <= ref.fun + 1e-5


def test_binary_hyper_iterations_increase_objective():
    rng = np.random.default_rng(12)
    X = (rng.random((30, 5)) < 0.3).astype(float)
    est = KingmanCoalescent(likelihood="binary", n_hyper_iter=3).fit(X)
    assert est.objective_history_[-1] > est.objective_history_[0]
    assert est.mutation_rate_.shape == (5,) and est.base_distribution_.shape == (5, 2)


# --------------------------------------------------------------------------- prediction
def test_brownian_predictive_density_integrates_to_one():
    rng = np.random.default_rng(13)
    X = rng.normal(size=(6, 1)) * 2
    est = KingmanCoalescent(n_hyper_iter=0).fit(X)
    with warnings.catch_warnings():
        # the density has kinks at the data points (leaf branches start there), which makes
        # QUADPACK report round-off; the accuracy asserted below is what matters
        warnings.simplefilter("ignore", integrate.IntegrationWarning)
        total, _ = integrate.quad(lambda y: math.exp(est.predictive_log_density([[y]])[0]), -40, 40, limit=400,
                                  epsabs=1e-7, epsrel=1e-7, points=sorted(X[:, 0]))
    assert total == pytest.approx(1.0, abs=2e-4)


def test_brownian_predictive_matches_three_point_marginal():
    # p(x1, x2, y) = int p(x1, x2, tree) p(y | x1, x2, tree) d tree for the 2-point trees
    x = THREE[:2]
    y = THREE[2]
    est = KingmanCoalescent(n_hyper_iter=0).fit(x[:, None])
    alg = BrownianMessages(np.ones(1))

    def integrand(d):
        est._tree = upward(alg, x[:, None], [0], [1], [d])
        est.__dict__.pop("_down", None)
        est.__dict__.pop("_attach", None)
        return math.exp(-d + est._tree.log_z.sum() + est.predictive_log_density([[y]])[0])

    val, _ = integrate.quad(integrand, 0, np.inf, epsabs=1e-12, epsrel=1e-7, limit=200)
    assert val == pytest.approx(exact_three_point_marginal(THREE), rel=1e-4)


def test_discrete_predictive_sums_to_one():
    rng = np.random.default_rng(14)
    X = rng.integers(3, size=(7, 3)).astype(float)
    X[1, 2] = np.nan
    est = KingmanCoalescent(n_hyper_iter=0, likelihood="multinomial").fit(X)
    Y = np.array(list(itertools.product(range(3), repeat=3)), dtype=float)
    assert np.exp(est.predictive_log_density(Y)).sum() == pytest.approx(1.0, abs=1e-6)
    # marginalising a coordinate out equals summing over it
    part = np.exp(est.predictive_log_density([[0.0, 1.0, np.nan]]))[0]
    assert part == pytest.approx(np.exp(est.predictive_log_density(Y[(Y[:, 0] == 0) & (Y[:, 1] == 1)])).sum(), rel=1e-9)


def test_impute_brownian_is_gaussian_conditional_mean():
    rng = np.random.default_rng(15)
    X = rng.normal(size=(6, 2))
    X[2, 0] = np.nan
    X[4, 1] = np.nan
    est = KingmanCoalescent(n_hyper_iter=0).fit(X)
    Z = est.linkage_
    H = lca_heights(Z[:, 0].astype(int), Z[:, 1].astype(int), Z[:, 2], 6)
    root = Z[-1, 2]
    C = root - H
    np.fill_diagonal(C, root)
    big = 1e7  # a very wide root prior approximates the flat one
    for i, d in [(2, 0), (4, 1)]:
        o = ~np.isnan(X[:, d])
        S = C + big
        mean = S[i, o] @ np.linalg.solve(S[np.ix_(o, o)], X[o, d])
        assert est.impute()[i, d] == pytest.approx(mean, abs=1e-5)
    filled = est.impute()
    assert not np.isnan(filled).any()
    np.testing.assert_array_equal(filled[~np.isnan(X)], X[~np.isnan(X)])
    np.testing.assert_array_equal(est.impute(X), filled)
    new = est.impute([[X[0, 0], np.nan]])
    assert np.isfinite(new).all()


def test_impute_new_row_is_predictive_conditional_mean():
    rng = np.random.default_rng(17)
    X = rng.normal(size=(6, 2))
    est = KingmanCoalescent(n_hyper_iter=0, diffusion_variance=[0.7, 1.6]).fit(X)
    y0 = 0.4

    def dens(y1):
        return math.exp(est.predictive_log_density([[y0, y1]])[0])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", integrate.IntegrationWarning)
        pts = sorted(X[:, 1])
        norm, _ = integrate.quad(dens, -30, 30, points=pts, limit=400)
        first, _ = integrate.quad(lambda v: v * dens(v), -30, 30, points=pts, limit=400)
    marg = math.exp(est.predictive_log_density([[y0, np.nan]])[0])
    assert norm == pytest.approx(marg, rel=1e-4)
    assert est.impute([[y0, np.nan]])[0, 1] == pytest.approx(first / norm, abs=1e-4)


def test_impute_discrete_is_brute_force_mode():
    rng = np.random.default_rng(16)
    X = rng.integers(3, size=(4, 2)).astype(float)
    X[0, 1] = np.nan
    est = KingmanCoalescent(n_hyper_iter=0, likelihood="multinomial", n_states=3).fit(X)
    Z = est.linkage_
    lam, q = est.mutation_rate_, est.base_distribution_
    scores = []
    for k in range(3):
        Xk = X.copy()
        Xk[0, 1] = k
        scores.append(brute_force_mutation_loglik(Xk, Z[:, 0].astype(int), Z[:, 1].astype(int), Z[:, 2], lam, q))
    assert est.impute()[0, 1] == int(np.argmax(scores))


# --------------------------------------------------------------------------- validation
def test_validation_errors():
    with pytest.raises(ValueError, match="unobserved in every sample"):
        KingmanCoalescent().fit([[1.0, np.nan], [2.0, np.nan]])
    with pytest.raises(ValueError, match="2-dimensional"):
        KingmanCoalescent().fit([1.0, 2.0])
    with pytest.raises(ValueError, match="states must lie"):
        KingmanCoalescent(likelihood="binary").fit([[0.0], [2.0]])
    with pytest.raises(ValueError, match="states must lie"):
        KingmanCoalescent(likelihood="multinomial", n_states=3).fit([[0.0], [3.0]])
    with pytest.raises(ValueError, match="integer"):
        KingmanCoalescent(likelihood="multinomial").fit([[0.5], [1.0]])
    with pytest.raises(ValueError, match="method"):
        KingmanCoalescent(method="greedy").fit([[0.0], [1.0]])
    with pytest.raises(ValueError, match="at least 2"):
        KingmanCoalescent().fit([[0.0]])
    with pytest.raises(ValueError, match="diffusion_variance"):
        KingmanCoalescent(diffusion_variance=[1.0, 2.0]).fit([[0.0], [1.0]])
    with pytest.raises(NotFittedError, match="not fitted"):
        KingmanCoalescent().impute()
    est = KingmanCoalescent().fit([[0.0, 1.0], [1.0, 2.0]])
    with pytest.raises(ValueError, match="features"):
        est.predictive_log_density([[0.0]])


# --------------------------------------------------------------------------- quality
def test_digits_purity_against_agglomerative_baselines():
    """Dendrogram purity on scikit-learn's 8x8 digits, the paper's MNIST protocol at small scale:
    20 examples per digit, 20 PCA dimensions, Greedy-Rate1 with up to 10 hyperparameter rounds,
    averaged over 5 random subsets.

    Measured (10 subsets): coalescent 0.681, average linkage 0.725, Ward 0.713, single 0.673,
    complete 0.607. With this one global scale (X / X.std()) the principal components keep their
    relative variances, which average linkage exploits; the paper's MNIST ordering (coalescent
    above average linkage) does not hold here, so we assert the orderings that do: above complete
    linkage, and within 10% of average linkage. Standardised per feature, the coalescent is
    above average linkage (next test).
    """
    from scipy.cluster.hierarchy import linkage
    from sklearn.datasets import load_digits
    from sklearn.decomposition import PCA

    from streamtree.static.metrics import dendrogram_purity

    digits = load_digits()
    res = []
    for seed in range(5):
        rng = np.random.default_rng(seed)
        idx = np.concatenate([rng.choice(np.flatnonzero(digits.target == c), 20, replace=False) for c in range(10)])
        X = PCA(20, random_state=0).fit_transform(digits.data[idx])
        X = X / X.std()
        y = digits.target[idx]
        coal = KingmanCoalescent(n_hyper_iter=10).fit(X)
        res.append([dendrogram_purity(coal.linkage_, y), dendrogram_purity(linkage(X, "average"), y),
                    dendrogram_purity(linkage(X, "complete"), y)])
    p_coal, p_avg, p_complete = np.mean(res, axis=0)
    print(f"digits purity: coalescent {p_coal:.4f}, average {p_avg:.4f}, complete {p_complete:.4f}")
    assert p_coal > p_complete
    assert p_coal > 0.9 * p_avg


def test_digits_purity_at_defaults_at_or_above_average_linkage():
    """The MNIST protocol of the paper on scikit-learn's 8x8 digits, at the defaults: 20 examples
    per digit, 20 PCA dimensions standardised per feature, mean over 5 random subsets.

    Measured (bench/bench_coalescent.py, 20 subsets): defaults 0.678 +- 0.047, average linkage
    0.551 +- 0.055, fixed unit diffusion variance (the former default) 0.512 +- 0.044.
    """
    from scipy.cluster.hierarchy import linkage
    from sklearn.datasets import load_digits
    from sklearn.decomposition import PCA

    from streamtree.static.metrics import dendrogram_purity

    digits = load_digits()
    res = []
    for seed in range(5):
        rng = np.random.default_rng(seed)
        idx = np.concatenate([rng.choice(np.flatnonzero(digits.target == c), 20, replace=False) for c in range(10)])
        X = PCA(20, random_state=0).fit_transform(digits.data[idx])
        X = (X - X.mean(axis=0)) / X.std(axis=0)
        y = digits.target[idx]
        res.append([dendrogram_purity(KingmanCoalescent().fit(X).linkage_, y),
                    dendrogram_purity(linkage(X, "average"), y)])
    p_coal, p_avg = np.mean(res, axis=0)
    print(f"digits purity at defaults: coalescent {p_coal:.4f}, average linkage {p_avg:.4f}")
    assert p_coal >= p_avg


def test_hyperparameter_change_ignores_the_common_scale():
    from streamtree.static.coalescent import hyperparameter_change

    lam = np.array([0.5, 2.0, 1.0])
    assert hyperparameter_change(lam, 7.0 * lam) == pytest.approx(0.0, abs=1e-12)
    assert hyperparameter_change(lam, lam * [1.0, 1.1, 1.0]) == pytest.approx(2 / 3 * math.log(1.1))
    q = np.array([[0.2, 0.8], [0.5, 0.5], [0.9, 0.1]])
    q2 = q.copy()
    q2[1] = [0.4, 0.6]
    assert hyperparameter_change(lam, lam, q, q2) == pytest.approx(math.log(0.5 / 0.4))


def test_hyperparameter_rounds_stop_early_and_report_the_tree_they_built():
    from streamtree.static.coalescent_inference import greedy_rate1

    rng = np.random.default_rng(21)
    centres = rng.normal(scale=[4.0, 4.0, 0.5], size=(4, 3))
    X = centres[rng.integers(4, size=60)] + rng.normal(scale=[1.0, 1.0, 3.0], size=(60, 3))
    est = KingmanCoalescent().fit(X)
    assert 1 <= est.n_hyper_iter_ < 10  # at most 10 rounds for the Brownian likelihood
    assert len(est.objective_history_) == est.n_hyper_iter_ + 1
    # the reported variances are the ones the returned tree was built with
    tree = greedy_rate1(BrownianMessages(est.diffusion_variance_), X)
    np.testing.assert_array_equal(Dendrogram.from_merges(tree.left, tree.right, tree.heights, 60).linkage,
                                  est.linkage_)
    # the noisy third dimension gets the largest diffusion variance relative to its spread
    assert np.argmax(est.diffusion_variance_ / X.var(axis=0)) == 2
    fixed = KingmanCoalescent(n_hyper_iter=0).fit(X)
    assert fixed.n_hyper_iter_ == 0 and np.all(fixed.diffusion_variance_ == 1.0)
    binary = KingmanCoalescent(likelihood="binary").fit((X > 0).astype(float))
    assert binary.n_hyper_iter_ == 1  # one round for discrete likelihoods, as in the paper
