"""Cost of fitting the multinomial likelihood on SOU decades (CPU time, one process).

Data: the SOU paragraphs of the chosen decades, raw term counts over a ``TextVectorizer``
vocabulary fitted on the whole corpus (``norm=None``), empty rows left out.

Two runs in one process, interleaved by decade so that both see the same machine load:

* ``fast``: ``DTSSBP(likelihood="multinomial")`` at its defaults, as shipped.
* ``reference``: the same model with the node update as it was before it was made
  incremental: every node re-solved on every pass, from the solver's own start (the
  children-free MAP), by the safeguarded multiplier search alone (no joint Newton steps).
  It shares the rest of the current code (numba kernels, dense set marginals), so the ratio
  is the node update's part of the speed-up; the code before this work is slower still
  (see BENCHMARKS.md).

For each decade (``partial_fit`` one after the other, so later decades have time links) it
prints CPU seconds of both, their ratio, the node counts and the adjusted Rand index between
the two runs' labels (1.0 when the trees agree).

With ``--before-src DIR`` it also fits the same decades with an earlier version of the package
(a directory holding its ``streamtree``, e.g. ``git archive <commit> streamtree | tar -x -C DIR``)
in a child process first, and prints its CPU seconds, the ratio to ``fast`` and the ARI
between their labels.

Usage: python bench/bench_multinomial.py [--decades 1940,1950,1960] [--seed 0] [--profile]
       [--only-fast] [--before-src DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from sklearn.metrics import adjusted_rand_score

from streamtree.likelihoods import multinomial_math
from streamtree.likelihoods.multinomial import Multinomial
from streamtree.model import DTSSBP
from streamtree.text import TextVectorizer

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "sotu_paragraphs.parquet"


def load(decades: list[int]):
    t = pq.read_table(DATA)
    dec = np.array(t.column("decade").to_pylist())
    texts = t.column("text").to_pylist()
    vec = TextVectorizer(norm=None).fit(texts)
    X = vec.transform(texts)
    keep = np.diff(X.indptr) > 0
    return [X[np.flatnonzero((dec == d) & keep)] for d in decades]


JOINT_MAX_ITER = getattr(multinomial_math, "_JOINT_MAX_ITER", None)  # None in earlier code


def reference_map(on: bool) -> None:
    """Switch the node update to the reference (cold, safeguarded search only) or back."""
    Multinomial.incremental_map = not on
    multinomial_math._JOINT_MAX_ITER = 0 if on else JOINT_MAX_ITER


def earlier_code(src: str, args) -> tuple[list[float], list[np.ndarray]]:
    """CPU seconds and labels per decade of the same fits by the package found at ``src``
    (e.g. ``git archive <commit> streamtree | tar -x -C DIR``), in a child process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "earlier.npz"
        env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
        subprocess.run([sys.executable, __file__, "--decades", args.decades, "--seed", str(args.seed),
                        "--dump", str(out)], env=env, check=True, stdout=subprocess.DEVNULL)
        got = np.load(out)
        return got["cpu"].tolist(), [got[f"labels{t}"] for t in range(got["cpu"].size)]


def dump(args, data) -> None:
    """The child process of ``earlier_code``: fit with whatever package is importable."""
    import streamtree

    logging.info("fitting with %s", streamtree.__file__)
    m = DTSSBP(random_state=args.seed, likelihood="multinomial")
    cpu, labels = [], {}
    for t, X in enumerate(data):
        c0 = time.process_time()
        m.partial_fit(X)
        cpu.append(time.process_time() - c0)
        labels[f"labels{t}"] = np.asarray(m.trees_[-1].assignments)
    np.savez(args.dump, cpu=np.array(cpu), **labels)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decades", default="1940,1950,1960")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="cProfile the fast run")
    ap.add_argument("--only-fast", action="store_true", help="skip the reference run")
    ap.add_argument("--before-src", help="directory holding an earlier streamtree package to time too")
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    args = ap.parse_args()
    decades = [int(d) for d in args.decades.split(",")]
    data = load(decades)
    if args.dump:
        dump(args, data)
        return
    print(f"SOU decades {decades}: documents {[x.shape[0] for x in data]}, V = {data[0].shape[1]}")
    before = earlier_code(args.before_src, args) if args.before_src else None
    runs = {"fast": DTSSBP(random_state=args.seed, likelihood="multinomial")}
    if not args.only_fast:
        runs["reference"] = DTSSBP(random_state=args.seed, likelihood="multinomial")
    cpu = {k: [] for k in runs}
    prof = cProfile.Profile() if args.profile else None
    print(f"{'decade':>7} {'run':>10} {'cpu s':>8} {'nodes':>6}")
    for t, X in enumerate(data):
        labels = {}
        for name, m in runs.items():
            reference_map(name == "reference")
            if prof is not None and name == "fast":
                prof.enable()
            c0 = time.process_time()
            m.partial_fit(X)
            cpu[name].append(time.process_time() - c0)
            if prof is not None and name == "fast":
                prof.disable()
            tree = m.trees_[-1]
            labels[name] = np.asarray(tree.assignments)
            print(f"{decades[t]:>7} {name:>10} {cpu[name][-1]:8.2f} {len(tree.node_ids):6d}")
        if "reference" in labels:
            ari = adjusted_rand_score(labels["reference"], labels["fast"])
            print(f"{decades[t]:>7} ratio reference/fast {cpu['reference'][-1] / cpu['fast'][-1]:.2f}, "
                  f"ARI between the runs {ari:.4f}")
        if before is not None:
            ari = adjusted_rand_score(before[1][t], labels["fast"])
            print(f"{decades[t]:>7} {'earlier':>10} {before[0][t]:8.2f} {np.unique(before[1][t]).size:6d} "
                  f"(occupied); ratio earlier/fast {before[0][t] / cpu['fast'][-1]:.2f}, ARI with fast {ari:.4f}")
    for name in runs:
        print(f"total {name}: {sum(cpu[name]):.2f} s CPU")
    if "reference" in cpu:
        print(f"total ratio reference/fast: {sum(cpu['reference']) / sum(cpu['fast']):.2f}")
    if before is not None:
        print(f"total earlier: {sum(before[0]):.2f} s CPU; ratio earlier/fast {sum(before[0]) / sum(cpu['fast']):.2f}")
    reference_map(False)
    if prof is not None:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
        print(s.getvalue())


if __name__ == "__main__":
    main()
