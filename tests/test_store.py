"""Snapshot store: exact round trips, atomic publish, lineage, static snapshots."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy.cluster.hierarchy import linkage

from connectors.stores import SnapshotStore, StoreAccessError, StoreError
from streamtree.epoch_tree import EpochTree
from streamtree.records import make_rejects
from streamtree.static.dendrogram import Dendrogram
from streamtree.text import TextVectorizer


def make_tree(epoch, node_ids, parent, born, p=6, seed=0, n_docs=5, died=(), label=None):
    rng = np.random.default_rng(seed)
    k = len(node_ids)
    theta = np.zeros((k, p))
    for i in range(k):
        support = rng.choice(p, size=rng.integers(1, p + 1), replace=False)  # some dense, some sparse
        theta[i, support] = rng.normal(size=support.size)
        theta[i] /= np.linalg.norm(theta[i])
    depth = np.zeros(k, dtype=np.int64)
    ids = list(node_ids)
    for i, par in enumerate(parent):
        depth[i] = 0 if par == -1 else depth[ids.index(par)] + 1
    counts = rng.integers(0, 4, size=k)
    return EpochTree(
        epoch=epoch, node_ids=np.asarray(node_ids, dtype=np.int64), parent=np.asarray(parent, dtype=np.int64),
        depth=depth, mass=rng.dirichlet(np.ones(k + 1))[:k], counts=counts, subtree_counts=counts + 1,
        window_counts=counts + 2, theta=theta, concentration=rng.uniform(1, 100, size=k),
        born=np.asarray(born, dtype=np.int64), assignments=rng.choice(np.asarray(node_ids), size=n_docs),
        died=np.asarray(died, dtype=np.int64), label=label,
    )


def assert_same_tree(a: EpochTree, b: EpochTree):
    for name in ("node_ids", "parent", "depth", "mass", "counts", "subtree_counts", "window_counts",
                 "theta", "concentration", "born", "assignments", "died"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        np.testing.assert_array_equal(x, y, err_msg=name)  # exact: stored as float64
    assert a.epoch == b.epoch and a.label == b.label


def vocab6():
    return TextVectorizer(min_df=1, max_df=1.0, stop_words=None).fit(
        ["alpha beta gamma", "delta epsilon zeta"])


def test_round_trip_exact(tmp_path):
    store = SnapshotStore(str(tmp_path / "run"))
    assert store.epochs() == [] and store.vocabulary() is None
    v = vocab6()
    store.write_vocabulary(v)
    store.set_config({"window": 2, "spec": "10y"})
    t0 = make_tree(0, [0, 1, 2], [-1, 0, 0], [0, 0, 0], label="1790s")
    t1 = make_tree(1, [0, 1, 3, 4], [-1, 0, 1, 0], [0, 0, 1, 1], seed=1, died=[2], label="1800s")
    rej = make_rejects(["f.csv"], [3], ["f.csv:3"], ["empty text"], text=["  "])
    store.publish(t0, [f"d{i}" for i in range(5)], key=179, state={"epoch": 0, "rng": [1, 2]})
    store.publish(t1, [f"e{i}" for i in range(5)], key=180, rejects=rej, state={"epoch": 1})

    assert [(e["epoch"], e["label"], e["key"]) for e in store.epochs()] == [(0, "1790s", 179), (1, "1800s", 180)]
    for t, prefix in ((t0, "d"), (t1, "e")):
        got = store.read(t.epoch)
        assert_same_tree(got.tree, t)
        assert got.doc_ids.tolist() == [f"{prefix}{i}" for i in range(5)]
        assert got.theta_exact and got.theta_error == 0.0
        assert got.top_words == t.top_words(v.vocabulary_, 10)
    assert store.read(0).rejects is None and store.rejects(0) is None
    assert store.rejects(1).column("position").to_pylist() == [3]
    assert store.nodes(1).column("top_words").to_pylist() == store.read(1).top_words
    assert store.read(1).rejects.to_pylist()[0]["reason"] == "empty text"
    assert store.last_commit()["state"] == {"epoch": 1}
    assert store.epochs()[0]["state"] == {"epoch": 0, "rng": [1, 2]}
    assert store.config() == {"window": 2, "spec": "10y"}
    assert store.vocabulary().tolist() == v.vocabulary_.tolist()
    assert store.vectorizer().vocabulary_hash() == v.vocabulary_hash()

    # Plain Parquet/JSON readers see the layout the docs promise.
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["vocabulary"]["hash"] == v.vocabulary_hash() and manifest["versions"]["pyarrow"] == pa.__version__
    nodes = pq.read_table(tmp_path / "run" / "epochs" / "000001" / "nodes.parquet")
    assert nodes.column_names == ["id", "parent", "depth", "epoch", "count", "subtree_count", "window_count",
                                  "mass", "concentration", "born", "top_words"]
    assert nodes.column("id").to_pylist() == [0, 1, 3, 4]
    theta = pq.read_table(tmp_path / "run" / "epochs" / "000001" / "theta.parquet")
    dense_rows = [i is None for i in theta.column("indices").to_pylist()]
    nnz = (t1.theta != 0).sum(axis=1)
    assert dense_rows == (nnz > 4).tolist()
    assign = pq.read_table(tmp_path / "run" / "epochs" / "000000" / "assignments.parquet")
    assert assign.column("node_id").to_pylist() == t0.assignments.tolist()
    assert not list((tmp_path / "run" / "epochs").glob(".tmp-*"))
    # Commit records are plain JSON, one per epoch; no lease is left behind.
    record = json.loads((tmp_path / "run" / "commits" / "000001.json").read_text())
    assert record["epoch"] == 1 and record["path"] == "epochs/000001" and record["label"] == "1800s"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["commits", "epochs", "manifest.json",
                                                                  "vocabulary.parquet"]


def test_theta_top_n_is_lossy_and_says_so(tmp_path):
    store = SnapshotStore(str(tmp_path), theta_top_n=2)
    t = make_tree(0, [0, 1], [-1, 0], [0, 0], p=6, seed=3)
    store.publish(t, ["a"] * 5)
    got = store.read(0)
    assert not got.theta_exact and store.epochs()[0]["theta"]["exact"] is False
    for row, full in zip(got.tree.theta, t.theta):
        top = np.argsort(-np.abs(full), kind="stable")[:2]
        expected = np.zeros_like(full)
        expected[top] = full[top].astype(np.float32)  # truncated rows are stored as float32
        np.testing.assert_array_equal(row, expected)
    # the reported error is the largest relative norm of a node's dropped entries
    want = max(np.linalg.norm(full - row) / np.linalg.norm(full) for row, full in zip(got.tree.theta, t.theta))
    assert want > 0 and got.theta_error == pytest.approx(want)
    assert store.epochs()[0]["theta"]["error"] == pytest.approx(want)


def test_crash_before_manifest_commit_keeps_previous_epoch(tmp_path, monkeypatch):
    store = SnapshotStore(str(tmp_path))
    t0 = make_tree(0, [0, 1], [-1, 0], [0, 0])
    store.publish(t0, list("abcde"))
    before = (tmp_path / "manifest.json").read_text()

    def crash(entry):
        raise OSError("simulated crash before the commit record")

    monkeypatch.setattr(store, "_commit_record", crash)
    t1 = make_tree(1, [0, 1, 2], [-1, 0, 0], [0, 0, 1], seed=5)
    with pytest.raises(StoreAccessError, match="cannot commit epoch 1: simulated"):
        store.publish(t1, list("vwxyz"))
    # The folder was renamed into place but is not committed: invisible to readers.
    assert (tmp_path / "epochs" / "000001" / "nodes.parquet").exists()
    fresh = SnapshotStore(str(tmp_path))
    assert (tmp_path / "manifest.json").read_text() == before
    assert not (tmp_path / "commits" / "000001.json").exists()
    assert [e["epoch"] for e in fresh.epochs()] == [0]
    assert_same_tree(fresh.read(0).tree, t0)
    with pytest.raises(StoreError, match="not published"):
        fresh.read(1)
    assert list(fresh.lineage()) == [0, 1]

    monkeypatch.undo()
    t1b = make_tree(1, [0, 1, 3], [-1, 0, 1], [0, 0, 1], seed=6)
    store.publish(t1b, list("VWXYZ"))
    assert [e["epoch"] for e in fresh.epochs()] == [0, 1]
    got = fresh.read(1)
    assert_same_tree(got.tree, t1b)
    assert got.doc_ids.tolist() == list("VWXYZ")


def test_crash_while_writing_epoch_files_leaves_no_visible_trace(tmp_path, monkeypatch):
    store = SnapshotStore(str(tmp_path))
    t0 = make_tree(0, [0], [-1], [0])
    store.publish(t0, list("abcde"))
    real = store._write_parquet

    def fail_on_theta(table, path):
        if path.endswith("theta.parquet"):
            raise OSError("disk full")
        real(table, path)

    monkeypatch.setattr(store, "_write_parquet", fail_on_theta)
    with pytest.raises(StoreAccessError, match="cannot write epoch 1: disk full"):
        store.publish(make_tree(1, [0], [-1], [0]), list("abcde"))
    assert not (tmp_path / "epochs" / "000001").exists()
    assert [p.name for p in (tmp_path / "epochs").iterdir()] == ["000000"]  # no temporary folder left
    assert [e["epoch"] for e in SnapshotStore(str(tmp_path)).epochs()] == [0]


def test_republish_needs_replace(tmp_path):
    store = SnapshotStore(str(tmp_path))
    store.publish(make_tree(0, [0, 1], [-1, 0], [0, 0]), list("abcde"))
    t = make_tree(0, [0, 2], [-1, 0], [0, 0], seed=9)
    with pytest.raises(StoreError, match="already published"):
        store.publish(t, list("abcde"))
    store.publish(t, list("ABCDE"), replace=True)
    assert_same_tree(store.read(0).tree, t)
    # the replacement went to a new folder (the record switch is the commit) and the old one is gone
    assert len(store.epochs()) == 1 and [p.name for p in (tmp_path / "epochs").iterdir()] == [
        store.epochs()[0]["path"].split("/")[1]]


def test_publish_validation(tmp_path):
    store = SnapshotStore(str(tmp_path))
    store.write_vocabulary(vocab6())
    t = make_tree(0, [0], [-1], [0], p=6)
    with pytest.raises(ValueError, match="doc_ids"):
        store.publish(t, ["a"])
    with pytest.raises(TypeError, match="JSON"):
        store.publish(t, list("abcde"), state={"state": object()})
    with pytest.raises(TypeError, match="only numeric arrays"):
        store.publish(t, list("abcde"), checkpoint=({"a": np.array(["x"], dtype=object)}, {}))
    with pytest.raises(ValueError, match="vocabulary"):
        store.publish(make_tree(0, [0], [-1], [0], p=4), list("abcde"))
    assert store.epochs() == []
    store.publish(t, list("abcde"), state={"counts": np.arange(3), "beta": np.float64(0.5)})
    assert store.last_commit()["state"] == {"counts": [0, 1, 2], "beta": 0.5}
    other = TextVectorizer(min_df=1, stop_words=None, max_df=1.0).fit(["other words entirely"])
    with pytest.raises(StoreError, match="different vocabulary"):
        store.write_vocabulary(other)


def test_lineage(tmp_path):
    store = SnapshotStore(str(tmp_path))
    # epoch 0: 0 -> {1, 2}; epoch 1: 2 dies, 3 born under 1; epoch 2: 3 moves under 0, 4 born.
    store.publish(make_tree(0, [0, 1, 2], [-1, 0, 0], [0, 0, 0]), list("abcde"))
    store.publish(make_tree(1, [0, 1, 3], [-1, 0, 1], [0, 0, 1], died=[2]), list("abcde"))
    store.publish(make_tree(2, [0, 1, 3, 4], [-1, 0, 0, 1], [0, 0, 1, 2]), list("abcde"))
    lin = store.lineage()
    assert sorted(lin) == [0, 1, 2, 3, 4]
    assert (lin[2].born, lin[2].died, lin[2].epochs) == (0, 1, [0])
    assert (lin[3].born, lin[3].died, lin[3].parents) == (1, None, {1: 1, 2: 0})
    assert lin[3].parent_changes == [(2, 1, 0)]
    assert (lin[4].born, lin[4].epochs, lin[4].parent_changes) == (2, [2], [])
    assert lin[0].parents == {0: -1, 1: -1, 2: -1} and lin[0].died is None


def test_static_snapshots(tmp_path):
    store = SnapshotStore(str(tmp_path))
    store.publish(make_tree(0, [0], [-1], [0]), list("abcde"))
    X = np.random.default_rng(0).normal(size=(7, 3))
    Z = linkage(X, "average")
    dend = Dendrogram(linkage=Z, heights=np.arange(6.0), stats={"log_rk": np.linspace(-1, 0, 6)})
    store.write_static(0, "bhc", dend, stats={"log_evidence": -12.5}, leaf_ids=[f"d{i}" for i in range(7)])
    store.write_static(0, "kingman", Z)
    assert store.epochs()[0]["static"] == ["bhc", "kingman"]
    got = store.read_static(0, "bhc")
    np.testing.assert_array_equal(got.linkage, Z)
    np.testing.assert_array_equal(got.heights, np.arange(6.0))
    np.testing.assert_array_equal(got.stats["log_rk"], np.linspace(-1, 0, 6))
    assert got.stats["log_evidence"] == -12.5 and got.leaf_ids == [f"d{i}" for i in range(7)]
    np.testing.assert_array_equal(store.read_static(0, "kingman").heights, Z[:, 2])
    plain = pq.read_table(tmp_path / "epochs" / "000000" / "static" / "bhc.parquet")
    assert plain.column_names[:5] == ["left", "right", "distance", "size", "height"]
    with pytest.raises(StoreError, match="no static snapshot"):
        store.read_static(0, "tmc")
    with pytest.raises(StoreError, match="not published"):
        store.write_static(3, "bhc", Z)
    with pytest.raises(ValueError, match="method"):
        store.write_static(0, "../evil", Z)
    with pytest.raises(ValueError, match="shape"):
        store.write_static(0, "bad", Z[:, :3])


def test_a_static_write_cut_short_leaves_a_temporary_file_the_next_write_there_removes(tmp_path, monkeypatch):
    import connectors.stores.snapshot as snapshot_mod

    store = SnapshotStore(str(tmp_path))
    store.publish(make_tree(0, [0], [-1], [0]), list("abcde"))
    Z = linkage(np.random.default_rng(0).normal(size=(5, 2)), "average")
    store.write_static(0, "kingman", Z)
    folder = tmp_path / "epochs" / "000000" / "static"
    (folder / ".tmp-notes").write_text("a user's file")  # looks temporary, lacks the id: not ours

    def crash(name):
        if name == "rename static bhc":
            raise KeyboardInterrupt  # the process stops between writing the file and its rename

    monkeypatch.setattr(snapshot_mod, "write_point", crash)
    with pytest.raises(KeyboardInterrupt):
        store.write_static(0, "bhc", Z)
    monkeypatch.undo()
    left = [p.name for p in folder.iterdir() if p.name.startswith(".tmp-bhc-")]
    assert len(left) == 1
    store = SnapshotStore(str(tmp_path))
    assert store.epochs()[0]["static"] == ["kingman"]  # never committed
    store.write_static(0, "bhc", Z)
    assert sorted(p.name for p in folder.iterdir()) == [".tmp-notes", "bhc.parquet", "kingman.parquet"]
    np.testing.assert_array_equal(store.read_static(0, "bhc").linkage, Z)


def test_file_uri_and_bad_uri(tmp_path):
    store = SnapshotStore((tmp_path / "viauri").as_uri())
    t = make_tree(0, [0, 1], [-1, 0], [0, 0])
    store.publish(t, list("abcde"), label="2026-03")
    assert_same_tree(SnapshotStore(str(tmp_path / "viauri")).read(0).tree, EpochTree(**{**t.__dict__, "label": "2026-03"}))
    with pytest.raises(StoreError, match="nosuchscheme"):
        SnapshotStore("nosuchscheme://bucket/run")


def test_theta_is_written_without_a_dictionary_and_byte_stream_split(tmp_path):
    import pyarrow.parquet as pq

    store = SnapshotStore(str(tmp_path))
    t = make_tree(0, [0, 1], [-1, 0], [0, 0], p=6, seed=3)
    store.publish(t, ["a"] * 5)
    meta = pq.ParquetFile(tmp_path / "epochs" / "000000" / "theta.parquet").metadata.row_group(0)
    values = [meta.column(i) for i in range(meta.num_columns) if meta.column(i).path_in_schema.startswith("values")]
    assert values and "BYTE_STREAM_SPLIT" in values[0].encodings and "RLE_DICTIONARY" not in values[0].encodings
    np.testing.assert_array_equal(store.read(0).tree.theta, t.theta)  # lossless


def test_only_the_latest_checkpoint_is_kept_unless_asked(tmp_path):
    from connectors.stores import CheckpointNotKeptError

    ckpt = lambda e: ({"w": np.full(3, float(e))}, {"epoch": e})  # noqa: E731
    trees = [make_tree(e, [0, 1], [-1, 0], [0, 0], seed=e) for e in range(3)]
    latest, every = SnapshotStore(str(tmp_path / "latest")), SnapshotStore(str(tmp_path / "all"), keep_checkpoints="all")
    for store in (latest, every):
        for t in trees:
            store.publish(t, list("abcde"), checkpoint=ckpt(t.epoch))
    assert sorted(p.parent.name for p in (tmp_path / "latest").rglob("checkpoint.parquet")) == ["000002"]
    assert len(list((tmp_path / "latest").rglob("checkpoint.json"))) == 3
    assert latest.read_checkpoint()[1] == {"epoch": 2} and latest.checkpoint_epoch() == 2
    with pytest.raises(CheckpointNotKeptError, match="latest epoch \\(2\\)"):
        latest.read_checkpoint(0)
    assert latest.epochs()[0]["checkpoint"] is True  # committed with it; superseded since
    assert every.read_checkpoint(0)[1] == {"epoch": 0} and len(list((tmp_path / "all").rglob("checkpoint.parquet"))) == 3
    # a writer stopped between a commit and the deletion leaves two; the next writer removes the older
    (tmp_path / "latest" / "epochs" / "000002" / "checkpoint.parquet").rename(tmp_path / "keep.parquet")
    import shutil
    shutil.copy(tmp_path / "keep.parquet", tmp_path / "latest" / "epochs" / "000001" / "checkpoint.parquet")
    (tmp_path / "keep.parquet").rename(tmp_path / "latest" / "epochs" / "000002" / "checkpoint.parquet")
    with latest.writer("test"):
        pass
    assert sorted(p.parent.name for p in (tmp_path / "latest").rglob("checkpoint.parquet")) == ["000002"]


def test_compact_theta_keeps_the_cosine_and_reports_the_error(tmp_path):
    rng = np.random.default_rng(4)
    t = make_tree(0, [0, 1, 2], [-1, 0, 0], [0, 0, 0], p=400, seed=2)
    theta = rng.standard_normal((3, 400)) * np.exp(-np.arange(400) / 40.0)  # a heavy head, a long tail
    t = dataclasses.replace(t, theta=theta / np.linalg.norm(theta, axis=1, keepdims=True))
    store = SnapshotStore(str(tmp_path), theta_cosine=0.99)
    store.publish(t, list("abcde"))
    got = store.read(0)
    cos = (got.tree.theta * t.theta).sum(1) / np.linalg.norm(got.tree.theta, axis=1)
    assert np.all(cos >= 0.99 - 1e-6) and not got.theta_exact
    nnz = (got.tree.theta != 0).sum(1)
    assert np.all(nnz < 200)  # far fewer than the 400 entries
    # the fewest entries: one fewer would fall below the cosine
    for row, full, m in zip(got.tree.theta, t.theta, nnz):
        top = np.sort(np.abs(full))[::-1]
        assert np.sqrt((top[:m - 1] ** 2).sum()) < 0.99 <= np.sqrt((top[:m] ** 2).sum()) + 1e-6
    want = max(np.linalg.norm(full - row) for row, full in zip(got.tree.theta, t.theta))
    assert got.theta_error == pytest.approx(want, rel=1e-6) and 0 < want <= np.sqrt(1 - 0.99 ** 2) + 1e-6
    record = store.epochs()[0]["theta"]
    assert record["cosine"] == 0.99 and record["dtype"] == "float32" and record["error"] == pytest.approx(want)
    assert pq.read_table(tmp_path / "epochs" / "000000" / "theta.parquet").schema.field("values").type == \
        pa.list_(pa.float32())


def test_a_format_2_store_keeps_every_checkpoint_when_resumed(tmp_path):
    """Stores written before format 3 kept every epoch's checkpoint: still read, and writing
    more epochs to one (a resume) keeps the older ones."""
    store = SnapshotStore(str(tmp_path))
    ckpt = lambda e: ({"w": np.full(2, float(e))}, {"epoch": e})  # noqa: E731
    store.publish(make_tree(0, [0, 1], [-1, 0], [0, 0]), list("abcde"), checkpoint=ckpt(0))
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["format_version"] = 2
    del manifest["checkpoints"]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    store.publish(make_tree(1, [0, 1], [-1, 0], [0, 0], seed=1), list("abcde"), checkpoint=ckpt(1))
    assert store.read_checkpoint(0)[1] == {"epoch": 0} and store.read_checkpoint()[1] == {"epoch": 1}
    assert len(list(tmp_path.rglob("checkpoint.parquet"))) == 2


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names open files through /proc")
def test_the_new_checkpoint_is_on_disk_before_the_previous_one_is_deleted(tmp_path, monkeypatch):
    """A power cut (not just a killed process) must not leave a commit record pointing at
    unwritten data with the only older checkpoint already deleted: on a local disk the new
    checkpoint, its commit record and their folders are fsynced before the deletion."""
    import os

    store = SnapshotStore(str(tmp_path))
    ckpt = lambda e: ({"w": np.full(3, float(e))}, {"epoch": e})  # noqa: E731
    store.publish(make_tree(0, [0, 1], [-1, 0], [0, 0]), list("abcde"), checkpoint=ckpt(0))
    events = []
    real_fsync, real_delete = os.fsync, SnapshotStore._delete
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                  real_fsync(fd))[1])
    monkeypatch.setattr(SnapshotStore, "_delete",
                        lambda self, info: (events.append(("delete", info.path)), real_delete(self, info))[1])
    store.publish(make_tree(1, [0, 1], [-1, 0], [0, 0], seed=1), list("abcde"), checkpoint=ckpt(1))
    deleted = [i for i, (kind, path) in enumerate(events) if kind == "delete" and path.endswith(
        "000000/checkpoint.parquet")]
    assert deleted, events
    synced = {path for kind, path in events[:deleted[0]] if kind == "fsync"}
    for want in ("epochs/000001/checkpoint.parquet", "epochs/000001/checkpoint.json", "commits/000001.json",
                 "epochs/000001", "commits"):
        assert str(tmp_path / want) in synced, (want, events)


def test_a_writer_keeps_older_checkpoints_when_the_latest_one_is_missing(tmp_path):
    """Superseded checkpoints are removed only while the latest one is there to resume from."""
    store = SnapshotStore(str(tmp_path))
    ckpt = lambda e: ({"w": np.full(3, float(e))}, {"epoch": e})  # noqa: E731
    for e in range(2):
        store.publish(make_tree(e, [0, 1], [-1, 0], [0, 0], seed=e), list("abcde"), checkpoint=ckpt(e))
    (tmp_path / "epochs" / "000001" / "checkpoint.parquet").rename(tmp_path / "epochs" / "000000" / "checkpoint.parquet")
    with store.writer("test"):
        pass
    assert (tmp_path / "epochs" / "000000" / "checkpoint.parquet").exists()


def test_a_reader_racing_a_commit_gets_the_new_latest_checkpoint(tmp_path, monkeypatch):
    """A writer (e.g. serve) deletes the previous checkpoint right after its commit: a reader
    that looked up the latest epoch just before gets the new latest one, and one that asked for
    that (now older) epoch is told its checkpoint is no longer kept, not that the store is damaged."""
    from connectors.stores import CheckpointNotKeptError

    ckpt = lambda e: ({"w": np.full(3, float(e))}, {"epoch": e})  # noqa: E731
    writer = SnapshotStore(str(tmp_path))
    for e in range(2):
        writer.publish(make_tree(e, [0, 1], [-1, 0], [0, 0], seed=e), list("abcde"), checkpoint=ckpt(e))
    reader = SnapshotStore(str(tmp_path))
    real = reader._read_parquet
    commits = []

    def racing(path, columns=None):
        if path.endswith("checkpoint.parquet") and commits:
            e = commits.pop()
            writer.publish(make_tree(e, [0, 1], [-1, 0], [0, 0], seed=e), list("abcde"), checkpoint=ckpt(e))
        return real(path, columns)

    monkeypatch.setattr(reader, "_read_parquet", racing)
    commits.append(2)
    assert reader.read_checkpoint()[1] == {"epoch": 2}
    commits.append(3)
    with pytest.raises(CheckpointNotKeptError, match="latest epoch \\(3\\)"):
        reader.read_checkpoint(2)


def test_a_new_run_in_the_same_writer_keeps_only_its_latest_checkpoint(tmp_path):
    store = SnapshotStore(str(tmp_path))
    ckpt = lambda e: ({"w": np.full(3, float(e))}, {"epoch": e})  # noqa: E731
    with store.writer("test"):
        for e in range(3):
            store.publish(make_tree(e, [0, 1], [-1, 0], [0, 0], seed=e), list("abcde"), checkpoint=ckpt(e))
        store.begin({"run": 2})
        for e in range(2):
            store.publish(make_tree(e, [0, 1], [-1, 0], [0, 0], seed=e), list("abcde"), checkpoint=ckpt(e))
    assert sorted(p.parent.name for p in tmp_path.rglob("checkpoint.parquet")) == ["000001"]


def test_a_writer_deletes_no_checkpoint_of_a_store_without_its_manifest(tmp_path):
    """A store whose manifest is not in place has no recorded policy: a writer's own default must
    not decide what is deleted. Nothing proves the files are a store's any more, so the writer is
    refused outright (a replacement stopped while moving the old run aside is proven by the
    manifest in the aside, and restored)."""
    store = SnapshotStore(str(tmp_path), keep_checkpoints="all")
    ckpt = lambda e: ({"w": np.full(3, float(e))}, {"epoch": e})  # noqa: E731
    for e in range(2):
        store.publish(make_tree(e, [0, 1], [-1, 0], [0, 0], seed=e), list("abcde"), checkpoint=ckpt(e))
    (tmp_path / "manifest.json").rename(tmp_path / "manifest.json.bak")
    with pytest.raises(StoreError, match="holds commits, epochs but no streamtree manifest"):
        with SnapshotStore(str(tmp_path)).writer("test"):
            pass
    assert len(list(tmp_path.rglob("checkpoint.parquet"))) == 2
