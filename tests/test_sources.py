"""File sources: formats, column mapping, time interpretation and rejects."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
from datetime import date, datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from connectors.sources import Source, SourceError, open_source
from connectors.sources.files import (codec_of, content_digest, csv_parse_options, format_of, partition_keys,
                                     uncompressed_name)
from streamtree.records import REJECT_SCHEMA

SOTU = Path(__file__).resolve().parents[1] / "examples" / "data" / "sotu_paragraphs.parquet"
UTC = timezone.utc


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


def table3() -> pa.Table:
    return pa.table({
        "doc": ["a", "b", "c"],
        "body": ["alpha beta", "gamma delta", "epsilon"],
        "when": ["2026-03-14T10:00:00", "2026-03-15", "2026-03-16T00:00:00Z"],
    })


EXPECTED_TIMES = [utc(2026, 3, 14, 10), utc(2026, 3, 15), utc(2026, 3, 16)]


# ---- the bundled corpus -----------------------------------------------------------------
def test_sotu_reads_in_batches():
    src = open_source(str(SOTU), "text", "year", batch_size=4096)
    sizes, n, years, positions = [], 0, [], []
    for batch in src:
        assert batch.schema == src.schema
        sizes.append(batch.num_rows)
        years.append(pc.year(batch.column("time")).to_numpy())
        positions.append(batch.column("position").to_numpy())
        n += batch.num_rows
    assert n == 25_488 and src.n_read == 25_488 and src.rejects.total == 0
    assert max(sizes) <= 4096 and len(sizes) >= 25_488 // 4096
    np.testing.assert_array_equal(np.concatenate(positions), np.arange(25_488))
    raw = pq.read_table(SOTU, columns=["year", "decade"])
    np.testing.assert_array_equal(np.concatenate(years), raw.column("year").to_numpy())
    assert len(np.unique(np.concatenate(years) // 10)) == 24


def test_sotu_date_column_and_epoch_column():
    src = open_source(str(SOTU), "text", "date", id_col="fileid", epoch_col="decade")
    t = src.read_all()
    assert t.num_rows == 25_488
    first = t.slice(0, 1).to_pylist()[0]
    assert first["time"] == utc(1790, 1, 8) and first["epoch"] == 1790 and first["id"] == "1790-Washington-1"
    assert len(pc.unique(t.column("epoch"))) == 24


# ---- formats ------------------------------------------------------------------------------
def check3(src) -> None:
    t = src.read_all()
    assert t.column("id").to_pylist() == ["a", "b", "c"]
    assert t.column("text").to_pylist() == ["alpha beta", "gamma delta", "epsilon"]
    assert t.column("time").to_pylist() == EXPECTED_TIMES
    assert t.column("position").to_pylist() == [0, 1, 2]
    assert src.rejects.total == 0


def test_parquet_ipc_file_ipc_stream_jsonl_csv(tmp_path):
    t = table3()
    pq.write_table(t, tmp_path / "d.parquet")
    feather.write_feather(t, tmp_path / "d.arrow", compression="uncompressed")
    with pa.ipc.new_stream(tmp_path / "d.arrows", t.schema) as w:
        w.write_table(t)
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in t.to_pylist()) + "\n")
    (tmp_path / "d.csv").write_text("doc,body,when\n" + "\n".join(
        f"{r['doc']},{r['body']},{r['when']}" for r in t.to_pylist()) + "\n")
    for name in ("d.parquet", "d.arrow", "d.arrows", "d.jsonl", "d.csv"):
        check3(open_source(str(tmp_path / name), "body", "when", id_col="doc"))
    # A stream written under a file-format extension is recognised by its first bytes.
    (tmp_path / "s.arrow").write_bytes((tmp_path / "d.arrows").read_bytes())
    assert open_source(str(tmp_path / "s.arrow"), "body", "when").format == "ipc-stream"
    # And the file: URI form goes through pyarrow.fs.
    check3(open_source((tmp_path / "d.parquet").as_uri(), "body", "when", id_col="doc"))


def test_a_file_name_gives_its_codec_its_format_and_its_csv_delimiter():
    """A name ends in at most one compression extension, read once: the format and a CSV file's
    delimiter come from the name under it, in any case."""
    assert uncompressed_name("In/Speeches.TSV.gz") == "in/speeches.tsv"
    assert uncompressed_name("a.parquet") == "a.parquet"
    assert [codec_of(n) for n in ("a.csv.gz", "a.jsonl.BZ2", "a.csv.zst", "a.csv.lz4", "a.csv")] == [
        "gzip", "bz2", "zstd", "lz4", None]
    assert [format_of(n) for n in ("a.csv.gz", "A.TSV.bz2", "a.ndjson.zst", "a.pq", "a.arrows", "a.txt")] == [
        "csv", "csv", "jsonl", "parquet", "ipc-stream", None]
    # two compression extensions: the file is decompressed once (as gzip), which leaves lz4 data
    assert codec_of("a.csv.lz4.gz") == "gzip" and format_of("a.csv.lz4.gz") is None
    assert csv_parse_options("a.tsv.gz").delimiter == "\t" and csv_parse_options("a.csv.gz").delimiter == ","
    assert csv_parse_options("a.tsv", delimiter=";").delimiter == ";"
    assert csv_parse_options("a.csv").newlines_in_values


def test_tab_separated_files_compressed_or_not(tmp_path):
    t = table3()
    tsv = "doc\tbody\twhen\n" + "\n".join(f"{r['doc']}\t{r['body']}\t{r['when']}" for r in t.to_pylist()) + "\n"
    (tmp_path / "d.tsv").write_text(tsv)
    (tmp_path / "e.TSV.gz").write_bytes(gzip.compress(tsv.encode()))
    for name in ("d.tsv", "e.TSV.gz"):
        check3(open_source(str(tmp_path / name), "body", "when", id_col="doc"))


def test_row_positions_and_default_ids_across_row_groups(tmp_path):
    n = 23
    t = pa.table({"text": [f"doc number {i}" for i in range(n)], "year": list(range(1900, 1900 + n))})
    pq.write_table(t, tmp_path / "f.parquet", row_group_size=5)
    src = open_source(str(tmp_path / "f.parquet"), "text", "year", batch_size=3)
    batches = list(src)
    assert max(b.num_rows for b in batches) <= 3
    out = pa.Table.from_batches(batches)
    assert out.column("id").to_pylist() == [f"f.parquet:{i}" for i in range(n)]
    assert out.column("text").to_pylist() == t.column("text").to_pylist()
    assert out.column("source").to_pylist() == ["f.parquet"] * n


def test_hive_partitioned_directory(tmp_path):
    t = pa.table({"text": ["a b", "c d", "e f", "g h", "i j"], "decade": [1790, 1790, 1800, 1810, 1810],
                  "year": [1791, 1795, 1803, 1811, 1819]})
    pq.write_to_dataset(t, tmp_path / "ds", partition_cols=["decade"])
    (tmp_path / "ds" / "_SUCCESS").write_text("")  # ignored: leading underscore
    src = open_source(str(tmp_path / "ds"), "text", "year", epoch_col="decade", batch_size=2)
    out = src.read_all()
    assert out.num_rows == 5
    assert sorted(zip(out.column("epoch").to_pylist(), out.column("text").to_pylist())) == sorted(
        zip(t.column("decade").to_pylist(), t.column("text").to_pylist()))
    assert all(s.startswith("decade=") for s in out.column("source").to_pylist())
    # Ids are <relative file>:<position> and unique across files.
    ids = out.column("id").to_pylist()
    assert len(set(ids)) == 5 and all(i.split(":")[0].startswith("decade=") for i in ids)


@pytest.mark.parametrize("order", ["timestamps first", "seconds first"])
def test_parquet_files_of_one_folder_are_each_read_with_their_own_time_type(tmp_path, order):
    """Every file was cast to the first file's schema: integer seconds after a timestamp file
    were read as microseconds (all in 1970, no reject), a timestamp file after an integer one
    was rejected whole as unparsable, and a string column of zoned times after a timestamp
    file failed as "not a valid Parquet file"."""
    d = tmp_path / "mixed"
    d.mkdir()
    files = {
        "ts": pa.array([datetime(2024, 3, 1, 10, tzinfo=UTC)] * 2, pa.timestamp("us", tz="UTC")),
        "seconds": pa.array([1_709_337_600] * 2, pa.int64()),  # 2024-03-02
        "zoned_text": pa.array(["2024-03-02T19:00:00-05:00"] * 2),  # 2024-03-03 00:00 UTC
        "date": pa.array([date(2024, 3, 4)] * 2, pa.date32()),
        "naive_ms": pa.array([datetime(2024, 3, 5, 6)] * 2, pa.timestamp("ms")),
    }
    names = list(files) if order == "timestamps first" else ["seconds"] + [n for n in files if n != "seconds"]
    for i, name in enumerate(names):
        pq.write_table(pa.table({"text": ["some words", "more words"], "when": files[name]}), d / f"{i}-{name}.parquet")
    src = open_source(str(d), "text", "when")
    out = src.read_all()
    got = dict(zip(out.column("source").to_pylist(), out.column("time").to_pylist()))
    expected = {"ts": utc(2024, 3, 1, 10), "seconds": utc(2024, 3, 2), "zoned_text": utc(2024, 3, 3),
                "date": utc(2024, 3, 4), "naive_ms": utc(2024, 3, 5, 6)}
    assert out.num_rows == 10
    assert {name.split("-", 1)[1].removesuffix(".parquet"): t for name, t in got.items()} == expected


def test_spark_int96_timestamps_keep_their_year(tmp_path):
    """Spark's legacy INT96 timestamps were read in nanoseconds, whose int64 ends in 2262: a
    year-9999 'no end' date wrapped to 1816 (and a reject named that time)."""
    when = pa.array([datetime(9999, 12, 31), datetime(2024, 3, 1)], pa.timestamp("us"))
    pq.write_table(pa.table({"text": ["no end", "some words"], "when": when}), tmp_path / "spark.parquet",
                   use_deprecated_int96_timestamps=True)
    for target in (tmp_path / "spark.parquet", tmp_path):
        out = open_source(str(target), "text", "when").read_all()
        assert out.column("time").to_pylist() == [utc(9999, 12, 31), utc(2024, 3, 1)]


def test_directory_of_jsonl_files(tmp_path):
    d = tmp_path / "j"
    d.mkdir()
    (d / "b.jsonl").write_text('{"t": "second file", "y": 2001}\n')
    (d / "a.jsonl").write_text('{"t": "first file", "y": 2000}\n{"t": "still first", "y": 2000}\n')
    out = open_source(str(d), "t", "y").read_all()
    assert out.column("id").to_pylist() == ["a.jsonl:0", "a.jsonl:1", "b.jsonl:0"]


def test_a_file_holding_an_earlier_files_content_is_skipped_when_asked(tmp_path, monkeypatch):
    """Parquet files of a directory (read as one dataset): a byte copy of an earlier file is not
    read with ``skip_duplicate_files`` (as a replay reads its source) and is read without. Only
    files that may be copies are hashed: those whose size another file has."""
    pq.write_table(pa.table({"text": ["a b", "c d"], "year": [1990, 1991]}), tmp_path / "a.parquet")
    shutil.copy(tmp_path / "a.parquet", tmp_path / "b.parquet")
    pq.write_table(pa.table({"text": ["e f"], "year": [1992]}), tmp_path / "c.parquet")
    assert os.path.getsize(tmp_path / "c.parquet") != os.path.getsize(tmp_path / "a.parquet")
    hashed, digest = [], Source._digest
    monkeypatch.setattr(Source, "_digest", lambda self, path: hashed.append(os.path.basename(path)) or digest(self, path))
    src = open_source(str(tmp_path), "text", "year", skip_duplicate_files=True)
    assert src.duplicate_files == {"b.parquet": "a.parquet"} and hashed == ["a.parquet", "b.parquet"]
    assert src.read_all().column("id").to_pylist() == ["a.parquet:0", "a.parquet:1", "c.parquet:0"]
    every = open_source(str(tmp_path), "text", "year")
    assert every.duplicate_files == {} and every.read_all().num_rows == 5


def test_the_content_of_a_file_is_its_bytes_and_its_partition_keys():
    """A file's partition keys are the ``key=value`` folder names of its path (URL-decoded), the
    columns readers add to its rows; its digest is the sha256 of its bytes where it has none (as
    ledgers recorded it), and covers the keys, in any order, where it has some."""
    data = b'{"text": "a b", "time": "2020-05-01"}\n'
    assert content_digest([data]) == content_digest([data[:7], data[7:]], partition_keys={}) \
        == hashlib.sha256(data).hexdigest()
    assert partition_keys("part-0.jsonl") == partition_keys("raw/2020/part-0.jsonl") == {}
    keys = partition_keys("year=2020/raw/month=05/part-0.jsonl")
    assert keys == {"year": "2020", "month": "05"} and list(keys) == ["year", "month"]
    assert partition_keys("city=S%C3%A3o%20Paulo/x.jsonl") == {"city": "S\u00e3o Paulo"}
    in_2020 = content_digest([data], partition_keys=keys)
    in_2021 = content_digest([data], partition_keys={"year": "2021", "month": "05"})
    assert in_2020 not in (content_digest([data]), in_2021)
    assert in_2020 == content_digest([data[:3], data[3:]], partition_keys={"month": "05", "year": "2020"})
    assert len(in_2020) == 64


def test_files_in_two_partitions_are_not_copies_of_each_other(tmp_path):
    """Byte-identical files under ``year=2020`` and ``year=2021`` hold rows of two partitions: both
    are read, with ``skip_duplicate_files`` too. A copy within one partition (under another name,
    gzip-compressed) is skipped as before."""
    write = lambda path, data: (path.parent.mkdir(parents=True, exist_ok=True), path.write_bytes(data))  # noqa: E731
    data = b'{"text": "a b", "time": "2020-05-01"}\n{"text": "c d", "time": "2020-06-01"}\n'
    write(tmp_path / "year=2020" / "a.jsonl", data)
    write(tmp_path / "year=2021" / "a.jsonl", data)
    write(tmp_path / "year=2021" / "b.jsonl.gz", gzip.compress(data))
    src = open_source(str(tmp_path), "text", "time", skip_duplicate_files=True)
    assert src.duplicate_files == {"year=2021/b.jsonl.gz": "year=2021/a.jsonl"}
    assert src.read_all().column("id").to_pylist() == ["year=2020/a.jsonl:0", "year=2020/a.jsonl:1",
                                                       "year=2021/a.jsonl:0", "year=2021/a.jsonl:1"]


# ---- time interpretation ------------------------------------------------------------------
def test_time_types(tmp_path):
    n = 2
    cases = {
        "ts_naive": (pa.array([datetime(2026, 3, 14, 10), datetime(1790, 1, 8)], pa.timestamp("ns")),
                     [utc(2026, 3, 14, 10), utc(1790, 1, 8)]),
        "ts_paris": (pa.array([datetime(2026, 3, 14, 10, tzinfo=UTC)] * n, pa.timestamp("ms", tz="Europe/Paris")),
                     [utc(2026, 3, 14, 10)] * n),
        "dates": (pa.array([date(2026, 3, 14), date(1790, 1, 8)], pa.date32()), [utc(2026, 3, 14), utc(1790, 1, 8)]),
        "years": (pa.array([1790, 2026], pa.int16()), [utc(1790, 1, 1), utc(2026, 1, 1)]),
        "seconds": (pa.array([1_773_482_400, 86_400], pa.int64()), [utc(2026, 3, 14, 10), utc(1970, 1, 2)]),
        "fseconds": (pa.array([1_773_482_400.5, 0.0]), [utc(2026, 3, 14, 10, 0, 0, 500_000), utc(1970, 1, 1)]),
        "iso_offset": (pa.array(["2026-03-14T12:00:00+02:00", " 1790-01-08 "]), [utc(2026, 3, 14, 10), utc(1790, 1, 8)]),
        "year_text": (pa.array(["1790", "2026"]), [utc(1790, 1, 1), utc(2026, 1, 1)]),
        # were read as seconds: every such date fell in 1970-1973, one epoch of a daily replay
        "yyyymmdd": (pa.array([20240229, 19991231], pa.int64()), [utc(2024, 2, 29), utc(1999, 12, 31)]),
        # seconds of 1970-1973 that are not dates stay seconds
        "seconds_1970": (pa.array([20_245_431, 20_249_999], pa.int64()),
                         [utc(1970, 8, 23, 7, 43, 51), utc(1970, 8, 23, 8, 59, 59)]),
    }
    cols = {"text": ["some words", "more words"]}
    cols.update({k: v for k, (v, _) in cases.items()})
    pq.write_table(pa.table(cols), tmp_path / "t.parquet")
    for name, (_, expected) in cases.items():
        out = open_source(str(tmp_path / "t.parquet"), "text", name).read_all()
        assert out.column("time").to_pylist() == expected, name
    # Forced units.
    pq.write_table(pa.table({"text": ["x y"], "ms": [86_400_000], "y": [12]}), tmp_path / "u.parquet")
    assert open_source(str(tmp_path / "u.parquet"), "text", "ms", time_unit="ms").read_all()["time"].to_pylist() == [utc(1970, 1, 2)]
    assert open_source(str(tmp_path / "u.parquet"), "text", "y", time_unit="s").read_all()["time"].to_pylist() == [utc(1970, 1, 1, 0, 0, 12)]
    # a forced YYYYMMDD reading rejects what is not a date (31 April), and --time-unit s keeps seconds
    pq.write_table(pa.table({"text": ["x y", "z w"], "d": [20240301, 20240431]}), tmp_path / "d.parquet")
    src = open_source(str(tmp_path / "d.parquet"), "text", "d", time_unit="yyyymmdd")
    assert src.read_all()["time"].to_pylist() == [utc(2024, 3, 1)] and src.rejects.drain().num_rows == 1
    assert open_source(str(tmp_path / "d.parquet"), "text", "d", time_unit="s").read_all()["time"].to_pylist() == [
        utc(1970, 8, 23, 6, 18, 21), utc(1970, 8, 23, 6, 20, 31)]


# ---- bad input ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["m.parquet", "m.csv", "m.jsonl", "m.arrow"])
def test_missing_column_names_it_and_lists_present(tmp_path, name):
    t = pa.table({"body": ["x"], "when": ["2026-01-01"]})
    path = tmp_path / name
    if name.endswith(".parquet"):
        pq.write_table(t, path)
    elif name.endswith(".arrow"):
        feather.write_feather(t, path)
    elif name.endswith(".csv"):
        path.write_text("body,when\nx,2026-01-01\n")
    else:
        path.write_text('{"body": "x", "when": "2026-01-01"}\n')
    with pytest.raises(SourceError) as err:
        open_source(str(path), "text", "when")
    msg = str(err.value)
    assert "text column 'text' not found" in msg and "'body'" in msg and "'when'" in msg
    with pytest.raises(SourceError, match="id column 'doc_id' not found"):
        open_source(str(path), "body", "when", id_col="doc_id")


def test_a_text_column_of_token_lists_says_to_join_them(tmp_path):
    path = tmp_path / "tokens.parquet"
    pq.write_table(pa.table({"tokens": [["storm", "rain"], ["goal"]], "year": [1800, 1801]}), path)
    with pytest.raises(SourceError, match=r"text column 'tokens' holds lists \(list<.*join each row's tokens"):
        open_source(str(path), "tokens", "year").read_all()


def test_not_parquet_and_corrupt_files(tmp_path):
    bogus = tmp_path / "fake.parquet"
    bogus.write_text("text,year\nhello,1790\n")
    with pytest.raises(SourceError) as err:
        open_source(str(bogus), "text", "year").read_all()
    assert str(bogus) in str(err.value) and "Parquet" in str(err.value)
    assert err.value.path == str(bogus)

    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"text": [f"w{i} x" for i in range(2000)], "year": [1800] * 2000}), good)
    data = good.read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceError, match="cut.parquet"):
        open_source(str(cut), "text", "year").read_all()
    # Footer intact, page data scrambled: the failure shows up while reading batches.
    scrambled = bytearray(data)
    scrambled[8:len(data) // 2] = bytes(len(data) // 2 - 8)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(scrambled))
    with pytest.raises(SourceError, match="bad.parquet"):
        open_source(str(bad), "text", "year").read_all()

    arrow = tmp_path / "junk.arrow"
    arrow.write_bytes(b"definitely not arrow data")
    with pytest.raises(SourceError, match="junk.arrow"):
        open_source(str(arrow), "text", "year").read_all()
    unknown = tmp_path / "mystery.bin"
    unknown.write_bytes(b"\x00\x01\x02 nothing")
    with pytest.raises(SourceError, match="unknown file type"):
        open_source(str(unknown), "text", "year")
    with pytest.raises(SourceError, match="no such file"):
        open_source(str(tmp_path / "absent.parquet"), "text", "year")


def test_bad_times_and_empty_text_become_rejects(tmp_path):
    t = pa.table({
        "text": ["fine one", "no time", "blank time", "bad time", "bad month", "   ", None, "", "fine two"],
        "when": ["2026-03-14", None, "  ", "17 Brumaire", "2026-13-01", "2026-03-14", "2026-03-14",
                 None, "2026-03-15T08:30"],
    })
    pq.write_table(t, tmp_path / "r.parquet")
    src = open_source(str(tmp_path / "r.parquet"), "text", "when")
    good = src.read_all()
    assert good.column("text").to_pylist() == ["fine one", "fine two"]
    rej = src.rejects.table()
    assert rej.schema == REJECT_SCHEMA
    assert rej.column("position").to_pylist() == [1, 2, 3, 4, 5, 6, 7]
    assert rej.column("reason").to_pylist() == [
        "missing time", "missing time", "unparsable time '17 Brumaire'", "unparsable time '2026-13-01'",
        "empty text", "empty text", "empty text"]
    assert rej.column("text").to_pylist()[:2] == ["no time", "blank time"]
    # Empty-text rejects keep their (valid) time so they can be filed under their epoch.
    assert rej.column("time").to_pylist()[4:6] == [utc(2026, 3, 14)] * 2
    assert dict(src.rejects.counts) == {"missing time": 2, "unparsable time": 2, "empty text": 3}
    assert src.n_read == 9 and src.n_rows == 2


def test_numeric_time_rejects(tmp_path):
    pq.write_table(pa.table({"text": ["a b"] * 4, "t": [1.0e9, float("nan"), float("inf"), None]}), tmp_path / "n.parquet")
    src = open_source(str(tmp_path / "n.parquet"), "text", "t")
    assert src.read_all().num_rows == 1
    assert src.rejects.table().column("reason").to_pylist() == ["missing time", "unparsable time 'inf'", "missing time"]


def test_invalid_utf8_parquet_binary_column(tmp_path):
    t = pa.table({"text": pa.array([b"caf\xc3\xa9 ok", b"bad \xff\xfe bytes", b"fine"], pa.binary()),
                  "year": [1800, 1801, 1802]})
    pq.write_table(t, tmp_path / "b.parquet")
    src = open_source(str(tmp_path / "b.parquet"), "text", "year")
    assert src.read_all().column("text").to_pylist() == ["café ok", "fine"]
    rej = src.rejects.table().to_pylist()
    assert [(r["position"], r["reason"], r["text"]) for r in rej] == [(1, "invalid UTF-8", None)]


def test_invalid_utf8_csv(tmp_path):
    path = tmp_path / "u.csv"
    path.write_bytes(b"id,text,year\n1,good words,1790\n2,\"bad \xff word\",1791\n3,,1792\n4,more words,1793\n")
    src = open_source(str(path), "text", "year", id_col="id")
    out = src.read_all()
    assert out.column("id").to_pylist() == ["1", "4"]
    rej = src.rejects.table().to_pylist()
    assert [(r["id"], r["position"], r["reason"]) for r in rej] == [("2", 1, "invalid UTF-8"), ("3", 2, "empty text")]
    assert out.column("time").to_pylist() == [utc(1790, 1, 1), utc(1793, 1, 1)]


def test_invalid_utf8_jsonl(tmp_path):
    path = tmp_path / "u.jsonl"
    path.write_bytes(b'{"text": "ok one", "t": "2026-01-01"}\n{"text": "bad \xff\xfe", "t": "2026-01-02"}\n'
                     b'{"text": "ok two", "t": "2026-01-03"}\n{"text": "no time"}\n')
    src = open_source(str(path), "text", "t")
    assert src.read_all().column("text").to_pylist() == ["ok one", "ok two"]
    rej = src.rejects.table().to_pylist()
    assert [(r["position"], r["reason"], r["id"]) for r in rej] == [
        (1, "invalid UTF-8", "u.jsonl:1"), (3, "missing time", "u.jsonl:3")]
    assert rej[0]["time"] == utc(2026, 1, 2)


def test_missing_ids_and_bad_epochs_are_rejected(tmp_path):
    pq.write_table(pa.table({"text": ["a b", "c d", "e f", "g h"], "id": ["x", None, "z", "w"],
                             "ep": ["3", "4", "third", None]}), tmp_path / "e.parquet")
    src = open_source(str(tmp_path / "e.parquet"), "text", None, id_col="id", epoch_col="ep")
    out = src.read_all()
    assert out.column("epoch").to_pylist() == [3] and out.column("id").to_pylist() == ["x"]
    assert src.rejects.table().column("reason").to_pylist() == ["missing id", "unparsable epoch 'third'", "missing epoch"]


def test_argument_validation():
    with pytest.raises(ValueError, match="time_col, epoch_col"):
        open_source(str(SOTU), "text", None)
    with pytest.raises(ValueError, match="batch_size"):
        open_source(str(SOTU), "text", "year", batch_size=0)
    with pytest.raises(ValueError, match="time_unit"):
        open_source(str(SOTU), "text", "year", time_unit="fortnights")
    with pytest.raises(SourceError, match="text column 'year' has type int64"):
        open_source(str(SOTU), "year", "year").read_all()


def test_year_unit_out_of_range_and_source_rejects_follow_their_epochs(tmp_path):
    from streamtree.epochs import bucket

    pq.write_table(pa.table({
        "text": ["early words", "", "late words", "lost words", "far words"],
        "year": [1791, 1805, 1823, None, 123_456],
    }), tmp_path / "y.parquet")
    src = open_source(str(tmp_path / "y.parquet"), "text", "year", time_unit="year")
    eps = list(bucket(src, "decade"))
    assert [(e.label, e.n_rows) for e in eps] == [("1790s", 1), ("1800s", 0), ("1810s", 0), ("1820s", 1)]
    # Key-less rejects ride with the first epoch; the empty text one with its own decade.
    assert eps[0].rejects.column("reason").to_pylist() == ["missing time", "unparsable time '123456'"]
    assert eps[1].rejects.column("reason").to_pylist() == ["empty text"]
    assert dict(src.rejects.counts) == {"empty text": 1, "missing time": 1, "unparsable time": 1}


def test_malformed_and_type_changing_jsonl_name_the_file_and_line(tmp_path, monkeypatch):
    """pyarrow counts the row it fails on from the start of its block; the error names the
    file's own line (1-based), and what to do."""
    import connectors.sources.files as files

    monkeypatch.setattr(files, "_BLOCK_BYTES", 4096)
    good = "".join(f'{{"text": "a b", "t": "{1790 + i % 50}"}}\n' for i in range(3000))
    broken = tmp_path / "broken.jsonl"
    broken.write_text(good + '{"text": "c d",\n' + good)
    with pytest.raises(SourceError, match=r"broken.jsonl: .*line 3001, column 16: not valid JSON"):
        open_source(str(broken), "text", "t").read_all()
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(good + '\n{"text": "c d", "t": 1791}\n')  # a blank line counts as a line
    with pytest.raises(SourceError, match=r"mixed.jsonl: .*line 3002: field 't' is a number \(1791\) where line 1 "
                                          r"has a string.*write every 't' as a string"):
        open_source(str(mixed), "text", "t").read_all()
    listed = tmp_path / "listed.jsonl"
    listed.write_text('{"text": "a b", "t": 1790}\n[1, 2]\n')
    with pytest.raises(SourceError, match=r"line 2 is not a JSON object \(list\)"):
        open_source(str(listed), "text", "t").read_all()


def test_a_bad_time_after_the_first_jsonl_block_is_one_reject(tmp_path, monkeypatch):
    """pyarrow types a JSON field from the first block; a later time it cannot convert used to
    fail the whole file. It is one rejected row, and times in other forms still read."""
    import connectors.sources.files as files

    monkeypatch.setattr(files, "_BLOCK_BYTES", 1024)  # so that the file spans several blocks
    times = ["2020-01-01T23:30:00Z"] * 60 + ["n/a", "2020-01-02T10:00:00.5Z", "2020-01-03T08:00:00+02:00"]
    path = tmp_path / "late.jsonl"
    path.write_text("".join(json.dumps({"text": f"row {i}", "t": t}) + "\n" for i, t in enumerate(times)))
    src = open_source(str(path), "text", "t")
    good = src.read_all()
    assert good.num_rows == 62 and src.n_read == 63
    assert src.rejects.table().column("position").to_pylist() == [60]
    assert src.rejects.table().column("reason").to_pylist() == ["unparsable time 'n/a'"]
    assert good.column("time").to_pylist()[-2:] == [datetime(2020, 1, 2, 10, 0, 0, 500000, tzinfo=timezone.utc),
                                                    datetime(2020, 1, 3, 6, 0, tzinfo=timezone.utc)]


def test_directory_file_missing_a_column_is_named(tmp_path):
    d = tmp_path / "dd"
    d.mkdir()
    pq.write_table(pa.table({"text": ["a b"], "year": [1790]}), d / "a.parquet")
    pq.write_table(pa.table({"body": ["c d"], "year": [1791]}), d / "b.parquet")
    with pytest.raises(SourceError, match=r"b\.parquet: text column 'text' not found; columns present: 'body', 'year'"):
        open_source(str(d), "text", "year").read_all()



def test_iso_string_variants():
    from connectors.sources.times import to_utc_timestamps

    cases = {
        "2026-03-14T10:00:00+0200": utc(2026, 3, 14, 8),
        "2026-03-14T10:00+02": utc(2026, 3, 14, 8),
        "2026-03-14T10:00Z": utc(2026, 3, 14, 10),
        "2026-03-14T10:00:00.123456789Z": utc(2026, 3, 14, 10, 0, 0, 123456),
        "2026-03-14 10:00:00 UTC": utc(2026, 3, 14, 10),
        "2026-03-14T10:00:00.5-01:30": utc(2026, 3, 14, 11, 30, 0, 500000),
        "2026-03": utc(2026, 3, 1),
    }
    times, missing, bad = to_utc_timestamps(pa.array(list(cases) + ["2026-13-01", "2026-02-30", None, " "]))
    assert times.to_pylist()[: len(cases)] == list(cases.values())
    assert bad.tolist() == [False] * len(cases) + [True, True, False, False]
    assert missing.tolist() == [False] * len(cases) + [False, False, True, True]
    # Numbers in strings follow the column's unit: years here, seconds there.
    assert to_utc_timestamps(pa.array(["0800", "1790"]))[0].to_pylist() == [utc(800, 1, 1), utc(1790, 1, 1)]
    assert to_utc_timestamps(pa.array(["-1.5", "1773482400"]))[0].to_pylist() == [
        utc(1969, 12, 31, 23, 59, 58, 500000), utc(2026, 3, 14, 10)]


def test_a_folder_may_mix_formats_and_other_files(tmp_path, caplog):
    """A folder of CSV, JSON Lines, Parquet (one under a hive folder) and Arrow files is read as a
    service's landing reads it: every file in its own format, in path order, hive keys included;
    a file that is not a data file (no known extension) is left out with a warning and a note.
    ``--format`` still reads every file as that one format."""
    root = tmp_path / "mixed"
    (root / "year=2021").mkdir(parents=True)
    (root / "a.csv").write_text("text,year\nalpha beta,2020\ngamma delta,2020\n")
    (root / "b.jsonl").write_text(json.dumps({"text": "epsilon zeta", "year": 2020}) + "\n")
    pq.write_table(pa.table({"text": ["eta theta", "iota kappa"]}), root / "year=2021" / "c.parquet")
    feather.write_feather(pa.table({"text": ["lambda mu"], "year": [2022]}), root / "d.arrow")
    (root / "README.txt").write_text("where these came from")
    with caplog.at_level("WARNING", logger="connectors.sources.files"):
        src = open_source(str(root), "text", "year", time_unit="year")
    assert src.format == "mixed" and src.ignored == ["README.txt"]
    assert any("ignoring 1 file that is not a data file" in r.getMessage() and "README.txt" in r.getMessage()
               for r in caplog.records)
    assert any("ignored 1 file" in n and "README.txt" in n for n in src.notes)
    rows = src.read_all()
    assert rows.column("source").to_pylist() == ["a.csv", "a.csv", "b.jsonl", "d.arrow", "year=2021/c.parquet",
                                                 "year=2021/c.parquet"]
    assert rows.column("text").to_pylist() == ["alpha beta", "gamma delta", "epsilon zeta", "lambda mu",
                                               "eta theta", "iota kappa"]
    assert [t.year for t in rows.column("time").to_pylist()] == [2020, 2020, 2020, 2022, 2021, 2021]
    assert src.rejects.total == 0
    # a mapped column missing from one format's files names that file
    (root / "b.jsonl").write_text(json.dumps({"body": "epsilon zeta", "year": 2020}) + "\n")
    with pytest.raises(SourceError, match=r"b\.jsonl: text column 'text' not found"):
        open_source(str(root), "text", "year", time_unit="year").read_all()
    # --format: every file is read as that format, so the others are reported, not skipped
    with pytest.raises(SourceError, match="not a valid or readable"):
        open_source(str(root), "text", "year", time_unit="year", format="csv").read_all()
    # a folder with no data file at all says what it holds
    other = tmp_path / "notes"
    other.mkdir()
    (other / "README.txt").write_text("nothing here")
    with pytest.raises(SourceError, match="holds no data files .*README.txt.*--format"):
        open_source(str(other), "text", "year")


def test_a_file_named_for_another_format_or_delimiter_gets_an_error_that_says_so(tmp_path):
    """A Parquet file named .csv (or .jsonl) would list its binary header as column names, and a
    semicolon-separated CSV read with commas has one column: each error says what is wrong."""
    pq.write_table(pa.table({"text": ["a b"], "year": [2020]}), tmp_path / "data.csv")
    with pytest.raises(SourceError, match=r"data\.csv: holds a Parquet file, not CSV as its name says: rename "
                                          r"it to end in \.parquet, or pass --format parquet"):
        open_source(str(tmp_path / "data.csv"), "text", "year")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.jsonl").write_text(json.dumps({"text": "a b", "year": 2020}) + "\n")
    feather.write_feather(pa.table({"text": ["c d"], "year": [2021]}), folder / "b.jsonl")
    with pytest.raises(SourceError, match=r"b\.jsonl: holds an Arrow IPC file, not JSON Lines"):
        open_source(str(folder), "text", "year").read_all()
    (tmp_path / "semi.csv").write_text("text;year\nalpha beta;2020\n")
    with pytest.raises(SourceError, match="the header reads as one column, so the file may be delimited by ';': "
                                          "pass --delimiter ';'"):
        open_source(str(tmp_path / "semi.csv"), "text", "year")
    assert open_source(str(tmp_path / "semi.csv"), "text", "year", delimiter=";").read_all().num_rows == 1
