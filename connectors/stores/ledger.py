"""The service's file ledger inside a snapshot store: which landed files each epoch consumed.

The ledger is an event log. Every landed file the service takes (ingested, a duplicate of
an ingested file, or unreadable) and every idle close of the open epochs is one event with a
sequence number. The events taken since the previous commit are written as one Parquet
file, ``service/ledger/<epoch>.parquet``, *before* the epoch is published; the epoch's
manifest commit makes them part of the store. A ledger file whose epoch is not in the
manifest was left by an interrupted commit: it is invisible to readers and removed by
:meth:`Ledger.remove_uncommitted` (the service writes only these files, so it deletes only
what it wrote). Commit cost per epoch is the events since the last commit, whatever the
store's age.
"""

from __future__ import annotations

import logging
import re
import uuid

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from connectors.stores.snapshot import SnapshotStore, StoreError

logger = logging.getLogger(__name__)

LEDGER_DIR = "service/ledger"
_NAME_RE = re.compile(r"^(\d{6,})\.parquet$")

#: One row per event. ``kind`` is ``"file"`` or ``"idle"``; for files, ``status`` is
#: ``"ingested"``, ``"duplicate"`` (same content as the file named in ``detail``) or
#: ``"unreadable"`` (the error in ``detail``); ``close_through`` is the epoch key an idle
#: close closed through.
LEDGER_SCHEMA = pa.schema([
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("kind", pa.string(), nullable=False),
    pa.field("name", pa.string()),
    pa.field("size", pa.int64()),
    pa.field("mtime_ns", pa.int64()),
    pa.field("ready_ns", pa.int64()),
    pa.field("sha256", pa.string()),
    pa.field("status", pa.string()),
    pa.field("n_read", pa.int64()),
    pa.field("detail", pa.string()),
    pa.field("close_through", pa.int64()),
])


class Ledger:
    """Read and write the ledger files of a store."""

    def __init__(self, store: SnapshotStore) -> None:
        self.store = store
        self.fs = store.fs
        self.dir = f"{store.root}/{LEDGER_DIR}"

    def _files(self) -> dict[int, str]:
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.dir, allow_not_found=True))
        except OSError as exc:
            raise StoreError(f"{self.dir}: cannot list the ledger: {exc}") from None
        out = {}
        for info in infos:
            m = _NAME_RE.match(info.base_name)
            if info.type == pafs.FileType.File and m:
                out[int(m.group(1))] = info.path
        return out

    def write(self, epoch: int, events: list[dict]) -> None:
        """Write the events committed with ``epoch`` (call before publishing the epoch)."""
        table = pa.Table.from_pylist(events, schema=LEDGER_SCHEMA)
        self.fs.create_dir(self.dir, recursive=True)
        final = f"{self.dir}/{int(epoch):06d}.parquet"
        tmp = f"{self.dir}/.{int(epoch):06d}.tmp-{uuid.uuid4().hex}"
        pq.write_table(table, tmp, filesystem=self.fs, compression="zstd")
        self.fs.move(tmp, final)

    def read(self, committed: set[int]) -> pa.Table:
        """Every event committed with one of the ``committed`` epochs, in sequence order."""
        parts = []
        for epoch, path in sorted(self._files().items()):
            if epoch in committed:
                try:
                    parts.append(pq.read_table(path, filesystem=self.fs, schema=LEDGER_SCHEMA))
                except (OSError, pa.ArrowException) as exc:
                    raise StoreError(f"{path}: unreadable ledger file: {exc}") from None
        if not parts:
            return LEDGER_SCHEMA.empty_table()
        return pa.concat_tables(parts).sort_by("seq")

    def remove_uncommitted(self, committed: set[int]) -> list[str]:
        """Delete ledger files of epochs that were never committed (interrupted commits)."""
        removed = []
        for epoch, path in self._files().items():
            if epoch not in committed:
                self.fs.delete_file(path)
                removed.append(path)
        try:
            for info in self.fs.get_file_info(pafs.FileSelector(self.dir, allow_not_found=True)):
                if info.base_name.startswith(".") and ".tmp-" in info.base_name:
                    self.fs.delete_file(info.path)
                    removed.append(info.path)
        except OSError:
            pass
        if removed:
            logger.info("ledger: removed %d files of interrupted commits", len(removed))
        return removed


__all__ = ["LEDGER_DIR", "LEDGER_SCHEMA", "Ledger"]
