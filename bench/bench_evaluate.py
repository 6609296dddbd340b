"""Held-out evaluation on the bundled State of the Union corpus: all six models, depths 3 and 4.

Runs ``streamtree.evaluate`` (default: the documents protocol; ``--protocol paper`` for the
dTSSBP paper's Table 1 protocol) on SOU by decade with reduced settings that fit a small
shared machine, prints the table, the equivalent ``streamtree evaluate`` command, the CPU
time, and an estimate of the full protocol's CPU time (every document, the estimator's
default sweeps, the default grid and repeats), scaled linearly in training documents, sweeps
and runs from this run (a lower bound: trees grow with the data).

Model settings other than those given here are the estimator's defaults (``DTSSBP``), so the
figures are a snapshot of the current model; rerun this script after the model changes.

Usage: python bench/bench_evaluate.py [--protocol documents] [--max-docs-per-epoch 200]
       [--sweeps 5] [--repeats 3] [--kappa0-grid 10,100,1000] [--restarts 2] [--max-features 2000]
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from streamtree.evaluate import EvaluationConfig, format_results, load_and_evaluate, read_evaluation_epochs
from streamtree.replay import ReplayConfig

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "sotu_paragraphs.parquet"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


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
    p.add_argument("--verbose", action="store_true", help="one line per run")
    args = p.parse_args()

    grid = [float(v) for v in args.kappa0_grid.split(",")]
    ev = EvaluationConfig(protocol=args.protocol, depths=[3, 4], kappa0_grid=grid, repeats=args.repeats,
                          restarts=args.restarts, seed=args.seed, max_docs_per_epoch=args.max_docs_per_epoch or None,
                          model=dict(n_sweeps=args.sweeps))
    config = ReplayConfig(source=str(DATA), text_col="text", time_col="year", time_unit="year", epoch="10y",
                          min_df=args.min_df, max_df=0.5, max_features=args.max_features)
    command = (f"streamtree evaluate examples/data/sotu_paragraphs.parquet --text-col text --time-col year --time-unit year "
               f"--epoch 10y --min-df {args.min_df} --max-features {args.max_features} --protocol {args.protocol} "
               f"--max-depth 3,4 --kappa0-grid {args.kappa0_grid} --repeats {args.repeats} --sweeps {args.sweeps} "
               f"--seed {args.seed}"
               + (f" --restarts {args.restarts}" if args.protocol == "paper" else "")
               + (f" --max-docs-per-epoch {args.max_docs_per_epoch}" if args.max_docs_per_epoch else ""))
    print(f"== evaluate on SOU by decade, six models, depths 3 and 4\nequivalent command:\n  {command}\n", flush=True)
    w0, c0 = time.perf_counter(), _cpu()
    results, splits = load_and_evaluate(config, ev, log=(lambda m: print("  " + m, flush=True)) if args.verbose else None)
    wall, cpu = time.perf_counter() - w0, _cpu() - c0
    print(format_results(results, splits, ev))
    print(f"\nevaluate: {wall:.0f}s wall, {cpu:.0f}s CPU")

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
