"""Bayesian hierarchical clustering: exact checks against enumeration and numerical integration."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import integrate, stats
from scipy.cluster.hierarchy import (
    dendrogram,
    fcluster,
    is_monotonic,
    is_valid_linkage,
    linkage,
)
from scipy.special import gammaln, logsumexp

from streamtree.static import BayesianHierarchicalClustering
from streamtree.static.bhc import bhc_tree_log_evidence
from streamtree.static.likelihoods import BernoulliBeta, GaussianNIW, MultinomialDirichlet
from streamtree.static.metrics import dendrogram_purity


# ------------------------------------------------------------------------------ helpers
def set_partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]
        yield [[first]] + part


def tree_partitions(Z, n, node):
    """All partitions of the leaves of ``node`` consistent with the tree (enumerated)."""
    if node < n:
        return [[(node,)]]
    a, b = int(Z[node - n, 0]), int(Z[node - n, 1])
    split = [p + q for p in tree_partitions(Z, n, a) for q in tree_partitions(Z, n, b)]
    whole = tuple(sorted(sum((list(c) for c in split[0]), [])))
    return [[whole]] + split


def dp_log_weight(part, log_alpha):
    return sum(log_alpha + gammaln(len(c)) for c in part)


def toy_data(kind, n, rng):
    if kind == "gaussian":
        return rng.normal(size=(n, 2)) + np.repeat([[0, 0], [3, 1]], [n // 2, n - n // 2], axis=0)
    if kind == "bernoulli":
        return (rng.random((n, 4)) < 0.5).astype(float)
    return rng.integers(0, 4, size=(n, 3)).astype(float)


# ------------------------------------------------------------------------------ marginals
def test_niw_1d_marginal_equals_numerical_integration():
    x = np.array([0.3, -0.8, 1.4])
    m0, k0, nu0, s0 = 0.2, 0.7, 3.0, 1.5
    lik = GaussianNIW(np.array([m0]), k0, nu0, np.array([[s0]]))
    # 1-D inverse Wishart(nu0, s0) is inverse-gamma(nu0/2, scale s0/2); integrate over the
    # precision tau = 1/var so that both ranges are (semi-)infinite and the integrand smooth.
    lig = nu0 / 2 * math.log(s0 / 2) - math.lgamma(nu0 / 2)

    def integrand(mu, tau):
        ll = sum(0.5 * math.log(tau / (2 * math.pi)) - 0.5 * tau * (xi - mu) ** 2 for xi in x)
        lp = 0.5 * math.log(k0 * tau / (2 * math.pi)) - 0.5 * k0 * tau * (mu - m0) ** 2
        # inverse-gamma density in var, times |d var / d tau| = tau^-2
        lv = lig + (nu0 / 2 + 1) * math.log(tau) - s0 / 2 * tau - 2 * math.log(tau)
        return math.exp(ll + lp + lv)

    val, _ = integrate.dblquad(integrand, 0, np.inf, -np.inf, np.inf, epsabs=0, epsrel=1e-11)
    assert lik.log_marginal(x[:, None]) == pytest.approx(math.log(val), abs=1e-8)


def test_niw_marginal_equals_chain_of_student_t_predictives():
    rng = np.random.default_rng(1)
    d = 3
    X = rng.normal(size=(6, d))
    m0, k0, nu0 = rng.normal(size=d), 0.5, d + 1.5
    A = rng.normal(size=(d, d))
    S0 = A @ A.T + np.eye(d)
    lik = GaussianNIW(m0, k0, nu0, S0)
    total = 0.0
    for i in range(len(X)):
        P = X[:i]
        n = i
        kn, nun = k0 + n, nu0 + n
        mean = P.mean(axis=0) if n else np.zeros(d)
        C = (P - mean).T @ (P - mean) if n else np.zeros((d, d))
        mn = (k0 * m0 + n * mean) / kn
        Sn = S0 + C + (k0 * n / kn) * np.outer(mean - m0, mean - m0)
        dof = nun - d + 1
        total += stats.multivariate_t(mn, Sn * (kn + 1) / (kn * dof), df=dof).logpdf(X[i])
    assert lik.log_marginal(X) == pytest.approx(total, abs=1e-9)


def test_beta_bernoulli_marginal_equals_numerical_integration():
    X = np.array([[1, 0], [1, 1], [0, 1], [1, 1]], dtype=float)
    a, b = np.array([0.7, 2.0]), np.array([1.3, 0.4])
    lik = BernoulliBeta(a, b)
    logv = 0.0
    for f in range(2):
        s, n = X[:, f].sum(), len(X)
        val, _ = integrate.quad(lambda t: t**s * (1 - t) ** (n - s) * stats.beta.pdf(t, a[f], b[f]),
                                0, 1, epsabs=1e-14)
        logv += math.log(val)
    assert lik.log_marginal(X) == pytest.approx(logv, abs=1e-9)


def test_dirichlet_multinomial_marginal_two_and_three_categories():
    X2 = np.array([[3, 1], [0, 2]], dtype=float)
    beta2 = np.array([0.8, 1.7])
    c = X2.sum(axis=0)
    val, _ = integrate.quad(lambda t: t ** c[0] * (1 - t) ** c[1]
                            * stats.beta.pdf(t, *beta2), 0, 1, epsabs=1e-14)
    assert MultinomialDirichlet(beta2).log_marginal(X2) == pytest.approx(math.log(val), abs=1e-9)

    X3 = np.array([[2, 0, 1], [1, 1, 0]], dtype=float)
    beta3 = np.array([0.9, 1.4, 2.2])
    c = X3.sum(axis=0)
    log_norm = math.lgamma(beta3.sum()) - sum(math.lgamma(b) for b in beta3)
    e = [float(ci + bi - 1.0) for ci, bi in zip(c, beta3)]

    def f(t2, t1):  # likelihood times the Dirichlet density, by hand for speed
        t3 = 1.0 - t1 - t2
        if t3 <= 0:
            return 0.0
        return math.exp(log_norm) * t1 ** e[0] * t2 ** e[1] * t3 ** e[2]

    val, _ = integrate.dblquad(f, 0, 1, 0, lambda t1: 1 - t1, epsabs=1e-13)
    assert MultinomialDirichlet(beta3).log_marginal(X3) == pytest.approx(math.log(val), abs=1e-7)


@pytest.mark.parametrize("kind", ["gaussian", "bernoulli", "multinomial"])
def test_batched_slot_marginals_equal_direct(kind):
    """The fast paths (Gram trick, determinant lemma, sparse update) against direct formulas."""
    rng = np.random.default_rng(2)
    X = toy_data(kind, 9, rng)
    if kind == "gaussian":
        X = rng.normal(size=(9, 4))
        lik = GaussianNIW.from_data(X, kappa0=0.3, scale=0.5)
    elif kind == "bernoulli":
        lik = BernoulliBeta.from_data(X)
    else:
        lik = MultinomialDirichlet.from_data(X)
    lik.init_slots(X)
    pairs = lik.leaf_pair_log_marginal(np.arange(9))
    for i, j in itertools.combinations(range(9), 2):
        assert pairs[i, j] == pytest.approx(lik.log_marginal(X[[i, j]]), abs=1e-9)
    lik.merge_slots(0, 1)
    lik.merge_slots(2, 3)
    lik.merge_slots(2, 4)
    # a merged cluster against single points (lemma) and against a merged cluster (full)
    live = np.array([0, 5, 6, 7, 8])
    got = lik.merged_log_marginal(2, live)
    members = {0: [0, 1], 5: [5], 6: [6], 7: [7], 8: [8]}
    for g, j in zip(got, live):
        assert g == pytest.approx(lik.log_marginal(X[[2, 3, 4] + members[j]]), abs=1e-9)


# ------------------------------------------------------------------------------ the tree
@pytest.mark.parametrize("kind,n,alpha", [("gaussian", 7, 1.0), ("bernoulli", 6, 0.3),
                                          ("multinomial", 7, 2.5), ("gaussian", 5, 4.0)])
def test_root_evidence_equals_sum_over_tree_consistent_partitions(kind, n, alpha):
    rng = np.random.default_rng(n)
    X = toy_data(kind, n, rng)
    model = BayesianHierarchicalClustering(likelihood=kind, alpha=alpha).fit(X)
    lik = model._lik
    Z = model.linkage_
    la = math.log(alpha)

    def log_ml(cluster):
        return lik.log_marginal(X[list(cluster)])

    # every node: log p(D_k|T_k) and r_k from enumeration (d_k = sum of the DP weights)
    for k in range(n - 1):
        parts = tree_partitions(Z, n, n + k)
        w = np.array([dp_log_weight(p, la) for p in parts])
        lik_terms = np.array([sum(log_ml(c) for c in p) for p in parts])
        log_d = logsumexp(w)
        log_pt = logsumexp(w + lik_terms) - log_d
        assert model.dendrogram_.stats["log_dk"][k] == pytest.approx(log_d, abs=1e-9)
        assert model.dendrogram_.stats["log_evidence"][k] == pytest.approx(log_pt, abs=1e-9)
        # r_k: the posterior weight of the single-cluster partition (first in the list)
        assert model.log_rk_[k] == pytest.approx(w[0] + lik_terms[0] - log_d - log_pt, abs=1e-9)
    parts = tree_partitions(Z, n, 2 * n - 2)
    w = np.array([dp_log_weight(p, la) for p in parts])
    log_pt = logsumexp(w + np.array([sum(log_ml(c) for c in p) for p in parts])) - logsumexp(w)
    assert model.log_evidence_ == pytest.approx(log_pt, abs=1e-9)

    # the lower bound on the DP mixture marginal, by brute force over all set partitions
    allp = list(set_partitions(list(range(n))))
    assert len(allp) == [1, 1, 2, 5, 15, 52, 203, 877][n]
    wall = np.array([dp_log_weight(p, la) for p in allp])
    # the DP prior is normalised: sum_v alpha^m prod Gamma(n_l) = Gamma(n + alpha) / Gamma(alpha)
    assert logsumexp(wall) == pytest.approx(gammaln(n + alpha) - gammaln(alpha), abs=1e-9)
    log_dpm = logsumexp(wall + np.array([sum(log_ml(c) for c in p) for p in allp])) - logsumexp(wall)
    bound = model.log_evidence_ + model.dendrogram_.stats["log_dk"][-1] - logsumexp(wall)
    assert bound <= log_dpm + 1e-12
    assert bound < log_dpm - 1e-6  # strict: the tree misses partitions with 3+ points


def test_greedy_merges_take_the_highest_r_among_live_pairs():
    """Replay the fitted merges and re-score every live pair from scratch at each step."""
    rng = np.random.default_rng(4)
    X = np.concatenate([rng.normal(size=(10, 3)) + c for c in (0.0, 2.5, 5.0)])
    rng.shuffle(X)
    n = len(X)
    model = BayesianHierarchicalClustering(alpha=0.5, scale=0.3).fit(X)
    lik, la = model._lik, math.log(0.5)
    st = model.dendrogram_.stats
    order = np.argsort(st["merge_step"])  # linkage rows in greedy order
    clusters = {i: ([i], la, lik.log_marginal(X[[i]])) for i in range(n)}

    def score(ci, cj):
        (mi, di, ti), (mj, dj, tj) = ci, cj
        members = mi + mj
        a = la + gammaln(len(members))
        ld = np.logaddexp(a, di + dj)
        merged = a - ld + lik.log_marginal(X[members])
        lt = np.logaddexp(merged, di + dj - ld + ti + tj)
        return merged - lt, (members, ld, lt)

    for row in order:
        ids = list(clusters)
        best = max(score(clusters[i], clusters[j])[0] for i, j in itertools.combinations(ids, 2))
        a, b = int(model.linkage_[row, 0]), int(model.linkage_[row, 1])
        lr, new = score(clusters[a], clusters[b])
        assert lr == pytest.approx(st["log_rk"][row], abs=1e-8)
        assert lr >= best - 1e-8
        del clusters[a], clusters[b]
        clusters[n + row] = new


def test_linkage_heights_and_flat_cut():
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(size=(20, 2)) * 0.5 + c for c in [(0, 0), (5, 0), (0, 5)]])
    m = BayesianHierarchicalClustering().fit(X)
    Z = m.linkage_
    assert is_valid_linkage(Z) and is_monotonic(Z)
    assert np.all(Z[:, 2] >= 0)
    assert sorted(dendrogram(Z, no_plot=True)["leaves"]) == list(range(60))
    truth = np.repeat([0, 1, 2], 20)
    np.testing.assert_array_equal(m.labels_, truth)
    assert m.n_clusters_ == 3
    # heights put the r >= 0.5 cut at log 2
    f = fcluster(Z, math.log(2.0), "distance")
    assert len(set(zip(f, m.labels_))) == m.n_clusters_ == len(set(f))
    # top-down cut: every cluster is the leaf set of a node with r >= 1/2, all its ancestors < 1/2
    assert m.fit_predict(X).tolist() == m.labels_.tolist()


def test_tree_evidence_of_fixed_tree_matches_fit():
    rng = np.random.default_rng(8)
    X = rng.normal(size=(30, 3))
    m = BayesianHierarchicalClustering(alpha=2.0).fit(X)
    stats_ = m._lik.node_stats(X, m._members(m.dendrogram_))
    ev = bhc_tree_log_evidence(m._lik.node_log_marginal(stats_), m.linkage_, 2.0)
    assert ev == pytest.approx(m.log_evidence_, abs=1e-8)


def test_hyperparameter_optimisation_increases_evidence():
    rng = np.random.default_rng(9)
    X = np.concatenate([rng.normal(size=(15, 2)) * 0.2 + c for c in [(0, 0), (4, 0), (0, 4)]])
    base = BayesianHierarchicalClustering(scale=5.0, kappa0=10.0).fit(X)
    opt = BayesianHierarchicalClustering(scale=5.0, kappa0=10.0, optimize_hyperparameters=True).fit(X)
    assert opt.log_evidence_ > base.log_evidence_ + 1.0
    assert opt.hyperparameters_["scale"][0, 0] < 5.0 * X[:, 0].var()
    np.testing.assert_array_equal(opt.labels_, np.repeat([0, 1, 2], 15))


def test_bernoulli_and_multinomial_recover_planted_clusters():
    rng = np.random.default_rng(11)
    truth = np.repeat([0, 1, 2], 20)
    protos = rng.random((3, 40)) < 0.5
    flips = rng.random((60, 40)) < 0.08
    Xb = (protos[truth] ^ flips).astype(float)
    mb = BayesianHierarchicalClustering(likelihood="bernoulli").fit(Xb)
    np.testing.assert_array_equal(mb.labels_, truth)
    assert dendrogram_purity(mb.dendrogram_, truth) == 1.0

    topics = rng.dirichlet(np.full(30, 0.2), size=3)
    Xc = np.stack([rng.multinomial(60, topics[t]) for t in truth]).astype(float)
    mc = BayesianHierarchicalClustering(likelihood="multinomial").fit(Xc)
    np.testing.assert_array_equal(mc.labels_, truth)
    opt = BayesianHierarchicalClustering(likelihood="multinomial",
                                         optimize_hyperparameters=True).fit(Xc)
    assert opt.log_evidence_ >= mc.log_evidence_
    np.testing.assert_array_equal(opt.labels_, truth)


# ------------------------------------------------------------------------------ prediction
def _brute_predictive(model, X, x):
    """sum_k (n_k/n) r_k prod_anc (1 - r_a) p(x | D_k), predictives as ratios of marginals."""
    dend = model.dendrogram_
    n = dend.n_leaves
    members = [[i] for i in range(n)] + [m.tolist() for m in dend.clusters_of()]
    parent = {}
    for k in range(n - 1):
        for c in dend.linkage[k, :2].astype(int):
            parent[c] = n + k
    r = np.concatenate([np.ones(n), np.exp(model.log_rk_)])
    total = 0.0
    for node in range(2 * n - 1):
        w, p = r[node] * len(members[node]) / n, parent.get(node)
        while p is not None:
            w *= 1.0 - r[p]
            p = parent.get(p)
        lk = model._lik
        total += w * math.exp(lk.log_marginal(np.vstack([X[members[node]], x]))
                              - lk.log_marginal(X[members[node]]))
    return total


def test_gaussian_predictive_density_integrates_to_one():
    X = np.array([[-2.0], [-1.7], [0.1], [2.2], [2.5]])
    m = BayesianHierarchicalClustering(scale=0.5).fit(X)
    def f(t):
        return math.exp(m.predictive_log_density([[t]])[0])

    val = sum(integrate.quad(f, lo, hi, epsabs=1e-12, limit=200)[0]
              for lo, hi in [(-np.inf, -10), (-10, 10), (10, np.inf)])
    assert val == pytest.approx(1.0, abs=1e-8)
    x = np.array([0.7])
    assert math.exp(m.predictive_log_density([x])[0]) == pytest.approx(
        _brute_predictive(m, X, x), rel=1e-9)


def test_bernoulli_and_multinomial_predictives_normalise():
    rng = np.random.default_rng(6)
    X = (rng.random((6, 3)) < 0.4).astype(float)
    m = BayesianHierarchicalClustering(likelihood="bernoulli").fit(X)
    grid = np.array(list(itertools.product([0, 1], repeat=3)), dtype=float)
    lp = m.predictive_log_density(grid)
    assert np.exp(lp).sum() == pytest.approx(1.0, abs=1e-12)
    assert np.exp(lp[5]) == pytest.approx(_brute_predictive(m, X, grid[5]), rel=1e-9)

    C = rng.integers(0, 3, size=(6, 3)).astype(float)
    mm = BayesianHierarchicalClustering(likelihood="multinomial").fit(C)
    # sequence probabilities: summing multinomial coefficient x p over all counts of length 3 is 1
    vecs = np.array([v for v in itertools.product(range(4), repeat=3) if sum(v) == 3], float)
    coef = np.exp(gammaln(4.0) - gammaln(vecs + 1).sum(axis=1))
    assert (coef * np.exp(mm.predictive_log_density(vecs))).sum() == pytest.approx(1.0, abs=1e-12)


# ------------------------------------------------------------------------------ validation
def test_input_validation():
    X = np.random.default_rng(0).normal(size=(5, 2))
    with pytest.raises(ValueError, match="NaN"):
        BayesianHierarchicalClustering().fit(np.array([[0.0, np.nan], [1.0, 2.0]]))
    with pytest.raises(ValueError, match="2-D"):
        BayesianHierarchicalClustering().fit(np.zeros(4))
    with pytest.raises(ValueError, match="non-negative"):
        BayesianHierarchicalClustering(likelihood="multinomial").fit([[1, -1], [0, 2]])
    with pytest.raises(ValueError, match="integer"):
        BayesianHierarchicalClustering(likelihood="multinomial").fit([[1.5, 1], [0, 2]])
    with pytest.raises(ValueError, match="binary"):
        BayesianHierarchicalClustering(likelihood="bernoulli").fit([[1, 2], [0, 1]])
    with pytest.raises(ValueError, match="'likelihood' parameter.*'poisson'"):
        BayesianHierarchicalClustering(likelihood="poisson").fit(X)
    with pytest.raises(ValueError, match="alpha"):
        BayesianHierarchicalClustering(alpha=0.0).fit(X)
    with pytest.raises(ValueError, match="nu0"):
        BayesianHierarchicalClustering(nu0=0.5).fit(X)
    m = BayesianHierarchicalClustering().fit(X)
    with pytest.raises(ValueError, match="features"):
        m.predictive_log_density(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="not fitted"):
        BayesianHierarchicalClustering().predictive_log_density(X)


def test_single_point_and_sparse_input():
    from scipy import sparse

    m = BayesianHierarchicalClustering().fit([[1.0, 2.0]])
    assert m.labels_.tolist() == [0] and m.linkage_.shape == (0, 4)
    C = sparse.random(8, 5, density=0.5, random_state=1, format="csr")
    C.data = np.ceil(C.data * 3)
    a = BayesianHierarchicalClustering(likelihood="multinomial").fit(C)
    b = BayesianHierarchicalClustering(likelihood="multinomial").fit(C.toarray())
    np.testing.assert_array_equal(a.linkage_, b.linkage_)


# ------------------------------------------------------------------------------ quality
def _digits_pca(n, seed):
    from sklearn.datasets import load_digits
    from sklearn.decomposition import PCA

    X, y = load_digits(return_X_y=True)
    if n < len(X):
        idx = np.sort(np.random.default_rng(seed).choice(len(X), size=n, replace=False))
        X, y = X[idx], y[idx]
    # 20 principal components, the protocol of Teh, Daume and Roy (2007) for digits
    return PCA(20, random_state=0).fit_transform(X), y


def test_digits_purity_at_least_average_linkage():
    X, y = _digits_pca(600, seed=0)
    bhc = BayesianHierarchicalClustering().fit(X)
    p_bhc = dendrogram_purity(bhc.dendrogram_, y)
    p_avg = dendrogram_purity(linkage(X, "average"), y)
    print(f"digits n=600, PCA-20: BHC purity {p_bhc:.4f}, average linkage {p_avg:.4f}")
    assert p_bhc >= p_avg
    assert p_bhc > 0.75


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_digits_purity_other_subsets(seed):
    X, y = _digits_pca(600, seed=seed)
    p_bhc = dendrogram_purity(BayesianHierarchicalClustering().fit(X).dendrogram_, y)
    p_avg = dendrogram_purity(linkage(X, "average"), y)
    print(f"digits n=600 seed {seed}, PCA-20: BHC purity {p_bhc:.4f}, average linkage {p_avg:.4f}")
    assert p_bhc >= p_avg
