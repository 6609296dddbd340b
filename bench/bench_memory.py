"""Fit memory against the corpus and the node parameters, over epoch sizes (issue 10).

Target: the model's memory does not grow with the number of documents beyond the corpus
itself. Each size is fitted in a fresh child process: ``sparse_corpus`` (``--features`` terms,
30 non-zeros a row, 100 planted topics, raw counts; the generator of ``bench_zsweep.py``), then
``DTSSBP(likelihood="multinomial", max_depth=3, n_sweeps=--sweeps, random_state=--seed)``, one
epoch. The child reports its peak resident memory during the fit over its resident memory
before it (``ru_maxrss``, which includes what NumPy and numba allocate and free within a
sweep), and the most live nodes any sweep had (the fit's progress callback).

Baselines printed beside each figure, from the same run: the corpus itself (values, column
indices and row pointers) and one node-by-term matrix of doubles at the most live nodes, the
size of one copy of the node parameters. The growth is then split by least squares over the
sizes into node-by-term matrices and corpus copies (``growth ~ a K_max p 8 + b corpus``): ``b``
is what grows with the documents, in corpora. With ``--before-src DIR`` (an earlier package,
e.g. ``git archive <commit> streamtree | tar -x -C DIR``) every size is fitted with both
packages, alternately, and the script says whether each fit's assignments are the same.

Usage: python bench/bench_memory.py [--sizes 12500,25000,50000,100000] [--features 20000]
       [--sweeps 8] [--before-src DIR] [--seed 0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np

MIB = 2.0**20


def fit_one(n_docs: int, n_features: int, sweeps: int, seed: int) -> dict:
    """One fit in this process: peak RSS growth, most live nodes, corpus bytes, a digest."""
    from streamtree import DTSSBP
    from streamtree.synthetic import sparse_corpus

    corpus = sparse_corpus(np.random.default_rng(seed), n_docs=n_docs, p=n_features, nnz_per_row=30,
                           n_topics=100, normalise=False)
    X = corpus.X
    most = [0]

    def seen(done: int, total: int, n_live: int) -> None:
        most[0] = max(most[0], int(n_live))

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    with DTSSBP(likelihood="multinomial", max_depth=3, n_sweeps=sweeps, random_state=seed) as model:
        model.partial_fit(X, callback=seen)
        tree = model.trees_[-1]
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return {"docs": n_docs, "growth_mib": after - before, "k_max": most[0], "k_end": int(tree.n_nodes),
            "corpus_mib": (X.data.nbytes + X.indices.nbytes + X.indptr.nbytes) / MIB,
            "digest": hashlib.sha256(np.asarray(tree.assignments).tobytes()).hexdigest()[:12]}


def child(args, n_docs: int, src: str | None) -> dict:
    """:func:`fit_one` in a fresh process with the package at ``src`` (None: the installed one)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if src:
        env["PYTHONPATH"] = str(Path(src).resolve())
    cmd = [sys.executable, __file__, "--one", str(n_docs), "--features", str(args.features),
           "--sweeps", str(args.sweeps), "--seed", str(args.seed)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def split_growth(rows: list[dict], n_features: int) -> tuple[float, float] | None:
    """Least-squares ``growth ~ a * (K_max p 8 bytes) + b * corpus``: (a, b), or None with fewer
    than two sizes."""
    if len(rows) < 2:
        return None
    A = np.array([[r["k_max"] * n_features * 8 / MIB, r["corpus_mib"]] for r in rows])
    y = np.array([r["growth_mib"] for r in rows])
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    return float(a), float(b)


def report(tag: str, rows: list[dict], n_features: int) -> None:
    print(f"-- {tag}")
    print("   documents | corpus MiB | most live nodes | one node matrix MiB | RSS growth MiB | "
          "growth / corpus | growth / node matrix")
    for r in rows:
        node = r["k_max"] * n_features * 8 / MIB
        print(f"   {r['docs']:>9,} | {r['corpus_mib']:10.1f} | {r['k_max']:15d} | {node:19.1f} | "
              f"{r['growth_mib']:14.0f} | {r['growth_mib'] / r['corpus_mib']:15.1f} | "
              f"{r['growth_mib'] / node:20.2f}")
    fit = split_growth(rows, n_features)
    if fit is not None:
        a, b = fit
        print(f"   least squares: growth ~ {a:.2f} node matrices + {b:.2f} corpora")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="12500,25000,50000,100000", help="documents per fit, comma-separated")
    ap.add_argument("--features", type=int, default=20000, help="terms (V)")
    ap.add_argument("--sweeps", type=int, default=8)
    ap.add_argument("--before-src", help="directory holding an earlier streamtree package to measure against")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(fit_one(args.one, args.features, args.sweeps, args.seed)))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    # numba compiles or loads its kernels in a first, untimed fit, so that no measured child
    # pays for compiling (which raises the peak)
    for src in ([args.before_src] if args.before_src else []) + [None]:
        child(args, min(sizes), src)
    after, before = [], []
    for n in sizes:
        if args.before_src:
            before.append(child(args, n, args.before_src))
        after.append(child(args, n, None))
        print(f"   {n:,} documents done", flush=True)
    print(f"== multinomial, V = {args.features:,}, {args.sweeps} sweeps, seed {args.seed}")
    if before:
        report("before", before, args.features)
    report("this package", after, args.features)
    if before:
        same = [b["digest"] == a["digest"] for b, a in zip(before, after)]
        ratio = [a["growth_mib"] / b["growth_mib"] for b, a in zip(before, after)]
        print(f"   growth after / before: {', '.join(f'{x:.2f}' for x in ratio)}; "
              f"same assignments: {', '.join(map(str, same))}")


if __name__ == "__main__":
    main()
