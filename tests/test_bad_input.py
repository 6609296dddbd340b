"""Bad input, end to end: every case names the problem, and every record is accounted for
(documents fitted + rejects = records read)."""

from __future__ import annotations

import json
import os
import signal
import time
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from service_corpus import assert_events_follow_the_published_trees

from connectors.sources import open_source
from connectors.stores import SnapshotStore
from streamtree.cli import main
from streamtree.epochs import EpochReader, EpochSpec, TimeRange
from streamtree.records import DUPLICATE_ID, MISSING_TIME, OUT_OF_RANGE, UNPARSABLE_TIME
from streamtree.replay import ReplayConfig, replay

WORDS = ["war army navy peace treaty", "taxes revenue debt treasury money", "war navy ships sailors ocean",
         "money bank credit loans debt", "peace treaty nations war army", "treasury taxes money revenue bank"]


def corpus(path, times, *, ids=None, extra=None):
    n = len(times)
    cols = {"text": [WORDS[i % len(WORDS)] for i in range(n)], "when": times}
    if ids is not None:
        cols["doc_id"] = ids
    cols.update(extra or {})
    pq.write_table(pa.table(cols), path)
    return path


def run(path, store, **kw):
    base = dict(source=str(path), text_col="text", time_col="when", epoch="10y", min_df=1, max_df=1.0,
                model={"n_sweeps": 2, "kappa0": 100.0, "random_state": 0})
    base.update(kw)
    summary = replay(ReplayConfig(**base), str(store))
    assert summary.n_documents + summary.n_rejects == summary.n_records
    return summary


def stored_rejects(store) -> dict[str, str]:
    s = SnapshotStore(str(store))
    out = {}
    for e in s.epochs():
        rj = s.rejects(e["epoch"])
        if rj is not None:
            out.update(zip(rj.column("id").to_pylist(), rj.column("reason").to_pylist()))
    return out


def test_float_years_with_a_gap_are_years_and_said(tmp_path):
    # what pandas writes for a year column with one missing value
    times = [1791.0, 1795.0, np.nan, 1801.0, 1805.0, 1812.0] * 4
    summary = run(corpus(tmp_path / "c.parquet", times), tmp_path / "s")
    assert [e["label"] for e in SnapshotStore(str(tmp_path / "s")).epochs()] == ["1790s", "1800s", "1810s"]
    assert summary.rejects == {MISSING_TIME: 4}
    assert any("numbers read as calendar years" in n and "1791" in n for n in summary.notes)


def test_a_bad_year_is_rejected_not_read_as_1970(tmp_path):
    times = [1791, 1795, 1801, 1805, 19995] + [1812] * 20
    summary = run(corpus(tmp_path / "c.parquet", times), tmp_path / "s")
    assert summary.rejects == {UNPARSABLE_TIME: 1}
    assert "unparsable time '19995'" in stored_rejects(tmp_path / "s").values()


def test_common_date_formats_are_detected(tmp_path):
    times = ["2017/2/7", "2017/2/8", "2017/3/1", "2017/12/31", "not a date"] * 5
    summary = run(corpus(tmp_path / "c.parquet", times), tmp_path / "s", epoch="month")
    assert summary.rejects == {UNPARSABLE_TIME: 5}
    assert [e["label"] for e in SnapshotStore(str(tmp_path / "s")).epochs()][:2] == ["2017-02", "2017-03"]
    assert any("'%Y/%m/%d'" in n and "auto-detected" in n for n in summary.notes)


def test_rfc_2822_dates_with_zone_offsets_are_detected():
    """Mail, RSS, git and Debian changelogs write "Tue, 20 Sep 2022 12:17:15 -0400": read in UTC."""
    from connectors.sources.times import TimeParser

    parser = TimeParser()
    times, missing, bad = parser.parse(pa.array(["Tue, 20 Sep 2022 12:17:15 -0400", "Mon, 22 Aug 2022 22:28:58 +0100",
                                                 "1 Jan 2023 00:30:00 +0100", None]))
    assert missing.tolist() == [False, False, False, True] and bad.tolist() == [False, False, True, False]
    want = [datetime(2022, 9, 20, 16, 17, 15, tzinfo=timezone.utc),
            datetime(2022, 8, 22, 21, 28, 58, tzinfo=timezone.utc)]
    assert times.to_pylist()[:2] == want
    assert any("%a, %d %b %Y %H:%M:%S %z" in n and "auto-detected" in n for n in parser.notes)


def test_the_detected_format_is_shown_with_a_value_it_reads():
    """The note named the column's first string, which may be one the format rejects."""
    from connectors.sources.times import TimeParser

    parser = TimeParser()
    _, _, bad = parser.parse(pa.array(["not a date", "2/7/2017", "12/25/2018"]))
    assert bad.tolist() == [True, False, False]
    note = next(n for n in parser.notes if "auto-detected" in n)
    assert "'2/7/2017'" in note and "not a date" not in note, note


@pytest.mark.parametrize("value, utc", [
    ("Tue, 10 Jun 2003 04:00:00 GMT", datetime(2003, 6, 10, 4, 0, 0, tzinfo=timezone.utc)),  # RSS 2.0
    ("Mon Jul 3 17:18:43 2006 +0200", datetime(2006, 7, 3, 15, 18, 43, tzinfo=timezone.utc)),  # git log
])
def test_rss_gmt_and_git_log_dates_are_detected(value, utc):
    from connectors.sources.times import TimeParser

    times, missing, bad = TimeParser().parse(pa.array([value] * 3))
    assert not bad.any() and not missing.any()
    assert times.to_pylist() == [utc] * 3


def test_rfc_2822_dates_mixing_gmt_and_offsets_are_all_read():
    """Python's email.utils writes "GMT" for UTC and "+0100" otherwise; one column holds both.
    The detected format was the first batch's ("... GMT" or "... %z"), and the other kind of
    row was rejected as unparsable (100 of 600 rows)."""
    from connectors.sources.times import TimeParser

    parser = TimeParser()
    first, _, bad1 = parser.parse(pa.array(["Tue, 07 Feb 2017 10:00:00 GMT"] * 3))
    then, _, bad2 = parser.parse(pa.array(["Wed, 08 Feb 2017 10:00:00 +0100", "Thu, 09 Feb 2017 10:00:00 UT"]))
    assert not bad1.any() and not bad2.any()
    assert first.to_pylist()[0] == datetime(2017, 2, 7, 10, tzinfo=timezone.utc)
    assert then.to_pylist() == [datetime(2017, 2, 8, 9, tzinfo=timezone.utc), datetime(2017, 2, 9, 10, tzinfo=timezone.utc)]


def test_time_format_settles_day_month_order(tmp_path):
    times = ["3/2/2017", "4/2/2017", "5/3/2017"] * 5
    summary = run(corpus(tmp_path / "c.parquet", times), tmp_path / "auto", epoch="month")
    assert any("ambiguous" in n and "%d/%m/%Y" in n for n in summary.notes)
    assert [e["label"] for e in SnapshotStore(str(tmp_path / "auto")).epochs()] == ["2017-03", "2017-04", "2017-05"]
    run(corpus(tmp_path / "c.parquet", times), tmp_path / "fmt", epoch="month", time_format="%d/%m/%Y")
    assert [e["label"] for e in SnapshotStore(str(tmp_path / "fmt")).epochs()] == ["2017-02", "2017-03"]


def test_every_row_rejected_is_one_clear_error(tmp_path, capsys):
    path = corpus(tmp_path / "c.parquet", ["17 Brumaire an VIII", "Tridi", None, "x"] * 3)
    with pytest.raises(ValueError) as info:
        run(path, tmp_path / "s")
    msg = str(info.value)
    assert "every one of the 12 records was rejected (unparsable time: 9, missing time: 3)" in msg
    assert "--time-format" in msg
    assert not (tmp_path / "s" / "manifest.json").exists()
    rc = main(["replay", str(path), "--text-col", "text", "--time-col", "when", "--store", str(tmp_path / "s2")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "unparsable time: 9" in err


@pytest.mark.parametrize("stray", [9999, 1, 2099])
def test_stray_rows_far_away_are_out_of_range(tmp_path, stray):
    times = [1791, 1795, 1801, 1805, 1812, 1815] * 5 + [stray]
    ids = [f"d{i}" for i in range(len(times))]
    summary = run(corpus(tmp_path / "c.parquet", times, ids=ids), tmp_path / "s", id_col="doc_id")
    assert summary.n_epochs == 3 and summary.rejects == {OUT_OF_RANGE: 1}
    assert stored_rejects(tmp_path / "s") == {ids[-1]: OUT_OF_RANGE}
    assert any("rejected as 'out of range'" in n and "--time-range all" in n for n in summary.notes)


def test_daily_epochs_keep_runs_of_empty_epochs_out_of_the_folders(tmp_path):
    day = lambda y, m, d: datetime(y, m, d, tzinfo=timezone.utc)  # noqa: E731
    times = [day(2017, 2, 1 + i % 20) for i in range(60)] + [day(2019, 6, 1)]
    summary = run(corpus(tmp_path / "c.parquet", pa.array(times, pa.timestamp("us", tz="UTC"))), tmp_path / "s",
                  epoch="1d", time_range="all")
    store = SnapshotStore(str(tmp_path / "s"))
    entries = store.epochs()
    assert summary.n_epochs == (day(2019, 6, 1) - day(2017, 2, 1)).days + 1
    assert len(entries) == 21 and len(list((tmp_path / "s" / "epochs").iterdir())) == 21
    gap = entries[-1]["empty_before"]
    assert (gap["first_label"], gap["last_label"]) == ("2017-02-21", "2019-05-31")
    assert gap["n"] == gap["last"] - gap["first"] + 1 == summary.n_epochs - 21
    assert_events_follow_the_published_trees(store)
    # the default range rejects the stray day instead
    auto = run(corpus(tmp_path / "c.parquet", pa.array(times, pa.timestamp("us", tz="UTC"))), tmp_path / "a",
               epoch="1d")
    assert auto.n_epochs == 20 and auto.rejects == {OUT_OF_RANGE: 1}


@pytest.mark.parametrize("time_range", ["auto", "all"])
def test_a_span_of_mostly_empty_epochs_is_refused_before_any_fit(tmp_path, capsys, time_range):
    """A third of the rows two centuries away (a file whose times were read in the wrong unit
    does this): the automatic range keeps them (more than 1% of the rows), and a replay by day
    planned 66,000 epochs, about 40 of them holding rows, and fitted every one for hours with
    no output. It is refused before anything is fitted or written, naming the span and what to
    check."""
    day = lambda y, m, d: datetime(y, m, d, tzinfo=timezone.utc)  # noqa: E731
    times = [day(2024, 3, 1 + i % 20) for i in range(40)] + [day(2205, 1, 1 + i % 20) for i in range(20)]
    path = corpus(tmp_path / "c.parquet", pa.array(times, pa.timestamp("us", tz="UTC")))
    with pytest.raises(ValueError, match=r"span 66,\d{3} epochs of '1d' \(2024-03-01 to 2205-01-20\) but only 40 of "
                                         r"them hold rows.*--time-unit.*--time-range START\.\.END"):
        run(path, tmp_path / "s", epoch="1d", time_range=time_range)
    assert not (tmp_path / "s" / "manifest.json").exists()
    # a range the user gives is theirs: the bulk alone is replayed, the rest rejected
    summary = run(path, tmp_path / "r", epoch="1d", time_range="2024..2024")
    assert summary.n_epochs == 20 and summary.rejects == {OUT_OF_RANGE: 20}


def test_sparse_rows_spread_over_a_long_span_are_replayed(tmp_path, monkeypatch):
    """Rows on a few days spread over years (no gap holding half the span) are a sparse stream,
    not a misread time: replayed, every empty day between them fitted."""
    import streamtree.epochs as epochs_module

    monkeypatch.setattr(epochs_module, "MAX_EMPTY_EPOCHS", 1000)  # the same rule at a tenth of the size
    day = lambda k: datetime(2010, 1, 1, tzinfo=timezone.utc) + timedelta(days=k)  # noqa: E731
    times = [day(150 * k + (k * 37) % 100) for k in range(20)]  # 20 days over about 8 years
    path = corpus(tmp_path / "c.parquet", pa.array(times, pa.timestamp("us", tz="UTC")))
    summary = run(path, tmp_path / "s", epoch="1d", time_range="all")
    assert summary.n_epochs == (times[-1] - times[0]).days + 1 > 1000 * 2


def test_nodes_that_die_in_a_gap_die_in_the_next_published_epoch(tmp_path):
    """Three topics in 2000-2001, nothing in 2002-2005, one topic in 2006: the nodes the window
    lets die in the empty years are deaths of 2006 (before, their deaths were lost with the
    unpublished years' trees)."""
    rng = np.random.default_rng(0)
    groups = [[g + "abcdefghijkl"[i] * 2 for i in range(12)] for g in ("army", "farm", "bank")]
    texts, years = [], []
    for year, topics in ((2000, (0, 1, 2)), (2001, (0, 1, 2)), (2006, (0,))):
        for k in topics:
            for _ in range(25):
                texts.append(" ".join(rng.choice(groups[k], size=12)))
                years.append(year)
    pq.write_table(pa.table({"text": texts, "when": years}), tmp_path / "c.parquet")
    run(tmp_path / "c.parquet", tmp_path / "s", epoch="1y", model={"n_sweeps": 10, "random_state": 0, "window": 1})
    store = SnapshotStore(str(tmp_path / "s"))
    entries = store.epochs()
    assert [e["label"] for e in entries] == ["2000", "2001", "2006"]
    assert entries[-1]["empty_before"]["n"] == 4 and len(entries[-1]["died"]) > 0
    assert_events_follow_the_published_trees(store)


def test_explicit_time_range(tmp_path):
    times = [1791, 1795, 1801, 1805, 1812, 1815] * 3
    summary = run(corpus(tmp_path / "c.parquet", times), tmp_path / "s", time_range="1800..1809")
    assert summary.n_epochs == 1 and summary.rejects == {OUT_OF_RANGE: 12}
    with pytest.raises(ValueError, match="cannot parse time range"):
        TimeRange.parse("1800-1900")
    with pytest.raises(ValueError, match="ends before it starts"):
        TimeRange.parse("1900..1800")


def test_duplicate_ids_keep_the_first(tmp_path):
    times = [1791, 1795, 1801, 1805, 1812, 1815] * 3
    ids = [f"d{i}" for i in range(len(times))]
    ids[7] = ids[2]
    ids[-1] = ids[2]
    summary = run(corpus(tmp_path / "c.parquet", times, ids=ids), tmp_path / "s", id_col="doc_id")
    assert summary.rejects == {DUPLICATE_ID: 2}
    store = SnapshotStore(str(tmp_path / "s"))
    fitted = [d for e in store.epochs() for d in store.read(e["epoch"]).doc_ids.tolist()]
    assert fitted.count("d2") == 1 and "d2" in store.read(1).doc_ids.tolist()  # the first row (1801) was kept
    rejected = [(i, r) for i, r in stored_rejects(tmp_path / "s").items()]
    assert rejected == [("d2", DUPLICATE_ID)]  # (dict: both duplicates carry the same id)


def test_a_reject_dated_far_away_opens_no_epochs(tmp_path):
    """Blank rows dated 1053 and 2999 among rows of 1990-2019 (10-year epochs): three epochs are
    published, not 197, and the rows are reported with the first and the last."""
    times = [1053] + [1990 + i % 30 for i in range(120)] + [2999]
    texts = [" "] + [WORDS[i % len(WORDS)] for i in range(120)] + [" "]
    path = corpus(tmp_path / "c.parquet", times, extra={"text": texts})
    summary = run(path, tmp_path / "s")
    assert summary.n_epochs == 3 and summary.rejects == {"empty text": 2}
    store = SnapshotStore(str(tmp_path / "s"))
    assert [e["label"] for e in store.epochs()] == ["1990s", "2000s", "2010s"]
    by_epoch = [store.rejects(e["epoch"]) for e in store.epochs()]
    assert [0 if r is None else r.num_rows for r in by_epoch] == [1, 0, 1]


def test_resume_refuses_a_source_whose_epochs_are_numbered_differently(tmp_path, monkeypatch):
    """A store written by a streamtree that numbered the epochs otherwise (one that let a reject
    dated 1985 open epochs before 1990) would be resumed at the wrong epoch, skipping years;
    the resume refuses, naming both labels."""
    import streamtree.epochs as epochs_module
    from connectors.stores.snapshot import StoreError

    path = corpus(tmp_path / "c.parquet", [1990 + i % 8 for i in range(96)])
    config = ReplayConfig(source=str(path), text_col="text", time_col="when", epoch="1y", min_df=1, max_df=1.0,
                          model={"n_sweeps": 2, "kappa0": 100.0, "random_state": 0})

    class Stop(Exception):
        """Raised by the progress callback: the replay stops as an interrupted one would."""

    def stop_after_third(p):
        if p.index == 2:
            raise Stop

    with pytest.raises(Stop):
        replay(config, str(tmp_path / "s"), progress=stop_after_third)
    assert [e["label"] for e in SnapshotStore(str(tmp_path / "s")).epochs()] == ["1990", "1991", "1992"]
    plan = epochs_module.EpochReader._plan

    def shifted(self):  # the numbering of such a streamtree: five epochs before 1990
        plan(self)
        self.keys = list(range(self.keys[0] - 5, self.keys[0])) + self.keys

    monkeypatch.setattr(epochs_module.EpochReader, "_plan", shifted)
    with pytest.raises(StoreError, match=r"last epoch 2 is '1992', but the source's epoch 2 is '1987'.*--overwrite"):
        replay(config, str(tmp_path / "s"), mode="resume")
    monkeypatch.undo()
    summary = replay(config, str(tmp_path / "s"), mode="resume")  # numbered as written: it resumes
    assert summary.n_published == 5 and summary.n_epochs == 8


def test_reader_spills_and_reads_the_same_epochs(tmp_path):
    times = list(np.random.default_rng(0).integers(1790, 1850, size=3000))
    path = corpus(tmp_path / "c.parquet", times)
    src = lambda: open_source(str(path), "text", "when", batch_size=100)  # noqa: E731
    with EpochReader(src(), EpochSpec.parse("10y")) as mem, \
            EpochReader(src(), EpochSpec.parse("10y"), memory_bytes=4096) as spill:
        mem.scan()
        spill.scan()
        assert len(spill._runs) > 5 and not mem._runs
        for a, b in zip(mem.epochs(), spill.epochs()):
            assert (a.index, a.label) == (b.index, b.label) and a.rows.equals(b.rows)
        assert [e.index for e in spill.epochs(start=4)] == [4, 5]
        tmp = spill._tmpdir
    assert tmp is not None and not __import__("os").path.exists(tmp)


# ---- the command line --------------------------------------------------------------------
def cli_one_line(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return rc, err


def test_store_problems_come_before_reading_the_source(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    rc, err = cli_one_line(["replay", str(tmp_path / "no-such-source.parquet"), "--text-col", "text",
                            "--time-col", "when", "--store", str(tmp_path / "afile")], capsys)
    assert rc == 3 and "afile: is a file, not a store directory" in err and "no-such-source" not in err


def test_busy_store_and_damaged_store_exit_codes(tmp_path, capsys):
    path = corpus(tmp_path / "c.parquet", [1791, 1801, 1812] * 6)
    argv = ["replay", str(path), "--text-col", "text", "--time-col", "when", "--sweeps", "2", "--min-df", "1",
            "--max-df", "1.0", "--quiet", "--store", str(tmp_path / "s")]
    assert main(argv) == 0
    capsys.readouterr()
    with SnapshotStore(str(tmp_path / "s")).writer("serve"):
        rc, err = cli_one_line([*argv, "--resume"], capsys)
    assert rc == 75 and "being written by" in err and "serve since" in err
    record = tmp_path / "s" / "commits" / "000001.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "path": "../../../../etc"}))
    for args in (["show", str(tmp_path / "s")], [*argv, "--resume"]):
        rc, err = cli_one_line(args, capsys)
        assert rc == 3 and "epoch path '../../../../etc'" in err and "damaged" in err
    (tmp_path / "s" / "manifest.json").write_text("{")
    rc, err = cli_one_line(["show", str(tmp_path / "s")], capsys)
    assert rc == 3 and "manifest is not valid JSON" in err


def test_resume_matches_the_source_however_it_is_spelled(tmp_path, capsys, monkeypatch):
    path = corpus(tmp_path / "c.parquet", [1791, 1801, 1812] * 6)
    common = ["--text-col", "text", "--time-col", "when", "--sweeps", "2", "--min-df", "1", "--max-df", "1.0",
              "--quiet", "--store", str(tmp_path / "s")]
    assert main(["replay", str(path), *common]) == 0
    monkeypatch.chdir(tmp_path)
    assert main(["replay", "c.parquet", *common, "--resume"]) == 0
    assert "already complete" in capsys.readouterr().out
    corpus(tmp_path / "c.parquet", [1791, 1801, 1812] * 7)  # the source changed
    rc, err = cli_one_line(["replay", "c.parquet", *common, "--resume"], capsys)
    assert rc == 2 and "the source changed since the store was written" in err


@pytest.mark.slow
def test_sigterm_says_where_the_store_stands(tmp_path):
    times = [1791, 1801, 1812, 1825, 1833] * 40
    path = corpus(tmp_path / "c.parquet", times)
    proc = subprocess.Popen([sys.executable, "-m", "streamtree.cli", "replay", str(path), "--text-col", "text",
                             "--time-col", "when", "--sweeps", "40", "--min-df", "1", "--max-df", "1.0",
                             "--store", str(tmp_path / "s")], stderr=subprocess.PIPE, text=True)
    # progress bars are off when stderr is not a terminal: wait for the first commit record
    deadline = time.monotonic() + 240
    while not (tmp_path / "s" / "commits" / "000000.json").exists() and proc.poll() is None:
        assert time.monotonic() < deadline, "no epoch published in time"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    if proc.returncode == 0:
        return  # finished before the signal arrived
    assert proc.returncode == 143, err
    assert "streamtree: terminated; the store" in err and "readable through epoch" in err and "--resume" in err
    assert not (tmp_path / "s" / "lease.json").exists()


def test_a_sigterm_wrapped_by_compiled_code_is_still_a_sigterm(tmp_path, monkeypatch, capsys):
    """A signal's exception raised while numba runs a Python callback comes back as a
    SystemError caused by it: the replay still reports where the store stands and exits 143."""
    import streamtree.cli as cli
    import streamtree.replay as replay_module

    def interrupted(*args, **kwargs):
        try:
            raise cli.Terminated()
        except cli.Terminated as exc:
            raise SystemError("CPUDispatcher(...) returned a result with an exception set") from exc

    monkeypatch.setattr(replay_module, "replay", interrupted)
    path = corpus(tmp_path / "c.parquet", [1791, 1801, 1812])
    code = main(["replay", str(path), "--text-col", "text", "--time-col", "when", "--store", str(tmp_path / "s")])
    assert code == 143
    assert "streamtree: terminated; the store" in capsys.readouterr().err
    # a bug stays a bug: an error with no interrupt behind it is raised
    monkeypatch.setattr(replay_module, "replay", lambda *a, **k: (_ for _ in ()).throw(SystemError("a bug")))
    with pytest.raises(SystemError, match="a bug"):
        main(["replay", str(path), "--text-col", "text", "--time-col", "when", "--store", str(tmp_path / "s2")])


def test_an_interrupt_waits_for_the_jit_compiler(monkeypatch):
    """A SIGTERM or Ctrl-C that finds numba compiling in the main thread is not raised there:
    llvmlite's object cache calls Python back from C, which swallowed the exception and left the
    compiler broken, and the replay crashed (exit -11) instead of saying where its store stood.
    It is delivered again shortly; outside the compiler it is raised at once."""
    import streamtree.cli as cli

    retries = []

    class Timer:
        def __init__(self, delay, function, args):
            retries.append((delay, function, args))

        def start(self):
            """Not run: the test reads what the retry would send."""

    monkeypatch.setattr(cli.threading, "Timer", Timer)
    ns = {}
    exec(compile("import sys\nframe = sys._getframe()",
                 os.path.join("site-packages", "llvmlite", "binding", "executionengine.py"), "exec"), ns)
    for sig in (signal.SIGTERM, signal.SIGINT):
        cli._on_interrupt(sig, ns["frame"])  # no exception
        assert retries[-1] == (cli._INTERRUPT_RETRY_S, os.kill, (os.getpid(), sig))
    with pytest.raises(cli.Terminated):
        cli._on_interrupt(signal.SIGTERM, sys._getframe())
    with pytest.raises(KeyboardInterrupt) as raised:
        cli._on_interrupt(signal.SIGINT, sys._getframe())
    assert not isinstance(raised.value, cli.Terminated)
    assert len(retries) == 2
