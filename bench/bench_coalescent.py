"""Benchmark of Kingman's coalescent inference, next to SciPy average linkage in the same process.

Run: ``python bench/bench_coalescent.py [n]``. Prints the time of Greedy-Rate1 (Brownian, complete
and 20% missing data; binary sites) and of SciPy's average linkage on the same data, and the time
per particle of each SMC proposal on a smaller problem. Kernels are compiled before timing.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from scipy.cluster.hierarchy import linkage

import streamtree  # noqa: F401  (numba cache configuration)
from streamtree.static import KingmanCoalescent


def timed(fn, repeat: int = 1) -> float:
    best = np.inf
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def main(n: int = 2000, D: int = 20) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, D))
    Xm = X.copy()
    Xm[rng.random(X.shape) < 0.2] = np.nan
    B = (rng.random((n // 2, D)) < 0.3).astype(float)
    # compile every kernel on tiny inputs first
    KingmanCoalescent().fit(X[:20])
    KingmanCoalescent().fit(Xm[:20])
    KingmanCoalescent(likelihood="binary").fit(B[:20])
    for m in ("smc-priorprior", "smc-priorpost", "smc-postpost"):
        KingmanCoalescent(method=m, n_particles=2).fit(X[:5, :3])

    t_avg = timed(lambda: linkage(X, "average"), repeat=3)
    t_r1 = timed(lambda: KingmanCoalescent().fit(X))
    t_r1m = timed(lambda: KingmanCoalescent().fit(Xm))
    t_bin = timed(lambda: KingmanCoalescent(likelihood="binary").fit(B))
    t_avg_b = timed(lambda: linkage(B, "average"), repeat=3)
    print(f"Greedy-Rate1 Brownian        n={n:5d} D={D}: {t_r1:7.2f} s CPU  (SciPy average linkage {t_avg:.3f} s,"
          f" ratio {t_r1 / t_avg:.0f}x)")
    print(f"Greedy-Rate1 Brownian 20% NaN n={n:5d} D={D}: {t_r1m:7.2f} s CPU")
    print(f"Greedy-Rate1 binary          n={n // 2:5d} D={D}: {t_bin:7.2f} s CPU  (SciPy average linkage "
          f"{t_avg_b:.3f} s)")

    est = KingmanCoalescent().fit(X[:500])
    t_pred = timed(lambda: est.predictive_log_density(X[500:510]))
    print(f"predictive_log_density n=500 D={D}: {t_pred / 10:.3f} s CPU per new row (block of 10)")

    ns, Ds, S = 100, 5, 50
    Xs = rng.normal(size=(ns, Ds))
    for m in ("greedy-maxprob", "smc-priorprior", "smc-priorpost", "smc-postpost"):
        t = timed(lambda m=m: KingmanCoalescent(method=m, n_particles=S, random_state=0).fit(Xs))
        per = t / S if m.startswith("smc") else t
        unit = "s per particle" if m.startswith("smc") else "s"
        print(f"{m:18s} n={ns} D={Ds} S={S}: {t:7.2f} s CPU, {per:.4f} {unit}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
