"""How many threads the fitting code may use, in one place.

Inside fitting, BLAS runs single-threaded: the coordinator's products are small or per node,
where extra BLAS threads only spin-wait (on a 2-core machine they made a 50k-document epoch
2.7x slower in CPU time). Parallel work goes through numba instead, sized by ``n_jobs``
(scikit-learn's convention: ``None`` is 1, ``-1`` all CPUs, ``-2`` all but one). Every parallel
kernel computes each output row in one thread in a fixed order, so results do not depend on
the thread count.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numba
from joblib import effective_n_jobs
from threadpoolctl import threadpool_limits


def n_threads(n_jobs: int | None) -> int:
    """Worker threads for an ``n_jobs`` value (at least 1, at most numba's thread pool)."""
    return max(1, min(int(effective_n_jobs(n_jobs)), numba.config.NUMBA_NUM_THREADS))


@contextmanager
def fitting_threads(n_jobs: int | None) -> Iterator[int]:
    """BLAS capped at one thread and numba's parallel kernels at ``n_jobs`` threads (in the
    calling thread) for the duration of the block; yields the thread count."""
    before = numba.get_num_threads()
    threads = n_threads(n_jobs)
    numba.set_num_threads(threads)
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            yield threads
    finally:
        numba.set_num_threads(before)
