"""Benchmark of Kingman's coalescent inference, next to SciPy average linkage in the same process.

Run: ``python bench/bench_coalescent.py [--n 2000] [--subsets 20] [--skip-timing] [--skip-digits]``.

* Timing: Greedy-Rate1 at the defaults (hyperparameter re-estimation on) and with the
  hyperparameters fixed (``n_hyper_iter=0``), Brownian with complete and 20% missing data and
  binary sites, beside SciPy's average linkage on the same data; the time per particle of each
  SMC proposal on a smaller problem. Kernels are compiled before timing.
* Quality: the MNIST protocol of Teh, Daume and Roy (2007) on scikit-learn's 8x8 digits: 20
  examples per digit, PCA to 20 dimensions, then standardised, ``--subsets`` seeded random
  subsets. Prints the mean +- sd of dendrogram purity of the coalescent at its defaults, with
  fixed hyperparameters, and of average linkage, and the CPU time per fit. The protocol is run
  twice: standardised per feature (each principal component to unit variance, as
  ``StandardScaler`` does) and with one global scale (``X / X.std()``, which keeps the
  principal components' relative variances); average linkage depends on that choice, the
  coalescent with re-estimated per-dimension variances hardly does.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.cluster.hierarchy import linkage

import streamtree  # noqa: F401  (numba cache configuration)
from streamtree.static import KingmanCoalescent
from streamtree.static.metrics import dendrogram_purity


def timed(fn, repeat: int = 1) -> float:
    best = np.inf
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def timing(n: int = 2000, D: int = 20) -> None:
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
    t_avg_b = timed(lambda: linkage(B, "average"), repeat=3)
    print(f"SciPy average linkage n={n:5d} D={D}: {t_avg:.3f} s CPU; binary n={n // 2}: {t_avg_b:.3f} s CPU")
    for label, data, kw, base in [("Brownian", X, {}, t_avg), ("Brownian 20% NaN", Xm, {}, t_avg),
                                  ("binary", B, {"likelihood": "binary"}, t_avg_b)]:
        for hyper in ("defaults", "n_hyper_iter=0"):
            extra = {} if hyper == "defaults" else {"n_hyper_iter": 0}
            est = KingmanCoalescent(**kw, **extra)
            t = timed(lambda est=est, data=data: est.fit(data))
            print(f"Greedy-Rate1 {label:17s} n={data.shape[0]:5d} D={D} {hyper:15s}: {t:7.2f} s CPU "
                  f"({t / base:5.0f}x average linkage), {est.n_hyper_iter_} hyperparameter rounds")

    est = KingmanCoalescent().fit(X[:500])
    t_pred = timed(lambda: est.predictive_log_density(X[500:510]))
    print(f"predictive_log_density n=500 D={D}: {t_pred / 10:.3f} s CPU per new row (block of 10)")

    ns, Ds, S = 100, 5, 50
    Xs = rng.normal(size=(ns, Ds))
    for m in ("greedy-maxprob", "smc-priorprior", "smc-priorpost", "smc-postpost"):
        t = timed(lambda m=m: KingmanCoalescent(method=m, n_particles=S, n_hyper_iter=0,
                                                random_state=0).fit(Xs))
        per = t / S if m.startswith("smc") else t
        unit = "s per particle" if m.startswith("smc") else "s"
        print(f"{m:18s} n={ns} D={Ds} S={S} (n_hyper_iter=0): {t:7.2f} s CPU, {per:.4f} {unit}")


def digits_subset(seed: int, scaling: str):
    """20 random examples of each digit, 20 principal components, standardised."""
    from sklearn.datasets import load_digits
    from sklearn.decomposition import PCA

    digits = load_digits()
    rng = np.random.default_rng(seed)
    idx = np.concatenate([rng.choice(np.flatnonzero(digits.target == c), 20, replace=False)
                          for c in range(10)])
    X = PCA(20, random_state=0).fit_transform(digits.data[idx])
    X = (X - X.mean(axis=0)) / X.std(axis=0) if scaling == "per-feature" else X / X.std()
    return X, digits.target[idx]


def digits(n_subsets: int = 20) -> None:
    print(f"\ndigits, MNIST protocol (20 per digit, PCA 20, standardised), {n_subsets} subsets:")
    print(f"{'scaling':12s} {'method':32s} {'purity mean +- sd':>18s}  {'CPU per fit':>11s}")
    for scaling in ("per-feature", "global"):
        rows = {"Kingman defaults": [], "Kingman n_hyper_iter=0": [], "SciPy average linkage": []}
        cpu = {k: 0.0 for k in rows}
        rounds = []
        for seed in range(n_subsets):
            X, y = digits_subset(seed, scaling)
            for name, fit in [("Kingman defaults", lambda X: KingmanCoalescent().fit(X)),
                              ("Kingman n_hyper_iter=0", lambda X: KingmanCoalescent(n_hyper_iter=0).fit(X)),
                              ("SciPy average linkage", lambda X: linkage(X, "average"))]:
                t0 = time.process_time()
                out = fit(X)
                cpu[name] += time.process_time() - t0
                if name == "Kingman defaults":
                    rounds.append(out.n_hyper_iter_)
                rows[name].append(dendrogram_purity(out if isinstance(out, np.ndarray) else out.linkage_, y))
        for name, p in rows.items():
            p = np.asarray(p)
            print(f"{scaling:12s} {name:32s} {p.mean():8.4f} +- {p.std(ddof=1):.4f}  "
                  f"{cpu[name] / n_subsets:9.3f} s")
        diff = np.asarray(rows["Kingman defaults"]) - np.asarray(rows["SciPy average linkage"])
        print(f"{scaling:12s} defaults - average linkage: {diff.mean():+.4f} +- {diff.std(ddof=1):.4f} "
              f"(better on {int((diff >= 0).sum())}/{n_subsets} subsets); hyperparameter rounds "
              f"{np.mean(rounds):.1f} on average (max {max(rounds)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="points for the timing runs")
    ap.add_argument("--subsets", type=int, default=20, help="digit subsets for the purity runs")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--skip-digits", action="store_true")
    args = ap.parse_args()
    if not args.skip_timing:
        timing(args.n)
    if not args.skip_digits:
        digits(args.subsets)


if __name__ == "__main__":
    main()
