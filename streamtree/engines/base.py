"""The engine interface: where the per-epoch z-updates run.

An engine holds one epoch's documents split into a fixed number of contiguous row shards, each
with its own random stream spawned from the epoch's seed sequence. The coordinator (the
estimator) broadcasts :class:`~streamtree.inference.enumerated.Candidates` once per sweep and gets
back the merged :class:`~streamtree.inference.enumerated.SweepStats`; labels stay with the shards
until asked for. Given the same seed and shard count, every engine returns the same numbers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from streamtree.inference.enumerated import Candidates, SweepStats


def shard_bounds(n_rows: int, n_shards: int) -> np.ndarray:
    """Row boundaries of ``n_shards`` contiguous, near-equal shards."""
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1, got {n_shards}")
    return np.linspace(0, n_rows, n_shards + 1).round().astype(np.int64)


class Engine(ABC):
    """Runs enumerated z-sweeps over one epoch's documents."""

    n_shards: int

    @abstractmethod
    def load(self, X, seeds: list[np.random.SeedSequence]) -> None:
        """Distribute the rows of ``X`` over the shards; ``seeds`` has one entry per shard."""

    @abstractmethod
    def sweep(self, cand: Candidates) -> SweepStats:
        """One z-update on every shard; returns statistics merged in shard order."""

    @abstractmethod
    def labels(self) -> np.ndarray:
        """Candidate column of every row (in input order) from the last sweep."""

    def close(self) -> None:
        """Release resources (shards, actors)."""
