"""Epoch specs (keys against calendar arithmetic done by hand) and bucketing."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from connectors.sources import open_source
from streamtree.epochs import (ROW_ORDER, Bucketer, EpochReader, EpochSpec, IdWindow, bucket, in_row_order,
                               suggest_epoch, time_resolution)
from streamtree.records import REJECT_SCHEMA, make_rejects

SOTU = Path(__file__).resolve().parents[1] / "examples" / "data" / "sotu_paragraphs.parquet"
UTC = timezone.utc
EPOCH0 = datetime(1970, 1, 1, tzinfo=UTC)
MONDAY0 = datetime(1969, 12, 29, tzinfo=UTC)  # the Monday of 1970-01-01's ISO week


def rows(times, texts=None, epochs=None) -> pa.Table:
    n = len(times) if times is not None else len(epochs)
    cols = {
        "source": pa.array(["mem"] * n), "position": pa.array(np.arange(n, dtype=np.int64)),
        "id": pa.array([f"d{i}" for i in range(n)]), "text": pa.array(texts or [f"text {i}" for i in range(n)]),
    }
    if times is not None:
        cols["time"] = pa.array(times, pa.timestamp("us", tz="UTC"))
    if epochs is not None:
        cols["epoch"] = pa.array(epochs, pa.int64())
    return pa.table(cols)


def random_times(rng, n, lo_year=1700, hi_year=2100):
    lo = (datetime(lo_year, 1, 1, tzinfo=UTC) - EPOCH0) // timedelta(microseconds=1)
    hi = (datetime(hi_year, 1, 1, tzinfo=UTC) - EPOCH0) // timedelta(microseconds=1)
    us = rng.integers(lo, hi, size=n)
    return [EPOCH0 + timedelta(microseconds=int(u)) for u in us]


def test_parse_kinds_and_errors():
    assert EpochSpec.parse("1h") == EpochSpec("fixed", 3_600_000_000, 0, "1h")
    assert EpochSpec.parse("2w").width == 14 * 86_400_000_000
    assert EpochSpec.parse("15m").width == 15 * 60_000_000
    assert EpochSpec.parse("decade") == EpochSpec("years", 10, 0, "decade")
    assert EpochSpec.parse("10y").kind == "years" and EpochSpec.parse("year").width == 1
    assert EpochSpec.parse("month") == EpochSpec("months", 1, 0, "month")
    assert EpochSpec.parse("3mo").width == 3
    assert EpochSpec.parse("column").kind == "column"
    assert EpochSpec.parse("1d", origin="2026-03-14T06:00").origin_us == (
        datetime(2026, 3, 14, 6, tzinfo=UTC) - EPOCH0) // timedelta(microseconds=1)
    for bad in ("", "0d", "1x", "fortnight", "-1h", "1.5h"):
        with pytest.raises(ValueError, match="epoch"):
            EpochSpec.parse(bad)
    with pytest.raises(ValueError, match="calendar"):
        EpochSpec.parse("10y", origin="2000-01-01")
    # "1M" is a month to some tools and was read as one minute: refused, naming both spellings
    assert EpochSpec.parse("15min").width == EpochSpec.parse("15m").width
    for ambiguous in ("1M", " 3M "):
        with pytest.raises(ValueError, match="ambiguous.*'(1|3)mo' for months or '(1|3)min' for minutes"):
            EpochSpec.parse(ambiguous)


@pytest.mark.parametrize("text,width", [("1h", timedelta(hours=1)), ("1d", timedelta(days=1)),
                                        ("2w", timedelta(weeks=2)), ("30s", timedelta(seconds=30))])
def test_fixed_width_keys_match_calendar_arithmetic(text, width):
    rng = np.random.default_rng(0)
    times = random_times(rng, 300)
    for origin in (None, datetime(2026, 3, 14, 6, 30, tzinfo=UTC)):
        spec = EpochSpec.parse(text, origin=origin)
        keys = spec.keys(rows(times))
        o = origin or (MONDAY0 if text.endswith("w") else EPOCH0)
        expected = [(t - o) // width for t in times]  # floor division of timedeltas
        np.testing.assert_array_equal(keys, expected)
        for k, t in zip(keys[:20], times[:20]):
            assert spec.start(k) <= t < spec.start(k) + width


def test_year_and_month_keys_and_labels():
    rng = np.random.default_rng(1)
    times = random_times(rng, 300, 1600, 2400)
    t = rows(times)
    for n in (1, 10, 25, 100):
        np.testing.assert_array_equal(EpochSpec.parse(f"{n}y").keys(t), [x.year // n for x in times])
    for n in (1, 3):
        np.testing.assert_array_equal(EpochSpec.parse(f"{n}mo").keys(t),
                                      [(12 * x.year + x.month - 1) // n for x in times])
    decade = EpochSpec.parse("10y")
    assert [decade.label(k) for k in (179, 180, 202)] == ["1790s", "1800s", "2020s"]
    assert decade.keys(rows([datetime(1799, 12, 31, 23, 59, tzinfo=UTC), datetime(1800, 1, 1, tzinfo=UTC)])).tolist() == [179, 180]
    assert EpochSpec.parse("year").label(2026) == "2026"
    assert EpochSpec.parse("25y").label(1775 // 25) == "1775-1799"
    month = EpochSpec.parse("month")
    assert month.label(2026 * 12 + 2) == "2026-03"
    assert month.start(2026 * 12 + 2) == datetime(2026, 3, 1, tzinfo=UTC)
    assert EpochSpec.parse("3mo").label((2026 * 12 + 3) // 3) == "2026-04"


@pytest.mark.parametrize("text", ["1w", "week", "2w"])
def test_week_epochs_are_iso_weeks(text):
    """Weeks run Monday 00:00 to Sunday 24:00 UTC (ISO 8601) and are labelled by their Monday;
    a one-week epoch holds exactly the times of one ISO (year, week)."""
    spec = EpochSpec.parse(text)
    times = random_times(np.random.default_rng(3), 500, 1900, 2100)
    times += [datetime(2019, 2, 10, 23, 59, 59, tzinfo=UTC), datetime(2019, 2, 11, tzinfo=UTC),
              datetime(2019, 2, 17, 23, 59, 59, tzinfo=UTC), datetime(1969, 12, 31, tzinfo=UTC)]
    keys = spec.keys(rows(times))
    weeks = spec.width // (7 * 86_400_000_000)
    for k, t in zip(keys, times):
        start = spec.start(k)
        assert start.weekday() == 0 and start.time() == datetime.min.time()
        assert start <= t < start + timedelta(weeks=weeks)
        assert spec.label(k) == start.date().isoformat()
    if weeks == 1:
        iso = [t.isocalendar()[:2] for t in times]
        assert len(set(zip(keys.tolist(), iso))) == len(set(keys.tolist())) == len(set(iso))
        assert spec.label(spec.keys(rows([datetime(2019, 2, 14, 12, tzinfo=UTC)]))[0]) == "2019-02-11"
        # Sunday night and Monday morning fall in different weeks; Monday to Sunday in one
        assert keys[-4] + 1 == keys[-3] == keys[-2]
    assert EpochSpec.parse("1w", origin="1970-01-01").label(0) == "1970-01-01"  # an origin given is kept


def test_fixed_labels():
    hour = EpochSpec.parse("1h")
    t = datetime(2026, 3, 14, 10, 42, tzinfo=UTC)
    assert hour.label(hour.keys(rows([t]))[0]) == "2026-03-14T10:00"
    day = EpochSpec.parse("1d")
    assert day.label(day.keys(rows([t]))[0]) == "2026-03-14"
    shifted = EpochSpec.parse("1d", origin="2026-01-01T06:00")
    assert shifted.label(shifted.keys(rows([t]))[0]) == "2026-03-14T06:00"
    secs = EpochSpec.parse("30s")
    assert secs.label(secs.keys(rows([datetime(2026, 3, 14, 10, 0, 45, tzinfo=UTC)]))[0]) == "2026-03-14T10:00:30"


def test_fixed_width_labels_before_year_one_and_after_9999():
    """Python's dates stop at years 1 and 9999; labels beyond them are ISO 8601 extended years
    (year 0 is 1 BC), and the keys round-trip through the rows' times."""
    week, hour = EpochSpec.parse("1w"), EpochSpec.parse("1h")
    us = np.array([-80_000_000_000_000_000, 300_000_000_000_000_000], dtype=np.int64)  # 566 BC, AD 11476
    t = pa.table({"time": pa.array(us, pa.timestamp("us", tz="UTC"))})
    for x, u in zip(week.keys(t), us):
        start = np.datetime64(week.label(x), "D")  # the label parses back (NumPy reads extended years)
        day = int(start.astype(np.int64))
        assert day * 86_400_000_000 <= u < (day + 7) * 86_400_000_000 and (day + 3) % 7 == 0  # a Monday
    assert [week.label(x)[:6] for x in week.keys(t)] == ["-566-1", "11476-"]
    assert hour.label(hour.keys(t)[0]) == "-566-11-26T01:00"
    assert week.label(0) == "1969-12-29"  # within Python's range: as before


def test_out_of_order_rows_and_empty_epochs():
    years = [1825, 1791, 1799, 1822, 1790, 1828, 1795]
    t = rows([datetime(y, 6, 1, tzinfo=UTC) for y in years])
    # Feed in two batches, in the shuffled order.
    eps = list(bucket([t.slice(0, 4).to_batches()[0], t.slice(4).to_batches()[0]], "10y"))
    assert [(e.index, e.key, e.label, e.n_rows) for e in eps] == [
        (0, 179, "1790s", 4), (1, 180, "1800s", 0), (2, 181, "1810s", 0), (3, 182, "1820s", 3)]
    # Within an epoch rows keep arrival order.
    assert eps[0].rows.column("id").to_pylist() == ["d1", "d2", "d4", "d6"]
    assert eps[3].rows.column("id").to_pylist() == ["d0", "d3", "d5"]
    assert eps[1].is_empty and eps[1].rows.schema == t.schema
    # Same groups as a brute-force grouping.
    for e in eps:
        assert sorted(e.rows.column("id").to_pylist()) == sorted(
            f"d{i}" for i, y in enumerate(years) if y // 10 == e.key)


def _file_rows(source: str, days: list[int]) -> pa.Table:
    """Rows of file ``source``, the i-th dated 2026-03-``days[i]``."""
    n = len(days)
    return pa.table({"source": pa.array([source] * n), "position": pa.array(np.arange(n, dtype=np.int64)),
                     "id": pa.array([f"{source}:{i}" for i in range(n)]), "text": pa.array(["x"] * n),
                     "time": pa.array([datetime(2026, 3, d, 12, tzinfo=UTC) for d in days],
                                      pa.timestamp("us", tz="UTC"))})


def test_epochs_come_with_their_rows_in_one_canonical_order():
    """Whatever order files arrive in, in batches, over a stream's closes or a replay's reading,
    an epoch's rows come by file name, then position in the file (ROW_ORDER): the order the
    seeded sampler visits them in. Before, a bucketer yielded them in arrival order, and only
    the service sorted them, in a place of its own."""
    days = {"b.jsonl": [2, 1, 2, 1], "a.jsonl": [1, 2, 2], "c/x.jsonl": [1, 1], "c.jsonl": [2, 1]}
    files = {name: _file_rows(name, d) for name, d in days.items()}

    def ids(names, day):  # by (file name, position): "c.jsonl" before "c/x.jsonl", as '.' < '/'
        return [f"{n}:{p}" for n in sorted(names) for p, d in enumerate(days[n]) if d == day]

    assert ids(days, 1) == ["a.jsonl:0", "b.jsonl:1", "b.jsonl:3", "c.jsonl:1", "c/x.jsonl:0", "c/x.jsonl:1"]
    for order in (["b.jsonl", "a.jsonl", "c/x.jsonl", "c.jsonl"], ["c.jsonl", "c/x.jsonl", "b.jsonl", "a.jsonl"]):
        b = Bucketer("1d")  # a stream: day 1 closes after the second file, day 2 at the end
        for i, name in enumerate(order):
            b.add(files[name].slice(0, 1))
            b.add(files[name].slice(1))
            if i == 1:
                (first,) = list(b.pop_through(b.spec.keys(_file_rows("f", [1]))[0]))
        (second,) = list(b.drain())
        assert first.rows.column("id").to_pylist() == ids(order[:2], 1)
        assert second.rows.column("id").to_pylist() == ids(days, 2)
        drained = list(bucket([files[n] for n in order], "1d"))  # all at once
        assert [e.rows.column("id").to_pylist() for e in drained] == [ids(days, 1), ids(days, 2)]
        with EpochReader([files[n] for n in order], "1d", time_range="all") as reader:  # a replay's reading
            assert [e.rows.column("id").to_pylist() for e in reader.epochs()] == [ids(days, 1), ids(days, 2)]
    # rows already in order come back as they are, not copied
    rows = pa.concat_tables([files["a.jsonl"], files["b.jsonl"]])
    assert in_row_order(rows) is rows and ROW_ORDER == (("source", "ascending"), ("position", "ascending"))


def test_a_reader_knows_the_span_and_resolution_of_its_times_for_a_better_epoch():
    """What the replay's hint on too few epochs reads: the earliest and latest time of the rows
    kept and what they are dated to, and the widest --epoch cutting them into several."""
    years = [datetime(y, 1, 1, tzinfo=UTC) for y in (1793, 1790, 1791)]
    with EpochReader([rows(years[:2]), rows(years[2:])], "10y") as reader:
        reader.scan()
        assert reader.n_epochs == 1 and reader.time_resolution == "year"
        first, last = reader.time_span_us
        assert (EPOCH0 + timedelta(microseconds=first), EPOCH0 + timedelta(microseconds=last)) == (years[1], years[0])
    assert suggest_epoch(first, last, resolution="year") == ("year", 4)  # not months no row falls in
    assert suggest_epoch(first, last) == ("6mo", 7)
    at = lambda *a: pa.array([datetime(*a, tzinfo=UTC)], pa.timestamp("us", tz="UTC"))  # noqa: E731
    assert [time_resolution(at(*a)) for a in [(1790, 3, 1), (1790, 3, 2), (1790, 3, 2, 5), (1790, 3, 2, 5, 1),
                                              (1790, 3, 2, 5, 1, 2), (1790, 3, 2, 5, 1, 2, 500)]] == \
        ["month", "1d", "1h", "1min", "1s", None]
    with EpochReader([rows(None, epochs=[1, 2])], "column") as reader:
        reader.scan()
        assert reader.time_span_us is None and reader.time_resolution is None


def test_a_readers_time_resolution_is_that_of_the_rows_kept():
    """The rows' span and what their times are dated to are both those of the rows the time range
    keeps: years, though a row out of range (rejected) is dated to the second. Before, the
    resolution was read before the range was decided, from every row (here: "1s", so that the hint
    could offer months no kept row falls in). Times under a second apart get no --epoch."""
    years = [datetime(1790 + i % 4, 1, 1, tzinfo=UTC) for i in range(40)]
    stray = [datetime(2500, 3, 2, 5, 1, 2, tzinfo=UTC)]
    with EpochReader([rows(years[:20]), rows(years[20:] + stray)], "10y") as reader:
        reader.scan()
        assert reader.key_range[1] is not None and reader.n_epochs == 1  # the stray row is out of range
        first, last = reader.time_span_us
        assert EPOCH0 + timedelta(microseconds=last) == datetime(1793, 1, 1, tzinfo=UTC)
        assert reader.time_resolution == "year"
    with EpochReader([rows(years[:20]), rows([datetime(1791, 3, 1, tzinfo=UTC)] + years[20:] + stray)], "10y") as reader:
        reader.scan()
        assert reader.time_resolution == "month"  # a kept row dated to a month
    with EpochReader([rows(years + stray)], "10y", time_range="all") as reader:
        reader.scan()
        assert reader.time_resolution == "1s"  # all kept
    t0 = int((datetime(2000, 1, 1, tzinfo=UTC) - EPOCH0) // timedelta(microseconds=1))
    assert suggest_epoch(t0 - 100_000, t0 + 100_000) is None  # straddles a second's start: 1s would make 2
    assert suggest_epoch(t0, t0 + 999_999) is None and suggest_epoch(t0, t0 + 1_000_000) == ("1s", 2)


def test_column_epochs_do_not_fill_gaps():
    t = rows(None, epochs=[1800, 1790, 1820, 1790])
    eps = list(bucket([t], "column"))
    assert [(e.index, e.key, e.label, e.n_rows) for e in eps] == [(0, 1790, "1790", 2), (1, 1800, "1800", 1), (2, 1820, "1820", 1)]
    with pytest.raises(ValueError, match="epoch_col"):
        EpochSpec.parse("column").keys(rows([datetime(2000, 1, 1, tzinfo=UTC)]))
    with pytest.raises(ValueError, match="time_col"):
        EpochSpec.parse("1d").keys(t)


def test_rejects_are_filed_under_their_epoch():
    b = Bucketer("10y")
    b.add(rows([datetime(1791, 1, 1, tzinfo=UTC), datetime(1811, 1, 1, tzinfo=UTC)]))
    b.add_rejects(make_rejects(
        source=["f", "f", "f"], position=[7, 8, 9], id=["f:7", "f:8", "f:9"],
        reason=["empty text", "missing time", "empty text"],
        time=pa.array([datetime(1812, 1, 1, tzinfo=UTC), None, datetime(1802, 1, 1, tzinfo=UTC)],
                      pa.timestamp("us", tz="UTC"))))
    eps = list(b)
    assert [e.label for e in eps] == ["1790s", "1800s", "1810s"]
    assert eps[0].rejects.column("position").to_pylist() == [8]  # key-less: first epoch
    assert eps[1].rejects.column("position").to_pylist() == [9] and eps[1].is_empty
    assert eps[2].rejects.column("position").to_pylist() == [7]
    assert all(e.rejects.schema == REJECT_SCHEMA for e in eps)


def _rejects_at(years, first=0):
    n = len(years)
    return make_rejects(source=["f"] * n, position=list(range(first, first + n)),
                        id=[f"f:{first + i}" for i in range(n)], reason=["empty text"] * n,
                        time=pa.array([datetime(y, 6, 1, tzinfo=UTC) for y in years], pa.timestamp("us", tz="UTC")))


def test_rejects_alone_open_no_epochs():
    """A reject dated far from every row opens no epoch (one blank row dated centuries away
    would otherwise bring every empty epoch in between): those before the first epoch with rows
    go with it, those after the last with the last, and nothing is lost."""
    year = lambda y: datetime(y, 6, 1, tzinfo=UTC)  # noqa: E731
    b = Bucketer("10y")
    b.add(rows([year(1991), year(2015)]))
    b.add_rejects(_rejects_at([1053, 2005, 2999]))
    eps = list(b)
    assert [e.label for e in eps] == ["1990s", "2000s", "2010s"]
    assert [e.rejects.column("position").to_pylist() for e in eps] == [[0], [1], [2]]
    # streaming: nothing to yield before the first row; then the rows' first epoch comes first
    b = Bucketer("1y")
    b.add_rejects(_rejects_at([53]))
    assert list(b.pop_through(10**6)) == [] and b.closed_through is None
    b.add(rows([year(2024), year(2026)]))
    b.add_rejects(_rejects_at([1999], first=1), place=False)  # e.g. outside a time range
    eps = list(b.pop_through(b.max_key - 1))
    assert [e.label for e in eps] == ["2024", "2025"]
    assert sorted(eps[0].rejects.column("position").to_pylist()) == [0, 1] and eps[1].rejects.num_rows == 0
    # rejects alone: no epochs, and they stay to be reported
    b = Bucketer("10y")
    b.add_rejects(_rejects_at([1999, 2999]))
    assert list(b) == [] and b.leftover_rejects().num_rows == 2

    class Log:
        def drain(self):
            return _rejects_at([1999])

    class Source(list):  # a source whose every row was rejected
        rejects = Log()

    with pytest.raises(ValueError, match=r"all 1 were rejected \(empty text\)"):
        list(bucket(Source(), "10y"))


def test_streaming_watermark_and_late_rows():
    b = Bucketer("1d")
    day = lambda d, h=12: datetime(2026, 3, d, h, tzinfo=UTC)  # noqa: E731
    assert b.max_key is None
    b.add(rows([day(1), day(3), day(2)]))
    assert b.max_key == EpochSpec.parse("1d").keys(rows([day(3)]))[0]
    first = list(b.pop_through(b.max_key - 1))
    assert [(e.label, e.n_rows) for e in first] == [("2026-03-01", 1), ("2026-03-02", 1)]
    b.add(rows([day(2, 18), day(4)]))  # the first is late: its epoch is closed
    assert b.n_late == 1
    rest = list(b.drain())
    assert [(e.index, e.label, e.n_rows) for e in rest] == [(2, "2026-03-03", 1), (3, "2026-03-04", 1)]
    assert rest[0].rejects.column("reason").to_pylist() == ["late row for a closed epoch"]
    # A watermark past the data closes empty epochs too.
    assert [e.label for e in b.pop_through(b.closed_through + 2)] == ["2026-03-05", "2026-03-06"]


def test_pop_rows_before_takes_the_old_rows_out_of_a_streams_first_epoch():
    """Before the first close, the rows of epochs before a key leave the bucketer (for the caller
    to reject) and rejects filed there go with the first epoch: one stray old row no longer makes
    the first epoch, with every empty epoch from it to the bulk."""
    b = Bucketer("1d")
    day = lambda m, d: datetime(2026, m, d, 12, tzinfo=UTC)  # noqa: E731
    b.add(rows([day(3, 2), datetime(1970, 1, 1, tzinfo=UTC), day(3, 1)]))
    b.add_rejects(_rejects_at([1971]))
    assert b.pop_rows_before(int(b.spec.keys(rows([day(1, 1)]))[0])).column("id").to_pylist() == ["d1"]
    assert b.n_rows == 2 and b.pop_rows_before(0) is None
    eps = list(b.pop_through(b.max_key))
    assert [(e.label, e.n_rows) for e in eps] == [("2026-03-01", 1), ("2026-03-02", 1)]
    assert eps[0].rejects.column("position").to_pylist() == [0]


def _scan_with_ids(b: Bucketer, ids) -> list:
    """The waiting rows holding one of ``ids``, read from every part: (key, source, position, id)."""
    return [(key, s, p, x) for key in sorted(b._rows) for part in b._rows[key].values()
            for s, p, x in zip(part.column("source").to_pylist(), part.column("position").to_pylist(),
                               part.column("id").to_pylist()) if x in ids]


def _index_from_scratch(b: Bucketer) -> dict:
    index: dict = {}
    for parts in b._rows.values():
        for number, part in parts.items():
            for x in part.column("id").to_pylist():
                index.setdefault(x, set()).add(number)
    return {x: sorted(n) for x, n in index.items()}


def test_the_waiting_ids_index_stays_that_of_the_waiting_rows(monkeypatch):
    """Looking ids up reads only the parts that hold them (not every file waiting in the open
    epochs), and the index of waiting ids stays the one a scan would build through adds, look-ups,
    pops, old rows taken out, epochs emitted, and a restore."""
    rng = np.random.default_rng(3)
    spec = EpochSpec.parse("1d")
    day0 = datetime(2026, 3, 1, 12, tzinfo=UTC)

    def file(f, n, days):
        return pa.table({"source": pa.array([f"f{f:04d}"] * n), "position": pa.array(np.arange(n, dtype=np.int64)),
                         "id": pa.array([f"x{int(i)}" for i in rng.integers(0, 60, n)]),
                         "text": pa.array(["t"] * n),
                         "time": pa.array([day0 + timedelta(days=int(d)) for d in rng.integers(0, days, n)],
                                          pa.timestamp("us", tz="UTC"))})

    def check(b):
        for ids in (["x1"], ["x2", "x3", "x2"], ["nope"]):
            got = b.waiting_with_ids(ids)
            keys = spec.keys(got) if got.num_rows else []
            assert [(int(k), s, p, x) for k, s, p, x in zip(keys, got.column("source").to_pylist(),
                    got.column("position").to_pylist(), got.column("id").to_pylist())] == _scan_with_ids(b, ids)
        assert {x: sorted(n) if isinstance(n, list) else [n] for x, n in b._id_parts.items()} == _index_from_scratch(b)
        assert set(b._part_key) == {n for parts in b._rows.values() for n in parts}

    b = Bucketer(spec)
    for f in range(40):
        b.add(file(f, 5, 3))
    calls = []
    is_in = pc.is_in
    monkeypatch.setattr(pc, "is_in", lambda *a, **k: calls.append(1) or is_in(*a, **k))
    wanted = _scan_with_ids(b, ["x7"])
    b.waiting_with_ids(["x7"])
    assert 0 < len(calls) <= len({(s, k) for k, s, _, _ in wanted}) < 40
    monkeypatch.undo()
    check(b)
    for step in range(30):
        op = step % 5
        if op == 0:
            b.add(file(100 + step, int(rng.integers(1, 8)), 4))
        elif op == 1:
            ids = ["x4", f"x{step}", "x5"]
            expected = _scan_with_ids(b, ids)
            popped = b.pop_ids(ids)
            assert list(zip(popped.column("source").to_pylist(), popped.column("position").to_pylist())) == \
                [(s, p) for _, s, p, _ in expected]
            assert _scan_with_ids(b, ids) == []
        elif op == 2 and step == 12:
            b.pop_rows_before(min(b._rows) + 1)
        elif op == 3 and step >= 18:
            list(b.pop_through(min(b._rows)))
        elif op == 4:
            state = b.state()
            b = Bucketer.restore(spec, *state)
            assert b._id_parts is None  # built again at the first look-up
        check(b)


def test_id_window_remembers_waiting_ids_and_the_last_published_epochs():
    w = IdWindow(2)
    assert w.fresh(["a", "b", "a"]).tolist() == [True, True, False]  # the first of an id is kept
    w.take(["a", "b"])
    assert w.fresh(["a", "c"]).tolist() == [False, True]
    w.release(["a", "b"])  # epoch 1 fitted: "b" was a document, "a" a reject after all
    w.publish(["b"])
    assert w.fresh(["a", "b"]).tolist() == [True, False]
    w.publish(["c"])
    w.publish(["d"])  # a window of two: "b" is forgotten
    assert w.fresh(["b", "c", "d"]).tolist() == [True, False, False] and w.n_ids == 2
    with pytest.raises(ValueError, match="at least 1 epoch"):
        IdWindow(0)


def test_sotu_decades_in_key_order():
    src = open_source(str(SOTU), "text", "year", batch_size=5000)
    eps = list(bucket(src, "decade"))
    assert len(eps) == 24
    assert [e.label for e in eps] == [f"{y}s" for y in range(1790, 2030, 10)]
    counts = dict(zip(*np.unique(pq.read_table(SOTU, columns=["decade"]).column("decade").to_numpy(), return_counts=True)))
    assert [e.n_rows for e in eps] == [counts[y] for y in range(1790, 2030, 10)]
    assert eps[1].n_rows == 221 and eps[18].n_rows == 3312
    assert sum(e.n_rows for e in eps) == 25_488


def test_epoch_reject_moves_rows_with_reason():
    from streamtree.records import EMPTY_AFTER_VOCABULARY
    from streamtree.text import TextVectorizer

    t = rows([datetime(1790 + i, 1, 1, tzinfo=UTC) for i in range(4)],
             texts=["liberty union", "the of and", "union debt", "zzz"])
    (ep,) = list(bucket([t], "decade"))
    vec = TextVectorizer(min_df=1, max_df=1.0).fit(["liberty union debt"])
    X = vec.transform(ep.rows.column("text"))
    empty = vec.empty_rows(X)
    kept = ep.reject(empty, EMPTY_AFTER_VOCABULARY)
    assert kept.rows.column("id").to_pylist() == ["d0", "d2"] and X[~empty].shape[0] == 2
    rej = kept.rejects.to_pylist()
    assert [(r["id"], r["reason"], r["text"]) for r in rej] == [
        ("d1", "empty after vocabulary filtering", "the of and"), ("d3", "empty after vocabulary filtering", "zzz")]
    assert rej[0]["time"] == datetime(1791, 1, 1, tzinfo=UTC)
    assert ep.reject(np.zeros(4, bool), "x") is ep
    with pytest.raises(ValueError, match="mask"):
        ep.reject([True], "x")


def test_repeated_texts_marks_every_copy_after_the_first():
    from streamtree.epochs import Epoch

    texts = pa.chunked_array([["a b", "c", "a b"], ["c", "a b ", "c", "A b"]])  # across chunks; exact text only
    rows = pa.table({"id": [f"r{i}" for i in range(7)], "text": texts})
    ep = Epoch(0, 0, "0", rows)
    assert ep.repeated_texts().tolist() == [False, False, True, True, False, True, False]
    assert Epoch(0, 0, "0", rows.slice(0, 0)).repeated_texts().tolist() == []
