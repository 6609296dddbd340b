"""Base class of the engines: an implementation of the core's z-sweep interface.

The interface itself (:class:`~streamtree.inference.zsweep.ZSweeper`) is defined in the core;
this abstract class only makes the engines declare every method of it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from streamtree.inference.enumerated import Candidates, SweepStats


class EngineFailure(RuntimeError):
    """Where the sweeps run failed, not the data or the model: actors that cannot be placed or
    keep dying, a connection shut down under the engine. The message says what to do."""


def shard_bounds(n_rows: int, n_shards: int) -> np.ndarray:
    """Row boundaries of ``n_shards`` contiguous, near-equal shards."""
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1, got {n_shards}")
    return np.linspace(0, n_rows, n_shards + 1).round().astype(np.int64)


class Engine(ABC):
    """Runs enumerated z-sweeps over one epoch's documents (see :class:`streamtree.inference.zsweep.ZSweeper`)."""

    n_shards: int

    @abstractmethod
    def load(self, X, seeds: list[np.random.SeedSequence]) -> None:
        """Distribute the rows of ``X`` over the shards; ``seeds`` has one entry per shard."""

    @abstractmethod
    def sweep(self, cand: Candidates, own: np.ndarray | None = None,
              adjust: np.ndarray | None = None) -> SweepStats:
        """One z-update on every shard; returns statistics merged in shard order. ``own`` and
        ``adjust`` (one entry per row, in input order) are each row's own live column and the
        log weight added to it (see :func:`streamtree.inference.enumerated.score_rows`)."""

    @abstractmethod
    def labels(self) -> np.ndarray:
        """Candidate column of every row (in input order) from the last sweep."""

    def set_values(self, data: np.ndarray) -> None:
        """Replace the values of the loaded CSR rows by ``data`` (same sparsity pattern); needed
        only by likelihoods that redraw their rows every sweep (multinomial with
        ``document_concentration``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot replace its rows' values; use the 'local' or "
                                  "'ray' engine with document_concentration")

    def close(self) -> None:
        """Release resources (shards, actors)."""
