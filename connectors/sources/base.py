"""Source errors and the normalisation of raw record batches.

Every format reader yields raw record batches (the mapped columns, as the file stores them)
together with the file they came from and the position of their first row. :func:`normalise`
turns one such batch into a batch of the normalised schema (:data:`streamtree.records.ROW_FIELDS`
plus ``time`` and/or ``epoch``) and a rejects table; the split is computed with vectorised
pyarrow/numpy operations, and per-value Python work happens only for values already known bad.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.sources.times import TimeParser
from streamtree.records import (
    EMPTY_TEXT,
    INVALID_UTF8,
    MISSING_EPOCH,
    MISSING_ID,
    MISSING_TIME,
    ROW_FIELDS,
    TIME_TYPE,
    UNPARSABLE_EPOCH,
    UNPARSABLE_TIME,
    make_rejects,
)


class SourceError(Exception):
    """A source cannot be read: missing file or column, not the expected format, corrupt data.

    Attributes
    ----------
    path : str
        The file or dataset the error is about.
    """

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


def check_columns(path: str, present: list[str], wanted: dict[str, str | None]) -> None:
    """Raise :class:`SourceError` naming any mapped column absent from ``present`` (with a hint
    when a one-column header looks like several run together: a delimiter other than the one
    the file was read with)."""
    for role, name in wanted.items():
        if name is not None and name not in present:
            hint = ""
            if len(present) == 1:
                found = next((d for d in (";", "\t", "|", ",") if d in present[0]), None)
                if found is not None:
                    shown = "tab" if found == "\t" else found
                    hint = (f"; the header reads as one column, so the file may be delimited by {shown!r}: "
                            f"pass --delimiter {shown!r}")
            raise SourceError(
                path, f"{role} column {name!r} not found; columns present: {', '.join(map(repr, present))}{hint}"
            )


def normalised_schema(has_time: bool, has_epoch: bool) -> pa.Schema:
    fields = list(ROW_FIELDS)
    if has_time:
        fields.append(pa.field("time", TIME_TYPE, nullable=False))
    if has_epoch:
        fields.append(pa.field("epoch", pa.int64(), nullable=False))
    return pa.schema(fields)


def normalise(
    raw: pa.RecordBatch,
    source: str,
    start: int,
    *,
    text_col: str,
    time_col: str | None,
    id_col: str | None,
    epoch_col: str | None,
    time_unit: str = "auto",
    time_parser: TimeParser | None = None,
) -> tuple[pa.RecordBatch, pa.Table]:
    """Split a raw batch into normalised good rows and rejects.

    Parameters
    ----------
    raw : pyarrow.RecordBatch
        The mapped columns as read from ``source``.
    source : str
        Name of the file the batch came from (goes into the ``source`` column and default ids).
    start : int
        Position (0-based record index in the file) of the batch's first row.
    time_parser : TimeParser, optional
        Reads the time column; a source passes its own so that automatic choices made on
        the first batch hold for all (default: a fresh one with ``time_unit``).
    """
    n = raw.num_rows
    position = pa.array(np.arange(start, start + n, dtype=np.int64))
    src = pa.array([source], pa.string()).take(pa.array(np.zeros(n, dtype=np.int64)))
    reasons = np.full(n, None, dtype=object)

    text, invalid = _decode_text(raw.column(text_col), source, text_col)
    stripped = pc.utf8_trim_whitespace(text)
    empty = ~invalid & _np_mask(pc.or_kleene(pc.is_null(text), pc.equal(stripped, "")))

    if id_col is not None:
        ids = _as_string(raw.column(id_col), source, id_col)
        missing_id = ~_np_mask(pc.is_valid(ids))
    else:
        ids = pc.binary_join_element_wise(src, pc.cast(position, pa.string()), ":")
        missing_id = np.zeros(n, dtype=bool)

    columns = {"source": src, "position": position, "id": ids, "text": text}
    time = epoch = None
    # Assign reasons from lowest to highest priority so a row keeps the most basic one.
    reasons[missing_id] = MISSING_ID
    if epoch_col is not None:
        epoch, missing_e, bad_e = _as_epoch(raw.column(epoch_col), source, epoch_col)
        reasons[missing_e] = MISSING_EPOCH
        _set_valued(reasons, bad_e, UNPARSABLE_EPOCH, raw.column(epoch_col))
        columns["epoch"] = epoch
    if time_col is not None:
        try:
            parser = time_parser if time_parser is not None else TimeParser(time_unit)
            time, missing_t, bad_t = parser.parse(raw.column(time_col))
        except TypeError as exc:
            raise SourceError(source, f"time column {time_col!r}: {exc}") from None
        _set_valued(reasons, bad_t, UNPARSABLE_TIME, raw.column(time_col))
        reasons[missing_t] = MISSING_TIME
        columns["time"] = time
    reasons[empty] = EMPTY_TEXT
    reasons[invalid] = INVALID_UTF8

    bad = reasons != None  # noqa: E711  (elementwise on an object array)
    schema = normalised_schema(time_col is not None, epoch_col is not None)
    good_mask = pa.array(~bad)
    good = pa.RecordBatch.from_arrays(
        [pc.filter(columns[f.name], good_mask) for f in schema], schema=schema
    )
    if not bad.any():
        return good, make_rejects([], [], [], [])
    bad_mask = pa.array(bad)
    rejects = make_rejects(
        source=pc.filter(src, bad_mask),
        position=pc.filter(position, bad_mask),
        id=pc.filter(ids, bad_mask),
        reason=pa.array(reasons[bad].tolist(), pa.string()),
        text=pc.filter(text, bad_mask),
        time=pc.filter(time, bad_mask) if time is not None else None,
        epoch=pc.filter(epoch, bad_mask) if epoch is not None else None,
    )
    return good, rejects


def _np_mask(boolean) -> np.ndarray:
    return np.asarray(pc.fill_null(boolean, False).to_numpy(zero_copy_only=False), dtype=bool)


def _set_valued(reasons: np.ndarray, mask: np.ndarray, prefix: str, raw: pa.Array) -> None:
    # The offending value goes into the reason; only the (rare) bad rows are formatted.
    if mask.any():
        idx = np.flatnonzero(mask)
        values = raw.take(pa.array(idx)).to_pylist()
        reasons[idx] = [f"{prefix} {_show(v)}" for v in values]


def _show(value) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = str(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"'{text}'"


def _decode_text(values: pa.Array, source: str, name: str) -> tuple[pa.Array, np.ndarray]:
    """The column as valid UTF-8 strings (null where invalid) and the invalid mask.

    String columns are checked too: JSON and Parquet readers do not always validate UTF-8.
    """
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    t = values.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        raw = values.view(pa.binary() if pa.types.is_string(t) else pa.large_binary())
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        raw = values
    elif pa.types.is_null(t):
        return pa.nulls(len(values), pa.string()), np.zeros(len(values), dtype=bool)
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        # pre-tokenised text: joining it here would split its tokens again by other rules
        raise SourceError(source, f"text column {name!r} holds lists ({t}), not text: join each row's tokens "
                                  f"into one string first (for example pyarrow.compute.binary_join(column, ' '))")
    else:
        raise SourceError(source, f"text column {name!r} has type {t}; expected a string or binary column")
    try:
        return pc.cast(raw, pa.string()), np.zeros(len(values), dtype=bool)
    except pa.ArrowInvalid:
        pass
    # Error path: decode one value at a time to find the invalid ones.
    out, invalid = [], np.zeros(len(values), dtype=bool)
    for i, b in enumerate(raw.to_pylist()):
        if b is None:
            out.append(None)
            continue
        try:
            out.append(b.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(None)
            invalid[i] = True
    return pa.array(out, pa.string()), invalid


def _as_string(values: pa.Array, source: str, name: str) -> pa.Array:
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type):
        return _decode_text(values, source, name)[0]
    try:
        return pc.cast(values, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SourceError(source, f"id column {name!r} of type {values.type} cannot be read as text: {exc}") from None


def _as_epoch(values: pa.Array, source: str, name: str) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """An explicit epoch column as int64: integers, whole floats, or integer strings."""
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    t = values.type
    n = len(values)
    if pa.types.is_integer(t):
        out = pc.cast(values, pa.int64())
        return out, ~_np_mask(pc.is_valid(out)), np.zeros(n, dtype=bool)
    if pa.types.is_floating(t):
        f = pc.fill_null(values, np.nan).to_numpy(zero_copy_only=False).astype(np.float64)
        missing = np.isnan(f)
        bad = ~missing & ~(np.isfinite(f) & (np.floor(f) == f))
        keep = ~missing & ~bad
        return pa.array(np.where(keep, f, 0).astype(np.int64), mask=~keep), missing, bad
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t):
        s, _ = _decode_text(values, source, name) if not pa.types.is_string(t) else (values, None)
        s = pc.utf8_trim_whitespace(s.cast(pa.string()))
        s = pc.if_else(pc.equal(s, ""), pa.scalar(None, pa.string()), s)
        missing = ~_np_mask(pc.is_valid(s))
        ok = _np_mask(pc.match_substring_regex(s, r"^[+-]?\d{1,18}$"))
        out = pc.cast(pc.if_else(pa.array(ok), s, pa.scalar(None, pa.string())), pa.int64())
        return out, missing, ~missing & ~ok
    raise SourceError(source, f"epoch column {name!r} has type {t}; expected integers")
