"""Store size against input size on a weekly, news-like stream.

The corpus: ``--docs`` paragraphs sampled (seeded) from the bundled SOU corpus and re-dated
uniformly over one year, replayed with weekly epochs (52 epochs of ~``docs/52`` documents,
like a news feed). Prints the input file's size, the store's size and the ratio, and the
store's bytes by file kind (theta, checkpoint, nodes, assignments, other), so the part that
dominates is visible. The baseline is the input file, measured in the same run.

Then the same trees' theta written with a top-m truncation (``SnapshotStore(theta_top_n=m)``)
for a few m, with its reported error, and the size if only the last epoch kept its checkpoint
(what a resume needs; older epochs' models could then not be loaded): measured file sizes of
what the store writes, not estimates.

Usage: python bench/bench_store_size.py [--docs 3800] [--sweeps 5] [--top-m 50,100,200]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from connectors.stores import SnapshotStore
from connectors.stores.snapshot import THETA_ENCODING, _theta_table
from streamtree.replay import ReplayConfig, replay

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "sotu_paragraphs.parquet"


def weekly_corpus(path: Path, n_docs: int, seed: int = 0) -> None:
    table = pq.read_table(DATA, columns=["text"])
    rng = np.random.default_rng(seed)
    take = np.sort(rng.choice(table.num_rows, size=min(n_docs, table.num_rows), replace=False))
    start = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    seconds = np.sort(rng.uniform(0, 364 * 86400, size=take.size))
    times = [start + dt.timedelta(seconds=float(s)) for s in seconds]
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(take.size)],
                             "text": table.column("text").take(take), "time": pa.array(times)}), path)


def kind_of(name: str) -> str:
    for kind in ("theta", "checkpoint", "nodes", "assignments", "rejects"):
        if name.startswith(kind):
            return kind
    return "other"


def sizes(root: Path) -> Counter:
    out: Counter = Counter()
    for dirpath, _, files in os.walk(root):
        for f in files:
            out[kind_of(f)] += os.path.getsize(os.path.join(dirpath, f))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=3800)
    ap.add_argument("--sweeps", type=int, default=5)
    ap.add_argument("--top-m", default="50,100,200")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "news.parquet"
        weekly_corpus(source, args.docs)
        store_dir = Path(tmp) / "store"
        config = ReplayConfig(source=str(source), text_col="text", time_col="time", id_col="id", epoch="1w",
                              model={"n_sweeps": args.sweeps})
        t0 = time.process_time()
        summary = replay(config, str(store_dir))
        cpu = time.process_time() - t0
        store = SnapshotStore(str(store_dir))
        epochs = store.epochs()
        by_kind = sizes(store_dir)
        total = sum(by_kind.values())
        given = source.stat().st_size
        print(f"weekly news-like corpus: {args.docs} documents, {len(epochs)} epochs, "
              f"vocabulary {len(store.vectorizer().vocabulary_)} terms, {args.sweeps} sweeps, replay CPU {cpu:.1f}s")
        print(f"input {given / 1e6:.2f} MB (baseline); store {total / 1e6:.2f} MB = {total / given:.2f} x input")
        for kind, n in by_kind.most_common():
            print(f"  {kind:12s} {n / 1e6:8.2f} MB  {n / total:6.1%}")
        last = store.read(epochs[-1]["epoch"])
        print(f"last epoch: {last.tree.n_nodes} nodes, theta exact: {last.theta_exact}; "
              f"{summary.n_rejects} rejects")
        trees = [store.read(e["epoch"]).tree for e in epochs]
        last_ckpt = sum(os.path.getsize(store_dir / epochs[-1]["path"] / f)
                        for f in ("checkpoint.parquet", "checkpoint.json"))
        for m in [int(x) for x in args.top_m.split(",")]:
            theta_bytes, error = 0, 0.0
            for tree in trees:
                table, _, err = _theta_table(tree, m)
                out = Path(tmp) / "theta.parquet"
                pq.write_table(table, out, compression="zstd", **THETA_ENCODING)
                theta_bytes += out.stat().st_size
                error = max(error, err)
            rest = total - by_kind["theta"]
            only_last = rest - by_kind["checkpoint"] + last_ckpt
            print(f"theta top-{m}: {theta_bytes / 1e6:.2f} MB (max relative L2 error {error:.3f}); store "
                  f"{(rest + theta_bytes) / 1e6:.2f} MB = {(rest + theta_bytes) / given:.2f} x input, "
                  f"{(only_last + theta_bytes) / 1e6:.2f} MB = {(only_last + theta_bytes) / given:.2f} x input "
                  "with the last checkpoint only")


if __name__ == "__main__":
    main()
