"""Time-marginalised coalescent (Boyles & Welling, NIPS 2012): Bayesian hierarchical clustering
with a TMC prior on the topology, Beta stick-breaking node heights and Brownian leaves.

Generative model over ``n`` points in ``R^d``:

* topology ``psi`` ~ TMC prior (see :mod:`streamtree.static.tmc_prior`),
* the root sits at time 1, leaves at time 0; every other internal node ``v`` takes the fraction
  ``B_v = 1 - t_v / t_parent ~ Beta(alpha, beta)`` of its parent's remaining height, so the
  density of the times is ``prod_v Beta(1 - t_v/t_p; alpha, beta) / t_p``,
* Brownian motion with covariance ``sigma2 * I`` per unit time runs from the root (whose location
  has a flat prior) down the tree; the leaves are the data. The likelihood is computed by Gaussian
  message passing; the flat root makes it translation invariant.

Inference alternates, per sweep,

* prune-and-regraft Gibbs moves: every node ``l`` (in random order) is cut out with its parent
  and re-attached on any branch of the remaining tree at any time, drawn from its exact
  conditional by slice sampling over (branch, time) -- see :func:`tmc_kernels.regraft`. Nodes
  whose parent is the root are left in place (cutting them would remove the root, which is
  pinned at time 1). Every topology stays reachable: a leaf on a root side with two or more
  leaves can always be cut and re-attached anywhere, including above the other side's top,
* slice-sampling updates of every non-root internal node's time,
* (``sample_hyperparameters``) the conjugate inverse-Gamma draw of ``sigma2`` and slice-sampling
  updates of ``alpha`` and ``beta`` under Gamma priors on ``alpha - 1`` and ``beta - 1``.

All moves leave ``p(tree, times, sigma2, alpha, beta | X)`` invariant. Differences from the
paper: the time density includes the ``1 / t_parent`` Jacobian (the paper's eq. 7 lists only the
Beta densities of the fractions, which is not a density over the times being sampled), and the cross-branch slice step works in the quantile
coordinate of a grid approximation instead of locating the density's extrema by Newton steps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from math import lgamma, log
from numbers import Integral, Real

import numpy as np
from numpy.polynomial.legendre import leggauss
from scipy import sparse
from scipy.cluster.hierarchy import linkage as scipy_linkage
from scipy.special import betaln, logsumexp
from sklearn.base import BaseEstimator, _fit_context
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted, validate_data

from streamtree.static import tmc_kernels as K
from streamtree.static.dendrogram import Dendrogram
from streamtree.static.tmc_prior import log_tmc_prior

logger = logging.getLogger(__name__)

__all__ = ["TimeMarginalizedCoalescent", "TMCSample", "TreeState"]


@dataclass
class TreeState:
    """A TMC tree in array form (see :mod:`streamtree.static.tmc_kernels` for the layout)."""

    parent: np.ndarray  # (2n-1,) int64, -1 at the root
    ch: np.ndarray  # (2n-1, 2) int64, -1 at leaves
    t: np.ndarray  # (2n-1,) node times, leaves 0, root 1
    m: np.ndarray  # (2n-1,) internal nodes in each subtree
    root: int

    @property
    def n_leaves(self) -> int:
        return (self.parent.shape[0] + 1) // 2

    def copy(self) -> "TreeState":
        return TreeState(self.parent.copy(), self.ch.copy(), self.t.copy(), self.m.copy(), self.root)

    @classmethod
    def from_linkage(cls, Z: np.ndarray, times: np.ndarray | None = None) -> "TreeState":
        """Tree of a SciPy linkage; node ``n + k`` is merge ``k``.

        ``times`` gives the internal nodes' times (root last, equal to 1); by default
        ``(size - 1) / (n - 1)``, which increases strictly towards the root.
        """
        Z = np.asarray(Z, dtype=np.float64)
        n = Z.shape[0] + 1
        N = 2 * n - 1
        parent = np.full(N, -1, dtype=np.int64)
        ch = np.full((N, 2), -1, dtype=np.int64)
        m = np.zeros(N, dtype=np.int64)
        for k in range(n - 1):
            a, b = int(Z[k, 0]), int(Z[k, 1])
            ch[n + k] = (a, b)
            parent[a] = parent[b] = n + k
            m[n + k] = m[a] + m[b] + 1
        t = np.zeros(N)
        if times is None:
            t[n:] = (Z[:, 3] - 1.0) / (n - 1.0)
        else:
            t[n:] = np.asarray(times, dtype=np.float64)
        return cls(parent, ch, t, m, N - 1)

    def to_dendrogram(self) -> Dendrogram:
        """Dendrogram with merges in order of time; heights are the node times."""
        n = self.n_leaves
        internal = np.arange(n, 2 * n - 1)
        internal = internal[np.argsort(self.t[internal], kind="stable")]
        cid = np.arange(2 * n - 1)
        cid[internal] = n + np.arange(n - 1)
        left = cid[self.ch[internal, 0]]
        right = cid[self.ch[internal, 1]]
        frac = np.ones(n - 1)
        for k, v in enumerate(internal):
            if v != self.root:
                frac[k] = 1.0 - self.t[v] / self.t[self.parent[v]]
        return Dendrogram.from_merges(left, right, self.t[internal], n,
                                      stats={"branch_fraction": frac})

    def messages(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Upward Brownian messages ``(umean, uvar)`` of every node; leaf rows are ``X``."""
        n = self.n_leaves
        umean = np.zeros((2 * n - 1, X.shape[1]))
        umean[:n] = X
        uvar = np.zeros(2 * n - 1)
        K.upward_all(self.ch, self.t, self.root, umean, uvar)
        return umean, uvar

    def log_likelihood(self, X: np.ndarray, sigma2: float) -> float:
        """log p(X | tree, sigma2) with a flat prior on the root location."""
        umean, uvar = self.messages(X)
        return float(K.log_likelihood(self.ch, self.t, self.root, umean, uvar, sigma2)[0])

    def log_prior(self, alpha: float, beta: float) -> float:
        """log p(topology) + log p(times | topology)."""
        lb = lgamma(alpha) + lgamma(beta) - lgamma(alpha + beta)
        lt = K.log_time_prior(self.parent, self.ch, self.t, self.root, alpha, beta, lb)[0]
        return log_tmc_prior(self.m[self.n_leaves:]) + float(lt)


@dataclass(frozen=True)
class TMCSample:
    """One retained posterior sample."""

    parent: np.ndarray
    ch: np.ndarray
    t: np.ndarray
    sigma2: float
    alpha: float
    beta: float
    log_posterior: float

    def tree(self) -> TreeState:
        parent = self.parent.astype(np.int64)
        ch = self.ch.astype(np.int64)
        m = np.zeros(parent.shape[0], dtype=np.int64)
        order = np.argsort(self.t, kind="stable")
        for v in order:
            if ch[v, 0] >= 0:
                m[v] = m[ch[v, 0]] + m[ch[v, 1]] + 1
        root = int(np.flatnonzero(parent < 0)[0])
        return TreeState(parent, ch, self.t.copy(), m, root)

    def to_dendrogram(self) -> Dendrogram:
        return self.tree().to_dendrogram()


def _slice_positive(logp, x0: float, lower: float, rng: np.random.Generator, width: float = 1.0,
                    max_steps: int = 50) -> float:
    """Univariate slice sampling (stepping out, shrinkage) on ``(lower, inf)``."""
    y = logp(x0) + log(rng.random())
    left = x0 - width * rng.random()
    right = left + width
    j = int(max_steps * rng.random())
    k = max_steps - 1 - j
    while j > 0 and left > lower and logp(left) > y:
        left -= width
        j -= 1
    while k > 0 and logp(right) > y:
        right += width
        k -= 1
    left = max(left, lower)
    for _ in range(200):
        x1 = left + rng.random() * (right - left)
        if x1 > lower and logp(x1) > y:
            return x1
        if x1 < x0:
            left = x1
        else:
            right = x1
    return x0


def sigma2_posterior(ssq: float, n_leaves: int, dim: int,
                     prior: tuple[float, float]) -> tuple[float, float]:
    """Inverse-Gamma posterior ``(shape, scale)`` of ``sigma2`` given a tree.

    The likelihood is ``prod_v N(yhat_a - yhat_b; 0, sigma2 * s_v * I)`` over the ``n - 1``
    merges, i.e. ``sigma2^{-(n-1)d/2} exp(-ssq / (2 sigma2))`` with
    ``ssq = sum_v ||yhat_a - yhat_b||^2 / s_v``.
    """
    a0, b0 = prior
    return a0 + 0.5 * (n_leaves - 1) * dim, b0 + 0.5 * ssq


def sample_sigma2(ssq: float, n_leaves: int, dim: int, prior: tuple[float, float],
                  rng: np.random.Generator) -> float:
    """Conjugate Gibbs draw of ``sigma2`` from :func:`sigma2_posterior`."""
    shape, scale = sigma2_posterior(ssq, n_leaves, dim, prior)
    return float(scale / rng.gamma(shape))


def log_alpha_beta_posterior(alpha: float, beta: float, slog_b: float, slog_1mb: float,
                             count: int, prior: tuple[float, float]) -> float:
    """log p(alpha, beta | fractions) up to a constant, Gamma(shape, rate) priors on alpha-1,
    beta-1; ``slog_b = sum log B_v``, ``slog_1mb = sum log(1 - B_v)`` over ``count`` nodes."""
    if alpha <= 1.0 or beta <= 1.0:
        return -np.inf
    shape, rate = prior
    return (
        (alpha - 1.0) * slog_b
        + (beta - 1.0) * slog_1mb
        - count * float(betaln(alpha, beta))
        + (shape - 1.0) * (log(alpha - 1.0) + log(beta - 1.0))
        - rate * (alpha - 1.0 + beta - 1.0)
    )


class TimeMarginalizedCoalescent(BaseEstimator):
    """Bayesian hierarchical clustering with the time-marginalised coalescent prior.

    The result is a tree (``dendrogram_``, ``linkage_``) and posterior samples of trees; the
    model has no flat-clustering rule, so it is not a scikit-learn ``ClusterMixin``.

    Parameters
    ----------
    alpha, beta : float
        Beta(alpha, beta) prior of the branch fractions; initial values when
        ``sample_hyperparameters`` (then both must exceed 1, the support of their prior).
    n_sweeps : int
        Gibbs sweeps (each: a prune-and-regraft move per node, a time update per internal node,
        hyperparameter updates).
    burn_in : int
        Sweeps discarded before samples are retained.
    sigma2_prior : (float, float)
        Inverse-Gamma (shape, scale) prior of the Brownian diffusion variance ``sigma2``.
    sample_hyperparameters : bool
        Sample ``sigma2``, ``alpha``, ``beta``; otherwise they stay fixed.
    sigma2 : float or None
        Initial (or fixed) ``sigma2``; None uses the mean per-dimension variance of ``X``.
    alpha_beta_prior : (float, float)
        Gamma (shape, rate) prior of ``alpha - 1`` and of ``beta - 1``.
    thin : int
        Keep every ``thin``-th sweep after burn-in.
    n_grid : int
        Cells per branch of the piecewise-constant approximation that guides the cross-branch
        slice step (only branches whose midpoint density is within 25 nats of the best are
        split; the rest get one cell). Affects mixing speed only, never the target.
    random_state : None, int or numpy.random.Generator
        Seed of the sampler; a fixed seed gives identical runs.

    Attributes
    ----------
    n_features_in_ : int
        Number of features seen during fit.
    X_ : ndarray of shape (n_samples, n_features)
        The training data (the predictive density conditions on it).
    state_ : TreeState
        The sampler's state after the last sweep.
    dendrogram_ : Dendrogram
        The highest-posterior state visited after burn-in (the last state if ``n_sweeps <=
        burn_in``); heights are node times in (0, 1].
    linkage_ : ndarray of shape (n - 1, 4)
        SciPy linkage matrix of ``dendrogram_``.
    log_posterior_trace_ : ndarray of shape (n_sweeps,)
        Joint log density of the state after each sweep (up to a constant).
    sigma2_, alpha_, beta_ : float
        Values at the final sweep.
    samples_ : list of TMCSample
        Retained states (after burn-in, thinned).
    acceptance_ : ndarray of shape (n_sweeps,)
        Fraction of regraft moves that changed the topology, per sweep.
    """

    _parameter_constraints: dict = {
        "alpha": [Interval(Real, 0, None, closed="neither")],
        "beta": [Interval(Real, 0, None, closed="neither")],
        "n_sweeps": [Interval(Integral, 1, None, closed="left")],
        "burn_in": [Interval(Integral, 0, None, closed="left")],
        "sigma2_prior": ["array-like"],
        "sample_hyperparameters": ["boolean"],
        "sigma2": [None, Interval(Real, 0, None, closed="neither")],
        "alpha_beta_prior": ["array-like"],
        "thin": [Interval(Integral, 1, None, closed="left")],
        "n_grid": [Interval(Integral, 1, None, closed="left")],
        "random_state": [None, Interval(Integral, 0, None, closed="left"), np.random.Generator],
    }

    def __init__(self, alpha: float = 2.0, beta: float = 2.0, n_sweeps: int = 100,
                 burn_in: int = 50, sigma2_prior: tuple[float, float] = (1.0, 1.0),
                 sample_hyperparameters: bool = True, sigma2: float | None = None,
                 alpha_beta_prior: tuple[float, float] = (1.0, 0.5), thin: int = 1,
                 n_grid: int = 8, random_state=None) -> None:
        self.alpha = alpha
        self.beta = beta
        self.n_sweeps = n_sweeps
        self.burn_in = burn_in
        self.sigma2_prior = sigma2_prior
        self.sample_hyperparameters = sample_hyperparameters
        self.sigma2 = sigma2
        self.alpha_beta_prior = alpha_beta_prior
        self.thin = thin
        self.n_grid = n_grid
        self.random_state = random_state

    # ------------------------------------------------------------------ validation
    def _check_params(self) -> None:
        """Conditions that involve more than one parameter or the content of a pair."""
        for name in ("alpha", "beta"):
            v = getattr(self, name)
            if self.sample_hyperparameters and v <= 1.0:
                raise ValueError(
                    f"{name}={v!r}: with sample_hyperparameters=True it must exceed 1 "
                    "(its prior is a Gamma on {name} - 1)"
                )
        for name in ("sigma2_prior", "alpha_beta_prior"):
            v = np.asarray(getattr(self, name), dtype=np.float64)
            if v.shape != (2,) or not np.all(np.isfinite(v) & (v > 0)):
                raise ValueError(f"{name} must be two positive numbers (shape, scale/rate), "
                                 f"got {getattr(self, name)!r}")

    def _validate_X(self, X, fitted: bool = False) -> np.ndarray:
        if not sparse.issparse(X) and np.ndim(X) != 2:
            raise ValueError(f"X must be a 2-d array (n_samples, n_features), got shape {np.shape(X)}")
        # copy: the training matrix is kept for prediction
        X = validate_data(self, X, reset=not fitted, dtype=np.float64, copy=True)
        if not fitted and X.shape[0] < 2:
            raise ValueError(f"X needs at least 2 rows (samples), got n_samples = {X.shape[0]}")
        return X

    # ------------------------------------------------------------------ fitting
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None) -> "TimeMarginalizedCoalescent":
        """Run the Gibbs sampler on the rows of ``X``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Real features, at least 2 samples.
        y : None
            Ignored.

        Returns
        -------
        self : TimeMarginalizedCoalescent
            The fitted estimator.
        """
        self._check_params()
        X = self._validate_X(X)
        rng = np.random.default_rng(self.random_state)
        n, d = X.shape
        Z0 = scipy_linkage(X, method="average")
        state = TreeState.from_linkage(Z0)
        sigma2 = float(self.sigma2) if self.sigma2 is not None else float(np.mean(np.var(X, axis=0)))
        if sigma2 <= 0:
            sigma2 = 1.0
        alpha, beta = float(self.alpha), float(self.beta)
        umean, uvar = state.messages(X)

        trace = np.empty(self.n_sweeps)
        accept = np.zeros(self.n_sweeps)
        samples: list[TMCSample] = []
        best: tuple[float, TreeState] | None = None
        internal = np.arange(n, 2 * n - 1)
        N = 2 * n - 1
        for it in range(self.n_sweeps):
            prune_order = rng.permutation(N)
            heights = rng.permutation(internal)
            heights = heights[heights != state.root]
            u = rng.random(N * K.REGRAFT_BUDGET + heights.size * K.HEIGHT_BUDGET)
            moved, tried = K.sweep(prune_order, heights, state.parent, state.ch, state.t, state.m,
                                   state.root, umean, uvar, sigma2, alpha, beta, self.n_grid, 0.05, u)
            accept[it] = moved / max(tried, 1)
            ll, ssq = K.log_likelihood(state.ch, state.t, state.root, umean, uvar, sigma2)
            if self.sample_hyperparameters:
                sigma2 = sample_sigma2(float(ssq), n, d, self.sigma2_prior, rng)
                alpha, beta = self._update_alpha_beta(state, alpha, beta, rng)
                ll = self._loglik_given(state, umean, uvar, sigma2)
            lp = self._log_posterior(state, float(ll), sigma2, alpha, beta)
            trace[it] = lp
            if it >= self.burn_in and (it - self.burn_in) % self.thin == 0:
                samples.append(TMCSample(state.parent.astype(np.int32), state.ch.astype(np.int32),
                                         state.t.copy(), sigma2, alpha, beta, lp))
                if best is None or lp > best[0]:
                    best = (lp, state.copy())
            logger.debug("sweep %d: log posterior %.3f, sigma2 %.4g, alpha %.3g, beta %.3g, moved %d",
                         it, lp, sigma2, alpha, beta, moved)

        rep = best[1] if best is not None else state
        self.X_ = X
        self.state_ = state
        self.dendrogram_ = rep.to_dendrogram()
        self.linkage_ = self.dendrogram_.linkage
        self.log_posterior_trace_ = trace
        self.acceptance_ = accept
        self.sigma2_ = sigma2
        self.alpha_ = alpha
        self.beta_ = beta
        self.samples_ = samples
        return self

    @staticmethod
    def _loglik_given(state: TreeState, umean, uvar, sigma2: float) -> float:
        return float(K.log_likelihood(state.ch, state.t, state.root, umean, uvar, sigma2)[0])

    def _update_alpha_beta(self, state: TreeState, alpha: float, beta: float,
                           rng: np.random.Generator) -> tuple[float, float]:
        _, slog_b, slog_1mb, count = K.log_time_prior(state.parent, state.ch, state.t, state.root,
                                                     alpha, beta, 0.0)
        if count == 0:
            return alpha, beta
        prior = self.alpha_beta_prior
        alpha = _slice_positive(
            lambda a: log_alpha_beta_posterior(a, beta, slog_b, slog_1mb, count, prior), alpha, 1.0, rng)
        beta = _slice_positive(
            lambda b: log_alpha_beta_posterior(alpha, b, slog_b, slog_1mb, count, prior), beta, 1.0, rng)
        return alpha, beta

    def _log_posterior(self, state: TreeState, ll: float, sigma2: float, alpha: float,
                       beta: float) -> float:
        lp = ll + state.log_prior(alpha, beta)
        if self.sample_hyperparameters:
            a0, b0 = self.sigma2_prior
            lp += a0 * log(b0) - lgamma(a0) - (a0 + 1.0) * log(sigma2) - b0 / sigma2
            shape, rate = self.alpha_beta_prior
            for v in (alpha, beta):
                lp += shape * log(rate) - lgamma(shape) + (shape - 1.0) * log(v - 1.0) - rate * (v - 1.0)
        return lp

    # ------------------------------------------------------------------ prediction
    def predictive_log_density(self, X_new, n_quadrature: int = 16,
                               max_samples: int | None = None) -> np.ndarray:
        """log p(x | X) for each row of ``X_new``, averaged over the retained samples.

        For one sample, a new leaf is attached on the branch above node ``i`` at time ``s`` with
        probability proportional to the prior of the enlarged tree (TMC structure term times the
        Beta time factors), normalised over all branches below the root; given the attachment
        point, ``x`` is Gaussian (the branch point's posterior given ``X``, diffused for time
        ``s``). The integral over ``s`` uses ``n_quadrature`` Gauss-Legendre nodes per branch,
        and the prior weights are normalised over those nodes, so each sample contributes an
        exact, normalised Gaussian mixture. The Monte Carlo average over samples is then taken.
        ``max_samples`` keeps that many samples evenly spaced over the retained ones.

        Parameters
        ----------
        X_new : array-like of shape (n_new, n_features)
            New points.
        n_quadrature : int
            Gauss-Legendre nodes per branch for the attachment time.
        max_samples : int or None
            Use at most this many retained samples.

        Returns
        -------
        log_density : ndarray of shape (n_new,)
        """
        check_is_fitted(self, "samples_")
        X_new = self._validate_X(X_new, fitted=True)
        samples = self.samples_ if self.samples_ else [self._final_sample()]
        if max_samples is not None and len(samples) > max_samples:
            idx = np.linspace(0, len(samples) - 1, max_samples).round().astype(int)
            samples = [samples[i] for i in idx]
        gl_x, gl_w = leggauss(int(n_quadrature))
        per_sample = np.empty((len(samples), X_new.shape[0]))
        for s_idx, smp in enumerate(samples):
            per_sample[s_idx] = tree_predictive_log_density(smp.tree(), self.X_, X_new, smp.sigma2,
                                                            smp.alpha, smp.beta, gl_x, gl_w)
        return logsumexp(per_sample, axis=0) - log(len(samples))

    def _final_sample(self) -> TMCSample:
        st = self.state_
        return TMCSample(st.parent, st.ch, st.t, self.sigma2_, self.alpha_, self.beta_,
                         float(self.log_posterior_trace_[-1]))


def tree_predictive_log_density(state: TreeState, X: np.ndarray, X_new: np.ndarray, sigma2: float,
                                alpha: float, beta: float, gl_x: np.ndarray, gl_w: np.ndarray,
                                chunk: int = 256) -> np.ndarray:
    """log density of new points under one tree (Gaussian mixture over attachment points)."""
    umean, uvar = state.messages(X)
    logw, mean, var = K.predictive_components(state.parent, state.ch, state.t, state.m, state.root,
                                              umean, uvar, alpha, beta, gl_x, gl_w)
    logw = logw - logsumexp(logw)
    d = X.shape[1]
    v = sigma2 * var
    const = logw - 0.5 * d * np.log(2.0 * np.pi * v)
    mean_sq = np.einsum("ij,ij->i", mean, mean)
    out = np.empty(X_new.shape[0])
    for start in range(0, X_new.shape[0], chunk):
        xb = X_new[start:start + chunk]
        d2 = np.einsum("ij,ij->i", xb, xb)[:, None] - 2.0 * xb @ mean.T + mean_sq[None, :]
        np.maximum(d2, 0.0, out=d2)
        out[start:start + chunk] = _logsumexp_rows(const[None, :] - 0.5 * d2 / v[None, :])
    return out


def _logsumexp_rows(a: np.ndarray) -> np.ndarray:
    # plain NumPy: scipy's logsumexp carries array-API overhead that dominates here
    mx = a.max(axis=1)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    return np.log(np.exp(a - mx[:, None]).sum(axis=1)) + mx
