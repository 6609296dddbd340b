"""The ingestion service in-process: landing rules, --once runs, restarts, replay equality, metrics."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import logging
import os
import shutil
import threading
import time
import urllib.request
from datetime import datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from service_corpus import (MODEL, assert_events_follow_the_published_trees, day_rows, store_epochs, store_rejects,
                            write_jsonl, write_partition_copies)

import connectors.landing
from connectors.landing import LandingError, LandingNotReady, LandingZone, read_landed
from connectors.sources.files import content_digest
from connectors.stores.ledger import read_ledger
from connectors.stores.snapshot import SnapshotStore, StoreBusyError, StoreError
from streamtree.replay import ReplayConfig, replay
from streamtree.service import ServeConfig, Service, parse_address

DAYS = range(1, 7)


# ---------------------------------------------------------------------------------- landing
def _touch(path, text="x", age=0.0):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    if age:
        t = time.time() - age
        os.utime(path, (t, t))


def test_landing_ready_rules(tmp_path):
    root = str(tmp_path)
    zone = LandingZone(root, settle=60)
    _touch(f"{root}/a.jsonl")
    _touch(f"{root}/.hidden.jsonl")
    _touch(f"{root}/b.jsonl.tmp")
    _touch(f"{root}/_temporary/c.jsonl")
    _touch(f"{root}/notes.txt")
    assert zone.poll() == []  # nothing seen twice yet
    ready = zone.poll()
    assert [f.name for f in ready] == ["a.jsonl"]
    assert zone.ignored == {"notes.txt"}
    # a growing file is not ready until unchanged over a poll
    _touch(f"{root}/d.jsonl", "x")
    assert [f.name for f in zone.poll(skip={"a.jsonl"})] == []
    _touch(f"{root}/d.jsonl", "xy")
    os.utime(f"{root}/d.jsonl", ns=(0, time.time_ns() + 10**9))
    assert [f.name for f in zone.poll(skip={"a.jsonl"})] == []
    assert [f.name for f in zone.poll(skip={"a.jsonl"})] == ["d.jsonl"]
    # an old file is ready at once (settle); files come in the order they landed, then by name
    fresh = LandingZone(root, settle=60)
    _touch(f"{root}/z.jsonl", age=300)
    _touch(f"{root}/y.jsonl", age=200)
    assert [f.name for f in fresh.poll(skip={"a.jsonl", "d.jsonl"})] == ["z.jsonl", "y.jsonl"]


def test_files_are_handed_out_in_the_order_they_landed(tmp_path):
    """Not by modification time, which a copy keeps from its source (cp -p, rsync -a): a file
    copied in later with an older time comes later. And a ready file waits for one that landed
    before it and is still settling, so the order is the landing order whatever a poll saw."""
    root = str(tmp_path)
    zone = LandingZone(root, settle=60)
    _touch(f"{root}/c.jsonl", age=100)
    time.sleep(0.01)
    _touch(f"{root}/d.jsonl", age=200)  # landed after c.jsonl with an older modification time
    assert [f.name for f in zone.poll()] == ["c.jsonl", "d.jsonl"]
    skip = {"c.jsonl", "d.jsonl"}
    _touch(f"{root}/e.jsonl")  # settling: ready once seen unchanged on two polls
    time.sleep(0.01)
    _touch(f"{root}/f.jsonl", age=300)  # ready at once, but landed after e.jsonl
    assert zone.poll(skip=skip) == []
    assert [f.name for f in zone.poll(skip=skip)] == ["e.jsonl", "f.jsonl"]


def test_a_file_lands_when_it_was_put_in_the_folder_never_later_than_now(tmp_path):
    """The idle clock's landing time: the status-change time on a local disk, so neither a
    modification time kept from long ago nor one set in the future by a clock running ahead
    moves it; and never later than the poll."""
    root = tmp_path / "land"
    os.makedirs(root)
    for name, offset in (("old.jsonl", -86400.0), ("ahead.jsonl", 86400.0)):
        write_jsonl(str(root / name), day_rows(1, 2, 0))
        t = time.time() + offset
        os.utime(root / name, (t, t))
    now = time.time()
    zone = LandingZone(str(root), settle=0)
    zone.poll(now=now)  # a file stamped in the future is ready once seen unchanged on two polls
    files = {f.name: f for f in zone.poll(now=now + 1)}
    for name in ("old.jsonl", "ahead.jsonl"):
        landed = files[name].arrived_ns / 1e9
        assert abs(landed - os.stat(root / name).st_ctime) < 1e-3 and landed <= now + 1
    assert LandingZone(str(root), settle=0).poll(now=now - 3600)[0].arrived_ns <= (now - 3600) * 1e9


def test_landing_success_marker(tmp_path):
    root = str(tmp_path)
    zone = LandingZone(root, settle=0, require_success=True)
    _touch(f"{root}/day=1/part-0.jsonl", age=100)
    _touch(f"{root}/day=2/part-0.jsonl", age=100)
    assert zone.poll() == []
    _touch(f"{root}/day=2/_SUCCESS", "")
    ready = zone.poll()
    assert [f.name for f in ready] == ["day=2/part-0.jsonl"]
    assert ready[0].ready_ns > ready[0].mtime_ns  # ordered by the marker


def test_a_landed_spark_int96_timestamp_keeps_its_year(tmp_path):
    """As a replay reads it (a year-9999 INT96 timestamp was read as 1816)."""
    when = pa.array([datetime(9999, 12, 31), datetime(2026, 3, 1)], pa.timestamp("us"))
    pq.write_table(pa.table({"text": ["no end", "some words"], "time": when}), f"{tmp_path}/a.parquet",
                   use_deprecated_int96_timestamps=True)
    zone = LandingZone(str(tmp_path), settle=0)
    got = read_landed(zone.fs, zone.poll()[0], text_col="text", time_col="time")
    assert [t.year for t in got.rows.column("time").to_pylist()] == [9999, 2026]


def test_read_landed_formats_partitions_and_errors(tmp_path):
    root = str(tmp_path)
    rows = day_rows(1, 5, 0)
    write_jsonl(f"{root}/a.jsonl", rows)
    pq.write_table(pa.Table.from_pylist(rows), f"{root}/b.parquet")
    os.makedirs(f"{root}/year=1790")
    pq.write_table(pa.table({"text": ["army navy war troops"], "id": ["s1"]}), f"{root}/year=1790/c.parquet")
    with open(f"{root}/d.csv", "w") as f:
        f.write("text,time\n\"tax, budget\",2026-03-01\n,2026-03-01\n")
    with open(f"{root}/bad.parquet", "wb") as f:
        f.write(b"PAR1 not really")
    zone = LandingZone(root, settle=0)
    files = {f.name: f for f in zone.poll()}
    kw = dict(text_col="text", time_col="time")
    a = read_landed(zone.fs, files["a.jsonl"], **kw)
    b = read_landed(zone.fs, files["b.parquet"], **kw)
    assert a.rows.num_rows == b.rows.num_rows == 5 and a.n_read == 5
    assert a.rows.column("id").to_pylist()[:2] == ["a.jsonl:0", "a.jsonl:1"]
    assert a.rows.column("time").equals(b.rows.column("time"))
    assert len(a.sha256) == 64 and a.sha256 != b.sha256
    c = read_landed(zone.fs, files["year=1790/c.parquet"], text_col="text", time_col="year", id_col="id")
    assert c.rows.column("time").to_pylist()[0].year == 1790 and c.rows.column("source")[0].as_py() == "year=1790/c.parquet"
    d = read_landed(zone.fs, files["d.csv"], **kw)
    assert d.rows.column("text").to_pylist() == ["tax, budget"] and d.rejects.column("reason").to_pylist() == ["empty text"]
    with pytest.raises(LandingError, match="bad.parquet"):
        read_landed(zone.fs, files["bad.parquet"], **kw)
    with pytest.raises(LandingError, match="column 'body' not found"):
        read_landed(zone.fs, files["a.jsonl"], text_col="body", time_col="time")
    # a CSV's error lists every column it holds, the ones not mapped too
    with pytest.raises(LandingError, match=r"d\.csv: time column 'posted' not found; columns present: 'text', 'time'$"):
        read_landed(zone.fs, files["d.csv"], text_col="text", time_col="posted")
    with pytest.raises(LandingError, match=r"text column 'body' not found; columns present: 'text', 'time'$"):
        read_landed(zone.fs, files["d.csv"], text_col="body", time_col="time")


def test_compressed_landed_files_are_read_as_replay_reads_them(tmp_path):
    """A compressed file is decompressed once. pyarrow's input stream already decompressed it by
    its extension and the reader did so again, so every .gz, .bz2, .zst or .lz4 file failed
    ("zlib inflate failed") and was recorded as unreadable."""
    import pyarrow.csv as pacsv

    from connectors.sources import open_source

    root, plain = tmp_path / "land", tmp_path / "plain"
    rows = day_rows(1, 5, 0)
    write_jsonl(str(plain / "a.jsonl"), rows)
    pacsv.write_csv(pa.Table.from_pylist(rows), plain / "b.csv")
    # tab-separated, as its name says under the compression extension
    pacsv.write_csv(pa.Table.from_pylist(rows), plain / "c.TSV", write_options=pacsv.WriteOptions(delimiter="\t"))
    os.makedirs(root)
    compressed = (("a.jsonl.gz", "gzip"), ("a.jsonl.zst", "zstd"), ("b.csv.bz2", "bz2"), ("b.csv.lz4", "lz4"),
                  ("c.TSV.gz", "gzip"))
    for name, codec in compressed:
        with pa.CompressedOutputStream(str(root / name), codec) as out:
            out.write((plain / name.rsplit(".", 1)[0]).read_bytes())
    (root / "broken.jsonl.gz").write_bytes(b"not gzip at all")
    zone = LandingZone(str(root), settle=0)
    files = {f.name: f for f in zone.poll()}
    kw = dict(text_col="text", time_col="time")
    for name, _ in compressed:
        got = read_landed(zone.fs, files[name], **kw)
        replayed = open_source(str(root / name), **kw).read_all()
        assert got.n_read == 5 and got.rows.drop_columns(["source", "id"]).equals(
            replayed.drop_columns(["source", "id"])), name
    # the content is hashed, so a compressed copy of the same content is the same file
    hashes = {read_landed(zone.fs, files[n], **kw).sha256 for n in ("a.jsonl.gz", "a.jsonl.zst")}
    assert len(hashes) == 1
    with pytest.raises(LandingError, match="broken.jsonl.gz: cannot decompress it as gzip"):
        read_landed(zone.fs, files["broken.jsonl.gz"], **kw)


def test_the_hash_of_a_landed_file_covers_its_partition_keys(tmp_path):
    """The ledger's hash of a landed file is the sha256 of its bytes (decompressed) where no folder
    of its names a partition key, as ledgers always held it. Partition keys are columns of its
    rows, so they count: the same bytes in ``year=2020`` and ``year=2021`` are two files, a copy
    in one partition (compressed, under another name) is one, as a replay compares them."""
    data = b'{"text": "tax budget", "time": "2026-03-01"}\n'
    for name in ("a.jsonl", "year=2020/a.jsonl", "year=2021/a.jsonl", "year=2021/b.jsonl.gz"):
        os.makedirs(tmp_path / os.path.dirname(name), exist_ok=True)
        (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    zone = LandingZone(str(tmp_path), settle=0)
    sha = {f.name: read_landed(zone.fs, f, text_col="text", time_col="time").sha256 for f in zone.poll()}
    assert sha["a.jsonl"] == hashlib.sha256(data).hexdigest()
    assert len({sha["a.jsonl"], sha["year=2020/a.jsonl"], sha["year=2021/a.jsonl"]}) == 3
    assert sha["year=2021/b.jsonl.gz"] == sha["year=2021/a.jsonl"] == content_digest([data],
                                                                                   partition_keys={"year": "2021"})


def test_files_that_cannot_be_read_yet_are_not_read_as_unreadable(tmp_path):
    """An empty file, and a file that changed between its listing and its read (a writer still
    at it), are not ready yet rather than unreadable: the service leaves them for a later poll.
    Only a file that is malformed as it stands is an error."""
    root = tmp_path / "land"
    write_jsonl(str(root / "a.jsonl"), day_rows(1, 5, 0))
    (root / "empty.jsonl").write_bytes(b"")
    (root / "bad.jsonl").write_text("{not json\n")
    zone = LandingZone(str(root), settle=0)
    files = {f.name: f for f in zone.poll()}
    kw = dict(text_col="text", time_col="time")
    with pytest.raises(LandingNotReady, match="empty.jsonl: it is empty"):
        read_landed(zone.fs, files["empty.jsonl"], **kw)
    with open(root / "a.jsonl", "a") as f:  # grows after it was listed
        f.write(json.dumps(day_rows(1, 1, 1)[0]) + "\n")
    with pytest.raises(LandingNotReady, match="a.jsonl: it changed while it was read"):
        read_landed(zone.fs, files["a.jsonl"], **kw)
    with pytest.raises(LandingError, match="bad.jsonl: not a valid jsonl file"):
        read_landed(zone.fs, files["bad.jsonl"], **kw)


def _csv_days(path, days: list[str], seed: int) -> None:
    """A CSV of 10 documents per day string (times as written: ``"13/03/2026"``)."""
    import pyarrow.csv as pacsv

    rows = [dict(r, time=d) for i, d in enumerate(days) for r in day_rows(i + 1, 10, seed)]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pacsv.write_csv(pa.Table.from_pylist(rows), path)


def test_a_file_is_read_with_the_streams_time_choices_and_says_if_alone_it_would_not_be(tmp_path):
    """read_landed reads a file as the stream's earlier files decided (the parser it is given is
    not changed), and says when the file on its own would have been read otherwise."""
    from connectors.sources.times import TimeParser

    _csv_days(str(tmp_path / "a.csv"), ["03/03/2026"], 0)  # either order reads it alike
    _csv_days(str(tmp_path / "b.csv"), ["13/03/2026", "01/03/2026"], 1)  # only day first reads it
    zone = LandingZone(str(tmp_path), settle=0)
    files = {f.name: f for f in zone.poll()}
    stream = TimeParser()
    a = read_landed(zone.fs, files["a.csv"], text_col="text", time_col="time", time_parser=stream)
    assert stream.string_format is None and a.time_parser.string_format == "%m/%d/%Y" and a.time_alone is None
    assert "day and month order is ambiguous" in a.time_parser.notes[0]
    b = read_landed(zone.fs, files["b.csv"], text_col="text", time_col="time", time_parser=a.time_parser)
    assert b.time_parser.choices == a.time_parser.choices and b.rows.num_rows == 10  # 13 is no month
    assert b.time_alone.endswith("strings with the format '%d/%m/%Y', not '%m/%d/%Y'; 20 of its 20 rows get "
                                 "another time or none")
    alone = read_landed(zone.fs, files["b.csv"], text_col="text", time_col="time")
    assert alone.rows.num_rows == 20 and alone.time_alone is None


class _LockedFiles:
    """A landing file system on which some files cannot be opened (permission denied), as a
    file of mode 000 is for a service not running as root."""

    def __init__(self, fs, names) -> None:
        self._fs, self.locked = fs, set(names)

    def open_input_stream(self, path, *args, **kwargs):
        if os.path.basename(path) in self.locked:
            raise PermissionError(13, f"Failed to open local file '{path}'. Detail: [errno 13] Permission denied")
        return self._fs.open_input_stream(path, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._fs, name)


# ---------------------------------------------------------------------------------- service
def _land_in_order(src, land) -> None:
    """Copy the files of ``src`` into ``land`` in name order (the order they land in, which is
    the order the service takes them in: a tree copy would land them in directory order)."""
    os.makedirs(land)
    for name in sorted(os.listdir(src)):
        shutil.copy2(os.path.join(src, name), os.path.join(land, name))


def _config(landing, store, **kw) -> ServeConfig:
    base = dict(landing=str(landing), store=str(store), text_col="text", time_col="time", epoch="1d",
                poll_interval=0.05, model=dict(MODEL))
    base.update(kw)
    return ServeConfig(**base)


def _once(config, **kw) -> Service:
    service = Service(config, **kw)
    service.run(once=True, install_signals=False)
    return service


def _replay_days(source, store) -> None:
    """Replay a folder of daily files as the services they are compared with fit them."""
    replay(ReplayConfig(source=str(source), text_col="text", time_col="time", epoch="1d", model=dict(MODEL),
                        min_df=1), str(store))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Six daily files and a replay of them (whose vocabulary the service borrows)."""
    base = tmp_path_factory.mktemp("corpus")
    for d in DAYS:
        write_jsonl(f"{base}/all/day{d}.jsonl", day_rows(d, 25, 0))
    _replay_days(f"{base}/all", f"{base}/replay")
    return base


def test_a_borrowed_vocabulary_must_make_the_rows_the_model_reads(corpus, tmp_path):
    """``vocabulary_from`` a store whose vocabulary makes other rows than the service's model
    reads (raw counts for a vMF, unit rows for weighted vMF documents) is refused up front,
    naming both, rather than failing on every epoch or fitting unweighted rows silently."""
    land = tmp_path / "land"
    _land_in_order(f"{corpus}/all", land)
    with pytest.raises(StoreError, match=r"makes raw counts, but this service's model reads rows of norm "
                                         r"\(tokens / median\) \*\* 0.5"):
        _once(_config(land, tmp_path / "vmf", vocabulary_from=f"{corpus}/replay", idle_timeout=1e-3,
                      model=dict(MODEL, likelihood="vmf")))
    assert not (tmp_path / "vmf").exists() or not any((tmp_path / "vmf").iterdir())


def test_once_runs_equal_replay_and_each_other(corpus, tmp_path):
    land = tmp_path / "land"
    # one run over everything, closing the last epoch as idle; a copy of day 3 re-delivered under
    # another name is skipped, by the service and by a replay of the landing folder alike
    _land_in_order(f"{corpus}/all", land)
    shutil.copy(land / "day3.jsonl", land / "resent-day3.jsonl")
    _once(_config(land, tmp_path / "one", vocabulary_from=f"{corpus}/replay", idle_timeout=1e-3))
    assert store_epochs(tmp_path / "one") == store_epochs(f"{corpus}/replay")
    statuses = {e["name"]: e["status"] for e in read_ledger(SnapshotStore(str(tmp_path / "one"))).to_pylist()}
    assert statuses["resent-day3.jsonl"] == "duplicate"
    _replay_days(land, tmp_path / "replayed")
    assert store_epochs(tmp_path / "replayed") == store_epochs(f"{corpus}/replay")
    # files arriving in three batches, in reverse order within a batch (allowed two days late),
    # one --once run each
    land2 = tmp_path / "land2"
    os.makedirs(land2)
    for batch in ([3, 2, 1], [5, 4], [6]):
        for d in batch:
            shutil.copy(f"{corpus}/all/day{d}.jsonl", land2 / f"day{d}.jsonl")
            time.sleep(0.01)
        last = batch == [6]
        _once(_config(land2, tmp_path / "many", vocabulary_from=f"{corpus}/replay", allowed_lateness=2 * 86400,
                      idle_timeout=1e-3 if last else None))
    assert store_epochs(tmp_path / "many") == store_epochs(f"{corpus}/replay")
    ledger = read_ledger(SnapshotStore(str(tmp_path / "many")))
    files = [e for e in ledger.to_pylist() if e["kind"] == "file"]
    assert sorted(e["name"] for e in files) == [f"day{d}.jsonl" for d in DAYS]
    assert {e["status"] for e in files} == {"ingested"}
    assert [e["kind"] for e in ledger.to_pylist()].count("idle") == 1


def _partitions_config(land, store, **kw) -> ServeConfig:
    return _config(land, store, time_col="year", epoch="1y", idle_timeout=1e-3, **kw)


def _file_statuses(store) -> dict[str, tuple[str, str | None]]:
    return {e["name"]: (e["status"], e["detail"]) for e in read_ledger(SnapshotStore(str(store))).to_pylist()
            if e["kind"] == "file"}


def test_byte_identical_files_in_two_partitions_are_both_ingested(tmp_path):
    """``year=2020/part-0.parquet`` and ``year=2021/part-0.parquet`` hold the same bytes, but their
    rows are of two years: the service ingests both, and publishes the trees a replay of the folder
    does. Before, the second was a ``duplicate`` and 2021 lost its rows. A copy landed within one
    partition is still a duplicate."""
    land = tmp_path / "land"
    write_partition_copies(str(land))
    time.sleep(0.01)
    shutil.copy(land / "year=2021" / "part-0.parquet", land / "year=2021" / "part-1.parquet")
    replay(ReplayConfig(source=str(land), text_col="text", time_col="year", epoch="1y", model=dict(MODEL), min_df=1),
           str(tmp_path / "replay"))
    _once(_partitions_config(land, tmp_path / "store", vocabulary_from=str(tmp_path / "replay")))
    assert _file_statuses(tmp_path / "store") == {
        "year=2020/part-0.parquet": ("ingested", None), "year=2021/part-0.parquet": ("ingested", None),
        "year=2021/part-1.parquet": ("duplicate", "year=2021/part-0.parquet")}
    assert [e["label"] for e in SnapshotStore(str(tmp_path / "store")).epochs()] == ["2020", "2021"]
    assert store_epochs(tmp_path / "store") == store_epochs(tmp_path / "replay")


def test_a_ledger_of_byte_hashes_still_knows_a_partitioned_files_copy(tmp_path, monkeypatch):
    """A ledger written before partition keys counted holds a partitioned file's hash of its bytes
    alone. Resumed on it, the service still takes a copy of that file landed in its partition for
    a duplicate, and ingests the same bytes landed in another partition."""
    parts, land, store = tmp_path / "parts", tmp_path / "land", tmp_path / "store"
    write_partition_copies(str(parts))
    replay(ReplayConfig(source=str(parts), text_col="text", time_col="year", epoch="1y", model=dict(MODEL), min_df=1),
           str(tmp_path / "replay"))
    cfg = _partitions_config(land, store, vocabulary_from=str(tmp_path / "replay"))
    data = (parts / "year=2020" / "part-0.parquet").read_bytes()
    os.makedirs(land / "year=2020")
    (land / "year=2020" / "part-0.parquet").write_bytes(data)
    with monkeypatch.context() as m:  # the hash before partition keys counted
        m.setattr(connectors.landing, "content_digest", lambda chunks, partition_keys=None: content_digest(chunks))
        _once(cfg)
    ledger = read_ledger(SnapshotStore(str(store))).to_pylist()
    assert [(e["name"], e["sha256"]) for e in ledger if e["kind"] == "file"] == [
        ("year=2020/part-0.parquet", hashlib.sha256(data).hexdigest())]
    (land / "year=2020" / "part-1.parquet").write_bytes(data)
    os.makedirs(land / "year=2021")
    (land / "year=2021" / "part-0.parquet").write_bytes(data)
    _once(cfg)
    statuses = _file_statuses(store)
    assert statuses["year=2020/part-1.parquet"] == ("duplicate", "year=2020/part-0.parquet")
    assert statuses["year=2021/part-0.parquet"] == ("ingested", None)
    assert [e["label"] for e in SnapshotStore(str(store)).epochs()] == ["2020", "2021"]


def _trees(uri) -> list[tuple]:
    """Per published epoch: what :func:`store_epochs` compares, and the nodes' document counts."""
    store = SnapshotStore(str(uri))
    counts = [(store.read(e["epoch"]).tree.counts.tolist(), store.read(e["epoch"]).tree.subtree_counts.tolist())
              for e in store.epochs()]
    return list(zip(store_epochs(uri), counts))


def test_the_order_files_land_in_changes_no_tree(tmp_path):
    """Files each holding rows of several days, landed in two orders other than their names'
    and in batches, one --once run each: every epoch's rows are fitted in the canonical order
    (file name, then position in the file), so both services publish the trees of a replay of
    the folder (node ids, parents, counts, assignments, document ids), with no row dropped or
    fitted twice."""
    import random

    src = tmp_path / "src"
    names = ["c.jsonl", "a.jsonl", "d.jsonl", "b.jsonl"]
    for i, name in enumerate(names):
        rows = [r for d in (1, 2, 3) for r in day_rows(d, 8, seed=i + 1)]
        random.Random(i).shuffle(rows)
        write_jsonl(str(src / name), rows)
    replay(ReplayConfig(source=str(src), text_col="text", time_col="time", epoch="1d", model=dict(MODEL), min_df=1),
           str(tmp_path / "replay"))
    want = _trees(tmp_path / "replay")
    assert [len(t[0][6]) for t in want] == [32, 32, 32]
    for tag, batches in (("one", [["d.jsonl", "c.jsonl"], ["b.jsonl"], ["a.jsonl"]]),
                         ("two", [["b.jsonl"], ["d.jsonl", "a.jsonl", "c.jsonl"]])):
        land = tmp_path / f"land-{tag}"
        os.makedirs(land)
        for i, batch in enumerate(batches):
            for name in batch:
                shutil.copy(src / name, land / name)
                time.sleep(0.01)
            last = i == len(batches) - 1
            _once(_config(land, tmp_path / tag, vocabulary_from=str(tmp_path / "replay"),
                          allowed_lateness=3 * 86400, idle_timeout=1e-3 if last else None))
        assert _trees(tmp_path / tag) == want, tag
        assert store_rejects(tmp_path / tag) == []


def test_restarts_keep_no_ready_times_of_published_epochs(corpus, tmp_path):
    """A commit's state keeps the ready times of open epochs only. Before, it kept the epoch it
    published too, and a restart restored that key for good: every restart added one more key
    to the state of every later commit."""
    land, store = tmp_path / "land", tmp_path / "store"
    os.makedirs(land)
    for d in (1, 2, 3, 4):  # one --once run per landed day: three restarts that commit
        shutil.copy(f"{corpus}/all/day{d}.jsonl", land / f"day{d}.jsonl")
        _once(_config(land, store, vocabulary_from=f"{corpus}/replay"))
    last = SnapshotStore(str(store)).last_commit()
    assert last["label"] == "2026-03-03"
    assert list(last["state"]["service"]["epoch_ready_ns"]) == [str(last["key"] + 1)]  # day 4, still open


def test_idle_timeout_counts_from_arrival_not_from_modification_time(corpus, tmp_path, caplog):
    """Files copied in with their hour-old modification times kept: the stream is idle only
    --idle-timeout after they landed (their status-change time, the service's idle clock). Before,
    it counted from the preserved times and closed the newest epoch as soon as the files were taken.

    Timed on the wall clock, as the service times it: from the landing time it reads off the files
    to its log record of the idle close, written after it decided. A stopwatch started after the
    files landed started late by however long a loaded machine took to get there (and failed a
    service that was right), and counted the fits besides. The idle clock committed for a restart
    is the landing time, which fails the old defect however slow the machine."""
    land, store = tmp_path / "land", tmp_path / "store"
    os.makedirs(land)
    old = time.time() - 3600
    for d in (1, 2):
        shutil.copy(f"{corpus}/all/day{d}.jsonl", land / f"day{d}.jsonl")
        os.utime(land / f"day{d}.jsonl", (old, old))
    landed_ns = max(os.stat(land / f"day{d}.jsonl").st_ctime_ns for d in (1, 2))
    timeout = 1.5
    service = Service(_config(land, store, vocabulary_from=f"{corpus}/replay", idle_timeout=timeout))
    labels = lambda: [e["label"] for e in SnapshotStore(str(store)).epochs()]  # noqa: E731
    thread = threading.Thread(target=service.run, kwargs={"install_signals": False})
    with caplog.at_level("INFO", logger="streamtree.service"):
        thread.start()
        try:
            deadline = time.monotonic() + 120
            while len(labels()) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            service.request_stop("test")
            thread.join(120)
    assert labels() == ["2026-03-01", "2026-03-02"]  # day 2 closed by the idle timeout ...
    idle = [r for r in caplog.records if r.getMessage().startswith("stream idle for")]
    assert len(idle) == 1 and idle[0].created - landed_ns / 1e9 >= timeout  # ... counted from the arrival ...
    last = SnapshotStore(str(store)).last_commit()
    assert last["state"]["service"]["last_arrival_ns"] == landed_ns  # ... not from the modification time
    assert [e["kind"] for e in read_ledger(SnapshotStore(str(store))).to_pylist()].count("idle") == 1


def test_repeated_once_runs_close_an_idle_stream_as_one_service_would(corpus, tmp_path):
    """Cron-style --once runs: the idle clock is the files' landing time, which every run reads
    alike, so a run after the timeout closes the newest epoch, though it saw no file arrive."""
    land, store = tmp_path / "land", tmp_path / "store"
    os.makedirs(land)
    for d in (1, 2):
        shutil.copy(f"{corpus}/all/day{d}.jsonl", land / f"day{d}.jsonl")
    landed = max(os.stat(land / f"day{d}.jsonl").st_ctime for d in (1, 2))
    timeout = 30.0  # longer than the first run, which must not find the stream idle
    cfg = _config(land, store, vocabulary_from=f"{corpus}/replay", idle_timeout=timeout)
    labels = lambda: [e["label"] for e in SnapshotStore(str(store)).epochs()]  # noqa: E731
    _once(cfg)
    assert time.time() - landed < timeout and labels() == ["2026-03-01"]  # day 2 still open
    # the second run comes after the timeout (as a later cron run would): its clock reads the
    # files' landing time, not when this run saw them
    cfg = dataclasses.replace(cfg, idle_timeout=max(0.5, time.time() - landed))
    time.sleep(max(0.0, landed + cfg.idle_timeout - time.time()) + 0.1)
    _once(cfg)
    assert labels() == ["2026-03-01", "2026-03-02"]
    assert [e["kind"] for e in read_ledger(SnapshotStore(str(store))).to_pylist()].count("idle") == 1


def test_rows_the_warm_up_vocabulary_cannot_read_are_warned_about(corpus, tmp_path, caplog):
    """The vocabulary is fixed at the warm-up: a later day written in new words loses its rows to
    the reject 'empty after vocabulary filtering', and the log says so with what to do."""
    land = tmp_path / "land"
    write_jsonl(str(land / "day1.jsonl"), day_rows(1, 30, 0))
    write_jsonl(str(land / "day2.jsonl"), day_rows(2, 30, 0)[:20]
                + [{"text": "quasar nebula galaxy orbit", "time": "2026-03-02T12:00:00Z"}] * 10)
    with caplog.at_level("WARNING", logger="streamtree.service"):
        _once(_config(land, tmp_path / "store", idle_timeout=1e-3, warmup_docs=10))
    warned = [r.getMessage() for r in caplog.records if "hold no term of the store's vocabulary" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("epoch 2026-03-02: 10 of 30 rows (33%)")
    assert "--vocabulary-from" in warned[0]


def test_words_the_warm_up_vocabulary_lacks_are_named_once_they_are_common(tmp_path, caplog):
    """A new topic's documents also hold known words, so they are not rejects, but the words
    that mark them are invisible to the model: the log names those words, each once, with what
    to do. Words as rare as noise, and days written in the warm-up's words, are not named."""
    land = tmp_path / "land"
    new_topic = [{"text": f"quasar nebula galaxy {w} the people", "time": f"2026-03-0{d}T12:00:00Z"}
                 for d in (2, 3) for w in ("orbit", "comet", "pulsar", "orbit", "comet", "pulsar", "orbit", "comet")]
    write_jsonl(str(land / "day1.jsonl"), day_rows(1, 60, 0))
    write_jsonl(str(land / "day2.jsonl"), day_rows(2, 60, 0) + new_topic[:8]
                + [{"text": "tax budget zeppelin", "time": "2026-03-02T13:00:00Z"}])
    write_jsonl(str(land / "day3.jsonl"), day_rows(3, 60, 0) + new_topic[8:])
    with caplog.at_level("WARNING", logger="streamtree.service"):
        _once(_config(land, tmp_path / "store", idle_timeout=1e-3, warmup_docs=30))
    warned = [r.getMessage() for r in caplog.records if "not in the store's vocabulary" in r.getMessage()]
    assert len(warned) == 1, warned
    assert warned[0].startswith("epoch 2026-03-02: 3 words common in its 69 rows are not in the store's vocabulary")
    assert "galaxy (8), nebula (8), quasar (8);" in warned[0] and "--vocabulary-from" in warned[0]
    assert not any(w in warned[0] for w in ("zeppelin", "orbit", "comet", "pulsar"))  # in 1-3 rows a day


def test_late_duplicate_and_unreadable_files(corpus, tmp_path, caplog):
    land = tmp_path / "land"
    for d in (1, 2, 3):
        shutil.copy(f"{corpus}/all/day{d}.jsonl", land / f"day{d}.jsonl") if land.exists() else \
            (os.makedirs(land), shutil.copy(f"{corpus}/all/day{d}.jsonl", land / f"day{d}.jsonl"))
    cfg = _config(land, tmp_path / "store", vocabulary_from=f"{corpus}/replay")
    _once(cfg)
    assert [e["label"] for e in SnapshotStore(str(tmp_path / "store")).epochs()] == ["2026-03-01", "2026-03-02"]
    write_jsonl(str(land / "late.jsonl"), [{"text": "tax budget revenue", "time": "2026-03-01T05:00:00Z"},
                                           {"text": "army navy war", "time": "2026-03-03T05:00:00Z"}])
    shutil.copy(f"{corpus}/all/day1.jsonl", land / "copy-of-day1.jsonl")
    (land / "broken.parquet").write_bytes(b"PAR1 truncated")
    write_jsonl(str(land / "day4.jsonl"), day_rows(4, 25, 0))
    with caplog.at_level(logging.WARNING, logger="streamtree.service"):
        service = _once(cfg)
    assert any("broken.parquet is unreadable" in r.getMessage() and "under a new name" in r.getMessage()
               for r in caplog.records)  # what to do about it
    rejects = store_rejects(tmp_path / "store")
    assert ("late.jsonl:0", "late row for a closed epoch") in rejects
    assert any(src == "broken.parquet" and reason.startswith("unreadable file") for src, reason in rejects)
    assert not any(i.startswith("copy-of-day1") for i, _ in rejects)
    statuses = {e["name"]: e["status"] for e in read_ledger(SnapshotStore(str(tmp_path / "store"))).to_pylist()}
    assert statuses["copy-of-day1.jsonl"] == "duplicate" and statuses["broken.parquet"] == "unreadable"
    docs = [d for e in store_epochs(tmp_path / "store") for d in e[6]]
    assert "late.jsonl:1" in docs and "late.jsonl:0" not in docs
    text = service.metrics.exposition().decode()
    assert 'streamtree_rows_rejected_total{reason="late row for a closed epoch"} 1.0' in text
    assert 'streamtree_files_total{status="duplicate"} 1.0' in text


def test_a_file_changed_after_it_was_taken_is_recorded_not_read(corpus, tmp_path):
    """Each landed file is read once; new data landed under a name already taken is not read,
    and the ledger says so (once, across restarts), so nothing goes unrecorded."""
    land = tmp_path / "land"
    os.makedirs(land)
    for d in (1, 2):
        shutil.copy(f"{corpus}/all/day{d}.jsonl", land / f"day{d}.jsonl")
    cfg = _config(land, tmp_path / "store", vocabulary_from=f"{corpus}/replay")
    _once(cfg)
    write_jsonl(str(land / "day1.jsonl"), day_rows(1, 7, 0))  # re-landed under a taken name
    write_jsonl(str(land / "day3.jsonl"), day_rows(3, 25, 0))
    _once(cfg)
    write_jsonl(str(land / "day4.jsonl"), day_rows(4, 25, 0))
    _once(cfg)  # a restart: the change is not recorded again
    events = read_ledger(SnapshotStore(str(tmp_path / "store"))).to_pylist()
    changed = [e for e in events if e["kind"] == "changed"]
    assert [(e["name"], e["status"]) for e in changed] == [("day1.jsonl", "not read")]
    assert changed[0]["size"] == (land / "day1.jsonl").stat().st_size and "land new data as a new file" in changed[0]["detail"]
    assert [e["name"] for e in events if e["kind"] == "file"].count("day1.jsonl") == 1


def test_late_policy_next_epoch(corpus, tmp_path):
    land = tmp_path / "land"
    os.makedirs(land)
    for d in (1, 2, 3):
        shutil.copy(f"{corpus}/all/day{d}.jsonl", land / f"day{d}.jsonl")
    cfg = _config(land, tmp_path / "store", vocabulary_from=f"{corpus}/replay", late_policy="next-epoch",
                  idle_timeout=1e-3)
    _once(cfg)
    write_jsonl(str(land / "late.jsonl"), [{"text": "tax budget revenue", "time": "2026-03-01T05:00:00Z"}])
    write_jsonl(str(land / "day4.jsonl"), day_rows(4, 25, 0))
    _once(cfg)
    store = SnapshotStore(str(tmp_path / "store"))
    where = {d: e["label"] for e in store.epochs() for d in store.read(e["epoch"]).doc_ids}
    assert where["late.jsonl:0"] == "2026-03-04"  # the first epoch still open when it came
    assert store_rejects(tmp_path / "store") == []


def test_warmup_vocabulary_and_restart_checks(corpus, tmp_path):
    land = tmp_path / "land"
    _land_in_order(f"{corpus}/all", land)
    cfg = _config(land, tmp_path / "store", warmup_docs=60, min_df=1)
    _once(cfg)
    store = SnapshotStore(str(tmp_path / "store"))
    vec = store.vectorizer()
    assert vec is not None and vec.n_fit_documents_ == 75  # the first three closed days
    assert [e["label"] for e in store.epochs()][:3] == ["2026-03-01", "2026-03-02", "2026-03-03"]
    with pytest.raises(StoreError, match="other settings.*epoch: '1d' in the store, '1w' now"):
        Service(_config(land, tmp_path / "store", warmup_docs=60, min_df=1, epoch="1w")).run(
            once=True, install_signals=False)
    with pytest.raises(StoreError, match="not from `streamtree serve`"):
        Service(_config(land, f"{corpus}/replay")).run(once=True, install_signals=False)
    with store.writer("someone else"):
        with pytest.raises(StoreBusyError):
            Service(cfg).run(once=True, install_signals=False)


def test_a_second_signal_wrapped_by_the_engine_still_abandons_the_epoch(corpus, tmp_path, monkeypatch):
    """A second stop signal raised while the Ray engine waits for its shards comes back as a
    SystemError caused by it: the service still leaves without committing the epoch in progress."""
    import signal

    from streamtree.replay import EpochFitter

    land, store = tmp_path / "land", tmp_path / "store"
    os.makedirs(land)
    for d in (1, 2):  # day 1 closes when day 2 lands
        shutil.copy(f"{corpus}/all/day{d}.jsonl", land / f"day{d}.jsonl")
    service = Service(_config(land, store, vocabulary_from=f"{corpus}/replay"))

    def fit(fitter, ep):
        service._on_signal(signal.SIGTERM, None)  # the first: finish this epoch, then stop
        try:
            service._on_signal(signal.SIGTERM, None)  # the second: leave now
        except Exception as exc:
            raise SystemError("<built-in method __new__> returned a result with an exception set") from exc

    monkeypatch.setattr(EpochFitter, "fit", fit)
    summary = service.run(install_signals=False)
    assert summary.abandoned and summary.last_epoch is None
    assert SnapshotStore(str(store)).epochs() == []


def test_metrics_and_health_endpoint(corpus, tmp_path):
    land = tmp_path / "land"
    _land_in_order(f"{corpus}/all", land)
    service = Service(_config(land, tmp_path / "store", vocabulary_from=f"{corpus}/replay"),
                      metrics_addr=("127.0.0.1", 0))
    import threading

    th = threading.Thread(target=service.run, kwargs={"install_signals": False})
    th.start()
    try:
        deadline = time.time() + 60
        while time.time() < deadline and service.summary.epochs_published < 5:
            time.sleep(0.05)
        host, port = service.bound_address
        text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
        health = json.loads(urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=10).read())
    finally:
        service.request_stop()
        th.join(60)
    assert not th.is_alive()
    assert health["healthy"] and health["last_epoch"] == "2026-03-05"
    assert "streamtree_rows_read_total 150.0" in text
    assert "streamtree_epochs_published_total 5.0" in text
    assert "streamtree_documents_fitted_total 125.0" in text
    assert "streamtree_pending_rows 25.0" in text
    for name in ("streamtree_live_nodes", "streamtree_event_time_lag_seconds", "streamtree_seconds_since_last_commit",
                 "streamtree_checkpoint_seconds_count", "streamtree_landing_to_publish_seconds_count"):
        assert name in text


def test_a_busy_metrics_address_is_named_as_such_not_blamed_on_the_store(tmp_path, capsys):
    """A metrics port in use is an error naming the metrics address and what to do (exit 2).
    Before, it read 'snapshot store cannot listen on ...', blaming the store."""
    import logging
    import socket

    from streamtree.cli import main
    from streamtree.service import MetricsAddressError

    os.makedirs(tmp_path / "land")
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(MetricsAddressError, match=f"cannot listen on 127.0.0.1:{port} for /metrics and "
                                                      "/healthz: the port is in use"):
            Service(_config(tmp_path / "land", tmp_path / "store"), metrics_addr=("127.0.0.1", port)).run(
                once=True, install_signals=False)
        try:
            code = main(["serve", str(tmp_path / "land"), "--store", str(tmp_path / "store"), "--text-col", "text",
                         "--time-col", "time", "--metrics-addr", f"127.0.0.1:{port}", "--once"])
        finally:
            root.handlers[:], root.level = handlers, level
    err = capsys.readouterr().err
    assert code == 2 and "snapshot store" not in err
    assert err.strip().endswith(f"cannot listen on 127.0.0.1:{port} for /metrics and /healthz: the port is in use "
                                "(another service, or another streamtree serve) (--metrics-addr): choose another "
                                "--metrics-addr (HOST:PORT) or 'off'")
    assert not (tmp_path / "store").exists()  # nothing was written


def test_parse_address():
    assert parse_address("127.0.0.1:9750") == ("127.0.0.1", 9750)
    assert parse_address(":9") == ("127.0.0.1", 9)
    assert parse_address("[::1]:80") == ("::1", 80)
    assert parse_address("off") is None
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address("localhost")


def test_config_checks(tmp_path):
    with pytest.raises(ValueError, match="event-time epochs"):
        _config(tmp_path, tmp_path / "s", epoch="column")
    with pytest.raises(ValueError, match="late policy"):
        _config(tmp_path, tmp_path / "s", late_policy="drop")
    ident = _config(tmp_path, tmp_path / "s", model=dict(MODEL, engine="ray", engine_options={"address": "x"})).identity()
    assert "engine" not in ident["model"] and "engine_options" not in ident["model"]
    assert ident == _config(tmp_path, tmp_path / "other", poll_interval=9).identity()


def test_the_store_and_the_landing_directory_stay_apart(tmp_path):
    """A store inside the landing directory would have its own files read as landed data; the
    service refuses to start, and writes nothing, whichever holds the other."""
    land = tmp_path / "land"
    write_jsonl(str(land / "day1.jsonl"), day_rows(1, 10, 3))
    (tmp_path / "link").symlink_to(land)
    for store, where in ((land / "out", "is inside the"), (land, "is the"), (tmp_path / "link" / "out", "is inside the"),
                         (tmp_path, "holds the")):
        with pytest.raises(StoreError, match=f"the store {where} landing directory"):
            _once(_config(land, store))
    assert sorted(p.name for p in land.iterdir()) == ["day1.jsonl"]
    # a hidden or _-prefixed folder of the landing directory is never read: a store may live there
    _once(_config(land, land / "_stores" / "live", idle_timeout=1e-3, warmup_docs=5))
    assert sorted(p.name for p in land.iterdir()) == ["_stores", "day1.jsonl"]


def test_rows_and_rejects_outside_the_time_range_go_with_the_next_epoch(corpus, tmp_path):
    """A row dated years before --time-range and a blank row dated years after it open no
    epochs of their own and are not left pending: both are published as rejects with the first
    epoch closed."""
    land = tmp_path / "land"
    rows = day_rows(1, 25, 0) + day_rows(2, 25, 0) + day_rows(3, 25, 0)
    rows += [{"text": "tax budget revenue", "time": "2020-05-01T00:00:00Z"}, {"text": "  ", "time": "2030-05-02T00:00:00Z"}]
    write_jsonl(str(land / "days.jsonl"), rows)
    _once(_config(land, tmp_path / "store", time_range="2026-01-01..2026-12-31", idle_timeout=1e-3,
                  vocabulary_from=f"{corpus}/replay"))
    epochs = SnapshotStore(str(tmp_path / "store")).epochs()
    assert [e["label"] for e in epochs] == ["2026-03-01", "2026-03-02", "2026-03-03"]
    rejects = store_rejects(tmp_path / "store")
    assert sorted(rejects) == [("days.jsonl:75", "out of range"), ("days.jsonl:76", "empty text")]


def test_gap_in_the_stream_is_recorded_like_replay(tmp_path):
    """Days 1, 2 and 5: the quiet days 3 and 4 are recorded with day 5, as a replay does."""
    src, land = tmp_path / "src", tmp_path / "land"
    for d in (1, 2, 5):
        write_jsonl(str(src / f"day{d}.jsonl"), day_rows(d, 25, 3))
    replay(ReplayConfig(source=str(src), text_col="text", time_col="time", epoch="1d",
                        model=dict(max_depth=2, n_sweeps=3), min_df=1), str(tmp_path / "replay"))
    _land_in_order(src, land)
    _once(_config(land, tmp_path / "store", vocabulary_from=str(tmp_path / "replay"), idle_timeout=1e-3))
    assert store_epochs(tmp_path / "store") == store_epochs(tmp_path / "replay")
    last = SnapshotStore(str(tmp_path / "store")).epochs()[-1]
    assert last["epoch"] == 4 and last["empty_before"]["first"] == 2 and last["empty_before"]["last"] == 3
    served, replayed = SnapshotStore(str(tmp_path / "store")), SnapshotStore(str(tmp_path / "replay"))
    assert served.events().equals(replayed.events())
    assert_events_follow_the_published_trees(served)


def test_format_and_delimiter_read_landed_files_as_replay_reads_sources(corpus, tmp_path):
    """Semicolon-separated files with a .txt name: --format csv --delimiter ';' (as a replay's)
    give the store the same files as JSONL give."""
    import pyarrow.csv as pacsv

    land = tmp_path / "land"
    os.makedirs(land)
    for d in DAYS:
        table = pa.Table.from_pylist(day_rows(d, 25, 0))
        pacsv.write_csv(table, land / f"day{d}.txt", write_options=pacsv.WriteOptions(delimiter=";"))
    with pytest.raises(ValueError, match="delimiter is for CSV"):
        _config(land, tmp_path / "bad", format="jsonl", delimiter=";")
    _once(_config(land, tmp_path / "csv", vocabulary_from=f"{corpus}/replay", idle_timeout=1e-3, format="csv",
                  delimiter=";"))
    same = lambda epochs: [e[:-1] for e in epochs]  # noqa: E731  (not the ids, "<file>:<row>")
    assert same(store_epochs(tmp_path / "csv")) == same(store_epochs(f"{corpus}/replay"))
    assert SnapshotStore(str(tmp_path / "csv")).config()["serve"]["delimiter"] == ";"


def test_one_spelling_of_a_format_is_one_identity(tmp_path):
    """--format tsv and --format csv --delimiter tab read the same files: a restart with either
    spelling continues the store."""
    ids = {repr(_config(tmp_path, tmp_path / "s", **kw).identity())
           for kw in ({"format": "tsv"}, {"format": "csv", "delimiter": "tab"}, {"format": "csv", "delimiter": "\\t"})}
    assert len(ids) == 1


def test_repeated_texts_rejected_as_replay_does_or_kept_with_a_warning(tmp_path, caplog):
    from streamtree.records import DUPLICATE_TEXT

    src, land = tmp_path / "src", tmp_path / "land"
    for d in (1, 2):
        rows = day_rows(d, 25, 5)
        write_jsonl(str(src / f"day{d}.jsonl"), rows + rows[:10])  # 10 repeats of 35 rows a day
    model = dict(max_depth=2, n_sweeps=3)
    replay(ReplayConfig(source=str(src), text_col="text", time_col="time", epoch="1d", model=model, min_df=1,
                        duplicate_texts="reject"), str(tmp_path / "replay"))
    _land_in_order(src, land)
    _once(_config(land, tmp_path / "store", vocabulary_from=str(tmp_path / "replay"), idle_timeout=1e-3,
                  duplicate_texts="reject"))
    assert store_epochs(tmp_path / "store") == store_epochs(tmp_path / "replay")
    assert [r for _, r in store_rejects(tmp_path / "store")] == [DUPLICATE_TEXT] * 20
    # a restart with the other setting (the default) is refused, naming both values
    with pytest.raises(StoreError, match="duplicate_texts: 'reject' in the store, 'collapse' now"):
        _once(_config(land, tmp_path / "store", vocabulary_from=str(tmp_path / "replay"), idle_timeout=1e-3))
    with caplog.at_level("WARNING", logger="streamtree.service"):
        _once(_config(land, tmp_path / "kept", vocabulary_from=str(tmp_path / "replay"), idle_timeout=1e-3,
                      duplicate_texts="keep"))
    warned = [r.getMessage() for r in caplog.records if "repeat the text" in r.getMessage()]
    assert len(warned) == 2 and "10 of the 35 documents" in warned[0]
    assert store_rejects(tmp_path / "kept") == []
    # collapsed as replay collapses them: every copy published at its text's node, none filed
    replay(ReplayConfig(source=str(src), text_col="text", time_col="time", epoch="1d", model=model, min_df=1,
                        duplicate_texts="collapse"), str(tmp_path / "replay_collapsed"))
    _once(_config(land, tmp_path / "collapsed", vocabulary_from=str(tmp_path / "replay_collapsed"),
                  idle_timeout=1e-3, duplicate_texts="collapse"))
    collapsed = store_epochs(tmp_path / "collapsed")
    assert collapsed == store_epochs(tmp_path / "replay_collapsed")
    assert store_rejects(tmp_path / "collapsed") == [] and sum(len(e[-1]) for e in collapsed) == 70


def test_warm_up_counts_the_rows_that_will_be_fitted(tmp_path):
    """Under --duplicate-texts reject or collapse a copy is not a warm-up document (the vocabulary
    counts each text once, as the fit does): 2 days of 25 texts, each day with 10 copies, reach 60
    documents only when the copies count."""
    land = tmp_path / "land"
    for d in (1, 2, 3):
        rows = day_rows(d, 25, 7)
        write_jsonl(str(land / f"day{d}.jsonl"), rows + rows[:10])
    for mode, fitted in (("keep", True), ("reject", False), ("collapse", False)):
        _once(_config(land, tmp_path / mode, warmup_docs=60, duplicate_texts=mode, min_df=1))
        # day 3 stays open (no idle timeout): days 1-2 are the closed warm-up epochs
        assert (SnapshotStore(str(tmp_path / mode)).vectorizer() is not None) == fitted, mode


def test_a_file_empty_for_the_settle_time_or_marked_complete_is_taken_with_no_rows(corpus, tmp_path, caplog):
    """Spark writes empty part files for empty partitions. An empty file waited for data forever
    (a warning at every start, counted as waiting for good); one that stayed empty for the settle
    time, or whose folder holds the _SUCCESS marker a --require-success service waits for, is
    taken with no rows and ledgered as ingested. A bool column where a time belongs makes the
    file an unreadable-file reject; it stopped the service at every start."""
    land, store = tmp_path / "land", tmp_path / "store"
    os.makedirs(land / "part")
    for d in (1, 2, 3):
        shutil.copy(f"{corpus}/all/day{d}.jsonl", land / f"day{d}.jsonl")
    (land / "part" / "part-00001.jsonl").write_bytes(b"")
    old = time.time() - 3600
    os.utime(land / "part" / "part-00001.jsonl", (old, old))
    (land / "bad.jsonl").write_text('{"text": "tax budget", "time": true}\n')
    caplog.set_level("INFO")
    _once(_config(land, store, vocabulary_from=f"{corpus}/replay", idle_timeout=1e-3))
    statuses = {e["name"]: e["status"] for e in read_ledger(SnapshotStore(str(store))).to_pylist() if e["name"]}
    assert statuses["part/part-00001.jsonl"] == "ingested", statuses
    assert statuses["bad.jsonl"] != "ingested", statuses
    assert not any("cannot be read yet" in r.getMessage() for r in caplog.records)
    assert any(f.startswith("bad.jsonl") and r.startswith("unreadable file") for f, r in store_rejects(str(store)))


def test_a_file_that_cannot_be_read_yet_is_read_once_it_can_be(corpus, tmp_path, caplog):
    """A file the service may not read yet (permission denied) and a file created empty are left
    for later polls, with one warning each however many polls find them so, and read once they
    can be: their rows are published. Before, both were ledgered as unreadable at once and,
    their size and time unchanged by a chmod, never read again."""
    land, store = tmp_path / "land", tmp_path / "store"
    os.makedirs(land)
    for d in (1, 2, 3):
        shutil.copy(f"{corpus}/all/day{d}.jsonl", land / f"day{d}.jsonl")
    write_jsonl(str(land / "locked.jsonl"), day_rows(2, 10, 9))
    (land / "empty.jsonl").write_bytes(b"")
    # a settle time the test outlasts never: the empty file is still being written, not empty
    service = Service(_config(land, store, vocabulary_from=f"{corpus}/replay", allowed_lateness=86400,
                              idle_timeout=3.0, settle=60.0))
    service.landing.fs = locked = _LockedFiles(service.landing.fs, ["locked.jsonl"])
    polls = []
    poll = service.landing.poll
    service.landing.poll = lambda *a, **kw: polls.append(1) or poll(*a, **kw)
    labels = lambda: [e["label"] for e in SnapshotStore(str(store)).epochs()]  # noqa: E731

    def wait(what, done):
        deadline = time.monotonic() + 60
        while not done():
            assert time.monotonic() < deadline, what
            time.sleep(0.02)

    thread = threading.Thread(target=service.run, kwargs={"install_signals": False})
    with caplog.at_level("INFO", logger="streamtree.service"):
        thread.start()
        try:
            wait("days taken", lambda: {"day1.jsonl", "day2.jsonl", "day3.jsonl"} <= set(service._taken))
            n = len(polls)
            wait("more polls", lambda: len(polls) >= n + 5)
            assert "locked.jsonl" in service._waiting and "empty.jsonl" in service._waiting
            locked.locked.clear()  # chmod 644
            write_jsonl(str(land / "empty.jsonl"), day_rows(3, 10, 8))  # its writer is done
            wait("all published", lambda: labels() == ["2026-03-01", "2026-03-02", "2026-03-03"])
        finally:
            service.request_stop("test")
            thread.join(60)
    messages = [r.getMessage() for r in caplog.records]
    waiting = [m for m in messages if "cannot be read yet" in m]
    assert len(waiting) == 2, waiting
    assert any(m.startswith("landing: locked.jsonl cannot be read yet") and "permission denied" in m for m in waiting)
    assert any(m.startswith("landing: empty.jsonl cannot be read yet") and "it is empty" in m for m in waiting)
    assert "landing: locked.jsonl can be read now" in messages
    events = read_ledger(SnapshotStore(str(store))).to_pylist()
    statuses = [(e["name"], e["status"]) for e in events if e["kind"] == "file"]
    assert sorted(statuses) == [(f"{n}.jsonl", "ingested") for n in ("day1", "day2", "day3", "empty", "locked")]
    docs = {d for e in store_epochs(store) for d in e[6]}
    assert {f"locked.jsonl:{i}" for i in range(10)} | {f"empty.jsonl:{i}" for i in range(10)} <= docs
    assert store_rejects(store) == [] and service._waiting == {}
    assert "streamtree_files_waiting 0.0" in service.metrics.exposition().decode()


def test_files_found_together_are_taken_in_the_order_they_landed(corpus, tmp_path):
    """Files that a restart finds together (taken, uncommitted, before a kill) are taken in the
    order they landed, as the service running all along took them: day 4, then day 3 copied in
    later keeping an older modification time (cp -p), whose rows are then late. Before, a restart
    took day 3 first, by modification time, and fitted the rows the first service had rejected."""
    def land(where, d, old):
        shutil.copy(f"{corpus}/all/day{d}.jsonl", where / f"day{d}.jsonl")
        if old:
            t = time.time() - 3600
            os.utime(where / f"day{d}.jsonl", (t, t))
        time.sleep(0.01)

    cfg = dict(vocabulary_from=f"{corpus}/replay")
    for name in ("one", "restarted"):
        os.makedirs(tmp_path / name)
    for d in (1, 2):
        land(tmp_path / "one", d, False)
        land(tmp_path / "restarted", d, False)
    for name in ("one", "restarted"):
        _once(_config(tmp_path / name, tmp_path / f"{name}-store", **cfg))
    # the service running all along takes day 4, then day 3 as it lands
    land(tmp_path / "one", 4, False)
    _once(_config(tmp_path / "one", tmp_path / "one-store", **cfg))
    land(tmp_path / "one", 3, True)
    _once(_config(tmp_path / "one", tmp_path / "one-store", idle_timeout=1e-3, **cfg))
    # the restarted one finds both at once
    land(tmp_path / "restarted", 4, False)
    land(tmp_path / "restarted", 3, True)
    _once(_config(tmp_path / "restarted", tmp_path / "restarted-store", idle_timeout=1e-3, **cfg))
    assert store_epochs(tmp_path / "restarted-store") == store_epochs(tmp_path / "one-store")
    rejects = store_rejects(tmp_path / "restarted-store")
    assert rejects == store_rejects(tmp_path / "one-store") and len(rejects) == 25
    assert {r for _, r in rejects} == {"late row for a closed epoch"}


def test_a_row_dated_after_its_file_landed_is_a_future_time_reject(corpus, tmp_path, caplog):
    """A live stream cannot hold a row dated after its file landed (beyond the tolerance for
    clocks and time zones): it is a 'future time' reject, published with the next epoch, and the
    log says how many and why. Before, one row dated 2099 closed every epoch up to it (73 yearly
    epochs here, 27,000 daily ones), and made every later row late."""
    land = tmp_path / "land"
    write_jsonl(str(land / "days.jsonl"), day_rows(1, 25, 0) + day_rows(2, 25, 0)
                + [{"text": "tax budget revenue", "time": "2099-01-01T00:00:00Z"},
                   {"text": " ", "time": "2099-01-02T00:00:00Z"}])
    with caplog.at_level("WARNING", logger="streamtree.service"):
        _once(_config(land, tmp_path / "store", epoch="year", idle_timeout=1e-3, vocabulary_from=f"{corpus}/replay"))
    assert [e["label"] for e in SnapshotStore(str(tmp_path / "store")).epochs()] == ["2026"]
    assert store_rejects(tmp_path / "store") == [("days.jsonl:50", "future time"), ("days.jsonl:51", "empty text")]
    warned = [r.getMessage() for r in caplog.records if "future time" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("days.jsonl: 1 rows dated after the file landed plus "
                                                     "--future-tolerance 1d (the latest 2099-01-01T00:00:00Z)")
    # the bound is the file's landing time plus the tolerance, which an option sets or lifts
    # the guards are not part of the store's identity: their warnings say to raise them, and a
    # restart that does must not be refused as "served with other settings"
    for guard in (dict(future_tolerance=None), dict(future_tolerance=172800.0), dict(max_backlog=5000),
                  dict(id_window=20)):
        assert _config(land, tmp_path / "s", **guard).identity() == _config(land, tmp_path / "s").identity()
    assert "future_tolerance" not in _config(land, tmp_path / "s").identity()
    with pytest.raises(ValueError, match="future tolerance"):
        _config(land, tmp_path / "s", future_tolerance=-1)
    from streamtree.cli import build_parser, serve_config

    argv = ["serve", str(land), "--store", str(tmp_path / "s"), "--text-col", "text", "--time-col", "time"]
    given = serve_config(build_parser().parse_args(argv + ["--future-tolerance", "off", "--max-backlog", "7"]))
    default = serve_config(build_parser().parse_args(argv))
    assert (given.future_tolerance, given.max_backlog) == (None, 7)
    assert (default.future_tolerance, default.max_backlog) == (ServeConfig.future_tolerance, ServeConfig.max_backlog)


def test_rows_far_behind_the_watermark_do_not_open_the_first_epoch(corpus, tmp_path, caplog):
    """Until the first epoch closes, a row dated more than max_backlog epochs behind the
    watermark's epoch is 'out of range', whether it came with the bulk or alone before it, so a
    stray old row (a time of 0, a default date) cannot make the stream start years back, with an
    empty epoch for every day since."""
    land = tmp_path / "land"
    write_jsonl(str(land / "a-early.jsonl"), [{"text": "army navy war", "time": "2026-01-01T00:00:00Z"}])
    time.sleep(0.01)
    write_jsonl(str(land / "b-days.jsonl"), day_rows(1, 25, 0) + day_rows(2, 25, 0)
                + [{"text": "tax budget revenue", "time": "2026-02-01T00:00:00Z"}])
    time.sleep(0.01)
    write_jsonl(str(land / "c-day3.jsonl"), day_rows(3, 25, 0))
    with caplog.at_level("WARNING", logger="streamtree.service"):
        _once(_config(land, tmp_path / "store", max_backlog=20, vocabulary_from=f"{corpus}/replay"))
    assert [e["label"] for e in SnapshotStore(str(tmp_path / "store")).epochs()] == ["2026-03-01", "2026-03-02"]
    assert store_rejects(tmp_path / "store") == [("a-early.jsonl:0", "out of range"),
                                                 ("b-days.jsonl:50", "out of range")]
    warned = [r.getMessage() for r in caplog.records if "--max-backlog" in r.getMessage()]
    assert warned == ["after b-days.jsonl: 2 rows dated more than --max-backlog 20 epochs before the watermark's "
                      "epoch 2026-03-02 (the earliest 2026-01-01T00:00:00Z) are rejects 'out of range': the "
                      "stream's first epoch may lie no further back; raise --max-backlog to keep a longer backlog"]
    # within the bound the old row starts the stream, its quiet days recorded as a gap
    _once(_config(land, tmp_path / "kept", max_backlog=100, vocabulary_from=f"{corpus}/replay"))
    assert [e["label"] for e in SnapshotStore(str(tmp_path / "kept")).epochs()][:2] == ["2026-01-01", "2026-02-01"]


def test_the_warm_up_reads_each_queued_epoch_once_and_stops_when_asked(tmp_path, monkeypatch):
    """The warm-up counted its documents by reading every queued epoch again as each epoch
    closed: quadratic in the epochs (one row of 1970 queued 20,000 daily epochs: 14 minutes), and
    deaf to SIGTERM meanwhile. It now reads each epoch once to count, and the whole queue once to
    fit; a stop asked for during it is honoured at the next epoch, committing nothing."""
    import streamtree.service as service_module

    land = tmp_path / "land"
    write_jsonl(str(land / "days.jsonl"), [{"text": "army navy war", "time": "2026-01-01T00:00:00Z"}]
                + day_rows(1, 25, 0) + day_rows(2, 25, 0) + day_rows(3, 25, 0))
    read = []
    texts = service_module.vocabulary_texts
    monkeypatch.setattr(service_module, "vocabulary_texts", lambda eps, how: texts(read.extend(eps) or eps, how))
    _once(_config(land, tmp_path / "store", warmup_docs=50, min_df=1))
    n = 61  # 2026-01-01 to 2026-03-02, which brings the 50th document
    assert [e["label"] for e in SnapshotStore(str(tmp_path / "store")).epochs()][-1] == "2026-03-02"
    assert len(read) == 2 * n  # once to count, once to fit (it was n (n + 1) / 2 to count)
    # a stop during the warm-up
    service = Service(_config(land, tmp_path / "stopped", warmup_docs=50, min_df=1))
    read.clear()
    monkeypatch.setattr(service_module, "vocabulary_texts",
                        lambda eps, how: (len(read) == 10 and service.request_stop("test"),
                                          texts(read.extend(eps) or eps, how))[1])
    summary = service.run(once=True, install_signals=False)
    assert len(read) == 11 and summary.stopped_by == "test" and summary.last_epoch is None
    assert SnapshotStore(str(tmp_path / "stopped")).epochs() == []


def test_the_streams_time_format_is_decided_once_and_kept_on_restarts(corpus, tmp_path, caplog):
    """The first file that decides how the stream's times are read decides for every file, and
    a restart keeps it (it is committed with the state), as a replay decides once for its
    source; the choice is logged (a warning where day and month are ambiguous), and a later file
    its times alone would read otherwise is warned about. Before, each file decided alone, and
    nothing was logged: day-first dates all <= 12 read month first, the next file day first."""
    land, store = tmp_path / "land", tmp_path / "store"
    cfg = _config(land, store, vocabulary_from=f"{corpus}/replay")
    _csv_days(str(land / "a.csv"), ["03/03/2026"], 0)
    time.sleep(0.01)
    _csv_days(str(land / "b.csv"), ["04/03/2026"], 1)  # ambiguous too: April 3, month first
    with caplog.at_level("INFO", logger="streamtree.service"):
        _once(cfg)
        last = SnapshotStore(str(store)).last_commit()
        assert last["label"] == "2026-03-03"
        assert last["state"]["service"]["time_choices"] == {"number_unit": None, "string_format": "%m/%d/%Y"}
        _csv_days(str(land / "c.csv"), ["13/03/2026"], 2)  # day first only
        service = _once(cfg)  # a restart
    assert service._time_parser.string_format == "%m/%d/%Y"
    notes = [r for r in caplog.records if "time column 'time'" in r.getMessage()]
    assert [r.levelname for r in notes] == ["WARNING", "WARNING"]
    assert "day and month order is ambiguous" in notes[0].getMessage()
    assert notes[0].getMessage().endswith("decided on a.csv for the stream (and kept on restarts)")
    assert notes[1].getMessage().startswith("c.csv: time column 'time': its times would be read otherwise")
    events = [e for e in read_ledger(SnapshotStore(str(store))).to_pylist() if e["kind"] == "file"]
    assert [e["name"] for e in events] == ["a.csv", "b.csv"]  # c.csv waits in the open epochs
    assert service.summary.pending_rejects == 10 and "b.csv:0" not in {d for e in store_epochs(store) for d in e[6]}


def test_a_row_repeating_a_taken_id_is_a_duplicate_id_reject(tmp_path):
    """With --id-col, a row whose id a row took before is a 'duplicate id' reject, as in a replay
    of the same files: a re-delivery of rows waiting in an open epoch, and one of rows fitted in
    a published epoch of the window, across restarts (one --once run per file). Before, serve
    fitted every re-delivered row a second time."""
    def rows(day, n, seed):
        return [dict(r, id=f"d{day}-{i}") for i, r in enumerate(day_rows(day, n, seed))]

    src = tmp_path / "src"
    day1, day2 = rows(1, 25, 0), rows(2, 25, 0)
    files = {"day1.jsonl": day1, "day2.jsonl": day2,
             "day3.jsonl": rows(3, 25, 0) + day2[:10],  # day 2 is still open
             "day4.jsonl": rows(4, 25, 0) + day1[:5]}  # day 1 is published
    for name, r in files.items():
        write_jsonl(str(src / name), r)
    replay(ReplayConfig(source=str(src), text_col="text", time_col="time", id_col="id", epoch="1d",
                        model=dict(MODEL), min_df=1), str(tmp_path / "replay"))
    land = tmp_path / "land"
    os.makedirs(land)
    for i, name in enumerate(files):
        shutil.copy(src / name, land / name)
        _once(_config(land, tmp_path / "store", id_col="id", vocabulary_from=str(tmp_path / "replay"),
                      idle_timeout=1e-3 if i == len(files) - 1 else None))
    assert store_epochs(tmp_path / "store") == store_epochs(tmp_path / "replay")
    rejects = store_rejects(tmp_path / "store")
    assert rejects == store_rejects(tmp_path / "replay")
    assert sorted(i for i, _ in rejects) == sorted([f"d2-{i}" for i in range(10)] + [f"d1-{i}" for i in range(5)])
    assert {r for _, r in rejects} == {"duplicate id"}
    # a window of one published epoch forgets day 1 once day 2 is published: a late row of day 1
    # moved to the next open epoch is then fitted again
    land2 = tmp_path / "land2"
    _land_in_order(land, land2)
    _once(_config(land2, tmp_path / "short", id_col="id", vocabulary_from=str(tmp_path / "replay"), id_window=1,
                  late_policy="next-epoch", idle_timeout=1e-3))
    docs = [d for e in store_epochs(tmp_path / "short") for d in e[6]]
    assert docs.count("d1-0") == 2 and docs.count("d2-0") == 1


def test_of_two_rows_with_one_id_the_first_in_file_order_is_kept_whichever_landed_first(tmp_path):
    """With --id-col, two files holding rows with the same ids (a re-export, say), landed in the
    order opposite to their names', one --once run each: while both copies wait in open epochs,
    the one kept is the first in file-name order, as a replay keeps it, and the other is the
    'duplicate id' reject, so the trees do not depend on which file landed first. Before, the
    copy that landed first was kept, and the trees differed from the replay's. A copy in a
    published epoch stays (a later file's row is then the reject)."""
    def rows(name, seed):
        out = [dict(r, id=f"{name}-{d}-{i}") for d in (1, 2, 3) for i, r in enumerate(day_rows(d, 8, seed))]
        return out + [{"id": "shared-1", "text": f"tax budget from {name}", "time": "2026-03-02T05:00:00Z"},
                      {"id": "shared-2", "text": f"army navy from {name}", "time": "2026-03-03T06:00:00Z"}]

    src = tmp_path / "src"
    files = {"b.jsonl": rows("b", 1),
             "a.jsonl": rows("a", 2) + [{"id": "shared-1", "text": "a second copy in a", "time": "2026-03-01T07:00:00Z"}]}
    for name, r in files.items():
        write_jsonl(str(src / name), r)
    replay(ReplayConfig(source=str(src), text_col="text", time_col="time", id_col="id", epoch="1d",
                        model=dict(MODEL), min_df=1), str(tmp_path / "replay"))
    assert store_rejects(tmp_path / "replay") == [("shared-1", "duplicate id")] * 2 + [("shared-2", "duplicate id")]
    for tag, order in (("reversed", ["b.jsonl", "a.jsonl"]), ("named", ["a.jsonl", "b.jsonl"])):
        land = tmp_path / f"land-{tag}"
        os.makedirs(land)
        for i, name in enumerate(order):
            shutil.copy(src / name, land / name)
            _once(_config(land, tmp_path / tag, id_col="id", vocabulary_from=str(tmp_path / "replay"),
                          allowed_lateness=3 * 86400, idle_timeout=1e-3 if i == len(order) - 1 else None))
        assert _trees(tmp_path / tag) == _trees(tmp_path / "replay"), tag
        assert store_rejects(tmp_path / tag) == store_rejects(tmp_path / "replay"), tag
        store = SnapshotStore(str(tmp_path / tag))
        texts = [r["text"] for e in store.epochs() for r in (store.rejects(e["epoch"]) or pa.table({"id": []})).to_pylist()
                 if r["id"] == "shared-2"]
        assert texts == ["army navy from b"]  # b's copy is the reject, a's the document
    # day 2 published before a.jsonl lands (no lateness allowed): b's copy of shared-1 stays, a's
    # is the reject; day 3 is still open, so a's copy of shared-2 takes the place of b's
    land = tmp_path / "land-late"
    os.makedirs(land)
    write_jsonl(str(land / "b.jsonl"), files["b.jsonl"] + [{"id": "b-4", "text": "tax", "time": "2026-03-03T20:00:00Z"}])
    _once(_config(land, tmp_path / "late", id_col="id", vocabulary_from=str(tmp_path / "replay")))
    shutil.copy(src / "a.jsonl", land / "a.jsonl")
    _once(_config(land, tmp_path / "late", id_col="id", vocabulary_from=str(tmp_path / "replay"), idle_timeout=1e-3))
    store = SnapshotStore(str(tmp_path / "late"))
    rejects = sorted((r["id"], r["source"], r["reason"]) for e in store.epochs()
                     for r in (store.rejects(e["epoch"]) or pa.table({"id": []})).to_pylist() if r["id"].startswith("shared"))
    assert rejects == [("shared-1", "a.jsonl", "duplicate id")] * 2 + [("shared-2", "b.jsonl", "duplicate id")]
    docs = {d: e[1] for e in store_epochs(tmp_path / "late") for d in e[6]}
    assert docs["shared-1"] == "2026-03-02" and docs["shared-2"] == "2026-03-03"


def test_reading_a_store_before_its_first_epoch_says_why_it_is_empty(tmp_path, capsys):
    """A service still gathering its warm-up documents has published nothing: `show` says
    so, with what it waits for, where it would say 'is this a store?' of a folder of nothing."""
    from streamtree.cli import main

    land = tmp_path / "land"
    write_jsonl(str(land / "day1.jsonl"), day_rows(1, 20, 0))
    _once(_config(land, tmp_path / "store", warmup_docs=1000))
    assert main(["show", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert "no published epochs (a service writes it and has published no epoch yet" in err
    assert "--warmup-docs" in err
    (tmp_path / "nothing").mkdir()
    assert main(["show", str(tmp_path / "nothing")]) == 2
    assert "no published epochs (is this a store?" in capsys.readouterr().err
    # a path that is not there at all is a wrong path, not a folder of something else
    assert main(["show", str(tmp_path / "typo")]) == 2
    assert "no such folder: check the path" in capsys.readouterr().err


def test_a_landed_parquet_file_named_csv_is_unreadable_with_a_reason(tmp_path):
    pq.write_table(pa.table({"text": ["a b"], "time": ["2026-03-01"]}), tmp_path / "x.csv")
    zone = LandingZone(str(tmp_path), settle=0)
    with pytest.raises(LandingError, match=r"x\.csv: holds a Parquet file, not CSV as its name says"):
        read_landed(zone.fs, zone.poll()[0], text_col="text", time_col="time")
