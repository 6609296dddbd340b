"""Benchmark of the static hierarchical models against SciPy average linkage, in one process.

Run: ``python bench/bench_static.py [--n 2000] [--dim 20]``. Data: a mixture of 10 Gaussians in
``dim`` dimensions. Times Bayesian hierarchical clustering, SciPy average linkage and, when the
module is importable, Kingman's coalescent (greedy-rate1, Brownian likelihood, defaults with
hyperparameter re-estimation); prints the ratios to average linkage, the dendrogram purity of
each tree, and the peak traced memory of each fit (tracemalloc, in a second run so that tracing does not distort the times).
Target: BHC at n = 2,000, d = 20 under 10 s on one core.
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

import numpy as np
from scipy.cluster.hierarchy import linkage

import streamtree  # noqa: F401  (numba cache configuration)
from streamtree.static.bhc import BayesianHierarchicalClustering
from streamtree.static.metrics import dendrogram_purity


def mixture(n: int, dim: int, k: int, rng: np.random.Generator):
    centres = rng.normal(scale=2.0, size=(k, dim))
    y = rng.integers(0, k, size=n)
    return centres[y] + rng.normal(size=(n, dim)), y


def methods():
    out = {
        "bhc": lambda X: BayesianHierarchicalClustering(likelihood="gaussian").fit(X).linkage_,
        "average": lambda X: linkage(X, "average"),
    }
    try:
        from streamtree.static.coalescent import KingmanCoalescent
    except ImportError:
        out["kingman"] = None
    else:
        out["kingman"] = lambda X: KingmanCoalescent(likelihood="brownian",
                                                     method="greedy-rate1").fit(X).linkage_
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--dim", type=int, default=20)
    ap.add_argument("--clusters", type=int, default=10)
    ap.add_argument("--no-memory", action="store_true", help="skip the tracemalloc runs")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    X, y = mixture(args.n, args.dim, args.clusters, rng)

    t0 = time.perf_counter()
    BayesianHierarchicalClustering().fit(X[:50])  # numba compilation or cache load
    print(f"BHC warm-up (numba compile/cache load) on 50 points: {time.perf_counter() - t0:.2f} s")
    print(f"data: n={args.n}, d={args.dim}, {args.clusters}-component Gaussian mixture\n")

    results = {}
    for name, fn in methods().items():
        if fn is None:
            print(f"{name:>8}: unavailable")
            continue
        t0 = time.perf_counter()
        c0 = time.process_time()
        Z = fn(X)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        results[name] = (wall, cpu, dendrogram_purity(Z, y))
        print(f"{name:>8}: wall {wall:8.3f} s  cpu {cpu:8.3f} s  purity {results[name][2]:.4f}")

    base_wall, base_cpu = results["average"][:2]
    print("\nratios to SciPy average linkage (wall, and CPU time, which a busy machine inflates less):")
    for name, (wall, cpu, _) in results.items():
        print(f"{name:>8}: {wall / base_wall:8.1f}x wall  {cpu / base_cpu:8.1f}x cpu")

    if not args.no_memory:
        print("\npeak traced memory per fit (tracemalloc):")
        for name, fn in methods().items():
            if fn is None:
                continue
            tracemalloc.start()
            fn(X)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            print(f"{name:>8}: {peak / 2**20:8.1f} MiB")
        print(f"n^2 float64 matrix for reference: {8 * args.n**2 / 2**20:.1f} MiB")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"process max RSS: {rss:.0f} MiB")
    if "bhc" in results:
        ok = "meets" if results["bhc"][0] < 10.0 else "misses"
        print(f"\nBHC {ok} the 10 s target at n={args.n} ({results['bhc'][0]:.2f} s)")


if __name__ == "__main__":
    main()
