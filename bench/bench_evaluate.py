"""Held-out evaluation on the bundled State of the Union corpus: all six models, depths 3 and 4.

Runs ``streamtree.evaluate`` (default: the documents protocol; ``--protocol paper`` for the
dTSSBP paper's Table 1 protocol) on SOU by decade with reduced settings that fit a small
shared machine, prints the table, the equivalent ``streamtree evaluate`` command, the CPU
time, and an estimate of the full protocol's CPU time (every document, the estimator's
default sweeps, the default grid and repeats), scaled linearly in training documents, sweeps
and runs from this run (a lower bound: trees grow with the data).

Model settings other than those given here are the estimator's defaults (``DTSSBP``), so the
figures are a snapshot of the current model; rerun this script after the model changes.

``--workers N`` (N > 1) fits the protocol's runs in N worker processes. The same run first
evaluates with one worker as the baseline (skip it with ``--no-baseline``), then prints both
wall and CPU times (CPU of this process plus its finished worker processes), the speed-up and
whether the two results are identical (a digest of every figure, bit for bit).

Usage: python bench/bench_evaluate.py [--protocol documents] [--max-docs-per-epoch 200]
       [--sweeps 5] [--repeats 3] [--kappa0-grid 10,100,1000] [--restarts 2] [--max-features 2000]
       [--workers 2] [--no-baseline]
"""

from __future__ import annotations

import argparse
import hashlib
import resource
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from streamtree.evaluate import EvaluationConfig, format_results, load_and_evaluate, read_evaluation_epochs
from streamtree.replay import ReplayConfig

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "sotu_paragraphs.parquet"


def _cpu() -> tuple[float, float]:
    """CPU seconds of this process and of its finished (joined) child processes: the workers."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def _digest(results) -> str:
    """A digest of every figure of the results, bit for bit (not the CPU times)."""
    h = hashlib.sha256()
    for r in results:
        h.update(repr((r.variant, r.depth, r.kappa0, r.seed, list(r.selection.items()), r.selection_rows)).encode())
        for a in (r.normalized, r.unnormalized, r.npmi, *r.doc_scores):
            h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return h.hexdigest()[:16]


def _timed(config, ev, verbose: bool):
    """Run the evaluation; (results, splits, wall, CPU of this process, CPU of the workers)."""
    w0, (s0, c0) = time.perf_counter(), _cpu()
    results, splits = load_and_evaluate(config, ev, log=(lambda m: print("  " + m, flush=True)) if verbose else None)
    wall, (s1, c1) = time.perf_counter() - w0, _cpu()
    return results, splits, wall, s1 - s0, c1 - c0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--protocol", default="documents", choices=["documents", "paper"])
    p.add_argument("--max-docs-per-epoch", type=int, default=200, help="0: every document")
    p.add_argument("--sweeps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--restarts", type=int, default=2, help="paper protocol only")
    p.add_argument("--kappa0-grid", default="10,100,1000")
    p.add_argument("--max-features", type=int, default=2000)
    p.add_argument("--min-df", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1, help="worker processes fitting the runs (-1: all CPUs)")
    p.add_argument("--no-baseline", action="store_true", help="with --workers: skip the one-worker baseline run")
    p.add_argument("--verbose", action="store_true", help="one line per run")
    args = p.parse_args()

    grid = [float(v) for v in args.kappa0_grid.split(",")]
    ev = EvaluationConfig(protocol=args.protocol, depths=[3, 4], kappa0_grid=grid, repeats=args.repeats,
                          restarts=args.restarts, seed=args.seed, max_docs_per_epoch=args.max_docs_per_epoch or None,
                          model=dict(n_sweeps=args.sweeps), workers=args.workers)
    config = ReplayConfig(source=str(DATA), text_col="text", time_col="year", time_unit="year", epoch="10y",
                          min_df=args.min_df, max_df=0.5, max_features=args.max_features)
    command = (f"streamtree evaluate examples/data/sotu_paragraphs.parquet --text-col text --time-col year --time-unit year "
               f"--epoch 10y --min-df {args.min_df} --max-features {args.max_features} --protocol {args.protocol} "
               f"--max-depth 3,4 --kappa0-grid {args.kappa0_grid} --repeats {args.repeats} --sweeps {args.sweeps} "
               f"--seed {args.seed}"
               + (f" --restarts {args.restarts}" if args.protocol == "paper" else "")
               + (f" --max-docs-per-epoch {args.max_docs_per_epoch}" if args.max_docs_per_epoch else "")
               + (f" --workers {args.workers}" if args.workers != 1 else ""))
    print(f"== evaluate on SOU by decade, six models, depths 3 and 4\nequivalent command:\n  {command}\n", flush=True)
    n_workers = ev.n_workers()
    baseline = None
    if n_workers > 1 and not args.no_baseline:
        print("baseline: one worker (runs in this process)", flush=True)
        baseline = _timed(config, replace(ev, workers=1), args.verbose)
        print(f"  {baseline[2]:.1f}s wall, {baseline[3] + baseline[4]:.1f}s CPU\n"
              f"{n_workers} workers:", flush=True)
    results, splits, wall, cpu_self, cpu_workers = _timed(config, ev, args.verbose)
    cpu = cpu_self + cpu_workers
    print(format_results(results, splits, ev))
    runs_cpu = sum(r.seconds for r in results)
    print(f"\nevaluate, {n_workers} worker{'s' if n_workers > 1 else ''}: {wall:.1f}s wall, {cpu:.1f}s CPU "
          f"({cpu_self:.1f}s this process + {cpu_workers:.1f}s worker processes; the models' runs: "
          f"{runs_cpu:.1f}s); results digest {_digest(results)}")
    if baseline is not None:
        b_results, _, b_wall, b_self, b_workers = baseline
        same = _digest(b_results) == _digest(results)
        print(f"baseline, 1 worker: {b_wall:.1f}s wall, {b_self + b_workers:.1f}s CPU (the models' runs: "
              f"{sum(r.seconds for r in b_results):.1f}s); results digest {_digest(b_results)}")
        print(f"{n_workers} workers against 1: wall speed-up {b_wall / wall:.2f}x, CPU ratio "
              f"{cpu / (b_self + b_workers):.2f}; results {'identical' if same else 'DIFFERENT'}")

    # the full protocol, scaled from this run: every document, default sweeps, grid, restarts, repeats
    full = EvaluationConfig(protocol=args.protocol)
    n_train_now = sum(s.n_docs("train") for s in splits) / len(splits)
    n_all = sum(e.n_rows for e in read_evaluation_epochs(config, ev))
    held = full.test_fraction + (full.selection_fraction if args.protocol == "documents" else 0.0)
    scale = (n_all * (1 - held) / n_train_now) * (full.model_params()["n_sweeps"] / args.sweeps)
    n_grid_now, n_grid_full = len(grid), len(full.kappa0_grid)
    if args.protocol == "documents":
        # per repeat: grid runs for the two kappa0-linked tree models at two depths, one run for the others
        runs_now = args.repeats * (4 * n_grid_now + 5)
        runs_full = full.repeats * (4 * n_grid_full + 5)
    else:  # selection runs are half as long (first half of the epochs)
        runs_now = 4 * (n_grid_now * args.restarts * 0.5 + args.repeats) + 5 * (args.restarts * 0.5 + args.repeats)
        runs_full = 4 * (n_grid_full * full.restarts * 0.5 + full.repeats) + 5 * (full.restarts * 0.5 + full.repeats)
    est = cpu * scale * runs_full / runs_now
    print(f"full protocol ({n_all} documents, {full.model_params()['n_sweeps']} sweeps, grid of {n_grid_full}, "
          f"{full.repeats} repeats{', ' + str(full.restarts) + ' restarts' if args.protocol == 'paper' else ''}): "
          f"roughly {est / 3600:.1f} h CPU, scaled linearly from this run")


if __name__ == "__main__":
    main()
