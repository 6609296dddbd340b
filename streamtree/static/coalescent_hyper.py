"""Hyperparameter re-estimation for Kingman's coalescent given a fixed tree.

* Brownian diffusion, ``Lambda = diag(lam)``: independent Gamma(shape ``a``, rate ``b``) priors
  on the precisions ``1/lam_d``. Given the tree, the upward-pass variances (in units of
  ``Lambda``) do not depend on ``lam``, so the conditional posterior of ``1/lam_d`` is
  Gamma(``a + m_d/2``, ``b + r_d/2``) with ``m_d`` the merges where dimension ``d`` is observed on
  both sides and ``r_d = sum (mu_l - mu_r)^2 / s``; the MAP is ``(a + m_d/2 - 1)/(b + r_d/2)``.
  (The supplement writes the rate update as ``1/b_hat = 1/b + r/2`` but the MAP as
  ``(a_hat - 1)/b_hat``; those agree only when ``b`` is a rate, which is what we use.)
* Mutation process: per site, Newton steps with backtracking on the exact per-site log
  likelihood ``log p(x_d | tree)`` (leaf terms included, messages recomputed), over
  ``(logit q_d1, log lam_d)`` for binary data and over ``log lam_d`` for ``K > 2`` states (the
  base distribution then stays at its initial value).
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit, gammaln

from streamtree.static.coalescent_inference import Tree


def brownian_sufficient(tree: Tree) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-dimension (count m_d, sum r_d, sum log s) over merges of a fitted tree."""
    mu, var = tree.msgs
    A, B, h = tree.left, tree.right, tree.heights
    va, vb = var[A], var[B]
    both = np.isfinite(va) & np.isfinite(vb)
    s = np.where(both, va + vb, 1.0) + (2 * h - tree.hgt[A] - tree.hgt[B])[:, None]
    s = np.maximum(s, 1e-9)
    d2 = (mu[A] - mu[B]) ** 2
    m = both.sum(axis=0)
    r = np.where(both, d2 / s, 0.0).sum(axis=0)
    ls = np.where(both, np.log(s), 0.0).sum(axis=0)
    return m.astype(float), r, ls


def brownian_log_objective(tree: Tree, lam: np.ndarray, a: float, b: float) -> float:
    """log p(x | tree, Lambda) + log p(1/Lambda) with Gamma(a, rate b) priors on precisions."""
    m, r, ls = brownian_sufficient(tree)
    tau = 1.0 / np.asarray(lam, float)
    loglik = (-0.5 * m * np.log(2 * np.pi) - 0.5 * ls + 0.5 * m * np.log(tau) - 0.5 * tau * r).sum()
    logprior = (a * np.log(b) - gammaln(a) + (a - 1) * np.log(tau) - b * tau).sum()
    return float(loglik + logprior)


def brownian_map_update(tree: Tree, a: float, b: float) -> np.ndarray:
    """MAP diagonal Lambda given the tree (exact conditional maximiser of the objective)."""
    m, r, _ = brownian_sufficient(tree)
    shape = a + 0.5 * m
    if np.any(shape <= 1.0):
        raise ValueError("the Gamma prior shape must exceed 1 - m_d/2 for a finite MAP; raise variance_prior[0]")
    tau = (shape - 1.0) / (b + 0.5 * r)
    return 1.0 / tau


def mutation_site_loglik(X: np.ndarray, tree: Tree, lam: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Exact ``log p(x_d | tree)`` for every site, for per-site ``lam`` (D,) and ``q`` (D, K).

    The columns of ``X`` may be repeated to evaluate several parameter settings at once.
    """
    n, D = X.shape
    K = q.shape[1]
    M = np.ones((2 * n - 1, D, K))
    obs = ~np.isnan(X)
    ii, dd = np.nonzero(obs)
    kk = X[ii, dd].astype(np.int64)
    M[ii, dd, :] = 0.0
    M[ii, dd, kk] = 1.0 / q[dd, kk]
    out = np.zeros(D)
    out[:] = 0.0
    np.add.at(out, dd, np.log(q[dd, kk]))
    hgt = tree.hgt
    for k in range(n - 1):
        a, b, h = tree.left[k], tree.right[k], tree.heights[k]
        ea = np.exp(-lam * (h - hgt[a]))[:, None]
        eb = np.exp(-lam * (h - hgt[b]))[:, None]
        prod = (1.0 - ea * (1.0 - M[a])) * (1.0 - eb * (1.0 - M[b]))
        Z = (prod * q).sum(axis=1)
        with np.errstate(divide="ignore"):
            out += np.log(Z)
        M[n + k] = prod / Z[:, None]
    return out


def _params(theta: np.ndarray, q0: np.ndarray):
    lam = np.exp(theta[:, -1])
    if theta.shape[1] == 2:
        q1 = expit(theta[:, 0])
        q = np.column_stack([1.0 - q1, q1])
    else:
        q = q0
    return lam, q


def mutation_newton_update(X: np.ndarray, tree: Tree, lam: np.ndarray, q: np.ndarray, n_steps: int = 5,
                           eps: float = 1e-4) -> tuple[np.ndarray, np.ndarray]:
    """Newton steps (finite-difference derivatives, backtracking, never decreasing) on each site's
    exact log likelihood. Binary data: over ``(logit q_d1, log lam_d)``; otherwise ``log lam_d``."""
    D, K = q.shape
    binary = K == 2
    q = np.clip(q, 1e-6, 1 - 1e-6) if binary else q
    theta = np.log(lam)[:, None] if not binary else np.column_stack([np.log(q[:, 1] / q[:, 0]), np.log(lam)])
    p = theta.shape[1]

    def f(th_list):
        th = np.concatenate(th_list, axis=0)
        lm, qq = _params(th, np.tile(q, (len(th_list), 1)))
        v = mutation_site_loglik(np.tile(X, (1, len(th_list))), tree, lm, qq)
        return v.reshape(len(th_list), D)

    for _ in range(n_steps):
        E = [np.zeros((D, p)) for _ in range(p)]
        for j in range(p):
            E[j][:, j] = eps
        pts = [theta] + [theta + E[j] for j in range(p)] + [theta - E[j] for j in range(p)]
        if p == 2:
            pts += [theta + E[0] + E[1], theta - E[0] - E[1]]
        vals = f(pts)
        f0 = vals[0]
        fp, fm = vals[1:1 + p], vals[1 + p:1 + 2 * p]
        g = ((fp - fm) / (2 * eps)).T  # (D, p)
        H = np.empty((D, p, p))
        for j in range(p):
            H[:, j, j] = (fp[j] - 2 * f0 + fm[j]) / eps**2
        if p == 2:
            fpp, fmm = vals[5], vals[6]
            H[:, 0, 1] = H[:, 1, 0] = (fpp - fp[0] - fp[1] + 2 * f0 - fm[0] - fm[1] + fmm) / (2 * eps**2)
        step = np.empty((D, p))
        for d in range(D):
            Hd = H[d]
            ok = np.all(np.isfinite(Hd)) and np.all(np.linalg.eigvalsh(Hd) < 0)
            step[d] = -np.linalg.solve(Hd, g[d]) if ok else 0.1 * g[d]
        step = np.nan_to_num(step)
        step = np.clip(step, -3.0, 3.0)
        accepted = np.zeros(D, bool)
        new_theta = theta.copy()
        alpha = 1.0
        for _ls in range(20):
            cand = theta + alpha * step
            fc = f([cand])[0]
            good = (~accepted) & np.isfinite(fc) & (fc >= f0)
            new_theta[good] = cand[good]
            accepted |= good
            if accepted.all():
                break
            alpha *= 0.5
        theta = new_theta
    lam_new, q_new = _params(theta, q)
    return lam_new, q_new
