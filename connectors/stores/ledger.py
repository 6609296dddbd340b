"""The service's file ledger: which landed files each committed epoch consumed.

The ledger is an event log. Every landed file the service takes (ingested, a duplicate of an
ingested file, or unreadable), every taken file found changed afterwards (not read) and every
idle close of the open epochs is one event with a sequence number. The events taken since the previous commit go into the next published
epoch as its ``ledger`` table (``SnapshotStore.publish(tables={"ledger": ...})``), so they are
committed atomically with that epoch: a crash before the commit leaves them uncommitted and
the files are taken again after the restart. Commit cost per epoch is the events since the
last commit, whatever the store's age.
"""

from __future__ import annotations

import pyarrow as pa

from connectors.stores.snapshot import SnapshotStore

LEDGER_TABLE = "ledger"

#: One row per event. ``kind`` is ``"file"``, ``"changed"`` or ``"idle"``; for files,
#: ``status`` is ``"ingested"``, ``"duplicate"`` (same content as the file named in ``detail``)
#: or ``"unreadable"`` (the error in ``detail``); ``"changed"`` records, once per name, a file
#: taken before whose size or modification time has changed since (status ``"not read"``: each
#: file is read once; its new size and time, the old ones in ``detail``); ``close_through`` is
#: the epoch key an idle close closed through. ``sha256`` is a file's content digest
#: (:func:`~connectors.sources.files.content_digest`: of its bytes, decompressed, and of its
#: partition keys where it has some).
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


def ledger_table(events: list[dict]) -> pa.Table:
    """The events (dicts with the :data:`LEDGER_SCHEMA` fields) as a table."""
    return pa.Table.from_pylist(events, schema=LEDGER_SCHEMA)


def read_ledger(store: SnapshotStore) -> pa.Table:
    """Every committed event of the store, in sequence order, with the ``epoch`` that committed it."""
    parts = []
    for entry in store.epochs():
        if LEDGER_TABLE in entry.get("tables", []):
            t = store.read_table(entry["epoch"], LEDGER_TABLE).select(LEDGER_SCHEMA.names).cast(LEDGER_SCHEMA)
            parts.append(t.append_column("epoch", pa.array([entry["epoch"]] * t.num_rows, pa.int64())))
    if not parts:
        return LEDGER_SCHEMA.append(pa.field("epoch", pa.int64())).empty_table()
    return pa.concat_tables(parts).sort_by("seq")


__all__ = ["LEDGER_SCHEMA", "LEDGER_TABLE", "ledger_table", "read_ledger"]
