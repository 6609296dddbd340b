"""Bayesian hierarchical clustering (Heller and Ghahramani, ICML 2005).

Agglomerative clustering in which the two trees to merge are the pair with the highest
posterior probability r_k of the *merged* hypothesis H1 (all points of D_k from one component)
against every clustering of D_k consistent with the two subtrees. With n_k = |D_k| and a
Dirichlet process concentration alpha, for a node k with children i and j:

    d_k = alpha Gamma(n_k) + d_i d_j,                 d_leaf = alpha
    pi_k = alpha Gamma(n_k) / d_k
    p(D_k | T_k) = pi_k p(D_k | H1) + (1 - pi_k) p(D_i | T_i) p(D_j | T_j)
    r_k = pi_k p(D_k | H1) / p(D_k | T_k)

all computed in log space. p(D | T) at the root is a sum over the tree-consistent partitions of
the data weighted by the Dirichlet process prior renormalised to those partitions, and
p(D | T) d_root Gamma(alpha) / Gamma(n + alpha) is a lower bound on the DP mixture marginal.

The search keeps an n x n matrix of the log r of every live pair and, per cluster, its best
partner; a merge computes the new cluster's scores against all live clusters in one vectorised
call to the likelihood, and only clusters whose best partner disappeared rescan their row.
Memory is 8 n^2 bytes plus the likelihood's per-cluster statistics; time is O(n^2) score
evaluations.
"""

from __future__ import annotations

import logging
import math
from numbers import Integral, Real

import numpy as np
from scipy import sparse
from scipy.optimize import minimize
from scipy.special import gammaln, logsumexp
from sklearn.base import BaseEstimator, ClusterMixin, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from streamtree.static.dendrogram import Dendrogram
from streamtree.static.likelihoods import make_likelihood

__all__ = ["BayesianHierarchicalClustering", "bhc_tree_log_evidence"]

logger = logging.getLogger(__name__)


def _merge_scores(log_alpha, n_new, logd_i, logt_i, logd_j, logt_j, log_h1):
    """Vectorised d_k / pi_k / p(D_k|T_k) / r_k recursion for candidate merges.

    Returns the log odds log(r_k / (1 - r_k)), log r_k, log(1 - r_k), log p(D_k|T_k), log d_k.
    Merges are ranked by the log odds: log r_k rounds to 0 for every r_k near 1, which would
    turn the choice among confident merges into ties.
    """
    a = log_alpha + gammaln(n_new)
    logd = np.logaddexp(a, logd_i + logd_j)
    merged = a - logd + log_h1  # log pi_k p(D_k | H1)
    split = logd_i + logd_j - logd + logt_i + logt_j  # log (1 - pi_k) p(D_i|T_i) p(D_j|T_j)
    odds = merged - split
    return odds, -np.logaddexp(0.0, -odds), -np.logaddexp(0.0, odds), np.logaddexp(merged, split), logd


def _merge_odds(log_alpha_lgamma_n, logd_i, logt_i, logd_j, logt_j, log_h1):
    """log r_k / (1 - r_k) alone: log d_k cancels, so scoring needs no logaddexp.

    ``log_alpha_lgamma_n`` is log alpha + log Gamma(n_k).
    """
    return log_alpha_lgamma_n + log_h1 - (logd_i + logd_j + logt_i + logt_j)


def _greedy_bhc(lik, X: np.ndarray, log_alpha: float) -> dict:
    """Run the greedy merge search; returns per-step merge records in merge order."""
    n = X.shape[0]
    leaf_ml = lik.init_slots(X)
    logd = np.full(n, log_alpha)
    logt = leaf_ml.copy()
    size = np.ones(n)
    cid = np.arange(n)  # cluster id held by each slot
    alive = np.ones(n, dtype=bool)
    m = n - 1
    rec = {k: np.empty(m) for k in ("log_rk", "log_1m_rk", "log_evidence", "log_dk", "log_h1",
                                  "log_odds")}
    left = np.empty(m, dtype=np.int64)
    right = np.empty(m, dtype=np.int64)
    if m == 0:
        lik.release()
        return {"left": left, "right": right, "leaf_log_ml": leaf_ml, **rec}

    S = np.empty((n, n))  # log odds of merging each live pair
    lgamma_n = gammaln(np.arange(n + 1.0))
    block = max(1, (1 << 18) // n)  # rows per block of leaf pairs: bounds the temporaries
    for start in range(0, n, block):
        rows = np.arange(start, min(n, start + block))
        h1 = lik.leaf_pair_log_marginal(rows)
        S[rows] = _merge_odds(log_alpha, log_alpha, logt[rows][:, None], log_alpha,
                              logt[None, :], h1)  # log Gamma(2) = 0
    np.fill_diagonal(S, -np.inf)
    best = S.argmax(axis=1)
    best_score = S[np.arange(n), best]

    for step in range(m):
        a = int(np.argmax(best_score))
        b = int(best[a])
        if b < a:
            a, b = b, a  # the merged cluster takes the lower slot
        h1_ab = float(lik.merged_log_marginal(a, np.array([b]))[0])
        lo, lr, l1mr, lt, ld = _merge_scores(log_alpha, size[a] + size[b], logd[a], logt[a],
                                             logd[b], logt[b], h1_ab)
        left[step], right[step] = cid[a], cid[b]
        rec["log_rk"][step], rec["log_1m_rk"][step] = lr, l1mr
        rec["log_evidence"][step], rec["log_dk"][step] = lt, ld
        rec["log_h1"][step] = h1_ab
        rec["log_odds"][step] = lo

        lik.merge_slots(a, b)
        size[a] += size[b]
        logd[a], logt[a], cid[a] = ld, lt, n + step
        alive[b] = False
        S[b, :] = -np.inf
        S[:, b] = -np.inf
        best_score[b] = -np.inf
        if step == m - 1:
            break

        live = np.flatnonzero(alive)
        live = live[live != a]
        h1 = lik.merged_log_marginal(a, live)
        scores = _merge_odds(log_alpha + lgamma_n[(size[a] + size[live]).astype(np.int64)],
                             logd[a], logt[a], logd[live], logt[live], h1)
        S[a, live] = scores
        S[live, a] = scores
        # Clusters whose best partner was a or b rescan their row; the rest can only improve.
        stale = (best[live] == a) | (best[live] == b)
        better = ~stale & (scores > best_score[live])
        up = live[better]
        best[up] = a
        best_score[up] = scores[better]
        redo = live[stale]
        if redo.size:
            nb = S[redo].argmax(axis=1)
            best[redo] = nb
            best_score[redo] = S[redo, nb]
        best[a] = int(S[a].argmax())
        best_score[a] = S[a, best[a]]
    lik.release()
    return {"left": left, "right": right, "leaf_log_ml": leaf_ml, **rec}


def bhc_tree_log_evidence(node_log_ml: np.ndarray, linkage: np.ndarray, alpha: float) -> float:
    """log p(D | T) of a fixed binary tree from the log p(D_k | H1) of its 2n - 1 nodes.

    ``node_log_ml`` holds leaves ``0..n-1`` then internal nodes in linkage row order.
    """
    n = linkage.shape[0] + 1
    log_alpha = math.log(alpha)
    logd = np.empty(2 * n - 1)
    logt = np.empty(2 * n - 1)
    logd[:n] = log_alpha
    logt[:n] = node_log_ml[:n]
    for k in range(n - 1):
        i, j, size = int(linkage[k, 0]), int(linkage[k, 1]), linkage[k, 3]
        _, _, _, logt[n + k], logd[n + k] = _merge_scores(log_alpha, size, logd[i], logt[i], logd[j],
                                                       logt[j], node_log_ml[n + k])
    return float(logt[-1])


class BayesianHierarchicalClustering(ClusterMixin, BaseEstimator):
    """Bayesian hierarchical clustering with conjugate component models.

    Parameters
    ----------
    likelihood : {"gaussian", "bernoulli", "multinomial"}
        Component model: Gaussian with a Normal-inverse-Wishart prior (real features),
        independent Bernoullis with Beta priors (binary features), or a multinomial over
        categories with a Dirichlet prior (non-negative integer counts, e.g. word counts).
    alpha : float
        Concentration of the Dirichlet process prior over partitions.
    mean_prior : array of shape (n_features,), optional
        Gaussian: prior mean ``m0`` (default: the data mean).
    kappa0 : float
        Gaussian: prior precision scaling of the mean, mu | Sigma ~ N(m0, Sigma / kappa0).
    nu0 : float, optional
        Gaussian: inverse-Wishart degrees of freedom, > n_features - 1 (default
        2 n_features + 2).
    scale : float or array of shape (n_features, n_features), optional
        Gaussian: the inverse-Wishart scale matrix ``S0``, or a float ``s`` for
        ``S0 = s (nu0 - d - 1) diag(Var X)``, which makes the prior mean of the component
        covariance ``s diag(Var X)`` (default 0.2).
    beta_prior : tuple (a, b) of floats or arrays of shape (n_features,), optional
        Bernoulli: Beta prior per feature (default: mean = smoothed feature frequency, a + b = 2).
    dirichlet_prior : float or array of shape (n_features,), optional
        Multinomial: Dirichlet parameters (default: mean = smoothed category frequencies, total
        concentration = n_features).
    optimize_hyperparameters : bool
        If True, maximise the root evidence log p(D | T) over log-scale multipliers of alpha and
        the likelihood's main hyperparameters (Gaussian: kappa0 and the scale matrix; Bernoulli:
        a and b; multinomial: the Dirichlet concentration), starting from the best of a coarse
        grid (factors 1/16 to 16 of the scale matrix, Beta strength or Dirichlet concentration,
        each with its own tree), then alternating an optimisation with the tree fixed
        (L-BFGS-B) and a rebuild of the tree, as long as the evidence improves.
    max_hyper_iter : int
        Maximum number of optimise / rebuild rounds when ``optimize_hyperparameters``.

    Attributes
    ----------
    n_features_in_ : int
        Number of features seen during fit.
    dendrogram_ : Dendrogram
        The tree. Its linkage rows are sorted by height (SciPy's convention); ``stats`` holds, per
        row, ``log_rk``, ``log_1m_rk`` (log(1 - r_k)), ``log_odds`` (log r_k/(1-r_k), the
        merge criterion), ``log_evidence`` (log p(D_k | T_k)),
        ``log_dk``, ``log_h1`` (log p(D_k | H1)) and ``merge_step`` (the greedy step of the merge).
    linkage_ : ndarray of shape (n_samples - 1, 4)
        SciPy linkage matrix. Heights: ``-log max r_a`` over the node and its ancestors a, which
        is >= 0, never decreases towards the root, and puts exactly the nodes that the r_k >= 0.5
        cut keeps whole at height <= log 2, so ``fcluster(linkage_, log(2), "distance")``
        reproduces ``labels_``. (Raw per-merge r_k are in ``log_rk_``; heights flatten the inside
        of confident clusters towards 0 by design.)
    log_evidence_ : float
        log p(D | T) at the root.
    log_rk_ : ndarray of shape (n_samples - 1,)
        log r_k per linkage row.
    labels_ : ndarray of shape (n_samples,)
        Flat clustering: from the root down, a node whose r_k >= 0.5 is a cluster, otherwise its
        two subtrees are cut apart. Labels are numbered by their smallest member.
    n_clusters_ : int
        Number of flat clusters in ``labels_``.
    alpha_ : float
        The DP concentration used (after optimisation if requested).
    hyperparameters_ : dict
        The likelihood's prior parameters used.
    """

    _parameter_constraints: dict = {
        "likelihood": [StrOptions({"gaussian", "bernoulli", "multinomial"})],
        "alpha": [Interval(Real, 0, None, closed="neither")],
        "mean_prior": [None, "array-like"],
        "kappa0": [Interval(Real, 0, None, closed="neither")],
        "nu0": [None, Interval(Real, 0, None, closed="neither")],
        "scale": [None, Interval(Real, 0, None, closed="neither"), "array-like"],
        "beta_prior": [None, "array-like"],
        "dirichlet_prior": [None, Interval(Real, 0, None, closed="neither"), "array-like"],
        "optimize_hyperparameters": ["boolean"],
        "max_hyper_iter": [Interval(Integral, 0, None, closed="left")],
    }

    def __init__(self, likelihood: str = "gaussian", alpha: float = 1.0, *, mean_prior=None,
                 kappa0: float = 0.1, nu0: float | None = None, scale=None, beta_prior=None,
                 dirichlet_prior=None, optimize_hyperparameters: bool = False,
                 max_hyper_iter: int = 5):
        self.likelihood = likelihood
        self.alpha = alpha
        self.mean_prior = mean_prior
        self.kappa0 = kappa0
        self.nu0 = nu0
        self.scale = scale
        self.beta_prior = beta_prior
        self.dirichlet_prior = dirichlet_prior
        self.optimize_hyperparameters = optimize_hyperparameters
        self.max_hyper_iter = max_hyper_iter

    # ----------------------------------------------------------------------------- input
    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True  # densified: the statistics are dense per cluster
        tags.input_tags.positive_only = self.likelihood != "gaussian"
        return tags

    def _validate(self, X, fitted: bool = False) -> np.ndarray:
        if not sparse.issparse(X) and np.ndim(X) != 2:
            raise ValueError(f"X must be a 2-D array (n_samples, n_features), got shape {np.shape(X)}")
        X = validate_data(self, X, reset=not fitted, accept_sparse=True, dtype=np.float64)
        # a dense copy: the training matrix is kept for prediction
        X = X.toarray() if sparse.issparse(X) else np.array(X, dtype=np.float64, copy=True)
        if not np.all(np.isfinite(X)):  # some sparse formats are not checked by validate_data
            raise ValueError("Input X contains NaN or infinite values")
        if self.likelihood == "bernoulli" and not np.all((X == 0) | (X == 1)):
            raise ValueError("likelihood='bernoulli' needs binary data (only 0 and 1)")
        if self.likelihood == "multinomial":
            if np.any(X < 0):
                raise ValueError("likelihood='multinomial' needs non-negative counts")
            if not np.all(X == np.round(X)):
                raise ValueError("likelihood='multinomial' needs integer counts")
        return X

    def _make_likelihood(self, X):
        return make_likelihood(self.likelihood, X, mean_prior=self.mean_prior,
                               kappa0=self.kappa0, nu0=self.nu0, scale=self.scale,
                               beta_prior=self.beta_prior, dirichlet_prior=self.dirichlet_prior)

    # ----------------------------------------------------------------------------- fit
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None) -> "BayesianHierarchicalClustering":
        """Build the tree for the rows of ``X``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Real features (``"gaussian"``), 0/1 features (``"bernoulli"``) or non-negative
            integer counts (``"multinomial"``). Sparse input is densified.
        y : None
            Ignored.

        Returns
        -------
        self : BayesianHierarchicalClustering
            The fitted estimator.
        """
        X = self._validate(X)
        lik = self._make_likelihood(X)
        alpha = float(self.alpha)
        rec = _greedy_bhc(lik, X, math.log(alpha))
        dend, node_evidence = self._assemble(rec, X.shape[0])
        if self.optimize_hyperparameters and X.shape[0] > 1:
            lik, alpha, rec, dend, node_evidence = self._optimise(X, lik, alpha, rec, dend,
                                                                  node_evidence)
        self._lik = lik
        self._X = X
        self._node_stats = None
        self.alpha_ = alpha
        self.hyperparameters_ = {"alpha": alpha, **lik.hyperparameters()}
        self.dendrogram_ = dend
        self.linkage_ = dend.linkage
        self.log_rk_ = dend.stats["log_rk"]
        self.log_evidence_ = node_evidence
        self.labels_ = self._cut(dend)
        self.n_clusters_ = int(self.labels_.max()) + 1
        return self

    def _assemble(self, rec: dict, n: int) -> tuple[Dendrogram, float]:
        m = n - 1
        if m == 0:
            empty = {k: np.empty(0) for k in ("log_rk", "log_1m_rk", "log_odds", "log_evidence",
                                              "log_dk", "log_h1")}
            empty["merge_step"] = np.empty(0, dtype=np.int64)
            d = Dendrogram.from_merges([], [], [], 1, stats=empty)
            return d, float(rec["leaf_log_ml"][0])
        left, right = rec["left"], rec["right"]
        # height = -log of the largest r on the path from the node to the root (top-down max)
        parent = np.full(m, -1, dtype=np.int64)
        for s in range(m):
            for c in (left[s], right[s]):
                if c >= n:
                    parent[c - n] = s
        star = rec["log_odds"].copy()
        for s in range(m - 2, -1, -1):
            star[s] = max(star[s], star[parent[s]])
        heights = np.logaddexp(0.0, -star)  # -log r*, accurate also for r* near 1
        order = np.lexsort((np.arange(m), heights))  # parents sort after their children
        pos = np.empty(m, dtype=np.int64)
        pos[order] = np.arange(m)

        def relabel(c):
            return np.where(c < n, c, n + pos[np.maximum(c - n, 0)])

        stats = {k: rec[k][order] for k in ("log_rk", "log_1m_rk", "log_odds", "log_evidence",
                                             "log_dk", "log_h1")}
        stats["merge_step"] = order.astype(np.int64)
        dend = Dendrogram.from_merges(relabel(left[order]), relabel(right[order]),
                                      heights[order], n, stats=stats)
        return dend, float(rec["log_evidence"][-1])

    @staticmethod
    def _cut(dend: Dendrogram) -> np.ndarray:
        n = dend.n_leaves
        labels = np.empty(n, dtype=np.int64)
        if n == 1:
            labels[0] = 0
            return labels
        Z, log_odds = dend.linkage, dend.stats["log_odds"]
        groups: list[list[int]] = []
        stack = [2 * n - 2]
        while stack:
            c = stack.pop()
            if c < n or log_odds[c - n] >= 0.0:  # r_k >= 1/2
                members: list[int] = []
                sub = [c]
                while sub:
                    x = sub.pop()
                    if x < n:
                        members.append(x)
                    else:
                        sub.extend((int(Z[x - n, 0]), int(Z[x - n, 1])))
                groups.append(members)
            else:
                stack.extend((int(Z[c - n, 0]), int(Z[c - n, 1])))
        groups.sort(key=min)
        for g, members in enumerate(groups):
            labels[members] = g
        return labels

    # ----------------------------------------------------------------------------- hyper
    def _members(self, dend: Dendrogram) -> list[np.ndarray]:
        n = dend.n_leaves
        return [np.array([i]) for i in range(n)] + dend.clusters_of()

    def _optimise(self, X, lik, alpha, rec, dend, evidence):
        base_lik, base_alpha = lik, alpha
        n_tune = 1 + len(base_lik.tunable)
        theta = np.zeros(n_tune)
        best = (evidence, lik, alpha, rec, dend)

        def build(t):
            return base_lik.with_log_multipliers(t[1:]), base_alpha * math.exp(t[0])

        # The fixed-tree optimum of a poor tree can be a poor (even degenerate) local optimum,
        # so first rebuild the tree along a coarse log grid of the main prior scale.
        direction = np.concatenate([[0.0], base_lik.grid_direction])
        for g in np.log(4.0) * np.array([-2.0, -1.0, 1.0, 2.0]):
            lk, al = build(g * direction)
            rec_g = _greedy_bhc(lk, X, math.log(al))
            dend_g, ev_g = self._assemble(rec_g, X.shape[0])
            if ev_g > best[0]:
                theta, best = g * direction, (ev_g, lk, al, rec_g, dend_g)
        logger.info("BHC hyperparameter grid: best evidence %.4f", best[0])

        for it in range(self.max_hyper_iter):
            Z = best[4].linkage
            stats = best[1].node_stats(X, self._members(best[4]))

            def negev(t):
                lk, al = build(t)
                return -bhc_tree_log_evidence(lk.node_log_marginal(stats), Z, al)

            res = minimize(negev, theta, method="L-BFGS-B", bounds=[(-9.0, 9.0)] * n_tune)
            lk, al = build(res.x)
            rec = _greedy_bhc(lk, X, math.log(al))
            dend, ev = self._assemble(rec, X.shape[0])
            logger.info("BHC hyperparameter round %d: fixed-tree evidence %.4f, rebuilt %.4f",
                        it, -res.fun, ev)
            if ev <= best[0] + 1e-8 * abs(best[0]):
                break
            theta = res.x
            best = (ev, lk, al, rec, dend)
        ev, lik, alpha, rec, dend = best
        return lik, alpha, rec, dend, ev

    # ----------------------------------------------------------------------------- predict
    def _log_weights(self) -> np.ndarray:
        """log predictive weight of every node: (n_k / n) r_k prod_{ancestors a} (1 - r_a).

        r_k prod (1 - r_a) is the posterior probability, over the tree-consistent partitions,
        that D_k is one of the clusters; a new point joins a cluster of size n_k with
        probability n_k / n (the Polya urn without its new-cluster term), and the expected sum
        of n_k / n over the clusters of a partition is 1, so the weights sum to one.
        """
        dend = self.dendrogram_
        n = dend.n_leaves
        if n == 1:
            return np.zeros(1)
        Z = dend.linkage
        log_rk, log_1m = dend.stats["log_rk"], dend.stats["log_1m_rk"]
        prefix = np.zeros(2 * n - 1)
        logw = np.empty(2 * n - 1)
        for k in range(n - 2, -1, -1):  # parents have larger row numbers
            c = n + k
            logw[c] = prefix[c] + log_rk[k]
            for child in (int(Z[k, 0]), int(Z[k, 1])):
                prefix[child] = prefix[c] + log_1m[k]
        logw[:n] = prefix[:n]  # a leaf has r = 1
        sizes = np.concatenate([np.ones(n), Z[:, 3]])
        return logw + np.log(sizes / n)

    def predictive_log_density(self, X_new) -> np.ndarray:
        """log p(x | D) for each row of ``X_new``.

        The predictive of the tree is a mixture over all its nodes k (leaves included) of the
        component posterior predictive p(x | D_k), with weight n_k / n times r_k times the
        product of (1 - r_a) over the ancestors a of k (leaves have r = 1): the probability that
        D_k is a cluster of the posterior partition times the chance that x joins it. The
        weights sum to one; the DP's new-cluster term is not included.

        Parameters
        ----------
        X_new : {array-like, sparse matrix} of shape (n_new, n_features)
            New rows, of the kind the model was fitted on.

        Returns
        -------
        log_density : ndarray of shape (n_new,)
        """
        check_is_fitted(self, "dendrogram_")
        X_new = self._validate(X_new, fitted=True)
        if self._node_stats is None:
            self._node_stats = self._lik.node_stats(self._X, self._members(self.dendrogram_))
        logw = self._log_weights()
        out = np.empty(X_new.shape[0])
        chunk = max(1, (1 << 22) // logw.size)
        for s in range(0, X_new.shape[0], chunk):
            lp = self._lik.log_predictive(self._node_stats, X_new[s:s + chunk])
            out[s:s + chunk] = logsumexp(logw[:, None] + lp, axis=0)
        return out
