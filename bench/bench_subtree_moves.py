"""What moves confined to the root's subtrees could buy on two cores (issue 10, a projection).

The exact moves (:mod:`streamtree.inference.split_merge`) run on one thread, which bounds a
fit's two-core speed-up near 1.3x. A move that stays inside one subtree below the root (a
split of a node there to a place there, a merge of two of its nodes) keeps that subtree's
document total, so the collapsed stick prior changes only in the subtree's own factors and the
subtree's links to the nodes above are held: moves drawn within different subtrees could run
at once, exactly, with everything else between them. This script does not build that. It
classifies each split-merge attempt of a default fit as it runs now by the subtrees its nodes
lie in, takes its thread CPU, and projects:

* per sweep, the in-subtree attempts' CPU by subtree, dealt to ``--workers`` workers (largest
  first, each to the least loaded), plus everything else serially: the cross-subtree attempts
  (any that touch the root or two subtrees), the attempts that stop before drawing a move, the
  relocations, rehangs and lifts;
* the moves' bound: their CPU over that makespan, summed over sweeps (the baseline is 1.0x, the
  moves as they run now);
* the fit's projected two-core wall: the same fit at ``n_jobs=2`` measured in the same run, with
  its moves' time (their thread CPU in the classified run) replaced by the makespan, against the
  fit at ``n_jobs=1`` (the baseline: the measured speed-up at ``n_jobs=2``). The classified run
  is a third fit, so the wrappers' small cost stays out of the timed ones.

The projection takes the present attempts as they are; a kernel that draws moves within
subtrees would draw them differently (how many land in each subtree, and never across), so it
is an estimate of the parallel share, not of a built kernel.

Corpora: ``--corpus sou`` (SOU by decade, the demo's vocabulary, multinomial defaults,
``max_depth=3``) or ``--corpus sparse`` (``bench_zsweep.py``'s 50,000 documents at V = 20,000,
one epoch, 50 sweeps).

Usage: python bench/bench_subtree_moves.py [--corpus sou|sparse] [--likelihood multinomial|vmf]
       [--workers 2] [--decades N] [--seed 0]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import time
from collections import defaultdict
from collections.abc import Iterator

import numpy as np

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from streamtree.inference import split_merge as sm
from streamtree.model import DTSSBP
from streamtree.tree import ROOT

SERIAL_MOVES = ("relocate", "rehang", "lift", "lift_carried")


def top_subtree(parent: dict[int, int], x: int) -> int:
    """The child of the root whose subtree holds ``x`` (``ROOT`` for the root)."""
    if x == ROOT:
        return ROOT
    while parent[x] != ROOT:
        x = parent[x]
    return x


class Ledger:
    """Per sweep (one :class:`MoveState` each): CPU of in-subtree attempts by subtree, and the
    CPU that stays serial."""

    def __init__(self) -> None:
        self.sweeps: list[tuple[dict[int, float], list[float]]] = []
        self._state = None
        self.where: int | None = None  # the subtree of the attempt running, once known; -1 across

    def sweep_of(self, st) -> tuple[dict[int, float], list[float]]:
        if st is not self._state:
            self._state = st
            self.sweeps.append((defaultdict(float), [0.0]))
        return self.sweeps[-1]


@contextlib.contextmanager
def classified(ledger: Ledger) -> Iterator[Ledger]:
    """Wrap the moves so that each split-merge attempt's thread CPU goes to its subtree (or to
    the serial part) and every other move's to the serial part; the fit is unchanged."""
    SM, Places = sm.SplitMerge, sm.SplitPlaces
    saved = {name: getattr(SM, name) for name in ("attempt", "_split", "_merge", *SERIAL_MOVES)}
    saved_draw = Places.draw
    current: dict[str, object] = {}

    def attempt(self, st, rng, **kw):
        loads, serial = ledger.sweep_of(st)
        ledger.where = None
        c = time.thread_time()
        try:
            return saved["attempt"](self, st, rng, **kw)
        finally:
            spent = time.thread_time() - c
            if ledger.where is None or ledger.where < 0:
                serial[0] += spent
            else:
                loads[ledger.where] += spent

    def split(self, st, a, i, j, rng, born, proposal="launch"):
        current["st"], current["a"] = st, a
        try:
            return saved["_split"](self, st, a, i, j, rng, born, proposal)
        finally:
            current.clear()

    def draw(self, rng):
        place = saved_draw(self, rng)
        st, a = current.get("st"), current.get("a")
        if st is not None:
            parent = st.tree.parent
            s = top_subtree(parent, a)
            if place[0] == "new":
                inside = s != ROOT and place[1] != ROOT
            else:
                inside = s != ROOT and place[1] != ROOT and top_subtree(parent, place[1]) == s
            ledger.where = s if inside else -1
        return place

    def merge(self, st, a, b, i, j, rng, proposal="launch"):
        parent = st.tree.parent
        s = top_subtree(parent, b)
        ledger.where = s if (a != ROOT and s != ROOT and top_subtree(parent, a) == s) else -1
        return saved["_merge"](self, st, a, b, i, j, rng, proposal)

    def serial_move(name):
        fn = saved[name]

        @functools.wraps(fn)
        def run(self, st, *a, **k):
            _, serial = ledger.sweep_of(st)
            c = time.thread_time()
            try:
                return fn(self, st, *a, **k)
            finally:
                serial[0] += time.thread_time() - c
        return run

    SM.attempt, SM._split, SM._merge, Places.draw = attempt, split, merge, draw
    for name in SERIAL_MOVES:
        setattr(SM, name, serial_move(name))
    try:
        yield ledger
    finally:
        for name, fn in saved.items():
            setattr(SM, name, fn)
        Places.draw = saved_draw


def makespan(loads: list[float], workers: int) -> float:
    """Largest-first list scheduling of ``loads`` on ``workers`` workers."""
    bins = [0.0] * workers
    for x in sorted(loads, reverse=True):
        bins[bins.index(min(bins))] += x
    return max(bins, default=0.0)


def corpus_inputs(args) -> list:
    if args.corpus == "sou":
        from sou_corpus import load_sou
        from streamtree.likelihoods import LIKELIHOODS

        corpus = load_sou(decades=args.decades)
        return corpus.X if LIKELIHOODS[args.likelihood].text_norm == "l2" else corpus.counts
    from streamtree.synthetic import l2_rows, sparse_corpus

    corpus = sparse_corpus(np.random.default_rng(0), n_docs=50_000, p=20_000, nnz_per_row=30, n_topics=100,
                           normalise=False)
    return [l2_rows(corpus.X) if args.likelihood == "vmf" else corpus.X]


def fit(inputs: list, args, n_jobs: int) -> tuple[float, float, list]:
    """CPU and wall seconds of a default fit over ``inputs`` (one epoch each), and its trees'
    assignments."""
    c, w = time.process_time(), time.perf_counter()
    with DTSSBP(likelihood=args.likelihood, max_depth=3, random_state=args.seed, n_jobs=n_jobs) as model:
        for t, X in enumerate(inputs):
            model.partial_fit(X, epoch=t)
        labels = [tree.assignments.copy() for tree in model.trees_]
    return time.process_time() - c, time.perf_counter() - w, labels


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", choices=("sou", "sparse"), default="sou")
    p.add_argument("--likelihood", choices=("multinomial", "vmf"), default="multinomial")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--decades", default=None, help="SOU subset: first N decades, or labels like 1790s,1800s")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    inputs = corpus_inputs(args)
    print(f"== {args.corpus}: {len(inputs)} epoch(s), {sum(X.shape[0] for X in inputs)} documents, "
          f"{args.likelihood} defaults, max_depth=3, seed {args.seed}", flush=True)
    fit(inputs[:1] if args.corpus == "sou" else [inputs[0][:2000]], args, 1)  # compile or load the kernels

    ledger = Ledger()
    with classified(ledger):
        _, _, labels0 = fit(inputs, args, 1)
    cpu1, wall1, labels1 = fit(inputs, args, 1)  # the baselines, without the wrappers
    cpu2, wall2, labels2 = fit(inputs, args, 2)
    same = all(np.array_equal(a, b) and np.array_equal(a, c) for a, b, c in zip(labels0, labels1, labels2))

    inside = sum(sum(loads.values()) for loads, _ in ledger.sweeps)
    serial = sum(s[0] for _, s in ledger.sweeps)
    moves = inside + serial
    span = sum(makespan(list(loads.values()), args.workers) + s[0] for loads, s in ledger.sweeps)
    subtrees = [len(loads) for loads, _ in ledger.sweeps if loads]
    moves_bound = moves / span if span else 1.0
    projected = wall2 - moves + span  # the n_jobs=2 fit with its moves dealt to the workers
    print(f"fit at n_jobs=1: {cpu1:.1f} s CPU, {wall1:.1f} s wall; the moves' thread CPU {moves:.1f} s "
          f"({100 * moves / cpu1:.0f}% of the fit)")
    print(f"  split-merge attempts inside one subtree below the root: {inside:.1f} s "
          f"({100 * inside / moves:.0f}% of the moves), over a median of "
          f"{int(np.median(subtrees)) if subtrees else 0} subtrees a sweep")
    print(f"  serial (attempts across subtrees or at the root, attempts that draw no move, relocations, "
          f"rehangs, lifts): {serial:.1f} s ({100 * serial / moves:.0f}%)")
    print(f"moves on {args.workers} workers, in-subtree attempts dealt largest first: {span:.1f} s, "
          f"{moves_bound:.2f}x the moves (baseline: 1.00x, one thread as now)")
    print(f"fit at n_jobs=2: {wall2:.1f} s wall, {wall1 / wall2:.2f}x (baseline, measured; same trees: {same}); "
          f"projected with the moves dealt: {projected:.1f} s wall, {wall1 / projected:.2f}x (target >= 1.7x)")


if __name__ == "__main__":
    main()
