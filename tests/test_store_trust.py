"""Store guarantees: writer lease, own-files-only deletion, checkpoints, damaged stores, path checks."""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from connectors.stores import (
    CorruptStoreError,
    Lease,
    SnapshotStore,
    StoreAccessError,
    StoreBusyError,
    StoreError,
)
from connectors.stores.lease import LEASE
from test_store import assert_same_tree, make_tree, vocab6


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_second_writer_is_refused_naming_the_holder(tmp_path):
    store = SnapshotStore(str(tmp_path))
    with store.writer("replay"):
        other = SnapshotStore(str(tmp_path))
        with pytest.raises(StoreBusyError) as info:
            with other.writer("replay"):
                pass
        msg = str(info.value)
        assert "\n" not in msg and f"pid {os.getpid()}" in msg and socket.gethostname() in msg
        assert "being written by" in msg and "replay since" in msg
        with pytest.raises(StoreBusyError):  # an implicit one-call writer is refused as well
            other.publish(make_tree(0, [0], [-1], [0]), list("abcde"))
        store.publish(make_tree(0, [0], [-1], [0]), list("abcde"))
    assert not (tmp_path / LEASE).exists()
    assert [e["epoch"] for e in SnapshotStore(str(tmp_path)).epochs()] == [0]


def test_stale_leases_are_taken_over(tmp_path):
    # a holder on this host whose process is gone (kill -9): taken over at once
    lease = {"owner": "x", "host": socket.gethostname(), "pid": dead_pid(), "command": "replay", "token": "t1",
             "acquired": "then", "heartbeat_unix": time.time(), "timeout": 3600}
    (tmp_path / LEASE).write_text(json.dumps(lease))
    with SnapshotStore(str(tmp_path)).writer("replay") as w:
        assert json.loads((tmp_path / LEASE).read_text())["token"] == w.token
    # a holder elsewhere with a heartbeat older than its timeout
    lease.update(host="elsewhere", pid=1, timeout=1, heartbeat_unix=time.time() - 10)
    (tmp_path / LEASE).write_text(json.dumps(lease))
    old = time.time() - 10
    os.utime(tmp_path / LEASE, (old, old))
    with SnapshotStore(str(tmp_path)).writer("replay"):
        pass
    # ... but a fresh one elsewhere is respected
    lease.update(heartbeat_unix=time.time(), timeout=60)
    (tmp_path / LEASE).write_text(json.dumps(lease))
    with pytest.raises(StoreBusyError, match="x@elsewhere pid 1"):
        SnapshotStore(str(tmp_path)).writer("replay").acquire()
    assert not list(tmp_path.glob(".lease.json.stale-*"))


def test_lease_heartbeat_and_lost_lease(tmp_path):
    lease = Lease(pafs.LocalFileSystem(), str(tmp_path), command="test", timeout=0.4).acquire()
    try:
        time.sleep(1.0)  # several heartbeats: never stale while the holder lives
        assert not lease.is_stale(lease.read())
        lease.check()
        (tmp_path / LEASE).unlink()  # someone removed it by hand
        with pytest.raises(StoreError, match="lost the store's lease"):
            lease.check()
    finally:
        lease.release()


def test_lease_on_a_generic_pyarrow_file_system(tmp_path, monkeypatch):
    """The object-store path (no exclusive create): write, settle, read back."""
    import connectors.stores.lease as lease_mod

    monkeypatch.setattr(lease_mod, "_SETTLE_SECONDS", 0.01)
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    a = Lease(fs, "store", command="a")
    fs.create_dir("store")
    a.acquire()
    try:
        with pytest.raises(StoreBusyError, match="being written by"):
            Lease(fs, "store", command="b").acquire()
        a.beat()
        a.check()
    finally:
        a.release()
    assert not (tmp_path / "store" / LEASE).exists()
    Lease(fs, "store", command="b").acquire().release()


def test_concurrent_writers_exactly_one_proceeds(tmp_path):
    """Several processes race for one store: one gets the lease, the others are refused."""
    script = (
        "import pathlib, sys, time\n"
        "from connectors.stores import SnapshotStore, StoreBusyError\n"
        "from test_store import make_tree\n"
        "d, i = pathlib.Path(sys.argv[1]), int(sys.argv[2])\n"
        "(d / f'ready-{i}').touch()\n"
        "while len(list(d.glob('ready-*'))) < 4:  # start together, once all have imported\n"
        "    time.sleep(0.01)\n"
        "s = SnapshotStore(str(d / 's'))\n"
        "try:\n"
        "    with s.writer('race'):\n"
        "        for e in range(3):\n"
        "            s.publish(make_tree(e, [0, 1], [-1, 0], [0, 0], seed=i), list('abcde'), state={'writer': i})\n"
        "        end = time.time() + 60\n"
        "        while len(list(d.glob('tried-*'))) < 3 and time.time() < end:  # hold it while the others try\n"
        "            time.sleep(0.05)\n"
        "except StoreBusyError as exc:\n"
        "    (d / f'tried-{i}').touch()\n"
        "    print(exc); sys.exit(75)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(i)], env=env,
                              stdout=subprocess.PIPE, text=True) for i in range(4)]
    results = [(p.wait(timeout=180), p.stdout.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 75, 75, 75], results
    store = SnapshotStore(str(tmp_path / "s"))
    writers = {e["state"]["writer"] for e in store.epochs()}
    assert len(writers) == 1 and [e["epoch"] for e in store.epochs()] == [0, 1, 2]
    winner = writers.pop()
    for e in range(3):
        assert_same_tree(store.read(e).tree, make_tree(e, [0, 1], [-1, 0], [0, 0], seed=winner))


def test_checkpoint_and_tables_round_trip(tmp_path):
    store = SnapshotStore(str(tmp_path))
    arrays = {"theta": np.random.default_rng(0).normal(size=(3, 4)), "ids": np.arange(3, dtype=np.int64),
              "flags": np.array([True, False]), "scalar": np.float32(2.5), "empty": np.zeros((0, 7))}
    meta = {"format_version": 1, "seed": {"entropy": 2 ** 100 + 7, "spawned": 3}, "name": "x"}
    ledger = pa.table({"path": ["a.parquet"], "size": [12]})
    store.publish(make_tree(0, [0], [-1], [0]), list("abcde"), checkpoint=(arrays, meta), tables={"ledger": ledger})
    got, got_meta = store.read_checkpoint()
    assert got_meta == meta and set(got) == set(arrays)
    for name, value in arrays.items():
        value = np.asarray(value)
        assert got[name].dtype == value.dtype and got[name].shape == value.shape
        np.testing.assert_array_equal(got[name], value)
    assert store.read_table(0, "ledger").equals(ledger)
    raw = pq.read_table(tmp_path / "epochs" / "000000" / "checkpoint.parquet")
    assert raw.column_names == ["name", "dtype", "shape", "data"]
    # every name whose file is one the epoch writes itself, in any case, is refused before any write
    for name in ("nodes", "events", "checkpoint", "Theta", "ASSIGNMENTS", "Rejects"):
        with pytest.raises(ValueError, match="reserved"):
            store.publish(make_tree(1, [0], [-1], [0]), list("abcde"), tables={name: ledger})
    assert [e["epoch"] for e in store.epochs()] == [0]


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "manifest.json").write_text("{not json"), "manifest is not valid JSON"),
    (lambda d: (d / "manifest.json").write_text('{"format": "something else"}'), "not a streamtree snapshot manifest"),
    (lambda d: (d / "manifest.json").write_text(json.dumps(
        {**json.loads((d / "manifest.json").read_text()), "config": []})), "'config' is missing or of the wrong type"),
    (lambda d: (d / "commits" / "000001.json").write_text("[1, 2"), "commit record is not valid JSON"),
    (lambda d: (d / "commits" / "000001.json").write_text(json.dumps(
        {**json.loads((d / "commits" / "000001.json").read_text()), "path": "../../../../etc"})),
     "epoch path '../../../../etc' is not the epoch's folder"),
    (lambda d: (d / "commits" / "000001.json").write_text(json.dumps(
        {**json.loads((d / "commits" / "000001.json").read_text()), "path": "epochs/000000"})),
     "is not the epoch's folder"),
    (lambda d: (d / "commits" / "000001.json").write_text(json.dumps(
        {**json.loads((d / "commits" / "000001.json").read_text()), "n_documents": "many"})),
     "field 'n_documents' is missing or not a int"),
    (lambda d: (d / "commits" / "000001.json").write_text(json.dumps(
        {**json.loads((d / "commits" / "000001.json").read_text()), "run": "other"})), "belongs to run 'other'"),
])
def test_damaged_stores_are_one_clear_error(tmp_path, damage, message):
    store = SnapshotStore(str(tmp_path))
    store.write_vocabulary(vocab6())
    store.publish(make_tree(0, [0, 1], [-1, 0], [0, 0]), list("abcde"))
    store.publish(make_tree(1, [0, 1], [-1, 0], [0, 0]), list("abcde"))
    damage(tmp_path)
    for read in (lambda s: s.epochs(), lambda s: s.read(1), lambda s: s.lineage()):
        with pytest.raises(CorruptStoreError) as info:
            read(SnapshotStore(str(tmp_path)))
        assert message in str(info.value) and "\n" not in str(info.value)


def test_leftovers_are_cleaned_and_foreign_files_kept(tmp_path):
    store = SnapshotStore(str(tmp_path))
    store.publish(make_tree(0, [0], [-1], [0]), list("abcde"))
    (tmp_path / "my-notes.txt").write_text("mine")
    (tmp_path / "epochs" / f".tmp-000001-{uuid.uuid4().hex}").mkdir()
    (tmp_path / "epochs" / "000001").mkdir()  # renamed into place, never committed
    (tmp_path / "commits" / f".000001.json.tmp-{uuid.uuid4().hex}").write_text("{")
    (tmp_path / f".manifest.json.tmp-{uuid.uuid4().hex}").write_text("{")
    (tmp_path / "epochs" / "README").write_text("not ours")
    with store.writer("test") as w:
        removed = store.clean_leftovers()
        assert removed == [] and w.held  # already cleaned when the lease was taken
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert "my-notes.txt" in left and "epochs/README" in left
    assert not [p for p in left if ".tmp-" in p or p == "epochs/000001"]


LOOKS_TEMPORARY = [".old-photos/holiday.jpg", ".tmp-work/draft.txt", ".probe-notes", ".notes.tmp-1a2b",
                   ".replaced-backup/a.txt", f".probe-{'a' * 31}", "epochs/.tmp-drafts/a.txt",
                   "epochs/.old-000001-1a2b/a.txt", "commits/.000001.json.tmp-1a2b"]


def test_names_that_only_look_temporary_are_someone_elses(tmp_path):
    """Entries that merely look like the store's temporary names (``.old-photos``, ``.tmp-work``,
    ``.probe-notes``) are someone's files: a directory holding them and no store is refused as a
    new store, and a store's writer removes only the temporary names it makes itself (one of its
    prefixes and a 32-digit id, in the folder it makes them in). Before, such entries were not
    counted as foreign, a new store was written beside them, and its next writer deleted them."""
    user = tmp_path / "user"
    for rel in LOOKS_TEMPORARY[:4]:
        (user / rel).parent.mkdir(parents=True, exist_ok=True)
        (user / rel).write_text("precious")
    before = _files(user)
    with pytest.raises(StoreError, match="holds files that are not a streamtree store .e.g. '.notes.tmp-1a2b'"):
        SnapshotStore(str(user)).check_writable()
    assert _files(user) == before

    root = tmp_path / "store"
    store = SnapshotStore(str(root))
    store.publish(make_tree(0, [0], [-1], [0]), list("abcde"))
    for rel in LOOKS_TEMPORARY:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("precious")
    theirs = _files(root)
    own = [f".probe-{uuid.uuid4().hex}", f".vocabulary.parquet.tmp-{uuid.uuid4().hex}",
           f".{LEASE}.stale-{uuid.uuid4().hex}", f"epochs/.tmp-000001-{uuid.uuid4().hex}/nodes.parquet",
           f"epochs/.old-000000-{uuid.uuid4().hex}/nodes.parquet", f"commits/.000001.json.tmp-{uuid.uuid4().hex}",
           f".replaced-{uuid.uuid4().hex}/{LEASE}"]
    for rel in own:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("left by a crash")
    with store.writer("test"):
        pass
    assert _files(root) == theirs


def test_begin_replaces_the_old_run_only_at_the_first_commit(tmp_path):
    store = SnapshotStore(str(tmp_path))
    with store.writer("old"):
        store.begin({"run": "old"}, vocab6())
        store.publish(make_tree(0, [0, 1], [-1, 0], [0, 0]), list("abcde"))
        store.publish(make_tree(1, [0, 1], [-1, 0], [0, 0]), list("abcde"))
    (tmp_path / "mine.txt").write_text("keep me")
    with store.writer("new"):
        store.begin({"run": "new"}, vocab6())
        asides = list(tmp_path.glob(".replaced-*"))
        assert len(asides) == 1 and (asides[0] / "commits" / "000001.json").exists()
        reader = SnapshotStore(str(tmp_path))  # sees the old run whole until the new one commits
        assert reader.config() == {"run": "old"} and [e["epoch"] for e in reader.epochs()] == [0, 1]
        assert_same_tree(reader.read(1).tree, make_tree(1, [0, 1], [-1, 0], [0, 0]))
        store.publish(make_tree(0, [0, 2], [-1, 0], [0, 0], seed=4), list("vwxyz"))
        assert not list(tmp_path.glob(".replaced-*"))
        assert reader.config() == {"run": "new"} and [e["epoch"] for e in reader.epochs()] == [0]
    fresh = SnapshotStore(str(tmp_path))
    assert fresh.config() == {"run": "new"} and [e["epoch"] for e in fresh.epochs()] == [0]
    assert (tmp_path / "mine.txt").read_text() == "keep me"


@pytest.mark.parametrize("read", ["manifest", "last_commit", "count_published"])
@pytest.mark.parametrize("between, sees", [("commit", "new"), ("set aside", "old"), ("set aside and commit", "new")],
                         ids=["aside dropped", "old run set aside", "old run replaced"])
def test_a_reader_racing_a_replacement_sees_one_run_whole(tmp_path, read, between, sees):
    """A reader reads the manifest, then lists the commit records. A writer replacing the run in
    between (setting the old run aside, committing the new run's first epoch and dropping the
    aside) must not make it see the old run without epochs, or the new run's records under the
    old manifest: the read is done again when the run moved. Before, the reader got the old
    complete manifest with no epochs (or called the store damaged)."""
    store = SnapshotStore(str(tmp_path))
    with store.writer("old"):
        store.begin({"run": "old"}, vocab6())
        for e in range(3):
            store.publish(make_tree(e, [0, 1], [-1, 0], [0, 0], seed=e), list("abcde"))
        store.finish({"n": 3})
    writer = SnapshotStore(str(tmp_path))
    lease = writer.writer("new").acquire()
    try:
        if between == "commit":
            writer.begin({"run": "new"}, vocab6())
        reader = SnapshotStore(str(tmp_path))
        listing = reader._record_infos
        raced = []

        def interleaved():
            if not raced:  # once: the writer acts after the reader has read the manifest
                raced.append(True)
                if between != "commit":
                    writer.begin({"run": "new"}, vocab6())
                if between != "set aside":
                    writer.publish(make_tree(0, [0, 2], [-1, 0], [0, 0], seed=4), list("vwxyz"))
            return listing()

        reader._record_infos = interleaved
        got = getattr(reader, read)()
        assert raced
        new_run = writer._pending["run"] if writer._pending is not None else writer.manifest()["run"]
    finally:
        lease.release()
    if read == "manifest":
        assert got["config"] == {"run": sees}
        assert [e["epoch"] for e in got["epochs"]] == ([0, 1, 2] if sees == "old" else [0])
        assert (got["complete"] is not None) == (sees == "old")
    elif read == "last_commit":
        assert got["epoch"] == (2 if sees == "old" else 0) and (got["run"] == new_run) == (sees == "new")
    else:
        assert got == (3 if sees == "old" else 1)


@pytest.mark.parametrize("read", ["read", "nodes", "lineage", "all_nodes", "events"])
@pytest.mark.parametrize("started", [False, True], ids=["replacement begins meanwhile", "old run already aside"])
def test_a_reader_of_several_files_racing_a_replacement_reads_one_run(tmp_path, read, started):
    """Reading an epoch takes several files. A writer that sets the old run aside (or drops the
    aside) and commits the new run between two of them must not fail the read as damage or
    hand it one file of each run: the read is done again on the run now in place. Before,
    ``read`` called the store damaged when the aside was dropped, and could return the old
    run's nodes with the new run's assignments."""
    old_tree, new_tree = make_tree(0, [0, 1], [-1, 0], [0, 0], seed=1), make_tree(0, [0, 2, 3], [-1, 0, 0], [0, 2, 3])
    store = SnapshotStore(str(tmp_path))
    with store.writer("old"):
        store.begin({"run": "old"}, vocab6())
        store.publish(old_tree, list("abcde"))
    writer = SnapshotStore(str(tmp_path))
    lease = writer.writer("new").acquire()
    try:
        if started:
            writer.begin({"run": "new"}, vocab6())
        reader = SnapshotStore(str(tmp_path))
        real = reader._read_parquet
        raced = []

        def interleaved(path, columns=None):
            out = real(path, columns)
            if not raced:  # once: the writer acts after the reader's first file
                raced.append(path)
                if not started:
                    writer.begin({"run": "new"}, vocab6())
                writer.publish(new_tree, list("vwxyz"))
            return out

        reader._read_parquet = interleaved
        got = getattr(reader, read)(0) if read in ("read", "nodes") else getattr(reader, read)()
        assert raced
    finally:
        lease.release()
    ids = sorted(new_tree.node_ids.tolist())
    if read == "read":
        assert_same_tree(got.tree, new_tree)
        assert list(got.doc_ids) == list("vwxyz")
    elif read == "lineage":
        assert sorted(got) == ids
    elif read == "events":
        assert sorted(got.column("node_id").to_pylist()) == ids
    else:
        assert sorted(got.column("id").to_pylist()) == ids


class _AppearingFolder:
    """A store's file system on which ``folder`` is created while a reader lists it: Arrow then
    fails the listing as not found, though asked to allow a missing folder, because the folder
    exists by the time it checks."""

    def __init__(self, fs, folder: str) -> None:
        self._fs, self.folder = fs, folder

    def get_file_info(self, what):
        if isinstance(what, pafs.FileSelector) and what.base_dir == self.folder and not os.path.exists(self.folder):
            os.makedirs(self.folder)
            raise FileNotFoundError(errno.ENOENT, f"Cannot list directory '{self.folder}'. Detail: [errno 2] No "
                                                  "such file or directory")
        return self._fs.get_file_info(what)

    def __getattr__(self, name):
        return getattr(self._fs, name)


@pytest.mark.parametrize("folder", ["store", "commits"])
def test_a_reader_racing_the_creation_of_a_folder_of_the_store_reads_what_was_there(tmp_path, folder):
    """A reader polling a store while a writer creates it (a service or replay starting) or creates
    its commits folder (the first commit) reads the store as it was when listed: no epochs. Before,
    it failed with 'cannot list: No such file or directory'."""
    root = tmp_path / "store"
    if folder == "commits":
        writer = SnapshotStore(str(root))
        with writer.writer("new"):
            writer.begin({"run": "new"}, vocab6())
    reader = SnapshotStore(str(root))
    appearing = str(root if folder == "store" else root / "commits")
    reader.fs = _AppearingFolder(reader.fs, appearing)
    assert reader.epochs() == []
    assert os.path.isdir(appearing)  # the race happened
    assert reader.epochs() == []  # and the folder now there reads alike


def test_a_crash_after_setting_aside_is_cleaned_by_the_next_commit(tmp_path):
    store = SnapshotStore(str(tmp_path))
    store.publish(make_tree(0, [0], [-1], [0]), list("abcde"))
    with store.writer("new"):
        store.begin({"run": "new"})
    assert list(tmp_path.glob(".replaced-*"))  # the writer stopped before committing
    store.publish(make_tree(0, [0], [-1], [0]), list("abcde"))
    assert not list(tmp_path.glob(".replaced-*"))


def test_store_path_problems_are_caught_before_any_work(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(StoreAccessError, match="afile: is a file, not a store directory"):
        SnapshotStore(str(tmp_path / "afile")).check_writable()
    with pytest.raises(StoreAccessError, match="a file is in the way"):
        SnapshotStore(str(tmp_path / "afile" / "sub")).check_writable()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "thesis.tex").write_text("x")
    with pytest.raises(StoreError, match="not a streamtree store \\(e.g. 'thesis.tex'\\)"):
        SnapshotStore(str(tmp_path / "docs")).check_writable()
    SnapshotStore(str(tmp_path / "new")).check_writable()
    assert list((tmp_path / "new").iterdir()) == []

    for code, words in ((errno.ENOSPC, "no space left"), (errno.EACCES, "permission denied"),
                        (errno.EROFS, "read-only file system")):
        store = SnapshotStore(str(tmp_path / "new"))
        store.fs = RefusingFS(store.fs, code)
        with pytest.raises(StoreAccessError) as info:
            store.check_writable()
        assert f"{tmp_path / 'new'}: cannot write to the store: {words}" in str(info.value)


class RefusingFS:
    """A file system whose writes fail with one errno (a full disk, a read-only mount...)."""

    def __init__(self, fs, code):
        self._fs, self._code = fs, code

    def __getattr__(self, name):
        return getattr(self._fs, name)

    def open_output_stream(self, path, *args, **kwargs):
        raise OSError(self._code, os.strerror(self._code), path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_store_directory(tmp_path):
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o500)
    try:
        with pytest.raises(StoreAccessError, match="permission denied"):
            SnapshotStore(str(tmp_path / "ro")).check_writable()
    finally:
        (tmp_path / "ro").chmod(0o700)


def test_commit_cost_does_not_grow_with_the_number_of_epochs(tmp_path, monkeypatch):
    """Each commit writes one folder and one record; the manifest is not rewritten."""
    store = SnapshotStore(str(tmp_path))
    writes = []
    real = SnapshotStore._write_text

    def count(self, path, text):
        writes.append((path.rsplit("/", 1)[-1], len(text)))
        real(self, path, text)

    monkeypatch.setattr(SnapshotStore, "_write_text", count)
    with store.writer("test"):
        store.begin({"x": 1}, vocab6())
        for e in range(40):
            store.publish(make_tree(e, [0, 1], [-1, 0], [0, 0], seed=e), list("abcde"))
    assert [name for name, _ in writes[:2]] == ["manifest.json"] * 2  # the claim, then with the vocabulary
    per_epoch = writes[2:]
    assert [name for name, _ in per_epoch] == [f"{e:06d}.json" for e in range(40)]
    sizes = [n for _, n in per_epoch]
    assert max(sizes) - min(sizes) < 64  # the record does not grow with the epochs before it


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names open files through /proc")
def test_publication_is_flushed_before_and_after_its_renames(tmp_path, monkeypatch):
    """A power cut must not leave a published name over unwritten bytes: every file is flushed
    (under its temporary name) before the rename that publishes it, and the folder holding the
    new name is flushed after it. Before, nothing but the lease and superseded-checkpoint
    deletions was flushed."""
    import connectors.stores.snapshot as snapshot_mod
    from scipy.cluster.hierarchy import linkage

    events = []
    real_fsync, real_point = os.fsync, snapshot_mod.write_point
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                  real_fsync(fd))[1])
    monkeypatch.setattr(snapshot_mod, "write_point", lambda name: (events.append(("point", name)), real_point(name))[1])
    root = tmp_path / "s"
    store = SnapshotStore(str(root))
    ckpt = ({"w": np.arange(3.0)}, {"epoch": 0})
    with store.writer("test"):
        store.begin({"x": 1}, vocab6())
        store.publish(make_tree(0, [0, 1], [-1, 0], [0, 0]), list("abcde"), checkpoint=ckpt,
                      tables={"ledger": pa.table({"a": [1]})})
        store.write_static(0, "bhc", linkage(np.random.default_rng(0).normal(size=(5, 2))))
    points = [i for i, (kind, _) in enumerate(events) if kind == "point"] + [len(events)]

    def synced(lo, hi):
        return {os.path.relpath(p, root) for kind, p in events[lo:hi] if kind == "fsync"}

    renames = [(i, name) for i, (kind, name) in enumerate(events) if kind == "point" and name.startswith("rename ")]
    assert {name for _, name in renames} >= {"rename vocabulary.parquet", "rename manifest.json", "rename epoch folder",
                                             "rename 000000.json", "rename static bhc"}
    for i, name in renames:
        after = synced(i, points[points.index(i) + 1])
        before = synced(0, i)
        if name == "rename epoch folder":
            folder = next(p for p in before if p.startswith("epochs/.tmp-000000-") and "/" not in p[7:])
            files = {p.name for p in (root / "epochs" / "000000").iterdir() if p.is_file()}
            assert files >= {"nodes.parquet", "theta.parquet", "assignments.parquet", "checkpoint.parquet",
                             "checkpoint.json", "ledger.parquet"}
            assert {f"{folder}/{f}" for f in files} <= before, (files, before)
            assert "epochs" in after
        elif name == "rename static bhc":
            assert any(p.startswith("epochs/000000/static/.tmp-bhc-") for p in before)
            assert "epochs/000000/static" in after
        else:
            target = name.split(" ", 1)[1]
            folder = "commits" if target.endswith(".json") and target != "manifest.json" else "."
            assert any(os.path.basename(p).startswith(f".{target}.tmp-") and os.path.dirname(p) == folder.strip(".")
                       for p in before), (name, before)
            assert folder in after, (name, after)


def test_folders_the_file_system_cannot_flush_are_skipped(tmp_path, monkeypatch):
    """Where a folder cannot be flushed (some file systems refuse fsync on a directory), a
    publication goes on without it."""
    import stat

    real = os.fsync

    def refuse_folders(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        real(fd)

    monkeypatch.setattr(os, "fsync", refuse_folders)
    store = SnapshotStore(str(tmp_path))
    store.publish(make_tree(0, [0], [-1], [0]), list("abcde"))
    assert [e["epoch"] for e in SnapshotStore(str(tmp_path)).epochs()] == [0]


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOTSUP])
def test_files_the_file_system_cannot_flush_are_skipped(tmp_path, monkeypatch, code):
    """Where files cannot be flushed (some FUSE and network file systems refuse fsync with
    EINVAL or ENOTSUP), a writer goes on without it, as for folders; other errors still stop
    it. Before, taking the lease failed with the raw OSError, and every file written with
    "cannot flush to disk"."""
    from scipy.cluster.hierarchy import linkage

    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(code, os.strerror(code))))
    store = SnapshotStore(str(tmp_path))
    with store.writer("test"):
        store.begin({"x": 1}, vocab6())
        store.publish(make_tree(0, [0, 1], [-1, 0], [0, 0]), list("abcde"), checkpoint=({"w": np.arange(3.0)}, {}))
        store.write_static(0, "bhc", linkage(np.random.default_rng(0).normal(size=(5, 2))))
        store.publish(make_tree(1, [0, 1], [-1, 0], [0, 0]), list("abcde"), checkpoint=({"w": np.arange(3.0)}, {}))
    monkeypatch.setattr(os, "fsync", real)
    reader = SnapshotStore(str(tmp_path))
    assert [e["epoch"] for e in reader.epochs()] == [0, 1] and reader.read_static(0, "bhc") is not None
    with store.writer("test"):
        monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, os.strerror(errno.EIO))))
        with pytest.raises(StoreAccessError, match="cannot flush to disk"):
            store.publish(make_tree(2, [0, 1], [-1, 0], [0, 0]), list("abcde"))
        monkeypatch.setattr(os, "fsync", real)


def _three_epochs(root, checkpoints: bool) -> SnapshotStore:
    store = SnapshotStore(str(root))
    for e in range(3):
        store.publish(make_tree(e, [0, 1], [-1, 0], [0, 0], seed=e), list("abcde"),
                      checkpoint=({"w": np.full(3, float(e))}, {"epoch": e}) if checkpoints else None)
    return store


@pytest.mark.parametrize("cut", [lambda b: b[:len(b) // 2], lambda b: b[:1], lambda b: b"",
                                 lambda b: b[:40] + b"\0" * 100, lambda b: b"\0" * len(b)],
                         ids=["half", "brace", "empty", "zero tail", "zeros"])
def test_a_latest_commit_record_cut_short_by_a_crash_reads_as_the_epoch_before(tmp_path, cut):
    """A crash (a power cut on a store written before records were flushed) can leave the latest
    commit record cut short: the store reads as committed through the epoch before it, and a
    writer removes the record and the epoch's folder, to publish the epoch again. Before, every
    reader called the store damaged. A record cut short before a later one is still damage."""
    _three_epochs(tmp_path, checkpoints=False)
    record = tmp_path / "commits" / "000002.json"
    record.write_bytes(cut(record.read_bytes()))
    reader = SnapshotStore(str(tmp_path))
    assert [e["epoch"] for e in reader.epochs()] == [0, 1]
    assert reader.last_commit()["epoch"] == 1 and reader.count_published() == 2
    assert_same_tree(reader.read(1).tree, make_tree(1, [0, 1], [-1, 0], [0, 0], seed=1))
    with pytest.raises(StoreError, match=r"epoch 2 is not published \(published: \[0, 1\]\)"):
        reader.read(2)
    writer = SnapshotStore(str(tmp_path))
    with writer.writer("test"):
        assert not record.exists() and not (tmp_path / "epochs" / "000002").exists()
        writer.publish(make_tree(2, [0, 1], [-1, 0], [0, 0], seed=7), list("abcde"))
    assert_same_tree(SnapshotStore(str(tmp_path)).read(2).tree, make_tree(2, [0, 1], [-1, 0], [0, 0], seed=7))
    middle = tmp_path / "commits" / "000001.json"
    middle.write_bytes(middle.read_bytes()[:50])
    with pytest.raises(CorruptStoreError, match="000001.json: the commit record is cut short, yet later epochs"):
        SnapshotStore(str(tmp_path)).epochs()


@pytest.mark.parametrize("tail", [b"n", b"t", b"tr", b"-", b"e", b".", b"\n-", b"}"])
def test_a_whole_record_followed_by_stray_bytes_is_damage_not_a_crash(tmp_path, tail):
    """A crash cannot add bytes after a complete record: a latest record that parses whole and
    is followed by anything is damage, for readers and writers alike, and the writer deletes
    neither the record nor its epoch's folder. Before, a stray byte that could begin a JSON token
    read as a record cut short, and the next writer deleted the record and the epoch."""
    _three_epochs(tmp_path, checkpoints=False)
    record = tmp_path / "commits" / "000002.json"
    record.write_bytes(record.read_bytes() + tail)
    before = _files(tmp_path)
    with pytest.raises(CorruptStoreError, match="000002.json: the commit record is not valid JSON"):
        SnapshotStore(str(tmp_path)).epochs()
    with SnapshotStore(str(tmp_path)).writer("test"):
        pass
    assert _files(tmp_path) == before
    with pytest.raises(CorruptStoreError, match="the store is damaged"):
        SnapshotStore(str(tmp_path)).last_commit()


def test_a_cut_short_record_is_kept_when_its_folder_holds_the_only_checkpoint(tmp_path):
    """The previous epoch's checkpoint was deleted after the cut record's epoch committed: its
    folder is the only way back, so the writer keeps it (and says so) rather than delete it."""
    _three_epochs(tmp_path, checkpoints=True)
    record = tmp_path / "commits" / "000002.json"
    record.write_bytes(record.read_bytes()[:60])
    with SnapshotStore(str(tmp_path)).writer("test"):
        pass
    assert record.exists() and (tmp_path / "epochs" / "000002" / "checkpoint.parquet").exists()


def _files(root) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("plant, found", [
    ({"epochs/000003/data.bin": "mine", "vocabulary.parquet": "mine", "commits/notes": "mine"},
     "holds vocabulary.parquet, commits, epochs but no streamtree manifest"),
    ({"epochs/000000/nodes.parquet": "mine", ".tmp-000001-abc/x": "mine"}, "holds epochs but no streamtree manifest"),
    ({"manifest.json": '{"format": "someone else\'s"}', "epochs/000001/nodes.parquet": "mine",
      "commits/.000001.json.tmp-ab": "mine"}, "manifest.json: not the manifest of a streamtree store"),
    ({"lease.json": "my lease, not streamtree's"}, "holds lease.json but no streamtree manifest"),
    ({"lease.json": '{"token": "my-car-lease"}'}, "holds lease.json but no streamtree manifest"),
    ({".replaced-1234/manifest.json": "{}"}, "holds .replaced-1234 but no streamtree manifest"),
], ids=["data names", "epoch folder", "foreign manifest", "foreign lease", "foreign JSON lease",
        "aside without a manifest"])
def test_store_named_files_that_no_store_wrote_are_never_touched(tmp_path, plant, found):
    """A directory holding files with the store's names but no store of ours (no streamtree
    manifest proving it wrote them) is refused by every writer, saying what it found, and
    nothing in it is deleted or moved, with or without --overwrite. Before, taking the lease
    deleted epoch folders without a commit record, and a new run set the rest aside and deleted
    it at its first commit."""
    from streamtree.replay import ReplayConfig, replay

    for rel, text in plant.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    before = _files(tmp_path)
    if "lease.json" in plant:  # old enough to be taken over, were it a lease
        os.utime(tmp_path / "lease.json", (time.time() - 7200,) * 2)
        before = _files(tmp_path)
    store = SnapshotStore(str(tmp_path))
    with pytest.raises(StoreError, match=found):
        store.check_writable()
    with pytest.raises(StoreError, match=found):
        with store.writer("test"):
            store.begin({"x": 1}, vocab6())
            store.publish(make_tree(0, [0], [-1], [0]), list("abcde"))
    with pytest.raises(StoreError, match=found):
        replay(ReplayConfig(source=str(tmp_path / "none.parquet"), text_col="text", time_col="year"), str(tmp_path),
               mode="overwrite")
    assert _files(tmp_path) == before


def test_an_older_writer_stopped_before_its_manifest_is_refused_saying_what_to_remove(tmp_path):
    """Streamtree versions before the manifest-first store wrote ``vocabulary.parquet`` (and
    their lease) before the manifest; one killed in between left that layout, which nothing
    proves to be a store's. Every writer, --overwrite included, refuses it as before and touches
    nothing, but the message now says it may be such a run and which file to remove (before: only
    that the directory is not a store's); done so, the replay runs."""
    from streamtree.replay import ReplayConfig, replay

    store = SnapshotStore(str(tmp_path))
    with store.writer("replay"):
        store.begin({"x": 1}, vocab6())
    (tmp_path / "manifest.json").rename(tmp_path / f".manifest.json.tmp-{uuid.uuid4().hex}")
    lease = {"owner": "x", "host": socket.gethostname(), "pid": dead_pid(), "command": "replay", "token": "t1",
             "acquired": "then", "heartbeat_unix": time.time(), "timeout": 60}
    (tmp_path / LEASE).write_text(json.dumps(lease))
    before = _files(tmp_path)
    hint = (f"holds vocabulary.parquet but no streamtree manifest .manifest.json.. Earlier streamtree versions wrote "
            f"vocabulary.parquet before the manifest, .* remove {re.escape(str(tmp_path / 'vocabulary.parquet'))} "
            "and rerun")
    with pytest.raises(StoreError, match=hint):
        SnapshotStore(str(tmp_path)).check_writable()
    with pytest.raises(StoreError, match=hint):
        replay(ReplayConfig(source=str(tmp_path / "none.parquet"), text_col="text", time_col="year"), str(tmp_path),
               mode="overwrite")
    assert _files(tmp_path) == before
    (tmp_path / "epochs").mkdir()  # not that layout: the plain refusal
    with pytest.raises(StoreError, match="holds vocabulary.parquet, epochs but no streamtree manifest .manifest.json.,"):
        SnapshotStore(str(tmp_path)).check_writable()
    (tmp_path / "epochs").rmdir()
    (tmp_path / "vocabulary.parquet").unlink()
    store = SnapshotStore(str(tmp_path))
    store.check_writable()
    with store.writer("replay"):
        store.begin({"x": 2}, vocab6())
        store.publish(make_tree(0, [0], [-1], [0]), list("abcde"))
    assert SnapshotStore(str(tmp_path)).config() == {"x": 2}


def test_a_new_store_writes_its_manifest_first(tmp_path, monkeypatch):
    """The manifest is the proof that the files after it are the store's own, so a new store
    writes it before anything else, whole (a temporary file of the store's own name, renamed)."""
    import connectors.stores.snapshot as snapshot_mod

    points = []
    monkeypatch.setattr(snapshot_mod, "write_point", lambda name: points.append(
        (name, sorted(p.name for p in (tmp_path / "s").iterdir() if p.name != LEASE))))
    store = SnapshotStore(str(tmp_path / "s"))
    with store.writer("test"):
        store.begin({"x": 1}, vocab6())
    assert points[0] == ("write manifest.json", [])
    assert points[1][0] == "rename manifest.json" and len(points[1][1]) == 1
    assert re.fullmatch(r"\.manifest\.json\.tmp-[0-9a-f]{32}", points[1][1][0])
    assert points[2][0].startswith("write .vocabulary.parquet.tmp-") and points[2][1] == ["manifest.json"]
    assert SnapshotStore(str(tmp_path / "s")).config() == {"x": 1} and store.vocabulary() is not None


class Killed(BaseException):
    """A writer stopped dead at a write point (nothing after it runs)."""


def test_a_claim_stopped_before_its_rename_leaves_no_manifest(tmp_path, monkeypatch):
    """A crash while a new store writes its manifest leaves no ``manifest.json`` at all, only the
    store's temporary file: readers see an empty store, and the next writer claims the folder
    and removes that file. Before, the manifest was created in place, so a power cut between its
    creation and its flush left an empty or partial manifest, which every writer called damage."""
    import connectors.stores.snapshot as snapshot_mod

    real = snapshot_mod.write_point

    def kill(name):
        if name == "rename manifest.json":
            raise Killed
        real(name)

    monkeypatch.setattr(snapshot_mod, "write_point", kill)
    store = SnapshotStore(str(tmp_path))
    with pytest.raises(Killed):
        with store.writer("test"):
            store.begin({"x": 1}, vocab6())
    monkeypatch.setattr(snapshot_mod, "write_point", real)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == 1 and re.fullmatch(r"\.manifest\.json\.tmp-[0-9a-f]{32}", left[0]), left
    assert SnapshotStore(str(tmp_path)).epochs() == []
    store = SnapshotStore(str(tmp_path))
    store.check_writable()
    with store.writer("test"):
        store.begin({"x": 2}, vocab6())
        store.publish(make_tree(0, [0], [-1], [0]), list("abcde"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["commits", "epochs", "manifest.json", "vocabulary.parquet"]
    assert SnapshotStore(str(tmp_path)).config() == {"x": 2}


@pytest.mark.parametrize("torn", [b"", b"\0" * 300, b'{\n "checkpoints": "lat', b'{\n "check'],
                         ids=["empty", "zeros", "cut", "cut in the first key"])
def test_a_claim_torn_by_an_earlier_writer_is_replaced(tmp_path, caplog, torn):
    """Writers before the claim was renamed into place created ``manifest.json`` in place, so a
    power cut could leave it empty, zeros or cut off in a folder holding nothing else: no run
    ever began there. Readers see an empty store and the next writer replaces it, saying so.
    Before, every reader and writer said the store was damaged and to restore it from a copy.
    With anything of a run beside it, or someone else's JSON, it is still damage."""
    (tmp_path / "manifest.json").write_bytes(torn)
    (tmp_path / f".probe-{uuid.uuid4().hex}").write_bytes(b"")
    reader = SnapshotStore(str(tmp_path))
    assert reader.epochs() == [] and reader.complete() is None
    store = SnapshotStore(str(tmp_path))
    store.check_writable()
    with store.writer("test"):
        store.begin({"x": 1}, vocab6())
        store.publish(make_tree(0, [0], [-1], [0]), list("abcde"))
    assert "torn by a crash" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["commits", "epochs", "manifest.json", "vocabulary.parquet"]
    assert SnapshotStore(str(tmp_path)).config() == {"x": 1}

    for i, (other, beside) in enumerate(((torn, "epochs/000000"), (b'{"format": "someone', None))):
        root = tmp_path / f"other{i}"
        root.mkdir()
        (root / "manifest.json").write_bytes(other)
        if beside:
            (root / beside).mkdir(parents=True)
        before = _files(root)
        with pytest.raises(CorruptStoreError, match="manifest.json: the manifest is not valid JSON"):
            SnapshotStore(str(root)).epochs()
        with pytest.raises(CorruptStoreError, match="the store is damaged"):
            with SnapshotStore(str(root)).writer("test"):
                pass
        assert _files(root) == before


MINE = {"epochs/000000/notes.txt": "mine", "epochs/000000/static/draft.parquet": "mine",
        "epochs/my-folder/a.txt": "mine", "commits/README": "mine"}


def _plant(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_replacing_a_run_keeps_files_someone_put_in_its_folders(tmp_path, caplog):
    """A replacement moves the old run's folders aside and deletes the aside once the new run
    commits: only what the store wrote there goes. A file someone put in an epoch folder (or in
    ``epochs``, ``commits`` or ``static``) stays, with the folders that hold it, and the writer
    warns, naming it, until it is moved out."""
    store = SnapshotStore(str(tmp_path))
    with store.writer("old"):
        store.begin({"run": "old"}, vocab6())
        store.publish(make_tree(0, [0, 1], [-1, 0], [0, 0]), list("abcde"), tables={"ledger": pa.table({"a": [1]})})
        store.write_static(0, "bhc", np.array([[0.0, 1.0, 0.5, 2.0]]))
    _plant(tmp_path, MINE)
    with caplog.at_level("WARNING", logger="connectors.stores.snapshot"):
        with store.writer("new"):
            store.begin({"run": "new"}, vocab6())
            store.publish(make_tree(0, [0, 2], [-1, 0], [0, 0], seed=4), list("vwxyz"))
    asides = list(tmp_path.glob(".replaced-*"))
    assert len(asides) == 1
    left = {str(p.relative_to(asides[0])) for p in asides[0].rglob("*") if p.is_file()}
    assert left == set(MINE)  # the old run's own files are gone, every planted one is kept
    for rel, text in MINE.items():
        assert (asides[0] / rel).read_text() == text
    assert "kept 4 entries that streamtree did not write" in caplog.text and "notes.txt" in caplog.text
    fresh = SnapshotStore(str(tmp_path))
    assert fresh.config() == {"run": "new"} and [e["epoch"] for e in fresh.epochs()] == [0]
    assert_same_tree(fresh.read(0).tree, make_tree(0, [0, 2], [-1, 0], [0, 0], seed=4))
    # moved out by their owner: the next writer removes the empty folders
    import shutil
    shutil.rmtree(asides[0] / "epochs")
    (asides[0] / "commits" / "README").unlink()
    with store.writer("later"):
        pass
    assert not list(tmp_path.glob(".replaced-*"))


def test_replacing_an_epoch_keeps_files_someone_put_in_its_folder(tmp_path, caplog):
    store = SnapshotStore(str(tmp_path))
    store.publish(make_tree(0, [0], [-1], [0]), list("abcde"))
    _plant(tmp_path, {"epochs/000000/notes.txt": "mine"})
    with caplog.at_level("WARNING", logger="connectors.stores.snapshot"):
        store.publish(make_tree(0, [0, 1], [-1, 0], [0, 0]), list("ABCDE"), replace=True)
    assert (tmp_path / "epochs" / "000000" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "epochs" / "000000").iterdir()) == ["notes.txt"]
    assert "notes.txt" in caplog.text
    assert_same_tree(SnapshotStore(str(tmp_path)).read(0).tree, make_tree(0, [0, 1], [-1, 0], [0, 0]))


def test_an_uncommitted_epoch_folder_holding_someones_file_is_not_published_into(tmp_path):
    store = SnapshotStore(str(tmp_path))
    store.publish(make_tree(0, [0], [-1], [0]), list("abcde"))
    _plant(tmp_path, {"epochs/000001/notes.txt": "mine", "epochs/000001/nodes.parquet": "left by a crash"})
    store.publish(make_tree(1, [0], [-1], [0]), list("abcde"))
    assert sorted(p.name for p in (tmp_path / "epochs" / "000001").iterdir()) == ["notes.txt"]
    entry = SnapshotStore(str(tmp_path)).epochs()[1]
    assert entry["path"].startswith("epochs/000001-")
    assert_same_tree(SnapshotStore(str(tmp_path)).read(1).tree, make_tree(1, [0], [-1], [0]))


def test_a_store_that_was_never_made_is_not_discarded_with_a_warning(tmp_path, caplog):
    """A replay stopped before its store's folder could be made (its parent not writable, say)
    has nothing to remove, and says nothing about removing it."""
    with caplog.at_level("WARNING", logger="connectors.stores.snapshot"):
        SnapshotStore(str(tmp_path / "missing" / "store")).discard_if_empty()
    assert caplog.text == "" and not (tmp_path / "missing").exists()
