"""End-to-end replay and held-out evaluation on the bundled State of the Union corpus.

Part 1, replay: the demo's settings (2,000 terms, depth 3, kappa0 = 100, window 1,
``--sweeps`` per decade) over all 24 decades into a temporary store: documents per second,
wall and CPU seconds, peak resident memory. Baseline in the same process: the bare model
loop (``DTSSBP.partial_fit`` on the same pre-vectorised matrices, no source, rejects or
store), so the difference is the pipeline's overhead.

Part 2, evaluation: the paper's protocol (``streamtree.evaluate``, ``protocol="paper"``; the
default documents protocol is benchmarked by ``bench_evaluate.py``) on SOU decades for all six
models at depths 3 and 4. The full protocol (5 kappa0 values x 5 restarts on the first half,
5 repeats, 50 sweeps, every document) is far beyond a few minutes; ``--reduced`` (default)
subsamples each decade, shrinks the grid, restarts, repeats and sweeps, and the script
prints an estimate of the full run's time from the measured cost of one run.

Usage: python bench/bench_replay.py [--sweeps 10] [--skip-replay] [--skip-evaluate]
       [--full] [--max-docs-per-epoch 100] [--eval-sweeps 5] [--repeats 3] [--restarts 2]
       [--kappa0-grid 10,100,1000]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from streamtree.evaluate import EvaluationConfig, format_results, load_and_evaluate
from streamtree.model import DTSSBP
from streamtree.replay import ReplayConfig, fit_vocabulary, read_epochs, replay

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "sotu_paragraphs.parquet"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def bench_replay(sweeps: int) -> None:
    config = ReplayConfig(source=str(DATA), text_col="text", time_col="year", time_unit="year", epoch="10y",
                          min_df=5, max_df=0.5, max_features=2000,
                          model=dict(window=1, max_depth=3, kappa0=100.0, n_sweeps=sweeps, random_state=0))
    print(f"== replay: SOU by decade, 2000 terms, depth 3, kappa0 100, window 1, {sweeps} sweeps")
    with tempfile.TemporaryDirectory() as tmp:
        w0, c0 = time.perf_counter(), _cpu()
        summary = replay(config, f"{tmp}/store")
        wall, cpu = time.perf_counter() - w0, _cpu() - c0
    print(f"replay:   {summary.n_documents} documents in {summary.n_epochs} epochs, "
          f"{wall:.1f}s wall, {cpu:.1f}s CPU, {summary.n_documents / wall:.0f} docs/s wall, "
          f"{summary.n_documents / cpu:.0f} docs/s CPU; peak RSS {_peak_mib():.0f} MiB; "
          f"{summary.n_rejects} rejects ({summary.n_empty_after_filter} empty after filtering)")

    # baseline: the same fits with no pipeline around them
    epochs, _ = read_epochs(config)
    vec = fit_vocabulary(config, epochs)
    mats = []
    for ep in epochs:
        X = vec.transform(ep.rows.column("text"))
        empty = vec.empty_rows(X)
        mats.append((ep, X[~empty]))
    model = DTSSBP(**config.model_params())
    w0, c0 = time.perf_counter(), _cpu()
    nodes = []
    for ep, X in mats:
        nodes.append(model.partial_fit(X, epoch=ep.index, label=ep.label).trees_[-1].n_nodes)
    wall_b, cpu_b = time.perf_counter() - w0, _cpu() - c0
    n = sum(X.shape[0] for _, X in mats)
    print(f"baseline: bare partial_fit loop, {n} documents, {wall_b:.1f}s wall, {cpu_b:.1f}s CPU "
          f"({n / cpu_b:.0f} docs/s CPU); live nodes per decade: {nodes}")
    print(f"pipeline overhead (source, vectorising, publishing): {cpu - cpu_b:.1f}s CPU "
          f"({100 * (cpu - cpu_b) / cpu:.0f}% of the replay)")


def bench_evaluate(args) -> None:
    grid = [float(v) for v in args.kappa0_grid.split(",")]
    ev = EvaluationConfig(protocol="paper", depths=[3, 4], kappa0_grid=grid, restarts=args.restarts, repeats=args.repeats,
                          seed=0, max_docs_per_epoch=None if args.full else args.max_docs_per_epoch,
                          model=dict(n_sweeps=args.eval_sweeps, window=2))
    config = ReplayConfig(source=str(DATA), text_col="text", time_col="year", time_unit="year", epoch="10y",
                          min_df=5, max_df=0.5, max_features=args.max_features)
    c0 = time.perf_counter()
    results, splits = load_and_evaluate(config, ev, log=lambda m: print("  " + m, flush=True) if args.verbose else None)
    wall = time.perf_counter() - c0
    data = splits[0]
    n_train = sum(e.X_train.shape[0] for e in data.epochs)
    print(f"\n== evaluate: six models, depths 3 and 4, grid {grid}, {ev.restarts} restarts, {ev.repeats} repeats, "
          f"{ev.model_params()['n_sweeps']} sweeps, <= {ev.max_docs_per_epoch} docs per decade ({n_train} training docs)")
    print(format_results(results, data, ev))
    print(f"evaluate wall time {wall:.0f}s")
    # cost of the full protocol, scaled from the measured runs. In units of one all-epoch run,
    # a model costs grid * restarts half-length runs plus `repeats` full ones; time grows
    # about linearly with documents and sweeps (a lower bound: trees grow with the data).
    scale = (0.9 * 25488 / max(n_train, 1)) * (50 / ev.model_params()['n_sweeps'])
    est = 0.0
    for r in results:
        if r.seconds == 0:  # a DP model's other depth: reused, not rerun
            continue
        grid_r = len({k for k, _ in r.selection})
        units_now = grid_r * ev.restarts * 0.5 + ev.repeats
        units_full = (5 if grid_r > 1 else 1) * 5 * 0.5 + 5
        est += r.seconds / units_now * units_full * scale
    print(f"the full protocol (every document, 50 sweeps, 5 kappa0 values x 5 restarts, 5 repeats) would take "
          f"roughly {est / 3600:.0f} h on this machine, scaling these runs linearly in documents and sweeps")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweeps", type=int, default=10, help="sweeps per decade in the replay")
    p.add_argument("--skip-replay", action="store_true")
    p.add_argument("--skip-evaluate", action="store_true")
    p.add_argument("--full", action="store_true", help="evaluate on every document (very long)")
    p.add_argument("--max-docs-per-epoch", type=int, default=100)
    p.add_argument("--max-features", type=int, default=2000)
    p.add_argument("--eval-sweeps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--restarts", type=int, default=2)
    p.add_argument("--kappa0-grid", default="10,100,1000")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args()
    if not args.skip_replay:
        bench_replay(args.sweeps)
    if not args.skip_evaluate:
        bench_evaluate(args)


if __name__ == "__main__":
    main()
