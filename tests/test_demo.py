"""The demo (``make run``) on a small slice: it runs at the defaults, prints the equivalent
replay command with only the flags given, and ends with a readable store and a report."""

from __future__ import annotations

from test_replay import sou_slice

from connectors.stores.snapshot import SnapshotStore
from streamtree.demo import main


def test_demo_prints_its_command_and_writes_store_and_report(tmp_path, capsys):
    data = sou_slice(tmp_path / "slice.parquet", n=150)
    store, report = tmp_path / "store", tmp_path / "report.html"
    assert main(["--data", str(data), "--store", str(store), "--report", str(report), "--sweeps", "2",
                 "--kappa0", "100"]) == 0
    out = capsys.readouterr().out
    command = out.splitlines()[1]
    assert command.strip().startswith("streamtree replay ") and "--sweeps 2 --kappa0 100 " in command
    assert "--window" not in command and "--max-depth" not in command  # defaults are not spelled out
    assert "evolution over " in out
    assert SnapshotStore(str(store)).epochs()
    assert report.stat().st_size > 0 and str(report.resolve()) in out
