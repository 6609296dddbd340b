"""Vectorised conversion of a raw time column to ``timestamp[us, UTC]``.

How each input type is interpreted
----------------------------------
* ``timestamp`` (any unit): tz-aware values are converted to UTC; tz-naive values are taken
  to be UTC already. Sub-microsecond precision is truncated.
* ``date32`` / ``date64``: midnight UTC of that day.
* numbers (integers and floats, and integer or decimal strings): with ``time_unit="auto"``
  the unit is chosen once per column, from the first values seen, and reported in
  :attr:`TimeParser.notes`: whole numbers whose median magnitude is at most 9999 are
  calendar **years** (1 January, 00:00 UTC: a ``year`` column, also when pandas stored it
  as floats because of a missing value); otherwise the magnitude of the median picks epoch
  **seconds** (below 1e11), **milliseconds** (below 1e14), **microseconds** (below 1e17) or
  **nanoseconds**; whole numbers of eight digits that are nearly all valid dates written
  ``YYYYMMDD`` (``20240301``) are **dates** (as seconds they would all fall in 1970-1973, and
  fewer than one in eight random such seconds reads as a date). Once chosen, the unit holds
  for the rest of the column, so a stray ``19995`` in a year column is a bad year (rejected),
  not a time in 1970. ``time_unit`` forces ``"year"``, ``"yyyymmdd"``, ``"s"``, ``"ms"``,
  ``"us"`` or ``"ns"``. NaN counts as missing.
* other strings: surrounding whitespace is stripped; an empty string is missing. ISO 8601
  is always understood: ``2026-03``, ``2026-03-14``, ``2026-03-14T10:00``,
  ``2026-03-14 10:00:00.123`` (digits beyond microseconds are truncated); with a zone
  suffix (``Z``, ``+02:00``, ``+0200``, `` UTC``) it is converted to UTC, without one it is
  taken as UTC. Other strings are parsed with ``time_format`` (a ``strptime`` pattern such
  as ``"%d/%m/%Y"``) when given; otherwise the first strings that are not ISO choose one of
  the common formats (:data:`COMMON_FORMATS`: ``2017/2/7``, ``7.2.2017``, ``2/7/2017``,
  ``Feb 7, 2017``, ``7 February 2017``...), the one that reads most of them, and the choice
  is reported (day/month order is ambiguous when every day is at most 12: the note says
  so, and ``time_format`` settles it).

Rows whose value is null come back as null with ``missing`` set; rows with a value that
cannot be interpreted come back as null with ``bad`` set (the caller turns those into
``"unparsable time '<value>'"`` rejects).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamtree.records import TIME_TYPE

TIME_UNITS = ("auto", "year", "yyyymmdd", "s", "ms", "us", "ns")
#: strptime patterns tried, in this order, on strings that are neither numbers nor ISO 8601.
COMMON_FORMATS = (
    "%Y/%m/%d", "%Y/%m/%d %H:%M", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d", "%Y-%m-%d %H:%M", "%Y.%m.%d",
    "%d.%m.%Y", "%d.%m.%Y %H:%M", "%d.%m.%Y %H:%M:%S",
    "%m/%d/%Y", "%d/%m/%Y", "%m/%d/%Y %H:%M", "%d/%m/%Y %H:%M", "%m/%d/%Y %H:%M:%S", "%d/%m/%Y %H:%M:%S",
    "%m/%d/%y", "%d/%m/%y",
    "%b %d, %Y", "%B %d, %Y", "%b %d %Y", "%d %b %Y", "%d %B %Y", "%d-%b-%Y",
    "%a, %d %b %Y %H:%M:%S", "%a %b %d %H:%M:%S %Y",
    # RFC 2822 with its zone offset: mail, RSS, git and Debian changelog dates (a zone written
    # "GMT" or "UT", as RSS feeds mostly do, is read as "+0000" first); git log's own default
    "%a, %d %b %Y %H:%M:%S %z", "%d %b %Y %H:%M:%S %z", "%a %b %d %H:%M:%S %Y %z",
)
_US_PER = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": None}
#: what each number unit reads numbers as, for notes and messages
UNIT_NAMES = {"year": "calendar years", "yyyymmdd": "dates written YYYYMMDD", "s": "seconds since 1970",
              "ms": "milliseconds since 1970", "us": "microseconds since 1970", "ns": "nanoseconds since 1970"}
_INT_RE = r"^[+-]?\d+$"
_FLOAT_RE = r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$"
# A zone suffix only counts after a clock time, so "2026-03-14" is not read as offset "-14".
_ZONE_RE = r"\d{2}:\d{2}(:\d{2}(\.\d+)?)?\s*([Zz]|[+-]\d{2}(:?\d{2})?)$"
_ISO_RE = r"^[+-]?\d{4}-\d{2}-\d{2}([T ]\d.*)?$"
_MAX_YEAR = 9999
#: share of eight-digit whole numbers that must be YYYYMMDD dates for "auto" to read them so
_DATE_SHARE = 0.99
_INT64_MAX = np.iinfo(np.int64).max


def to_utc_timestamps(values: pa.Array, time_unit: str = "auto",
                      time_format: str | None = None) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """Convert ``values`` to ``timestamp[us, UTC]`` (a one-off :class:`TimeParser`).

    Returns
    -------
    times : pyarrow.Array of timestamp[us, UTC]
        Null where the value is missing or could not be interpreted.
    missing : ndarray of bool
        The input value was null (or NaN, or an empty string).
    bad : ndarray of bool
        The input value was present but could not be interpreted.
    """
    return TimeParser(time_unit, time_format).parse(values)


class TimeParser:
    """Reads one time column batch after batch, making its automatic choices once.

    Parameters
    ----------
    time_unit : {"auto", "year", "yyyymmdd", "s", "ms", "us", "ns"}
        How numbers are read (see the module docstring).
    time_format : str, optional
        ``strptime`` pattern for strings that are not ISO 8601.

    Attributes
    ----------
    number_unit : str or None
        The unit numbers are read in (chosen on the first numbers seen when ``"auto"``).
    string_format : str or None
        The pattern non-ISO strings are read with (given, or detected on the first ones).
    notes : list of str
        One sentence per automatic choice, for the user.
    """

    def __init__(self, time_unit: str = "auto", time_format: str | None = None) -> None:
        if time_unit not in TIME_UNITS:
            raise ValueError(f"time_unit must be one of {TIME_UNITS}, got {time_unit!r}")
        if time_format is not None and (not isinstance(time_format, str) or "%" not in time_format):
            raise ValueError(f"time_format must be a strptime pattern such as '%d/%m/%Y', got {time_format!r}")
        self.time_unit = time_unit
        self.time_format = time_format
        self.number_unit: str | None = None if time_unit == "auto" else time_unit
        self.string_format: str | None = time_format
        self.notes: list[str] = []

    @property
    def choices(self) -> dict:
        """What the parser has decided so far, as JSON: ``number_unit`` and ``string_format``
        (None where nothing decided yet)."""
        return {"number_unit": self.number_unit, "string_format": self.string_format}

    def with_choices(self, choices: dict) -> "TimeParser":
        """A parser with this one's settings and notes and ``choices`` (:attr:`choices` of
        another) made already; its later choices and notes do not touch this one."""
        out = TimeParser(self.time_unit, self.time_format)
        out.notes = list(self.notes)
        if out.number_unit is None:
            out.number_unit = choices.get("number_unit")
        if out.string_format is None:
            out.string_format = choices.get("string_format")
        return out

    def copy(self) -> "TimeParser":
        """This parser as it stands, whose later choices and notes do not touch this one."""
        return self.with_choices(self.choices)

    def parse(self, values: pa.Array) -> tuple[pa.Array, np.ndarray, np.ndarray]:
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
            return self._numbers(values)
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            return self._strings(values.cast(pa.string()))
        elif pa.types.is_null(t):
            n = len(values)
            return pa.nulls(n, TIME_TYPE), np.ones(n, dtype=bool), np.zeros(n, dtype=bool)
        else:
            raise TypeError(f"cannot interpret a column of type {t} as time")
        missing = ~_valid(values)
        return out, missing, np.zeros(len(values), dtype=bool)

    def _numbers(self, values: pa.Array) -> tuple[pa.Array, np.ndarray, np.ndarray]:
        if self.number_unit is None:
            raw = pc.fill_null(values.cast(pa.float64()), np.nan).to_numpy(zero_copy_only=False)
            raw = raw[np.isfinite(raw)]
            if raw.size == 0:
                return _from_numbers(values, "s")  # all missing: nothing to decide on yet
            self.number_unit, note = detect_number_unit(raw)
            self.notes.append(note)
        return _from_numbers(values, self.number_unit)

    def _strings(self, values: pa.Array) -> tuple[pa.Array, np.ndarray, np.ndarray]:
        return _from_strings(values, self)


def detect_number_unit(values: np.ndarray) -> tuple[str, str]:
    """The unit of a numeric time column from some of its finite values, and a note saying so."""
    v = np.abs(np.asarray(values, dtype=np.float64))
    whole = float(np.mean(np.floor(v) == v))
    med = float(np.median(v))
    example = values[0]
    shown = f"{int(example)}" if float(example).is_integer() and abs(example) < 1e18 else f"{example:g}"
    if med <= _MAX_YEAR and whole >= 0.9:
        unit = "year"
    elif 1e7 <= med < 1e8 and whole >= 0.99 and float(np.mean(_yyyymmdd_days(v)[1])) >= _DATE_SHARE:
        unit = "yyyymmdd"
    elif med < 1e11:
        unit = "s"
    elif med < 1e14:
        unit = "ms"
    elif med < 1e17:
        unit = "us"
    else:
        unit = "ns"
    return unit, (f"numbers read as {UNIT_NAMES[unit]} (detected from values such as {shown}; "
                  f"--time-unit {'|'.join(u for u in TIME_UNITS if u != 'auto')} overrides)")


def _yyyymmdd_days(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Days since 1970 of numbers written ``YYYYMMDD`` and whether each is a calendar date."""
    v = np.asarray(values, dtype=np.float64)
    whole = np.isfinite(v) & (np.floor(v) == v) & (v >= 10_000_101) & (v <= 99_991_231)
    n = np.where(whole, v, 19_700_101).astype(np.int64)
    y, m, d = n // 10_000, (n // 100) % 100, n % 100
    ok = whole & (m >= 1) & (m <= 12) & (d >= 1) & (d <= 31)
    months = np.where(ok, (y - 1970) * 12 + m - 1, 0).astype("datetime64[M]")
    days = months.astype("datetime64[D]") + np.where(ok, d - 1, 0)
    ok &= days.astype("datetime64[M]") == months  # 31 April is not a date
    return days.astype(np.int64), ok


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
    if time_unit == "yyyymmdd":
        days, dated = _yyyymmdd_days(raw)
        ok = ~missing & ~bad
        bad |= ok & ~dated
        keep = ok & dated
        out = pa.array(days * 86_400_000_000, type=pa.int64(), mask=~keep).cast(TIME_TYPE)
        return out, missing, bad
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


def _from_strings(values: pa.Array, parser: "TimeParser") -> tuple[pa.Array, np.ndarray, np.ndarray]:
    s = pc.utf8_trim_whitespace(values)
    s = pc.if_else(pc.equal(s, ""), pa.scalar(None, pa.string()), s)
    raw = s
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

    if (is_int | is_num).any():
        nums = _safe_cast(_only(s, is_int | is_num), pa.float64()) if is_num.any() else \
            _safe_cast(_only(s, is_int), pa.int64())
        take(is_int | is_num, parser._numbers(nums)[0])
    # Only ISO-looking strings go to the ISO parser (whose per-value fallback is slow).
    iso = present & ~is_int & ~is_num & _mask(pc.match_substring_regex(s, _ISO_RE))
    if (iso & has_zone).any():
        take(iso & has_zone, _safe_cast(_only(s, iso & has_zone), TIME_TYPE))
    if (iso & ~has_zone).any():
        take(iso & ~has_zone, _assume_utc(_safe_cast(_only(s, iso & ~has_zone), pa.timestamp("us"))))
    rest = present & ~got & ~iso
    if rest.any():
        others = _only(raw, rest)
        if parser.time_format is None:
            # "GMT" (RFC 822's name for UTC: RSS, Python's email.utils) as the offset it is, so
            # that one detected "%z" format reads a column mixing it with "+0100"
            others = pc.replace_substring_regex(others, r"(\d{2}:\d{2}(:\d{2})?)\s*(GMT|UTC|UT|Z)$", r"\1 +0000")
        if parser.string_format is None:
            _detect_format(parser, others)
        if parser.string_format is not None:
            take(rest, _assume_utc(pc.strptime(others, format=parser.string_format, unit="us", error_is_null=True)))
    missing = ~present
    bad = present & ~got
    out = pa.array(out_us, type=pa.int64(), mask=~got).cast(TIME_TYPE)
    return out, missing, bad


def _detect_format(parser: "TimeParser", strings: pa.Array) -> None:
    """Choose the common format that reads most of ``strings`` (non-null, not ISO)."""
    values = strings.drop_null()
    if len(values) == 0:
        return
    sample = values.slice(0, 1000)
    read = [pc.strptime(sample, format=f, unit="us", error_is_null=True).is_valid() for f in COMMON_FORMATS]
    counts = [int(r.sum().as_py() or 0) for r in read]
    best = int(np.argmax(counts))
    if counts[best] == 0:
        return  # nothing recognisable: these rows are rejected as unparsable, the next batch may decide
    fmt = COMMON_FORMATS[best]
    parser.string_format = fmt
    example = sample.filter(read[best])[0].as_py()  # one the format reads: the first may be rejected
    note = (f"strings like {example!r} read with the format {fmt!r} "
            f"(auto-detected; --time-format overrides)")
    swapped = {"%m/%d": "%d/%m", "%d/%m": "%m/%d"}
    for a, b in swapped.items():
        if a in fmt and fmt.replace(a, b) in COMMON_FORMATS:
            other = COMMON_FORMATS.index(fmt.replace(a, b))
            if counts[other] == counts[best]:
                note += f"; day and month order is ambiguous in these values: pass --time-format {fmt.replace(a, b)!r} if that is meant"
            break
    parser.notes.append(note)


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
