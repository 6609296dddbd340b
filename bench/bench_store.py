"""Store costs: resume against the original run, and the commit cost per epoch against the
number of epochs already published.

Part 1: replay the bundled SOU corpus by decade (``--sweeps`` per epoch) into a temporary
store, then (a) resume the complete store, (b) delete the commit records of the last
``--tail`` epochs (as if the run had been killed there) and resume, which fits only those.
Baseline: the original replay, in the same process. Before checkpoints, a resume refitted
every epoch from the first, so (a) and (b) cost as much as the original run.

Part 2: publish ``--epochs`` small synthetic epochs (with a checkpoint each) and report the
CPU time per commit over the first and the last 50: per-epoch commit records keep it flat
(the manifest used to be rewritten in full for every epoch).

Usage: python bench/bench_store.py [--sweeps 5] [--tail 3] [--epochs 1000]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from connectors.stores import SnapshotStore
from streamtree.epoch_tree import EpochTree
from streamtree.replay import ReplayConfig, replay

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "sotu_paragraphs.parquet"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(fn):
    w, c = time.perf_counter(), _cpu()
    out = fn()
    return out, time.perf_counter() - w, _cpu() - c


def bench_resume(sweeps: int, tail: int) -> None:
    config = ReplayConfig(source=str(DATA), text_col="text", time_col="year", time_unit="year", epoch="10y",
                          min_df=5, max_df=0.5, max_features=2000,
                          model={"window": 1, "max_depth": 3, "kappa0": 100.0, "n_sweeps": sweeps, "random_state": 0})
    print(f"== resume: SOU by decade, 2000 terms, {sweeps} sweeps")
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"{tmp}/store"
        # every epoch's checkpoint kept, so that deleting the last records below leaves a
        # resumable store (a real crash never removes a record: the latest one's checkpoint is kept)
        summary, wall0, cpu0 = _timed(lambda: replay(config, uri, keep_checkpoints="all"))
        print(f"original replay:          {summary.n_epochs} epochs, {wall0:6.2f}s wall, {cpu0:6.2f}s CPU (baseline)")
        _, wall1, cpu1 = _timed(lambda: replay(config, uri, mode="resume"))
        print(f"resume of complete store: {wall1:6.2f}s wall, {cpu1:6.2f}s CPU "
              f"({100 * cpu1 / cpu0:.1f}% of the original's CPU)")
        store = SnapshotStore(uri)
        last = store.last_commit()["epoch"]
        for e in range(last - tail + 1, last + 1):
            (Path(uri) / "commits" / f"{e:06d}.json").unlink()
        manifest = Path(uri) / "manifest.json"
        import json

        m = json.loads(manifest.read_text())
        m["complete"] = None
        manifest.write_text(json.dumps(m))
        s2, wall2, cpu2 = _timed(lambda: replay(config, uri, mode="resume"))
        print(f"resume of the last {tail}:     {wall2:6.2f}s wall, {cpu2:6.2f}s CPU "
              f"({100 * cpu2 / cpu0:.1f}% of the original's CPU; {s2.n_published} epochs fitted, "
              f"the source read and bucketed once)")


def _tree(epoch: int, k: int = 20, p: int = 500) -> EpochTree:
    rng = np.random.default_rng(epoch)
    theta = rng.normal(size=(k, p))
    theta /= np.linalg.norm(theta, axis=1, keepdims=True)
    ids = np.arange(k, dtype=np.int64)
    parent = np.r_[-1, np.zeros(k - 1, dtype=np.int64)]
    counts = rng.integers(0, 10, size=k)
    return EpochTree(epoch=epoch, node_ids=ids, parent=parent, depth=np.r_[0, np.ones(k - 1, dtype=np.int64)],
                     mass=np.full(k, 1.0 / (k + 1)), counts=counts, subtree_counts=counts, window_counts=counts,
                     theta=theta, concentration=np.ones(k), born=np.zeros(k, dtype=np.int64),
                     assignments=rng.integers(0, k, size=100), label=str(epoch))


def bench_commits(n_epochs: int) -> None:
    print(f"\n== commit cost: {n_epochs} epochs of 20 nodes x 500 terms, 100 documents, with a checkpoint")
    with tempfile.TemporaryDirectory() as tmp:
        store = SnapshotStore(f"{tmp}/store")
        cpu = []
        ckpt = ({"theta": np.zeros((20, 500)), "ids": np.arange(20)}, {"format_version": 1})
        with store.writer("bench"):
            for e in range(n_epochs):
                tree = _tree(e)
                ids = [f"d{i}" for i in range(100)]
                c = _cpu()
                store.publish(tree, ids, top_words=[[] for _ in range(20)], checkpoint=ckpt, state={"e": e})
                cpu.append(_cpu() - c)
    first, last = np.mean(cpu[:50]) * 1e3, np.mean(cpu[-50:]) * 1e3
    print(f"CPU per commit: first 50 epochs {first:.2f} ms (baseline), last 50 {last:.2f} ms "
          f"(ratio {last / first:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=5)
    ap.add_argument("--tail", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=1000)
    ap.add_argument("--skip-resume", action="store_true")
    args = ap.parse_args()
    if not args.skip_resume:
        bench_resume(args.sweeps, args.tail)
    bench_commits(args.epochs)


if __name__ == "__main__":
    main()
