"""The ``streamtree report`` page: a self-contained HTML report of a snapshot store.

:func:`write_report` reads a store (:func:`~streamtree.report.data.read_store`), computes what
the page shows (:func:`~streamtree.report.data.report_data`, pure) and renders one HTML file
(:func:`~streamtree.report.html.render`) with plotly.js inlined, so it opens offline.
"""

from __future__ import annotations

import os
from pathlib import Path

from streamtree.report.data import ReportOptions, StoreContent, read_store, report_data
from streamtree.report.html import render

__all__ = ["ReportOptions", "StoreContent", "read_store", "render", "report_data", "write_report"]


def write_report(store, path: str | os.PathLike, options: ReportOptions | None = None) -> Path:
    """Write the report of ``store`` (a :class:`~connectors.stores.SnapshotStore`) to ``path``.

    The file is written under a temporary name and renamed, so an existing report is
    replaced only by a complete one. Returns the path written.
    """
    options = options or ReportOptions()
    page = render(report_data(read_store(store, max_dendrograms=options.max_dendrograms), options))
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise FileNotFoundError(f"{path.parent}: no such directory for the report")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
