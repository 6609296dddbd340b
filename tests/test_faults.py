"""Fault injection: kill -9 at every store write point and at random times of a replay and of
its resume; after ``--resume`` the store must equal an undisturbed run's, with no leftovers."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from test_replay import sou_slice
from test_store import assert_same_tree

from connectors.stores import SnapshotStore

ARGS = ["--text-col", "text", "--time-col", "year", "--id-col", "doc_id", "--epoch", "10y", "--sweeps", "2",
        "--kappa0", "100", "--max-features", "200", "--seed", "5", "--quiet"]
VOLATILE = {"published", "created", "updated", "finished", "run", "seconds", "fit_seconds", "versions"}


def cli(corpus, store, *extra, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamtree.cli", "replay", str(corpus), *ARGS, "--store",
                           str(store), *extra], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def strip(value):
    """JSON data without the fields that legitimately differ between two runs (times, run ids)."""
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value


def snapshot(store: Path) -> dict:
    """Everything in a store: every file by relative path, Parquet as tables, JSON as data."""
    out = {}
    for f in sorted(store.rglob("*")):
        rel = str(f.relative_to(store))
        if f.is_dir():
            out[rel] = "dir"
        elif f.suffix == ".parquet":
            out[rel] = pq.read_table(f)
        elif f.suffix == ".json":
            out[rel] = strip(json.loads(f.read_text()))
        else:
            out[rel] = f.read_bytes()
    return out


def assert_same_store(got: Path, want: dict) -> None:
    have = snapshot(got)
    assert sorted(have) == sorted(want), "files differ (leftovers or missing files)"
    for rel, value in want.items():
        if hasattr(value, "equals"):
            assert value.equals(have[rel]), rel
        else:
            assert have[rel] == value, rel


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return sou_slice(tmp_path_factory.mktemp("faults") / "slice.parquet", n=90)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """An undisturbed run, and the names of its write points in order."""
    root = tmp_path_factory.mktemp("reference")
    trace = root / "trace.txt"
    r = cli(corpus, root / "store", env={"STREAMTREE_WRITE_TRACE": str(trace)})
    assert r.returncode == 0, r.stderr
    points = [line.split(" ", 1)[1] for line in trace.read_text().splitlines()]
    return snapshot(root / "store"), points


def kill_at_write(corpus, store, k: int, reference) -> None:
    want, points = reference
    r = cli(corpus, store, env={"STREAMTREE_KILL_AT_WRITE": str(k)})
    assert r.returncode == -signal.SIGKILL, (k, points[k - 1], r.returncode, r.stderr)
    r = cli(corpus, store, "--resume")
    assert r.returncode == 0, (k, points[k - 1], r.stderr)
    assert_same_store(store, want)


def test_write_points_cover_every_step(reference):
    _, points = reference
    assert points[0].startswith("write ") and "rename manifest.json" in points
    assert sum(p == "rename 000000.json" for p in points) == 1  # one commit record per epoch
    assert sum(p.startswith("rename 0") for p in points) == 3
    # only the latest epoch keeps its checkpoint arrays: each later commit deletes the previous one
    assert sum(p == "delete checkpoint.parquet" for p in points) == 2
    want, _ = reference
    assert [r for r in want if r.endswith("checkpoint.parquet")] == ["epochs/000002/checkpoint.parquet"]
    assert sum(r.endswith("checkpoint.json") for r in want) == 3


@pytest.mark.parametrize("which", ["epoch files", "commit record", "superseded checkpoint"])
def test_kill_at_chosen_write_points(corpus, reference, tmp_path, which):
    _, points = reference
    k = {"first": 1, "epoch files": points.index("write theta.parquet") + 1,
         "commit record": points.index("rename 000001.json") + 1,
         # after epoch 1's commit, before the previous epoch's checkpoint arrays are deleted
         "superseded checkpoint": points.index("delete checkpoint.parquet") + 1, "last": len(points)}[which]
    kill_at_write(corpus, tmp_path / "store", k, reference)


@pytest.mark.slow
def test_kill_at_every_write_point(corpus, reference, tmp_path):
    _, points = reference
    for k in range(1, len(points) + 1):
        kill_at_write(corpus, tmp_path / f"store{k}", k, reference)


@pytest.mark.slow
def test_kill_at_random_times_of_replay_and_resume(corpus, reference, tmp_path):
    want, _ = reference
    rng = random.Random(11)
    for trial in range(4):
        store = tmp_path / f"store{trial}"
        first = True
        for _ in range(3):  # a replay killed at a random time, then resumes killed at random times
            argv = [sys.executable, "-m", "streamtree.cli", "replay", str(corpus), *ARGS, "--store", str(store)]
            proc = subprocess.Popen(argv + ([] if first else ["--resume"]), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0.5, 4.0))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            first = first and proc.returncode != 0 and not (store / "manifest.json").exists()
        r = cli(corpus, store, *([] if first else ["--resume"]))
        assert r.returncode == 0, r.stderr
        assert_same_store(store, want)


@pytest.fixture(scope="module")
def static_reference(corpus, tmp_path_factory):
    """An undisturbed run with --static bhc, and its write points."""
    root = tmp_path_factory.mktemp("static")
    trace = root / "trace.txt"
    r = cli(corpus, root / "store", "--static", "bhc", env={"STREAMTREE_WRITE_TRACE": str(trace)})
    assert r.returncode == 0, r.stderr
    return snapshot(root / "store"), [line.split(" ", 1)[1] for line in trace.read_text().splitlines()]


@pytest.mark.parametrize("where, resume_static", [("epoch 1 file", False), ("epoch 1 record", True),
                                                  ("last epoch file", False)])
def test_a_resume_writes_the_static_snapshot_the_killed_run_did_not(corpus, static_reference, tmp_path, where,
                                                                    resume_static):
    """A replay writes an epoch's static snapshot after committing the epoch; killed in between,
    its resume (which starts after that epoch, with or without --static: the run's choice is
    committed with each epoch) writes it. Before, that epoch never got its snapshot."""
    want, points = static_reference
    files = [i for i, p in enumerate(points) if p.startswith("write .tmp-bhc-documents-")]
    assert len(files) == 3
    k = {"epoch 1 file": files[1] + 1, "epoch 1 record": files[1] + 3, "last epoch file": files[2] + 1}[where]
    assert points[k - 2:k] == ["rename static bhc-documents", "write 000001.json"] if where == "epoch 1 record" \
        else points[k - 1].startswith("write .tmp-bhc-documents-")
    store = tmp_path / "store"
    r = cli(corpus, store, "--static", "bhc", env={"STREAMTREE_KILL_AT_WRITE": str(k)})
    assert r.returncode == -signal.SIGKILL, (k, points[k - 1], r.stderr)
    r = cli(corpus, store, "--resume", *(["--static", "bhc"] if resume_static else []))
    assert r.returncode == 0, r.stderr
    assert_same_store(store, want)


@pytest.fixture(scope="module")
def overwrite_points(corpus, tmp_path_factory):
    """A complete store, and the write points of an --overwrite of it, in order."""
    root = tmp_path_factory.mktemp("overwrite")
    trace = root / "trace.txt"
    assert cli(corpus, root / "traced").returncode == 0
    shutil.copytree(root / "traced", root / "complete")
    assert cli(corpus, root / "traced", "--overwrite", env={"STREAMTREE_WRITE_TRACE": str(trace)}).returncode == 0
    return root / "complete", [line.split(" ", 1)[1] for line in trace.read_text().splitlines()]


@pytest.mark.parametrize("point", ["set aside vocabulary.parquet",
                                   pytest.param("set aside epochs", marks=pytest.mark.slow),
                                   pytest.param("rename manifest.json", marks=pytest.mark.slow)])
def test_an_overwrite_killed_while_setting_the_old_run_aside_leaves_the_old_run(corpus, reference, overwrite_points,
                                                                               tmp_path, point):
    """--overwrite moves the old run aside (manifest first) before writing the new run's
    manifest. Killed in between, the next writer restores the old run, whole: before, it took
    the old commit records still in place for the new run's and deleted the saved manifest."""
    want, _ = reference
    complete, points = overwrite_points
    assert points[:4] == ["set aside manifest.json", "set aside vocabulary.parquet", "set aside commits",
                          "set aside epochs"]
    store = tmp_path / "store"
    shutil.copytree(complete, store)
    r = cli(corpus, store, "--overwrite", env={"STREAMTREE_KILL_AT_WRITE": str(points.index(point) + 1)})
    assert r.returncode == -signal.SIGKILL
    assert not (store / "manifest.json").exists()
    assert [e["epoch"] for e in SnapshotStore(str(store)).epochs()] == [0, 1, 2]  # readers: the old run, from the aside
    r = cli(corpus, store)  # a plain replay: the store holds a run, restored
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "restored the previous run" in r.stderr and "already holds 3 published epochs" in r.stderr
    assert_same_store(store, want)
    r = cli(corpus, store, "--resume")
    assert r.returncode == 0, r.stderr
    assert_same_store(store, want)


@pytest.mark.parametrize("point, new_run", [("write theta.parquet", False), ("rename 000000.json", False),
                                            ("rename manifest.json", False), ("delete .replaced-", True)])
def test_readers_of_an_overwrite_killed_anywhere_see_the_old_run_or_the_new_one(corpus, reference, overwrite_points,
                                                                               tmp_path, point, new_run):
    """An --overwrite killed at any point leaves readers the old run, whole, until the new run's
    first commit is in place (its manifest is written with that commit), and the new run after
    it; the next writer restores the old run or goes on with the new one. Before, readers saw an
    empty store from the moment the old run was moved aside."""
    want, _ = reference
    complete, points = overwrite_points
    k = next(i for i, p in enumerate(points) if p.startswith(point)) + 1
    store = tmp_path / "store"
    shutil.copytree(complete, store)
    r = cli(corpus, store, "--overwrite", env={"STREAMTREE_KILL_AT_WRITE": str(k)})
    assert r.returncode == -signal.SIGKILL, (k, points[k - 1], r.stderr)
    reader, old = SnapshotStore(str(store)), SnapshotStore(str(complete))
    if new_run:
        assert reader.manifest()["run"] != old.manifest()["run"]
        assert [e["epoch"] for e in reader.epochs()] == [0]
    else:
        assert reader.manifest()["run"] == old.manifest()["run"] and reader.complete() is not None
        assert [e["epoch"] for e in reader.epochs()] == [0, 1, 2]
        for e in range(3):
            assert_same_tree(reader.read(e).tree, old.read(e).tree)
        assert reader.read_checkpoint()[1] == old.read_checkpoint()[1]
    r = cli(corpus, store, "--resume")
    assert r.returncode == 0, r.stderr
    assert_same_store(store, want)


def test_a_complete_store_whose_last_record_was_cut_short_is_finished_by_a_resume(corpus, tmp_path):
    """A latest record cut short by a crash on a store already marked complete: that epoch is
    not committed, so the run is not complete (readers say so) and a resume publishes it again,
    ending equal to the undisturbed run. Before, the writer removed the record and its folder
    and the resume answered "already complete", with the last epoch missing."""
    store = tmp_path / "store"
    r = cli(corpus, store, "--keep-checkpoints", "all")  # the epoch before keeps its checkpoint
    assert r.returncode == 0, r.stderr
    want = snapshot(store)
    record = store / "commits" / "000002.json"
    record.write_bytes(record.read_bytes()[:60])
    reader = SnapshotStore(str(store))
    assert [e["epoch"] for e in reader.epochs()] == [0, 1]
    assert reader.complete() is None and reader.manifest()["complete"] is None
    r = cli(corpus, store, "--resume")
    assert r.returncode == 0, r.stderr
    assert "already complete" not in r.stdout
    assert_same_store(store, want)


def test_a_cut_short_record_holding_the_only_checkpoint_is_a_clear_error_for_a_resume(corpus, reference, tmp_path):
    """When the cut record's folder holds the only checkpoint (the one before it was removed
    after that commit), the run cannot be resumed: --resume says so and what to do, and
    --overwrite replays it. Before, the resume said "already complete" after a warning."""
    want, _ = reference
    store = tmp_path / "store"
    assert cli(corpus, store).returncode == 0
    record = store / "commits" / "000002.json"
    record.write_bytes(record.read_bytes()[:60])
    r = cli(corpus, store, "--resume")
    assert r.returncode == 3 and "already complete" not in r.stdout, (r.returncode, r.stdout, r.stderr)
    assert "commit record of epoch 2 was cut short" in r.stderr and "cannot be resumed" in r.stderr
    assert "--overwrite" in r.stderr and "Traceback" not in r.stderr
    assert record.exists() and (store / "epochs" / "000002" / "checkpoint.parquet").exists()
    r = cli(corpus, store, "--overwrite")
    assert r.returncode == 0, r.stderr
    assert_same_store(store, want)


@pytest.mark.parametrize("again_static", [False, True], ids=["again without --static", "again with it"])
def test_a_resume_with_other_static_options_writes_their_snapshot_after_a_kill(corpus, static_reference, tmp_path,
                                                                               again_static):
    """The options in force when an epoch was committed decide the snapshot a resume writes for
    it: a run with --static bhc killed before epoch 1, resumed with --static coalescent and killed
    between epoch 1's commit and its snapshot, then resumed again, ends as the undisturbed
    coalescent resume did (epoch 1 with coalescent-documents). Before, the second resume wrote
    the options the run was begun with (bhc) for epoch 1."""
    _, points = static_reference
    killed = tmp_path / "killed"
    k = [i for i, p in enumerate(points) if p == "write nodes.parquet"][1] + 1  # epoch 1's first file
    assert cli(corpus, killed, "--static", "bhc", env={"STREAMTREE_KILL_AT_WRITE": str(k)}).returncode == -signal.SIGKILL
    undisturbed, trace = tmp_path / "undisturbed", tmp_path / "trace.txt"
    shutil.copytree(killed, undisturbed)
    r = cli(corpus, undisturbed, "--resume", "--static", "coalescent", env={"STREAMTREE_WRITE_TRACE": str(trace)})
    assert r.returncode == 0, r.stderr
    want = snapshot(undisturbed)
    assert "epochs/000000/static/bhc-documents.parquet" in want and "epochs/000001/static/coalescent-documents.parquet" \
        in want and not [f for f in want if f.startswith("epochs/000001/static/bhc")]
    resumed = [line.split(" ", 1)[1] for line in trace.read_text().splitlines()]
    k = next(i for i, p in enumerate(resumed) if p.startswith("write .tmp-coalescent-documents-")) + 1
    assert resumed[k - 3:k - 1] == ["rename 000001.json", "delete checkpoint.parquet"]  # epoch 1 committed
    store = tmp_path / "store"
    shutil.copytree(killed, store)
    r = cli(corpus, store, "--resume", "--static", "coalescent", env={"STREAMTREE_KILL_AT_WRITE": str(k)})
    assert r.returncode == -signal.SIGKILL, r.stderr
    r = cli(corpus, store, "--resume", *(["--static", "coalescent"] if again_static else []))
    assert r.returncode == 0, r.stderr
    assert_same_store(store, want)
