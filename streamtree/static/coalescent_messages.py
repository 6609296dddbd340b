"""Belief-propagation messages for Kingman's coalescent likelihoods (Teh, Daume III & Roy, 2007).

Two Markov processes run forward in time down the tree:

* Brownian diffusion with diagonal covariance ``Lambda``; a message is a Gaussian with mean
  ``mu`` and per-dimension variance ``var * lambda_d`` (``var`` in units of ``Lambda``). Missing
  entries carry ``var = inf`` (zero precision) and contribute nothing.
* The independent-sites mutation process on ``K`` states: site ``d`` mutates at rate
  ``lam_d`` to a state drawn from ``q_d``. Messages are vectors over states normalised so that
  ``q_d . M_d = 1``; a missing entry is the all-ones message.

Heights are ages (time before present, leaves at 0). Merging nodes ``a`` and ``b`` at height
``h`` propagates each message up its branch and multiplies them; the normaliser is the local
likelihood ``Z`` of the paper (its eqs. 11 and 14). For the Brownian process the root
distribution is flat (improper), so ``p(x | tree)`` is the product of the ``Z``'s; for the
mutation process the root is at equilibrium and the leaf messages' scaling ``1/q`` is returned by
:meth:`MutationMessages.leaf_log_const`.

All functions are pure: arrays in, arrays out. Pairwise kernels are numba-compiled.
"""

from __future__ import annotations

import math

import numpy as np

import streamtree  # noqa: F401  (configures the numba cache directory)
from numba import njit

LOG2PI = math.log(2.0 * math.pi)


# --------------------------------------------------------------------------- Brownian kernels
@njit(cache=True)
def _bm_logz_one(mu, var, hgt, lam, a, b, h, smin):
    out = 0.0
    for d in range(mu.shape[1]):
        va = var[a, d]
        vb = var[b, d]
        if math.isinf(va) or math.isinf(vb):
            continue
        s = va + vb + 2.0 * h - hgt[a] - hgt[b]
        if s < smin:
            s = smin
        diff = mu[a, d] - mu[b, d]
        out -= 0.5 * (LOG2PI + math.log(lam[d] * s) + diff * diff / (lam[d] * s))
    return out


@njit(cache=True)
def bm_logz_pairs(mu, var, hgt, lam, I, J, H, smin):
    """log Z of merging ``I[k]`` with ``J[k]`` at height ``H[k]``."""
    out = np.empty(I.shape[0])
    for k in range(I.shape[0]):
        out[k] = _bm_logz_one(mu, var, hgt, lam, I[k], J[k], H[k], smin)
    return out


@njit(cache=True)
def _bm_dfun(h, lb, s0, q, nd, rate):
    # derivative (and second derivative) of -rate*h + log Z(h); s_d = s0_d + 2 (h - lb)
    g = -rate
    g2 = 0.0
    for k in range(nd):
        s = s0[k] + 2.0 * (h - lb)
        g += (q[k] - s) / (s * s)
        g2 += 2.0 * (s - 2.0 * q[k]) / (s * s * s)
    return g, g2


@njit(cache=True)
def _bm_opt_one(mu, var, hgt, lam, a, b, rate, hfloor, smin, s0, q):
    lb = max(hgt[a], hgt[b], hfloor)
    nd = 0
    Q = 0.0
    equal = True
    for d in range(mu.shape[1]):
        va = var[a, d]
        vb = var[b, d]
        if math.isinf(va) or math.isinf(vb):
            continue
        s0[nd] = va + vb + 2.0 * lb - hgt[a] - hgt[b]
        diff = mu[a, d] - mu[b, d]
        q[nd] = diff * diff / lam[d]
        Q += q[nd]
        if abs(s0[nd] - s0[0]) > 1e-12 * (1.0 + abs(s0[0])):
            equal = False
        nd += 1
    if nd == 0:
        return lb
    if equal:
        sc = s0[0]
        s = (-nd + math.sqrt(nd * nd + 4.0 * rate * Q)) / (2.0 * rate)
        s = max(s, sc, smin)
        return lb + 0.5 * (s - sc)
    smin0 = s0[0]
    for j in range(nd):
        smin0 = min(smin0, s0[j])
    lo = lb + max(0.0, 0.5 * (smin - smin0))
    g, _ = _bm_dfun(lo, lb, s0, q, nd, rate)
    if g <= 0.0:
        return lo
    gap = 0.0
    sbar = 0.0
    for j in range(nd):
        gap = max(gap, q[j] - s0[j])
        sbar += s0[j] / nd
    hi = lb + 0.5 * gap + 1.0
    # start from the closed form with the offsets replaced by their mean
    s = (-nd + math.sqrt(nd * nd + 4.0 * rate * Q)) / (2.0 * rate)
    h = lb + 0.5 * (s - sbar)
    if not (lo < h < hi):
        h = 0.5 * (lo + hi)
    for _it in range(100):
        g, g2 = _bm_dfun(h, lb, s0, q, nd, rate)
        if g > 0.0:
            lo = h
        else:
            hi = h
        hn = h - g / g2 if g2 < 0.0 else 0.5 * (lo + hi)
        if not (lo < hn < hi):
            hn = 0.5 * (lo + hi)
        if abs(hn - h) <= 1e-12 * (1.0 + abs(h)) or hi - lo <= 1e-13 * (1.0 + abs(hi)):
            return hn
        h = hn
    return h


@njit(cache=True)
def bm_opt_pairs(mu, var, hgt, lam, I, J, rate, hfloor, smin):
    """Height maximising ``-rate * (h - lb) + log Z(h)`` over ``h >= lb`` for each pair.

    ``lb = max(h_I, h_J, hfloor)``. Closed form (paper eq. 12) when all shared dimensions have
    the same variance offset (complete data); safeguarded Newton on the derivative otherwise.
    Returns the optimal heights and the log Z there.
    """
    P = I.shape[0]
    D = mu.shape[1]
    hout = np.empty(P)
    zout = np.empty(P)
    s0 = np.empty(D)
    q = np.empty(D)
    for k in range(P):
        h = _bm_opt_one(mu, var, hgt, lam, I[k], J[k], rate, hfloor, smin, s0, q)
        hout[k] = h
        zout[k] = _bm_logz_one(mu, var, hgt, lam, I[k], J[k], h, smin)
    return hout, zout


@njit(cache=True)
def bm_best_partner(mu, var, hgt, lam, rows, cols, smin):
    """For each node in ``rows``, the partner in ``cols`` with the smallest rate-1 optimal height.
    When ``rows`` and ``cols`` are the same array each pair is evaluated once."""
    D = mu.shape[1]
    s0 = np.empty(D)
    q = np.empty(D)
    R = rows.shape[0]
    besth = np.full(R, np.inf)
    bestp = np.full(R, -1, dtype=np.int64)
    same = rows.shape[0] == cols.shape[0] and np.all(rows == cols)
    for i in range(R):
        a = rows[i]
        j0 = i + 1 if same else 0
        for j in range(j0, cols.shape[0]):
            b = cols[j]
            if a == b:
                continue
            h = _bm_opt_one(mu, var, hgt, lam, a, b, 1.0, 0.0, smin, s0, q)
            if h < besth[i]:
                besth[i] = h
                bestp[i] = b
            if same and h < besth[j]:
                besth[j] = h
                bestp[j] = a
    return besth, bestp


# --------------------------------------------------------------------------- mutation kernels
@njit(cache=True)
def _mut_B(M, q, a, b, d):
    acc = 0.0
    for j in range(M.shape[2]):
        acc += q[d, j] * M[a, d, j] * M[b, d, j]
    return 1.0 - acc


@njit(cache=True)
def _mut_logz_one(M, hgt, lam, q, a, b, h):
    out = 0.0
    tau0 = 2.0 * h - hgt[a] - hgt[b]
    for d in range(M.shape[1]):
        B = _mut_B(M, q, a, b, d)
        if B == 0.0:
            continue
        # 1 - e B written so that short branches keep their precision
        z = (1.0 - B) - B * math.expm1(-lam[d] * tau0)
        if z <= 0.0:
            return -np.inf
        out += math.log(z)
    return out


@njit(cache=True)
def mut_logz_pairs(M, hgt, lam, q, I, J, H):
    """log Z of merging ``I[k]`` with ``J[k]`` at height ``H[k]`` (paper eq. 14)."""
    out = np.empty(I.shape[0])
    for k in range(I.shape[0]):
        out[k] = _mut_logz_one(M, hgt, lam, q, I[k], J[k], H[k])
    return out


@njit(cache=True)
def _mut_dfun(h, tau0, lb, Bs, ls, nd, rate):
    g = -rate
    g2 = 0.0
    # with a common rate (the usual case) one exponential serves every site
    same = True
    for k in range(1, nd):
        if ls[k] != ls[0]:
            same = False
            break
    xc = -ls[0] * (tau0 + 2.0 * (h - lb)) if nd > 0 else 0.0
    ec = math.exp(xc)
    emc = math.expm1(xc)
    for k in range(nd):
        if same:
            x = xc
            e = ec
            em = emc
        else:
            x = -ls[k] * (tau0 + 2.0 * (h - lb))
            e = math.exp(x)
            em = math.expm1(x)
        den = (1.0 - Bs[k]) - Bs[k] * em
        if den <= 0.0:
            return np.inf, -np.inf
        g += 2.0 * ls[k] * Bs[k] * e / den
        g2 -= 4.0 * ls[k] * ls[k] * Bs[k] * e / (den * den)
    return g, g2


@njit(cache=True)
def _mut_opt_one(M, hgt, lam, q, a, b, rate, hfloor, Bs, ls):
    lb = max(hgt[a], hgt[b], hfloor)
    tau0 = 2.0 * lb - hgt[a] - hgt[b]
    nd = 0
    for d in range(M.shape[1]):
        B = _mut_B(M, q, a, b, d)
        if B != 0.0:
            Bs[nd] = B
            ls[nd] = lam[d]
            nd += 1
    lo = lb
    if nd == 0:
        return lo
    g, _ = _mut_dfun(lo, tau0, lb, Bs, ls, nd, rate)
    if g <= 0.0:
        return lo
    step = 1.0
    hi = lb + step
    for _it in range(200):
        g, _ = _mut_dfun(hi, tau0, lb, Bs, ls, nd, rate)
        if g < 0.0:
            break
        lo = hi
        step *= 2.0
        hi = lb + step
    h = 0.5 * (lo + hi)
    for _it in range(100):
        g, g2 = _mut_dfun(h, tau0, lb, Bs, ls, nd, rate)
        if g > 0.0:
            lo = h
        else:
            hi = h
        hn = h - g / g2 if g2 < 0.0 else 0.5 * (lo + hi)
        if not (lo < hn < hi):
            hn = 0.5 * (lo + hi)
        if abs(hn - h) <= 1e-12 * (1.0 + abs(h)) or hi - lo <= 1e-13 * (1.0 + abs(hi)):
            return hn
        h = hn
    return h


@njit(cache=True)
def mut_opt_pairs(M, hgt, lam, q, I, J, rate, hfloor):
    """Height maximising ``-rate * (h - lb) + log Z(h)`` over ``h >= lb`` (safeguarded Newton)."""
    P = I.shape[0]
    D = M.shape[1]
    hout = np.empty(P)
    zout = np.empty(P)
    Bs = np.empty(D)
    ls = np.empty(D)
    for k in range(P):
        h = _mut_opt_one(M, hgt, lam, q, I[k], J[k], rate, hfloor, Bs, ls)
        hout[k] = h
        zout[k] = _mut_logz_one(M, hgt, lam, q, I[k], J[k], h)
    return hout, zout


@njit(cache=True)
def mut_best_partner(M, hgt, lam, q, rows, cols):
    """As :func:`bm_best_partner` for the mutation process."""
    D = M.shape[1]
    Bs = np.empty(D)
    ls = np.empty(D)
    R = rows.shape[0]
    besth = np.full(R, np.inf)
    bestp = np.full(R, -1, dtype=np.int64)
    same = rows.shape[0] == cols.shape[0] and np.all(rows == cols)
    for i in range(R):
        a = rows[i]
        j0 = i + 1 if same else 0
        for j in range(j0, cols.shape[0]):
            b = cols[j]
            if a == b:
                continue
            h = _mut_opt_one(M, hgt, lam, q, a, b, 1.0, 0.0, Bs, ls)
            if h < besth[i]:
                besth[i] = h
                bestp[i] = b
            if same and h < besth[j]:
                besth[j] = h
                bestp[j] = a
    return besth, bestp


# --------------------------------------------------------------------------- message algebras
class BrownianMessages:
    """Gaussian messages of Brownian diffusion with diagonal covariance ``diag(lam)``.

    A message is the tuple ``(mu, var)`` of arrays with a leading node axis.
    """

    # Smallest combined branch variance (in units of Lambda). Duplicate points would otherwise
    # coalesce at zero time with infinite density; the floor keeps every quantity finite.
    smin = 1e-9

    def __init__(self, lam: np.ndarray):
        self.lam = np.asarray(lam, dtype=np.float64)

    def leaves(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        obs = ~np.isnan(X)
        return np.where(obs, X, 0.0), np.where(obs, 0.0, np.inf)

    def alloc(self, X: np.ndarray, n_nodes: int):
        n, D = X.shape
        mu = np.zeros((n_nodes, D))
        var = np.full((n_nodes, D), np.inf)
        mu[:n], var[:n] = self.leaves(X)
        return mu, var

    def empty_like(self, shape_nodes: int):
        D = self.lam.shape[0]
        return np.zeros((shape_nodes, D)), np.full((shape_nodes, D), np.inf)

    @staticmethod
    def take(msg, idx):
        return msg[0][idx], msg[1][idx]

    @staticmethod
    def put(msg, idx, value) -> None:
        msg[0][idx], msg[1][idx] = value

    def propagate(self, msg, tau):
        mu, var = msg
        tau = np.asarray(tau, dtype=np.float64)
        return mu, var + tau[..., None]

    def combine(self, m1, m2):
        """Product of two messages: (message, log Z summed over dimensions)."""
        (a, va), (b, vb) = m1, m2
        both = np.isfinite(va) & np.isfinite(vb)
        with np.errstate(divide="ignore", invalid="ignore"):
            pa = np.where(np.isfinite(va), 1.0 / np.maximum(va, 1e-300), 0.0)
            pb = np.where(np.isfinite(vb), 1.0 / np.maximum(vb, 1e-300), 0.0)
            P = pa + pb
            var = np.where(P > 0, 1.0 / np.where(P > 0, P, 1.0), np.inf)
            mu = np.where(P > 0, (pa * a + pb * b) / np.where(P > 0, P, 1.0), 0.0)
            s = np.maximum(np.where(both, va + vb, 1.0), self.smin) * self.lam
            d = a - b
            lz = np.where(both, -0.5 * (LOG2PI + np.log(s) + d * d / s), 0.0)
        return (mu, var), lz.sum(axis=-1)

    def no_info(self, n_nodes: int):
        return self.empty_like(n_nodes)

    def opt_pairs(self, msg, hgt, I, J, rate, hfloor):
        return bm_opt_pairs(msg[0], msg[1], hgt, self.lam, I, J, float(rate), float(hfloor), self.smin)

    def pair_offset(self, msg, hgt, I, J, h):
        """Half the combined branch variance of each pair at height ``h`` (mean over shared dims)."""
        va, vb = msg[1][I], msg[1][J]
        both = np.isfinite(va) & np.isfinite(vb)
        v = np.where(both, va + vb, 0.0).sum(axis=1) / np.maximum(both.sum(axis=1), 1)
        return 0.5 * v + h - 0.5 * (hgt[I] + hgt[J])

    def best_partner(self, msg, hgt, rows, cols):
        return bm_best_partner(msg[0], msg[1], hgt, self.lam, rows, cols, self.smin)

    def logz_pairs(self, msg, hgt, I, J, H):
        return bm_logz_pairs(msg[0], msg[1], hgt, self.lam, I, J, H, self.smin)

    def leaf_log_const(self, X: np.ndarray) -> float:
        return 0.0

    def log_predict(self, post, t, Y):
        """log density of new points ``Y`` (n_new, D; NaN = unobserved) given the posterior
        ``post`` of their attachment points (arrays broadcast as (..., n_new, D)) at heights ``t``."""
        mu, var = post
        obs = ~np.isnan(Y)
        s = (var + t[..., None]) * self.lam
        d = np.where(obs, Y, 0.0) - mu
        return np.where(obs, -0.5 * (LOG2PI + np.log(s) + d * d / s), 0.0).sum(axis=-1)

    def point_estimate(self, post):
        return post[0]

    @property
    def n_params(self) -> int:
        return self.lam.shape[0]


class MutationMessages:
    """Messages of the independent-sites mutation process (``K`` states per site).

    A message is the tuple ``(M,)`` with ``M`` of shape (nodes, D, K), normalised so that
    ``sum_k q[d, k] M[d, k] = 1``.
    """

    def __init__(self, lam: np.ndarray, q: np.ndarray):
        self.lam = np.asarray(lam, dtype=np.float64)
        self.q = np.asarray(q, dtype=np.float64)

    @property
    def K(self) -> int:
        return self.q.shape[1]

    def leaves(self, X: np.ndarray):
        n, D = X.shape
        M = np.ones((n, D, self.K))
        obs = ~np.isnan(X)
        ii, dd = np.nonzero(obs)
        kk = X[ii, dd].astype(np.int64)
        M[ii, dd, :] = 0.0
        M[ii, dd, kk] = 1.0 / self.q[dd, kk]
        return (M,)

    def alloc(self, X: np.ndarray, n_nodes: int):
        n, D = X.shape
        M = np.ones((n_nodes, D, self.K))
        M[:n] = self.leaves(X)[0]
        return (M,)

    def empty_like(self, shape_nodes: int):
        return (np.ones((shape_nodes, self.q.shape[0], self.K)),)

    @staticmethod
    def take(msg, idx):
        return (msg[0][idx],)

    @staticmethod
    def put(msg, idx, value) -> None:
        msg[0][idx] = value[0]

    def propagate(self, msg, tau):
        (M,) = msg
        tau = np.asarray(tau, dtype=np.float64)
        e = np.exp(-self.lam * tau[..., None])  # (..., D)
        return (1.0 - e[..., None] * (1.0 - M),)

    def combine(self, m1, m2):
        prod = m1[0] * m2[0]
        Z = np.einsum("...dk,dk->...d", prod, self.q)
        with np.errstate(divide="ignore", invalid="ignore"):
            M = prod / Z[..., None]
            lz = np.log(Z).sum(axis=-1)
        return (M,), lz

    def no_info(self, n_nodes: int):
        return self.empty_like(n_nodes)

    def opt_pairs(self, msg, hgt, I, J, rate, hfloor):
        return mut_opt_pairs(msg[0], hgt, self.lam, self.q, I, J, float(rate), float(hfloor))

    def pair_offset(self, msg, hgt, I, J, h):
        """Half the summed branch lengths of each pair at height ``h``."""
        return h - 0.5 * (hgt[I] + hgt[J])

    def best_partner(self, msg, hgt, rows, cols):
        return mut_best_partner(msg[0], hgt, self.lam, self.q, rows, cols)

    def logz_pairs(self, msg, hgt, I, J, H):
        return mut_logz_pairs(msg[0], hgt, self.lam, self.q, I, J, H)

    def leaf_log_const(self, X: np.ndarray) -> float:
        obs = ~np.isnan(X)
        ii, dd = np.nonzero(obs)
        return float(np.log(self.q[dd, X[ii, dd].astype(np.int64)]).sum())

    def state_posterior(self, post):
        w = post[0] * self.q
        return w / w.sum(axis=-1, keepdims=True)

    def log_predict(self, post, t, Y):
        p = self.state_posterior(post)  # (..., n_new, D, K)
        e = np.exp(-self.lam * t[..., None])[..., None]
        probs = e * p + (1.0 - e) * self.q
        obs = ~np.isnan(Y)
        k = np.where(obs, Y, 0).astype(np.int64)
        pk = np.take_along_axis(probs, np.broadcast_to(k[..., None], probs.shape[:-1] + (1,)), axis=-1)[..., 0]
        return np.where(obs, np.log(pk), 0.0).sum(axis=-1)

    def point_estimate(self, post):
        return np.argmax(self.state_posterior(post), axis=-1).astype(np.float64)
