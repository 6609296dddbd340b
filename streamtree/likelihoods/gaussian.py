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

__all__ = [
    "estimate_noise_variance",
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
