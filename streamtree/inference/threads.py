"""How many threads the fitting code may use, in one place.

Inside fitting, BLAS runs single-threaded: the coordinator's products are small or per node,
where extra BLAS threads only spin-wait (on a 2-core machine they made a 50k-document epoch
2.7x slower in CPU time). Parallel work runs on one pool of ``n_jobs`` threads (scikit-learn's
convention: ``None`` is 1, ``-1`` all CPUs, ``-2`` all but one) executing GIL-free numba
kernels on ranges of rows. Every kernel computes each output row in one thread in a fixed
order, so results do not depend on the thread count.

The coordinator's kernels (the MAP step's block passes) use the pool of the enclosing
:func:`fitting_threads` block rather than numba's ``prange``: OpenMP's worker threads
spin-wait between parallel regions, and with the z-kernel's threads and the coordinator on two
cores that spinning took a core's time from them (a 50k-document epoch at ``n_jobs=2`` used
15-20% more CPU time than at ``n_jobs=1`` with no wall-time gain). Pool threads sleep when idle.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar

import numba
import numpy as np
from joblib import effective_n_jobs
from threadpoolctl import ThreadpoolController

#: the executor and thread count of the enclosing :func:`fitting_threads` block
_FITTING_POOL: ContextVar[tuple[Executor | None, int]] = ContextVar("streamtree_fitting_pool", default=(None, 1))


#: the thread-pool libraries found at the last count of imported modules (see :func:`_blas_controller`)
_CONTROLLER: tuple[int, ThreadpoolController] | None = None


def _blas_controller() -> ThreadpoolController:
    """threadpoolctl's view of the loaded thread-pool libraries, found again only after new
    modules were imported (a library such as a BLAS arrives with an import): finding them walks
    every loaded shared object, about 1 ms, which a stream of tiny epochs paid at every fit."""
    global _CONTROLLER
    if _CONTROLLER is None or _CONTROLLER[0] != len(sys.modules):
        _CONTROLLER = (len(sys.modules), ThreadpoolController())
    return _CONTROLLER[1]


def n_threads(n_jobs: int | None) -> int:
    """Worker threads for an ``n_jobs`` value (at least 1, at most numba's thread pool)."""
    return max(1, min(int(effective_n_jobs(n_jobs)), numba.config.NUMBA_NUM_THREADS))


@contextmanager
def fitting_threads(n_jobs: int | None) -> Iterator[int]:
    """BLAS capped at one thread, numba's parallel kernels at ``n_jobs`` threads and, with more
    than one thread, a pool of ``n_jobs`` threads for :func:`in_row_ranges` (in the calling
    context) for the duration of the block; yields the thread count."""
    before = numba.get_num_threads()
    threads = n_threads(n_jobs)
    numba.set_num_threads(threads)
    pool = ThreadPoolExecutor(threads, thread_name_prefix="streamtree-fit") if threads > 1 else None
    token = _FITTING_POOL.set((pool, threads))
    try:
        with _blas_controller().limit(limits=1, user_api="blas"):
            yield threads
    finally:
        _FITTING_POOL.reset(token)
        if pool is not None:
            pool.shutdown(wait=True)
        numba.set_num_threads(before)


def dealt_by_cost(rows: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """``rows`` reordered so that the contiguous ranges :func:`in_row_ranges` hands to the
    fitting threads get even shares of ``cost`` (dealt round-robin from the dearest down);
    unchanged without a pool. For work whose rows are independent of each other."""
    _, threads = _FITTING_POOL.get()
    if threads <= 1 or rows.size < 2:
        return rows
    order = rows[np.argsort(-cost, kind="stable")]
    return np.concatenate([order[i::threads] for i in range(min(threads, rows.size))])


def in_row_ranges(n: int, run: Callable[[int, int], float]) -> float:
    """``run(start, stop)`` over ``n`` rows: one call, or one contiguous range per thread of the
    enclosing :func:`fitting_threads` pool; returns the largest value the calls return."""
    pool, threads = _FITTING_POOL.get()
    if pool is None or threads <= 1 or n < 2:
        return run(0, n) if n else 0.0
    bounds = np.linspace(0, n, min(threads, n) + 1).round().astype(np.int64)
    return max(f.result() for f in [pool.submit(run, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])])
