"""The z-sweep interface: what the epoch sampler needs from whatever runs its z-updates.

An implementation (an *engine*) holds one epoch's documents split into a fixed number of
contiguous row shards, each with its own random stream spawned from the epoch's seed sequence.
The epoch sampler broadcasts :class:`~streamtree.inference.enumerated.Candidates` once per
sweep and gets back the merged :class:`~streamtree.inference.enumerated.SweepStats`; labels
stay with the shards until asked for. Given the same seeds and shard count, every
implementation must return the same numbers.

The core never imports an engine. Engines live in :mod:`streamtree.engines`, which registers
them by name here (:func:`register_engine`) when the package is imported; the estimator
resolves an engine name through :func:`make_engine`, or takes any object with this interface.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from streamtree.inference.enumerated import Candidates, SweepStats


@runtime_checkable
class ZSweeper(Protocol):
    """Runs enumerated z-sweeps over one epoch's documents."""

    n_shards: int

    def load(self, X, seeds: list[np.random.SeedSequence]) -> None:
        """Distribute the rows of ``X`` over the shards; ``seeds`` has one entry per shard."""

    def sweep(self, cand: "Candidates", own: np.ndarray | None = None,
              adjust: np.ndarray | None = None) -> "SweepStats":
        """One z-update on every shard; returns statistics merged in shard order (``own`` and
        ``adjust``: each row's own live column and the log weight added there, in input
        order; see :func:`~streamtree.inference.enumerated.score_rows`)."""

    def labels(self) -> np.ndarray:
        """Candidate column of every row (in input order) from the last sweep."""

    def set_values(self, data: np.ndarray) -> None:
        """Replace the stored values of the loaded rows by ``data``, aligned with the ``data``
        array of the CSR matrix given to :meth:`load` (same rows, same sparsity pattern);
        labels and random streams are kept. Needed only when the likelihood redraws its rows
        every sweep (:meth:`~streamtree.likelihoods.base.Likelihood.sweep_counts`)."""

    def close(self) -> None:
        """Release resources (shards, actors)."""


#: ``factory(n_shards=..., n_jobs=..., **options) -> ZSweeper`` by engine name
_ENGINES: dict[str, Callable[..., ZSweeper]] = {}


def register_engine(name: str, factory: Callable[..., ZSweeper]) -> None:
    """Make ``name`` a valid ``engine=`` value; ``factory`` builds the engine."""
    _ENGINES[name] = factory


def engine_names() -> tuple[str, ...]:
    """Names of the registered engines."""
    return tuple(_ENGINES)


def make_engine(engine: Any, *, n_shards: int, n_jobs: int, options: dict | None = None) -> ZSweeper:
    """The engine for an ``engine=`` value: a registered name or a ready engine object."""
    if not isinstance(engine, str):
        return engine
    if engine not in _ENGINES:
        raise ValueError(f"unknown engine {engine!r}; registered engines: {', '.join(_ENGINES) or 'none'} "
                         "(import streamtree.engines to register the built-in ones)")
    return _ENGINES[engine](n_shards=n_shards, n_jobs=n_jobs, **(options or {}))
