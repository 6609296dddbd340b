"""A tiny topical corpus in daily files, and store comparison, for the service tests."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from connectors.stores.snapshot import SnapshotStore

TOPICS = [["tax", "budget", "revenue", "treasury", "debt", "spending"],
          ["army", "navy", "war", "troops", "defense", "enemy"],
          ["school", "education", "teacher", "student", "college", "learning"],
          ["farm", "crop", "harvest", "land", "rural", "farmer"]]
COMMON = ["the", "policy", "nation", "people", "year"]
#: the model settings of every service test and of the replays they are compared with (the
#: rest at the estimator's defaults, as a replay without model options has them)
MODEL = dict(max_depth=2, n_sweeps=3)


def day_rows(day: int, n: int, seed: int) -> list[dict]:
    """``n`` documents on 2026-03-``day`` (hours spread over the day)."""
    rng = np.random.default_rng([seed, day])
    rows = []
    for _ in range(n):
        t = rng.integers(len(TOPICS))
        words = rng.choice(TOPICS[t], size=8).tolist() + rng.choice(COMMON, size=3).tolist()
        rows.append({"text": " ".join(words), "time": f"2026-03-{day:02d}T{int(rng.integers(0, 24)):02d}:00:00Z"})
    return rows


def write_jsonl(path: str, rows: list[dict]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path))
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


def write_partition_copies(root: str) -> None:
    """A hive-partitioned folder whose two files are byte-identical: ``year=2020/part-0.parquet``
    (20 texts, no time column: the year is the folder's) and a copy as ``year=2021/part-0.parquet``,
    so the same texts are rows of 2020 and of 2021."""
    first, second = (os.path.join(root, f"year={y}", "part-0.parquet") for y in (2020, 2021))
    for path in (first, second):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table({"text": [r["text"] for r in day_rows(1, 20, 0)]}), first)
    with open(first, "rb") as src, open(second, "wb") as dst:
        dst.write(src.read())


def store_epochs(uri: str) -> list[tuple]:
    """Per published epoch: label, node ids, parents, theta, assignments, document ids."""
    store = SnapshotStore(str(uri))
    out = []
    for e in store.epochs():
        r = store.read(e["epoch"])
        t = r.tree
        out.append((e["epoch"], e["label"], t.node_ids.tolist(), t.parent.tolist(), t.theta.tobytes(),
                    t.assignments.tolist(), [str(d) for d in r.doc_ids]))
    return out


def store_rejects(uri: str) -> list[tuple[str, str]]:
    """(id or source, reason) of every committed reject."""
    store = SnapshotStore(str(uri))
    out = []
    for e in store.epochs():
        rej = store.rejects(e["epoch"])
        if rej is not None:
            for src, i, reason in zip(rej.column("source").to_pylist(), rej.column("id").to_pylist(),
                                      rej.column("reason").to_pylist()):
                out.append((i or src, reason))
    return sorted(out)


def assert_events_follow_the_published_trees(store: SnapshotStore) -> None:
    """Between consecutive published epochs, births and deaths are exactly the ids that came
    and went, whatever epochs without documents lay between them; the entry's ``died`` agrees."""
    prev: set[int] = set()
    for entry in store.epochs():
        now = set(store.read(entry["epoch"]).tree.node_ids.tolist())
        events = store.events(entry["epoch"]).to_pylist()
        kinds = {k: {e["node_id"] for e in events if e["event"] == k} for k in ("born", "died")}
        assert kinds["born"] == now - prev and kinds["died"] == prev - now, entry["label"]
        assert set(entry["died"]) == prev - now
        prev = now
