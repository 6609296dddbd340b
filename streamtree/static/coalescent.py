"""Kingman's coalescent for Bayesian agglomerative clustering (Teh, Daume III & Roy, NIPS 2007).

A coalescent prior over binary trees with times, a Markov process (Brownian diffusion or an
independent-sites mutation process) running down the tree, and bottom-up greedy or SMC inference.
See :class:`KingmanCoalescent`.
"""

from __future__ import annotations

import logging
from numbers import Integral, Real

import numpy as np
from scipy import sparse
from scipy.special import logsumexp
from sklearn.base import BaseEstimator, ClusterMixin, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from streamtree.static.coalescent_hyper import (
    brownian_log_objective,
    brownian_map_update,
    mutation_newton_update,
)
from streamtree.static.coalescent_inference import downward, greedy_local, greedy_rate1, smc
from streamtree.static.coalescent_messages import BrownianMessages, MutationMessages
from streamtree.static.dendrogram import Dendrogram

logger = logging.getLogger(__name__)

_LIKELIHOODS = ("brownian", "binary", "multinomial")
_METHODS = ("greedy-rate1", "greedy-maxprob", "greedy-minduration", "smc-priorprior", "smc-priorpost",
            "smc-postpost")


def llr_flat_clusters(dendrogram: Dendrogram, llr: np.ndarray, threshold: float = 0.0) -> np.ndarray:
    """Flat clustering from per-merge log likelihood ratios (the paper's NIPS experiment).

    Walk down from the root: a node whose log likelihood ratio ``log Z`` (one tree over its leaves
    versus two independent trees over its children's leaves) exceeds ``threshold`` becomes one
    cluster; otherwise recurse into both children. A leaf reached this way is its own cluster.
    Labels are numbered in left-to-right order of the clusters.
    """
    n = dendrogram.n_leaves
    labels = np.full(n, -1, dtype=np.int64)
    if n == 1:
        return np.zeros(1, np.int64)
    members = dendrogram.clusters_of()
    Z = dendrogram.linkage
    stack = [2 * n - 2]
    nxt = 0
    while stack:
        c = stack.pop()
        if c < n:
            labels[c] = nxt
            nxt += 1
        elif llr[c - n] > threshold:
            labels[members[c - n]] = nxt
            nxt += 1
        else:
            stack.append(int(Z[c - n, 1]))
            stack.append(int(Z[c - n, 0]))
    return labels


def topology_key(left: np.ndarray, right: np.ndarray, n: int) -> np.ndarray:
    """A fingerprint of a binary tree's topology that ignores merge order and heights.

    Each leaf gets a fixed pseudo-random 64-bit key and each internal node the XOR of its
    leaves' keys; the sorted keys of the internal nodes identify the set of clusters (two
    different trees collide with probability about n^2 / 2^64).
    """
    keys = np.random.default_rng(0x5EED).integers(1, 2**63, size=2 * n - 1, dtype=np.uint64)
    for k in range(n - 1):
        keys[n + k] = keys[left[k]] ^ keys[right[k]]
    return np.sort(keys[n:])


def hyperparameter_change(lam: np.ndarray, new_lam: np.ndarray, q: np.ndarray | None = None,
                          new_q: np.ndarray | None = None) -> float:
    """Largest change of the identified part of the hyperparameters, in log units.

    A common factor of all diffusion variances (or mutation rates) trades off against the
    coalescent times and is only weakly identified, so it drifts slowly from round to round;
    the rates relative to their geometric mean set the tree, and those are compared. Base
    distributions (discrete likelihoods) are compared entry by entry.
    """
    def shape(v):
        lv = np.log(v)
        return lv - lv.mean()

    change = float(np.max(np.abs(shape(new_lam) - shape(lam)))) if lam.size else 0.0
    if q is not None and new_q is not None:
        change = max(change, float(np.max(np.abs(np.log(new_q) - np.log(q)))))
    return change


class KingmanCoalescent(ClusterMixin, BaseEstimator):
    """Bayesian hierarchical clustering with Kingman's coalescent prior.

    Parameters
    ----------
    likelihood : {"brownian", "binary", "multinomial"}
        Brownian diffusion with diagonal covariance, or the independent-sites mutation process on
        ``{0, 1}`` / ``{0..K-1}`` valued features. NaN marks an unobserved entry.
    method : str
        ``"greedy-rate1"`` (O(n^2), recommended by the paper), ``"greedy-maxprob"``,
        ``"greedy-minduration"`` (both O(n^3)), ``"smc-priorprior"``, ``"smc-priorpost"``,
        ``"smc-postpost"``.
    n_particles : int
        Particles for the SMC methods.
    n_hyper_iter : int or "auto", default="auto"
        Most rounds of (re-estimate the hyperparameters given the tree, rebuild the tree).
        ``"auto"``: 10 for ``"brownian"``, as in the paper's experiments (its closed-form update
        is cheap), and 1 for the discrete likelihoods, as in the paper's binary experiment (each
        of their rounds runs Newton steps on exact per-site likelihoods and costs several tree
        builds). ``0`` keeps ``diffusion_variance`` / ``mutation_rate`` fixed. The rounds stop
        early once a rebuild gives the same topology as the round before, or once the
        hyperparameters have converged (see ``tol``).
    tol : float, default=0.05
        Convergence threshold of the re-estimation: the rounds end (after one last rebuild)
        when no diffusion variance / mutation rate relative to their geometric mean, and no
        base-distribution entry, changes by more than ``tol`` in log units (5% by default).
        A common factor of all of them trades off against the coalescent times, is only weakly
        identified and keeps drifting slowly, so it is left out of the comparison.
    diffusion_variance : float or array of shape (n_features,)
        Diagonal of ``Lambda`` (Brownian), the initial value when ``n_hyper_iter > 0``.
    variance_prior : (shape, rate)
        Gamma prior on each precision ``1 / lambda_d`` used by the re-estimation.
    mutation_rate : float or array of shape (n_features,)
        Per-site mutation rate (discrete likelihoods); initial value when re-estimated.
    base_distribution : None or array of shape (K,) or (n_features, K)
        Equilibrium distribution ``q`` of the mutation process; ``None`` uses the per-site
        observed state frequencies with add-one smoothing.
    n_states : int or None
        ``K`` for ``"multinomial"``; inferred as ``max(X) + 1`` when ``None``.
    llr_threshold : float
        Threshold of the log likelihood-ratio rule that defines ``labels_`` (the paper uses 0).
    random_state : None, int or numpy Generator
        Seed of the SMC samplers.

    Attributes
    ----------
    n_features_in_ : int
        Number of features seen during fit.
    n_clusters_ : int
        Number of flat clusters in ``labels_``.
    n_states_ : int
        ``K`` (discrete likelihoods).
    n_hyper_iter_ : int
        Hyperparameter rounds actually run (``len(objective_history_) - 1``).
    dendrogram_ : Dendrogram
        The tree; ``stats`` holds ``log_z`` (per-merge log likelihood ratio) and ``duration``.
    linkage_ : ndarray (n - 1, 4)
        SciPy linkage; heights are coalescent times measured backwards (leaves at 0).
    coalescent_times_ : ndarray (n - 1,)
        Merge times as ages (time before present), non-decreasing.
    log_likelihood_ : float
        ``log p(X | tree)`` for greedy methods; the SMC estimate of ``log p(X)`` for SMC.
    log_joint_ : float
        ``log p(X, tree)`` of the returned tree (paper eq. 7).
    labels_ : ndarray (n,)
        Flat clustering by :func:`llr_flat_clusters`.
    diffusion_variance_ : ndarray (n_features,)
        Fitted ``Lambda`` diagonal (Brownian).
    mutation_rate_, base_distribution_ : ndarrays
        Fitted mutation parameters (discrete).
    objective_history_ : list of float
        ``log p(X, tree)`` (plus the log prior of ``Lambda`` for Brownian) after each tree build.
    smc_log_weights_, n_resample_ : SMC only
        Normalised final log weights and the number of resampling steps.

    Notes
    -----
    * Greedy-Rate1 merges a pair at its rate-1 optimal time, or at the current time when that
      optimum is earlier (times never decrease). A pair sharing no observed feature has no
      likelihood information and its optimum is at zero duration.
    * The Brownian root is flat (improper), so Brownian likelihoods are densities defined up to
      translation; ``log_z`` of a merge is then a log density ratio and the LLR threshold 0 of the
      flat clustering depends on the data scale. For the stationary mutation process ``log_z`` is
      a genuine log likelihood ratio.
    * SMC-PostPost works for both likelihoods (its proposal only needs ``Z`` as a function of
      time); the tree reported by SMC is the highest-weight particle.
    * Durations of exact duplicates in two or more dimensions would be zero with infinite
      density; Brownian branch variances are floored at ``1e-9`` (in units of ``Lambda``).
    """

    _parameter_constraints: dict = {
        "likelihood": [StrOptions(set(_LIKELIHOODS))],
        "method": [StrOptions(set(_METHODS))],
        "n_particles": [Interval(Integral, 1, None, closed="left")],
        "n_hyper_iter": [Interval(Integral, 0, None, closed="left"), StrOptions({"auto"})],
        "tol": [Interval(Real, 0, None, closed="left")],
        "diffusion_variance": [Interval(Real, 0, None, closed="neither"), "array-like"],
        "variance_prior": ["array-like"],
        "mutation_rate": [Interval(Real, 0, None, closed="neither"), "array-like"],
        "base_distribution": [None, "array-like"],
        "n_states": [None, Interval(Integral, 2, None, closed="left")],
        "llr_threshold": [Interval(Real, None, None, closed="neither")],
        "random_state": [None, Interval(Integral, 0, None, closed="left"), np.random.Generator],
    }

    def __init__(self, likelihood: str = "brownian", method: str = "greedy-rate1", n_particles: int = 50,
                 n_hyper_iter: int | str = "auto", tol: float = 0.05, diffusion_variance=1.0, variance_prior=(1.1, 1.1), mutation_rate=1.0,
                 base_distribution=None, n_states: int | None = None, llr_threshold: float = 0.0,
                 random_state=None):
        self.likelihood = likelihood
        self.method = method
        self.n_particles = n_particles
        self.n_hyper_iter = n_hyper_iter
        self.tol = tol
        self.diffusion_variance = diffusion_variance
        self.variance_prior = variance_prior
        self.mutation_rate = mutation_rate
        self.base_distribution = base_distribution
        self.n_states = n_states
        self.llr_threshold = llr_threshold
        self.random_state = random_state

    # ------------------------------------------------------------------ validation
    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True  # NaN marks an unobserved entry
        tags.input_tags.positive_only = self.likelihood != "brownian"
        return tags

    def _check_X(self, X, fitted: bool = False) -> np.ndarray:
        if not sparse.issparse(X) and np.ndim(X) != 2:
            raise ValueError(f"X must be 2-dimensional (n_samples, n_features), got shape {np.shape(X)}")
        # copy: the training matrix is kept for prediction and imputation
        X = validate_data(self, X, reset=not fitted, dtype=np.float64, ensure_all_finite="allow-nan",
                          copy=True)
        if self.likelihood != "brownian":
            vals = X[~np.isnan(X)]
            if np.any(vals != np.round(vals)) or np.any(vals < 0):
                raise ValueError("discrete likelihoods need non-negative integer states (or NaN)")
            K = self.n_states_ if fitted else self._n_states(vals)
            if vals.size and vals.max() >= K:
                raise ValueError(f"states must lie in 0..{K - 1}; found {int(vals.max())}")
        return X

    def _n_states(self, vals: np.ndarray) -> int:
        if self.likelihood == "binary":
            return 2
        if self.n_states is not None:
            return int(self.n_states)
        return max(2, int(vals.max()) + 1 if vals.size else 2)

    def _per_feature(self, value, D: int, name: str) -> np.ndarray:
        v = np.asarray(value, dtype=np.float64)
        v = np.full(D, float(v)) if v.ndim == 0 else v
        if v.shape != (D,) or np.any(~np.isfinite(v)) or np.any(v <= 0):
            raise ValueError(f"{name} must be positive, scalar or of shape ({D},)")
        return v.copy()

    # ------------------------------------------------------------------ fit
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None) -> "KingmanCoalescent":
        """Build the coalescent tree of the rows of ``X``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Real features (``"brownian"``) or states ``0..K-1`` (discrete likelihoods); NaN marks
            an unobserved entry. At least 2 samples.
        y : None
            Ignored.

        Returns
        -------
        self : KingmanCoalescent
            The fitted estimator.
        """
        X = self._check_X(X)
        n, D = X.shape
        if n < 2:
            raise ValueError(f"KingmanCoalescent needs at least 2 samples, got n_samples = {n}")
        empty = np.isnan(X).all(axis=0)
        if empty.any():
            raise ValueError(f"features {np.flatnonzero(empty).tolist()} are unobserved in every sample")
        rng = np.random.default_rng(self.random_state)
        if self.likelihood == "brownian":
            lam, q = self._per_feature(self.diffusion_variance, D, "diffusion_variance"), None
            prior = np.asarray(self.variance_prior, dtype=np.float64)
            if prior.shape != (2,) or not np.all(np.isfinite(prior) & (prior > 0)):
                raise ValueError(f"variance_prior must be (shape > 0, rate > 0), got {self.variance_prior!r}")
            a, b = float(prior[0]), float(prior[1])
        else:
            K = self.n_states_ = self._n_states(X[~np.isnan(X)])
            lam = self._per_feature(self.mutation_rate, D, "mutation_rate")
            q = self._base(X, K)
        self.objective_history_ = []
        previous, converged = None, False
        max_rounds = self._max_hyper_rounds()
        for it in range(max_rounds + 1):
            alg = BrownianMessages(lam) if self.likelihood == "brownian" else MutationMessages(lam, q)
            tree, log_marg = self._build(alg, X, rng)
            key = topology_key(tree.left, tree.right, n)
            if self.likelihood == "brownian":
                obj = brownian_log_objective(tree, lam, a, b) + tree.log_prior()
            else:
                obj = float(tree.log_z.sum()) + alg.leaf_log_const(X) + tree.log_prior()
            self.objective_history_.append(obj)
            if converged or it == max_rounds or (previous is not None and np.array_equal(key, previous)):
                break
            previous = key
            if self.likelihood == "brownian":
                new_lam, new_q = brownian_map_update(tree, a, b), None
            else:
                new_lam, new_q = mutation_newton_update(X, tree, lam, q)
            change = hyperparameter_change(lam, new_lam, q, new_q)
            converged = change < float(self.tol)
            lam, q = new_lam, new_q
            logger.debug("hyper iteration %d: objective %.4f, relative change %.4f", it, obj, change)
        self.n_hyper_iter_ = len(self.objective_history_) - 1
        self._alg, self._tree, self._X = alg, tree, X
        self.__dict__.pop("_down", None)
        self.__dict__.pop("_attach", None)
        if self.likelihood == "brownian":
            self.diffusion_variance_ = lam
        else:
            self.mutation_rate_, self.base_distribution_ = lam, q
        loglik = float(tree.log_z.sum()) + alg.leaf_log_const(X)
        self.log_joint_ = loglik + tree.log_prior()
        self.log_likelihood_ = log_marg if log_marg is not None else loglik
        dur = np.diff(np.concatenate([[0.0], tree.heights]))
        self.dendrogram_ = Dendrogram.from_merges(tree.left, tree.right, tree.heights, n,
                                                  stats={"log_z": tree.log_z.copy(), "duration": dur})
        self.linkage_ = self.dendrogram_.linkage
        self.coalescent_times_ = tree.heights.copy()
        self.labels_ = llr_flat_clusters(self.dendrogram_, tree.log_z, float(self.llr_threshold))
        self.n_clusters_ = int(self.labels_.max()) + 1
        return self

    def _max_hyper_rounds(self) -> int:
        if self.n_hyper_iter == "auto":
            return 10 if self.likelihood == "brownian" else 1
        return int(self.n_hyper_iter)

    def _base(self, X: np.ndarray, K: int) -> np.ndarray:
        D = X.shape[1]
        if self.base_distribution is None:
            counts = np.ones((D, K))
            obs = ~np.isnan(X)
            ii, dd = np.nonzero(obs)
            np.add.at(counts, (dd, X[ii, dd].astype(np.int64)), 1.0)
            return counts / counts.sum(axis=1, keepdims=True)
        q = np.asarray(self.base_distribution, dtype=np.float64)
        q = np.broadcast_to(q, (D, K)).copy() if q.ndim == 1 else q
        if q.shape != (D, K) or np.any(q <= 0) or not np.allclose(q.sum(axis=1), 1.0):
            raise ValueError(f"base_distribution must be positive with rows summing to 1, shape ({K},) or ({D}, {K})")
        return q

    def _build(self, alg, X: np.ndarray, rng: np.random.Generator):
        m = self.method
        if m == "greedy-rate1":
            return greedy_rate1(alg, X), None
        if m in ("greedy-maxprob", "greedy-minduration"):
            return greedy_local(alg, X, m.split("-")[1]), None
        res = smc(alg, X, m.split("-")[1], int(self.n_particles), rng)
        self.smc_log_weights_ = res.log_weights
        self.n_resample_ = res.n_resample
        return res.tree, res.log_marginal

    # ------------------------------------------------------------------ prediction
    def _check_fitted(self) -> None:
        check_is_fitted(self, "linkage_")

    def _attachment_index(self, n_quad: int | None = None):
        """Quadrature over where a new point joins the tree: for every entry the branch (node
        below it), the time, the log prior weight, and whether it lies above the root. Between
        events the new lineage joins each of the k alive lineages at rate 1, so the density of
        joining a given branch at time t is ``exp(-int_0^t k(u) du)``."""
        tree = self._tree
        n = tree.n_leaves
        if n_quad is None:
            n_quad = int(np.clip(1e6 // max(n * n / 2, 1), 2, 48))
        xg, wg = np.polynomial.legendre.leggauss(n_quad)
        v = 0.5 * (xg + 1.0)
        nodes, ts, logw = [], [], []
        edges = np.concatenate([[0.0], tree.heights])
        log_surv = 0.0
        alive = np.arange(n)
        for k in range(n - 1):
            lo, hi = edges[k], edges[k + 1]
            kk = n - k
            if hi > lo:
                # t = lo + (hi - lo) v^2 removes the 1/sqrt(t) behaviour of leaf branches near 0
                t = lo + (hi - lo) * v * v
                lw = np.log(wg * (hi - lo) * v) + log_surv - kk * (t - lo)
                nodes.append(np.repeat(alive, n_quad))
                ts.append(np.tile(t, alive.size))
                logw.append(np.tile(lw, alive.size))
                log_surv -= kk * (hi - lo)
            a, b = tree.left[k], tree.right[k]
            alive = np.append(alive[(alive != a) & (alive != b)], n + k)
        # above the root: one lineage, rate 1, no message from above
        xl, wl = np.polynomial.laguerre.laggauss(24)
        root = 2 * n - 2
        nodes.append(np.full(xl.size, root))
        ts.append(tree.hgt[root] + xl)
        logw.append(np.log(wl) + log_surv)
        above = np.zeros(sum(x.size for x in nodes), dtype=bool)
        above[-xl.size:] = True
        return np.concatenate(nodes), np.concatenate(ts), np.concatenate(logw), above

    def _attachment_chunks(self):
        """Yield (posterior message, time, log weight) over blocks of attachment points; small
        trees keep a single cached block, large ones are streamed to bound memory."""
        if hasattr(self, "_attach"):
            yield from self._attach
            return
        tree, alg = self._tree, self._alg
        if not hasattr(self, "_down"):
            self._down = downward(alg, tree)
        par = tree.parent()
        nodes, ts, logw, above = self._attachment_index()
        width = self.n_features_in_ * (2 if self.likelihood == "brownian" else self.n_states_)
        block = max(1, int(4e6 // width))
        chunks = []
        for s in range(0, nodes.size, block):
            sl = slice(s, s + block)
            c, t, ab = nodes[sl], ts[sl], above[sl]
            up = alg.propagate(alg.take(tree.msgs, c), t - tree.hgt[c])
            # the root's outside message is the no-information message: nothing comes from above
            dn = alg.propagate(alg.take(self._down, c), np.where(ab, 0.0, tree.hgt[par[c]] - t))
            post, _ = alg.combine(up, dn)
            chunk = (post, t, logw[sl])
            if nodes.size <= block:
                chunks.append(chunk)
            yield chunk
        if chunks:
            self._attach = chunks

    def predictive_log_density(self, X_new) -> np.ndarray:
        """``log p(x_new | X, tree)`` of each row (NaN entries are marginalised out).

        The new point joins the fitted tree at a branch and time drawn from the conditional
        coalescent (supplement eq. 3), the process value there has the posterior given all
        data (upward and downward messages, supplement eq. 4), and the new point diffuses/mutates
        from it for the joining time. Time is integrated by Gauss-Legendre quadrature (in the square root of the elapsed
        time) within each inter-coalescence interval and Gauss-Laguerre above the root.
        """
        self._check_fitted()
        Y = self._check_X(X_new, fitted=True)
        out = np.full(Y.shape[0], -np.inf)
        for post, ts, logw in self._attachment_chunks():
            for i in range(Y.shape[0]):
                out[i] = np.logaddexp(out[i], logsumexp(logw + self._alg.log_predict(post, ts, Y[i][None, :])))
        return out

    def impute(self, X=None) -> np.ndarray:
        """Fill NaN entries by the posterior mean (Brownian) / most probable state (discrete).

        ``X=None`` (or the training matrix itself) imputes the training data using the tree:
        each leaf's missing entries given all other leaves. Other rows are imputed by averaging
        over where they would join the tree, weighted by their observed entries. The latter
        stores O(n^2) attachment points, so it is meant for trees of up to a few thousand leaves.

        Parameters
        ----------
        X : None or array-like of shape (n_rows, n_features)
            Rows to complete; ``None`` means the training matrix.

        Returns
        -------
        X_filled : ndarray of shape (n_rows, n_features)
            ``X`` with its NaN entries replaced and every observed entry unchanged.
        """
        self._check_fitted()
        alg, tree = self._alg, self._tree
        if X is not None:
            Xa = np.asarray(X, dtype=np.float64)
            if Xa.shape == self._X.shape and np.array_equal(Xa, self._X, equal_nan=True):
                X = None
        if X is None:
            X = self._X
            n = tree.n_leaves
            if not hasattr(self, "_down"):
                self._down = downward(alg, tree)
            par = tree.parent()
            leaves = np.arange(n)
            dn = alg.propagate(alg.take(self._down, leaves), tree.hgt[par[leaves]])
            post, _ = alg.combine(alg.take(tree.msgs, leaves), dn)
            est = alg.point_estimate(post)
            return np.where(np.isnan(X), est, X)
        Y = self._check_X(X, fitted=True)
        rows = np.flatnonzero(np.isnan(Y).any(axis=1))
        lognorm = np.full(rows.size, -np.inf)
        acc = [None] * rows.size  # running weighted sums, scaled by exp(-lognorm)
        for post, ts, logw in self._attachment_chunks():
            if self.likelihood == "brownian":
                value = post[0]
            else:
                e = np.exp(-alg.lam * ts[:, None])[..., None]
                value = e * alg.state_posterior(post) + (1 - e) * alg.q
            for r, i in enumerate(rows):
                lw = logw + alg.log_predict(post, ts, Y[i][None, :])
                new = np.logaddexp(lognorm[r], logsumexp(lw))
                w = np.exp(lw - new)
                part = np.tensordot(w, value, axes=1)
                acc[r] = part if acc[r] is None else acc[r] * np.exp(lognorm[r] - new) + part
                lognorm[r] = new
        out = Y.copy()
        for r, i in enumerate(rows):
            miss = np.isnan(Y[i])
            est = acc[r] if self.likelihood == "brownian" else np.argmax(acc[r], axis=-1)
            out[i, miss] = est[miss]
        return out
