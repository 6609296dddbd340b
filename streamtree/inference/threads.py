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

Waking them costs each parallel region a fixed amount, so a region goes to the threads only
when its rows are predicted to take at least :data:`MIN_PARALLEL_SECONDS` on one thread (from
the time a row the same code took at its last run); smaller ones run in the calling thread.
Which way a region runs never changes its values.
"""

from __future__ import annotations

import sys
import time
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


#: one-thread seconds below which a parallel region runs in the calling thread. Handing ranges
#: to the sleeping pool threads cost 0.15-0.25 ms a region on the 2-core machines, and regions
#: of a few ms gained nothing: SOU's decades (about 1,000 documents; regions averaging 0.03-1.2 ms
#: by kind) fitted 16-49% slower at ``n_jobs=2`` than at 1 with every region on the threads, 4%
#: slower at a 2 ms threshold, as fast at this one; at 50,000 documents the regions that matter
#: take 12-230 ms (BENCHMARKS.md, "Small parallel regions in the calling thread"). 0 sends every
#: region of two or more ranges to the threads (the tests of the threads' values set it so)
MIN_PARALLEL_SECONDS = 5e-3
#: one-thread seconds a row of each parallel region (keyed by its function's code, so every
#: closure made at one place shares it), as measured at its last run
_SECONDS_A_ROW: dict[object, float] = {}

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


def run_ranges(pool: Executor, bounds: np.ndarray, run: Callable[[int, int], object]) -> list:
    """``run(a, b)`` for each range ``[a, b)`` between consecutive ``bounds`` on ``pool``, or once
    over them all in the calling thread where the rows are predicted to take less than
    :data:`MIN_PARALLEL_SECONDS` on one thread (from ``run``'s code's time a row at its last
    run, on the threads the sum of its ranges' own times; a region not yet timed runs in the
    calling thread once). Returns the calls' results.
    For work whose rows are independent of each other, so the values are the same either way."""
    first, last = int(bounds[0]), int(bounds[-1])
    key = getattr(run, "__code__", run)
    if len(bounds) > 2 and (MIN_PARALLEL_SECONDS <= 0
                            or _SECONDS_A_ROW.get(key, 0.0) * (last - first) >= MIN_PARALLEL_SECONDS):
        futures = [pool.submit(_timed, run, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        timed = [f.result() for f in futures]
        out = [r for r, _ in timed]
        seconds = sum(t for _, t in timed)  # the ranges' own times: the threads' wake-up left out
    else:
        result, seconds = _timed(run, first, last)
        out = [result]
    if last > first:
        _SECONDS_A_ROW[key] = seconds / (last - first)
    return out


def _timed(run: Callable[[int, int], object], a: int, b: int) -> tuple[object, float]:
    """``run(a, b)`` and its wall seconds, timed in the thread that runs it."""
    start = time.perf_counter()
    out = run(a, b)
    return out, time.perf_counter() - start


def in_row_ranges(n: int, run: Callable[[int, int], float]) -> float:
    """``run(start, stop)`` over ``n`` rows: one call, or one contiguous range per thread of the
    enclosing :func:`fitting_threads` pool where the rows are worth the threads
    (:func:`run_ranges`); returns the largest value the calls return."""
    pool, threads = _FITTING_POOL.get()
    if pool is None or threads <= 1 or n < 2:
        return run(0, n) if n else 0.0
    bounds = np.linspace(0, n, min(threads, n) + 1).round().astype(np.int64)
    return max(run_ranges(pool, bounds, run))
