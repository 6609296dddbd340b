"""Fit cost on many small epochs, against an earlier version of the package in the same run (issue 10).

Corpora (``--corpus``):

* ``pre1900`` (default): SOU paragraphs before 1900 by year (110 epochs of about 80
  paragraphs), ``TextVectorizer`` fitted on them at its defaults, empty rows dropped: the case
  where each epoch's fixed cost (50 sweeps of split-merge attempts, node updates and
  hyperparameters whatever the epoch's size) dominates.
* ``tiny``: the same paragraphs in order, cut into epochs of ``TINY_EPOCH_DOCS`` (the first
  ``--epochs``, default ``TINY_EPOCHS``): a stream of a few documents an epoch, such as a
  project's commit messages by week, where a sweep's fixed cost is nearly all of it.
* ``decades``: SOU paragraphs by decade with the demo's vocabulary (``bench/sou_corpus.py``).

Each fit is ``DTSSBP(random_state=seed)`` at its defaults (``--likelihood`` to change the
family), one ``partial_fit`` per epoch, timed with ``time.process_time``. With ``--before-src
DIR`` (an earlier package, e.g. ``git archive <commit> streamtree | tar -x -C DIR``) the fits
alternate between that package and the installed one, each in a child process, ``--repeat``
times, and the script prints both CPU times, their ratio, whether every epoch's tree (its
documents' nodes and its node count) is the same and whether every node parameter and
concentration is the same to the bit.

Usage: python bench/bench_epoch_overhead.py [--corpus pre1900|tiny|decades] [--epochs N]
       [--likelihood NAME] [--before-src DIR] [--repeat 1] [--profile] [--seed 0]
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import os
import pickle
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "sotu_paragraphs.parquet"
TINY_EPOCH_DOCS = 6  # documents an epoch of the ``tiny`` corpus (a weekly stream's median is 4-10)
TINY_EPOCHS = 300


def load(corpus: str, likelihood: str | None, epochs: int | None) -> tuple[list[str], list]:
    """Epoch labels and inputs of ``corpus`` in the family's row form."""
    from streamtree.likelihoods import DEFAULT_LIKELIHOOD, LIKELIHOODS

    family = LIKELIHOODS[likelihood or DEFAULT_LIKELIHOOD]
    if corpus == "decades":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from sou_corpus import load_sou

        sou = load_sou(decades=str(epochs) if epochs else None)
        return sou.labels, sou.X if family.text_norm == "l2" else sou.counts
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from streamtree.text import TextVectorizer

    table = pq.read_table(DATA, columns=["year", "text"])
    table = table.filter(pc.less(table["year"], 1900))
    years = np.asarray(table["year"].to_pylist())
    texts = table["text"].to_pylist()
    if corpus == "tiny":  # stored in year order; epochs of TINY_EPOCH_DOCS consecutive paragraphs
        years = np.arange(len(texts)) // TINY_EPOCH_DOCS
        epochs = epochs or TINY_EPOCHS
    labels = sorted(set(years.tolist()))[:epochs]
    keep = np.flatnonzero(np.isin(years, labels))
    vec = TextVectorizer(norm=family.text_norm).fit([texts[i] for i in keep])
    inputs = []
    for y in labels:
        X = vec.transform([texts[i] for i in np.flatnonzero(years == y)])
        inputs.append(X[np.diff(X.indptr) > 0])
    return [str(y) for y in labels], inputs


def fit(args) -> tuple[float, list[tuple[list[int], int]], list[str]]:
    """CPU seconds of the whole fit, each epoch's (assignments, node count) and a digest of
    each epoch's node parameters and concentrations."""
    from streamtree.model import DTSSBP

    labels, inputs = load(args.corpus, args.likelihood, args.epochs)
    params = {"random_state": args.seed, **({"likelihood": args.likelihood} if args.likelihood else {})}
    with DTSSBP(**{**params, "n_sweeps": 2}) as warm:  # numba compiles or loads its kernels: untimed
        warm.partial_fit(inputs[0][:50], epoch=0)
    profiler = cProfile.Profile() if args.profile else None
    model = DTSSBP(**params)
    cpu = 0.0
    for t, (label, X) in enumerate(zip(labels, inputs)):
        c0 = time.process_time()
        if profiler:
            profiler.enable()
        model.partial_fit(X, epoch=t, label=label)
        if profiler:
            profiler.disable()
        cpu += time.process_time() - c0
    trees = [(np.asarray(tr.assignments).tolist(), tr.n_nodes) for tr in model.trees_]
    params = [hashlib.sha256(np.ascontiguousarray(tr.theta).tobytes()
                             + np.ascontiguousarray(tr.concentration).tobytes()).hexdigest() for tr in model.trees_]
    model.close()
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())
    return cpu, trees, params


def child(args, src: str | None, tmp: str, tag: str) -> tuple[float, list, list]:
    """One fit in a child process with the package at ``src`` (None: the installed one)."""
    out = Path(tmp) / f"{tag}.pkl"
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if src:
        env["PYTHONPATH"] = str(Path(src).resolve())
    cmd = [sys.executable, __file__, "--corpus", args.corpus, "--seed", str(args.seed), "--dump", str(out)]
    if args.epochs:
        cmd += ["--epochs", str(args.epochs)]
    if args.likelihood:
        cmd += ["--likelihood", args.likelihood]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(out, "rb") as f:
        return pickle.load(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", choices=["pre1900", "tiny", "decades"], default="pre1900")
    ap.add_argument("--epochs", type=int, default=None, help="only the first N epochs")
    ap.add_argument("--likelihood", default=None, help="model family (default: the model's)")
    ap.add_argument("--before-src", help="directory holding an earlier streamtree package to time against")
    ap.add_argument("--repeat", type=int, default=1, help="alternating before/after pairs (with --before-src)")
    ap.add_argument("--profile", action="store_true", help="cProfile the fit (no --before-src)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dump:
        with open(args.dump, "wb") as f:
            pickle.dump(fit(args), f)
        return
    what = f"{args.corpus}{f', first {args.epochs} epochs' if args.epochs else ''}, " \
           f"likelihood {args.likelihood or 'default'}, seed {args.seed}"
    if not args.before_src:
        cpu, trees, _ = fit(args)
        print(f"== {what}: {len(trees)} epochs, {cpu:.2f} s CPU, final tree {trees[-1][1]} nodes")
        return
    cpu: dict[str, list[float]] = {"before": [], "after": []}
    same = same_params = True
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            b_cpu, b_trees, b_params = child(args, args.before_src, tmp, f"before{r}")
            a_cpu, a_trees, a_params = child(args, None, tmp, f"after{r}")
            cpu["before"].append(b_cpu)
            cpu["after"].append(a_cpu)
            same &= b_trees == a_trees
            same_params &= b_params == a_params
            print(f"   pair {r + 1}: before {b_cpu:.2f} s, after {a_cpu:.2f} s CPU", flush=True)
    b, a = min(cpu["before"]), min(cpu["after"])
    print(f"== {what}: {len(a_trees)} epochs; best CPU before {b:.2f} s, after {a:.2f} s "
          f"(after/before {a / b:.3f}); same trees in every epoch: {same}; "
          f"same node parameters to the bit: {same_params}")
    for tag, trees in (("before", b_trees), ("after", a_trees)):
        nodes = np.array([k for _, k in trees])
        print(f"   nodes per epoch {tag}: mean {nodes.mean():.2f}, median {np.median(nodes):g}, "
              f"{nodes.min()}-{nodes.max()}; one-node epochs {int((nodes == 1).sum())}")


if __name__ == "__main__":
    main()
