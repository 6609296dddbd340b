"""Isotropic Gaussian likelihood, the real-valued variant of the model.

Documents are ``x ~ N(theta, sigma_x^2 I)`` in ``R^p``. The new-node marginal integrates a node
mean ``theta ~ N(m, s^2 I)`` out, giving ``N(x; m, (s^2 + sigma_x^2) I)``; it is written in terms
of ``||x||^2``, ``x.m`` and ``||m||^2`` so that callers can evaluate it for many documents and
candidate parents from one matrix product ``X @ Theta.T``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit
from numpy.typing import ArrayLike

from streamtree.inference.enumerated import LINEAR, Candidates
from streamtree.inference.theta_map import map_theta_gaussian
from streamtree.likelihoods.base import Likelihood

__all__ = [
    "Gaussian",
    "estimate_noise_variance",
    "group_log_likelihood",
    "group_log_marginal",
    "log_density",
    "log_new_node_marginal",
    "log_new_node_marginal_nb",
]

_LOG_2PI = math.log(2.0 * math.pi)


def log_density(X: ArrayLike, mean: ArrayLike, var: float) -> np.ndarray:
    """Log density of each row of ``X`` under ``N(mean, var I)``.

    Parameters
    ----------
    X : array_like, shape (n, p) or (p,)
        Observations (a single vector is treated as one row).
    mean : array_like, shape (p,)
        Mean vector.
    var : float
        Isotropic variance, ``var > 0``.

    Returns
    -------
    ndarray, shape (n,)
    """
    X = np.atleast_2d(np.asarray(X, dtype=float))
    mean = np.asarray(mean, dtype=float)
    if mean.ndim != 1 or mean.shape[0] != X.shape[1]:
        raise ValueError(f"mean must have shape ({X.shape[1]},), got {mean.shape}")
    var = float(var)
    if not (np.isfinite(var) and var > 0.0):
        raise ValueError("var must be finite and positive")
    p = X.shape[1]
    diff = X - mean
    sq = np.einsum("ij,ij->i", diff, diff)
    return -0.5 * (p * (_LOG_2PI + math.log(var)) + sq / var)


def log_new_node_marginal(
    sq_norm_x: ArrayLike,
    dot: ArrayLike,
    sq_norm_mean: ArrayLike,
    p: int,
    prior_var: ArrayLike,
    noise_var: ArrayLike,
) -> np.ndarray | float:
    """``log N(x; mean, (prior_var + noise_var) I)`` from inner products.

    Parameters
    ----------
    sq_norm_x : array_like
        ``||x||^2``.
    dot : array_like
        ``x.mean``.
    sq_norm_mean : array_like
        ``||mean||^2``.
    p : int
        Dimension.
    prior_var : array_like
        Variance of the new node's mean around ``mean`` (``s^2``; ``v_p`` for a new node).
    noise_var : array_like
        Document noise variance ``sigma_x^2``.

    Returns
    -------
    ndarray or float
        Broadcast shape of the inputs (a float if all are scalars). The squared distance
        ``||x||^2 - 2 x.mean + ||mean||^2`` is floored at 0 against rounding.
    """
    inputs = (sq_norm_x, dot, sq_norm_mean, prior_var, noise_var)
    args = [np.asarray(a, dtype=float) for a in inputs]
    sx, d, sm, pv, nv = args
    v = pv + nv
    if np.any(v <= 0.0):
        raise ValueError("prior_var + noise_var must be positive")
    sq = np.maximum(sx - 2.0 * d + sm, 0.0)
    out = -0.5 * (p * (_LOG_2PI + np.log(v)) + sq / v)
    if all(a.ndim == 0 for a in args):
        return float(out)
    return out


@njit(cache=True, nogil=True)
def log_new_node_marginal_nb(
    sq_norm_x: float,
    dot: float,
    sq_norm_mean: float,
    p: float,
    prior_var: float,
    noise_var: float,
) -> float:
    """Scalar numba twin of :func:`log_new_node_marginal`."""
    v = prior_var + noise_var
    sq = sq_norm_x - 2.0 * dot + sq_norm_mean
    if sq < 0.0:
        sq = 0.0
    return -0.5 * (p * (_LOG_2PI + math.log(v)) + sq / v)


def estimate_noise_variance(
    sum_x: ArrayLike,
    sum_sq: ArrayLike,
    n: ArrayLike,
    p: int,
    *,
    min_count: int = 2,
    fallback: ArrayLike = np.nan,
    var_min: float = 1e-8,
) -> np.ndarray:
    """Per-cluster pooled isotropic variance from sufficient statistics.

    ``sigma^2 = (sum_sq - ||sum_x||^2 / n) / (p (n - 1))``: the within-cluster sum of squares,
    pooled over the ``p`` coordinates, with the unbiased ``n - 1`` divisor
    (``E[sum of squares] = p (n - 1) sigma^2`` under ``N(theta, sigma^2 I)``).

    Parameters
    ----------
    sum_x : array_like, shape (K, p)
        Per-cluster sums of the vectors.
    sum_sq : array_like, shape (K,)
        Per-cluster sums of ``||x||^2``.
    n : array_like, shape (K,)
        Cluster sizes.
    p : int
        Dimension.
    min_count : int, default=2
        Clusters with ``n < max(min_count, 2)`` get ``fallback`` (one point has no spread).
    fallback : float or array_like, default=nan
        Value(s) for those clusters, broadcastable to ``(K,)``; returned as given.
    var_min : float, default=1e-8
        Floor for estimated entries (a cluster of identical points would give 0).

    Returns
    -------
    ndarray, shape (K,)
    """
    sum_x = np.atleast_2d(np.asarray(sum_x, dtype=float))
    sum_sq = np.atleast_1d(np.asarray(sum_sq, dtype=float))
    n = np.atleast_1d(np.asarray(n, dtype=float))
    k = sum_x.shape[0]
    if sum_x.shape[1] != p or sum_sq.shape != (k,) or n.shape != (k,):
        raise ValueError(
            f"expected sum_x (K, {p}), sum_sq (K,), n (K,); got {sum_x.shape}, "
            f"{sum_sq.shape}, {n.shape}"
        )
    out = np.array(np.broadcast_to(np.asarray(fallback, dtype=float), (k,)), dtype=float)
    ok = n >= max(min_count, 2)
    if ok.any():
        n_ok = n[ok]
        ss = sum_sq[ok] - np.einsum("ij,ij->i", sum_x[ok], sum_x[ok]) / n_ok
        out[ok] = np.maximum(ss / (p * (n_ok - 1.0)), var_min)
    return out


def group_log_marginal(n: float, s: np.ndarray, sumsq: float, mu: np.ndarray, prior_var: float,
                       noise_var: float) -> float:
    """log of the integral of prod_i N(x_i; theta, noise_var I) against N(theta; mu, prior_var I)."""
    p = s.shape[0]
    lam = 1.0 / prior_var + n / noise_var
    m = (mu / prior_var + s / noise_var) / lam
    return float(-0.5 * n * p * np.log(2 * np.pi * noise_var) - 0.5 * p * np.log(prior_var * lam)
                 - sumsq / (2 * noise_var) - mu @ mu / (2 * prior_var) + 0.5 * lam * m @ m)


def group_log_likelihood(n: float, s: np.ndarray, sumsq: float, theta: np.ndarray, noise_var: float) -> float:
    """sum_i log N(x_i; theta, noise_var I) from the group's sufficient statistics."""
    p = s.shape[0]
    return float(-0.5 * n * p * np.log(2 * np.pi * noise_var)
                 - (sumsq - 2 * theta @ s + n * theta @ theta) / (2 * noise_var))


class Gaussian(Likelihood):
    """Isotropic Gaussian nodes on real-valued dense rows: ``x | node ~ N(theta, sigma_x^2 I)``.

    Node means are linked to their parent by ``N(theta_parent, sigma0 sigma1^d I)`` and to their
    previous-epoch mean by ``N(eta theta_prev, sigma0 sigma1^(d + a) I)`` (the root:
    ``N(theta_prev, sigma0 sigma1^a I)``). The concentration is the precision ``1 / sigma_x^2``:
    ``1 / noise_var`` when given, else the pooled within-node variance of nodes with at least
    ``min_node_docs`` documents.
    """

    name = "gaussian"
    for_text = False
    text_norm = None
    params = ("sigma0", "sigma1", "eta", "a", "noise_var", "min_node_docs")

    @classmethod
    def check_input(cls, X, **settings):
        if hasattr(X, "toarray"):
            X = X.toarray()
        X = np.ascontiguousarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D, got shape {X.shape}")
        if not np.all(np.isfinite(X)):
            raise ValueError("X contains NaN or infinite values")
        return X

    def link_strengths(self, depth):
        """Per-node (parent, previous-epoch) link variances (inf where there is no link)."""
        v = self.variant
        d = np.asarray(depth, dtype=np.float64)
        par = self.sigma0 * self.sigma1 ** d if v.parent_link else np.full_like(d, np.inf)
        if not v.time_link:
            tim = np.full_like(d, np.inf)
        elif v.time_kappa is not None:
            tim = np.full_like(d, 1.0 / v.time_kappa)
        else:
            tim = self.sigma0 * self.sigma1 ** (d + self.a)
        return par, tim

    def root_anchor(self, X):
        return np.asarray(X.mean(axis=0)).ravel()

    def initial_root(self, X):
        n, p = X.shape
        mean = self.root_anchor(X)
        if self.noise_var is not None:
            return mean, 1.0 / self.noise_var
        sq = float(np.einsum("ij,ij->", X, X))
        var = estimate_noise_variance(mean[None] * n, np.array([sq]), np.array([float(n)]), p, min_count=2,
                                      fallback=np.array([1.0]))
        return mean, float(1.0 / var[0])

    def kernel(self, arrays, theta, concentration, log_mass, log_residual, *, normalized=True):
        p = self.n_features
        var = 1.0 / np.asarray(concentration, dtype=np.float64)
        ph_rows = np.flatnonzero(np.isfinite(log_residual))
        prior = np.array([self.new_node_prior(int(d) + 1) for d in arrays.depth[ph_rows]], dtype=np.float64)
        sq = np.einsum("ij,ij->i", theta, theta)
        v = prior + var[ph_rows]
        live_a = log_mass - sq / (2 * var)
        ph_a = log_residual[ph_rows] - sq[ph_rows] / (2 * v)
        if normalized:
            live_a = live_a - 0.5 * p * np.log(2 * np.pi * var)
            ph_a = ph_a - 0.5 * p * np.log(2 * np.pi * v)
        cand = Candidates(LINEAR, np.ascontiguousarray(theta.T), live_a, 1.0 / var, -0.5 / var,
                          ph_rows.astype(np.int64), ph_a, 1.0 / v, -0.5 / v)
        return cand, ph_rows

    def new_node_prior(self, depth):
        return self.sigma0 * self.sigma1 ** depth if self.variant.parent_link else self.sigma0

    def new_node_theta(self, theta_parent, concentration, depth, docs):
        prior, var = self.new_node_prior(depth), 1.0 / concentration
        return (theta_parent / prior + docs.s / var) / (1.0 / prior + docs.n / var)

    def _linked_prior(self, theta_parent, depth, theta_prev) -> tuple[np.ndarray, float]:
        """Mean and variance of a depth-``depth`` node's prior: the parent link, or with
        ``theta_prev`` given the product of both links, ``N(theta_parent, par) N(eta theta_prev,
        tim)``, which is ``N(m, v)`` with ``1/v = 1/par + 1/tim`` (as in :meth:`log_marginal`)."""
        if theta_prev is not None:
            par, tim = self.link_strengths(np.array([depth]))
            w_par, w_tim = 1.0 / par[0], 1.0 / tim[0]  # 1/inf = 0: no such link
            if w_tim > 0.0:
                v = 1.0 / (w_par + w_tim)
                return v * (w_par * np.asarray(theta_parent) + w_tim * self.eta * np.asarray(theta_prev)), v
        return np.asarray(theta_parent), self.new_node_prior(depth)

    def sample_node_theta(self, theta_parent, concentration, depth, docs, rng, theta_prev=None):
        mean, prior_var = self._linked_prior(theta_parent, depth, theta_prev)
        lam = 1.0 / prior_var + docs.n * concentration
        m = (mean / prior_var + docs.s * concentration) / lam
        return m + rng.standard_normal(m.shape[0]) / np.sqrt(lam)

    def seed_child_theta(self, theta_node, x):
        return np.array(x, dtype=np.float64, copy=True)

    def log_link(self, theta_child, theta_parent, depth, theta_prev=None):
        mean, prior = self._linked_prior(theta_parent, depth, theta_prev)
        diff = theta_child - mean
        return float(-diff @ diff / (2 * prior) - 0.5 * theta_child.shape[0] * np.log(2 * np.pi * prior))

    def log_marginal(self, docs, theta_parent, concentration, depth, theta_prev=None):
        if theta_prev is None:
            return group_log_marginal(docs.n, docs.s, docs.sumsq, theta_parent, self.new_node_prior(depth),
                                      1.0 / concentration)
        # both links: N(theta_parent, par) N(eta theta_prev, tim) is N(m, v), 1/v = 1/par + 1/tim
        par, tim = self.link_strengths(np.array([depth]))
        w_par, w_tim = 1.0 / par[0], 1.0 / tim[0]  # 1/inf = 0: no such link
        if w_tim == 0.0:
            return self.log_marginal(docs, theta_parent, concentration, depth)
        v = 1.0 / (w_par + w_tim)
        m = v * (w_par * np.asarray(theta_parent) + w_tim * self.eta * np.asarray(theta_prev))
        return group_log_marginal(docs.n, docs.s, docs.sumsq, m, v, 1.0 / concentration)

    def log_likelihood(self, docs, theta, concentration):
        return group_log_likelihood(docs.n, docs.s, docs.sumsq, theta, 1.0 / concentration)

    def drift_statistic(self, theta_now, theta_prev, depth):
        # a step of variance v per coordinate: |theta_now - theta_prev|^2 / v is chi-square with p df
        # (measured from theta_prev itself, not the link's shrunken mean, so a node that stays put
        # does not count as moved)
        _, tim = self.link_strengths(np.array([depth]))
        if not np.isfinite(tim[0]):
            return None
        d = theta_now - theta_prev
        return float(d @ d / tim[0]), float(self.n_features)

    def row_log_likelihood(self, X, theta, concentration):
        X = np.asarray(X, dtype=np.float64)
        d = X - theta
        p = theta.shape[0]
        return -0.5 * p * np.log(2 * np.pi / concentration) - 0.5 * concentration * np.einsum("ij,ij->i", d, d)

    def update_theta(self, arrays, theta, sums, counts, concentration, prev_theta, has_prev, root_anchor,
                     update, n_iter):
        par, tim = self.link_strengths(arrays.depth)
        time_coef = np.where(arrays.parent_index >= 0, self.eta, 1.0)
        if self.variant.time_link and self.variant.time_kappa is None:
            tim[0] = self.sigma0 * self.sigma1 ** self.a  # the root links to its predecessor itself
        return map_theta_gaussian(arrays, theta, sums, counts, 1.0 / concentration, prev_theta, has_prev, par,
                                  time_coef, tim, update=update, n_iter=n_iter)

    def update_concentration(self, counts, sums, sumsq, theta, current):
        current = np.asarray(current, dtype=np.float64)
        ok = counts >= self.min_node_docs
        if self.noise_var is not None:
            return np.where(ok, 1.0 / self.noise_var, current)
        if not ok.any():
            return current.copy()
        var = estimate_noise_variance(sums, sumsq, counts, self.n_features, min_count=self.min_node_docs,
                                      fallback=1.0 / current)
        return 1.0 / var
