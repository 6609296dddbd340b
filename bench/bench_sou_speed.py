"""Time per document pass on SOU against tomotopy HLDA and the sparse-product floor (issue 10, item 6).

Data: SOU paragraphs by decade with the demo's vocabulary (``bench/sou_corpus.py``).

* streamtree: ``DTSSBP`` at its defaults except ``max_depth`` (``--depths``, default the demo's
  3 and 4; ``--sweeps`` and ``--demo-settings`` change the run). A document pass is one Gibbs
  sweep over every document of every decade, so its cost is the CPU time of all
  ``partial_fit`` calls divided by the sweeps per decade. This charges each sweep its share
  of the per-epoch work too (setup, snapshot, predictive state), which is small.
* tomotopy ``HLDAModel(depth=4)``, default hyperparameters, one worker, on the same
  documents as lists of the same vocabulary terms: CPU time per training iteration (one pass
  over every document), after ``--hlda-burnin`` untimed-for-the-ratio iterations, measured in
  chunks interleaved with the streamtree decades so that both sides see the same machine load.
* Product floor: for every decade, ``X_t @ Theta_t.T`` with the decade's fitted tree (its
  live K at the end of the decade), best of 5 repeats, summed over decades; the least a
  sweep has to compute.

Targets: streamtree's pass at or below HLDA's iteration (ratio <= 1.0) at every depth, and
within 5x the product floor. CPU times include every thread of the process (BLAS threads too);
wall times are printed beside them.

Usage: python bench/bench_sou_speed.py [--depths 3,4] [--sweeps N] [--demo-settings]
       [--decades 6 | 1790s,1800s] [--hlda-burnin 50] [--hlda-chunk 5] [--profile] [--moves] [--seed 0]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import time

import numpy as np
from move_counts import move_counters, print_moves
from sou_corpus import load_sou

from streamtree.likelihoods import DEFAULT_LIKELIHOOD, LIKELIHOODS
from streamtree.model import DTSSBP

DEMO_SETTINGS = {"kappa0": 100.0, "window": 1, "n_sweeps": 10}  # as in streamtree/demo.py
FLOOR_REPEATS = 5


class Clock:
    """Accumulates CPU and wall seconds over several timed sections."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.wall = 0.0

    def __enter__(self) -> "Clock":
        self._c, self._w = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.cpu += time.process_time() - self._c
        self.wall += time.perf_counter() - self._w


def product_floor(trees, inputs) -> float:
    """CPU seconds of X_t @ Theta_t.T over all decades (best of FLOOR_REPEATS per decade); the
    family's coefficients (directions for the vMF, log word probabilities for the multinomial)
    cost the same product."""
    total = 0.0
    for tree, X in zip(trees, inputs):
        theta_t = np.ascontiguousarray(tree.theta.T)
        best = np.inf
        for _ in range(FLOOR_REPEATS):
            c0 = time.process_time()
            X @ theta_t
            best = min(best, time.process_time() - c0)
        total += best
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", default="3,4", help="model max_depth values (default 3,4)")
    p.add_argument("--sweeps", type=int, default=None, help="Gibbs sweeps per decade (default: the model's)")
    p.add_argument("--demo-settings", action="store_true",
                   help=f"use the demo's model settings {DEMO_SETTINGS} instead of the defaults")
    p.add_argument("--decades", default=None, help="subset: first N decades, or labels like 1790s,1800s")
    p.add_argument("--likelihood", default=DEFAULT_LIKELIHOOD,
                   help=f"model family (default {DEFAULT_LIKELIHOOD}, the model's): multinomial fits the raw "
                        "counts, vmf the L2-normalised rows")
    p.add_argument("--hlda-burnin", type=int, default=50, help="HLDA iterations before timing (default 50)")
    p.add_argument("--hlda-chunk", type=int, default=5,
                   help="HLDA iterations timed after each decade of each depth (default 5)")
    p.add_argument("--profile", action="store_true",
                   help="profile the streamtree side with cProfile (its times then include the profiler's overhead)")
    p.add_argument("--moves", action="store_true",
                   help="count each move kind's runs, acceptances and CPU, first decade apart from the later ones")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    depths = [int(d) for d in args.depths.split(",")]

    corpus = load_sou(decades=args.decades)
    print(f"== SOU speed: {len(corpus.labels)} decades, {corpus.n_documents} paragraphs, "
          f"{corpus.vocabulary.size} terms, {sum(c.nnz for c in corpus.counts)} nonzeros, "
          f"{int(sum(c.sum() for c in corpus.counts))} tokens")

    params = {"random_state": args.seed, "likelihood": args.likelihood,
              **(DEMO_SETTINGS if args.demo_settings else {})}
    inputs = corpus.X if LIKELIHOODS[args.likelihood].text_norm == "l2" else corpus.counts
    if args.sweeps is not None:
        params["n_sweeps"] = args.sweeps
    # warm-up, untimed: numba compiles (or loads from its cache) the kernels on first use
    for d in depths:
        with DTSSBP(max_depth=d, **{**params, "n_sweeps": 2}) as warm:
            warm.partial_fit(inputs[0][:300], epoch=0)
    models = {d: DTSSBP(max_depth=d, **params) for d in depths}
    n_sweeps = models[depths[0]].n_sweeps
    clocks = {d: Clock() for d in depths}
    profiler = cProfile.Profile() if args.profile else None

    hlda = None
    try:
        import tomotopy as tp
    except ImportError:
        print("-- tomotopy not installed: HLDA side skipped (pip install -e '.[bench]')")
    else:
        hlda = tp.HLDAModel(depth=4, seed=args.seed)
        for t in range(len(corpus.labels)):
            for words in corpus.token_lists(t):
                hlda.add_doc(words)
        burn = Clock()
        with burn:
            hlda.train(args.hlda_burnin, workers=1)
        hlda_clock, hlda_iters = Clock(), 0

    moves: dict[tuple[str, str], list] = {}
    at = {"depth": depths[0], "decade": 0}
    counting = (move_counters(moves, lambda: f"depth {at['depth']}, "
                              + ("first decade" if at["decade"] == 0 else "later decades"))
                if args.moves else contextlib.nullcontext())
    with counting:
        for t, label in enumerate(corpus.labels):
            for d in depths:
                at["depth"], at["decade"] = d, t
                if profiler:
                    profiler.enable()
                with clocks[d]:
                    models[d].partial_fit(inputs[t], epoch=t, label=label)
                if profiler:
                    profiler.disable()
                if hlda is not None:
                    with hlda_clock:
                        hlda.train(args.hlda_chunk, workers=1)
                    hlda_iters += args.hlda_chunk
            print(f"   {label}: {inputs[t].shape[0]} documents, nodes "
                  + ", ".join(f"depth {d}: {models[d].trees_[-1].n_nodes}" for d in depths), flush=True)

    shown = {k: v for k, v in params.items() if k != "random_state"}
    print(f"-- streamtree DTSSBP({', '.join(f'{k}={v!r}' for k, v in shown.items())}) at max_depth {depths}, "
          f"{n_sweeps} sweeps per decade" + (" [cProfile on: times inflated]" if profiler else ""))
    if hlda is not None:
        it_cpu, it_wall = hlda_clock.cpu / hlda_iters, hlda_clock.wall / hlda_iters
        print(f"-- tomotopy HLDAModel(depth=4), 1 worker: {it_cpu:.3f}s CPU ({it_wall:.3f}s wall) per iteration "
              f"over {hlda_iters} timed iterations after a {args.hlda_burnin}-iteration burn-in "
              f"({burn.cpu / max(args.hlda_burnin, 1):.3f}s CPU each); {hlda.live_k} live topics")
    print(f"{'depth':>5} {'mean K':>7} {'pass CPU s':>11} {'pass wall s':>12} {'floor s':>8} "
          f"{'pass/floor':>11} {'(<= 5x)':>8}" + (f" {'pass/HLDA':>10} {'(<= 1.0)':>9}" if hlda else ""))
    for d in depths:
        trees = models[d].trees_
        per_pass = clocks[d].cpu / n_sweeps
        floor = product_floor(trees, inputs)
        mean_k = np.mean([tr.n_nodes for tr in trees])
        line = (f"{d:>5} {mean_k:>7.0f} {per_pass:>11.3f} {clocks[d].wall / n_sweeps:>12.3f} {floor:>8.4f} "
                f"{per_pass / floor:>10.0f}x {'met' if per_pass <= 5 * floor else 'NOT met':>8}")
        if hlda is not None:
            ratio = per_pass / it_cpu
            line += f" {ratio:>9.1f}x {'met' if ratio <= 1.0 else 'NOT met':>9}"
        print(line)
        models[d].close()
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(20)
        print("-- where the streamtree time goes (all depths, by own time):")
        print(out.getvalue())
    if args.moves:
        print_moves(moves, sum(c.cpu for c in clocks.values()),
                    "-- moves (runs, accepted, thread CPU and its share of every depth's CPU; the counting's "
                    "overhead is in the times above):")


if __name__ == "__main__":
    main()
