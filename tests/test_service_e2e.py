"""End to end: ``streamtree serve`` as a process, files landing over time, kill -9 and restart."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from service_corpus import day_rows, store_epochs, store_rejects, write_jsonl

from connectors.stores.ledger import read_ledger
from connectors.stores.snapshot import SnapshotStore
from streamtree.replay import ReplayConfig, replay

pytestmark = pytest.mark.slow

DOCS = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _metrics(port: int) -> dict[str, float]:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _epochs(store: str) -> int:
    try:
        return len(SnapshotStore(store).epochs())
    except Exception:  # noqa: BLE001 (not created yet)
        return 0


def test_serve_process_with_kill_and_restart(tmp_path):
    ref, land, store = str(tmp_path / "ref"), str(tmp_path / "land"), str(tmp_path / "store")
    os.makedirs(land)
    for d in range(1, 9):
        write_jsonl(f"{ref}/day{d}.jsonl", day_rows(d, DOCS, 1))
    replay(ReplayConfig(source=ref, text_col="text", time_col="time", epoch="1d", model=dict(max_depth=2, n_sweeps=3),
                        min_df=1), str(tmp_path / "replay"))
    port = _free_port()
    log = open(tmp_path / "serve.log", "ab")
    cmd = [sys.executable, "-m", "streamtree.cli", "serve", land, "--store", store, "--text-col", "text",
           "--time-col", "time", "--epoch", "1d", "--allowed-lateness", "1d", "--idle-timeout", "4s",
           "--poll-interval", "0.3", "--vocabulary-from", str(tmp_path / "replay"), "--sweeps", "3",
           "--max-depth", "2", "--metrics-addr", f"127.0.0.1:{port}", "--log-format", "json"]

    def start():
        return subprocess.Popen(cmd, stdout=log, stderr=log)

    def land_day(d, name=None):
        shutil.copy(f"{ref}/day{d}.jsonl", f"{land}/{name or f'day{d}.jsonl'}")

    proc = start()
    try:
        _wait(lambda: _metrics(port), 60, "the metrics endpoint")
        land_day(1)
        land_day(2)  # in order
        time.sleep(0.5)
        land_day(4)  # out of order, within the allowed lateness
        land_day(3)
        _wait(lambda: _epochs(store) >= 2, 60, "epochs 03-01 and 03-02")
        write_jsonl(f"{land}/late.jsonl", [{"text": "tax budget revenue treasury", "time": "2026-03-01T12:00:00Z"}])
        with open(f"{land}/broken.parquet", "wb") as f:
            f.write(b"PAR1 this is not parquet")
        land_day(2, "dup-day2.jsonl")
        # a file written slowly, in place: half lines stay invisible until it stops growing
        lines = open(f"{ref}/day5.jsonl").read().splitlines(keepends=True)
        with open(f"{land}/day5.jsonl", "w") as f:
            for i in range(0, len(lines), 5):
                chunk = "".join(lines[i:i + 5])
                f.write(chunk[: len(chunk) // 2])
                f.flush()
                time.sleep(0.1)
                f.write(chunk[len(chunk) // 2:])
                f.flush()
                time.sleep(0.1)
        land_day(6)
        time.sleep(1.5)  # somewhere in taking day6 and fitting 03-04 / 03-05
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
        killed_at = _epochs(store)

        proc = start()
        _wait(lambda: _metrics(port), 60, "the restarted metrics endpoint")
        land_day(7)
        land_day(8)
        _wait(lambda: _epochs(store) == 8, 90, "all 8 epochs (the last one by the idle timeout)")
        m = _wait(lambda: (lambda x: x if x.get("streamtree_epochs_published_total") == 8 else None)(_metrics(port)),
                  30, "final metrics")
        health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = (tmp_path / "serve.log").read_text()
    records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert any("stopping" in r["message"] and r["level"] == "warning" for r in records), text[-2000:]
    assert any(r["message"].startswith("stopped (SIGTERM)") for r in records)
    assert killed_at < 8  # the kill came before the end
    if killed_at:  # the restart continued from the last commit
        assert any(r["message"].startswith(f"resumed after epoch {killed_at - 1} ") for r in records)

    # the store equals a replay of the accepted files; the late row is a reject
    assert store_epochs(store) == store_epochs(tmp_path / "replay")
    rejects = store_rejects(store)
    assert ("late.jsonl:0", "late row for a closed epoch") in rejects
    assert [src for src, reason in rejects if reason.startswith("unreadable file")] == ["broken.parquet"]
    assert len(rejects) == 2
    # every row accounted for: 8 days + the late row read once each; the duplicate only in the ledger
    docs = [d for e in store_epochs(store) for d in e[6]]
    assert len(docs) == len(set(docs)) == 8 * DOCS
    files = {e["name"]: e for e in read_ledger(SnapshotStore(store)).to_pylist() if e["kind"] == "file"}
    assert sorted(files) == sorted([f"day{d}.jsonl" for d in range(1, 9)] + ["late.jsonl", "broken.parquet",
                                                                            "dup-day2.jsonl"])
    assert files["dup-day2.jsonl"]["status"] == "duplicate" and files["dup-day2.jsonl"]["detail"] == "day2.jsonl"
    assert files["broken.parquet"]["status"] == "unreadable"
    assert files["day5.jsonl"]["n_read"] == DOCS  # read once, whole
    # the metrics count what the store holds
    assert health["healthy"]
    assert m["streamtree_rows_read_total"] == 8 * DOCS + 1
    assert m["streamtree_documents_fitted_total"] == 8 * DOCS
    assert m['streamtree_rows_rejected_total{reason="late row for a closed epoch"}'] == 1
    assert m['streamtree_rows_rejected_total{reason="unreadable file"}'] == 1
    assert m['streamtree_files_total{status="duplicate"}'] == 1
    assert m['streamtree_files_total{status="ingested"}'] == 9
    assert m["streamtree_pending_rows"] == 0
    assert m["streamtree_live_nodes"] >= 1
    assert m["streamtree_checkpoint_seconds_count"] >= 1
