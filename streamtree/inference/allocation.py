"""Sequentially allocated split proposals (after Dahl's sequentially-allocated merge-split).

A split of node ``a`` keeps document ``i`` at ``a`` and sends document ``j`` to the other side
``b``; the other documents of the merged group are visited in an order drawn uniformly at
random, and each goes to ``b`` with probability

    p = w(n_b) g_b(x) / (w(n_b) g_b(x) + w(n_a) f(x | theta_a)),

clipped to ``[EPS, 1 - EPS]``, where ``n_a`` and ``n_b`` count the documents already on each
side (``i`` and ``j`` included, so both start at 1), ``w(n) = n`` (:func:`log_side_weight`, the
Polya-urn factor that the sticks' collapsed prior also carries: splitting off ``k`` of ``n``
documents there costs about ``log C(n, k)``, not ``n log 2``), ``f(x | theta_a)`` the
likelihood at ``a``'s parameter (``a`` keeps it through the move, so this is the target's own
factor for the staying side) and ``g_b`` either

* for a new node, the collapsed predictive of ``x`` given the documents already on its side,
  its parameter integrated out under its parent link
  (:meth:`~streamtree.likelihoods.base.Likelihood.running_predictive`, whose terms sum to the
  family's ``log_marginal``), or
* for a kept node, the likelihood at its own parameter (it keeps it).

The probability of the realised split is the product of the visited documents' ``p`` or
``1 - p``. The order is an auxiliary variable drawn uniformly and independently of the state
in both directions (the merge scores the split it reverses under a fresh order): for each
order the pair (split with this proposal, deterministic merge) is a Metropolis-Hastings
kernel that leaves the target invariant, and a mixture of such kernels over a
state-independent order does too, so the order's probability never enters the ratio.
"""

from __future__ import annotations

import math

import numpy as np

from streamtree.likelihoods.base import RunningPredictive

#: floor on every per-document allocation probability of a split proposal
EPS = 1e-3
_LOG_EPS, _LOG_1M_EPS = math.log(EPS), math.log1p(-EPS)


def log_side_weight(n: int) -> float:
    """log of a side's weight in the allocation, with ``n`` documents on it so far: the
    Polya-urn count of the sticks' collapsed prior."""
    return math.log(n)


def sequential_allocation(rows: np.ndarray, order: np.ndarray, log_stay: np.ndarray,
                          new_side: RunningPredictive | np.ndarray, *, u: np.ndarray | None = None,
                          to_new: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Draw (``u``: one uniform per visit) or score (``to_new``) a sequential allocation.

    Parameters
    ----------
    rows : ndarray of int, shape (m,)
        The documents to allocate (rows of the matrix ``new_side`` reads).
    order : ndarray of int, shape (m,)
        A permutation of ``range(m)``: the visiting order of the positions of ``rows``.
    log_stay : ndarray, shape (m,)
        ``log f(x | theta_a)`` of each document (the staying side).
    new_side : RunningPredictive or ndarray, shape (m,)
        The other side: a running collapsed predictive (a new node, seeded with ``j``'s row
        already), or each document's log likelihood at a kept node's parameter.
    u, to_new : ndarray, shape (m,)
        Exactly one of them: uniforms indexed by visit step (draw) or the allocation to score,
        aligned with ``rows``.

    Returns
    -------
    to_new : ndarray of bool, shape (m,)
        Whether each of ``rows`` goes to the other side.
    log_q : float
        The log probability of that allocation given the order.
    """
    if (u is None) == (to_new is None):
        raise ValueError("give exactly one of u (draw) and to_new (score)")
    draw = to_new is None
    out = np.zeros(rows.size, dtype=bool) if draw else np.asarray(to_new, dtype=bool)
    running = isinstance(new_side, RunningPredictive)
    # Python scalars: the loop is sequential (each step reads the previous ones' outcome)
    rows_l, stay_l = rows.tolist(), np.asarray(log_stay, dtype=np.float64).tolist()
    fixed_l = None if running else np.asarray(new_side, dtype=np.float64).tolist()
    u_l = u.tolist() if draw else None
    n_a = n_b = 1  # i and j
    log_q = 0.0
    for t, k in enumerate(order.tolist()):
        lp_b = new_side.log_predictive(rows_l[k]) if running else fixed_l[k]
        logit = log_side_weight(n_b) + lp_b - log_side_weight(n_a) - stay_l[k]
        # log p and log (1 - p) of the clipped logistic, stable at both ends
        if logit >= 0.0:
            log_p, log_1mp = -math.log1p(math.exp(-logit)), -logit - math.log1p(math.exp(-logit))
        else:
            log_p, log_1mp = logit - math.log1p(math.exp(logit)), -math.log1p(math.exp(logit))
        log_p = min(max(log_p, _LOG_EPS), _LOG_1M_EPS)
        log_1mp = min(max(log_1mp, _LOG_EPS), _LOG_1M_EPS)
        go = u_l[t] < math.exp(log_p) if draw else bool(out[k])
        if go:
            out[k] = True
            log_q += log_p
            n_b += 1
            if running:
                new_side.add(rows_l[k])
        else:
            log_q += log_1mp
            n_a += 1
    return out, log_q
