"""Time per Gibbs sweep of the time-marginalised coalescent sampler (n = 200 and 1,000, d = 20).

Baseline, in the same process: a prune-and-regraft move that scores every candidate branch by
recomputing the whole tree's likelihood and prior (what the move costs without upward/outside
messages). Only the screening stage (one point per branch) is timed for the baseline, so its
figure is a lower bound on the naive cost. CPU time is reported next to wall time because the
benchmark machine may be shared.

    python bench/bench_tmc.py [--sizes 200 1000] [--sweeps 5 2]
"""

from __future__ import annotations

import argparse
import time

import streamtree  # noqa: F401  (numba cache directory)
import numpy as np

from streamtree.static import tmc_kernels as K
from streamtree.static.tmc import TimeMarginalizedCoalescent, TreeState


def make_data(n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    centers = rng.normal(scale=3.0, size=(10, d))
    return centers[rng.integers(0, 10, n)] + rng.normal(size=(n, d))


def time_fit(X: np.ndarray, sweeps: int) -> tuple[float, float, TimeMarginalizedCoalescent]:
    model = TimeMarginalizedCoalescent(n_sweeps=sweeps, burn_in=0, random_state=0)
    w0, c0 = time.perf_counter(), time.process_time()
    model.fit(X)
    return (time.perf_counter() - w0) / sweeps, (time.process_time() - c0) / sweeps, model


def naive_prune_seconds(state: TreeState, X: np.ndarray, n_moves: int, rng: np.random.Generator,
                        sigma2: float = 1.0, a: float = 2.0, b: float = 2.0) -> float:
    """CPU seconds per move of scoring every branch midpoint by full recomputation."""
    n = state.n_leaves
    cand = [v for v in range(2 * n - 1) if state.parent[v] >= 0 and state.parent[v] != state.root]
    total = 0.0
    for l in rng.choice(cand, size=n_moves, replace=False):
        work = state.copy()
        p, _ = K._detach(int(l), work.parent, work.ch, work.m)
        order = np.empty(2 * n - 1, dtype=np.int64)
        remaining = order[: K.postorder(work.ch, work.root, order)]  # the tree without l's subtree
        c0 = time.process_time()
        for i in remaining:
            if i == work.root:
                continue
            lo, hi = max(work.t[i], work.t[l]), work.t[work.parent[i]]
            if hi <= lo:
                continue
            trial = work.copy()
            K._attach(int(l), p, i, 0.5 * (lo + hi), trial.parent, trial.ch, trial.t, trial.m)
            trial.log_likelihood(X, sigma2) + trial.log_prior(a, b)
        total += time.process_time() - c0
    return total / n_moves


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[200, 1000])
    ap.add_argument("--sweeps", type=int, nargs="+", default=[5, 2])
    ap.add_argument("--dim", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    time_fit(make_data(12, args.dim, rng), 2)  # compile / load the kernels
    print(f"TMC Gibbs sweep, d = {args.dim} (per sweep: regraft every node, re-time every internal "
          "node, update sigma2/alpha/beta)")
    for n, sweeps in zip(args.sizes, args.sweeps):
        X = make_data(n, args.dim, rng)
        wall, cpu, model = time_fit(X, sweeps)
        moves = 2 * n - 1
        naive = naive_prune_seconds(model.state_, X, 3, rng)
        ours = cpu / moves  # upper bound: includes height and hyperparameter updates
        print(f"n = {n:5d}: {wall:7.3f} s/sweep wall, {cpu:7.3f} s/sweep CPU "
              f"({1e3 * ours:.3f} ms CPU per move); topology changes per regraft "
              f"{model.acceptance_.mean():.2f}")
        print(f"           baseline full-recompute regraft: {1e3 * naive:9.1f} ms CPU per move "
              f"(screening only) -> {naive / ours:,.0f}x slower, "
              f"~{naive * moves:,.0f} s per sweep")


if __name__ == "__main__":
    main()
