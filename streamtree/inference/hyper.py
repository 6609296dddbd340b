"""Slice sampling of the stick hyperparameters alpha0, lam and gamma (as in Adams et al., 2010).

Given the tree and the windowed document counts, the sticks integrate out of the TSSB prior in
closed form (:func:`streamtree.inference.merge.collapsed_log_prior` with no past), so each
hyperparameter has the one-dimensional conditional

    p(h | counts, others) ∝ prior(h) x prod_nodes B(1 + n_e, alpha(|e|) + Y_e) / B(1, alpha(|e|))
                                     x prod_edges B(1 + S_e.i, gamma + later) / B(1, gamma + ...)

Priors (:data:`HYPER_PRIORS`): ``alpha0`` and ``gamma`` log-uniform on ``[1e-2, 1e2]`` (scale
free over four decades), ``lam`` uniform on ``[1e-3, 1]`` (kept off 0, where the depth
scale ``alpha0 lam^d`` of a deep tree underflows). Each update is one univariate slice
sampling step (Neal, 2003) on the bounded support (log scale for ``alpha0`` and ``gamma``),
with shrinkage from the whole support, so it needs no step size and is exact.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.special import betaln

from streamtree.inference.merge import collapsed_log_prior
from streamtree.inference.sticks import alpha_at_depth, fixed_nu, subtree_and_later
from streamtree.tree import TreeArrays

#: name -> (low, high, log scale): the support of each hyperparameter's prior
HYPER_PRIORS: dict[str, tuple[float, float, bool]] = {
    "alpha0": (1e-2, 1e2, True),
    "lam": (1e-3, 1.0, False),
    "gamma": (1e-2, 1e2, True),
}


def log_hyper_likelihood(arrays: TreeArrays, counts: np.ndarray, *, alpha0: float, lam: float, gamma: float,
                         max_depth: int | None, root_holds_data: bool) -> float:
    """log p(windowed assignments | tree, alpha0, lam, gamma), sticks integrated out."""
    return collapsed_log_prior(arrays, np.zeros_like(counts, dtype=np.float64), np.asarray(counts, np.float64),
                               alpha0=alpha0, lam=lam, gamma=gamma, max_depth=max_depth,
                               root_holds_data=root_holds_data)


class HyperTarget:
    """:func:`log_hyper_likelihood` for one tree and one set of counts, as its two factors: the
    ``nu`` sticks' terms (:meth:`log_nu`, a function of ``alpha0`` and ``lam`` alone) and the
    ``psi`` sticks' (:meth:`log_psi`, of ``gamma`` alone). The counts' sums are taken once, and
    each slice update evaluates only the factor its parameter enters (the other is a constant
    of that conditional)."""

    def __init__(self, arrays: TreeArrays, counts: np.ndarray, *, max_depth: int | None,
                 root_holds_data: bool) -> None:
        own = np.asarray(counts, dtype=np.float64)
        S, later = subtree_and_later(np.asarray(arrays.parent_index, dtype=np.int64), own)
        depth = np.asarray(arrays.depth)
        free = np.isnan(fixed_nu(depth, max_depth, root_holds_data))
        self._own, self._below, self._depth = own[free], (S - own)[free], depth[free]
        self._subtree, self._later = S[1:], later[1:]

    def log_nu(self, alpha0: float, lam: float) -> float:
        a = alpha_at_depth(self._depth, alpha0, lam)
        return float(np.sum(betaln(1.0 + self._own, a + self._below) - betaln(1.0, a)))

    def log_psi(self, gamma: float) -> float:
        return float(np.sum(betaln(1.0 + self._subtree, gamma + self._later) - betaln(1.0, gamma)))


def slice_step(x: float, log_density: Callable[[float], float], low: float, high: float,
               rng: np.random.Generator, max_shrink: int = 200) -> float:
    """One slice-sampling update of ``x`` for a density on the bounded interval ``[low, high]``."""
    level = log_density(x) + np.log(rng.random())
    lo, hi = low, high
    for _ in range(max_shrink):
        y = lo + (hi - lo) * rng.random()
        if log_density(y) > level:
            return y
        if y < x:
            lo = y
        else:
            hi = y
    return x


def sample_hyperparameters(arrays: TreeArrays, counts: np.ndarray, hyper: dict[str, float], *,
                           max_depth: int | None, root_holds_data: bool, rng: np.random.Generator,
                           names: tuple[str, ...] = ("alpha0", "lam", "gamma")) -> dict[str, float]:
    """One slice update of each of ``names`` in turn; returns the new values (a new dict, with
    any other entries of ``hyper`` unchanged)."""
    cur = {name: hyper[name] for name in ("alpha0", "lam", "gamma")}
    target = HyperTarget(arrays, counts, max_depth=max_depth, root_holds_data=root_holds_data)
    for name in names:
        low, high, log_scale = HYPER_PRIORS[name]

        def logp(u: float, name: str = name, log_scale: bool = log_scale) -> float:
            value = float(np.exp(u)) if log_scale else u
            if name == "gamma":  # the factor the parameter enters (the other is constant)
                return target.log_psi(value)
            return target.log_nu(**{"alpha0": cur["alpha0"], "lam": cur["lam"], name: value})

        x = min(max(float(cur[name]), low), high)
        if log_scale:
            cur[name] = float(np.exp(slice_step(np.log(x), logp, np.log(low), np.log(high), rng)))
        else:
            cur[name] = float(slice_step(x, logp, low, high, rng))
    return {**hyper, **cur}
