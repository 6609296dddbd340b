"""Stick samplers of the dTSSBP and node masses in log space.

With windowed counts (past epochs W plus the live epoch X_t) the Gibbs conditionals are

    nu_e      ~ Beta(1 + n_e,  alpha(|e|) + Y_e)
    psi_{e.i} ~ Beta(1 + S_{e.i},  gamma + sum_{j > i} S_{e.j})

where n_e are the documents at e, Y_e those strictly below e, and S = n + Y is the subtree total.
With the live counts left out the same formulas give the epoch's prior. Nodes at the depth cap
have nu = 1; the DP baselines fix nu = 0 at the root so that it holds no data.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamtree  # noqa: F401  (configures the numba cache directory)
import numpy as np
from numba import njit

from streamtree.tree import TreeArrays

# Clip sticks away from 0 and 1 (as the reference TSSB code does) so logs stay finite.
_LOG_EPS = np.log(1e-12)
_LOG_1M_TINY = np.log1p(-1e-12)  # log(1 - 1e-12): the clip of a log stick at 1


@dataclass(frozen=True)
class StickParams:
    """Beta parameters of every node's sticks, aligned with ``TreeArrays`` rows."""

    a_nu: np.ndarray
    b_nu: np.ndarray
    a_psi: np.ndarray
    b_psi: np.ndarray
    nu_fixed: np.ndarray  # NaN where nu is sampled, else the fixed value (0 or 1)


@dataclass(frozen=True)
class Sticks:
    """Sticks in log space: log nu, log(1 - nu), log psi, log(1 - psi). Root psi is 1."""

    log_nu: np.ndarray
    log1m_nu: np.ndarray
    log_psi: np.ndarray
    log1m_psi: np.ndarray


def alpha_at_depth(depth: np.ndarray, alpha0: float, lam: float) -> np.ndarray:
    """alpha(d) = alpha0 * lam**d."""
    return alpha0 * np.power(lam, np.asarray(depth, dtype=np.float64))


def stick_params(
    arrays: TreeArrays,
    own_counts: np.ndarray,
    *,
    alpha0: float,
    lam: float,
    gamma: float,
    max_depth: int | None,
    root_holds_data: bool = True,
) -> StickParams:
    """Beta posterior parameters given per-node document counts (window plus live epoch).

    Parameters
    ----------
    arrays : TreeArrays
        The tree in pre-order.
    own_counts : ndarray, shape (K,)
        Documents at each node itself, summed over the counted epochs.
    """
    own = np.asarray(own_counts, dtype=np.float64)
    K = arrays.size
    if own.shape != (K,):
        raise ValueError(f"own_counts has shape {own.shape}, expected ({K},)")
    S, later = subtree_and_later(np.asarray(arrays.parent_index, dtype=np.int64), own)
    a_nu = 1.0 + own
    b_nu = alpha_at_depth(arrays.depth, alpha0, lam) + (S - own)
    a_psi = 1.0 + S
    b_psi = gamma + later
    return StickParams(a_nu, b_nu, a_psi, b_psi, fixed_nu(arrays.depth, max_depth, root_holds_data))


def fixed_nu(depth: np.ndarray, max_depth: int | None, root_holds_data: bool) -> np.ndarray:
    """Per node (pre-order, the root first): NaN where its ``nu`` is sampled, else its fixed
    value, 1 at the depth cap and 0 at a root that holds no data."""
    depth = np.asarray(depth)
    out = np.full(depth.shape[0], np.nan)
    if max_depth is not None:
        out[depth >= max_depth] = 1.0
    if not root_holds_data:
        out[0] = 0.0
    return out


@njit(cache=True, nogil=True)
def subtree_and_later(pidx: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Subtree totals S and, per node, the totals of its later siblings (rows in pre-order)."""
    K = own.shape[0]
    S = own.copy()
    for k in range(K - 1, 0, -1):  # reverse pre-order visits children before parents
        S[pidx[k]] += S[k]
    later = np.zeros(K)
    acc = np.zeros(K)
    for k in range(K - 1, 0, -1):  # and meets later siblings first
        later[k] = acc[pidx[k]]
        acc[pidx[k]] += S[k]
    return S, later


@njit(cache=True, nogil=True)
def _subtree_masses(pidx, log1m_nu, log_psi, log1m_psi):
    """M (log mass of each subtree), R (M plus log(1 - nu)) and the running sum of
    log(1 - psi) over each parent's children, in one pre-order pass."""
    K = pidx.shape[0]
    M = np.empty(K)
    R = np.empty(K)
    run = np.zeros(K)
    M[0] = 0.0
    for k in range(K):
        if k > 0:
            p = pidx[k]
            M[k] = R[p] + log_psi[k] + run[p]
            run[p] += log1m_psi[k]
        R[k] = M[k] + log1m_nu[k]
    return M, R, run


def _log_beta_draw(a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    # Beta as G1 / (G1 + G2) keeps log x and log(1 - x) accurate near 0 and 1.
    g1 = rng.standard_gamma(a)
    g2 = rng.standard_gamma(b)
    with np.errstate(divide="ignore"):
        lt = np.log(g1 + g2)
        lx = np.log(g1) - lt
        l1mx = np.log(g2) - lt
    # np.clip's values (np.minimum of np.maximum) without its per-call overhead
    lx = np.minimum(np.maximum(lx, _LOG_EPS), _LOG_1M_TINY)
    l1mx = np.minimum(np.maximum(l1mx, _LOG_EPS), _LOG_1M_TINY)
    return lx, l1mx


def _apply_fixed(nu_fixed: np.ndarray, log_nu: np.ndarray, log1m_nu: np.ndarray) -> None:
    one = nu_fixed == 1.0
    zero = nu_fixed == 0.0
    log_nu[one], log1m_nu[one] = 0.0, -np.inf
    log_nu[zero], log1m_nu[zero] = -np.inf, 0.0


def sample_sticks(params: StickParams, rng: np.random.Generator) -> Sticks:
    """One draw of all sticks from their Beta conditionals."""
    log_nu, log1m_nu = _log_beta_draw(params.a_nu, params.b_nu, rng)
    log_psi, log1m_psi = _log_beta_draw(params.a_psi, params.b_psi, rng)
    _apply_fixed(params.nu_fixed, log_nu, log1m_nu)
    log_psi[0], log1m_psi[0] = 0.0, -np.inf
    return Sticks(log_nu, log1m_nu, log_psi, log1m_psi)


def mean_sticks(params: StickParams) -> Sticks:
    """Sticks set to their posterior means (for plug-in predictive densities and reports)."""
    def logs(a, b):
        t = np.log(a + b)
        return np.log(a) - t, np.log(b) - t

    log_nu, log1m_nu = logs(params.a_nu, params.b_nu)
    log_psi, log1m_psi = logs(params.a_psi, params.b_psi)
    _apply_fixed(params.nu_fixed, log_nu, log1m_nu)
    log_psi[0], log1m_psi[0] = 0.0, -np.inf
    return Sticks(log_nu, log1m_nu, log_psi, log1m_psi)


def log_masses(arrays: TreeArrays, sticks: Sticks) -> tuple[np.ndarray, np.ndarray]:
    """Log node masses pi and the log mass of each node's not-yet-created children.

    Returns
    -------
    log_pi : ndarray, shape (K,)
        log pi_e = M(e) + log nu_e, with M(e) the log mass of e's subtree.
    log_residual : ndarray, shape (K,)
        R(e) + sum_j log(1 - psi_{e.j}): the mass of all children of e beyond the existing
        ones (with their subtrees). ``-inf`` at the depth cap. ``log_pi`` and
        ``log_residual`` together sum to exactly 1 in probability.
    """
    M, R, run = _subtree_masses(np.asarray(arrays.parent_index, dtype=np.int64), sticks.log1m_nu,
                                sticks.log_psi, sticks.log1m_psi)
    log_pi = M + sticks.log_nu
    with np.errstate(invalid="ignore"):
        log_residual = R + run
    log_residual[np.isnan(log_residual)] = -np.inf
    return log_pi, log_residual
