"""Benchmark of the vMF numerics against the obvious SciPy routes, in the same process.

Run: ``python bench/bench_vmf.py``. Prints CPU times of the log normaliser (NumPy and numba),
the share of inputs where the naive ``log(ive) + kappa`` route breaks down, and the time and
peak memory of the Wood sampler next to ``scipy.stats.vonmises_fisher``.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
from numba import njit
from scipy import stats
from scipy.special import ive

import streamtree  # noqa: F401  (numba cache configuration)
from streamtree.likelihoods.vmf import (
    estimate_concentration,
    log_normalizer,
    log_normalizer_nb,
    sample_vmf,
)


def naive_log_normalizer(p: int, kappa: np.ndarray) -> np.ndarray:
    """Textbook route: nu log k - (nu+1) log 2 pi - log(ive(nu, k)) - k."""
    nu = p / 2 - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        return nu * np.log(kappa) - (nu + 1) * np.log(2 * np.pi) - np.log(ive(nu, kappa)) - kappa


@njit(cache=True, nogil=True)
def _loop_nb(p, kappas):
    acc = 0.0
    for k in kappas:
        acc += log_normalizer_nb(p, k)
    return acc


def best_of(fn, repeat=3):
    """Best CPU time of ``repeat`` runs (CPU, not wall, time: the machine may be shared)."""
    best = np.inf
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def main() -> None:
    rng = np.random.default_rng(0)
    n = 1_000_000
    kappas = 10.0 ** rng.uniform(-3, 6, size=n)
    print(f"log C_p over {n:,} kappas log-uniform in [1e-3, 1e6]")
    hdr = ("p", "ours ms", "ours ns/call nb", "naive ms", "naive non-finite")
    print(f"{hdr[0]:>7} {hdr[1]:>9} {hdr[2]:>16} {hdr[3]:>9} {hdr[4]:>17}")
    for p in (3, 100, 2636, 36901, 100000):
        t_ours = best_of(lambda: log_normalizer(p, kappas))
        _loop_nb(float(p), kappas[:10])
        t_nb = best_of(lambda: _loop_nb(float(p), kappas))
        t_naive = best_of(lambda: naive_log_normalizer(p, kappas))
        bad = np.mean(~np.isfinite(naive_log_normalizer(p, kappas)))
        print(
            f"{p:>7} {1e3 * t_ours:>9.1f} {1e9 * t_nb / n:>16.1f} {1e3 * t_naive:>9.1f} "
            f"{bad:>16.1%}"
        )

    print("\nscipy.stats.vonmises_fisher.logpdf at the mean direction (kappa = 100):")
    for p in (100, 2636):
        mu = np.zeros(p)
        mu[0] = 1.0
        with np.errstate(all="ignore"):
            val = stats.vonmises_fisher(mu, 100.0).logpdf(mu)
        print(f"  p={p:>5}: scipy {val:.6g}   ours {log_normalizer(p, 100.0) + 100.0:.6g}")

    print("\nWood sampler, 200 draws (time, peak traced memory):")
    for p, kappa in ((2636, 100.0), (2636, 1e4), (36901, 1e4), (100000, 1e5)):
        mu = rng.standard_normal(p)
        mu /= np.linalg.norm(mu)
        tracemalloc.start()
        t0 = time.process_time()
        sample_vmf(mu, kappa, 200, rng)
        dt = time.process_time() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        line = f"  p={p:>6} kappa={kappa:>8g}: ours {1e3 * dt:7.1f} ms {peak / 2**20:7.1f} MB"
        if p <= 2636 and kappa == 100.0:  # scipy takes ~10 s CPU per call here
            tracemalloc.start()
            t0 = time.process_time()
            stats.vonmises_fisher(mu, kappa).rvs(200, random_state=rng)
            dt = time.process_time() - t0
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            line += f" | scipy {1e3 * dt:7.1f} ms {peak / 2**20:7.1f} MB"
        print(line)

    k = 100_000
    r = rng.uniform(1.0, 50.0, size=k)
    cnt = np.full(k, 100.0)
    t = best_of(lambda: estimate_concentration(r, cnt, 2636))
    print(f"\nestimate_concentration, {k:,} clusters at p=2636 (3 Newton steps): {1e3 * t:.1f} ms")


if __name__ == "__main__":
    main()
