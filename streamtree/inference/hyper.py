"""Slice sampling of the stick hyperparameters alpha0, lam and gamma (as in Adams et al., 2010).

Given the tree and the windowed document counts, the sticks integrate out of the TSSB prior in
closed form (:func:`streamtree.inference.merge.collapsed_log_prior` with no past), so each
hyperparameter has the one-dimensional conditional

    p(h | counts, others) ∝ prior(h) x prod_nodes B(1 + n_e, alpha(|e|) + Y_e) / B(1, alpha(|e|))
                                     x prod_edges B(1 + S_e.i, gamma + later) / B(1, gamma + ...)

Priors (:func:`hyper_priors`). ``alpha0`` and ``gamma`` have Gamma priors with shape
:data:`PRIOR_SHAPE` and their mean at the estimator's given value; ``lam`` has the density
``2 lam`` on ``(0, 1]`` (Beta(2, 1)). Why not scale-free (log-uniform) priors, or a uniform
``lam``: the collapsed likelihood above does not vanish at the ends of the support when the
tree is degenerate, so the posterior would be improper (or, for ``lam``, piled at 0) and the
value would be set by wherever the support is cut off:

* ``alpha0 -> 0``: a node's factor is ``alpha B(1 + n, alpha + Y)``, which tends to 0 like
  ``alpha`` when documents lie below it (``Y > 0``) but to 1 when none do. A root-only tree
  (or one whose every child is empty) therefore has a likelihood flat in ``alpha0`` near 0.
* ``alpha0 -> inf``: the factor tends to ``alpha**-n``, i.e. to 1 for every node without
  documents of its own. A tree whose documents all sit at the depth cap is flat near infinity.
* ``gamma -> 0``: a child's factor tends to 0 like ``gamma`` only when a later sibling holds
  documents; a tree of chains (single children) is flat near 0.
* ``lam -> 0``: ``alpha(d) = alpha0 lam**d`` vanishes below the root, and with it the factor
  of every node below the root that has documents below it; a tree without such a node is
  flat near 0, where every document below the root stops at depth 1 and no deeper node forms.

Under the former log-uniform prior on ``[1e-2, 1e2]`` such trees sent the hyperparameter to
the bound, and the bound's value made the degenerate tree self-perpetuating: on SOU replayed
by year (33-125 paragraphs per epoch, two epochs of window), once the internal merge had
gathered an epoch's past documents at the root (see ``EpochSampler._merge_internal``), the
stay-here concentration fell to 0.01-0.09, where a new child of the root costs about
``log(alpha0 / N)`` ~ -9 nats in the stick prior, and 5 of 58 epochs ended as the root alone
(BENCHMARKS.md, "Small epochs"). A Gamma(a, b) prior has the log-scale density
``a log h - b h``: it vanishes like ``h**a`` at 0 and exponentially at infinity, so every
posterior is proper, and it has the form of the likelihood's own factors (each node with
documents below it contributes one power of ``alpha``, each child with a later occupied sibling
one power of ``gamma``): the shape counts pseudo-branchings and the rate pseudo-``log N``
terms. With little data (a small epoch) the value stays on the scale the user gave; a tree
whose branchings are well attested by many documents moves it freely. ``lam``'s prior vanishes
at 0 in the same way (like ``lam**2`` on the log scale, as the Gammas' ``h**2``) and is
otherwise mild; it is not centred on the given ``lam``, whose range ends at 1.

Each update is one univariate slice sampling step (Neal, 2003) on the support (log scale for
``alpha0`` and ``gamma``), with shrinkage from the whole support, so it needs no step size and
is exact. The log-scale supports are cut at ``1e-4`` and ``1e4`` times the prior's mean, where
the Gamma prior's mass is below 1e-7 (the cut changes nothing measurable).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from streamtree.inference.merge import collapsed_log_prior
from streamtree.tree import TreeArrays

#: Gamma shape of the priors of ``alpha0`` and ``gamma``: two pseudo-branchings, the smallest
#: integer shape whose log-scale density has a mode (at ``log(mean)``), a log-scale spread of
#: ``sqrt(trigamma(2))`` = 0.80 (a 95% interval of about 0.12-2.8 times the mean)
PRIOR_SHAPE = 2.0
#: support of the log-scale priors, relative to their mean (numerical guard, not a prior)
_LOG_SUPPORT = (1e-4, 1e4)


@dataclass(frozen=True)
class HyperPrior:
    """Prior of one stick hyperparameter: the Gamma(shape, rate) density restricted to
    ``[low, high]`` (``rate = 0``: the density ``h**(shape - 1)``, e.g. Beta(2, 1) on (0, 1]
    for shape 2; shape 1 and rate 0: uniform).

    ``log_scale``: sampled on ``u = log h``, with log density ``shape * u - rate * exp(u)``
    (the Jacobian included). Otherwise sampled on ``h`` itself.
    """

    low: float
    high: float
    log_scale: bool
    shape: float = 1.0
    rate: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 < self.low < self.high:
            raise ValueError(f"prior support must satisfy 0 < low < high, got [{self.low}, {self.high}]")
        if self.log_scale and not (self.shape > 0.0 and self.rate > 0.0):
            raise ValueError(f"a log-scale prior needs a Gamma shape and rate > 0, got {self.shape}, {self.rate}")
        if not self.log_scale and not (self.shape > 0.0 and self.rate >= 0.0):
            raise ValueError(f"a prior needs a shape > 0 and a rate >= 0, got {self.shape}, {self.rate}")

    @classmethod
    def gamma(cls, mean: float, shape: float = PRIOR_SHAPE) -> "HyperPrior":
        """Gamma(shape, shape / mean) on a log scale, cut at ``_LOG_SUPPORT`` times the mean."""
        if not mean > 0.0:
            raise ValueError(f"the prior mean must be > 0, got {mean}")
        return cls(mean * _LOG_SUPPORT[0], mean * _LOG_SUPPORT[1], True, shape, shape / mean)

    def support(self) -> tuple[float, float]:
        """The support on the sampling coordinate."""
        return (math.log(self.low), math.log(self.high)) if self.log_scale else (self.low, self.high)

    def value(self, x: float) -> float:
        """The hyperparameter at sampling coordinate ``x``."""
        return math.exp(x) if self.log_scale else x

    def coordinate(self, value: float) -> float:
        """The sampling coordinate of ``value`` (clipped into the support)."""
        value = min(max(value, self.low), self.high)
        return math.log(value) if self.log_scale else value

    def log_density(self, x: float) -> float:
        """Log prior density of the sampling coordinate ``x``, up to a constant."""
        if self.log_scale:
            return self.shape * x - self.rate * math.exp(x)
        return (self.shape - 1.0) * math.log(x) - self.rate * x


def hyper_priors(alpha0: float, gamma: float) -> dict[str, HyperPrior]:
    """The priors of the three stick hyperparameters: Gamma priors with means ``alpha0`` and
    ``gamma`` (the estimator's given values) and shape :data:`PRIOR_SHAPE`; ``lam``'s density
    ``lam**(PRIOR_SHAPE - 1)`` on ``[1e-3, 1]`` (Beta(2, 1), cut where it holds 1e-6)."""
    return {"alpha0": HyperPrior.gamma(alpha0), "lam": HyperPrior(1e-3, 1.0, False, PRIOR_SHAPE, 0.0),
            "gamma": HyperPrior.gamma(gamma)}


def log_hyper_likelihood(arrays: TreeArrays, counts: np.ndarray, *, alpha0: float, lam: float, gamma: float,
                         max_depth: int | None, root_holds_data: bool) -> float:
    """log p(windowed assignments | tree, alpha0, lam, gamma), sticks integrated out."""
    return collapsed_log_prior(arrays, np.zeros_like(counts, dtype=np.float64), np.asarray(counts, np.float64),
                               alpha0=alpha0, lam=lam, gamma=gamma, max_depth=max_depth,
                               root_holds_data=root_holds_data)


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
                           priors: Mapping[str, HyperPrior], max_depth: int | None, root_holds_data: bool,
                           rng: np.random.Generator,
                           names: tuple[str, ...] = ("alpha0", "lam", "gamma")) -> dict[str, float]:
    """One slice update of each of ``names`` in turn under ``priors`` (see :func:`hyper_priors`);
    returns the new values (a new dict, with any other entries of ``hyper`` unchanged)."""
    cur = {name: hyper[name] for name in ("alpha0", "lam", "gamma")}
    for name in names:
        prior = priors[name]

        def logp(x: float, name: str = name, prior: HyperPrior = prior) -> float:
            return prior.log_density(x) + log_hyper_likelihood(arrays, counts, **{**cur, name: prior.value(x)},
                                                               max_depth=max_depth, root_holds_data=root_holds_data)

        x = slice_step(prior.coordinate(cur[name]), logp, *prior.support(), rng)
        cur[name] = float(prior.value(x))
    return {**hyper, **cur}
