"""Agglomerative inference for Kingman's coalescent: greedy and sequential Monte Carlo.

Every algorithm builds the tree bottom-up as a sequence of merges ``(a, b, h)`` with node ids in
SciPy numbering (leaves ``0..n-1``, merge ``k`` creates node ``n + k``) and non-decreasing
heights ``h`` (ages; leaves at 0). A message algebra from :mod:`coalescent_messages` supplies the
likelihood. The i-th factor of ``p(x, tree)`` (paper eq. 7) is
``exp(-C(m, 2) * delta_i) * Z_i`` with ``m`` lineages present before the merge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import log_ndtr, logsumexp


@dataclass
class Tree:
    """Merges of a coalescent tree and the quantities of its upward pass."""

    left: np.ndarray
    right: np.ndarray
    heights: np.ndarray
    log_z: np.ndarray  # local log likelihood of each merge
    msgs: tuple  # upward messages, node axis first (2n-1 nodes)
    hgt: np.ndarray  # height of every node (0 for leaves)

    @property
    def n_leaves(self) -> int:
        return self.left.shape[0] + 1

    def log_prior(self) -> float:
        """log p(tree) of the n-coalescent (paper eq. 2)."""
        n = self.n_leaves
        m = np.arange(n, 1, -1)
        dur = np.diff(np.concatenate([[0.0], self.heights]))
        return float(-(m * (m - 1) / 2.0 * dur).sum())

    def parent(self) -> np.ndarray:
        n = self.n_leaves
        par = np.full(2 * n - 1, -1, dtype=np.int64)
        par[self.left] = np.arange(n, 2 * n - 1)
        par[self.right] = np.arange(n, 2 * n - 1)
        return par


def merge_message(alg, msgs, hgt, a: int, b: int, h: float):
    ma = alg.propagate(alg.take(msgs, [a]), np.array([h - hgt[a]]))
    mb = alg.propagate(alg.take(msgs, [b]), np.array([h - hgt[b]]))
    m, lz = alg.combine(ma, mb)
    return m, float(lz[0])


def upward(alg, X: np.ndarray, left, right, heights) -> Tree:
    """Upward pass of belief propagation on a fixed tree (paper eqs. 4-6).

    Fewer than ``n - 1`` merges describe a forest; its messages are still valid.
    """
    n = X.shape[0]
    msgs = alg.alloc(X, 2 * n - 1)
    hgt = np.zeros(2 * n - 1)
    lz = np.zeros(len(left))
    for k in range(len(left)):
        a, b, h = int(left[k]), int(right[k]), float(heights[k])
        m, lz[k] = merge_message(alg, msgs, hgt, a, b, h)
        alg.put(msgs, [n + k], m)
        hgt[n + k] = h
    return Tree(np.asarray(left, np.int64), np.asarray(right, np.int64), np.asarray(heights, float), lz, msgs, hgt)


def downward(alg, tree: Tree):
    """Messages from outside each node's subtree, located at the node's parent.

    ``down[c]`` summarises all leaves not below ``c``, as a message on the value of the process at
    ``c``'s parent. The root gets the no-information message.
    """
    n = tree.n_leaves
    N = 2 * n - 1
    down = alg.no_info(N)
    par = tree.parent()
    hgt = tree.hgt
    for k in range(n - 2, -1, -1):
        p = n + k
        a, b = int(tree.left[k]), int(tree.right[k])
        gp = par[p]
        if gp >= 0:
            from_above = alg.propagate(alg.take(down, [p]), np.array([hgt[gp] - hgt[p]]))
        else:
            from_above = alg.no_info(1)
        for c, s in ((a, b), (b, a)):
            sib = alg.propagate(alg.take(tree.msgs, [s]), np.array([hgt[p] - hgt[s]]))
            m, _ = alg.combine(sib, from_above)
            alg.put(down, [c], m)
    return down


# --------------------------------------------------------------------------- greedy
def greedy_rate1(alg, X: np.ndarray) -> Tree:
    """Greedy-Rate1: every pair coalesces at rate 1 from when both exist; merge the pair whose
    optimal coalescence time is most recent.

    Pair optima do not depend on the other lineages, so they are computed once per pair and each
    lineage caches its best partner: O(n^2) pair evaluations overall. When the chosen pair's
    optimum lies below the current height (possible because optima are computed with rate 1 from
    the pair's own start), it is merged at the current height so heights never decrease.
    """
    n = X.shape[0]
    N = 2 * n - 1
    msgs = alg.alloc(X, N)
    hgt = np.zeros(N)
    besth = np.full(N, np.inf)
    bestp = np.full(N, -1, dtype=np.int64)
    act = np.zeros(N, dtype=bool)
    act[:n] = True

    def best_rows(rows: np.ndarray, cols: np.ndarray) -> None:
        besth[rows], bestp[rows] = alg.best_partner(msgs, hgt, rows, cols)

    leaves = np.arange(n)
    best_rows(leaves, leaves)
    left = np.empty(n - 1, np.int64)
    right = np.empty(n - 1, np.int64)
    heights = np.empty(n - 1)
    lz = np.empty(n - 1)
    h_prev = 0.0
    # A row whose cached partner has merged keeps its old value as a lower bound (pair optima
    # never change and the candidate set only loses members, apart from new nodes that are
    # compared on creation); it is recomputed only if it reaches the front.
    stale = np.zeros(N, dtype=bool)
    for k in range(n - 1):
        ids = np.flatnonzero(act)
        while True:
            a = int(ids[np.argmin(besth[ids])])
            if not stale[a]:
                break
            best_rows(np.array([a]), ids)
            stale[a] = False
        b = int(bestp[a])
        h = max(float(besth[a]), h_prev)
        c = n + k
        m, lz[k] = merge_message(alg, msgs, hgt, a, b, h)
        alg.put(msgs, [c], m)
        hgt[c] = h
        left[k], right[k], heights[k] = a, b, h
        h_prev = h
        act[a] = act[b] = False
        act[c] = True
        others = ids[(ids != a) & (ids != b)]
        if others.size == 0:
            break
        hh, _ = alg.opt_pairs(msgs, hgt, np.full(others.size, c), others, 1.0, 0.0)
        j = int(np.argmin(hh))
        besth[c], bestp[c] = hh[j], others[j]
        better = hh < besth[others]
        besth[others[better]] = hh[better]
        bestp[others[better]] = c
        stale[others[better]] = False
        stale[others[(bestp[others] == a) | (bestp[others] == b)]] = True
    return Tree(left, right, heights, lz, msgs, hgt)


def greedy_local(alg, X: np.ndarray, criterion: str) -> Tree:
    """Greedy-MaxProb / Greedy-MinDuration: at every step re-optimise the duration of every pair
    under the current prior rate C(m, 2), then merge the pair maximising the local term
    ``exp(-C delta) Z`` (``"maxprob"``) or with the shortest optimal duration (``"minduration"``,
    ties broken by the local term). O(n^3) overall."""
    n = X.shape[0]
    N = 2 * n - 1
    msgs = alg.alloc(X, N)
    hgt = np.zeros(N)
    ids = np.arange(n)
    left = np.empty(n - 1, np.int64)
    right = np.empty(n - 1, np.int64)
    heights = np.empty(n - 1)
    lz = np.empty(n - 1)
    h_prev = 0.0
    for k in range(n - 1):
        m = ids.size
        C = m * (m - 1) / 2.0
        iu, ju = np.triu_indices(m, 1)
        I, J = ids[iu], ids[ju]
        h, z = alg.opt_pairs(msgs, hgt, I, J, C, h_prev)
        score = -C * (h - h_prev) + z
        if criterion == "maxprob":
            p = int(np.argmax(score))
        else:
            hmin = h.min()
            cand = np.flatnonzero(h <= hmin + 1e-12 * (1.0 + abs(hmin)))
            p = int(cand[np.argmax(score[cand])])
        a, b, hk = int(I[p]), int(J[p]), float(h[p])
        c = n + k
        mm, lz[k] = merge_message(alg, msgs, hgt, a, b, hk)
        alg.put(msgs, [c], mm)
        hgt[c] = hk
        left[k], right[k], heights[k] = a, b, hk
        h_prev = hk
        ids = np.append(ids[(ids != a) & (ids != b)], c)
    return Tree(left, right, heights, lz, msgs, hgt)


# --------------------------------------------------------------------------- SMC
@dataclass
class SMCResult:
    tree: Tree
    log_marginal: float
    log_weights: np.ndarray  # normalised final log weights
    n_resample: int


def _systematic_resample(logw: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    S = logw.size
    w = np.exp(logw - logsumexp(logw))
    cum = np.cumsum(w)
    cum[-1] = 1.0
    u = (rng.random() + np.arange(S)) / S
    return np.searchsorted(cum, u)


def _seg_logmass(L0, L1, w):
    d = np.abs(L1 - L0)
    m = np.maximum(L0, L1)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(d > 1e-10, -np.expm1(-d) / np.where(d > 1e-10, d, 1.0), 1.0)
    return m + np.log(w) + np.log(f)


class _PostPostProposal:
    """Proposal for (pair, duration) approximating ``exp(-C delta) Z(delta)``, for all particles.

    Work in ``u = log(delta)``. A pair is chosen with probability proportional to a Laplace
    approximation of its integral ``int exp(-C delta) Z(delta) d delta`` (a boundary-exponential
    approximation when the optimum is at ``delta = 0``). For the chosen pair the log target is
    evaluated on a fine grid around its optimum and interpolated linearly (a piecewise-exponential
    density) with exponential tails at least as heavy as the target's (slope >= 1/2 on the left,
    <= -1 on the right), so the proposal covers the whole support. The weight uses the exact
    density of this proposal, so the approximations only affect variance, never the target.
    Pairs are given as flat node indices of shape (S, P) (one row per particle).
    """

    G = 97

    def __init__(self, alg, msgs, hgt, I, J, C, h_prev):
        S, P = I.shape
        self.S, self.P = S, P
        self.I, self.J = I.ravel(), J.ravel()
        self.hp = np.repeat(h_prev, P)
        self.alg, self.msgs, self.hgt, self.C = alg, msgs, hgt, C
        h_opt = np.empty(S * P)
        for s in range(S):  # the kernel takes one lower bound per call
            sl = slice(s * P, (s + 1) * P)
            h_opt[sl], _ = alg.opt_pairs(msgs, hgt, self.I[sl], self.J[sl], C, h_prev[s])
        d_opt = h_opt - self.hp
        self.ref = np.where(d_opt > 1e-9 / C, d_opt, 1.0 / C)
        # Laplace approximation, truncated to delta >= 0, in x = log(c + delta) where c is the
        # pair's branch-length offset: in x the target is close to log-concave (exactly so for
        # complete Brownian data, where s = 2(c + delta) gives a generalised inverse Gaussian).
        k_all = np.arange(S * P)
        c = np.maximum(alg.pair_offset(msgs, hgt, self.I, self.J, self.hp), 1e-12 / C)
        x0 = np.log(c + d_opt)
        e = 0.02
        xs = np.concatenate([x0 - e, x0, x0 + e])
        dd = np.maximum(np.exp(xs) - np.tile(c, 3), 0.0)
        L = (self.log_delta_target(np.tile(k_all, 3), dd) + xs).reshape(3, -1)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            c2 = (L[0] - 2 * L[1] + L[2]) / e**2
            c1 = (L[2] - L[0]) / (2 * e)
            sig = 1.0 / np.sqrt(-c2)
            xhat = x0 + c1 / -c2
            lap = L[1] + 0.5 * c1**2 / -c2 + 0.5 * np.log(2 * np.pi) + np.log(sig) + log_ndtr((xhat - np.log(c)) / sig)
            ok = (c2 < 0) & (np.abs(c1 / c2) <= 2.0) & np.isfinite(lap)
            logm = np.where(ok, lap, L[1] + np.log(c + d_opt))
            # an optimum at the boundary is better described by exp(f(0) + f'(0) delta)
            step = 1e-3 * (c + self.ref)
            f = self.log_delta_target(np.tile(k_all, 2), np.concatenate([np.zeros(S * P), step])).reshape(2, -1)
            slope = (f[1] - f[0]) / step
            edge = np.where(slope < 0, f[0] - np.log(-slope), -np.inf)
            boundary = d_opt <= 1e-9 / C
            logm = np.where(boundary & np.isfinite(edge), edge,
                            np.where(np.isfinite(edge), np.maximum(logm, edge), logm))
        bad = ~np.isfinite(logm)
        if bad.any():  # crude but positive: the weight corrects any error here
            kk = k_all[bad]
            logm[kk] = self.log_target(kk, np.log(self.ref[kk]))
            logm[kk] = np.where(np.isfinite(logm[kk]), logm[kk], -700.0)
        self.pair_logmass = logm
        self.total = logsumexp(logm.reshape(S, P), axis=1)  # (S,)

    def log_delta_target(self, k, d):
        z = self.alg.logz_pairs(self.msgs, self.hgt, self.I[k], self.J[k], self.hp[k] + d)
        return -self.C * d + z

    def log_target(self, k, u):
        return self.log_delta_target(k, np.exp(u)) + u

    def _fine(self, k: np.ndarray) -> None:
        self.k = k
        self.u = np.log(self.ref[k])[:, None] + np.linspace(-16.0, 4.5, self.G)[None, :]
        self.L = self.log_target(np.repeat(k, self.G), self.u.ravel()).reshape(k.size, self.G)
        slope = np.diff(self.L, axis=1) / np.diff(self.u, axis=1)
        self.sl = np.maximum(np.nan_to_num(slope[:, 0], nan=0.5, neginf=0.5, posinf=0.5), 0.5)
        self.sr = np.minimum(np.nan_to_num(slope[:, -1], nan=-1.0, neginf=-1.0, posinf=-1.0), -1.0)
        seg = _seg_logmass(self.L[:, :-1], self.L[:, 1:], np.diff(self.u, axis=1))
        tails = np.stack([self.L[:, 0] - np.log(self.sl), self.L[:, -1] - np.log(-self.sr)], axis=1)
        self.parts = np.concatenate([tails[:, :1], seg, tails[:, 1:]], axis=1)  # (S, G+1)
        self.fine_logmass = logsumexp(self.parts, axis=1)

    def log_proposal(self, u: np.ndarray) -> np.ndarray:
        """log density (in u, pair included) of the draws made by :meth:`sample`."""
        uu, L, k = self.u, self.L, self.k
        g = np.clip((uu <= u[:, None]).sum(axis=1) - 1, 0, self.G - 2)
        r = np.arange(k.size)
        t = (u - uu[r, g]) / (uu[r, g + 1] - uu[r, g])
        inner = (1 - t) * L[r, g] + t * L[r, g + 1]
        val = np.where(u < uu[:, 0], L[:, 0] + self.sl * (u - uu[:, 0]),
                       np.where(u > uu[:, -1], L[:, -1] + self.sr * (u - uu[:, -1]), inner))
        return val - self.fine_logmass + self.pair_logmass[k] - self.total

    def sample(self, rng: np.random.Generator):
        S, P = self.S, self.P
        pw = np.exp(self.pair_logmass.reshape(S, P) - self.total[:, None])
        p = _choose_rows(pw, rng)
        k = np.arange(S) * P + p
        self._fine(k)
        parts = np.exp(self.parts - self.fine_logmass[:, None])
        j = _choose_rows(parts, rng)
        U = rng.random(S)
        uu, L = self.u, self.L
        r = np.arange(S)
        g = np.clip(j - 1, 0, self.G - 2)
        w = uu[r, g + 1] - uu[r, g]
        d = L[r, g + 1] - L[r, g]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            up = uu[r, g + 1] + (w / d) * np.log(U + (1 - U) * np.exp(-d))
            dn = uu[r, g] + (w / d) * np.log1p(-U * (-np.expm1(d)))
            inner = np.where(np.abs(d) < 1e-10, uu[r, g] + U * w, np.where(d > 0, up, dn))
            u = np.where(j == 0, uu[:, 0] + np.log(U) / self.sl,
                         np.where(j == self.G, uu[:, -1] + np.log(U) / self.sr, inner))
        return p, k, u


def _choose_rows(prob: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One categorical draw per row of an (unnormalised) probability matrix."""
    cum = np.cumsum(prob, axis=1)
    u = rng.random(prob.shape[0]) * cum[:, -1]
    return np.minimum((cum < u[:, None]).sum(axis=1), prob.shape[1] - 1)


def smc(alg, X: np.ndarray, proposal: str, n_particles: int, rng: np.random.Generator,
        resample: bool = True) -> SMCResult:
    """Sequential Monte Carlo over coalescent trees (paper section 4.1), vectorised over particles.

    Proposals: ``"priorprior"`` (duration and pair from the prior), ``"priorpost"`` (duration from
    the prior, pair from its local posterior) and ``"postpost"`` (duration and pair from their
    local posterior). Weights follow eq. 8 with the exact proposal densities; in particular the
    PriorPost increment is the *mean* local likelihood over pairs (the prior picks each pair with
    probability 1/C(m, 2)), which makes the marginal-likelihood estimate unbiased. Systematic
    resampling whenever the effective sample size falls below half the particles. Returns the
    highest-weight tree and the log marginal likelihood estimate.
    """
    n = X.shape[0]
    N = 2 * n - 1
    S = n_particles
    base = alg.alloc(X, N)
    # particle s owns flat node slots s*N .. s*N + N - 1 so the pair kernels run unchanged
    msgs = tuple(np.tile(a, (S,) + (1,) * (a.ndim - 1)) for a in base)
    hgt = np.zeros(S * N)
    off = np.arange(S) * N
    ids = np.tile(np.arange(n), (S, 1))
    left = np.empty((S, n - 1), np.int64)
    right = np.empty((S, n - 1), np.int64)
    heights = np.empty((S, n - 1))
    lz = np.empty((S, n - 1))
    h = np.zeros(S)
    logw = np.full(S, -math.log(S))
    log_marg = 0.0
    n_res = 0
    rows = np.arange(S)
    for k in range(n - 1):
        m = n - k
        C = m * (m - 1) / 2.0
        iu, ju = np.triu_indices(m, 1)
        I, J = ids[:, iu] + off[:, None], ids[:, ju] + off[:, None]  # flat, (S, P)
        P = iu.size
        if proposal == "postpost":
            prop = _PostPostProposal(alg, msgs, hgt, I, J, C, h)
            p, kk, u = prop.sample(rng)
            h_new = h + np.exp(u)
            inc = prop.log_target(kk, u) - prop.log_proposal(u)
        else:
            h_new = h + rng.exponential(1.0 / C, size=S)
            if proposal == "priorprior":
                p = rng.integers(P, size=S)
                inc = alg.logz_pairs(msgs, hgt, I[rows, p], J[rows, p], h_new)
            else:
                z = alg.logz_pairs(msgs, hgt, I.ravel(), J.ravel(), np.repeat(h_new, P)).reshape(S, P)
                lse = logsumexp(z, axis=1)
                inc = lse - math.log(P)
                p = _choose_rows(np.exp(z - lse[:, None]), rng)
        a, b = I[rows, p], J[rows, p]
        ma = alg.propagate(alg.take(msgs, a), h_new - hgt[a])
        mb = alg.propagate(alg.take(msgs, b), h_new - hgt[b])
        mm, lzk = alg.combine(ma, mb)
        c = off + n + k
        alg.put(msgs, c, mm)
        hgt[c] = h_new
        left[:, k], right[:, k], heights[:, k], lz[:, k] = a - off, b - off, h_new, lzk
        h = h_new
        keep = (ids != (a - off)[:, None]) & (ids != (b - off)[:, None])
        ids = np.column_stack([ids[keep].reshape(S, m - 2), np.full(S, n + k)])
        log_marg += float(logsumexp(logw + inc))
        logw = logw + inc
        logw = logw - logsumexp(logw)
        ess = 1.0 / np.exp(logsumexp(2 * logw))
        if resample and ess < S / 2 and k < n - 2:
            idx = _systematic_resample(logw, rng)
            src = (idx[:, None] * N + np.arange(N)[None, :]).ravel()
            msgs = tuple(arr[src] for arr in msgs)
            hgt = hgt[src]
            ids, left, right, heights, lz, h = ids[idx], left[idx], right[idx], heights[idx], lz[idx], h[idx]
            logw = np.full(S, -math.log(S))
            n_res += 1
    s = int(np.argmax(logw))
    sl = slice(s * N, (s + 1) * N)
    tree = Tree(left[s], right[s], heights[s], lz[s], tuple(arr[sl] for arr in msgs), hgt[sl])
    return SMCResult(tree, log_marg + alg.leaf_log_const(X), logw, n_res)
