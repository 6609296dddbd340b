"""Row and reject types shared by sources, epoch bucketing and the snapshot store.

A source turns raw records into *normalised* record batches (:data:`ROW_FIELDS` plus the
time and/or epoch column) and routes every record it cannot use to a *rejects* stream
(:data:`REJECT_SCHEMA`) with a human-readable reason. Nothing is dropped silently: every
input record ends up either in a normalised batch or as a reject, and :class:`RejectLog`
counts the rejects by reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import pyarrow as pa

#: Type of the normalised ``time`` column: microseconds since 1970-01-01, UTC.
TIME_TYPE = pa.timestamp("us", tz="UTC")

#: Columns every normalised batch starts with. ``source`` names the file a row came from
#: (relative to the source root) and ``position`` is the 0-based record index inside it.
ROW_FIELDS = [
    pa.field("source", pa.string(), nullable=False),
    pa.field("position", pa.int64(), nullable=False),
    pa.field("id", pa.string(), nullable=False),
    pa.field("text", pa.string(), nullable=False),
]

#: Schema of a rejects table: where the record was, why it was rejected, and what we could
#: recover of it (``text`` is null when it is not valid UTF-8; ``time``/``epoch`` are set
#: when they could be parsed, so a reject can be filed under its epoch).
REJECT_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string()),
        pa.field("position", pa.int64()),
        pa.field("id", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("text", pa.string()),
        pa.field("time", TIME_TYPE),
        pa.field("epoch", pa.int64()),
    ]
)

# Reasons used across the data path (kept here so tests and readers can match on them).
MISSING_TIME = "missing time"
UNPARSABLE_TIME = "unparsable time"  # followed by the offending value: "unparsable time '...'"
MISSING_EPOCH = "missing epoch"
UNPARSABLE_EPOCH = "unparsable epoch"
EMPTY_TEXT = "empty text"
INVALID_UTF8 = "invalid UTF-8"
MISSING_ID = "missing id"
EMPTY_AFTER_VOCABULARY = "empty after vocabulary filtering"
LATE_ROW = "late row for a closed epoch"
OUT_OF_RANGE = "out of range"  # time far outside the data's bulk, or outside --time-range
#: serve: a time later than its file landed plus the future tolerance (a live stream cannot hold it)
FUTURE_TIME = "future time"
DUPLICATE_ID = "duplicate id"  # the id of an earlier row; the first row with an id is kept
#: the text of an earlier row of the same epoch, under ``duplicate_texts="reject"``; the first is kept
DUPLICATE_TEXT = "duplicate text in its epoch"

#: what replay, serve and evaluate do with a row whose text repeats an earlier row's in its
#: epoch: ``"keep"`` fits every copy as a document (and says how many there were), ``"reject"``
#: fits the first and files the others as rejects (:data:`DUPLICATE_TEXT`; evaluate leaves them
#: out), ``"collapse"`` fits the first once and publishes every copy as a document at its node
#: (nothing is rejected; the published counts hold the copies; evaluate leaves them out)
DUPLICATE_TEXTS = ("keep", "reject", "collapse")
#: collapsed by default: copies are published (repeats may be real volume, and no row is
#: dropped), but fitted as independent documents a text repeated k times weighs like k
#: documents and gets nodes of near copies of its own (Debian changelog entries, two thirds of
#: them copies: 151 occupied nodes in one epoch kept, 14 collapsed; BENCHMARKS.md)
DEFAULT_DUPLICATE_TEXTS = "collapse"
#: what stores written before the setting was recorded, or while it was recorded only where it
#: differed from this value, fitted: an identity without ``duplicate_texts`` means this
DUPLICATE_TEXTS_BEFORE_COLLAPSE = "keep"


def empty_rejects() -> pa.Table:
    """A rejects table with no rows."""
    return REJECT_SCHEMA.empty_table()


def make_rejects(
    source,
    position,
    id,
    reason,
    text=None,
    time=None,
    epoch=None,
) -> pa.Table:
    """Build a rejects table from aligned columns (arrays, lists, or ``None`` for all-null)."""
    cols = {"source": source, "position": position, "id": id, "reason": reason,
            "text": text, "time": time, "epoch": epoch}
    n = len(position) if position is not None else len(reason)
    arrays = []
    for field in REJECT_SCHEMA:
        value = cols[field.name]
        if value is None:
            arrays.append(pa.nulls(n, field.type))
        elif isinstance(value, (pa.Array, pa.ChunkedArray)):
            arrays.append(value.cast(field.type))
        else:
            arrays.append(pa.array(value, type=field.type))
    return pa.Table.from_arrays(arrays, schema=REJECT_SCHEMA)


def reject_rows(rows: pa.Table | pa.RecordBatch, reason: str) -> pa.Table:
    """Turn normalised rows into rejects with one common ``reason`` (e.g. empty after filtering)."""
    names = rows.schema.names
    n = rows.num_rows
    return make_rejects(
        source=rows.column("source"),
        position=rows.column("position"),
        id=rows.column("id"),
        reason=pa.array([reason] * n, pa.string()),
        text=rows.column("text"),
        time=rows.column("time") if "time" in names else None,
        epoch=rows.column("epoch").cast(pa.int64()) if "epoch" in names else None,
    )


class RejectLog:
    """Accumulates reject tables and counts them by reason.

    Reasons that carry the offending value (``"unparsable time '17 Brumaire'"``) are counted
    under their prefix (``"unparsable time"``) in :attr:`counts`, and in full in the tables.
    """

    def __init__(self) -> None:
        self._tables: list[pa.Table] = []
        self.counts: Counter[str] = Counter()

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if table.schema != REJECT_SCHEMA:
            table = table.select(REJECT_SCHEMA.names).cast(REJECT_SCHEMA)
        self._tables.append(table)
        for reason in table.column("reason").to_pylist():
            self.counts[_reason_kind(reason)] += 1

    def extend(self, tables: Iterable[pa.Table]) -> None:
        for table in tables:
            self.add(table)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def table(self) -> pa.Table:
        """All rejects logged so far, in arrival order."""
        if not self._tables:
            return empty_rejects()
        return pa.concat_tables(self._tables)

    def drain(self) -> pa.Table:
        """Return the rejects logged since the last drain and forget them (counts are kept)."""
        out = self.table()
        self._tables = []
        return out


def _reason_kind(reason: str) -> str:
    # "unparsable time '...'" -> "unparsable time"
    cut = reason.find(" '")
    return reason if cut < 0 else reason[:cut]
