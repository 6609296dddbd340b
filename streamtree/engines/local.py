"""The in-process engine: shards are row blocks of the local matrix."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from streamtree.engines.base import Engine, shard_bounds
from streamtree.inference.enumerated import Candidates, SweepStats, node_order, row_sq_norms, sweep_rows
from streamtree.inference.threads import n_threads


class LocalEngine(Engine):
    """Runs the shards in this process.

    Parameters
    ----------
    n_shards : int
        Number of row shards (each with its own random stream). Results depend on it, so keep
        it fixed to reproduce a run; it need not equal the number of threads.
    n_jobs : int or None
        Worker threads (``None``: 1; ``-1``: all CPUs; ``-2``: all but one). Each shard's rows
        are split into ``n_jobs`` ranges scored at once by GIL-free numba kernels. A row's draw
        depends only on the row and its shard's stream, so results do not depend on ``n_jobs``.
    """

    def __init__(self, n_shards: int = 1, n_jobs: int | None = 1) -> None:
        self.n_shards = int(n_shards)
        self.n_jobs = n_jobs
        self._n_threads = n_threads(n_jobs)
        self._pool: ThreadPoolExecutor | None = None
        self._shards: list = []
        self._sq: list[np.ndarray] = []
        self._rngs: list[np.random.Generator] = []
        self._labels: list[np.ndarray] = []
        self._bounds: np.ndarray | None = None  # shard row bounds of the loaded rows

    def load(self, X, seeds: list[np.random.SeedSequence]) -> None:
        if len(seeds) != self.n_shards:
            raise ValueError(f"{len(seeds)} seeds for {self.n_shards} shards")
        b = self._bounds = shard_bounds(X.shape[0], self.n_shards)
        self._shards = [_row_block(X, b[s], b[s + 1]) for s in range(self.n_shards)]
        self._starts = [int(X.indptr[b[s]]) for s in range(self.n_shards)] if hasattr(X, "indptr") else []
        self._sq = [row_sq_norms(x) for x in self._shards]
        self._rngs = [np.random.Generator(np.random.PCG64(s)) for s in seeds]
        self._labels = [np.zeros(x.shape[0], dtype=np.int64) for x in self._shards]
        if self._n_threads > 1 and self._pool is None:
            self._pool = ThreadPoolExecutor(self._n_threads, thread_name_prefix="streamtree-zsweep")

    def sweep(self, cand: Candidates, own: np.ndarray | None = None,
              adjust: np.ndarray | None = None) -> SweepStats:
        parts = []
        b = self._bounds
        for s in range(self.n_shards):
            # rows taken by their last node: the same draws, read with warmer caches
            # one shard: its sums go straight into the dense matrix the coordinator uses
            labels, stats = sweep_rows(self._shards[s], cand, self._rngs[s], self._sq[s], pool=self._pool,
                                       n_threads=self._n_threads, order=node_order(self._labels[s]),
                                       dense_sums=self.n_shards == 1,
                                       own=None if own is None else own[b[s]:b[s + 1]],
                                       adjust=None if adjust is None else adjust[b[s]:b[s + 1]])
            self._labels[s] = labels
            parts.append(stats)
        return SweepStats.combine(parts)

    def set_values(self, data: np.ndarray) -> None:
        data = np.asarray(data, dtype=np.float64)
        for s, x in enumerate(self._shards):
            # a new values array (not written in place): the kernel's per-matrix tables are
            # keyed by the identity of the matrix's arrays; a view of ``data``, which the
            # coordinator holds as this sweep's rows, is such an array without a copy
            x.data = data[self._starts[s]:self._starts[s] + x.nnz]
            self._sq[s] = row_sq_norms(x)

    def labels(self) -> np.ndarray:
        return np.concatenate(self._labels) if self._labels else np.zeros(0, dtype=np.int64)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._shards, self._sq, self._rngs, self._labels = [], [], [], []

    def __getstate__(self) -> dict:
        # a thread pool does not pickle; it is recreated at the next load
        state = dict(self.__dict__)
        state["_pool"] = None
        return state


def _row_block(X, start: int, stop: int):
    """Rows ``start:stop`` of ``X``. For a CSR matrix, built from views of ``X``'s values and
    column indices (slicing copies them): SciPy keeps the views when they are most of their
    arrays (always for one shard, the default) and copies a small block's. The engine never
    writes into a shard's arrays (:meth:`LocalEngine.set_values` replaces them), so the
    caller's matrix is left as it was."""
    if not hasattr(X, "indptr"):
        return X[start:stop]
    a, z = int(X.indptr[start]), int(X.indptr[stop])
    return type(X)((X.data[a:z], X.indices[a:z], X.indptr[start:stop + 1] - a),
                   shape=(int(stop - start), X.shape[1]), copy=False)
