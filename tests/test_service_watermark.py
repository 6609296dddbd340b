"""Watermark and epoch closing for the ingestion service (pure core)."""

from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pytest

from streamtree.epochs import Bucketer, EpochSpec
from streamtree.records import LATE_ROW, TIME_TYPE
from streamtree.watermark import Watermark, is_idle, parse_duration

DAY_US = 86_400_000_000


def _us(*ymd) -> int:
    return int(datetime(*ymd, tzinfo=timezone.utc).timestamp() * 1_000_000)


def _rows(times_us, start=0, source="f"):
    n = len(times_us)
    return pa.table({
        "source": pa.array([source] * n, pa.string()),
        "position": pa.array(np.arange(start, start + n), pa.int64()),
        "id": pa.array([f"{source}:{i}" for i in range(start, start + n)], pa.string()),
        "text": pa.array(["x"] * n, pa.string()),
        "time": pa.array(times_us, pa.int64()).cast(TIME_TYPE),
    })


def test_parse_duration():
    assert parse_duration("0") == 0
    assert parse_duration("90s") == 90
    assert parse_duration("15m") == 900
    assert parse_duration("2h") == 7200
    assert parse_duration("1d") == 86400
    assert parse_duration("2w") == 14 * 86400
    assert parse_duration("1y") == pytest.approx(365.2425 * 86400)
    assert parse_duration("2.5") == 2.5
    for bad in ("", "-1d", "1 day", "d", "1mo"):
        with pytest.raises(ValueError, match="duration"):
            parse_duration(bad)


def test_daily_epochs_close_when_watermark_passes_their_end():
    spec = EpochSpec.parse("1d")
    wm = Watermark(spec, allowed_lateness_us=6 * 3600 * 1_000_000)
    assert wm.closable_through() is None
    day3 = _us(2026, 3, 3)
    wm.observe(np.array([day3 + 5 * 3600 * 1_000_000]))  # 03-03 05:00, watermark 03-02 23:00
    assert wm.closable_through() == day3 // DAY_US - 2  # 03-01 closed, 03-02 still open
    wm.observe(np.array([day3 + 6 * 3600 * 1_000_000]))  # watermark exactly 03-03 00:00 = end of 03-02
    assert wm.closable_through() == day3 // DAY_US - 1
    wm.observe(np.array([day3]))  # older times do not move it back
    assert wm.closable_through() == day3 // DAY_US - 1
    # idle: the epoch holding the newest time closes too
    assert wm.closable_through(idle=True) == day3 // DAY_US


def test_calendar_epochs_and_arrow_input():
    spec = EpochSpec.parse("10y")
    wm = Watermark(spec, allowed_lateness_us=int(parse_duration("2y") * 1e6))
    wm.observe(pa.array([_us(1803, 6, 1), None], pa.int64()).cast(TIME_TYPE))
    # watermark ~1801-06: the 1790s (key 179) are closed, the 1800s open
    assert wm.closable_through() == 179
    assert wm.closable_through(idle=True) == 180
    wm2 = Watermark(spec, allowed_lateness_us=int(parse_duration("5000y") * 1e6))
    wm2.observe(np.array([_us(1803, 1, 1)]))
    assert wm2.closable_through() is None  # lateness reaches before year 1


def test_watermark_rejects_column_epochs_and_negative_lateness():
    with pytest.raises(ValueError, match="event-time"):
        Watermark(EpochSpec.parse("column"))
    with pytest.raises(ValueError, match=">= 0"):
        Watermark(EpochSpec.parse("1d"), allowed_lateness_us=-1)


def test_is_idle():
    assert not is_idle(100.0, 50.0, None)
    assert not is_idle(100.0, None, 10.0)
    assert not is_idle(100.0, 95.0, 10.0)
    assert is_idle(100.0, 90.0, 10.0)


def _stream(policy):
    spec = EpochSpec.parse("1d")
    b = Bucketer(spec)
    d0 = _us(2026, 3, 1)
    b.add(_rows([d0 + 1, d0 + DAY_US + 1], source="a"), late=policy)
    first = list(b.pop_through(d0 // DAY_US))
    b.add(_rows([d0 + 2, d0 + DAY_US + 2], source="b"), late=policy)  # one late row for 03-01
    rest = list(b.pop_through(d0 // DAY_US + 1))
    return b, first, rest


def test_late_row_is_rejected_and_counted():
    b, first, rest = _stream("reject")
    assert [e.n_rows for e in first] == [1]
    assert [e.n_rows for e in rest] == [2]
    assert b.n_late == 1
    assert rest[0].rejects.column("reason").to_pylist() == [LATE_ROW]
    assert rest[0].rejects.column("id").to_pylist() == ["b:0"]


def test_late_row_moves_to_next_epoch():
    b, first, rest = _stream("next-epoch")
    assert [e.n_rows for e in rest] == [3]
    assert b.n_late == 0 and b.n_moved == 1
    assert rest[0].rejects.num_rows == 0
    assert sorted(rest[0].rows.column("id").to_pylist()) == ["a:1", "b:0", "b:1"]


def test_bad_late_policy():
    with pytest.raises(ValueError, match="late must be one of"):
        Bucketer(EpochSpec.parse("1d")).add(_rows([0]), late="drop")


def test_bucketer_state_round_trip():
    spec = EpochSpec.parse("1d")
    d0 = _us(2026, 3, 1)
    live = Bucketer(spec)
    live.add(_rows([d0 + 1, d0 + DAY_US + 1, d0 + 2 * DAY_US], source="a"), late="next-epoch")
    list(live.pop_through(d0 // DAY_US))
    live.add(_rows([d0 + 5], source="b"), late="next-epoch")  # moved to 03-02 with its own time
    from streamtree.records import make_rejects
    live.add_rejects(make_rejects(source=["c"], position=[0], id=["c:0"], reason=["missing time"]))
    scalars, rows, rejects, unplaced = live.state()
    back = Bucketer.restore(spec, scalars, rows, rejects, unplaced)
    a = list(live.pop_through(d0 // DAY_US + 2))
    b = list(back.pop_through(d0 // DAY_US + 2))
    assert [(e.index, e.key, e.rows.column("id").to_pylist(), e.rejects.num_rows) for e in a] == \
           [(e.index, e.key, e.rows.column("id").to_pylist(), e.rejects.num_rows) for e in b]
    assert a[0].rows.column("id").to_pylist() == ["a:1", "b:0"] and a[0].rejects.num_rows == 1
    empty = Bucketer.restore(spec, *Bucketer(spec).state())
    empty.add(_rows([d0]))
    assert [e.n_rows for e in empty.pop_through(d0 // DAY_US)] == [1]
