"""Vectorised conversion of a raw time column to ``timestamp[us, UTC]``.

How each input type is interpreted
----------------------------------
* ``timestamp`` (any unit): tz-aware values are converted to UTC; tz-naive values are taken
  to be UTC already. Sub-microsecond precision is truncated.
* ``date32`` / ``date64``: midnight UTC of that day.
* integers: with ``time_unit="auto"``, a value with at most four digits (``|v| <= 9999``) is a
  calendar **year** (1 January, 00:00 UTC: a column like ``year``) and anything larger is
  **epoch seconds** (epoch second 9999 is 1970-01-01T02:46, never a real document time).
  ``time_unit="year"`` forces years; ``"s"``, ``"ms"``, ``"us"``, ``"ns"`` force epoch
  offsets in that unit.
* floats: epoch seconds (or the forced ``time_unit``; ``"year"`` needs whole numbers).
  NaN counts as missing.
* strings: surrounding whitespace is stripped; an empty string is missing. An integer or
  decimal string is interpreted like the number above (CSV files carry years as text; note
  that a compact ``20260314`` is therefore epoch seconds). Any other string is parsed as
  ISO 8601: ``2026-03``, ``2026-03-14``, ``2026-03-14T10:00``, ``2026-03-14 10:00:00.123``
  (digits beyond microseconds are truncated); with a zone suffix (``Z``, ``+02:00``,
  ``+0200``, `` UTC``) it is converted to UTC, without one it is taken as UTC.

Rows whose value is null come back as null with ``missing`` set; rows with a value that
cannot be interpreted come back as null with ``bad`` set (the caller turns those into
``"unparsable time '<value>'"`` rejects).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamtree.records import TIME_TYPE

TIME_UNITS = ("auto", "year", "s", "ms", "us", "ns")
_US_PER = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": None}
_INT_RE = r"^[+-]?\d+$"
_FLOAT_RE = r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$"
# A zone suffix only counts after a clock time, so "2026-03-14" is not read as offset "-14".
_ZONE_RE = r"\d{2}:\d{2}(:\d{2}(\.\d+)?)?\s*([Zz]|[+-]\d{2}(:?\d{2})?)$"
_MAX_YEAR = 9999
_INT64_MAX = np.iinfo(np.int64).max


def to_utc_timestamps(values: pa.Array, time_unit: str = "auto") -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """Convert ``values`` to ``timestamp[us, UTC]``.

    Returns
    -------
    times : pyarrow.Array of timestamp[us, UTC]
        Null where the value is missing or could not be interpreted.
    missing : ndarray of bool
        The input value was null (or NaN, or an empty string).
    bad : ndarray of bool
        The input value was present but could not be interpreted.
    """
    if time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit must be one of {TIME_UNITS}, got {time_unit!r}")
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    t = values.type
    if pa.types.is_timestamp(t):
        out = pc.cast(values, pa.timestamp("us", tz=t.tz), safe=False)
        out = out.cast(TIME_TYPE) if t.tz is not None else _assume_utc(out)
    elif pa.types.is_date(t):
        out = _assume_utc(pc.cast(values, pa.timestamp("us")))
    elif pa.types.is_integer(t) or pa.types.is_floating(t):
        return _from_numbers(values, time_unit)
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        return _from_strings(values.cast(pa.string()), time_unit)
    else:
        raise TypeError(f"cannot interpret a column of type {t} as time")
    missing = ~_valid(values)
    return out, missing, np.zeros(len(values), dtype=bool)


def _valid(values: pa.Array) -> np.ndarray:
    return np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _assume_utc(naive: pa.Array) -> pa.Array:
    # A cast from naive to tz-aware keeps the stored integers, i.e. reads them as UTC.
    return naive.cast(TIME_TYPE)


def _from_numbers(values: pa.Array, time_unit: str) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    n = len(values)
    valid = _valid(values)
    is_float = pa.types.is_floating(values.type)
    raw = pc.fill_null(values, 0).to_numpy(zero_copy_only=False)
    if is_float:
        raw = raw.astype(np.float64)
        finite = np.isfinite(raw)
        missing = ~valid | np.isnan(raw)
        bad = valid & ~np.isnan(raw) & ~finite
        raw = np.where(finite, raw, 0.0)
    else:
        raw = raw.astype(np.int64)
        missing = ~valid
        bad = np.zeros(n, dtype=bool)
    if time_unit == "auto":
        # Floats are always epoch seconds in auto mode; integers up to four digits are years.
        as_year = np.zeros(n, dtype=bool) if is_float else np.abs(raw) <= _MAX_YEAR
        unit = "s"
    else:
        as_year = np.full(n, time_unit == "year")
        unit = "s" if time_unit == "year" else time_unit
    us = np.zeros(n, dtype=np.int64)
    ok = ~missing & ~bad
    # Years: 1 January of that year; whole numbers inside the calendar range only.
    yr = ok & as_year
    if yr.any():
        years = raw[yr]
        whole = np.floor(years) == years if is_float else np.ones(years.shape, bool)
        inside = whole & (np.abs(years) <= _MAX_YEAR)
        y = np.where(inside, years, 1970).astype(np.int64)
        stamps = (y - 1970).astype("datetime64[Y]").astype("datetime64[us]").astype(np.int64)
        sub = np.flatnonzero(yr)
        us[sub] = stamps
        bad[sub[~inside]] = True
    # Epoch offsets in `unit`.
    off = ok & ~as_year
    if off.any():
        v = raw[off]
        if unit == "ns":
            scaled = np.floor_divide(v, 1000) if not is_float else np.floor(v / 1000.0)
        else:
            scaled = v * _US_PER[unit] if not is_float else np.round(v * _US_PER[unit])
        fits = np.abs(np.asarray(v, dtype=np.float64) * (_US_PER[unit] or 1e-3)) < 9.0e18
        sub = np.flatnonzero(off)
        us[sub] = np.where(fits, scaled, 0).astype(np.int64)
        bad[sub[~fits]] = True
    keep = ~missing & ~bad
    out = pa.array(us, type=pa.int64(), mask=~keep).cast(TIME_TYPE)
    return out, missing, bad


def _from_strings(values: pa.Array, time_unit: str) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    s = pc.utf8_trim_whitespace(values)
    s = pc.if_else(pc.equal(s, ""), pa.scalar(None, pa.string()), s)
    # Light normalisation before the ISO parser: "2026-03" -> "2026-03-01", a " UTC"/"GMT"
    # suffix -> "Z", and fractions beyond microseconds truncated (the parser rejects them).
    s = pc.replace_substring_regex(s, r"^(\d{4}-\d{2})$", r"\1-01")
    s = pc.replace_substring_regex(s, r"(\d)\s*(UTC|GMT)$", r"\1Z")
    s = pc.replace_substring_regex(s, r"(\.\d{6})\d+", r"\1")
    n = len(s)
    present = _valid(s)
    is_int = _mask(pc.match_substring_regex(s, _INT_RE))
    is_num = _mask(pc.match_substring_regex(s, _FLOAT_RE)) & ~is_int
    has_zone = _mask(pc.match_substring_regex(s, _ZONE_RE))
    out_us = np.zeros(n, dtype=np.int64)
    got = np.zeros(n, dtype=bool)

    def take(mask: np.ndarray, stamps: pa.Array) -> None:
        ok = mask & _valid(stamps)
        vals = pc.fill_null(stamps.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
        out_us[ok] = vals[ok]
        got[ok] = True

    if is_int.any():
        ints = _only(s, is_int)
        take(is_int, _from_numbers(_safe_cast(_only(s, is_int), pa.int64()), time_unit)[0])
    if is_num.any():
        take(is_num, _from_numbers(_safe_cast(_only(s, is_num), pa.float64()), time_unit)[0])
    iso = present & ~is_int & ~is_num
    if (iso & has_zone).any():
        take(iso & has_zone, _safe_cast(_only(s, iso & has_zone), TIME_TYPE))
    if (iso & ~has_zone).any():
        take(iso & ~has_zone, _assume_utc(_safe_cast(_only(s, iso & ~has_zone), pa.timestamp("us"))))
    missing = ~present
    bad = present & ~got
    out = pa.array(out_us, type=pa.int64(), mask=~got).cast(TIME_TYPE)
    return out, missing, bad


def _mask(boolean: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(boolean, False).to_numpy(zero_copy_only=False), dtype=bool)


def _only(s: pa.Array, mask: np.ndarray) -> pa.Array:
    return pc.if_else(pa.array(mask), s, pa.scalar(None, s.type))


def _safe_cast(values: pa.Array, to: pa.DataType) -> pa.Array:
    """Cast in one vectorised call; only when some value fails, fall back to one at a time."""
    try:
        return pc.cast(values, to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return _cast_each(values, to)


def _cast_each(values: pa.Array, to: pa.DataType) -> pa.Array:
    # Error path only: per-value cast, invalid values become null.
    out = []
    for v in values:
        if not v.is_valid:
            out.append(None)
            continue
        try:
            out.append(v.cast(to).as_py())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            out.append(None)
    return pa.array(out, type=to)
