"""The state and work of one shard actor of the Ray engine.

A plain class (no Ray import) so that it can be tested in-process and wrapped with
``ray.remote`` only when a Ray engine starts. Ray pickles it by reference, so every node of the
cluster must have streamtree installed.
"""

from __future__ import annotations

import os
import resource
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

import streamtree  # noqa: F401  (numba cache configuration before the kernels load)
from streamtree.inference.enumerated import Candidates, SweepStats, node_order, row_sq_norms, sweep_rows


def generator_from_state(state: dict) -> np.random.Generator:
    """A PCG64 generator positioned exactly at ``state`` (a ``bit_generator.state`` dict)."""
    bit = np.random.PCG64()
    bit.state = state
    return np.random.Generator(bit)


class ShardWorker:
    """Holds one shard's rows, squared norms, random stream and last labels.

    Every call carries the engine's load generation; a worker that does not hold that
    generation's rows (it was restarted after a crash and lost its state) answers ``None`` so
    that the engine re-sends the shard instead of computing on the wrong data.
    """

    def __init__(self, n_threads: int = 1) -> None:
        # threads for the shard's z-kernel (GIL-free row ranges; results do not depend on them)
        self._n_threads = max(1, int(n_threads))
        self._pool = ThreadPoolExecutor(self._n_threads) if self._n_threads > 1 else None
        self._gen = -1
        self._X = None
        self._sq: np.ndarray | None = None
        self._rng: np.random.Generator | None = None
        self._labels = np.zeros(0, dtype=np.int64)
        self._n_sweeps = 0
        self._crash_next = False

    def load(self, X, rng_state: dict, gen: int) -> int:
        """Take a shard and the random-stream state to continue from; returns its row count."""
        self._X = X
        self._sq = row_sq_norms(X)
        self._rng = generator_from_state(rng_state)
        self._labels = np.zeros(X.shape[0], dtype=np.int64)
        self._gen = gen
        return int(X.shape[0])

    def set_values(self, values, gen: int) -> bool:
        """Replace the values of the shard's rows (same sparsity pattern; the likelihood redrew
        them), keeping its random stream and labels; ``False`` if the worker does not hold this
        generation. The rows are rebuilt around a new values array, never written in place: the
        kernel's per-matrix tables are keyed by the identity of the matrix's arrays."""
        if gen != self._gen:
            return False
        X = self._X
        self._X = sp.csr_matrix((np.array(values, dtype=np.float64), X.indices, X.indptr), shape=X.shape)
        self._sq = row_sq_norms(self._X)
        return True

    def sweep(self, cand: Candidates, gen: int, own: np.ndarray | None = None,
              adjust: np.ndarray | None = None) -> tuple[SweepStats, dict] | None:
        """One z-update of the shard; returns its statistics and the stream state after it
        (``own``/``adjust``: its rows' own columns and adjustments, as for
        :func:`~streamtree.inference.enumerated.score_rows`)."""
        if gen != self._gen:
            return None
        if self._crash_next:
            # fault injection: die after advancing the stream, as a real mid-sweep crash would
            self._rng.random(self._X.shape[0])
            os._exit(1)
        labels, stats = sweep_rows(self._X, cand, self._rng, self._sq, pool=self._pool, n_threads=self._n_threads,
                                   order=node_order(self._labels), own=own, adjust=adjust)
        self._labels = labels
        self._n_sweeps += 1
        return stats, self._rng.bit_generator.state

    def labels(self, gen: int) -> np.ndarray | None:
        return self._labels if gen == self._gen else None

    def node_id(self) -> str | None:
        """Ray node of this worker (``None`` outside Ray; never starts Ray by itself)."""
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None

    def info(self) -> dict:
        """Where the worker runs and how much it did (for tests and benchmarks)."""
        return {"node_id": self.node_id(), "pid": os.getpid(), "n_sweeps": self._n_sweeps,
                "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}

    def crash_during_next_sweep(self) -> None:
        """Test hook: the next sweep kills this worker process half-way (after drawing uniforms)."""
        self._crash_next = True
