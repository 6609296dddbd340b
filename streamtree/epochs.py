"""Epoch specifications and the bucketing of normalised rows into epochs.

An :class:`EpochSpec` maps each row to an integer epoch *key* and each key to a human
*label*:

* fixed widths ``"30s"``, ``"15m"`` (minutes), ``"1h"``, ``"1d"``, ``"2w"``: key
  ``floor((time - origin) / width)``, origin 1970-01-01T00:00Z unless given, except for
  weeks, whose default origin is Monday 1969-12-29T00:00Z so that weeks are ISO weeks
  (Monday to Sunday). Labels are the start of the epoch: ``"2026-03-14"`` when the width and
  origin are whole days (for weeks, the Monday's date), ``"2026-03-14T10:00"`` for whole
  minutes, ``"2026-03-14T10:00:30"`` otherwise.
* year widths ``"Ny"`` (``"year"`` = ``"1y"``, ``"decade"`` = ``"10y"``,
  ``"century"`` = ``"100y"``): key ``floor(year / N)``, so epochs are aligned to years
  divisible by N (``"10y"`` gives the 1790s, 1800s, ...). Labels ``"2026"`` for N = 1,
  ``"1790s"`` for N = 10, 100, 1000, otherwise ``"1790-1814"``.
* calendar months ``"month"`` or ``"Nmo"``: key ``floor((12 * year + month - 1) / N)``,
  label of the first month ``"2026-03"``.
* ``"column"``: the normalised ``epoch`` column (an explicit integer epoch per row) is the
  key and its decimal text the label.

Calendar fields are taken in UTC.

The order of an epoch's rows
----------------------------
The sampler is seeded, and it visits an epoch's documents in their row order, so that order is
part of what a seed reproduces. Every epoch is yielded with its rows in one canonical order,
:data:`ROW_ORDER`: by ``source`` (the file's path below the source folder, or below the
landing folder of a service), then ``position`` (the record's index in its file). It is a
total order (no two rows share a file and a position), it depends only on the files and not
on how or when they were read, and it is the order in which a replay reads a folder (files in
sorted path order, each from its first record). So a replay of a folder and a service taking
the same files in any landing order, over any number of polls and restarts, fit an epoch's
rows in the same order, and the same seed gives the same trees (with the same vocabulary, and
no row late for the service). It is applied in
one place, :func:`in_row_order`, where :class:`Bucketer` and :class:`EpochReader` yield an
epoch. (Ordering by time first was not chosen: it adds nothing to a total order, since times
tie, often, in data dated by day or year, and it would reorder every replay written so far,
so that a resumed store would continue in another order than it began.)

Bucketing and empty epochs
--------------------------
:class:`Bucketer` groups rows by key with vectorised numpy/pyarrow operations (a stable
argsort per incoming batch; Python only loops over the distinct keys of a batch). Rows may
arrive in any time order: a replay adds the whole source and then yields epochs in key
order. Epochs with no rows that lie between the first and the last non-empty epoch are
yielded too, as empty epochs, because the model must see them: the tree is carried forward
unchanged and the stick window still advances by one epoch, so old counts age out during
a gap exactly as they would in calendar time. (For ``"column"`` specs the spacing of keys
is unknown, so only keys that occur are yielded.)

For streaming use, :meth:`Bucketer.pop_through` closes all epochs up to a key (the
watermark); rows that later arrive for a closed epoch become rejects with reason
``"late row for a closed epoch"`` (or, with ``add(rows, late="next-epoch")``, join the
first epoch not yet closed).

Rejects from the source are filed under their epoch when their time (or epoch) is known and
falls within the epochs that rows span; rejects without one (missing or unparsable time), and
those before the first epoch with rows, are attached to the next epoch yielded (in a replay,
the first), or stay in :meth:`Bucketer.leftover_rejects` if none follows. A replay files
rejects after the last epoch with rows under that epoch. Rejects alone never open an epoch of
a time spec (a ``"column"`` spec yields every key that occurs, a reject's too).
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamtree.records import (
    DUPLICATE_ID,
    LATE_ROW,
    OUT_OF_RANGE,
    REJECT_SCHEMA,
    TIME_TYPE,
    _reason_kind,
    empty_rejects,
    reject_rows,
)
from streamtree.wording import counted

_US = {"s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000, "d": 86_400_000_000, "w": 7 * 86_400_000_000}
_ALIASES = {"year": "1y", "decade": "10y", "century": "100y", "month": "1mo",
            "hour": "1h", "day": "1d", "week": "1w", "minute": "1m"}
_SPEC_RE = re.compile(r"^\s*(\d+)\s*(mo|min|s|m|h|d|w|y)\s*$")
#: a width in capital M: months to some tools (pandas' "M"), minutes to others; never guessed
_CAPITAL_M_RE = re.compile(r"^\s*\d+\s*M\s*$")
_EPOCH0 = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: default origin of week epochs: the Monday before 1970-01-01 (a Thursday), so that weeks
#: run Monday to Sunday as ISO weeks do
WEEK_ORIGIN = datetime(1969, 12, 29, tzinfo=timezone.utc)
#: A planned span of more epochs than this, of which fewer than one in EMPTY_SPAN_RATIO hold rows
#: and most lie in one gap, is refused under the automatic or whole time range (see
#: EpochReader._check_span)
MAX_EMPTY_EPOCHS = 10_000
EMPTY_SPAN_RATIO = 100
#: CPU seconds an empty epoch takes in a replay (fit, events, progress; measured 1.4-1.8 ms)
EMPTY_EPOCH_SECONDS = 0.0017
#: What :meth:`Bucketer.add` does with a row of an epoch that is already closed.
LATE_POLICIES = ("reject", "next-epoch")
#: The canonical order of an epoch's rows (``pyarrow`` sort keys): by source file name, then
#: position in the file; see the module docstring and :func:`in_row_order`.
ROW_ORDER = (("source", "ascending"), ("position", "ascending"))


def in_row_order(rows: pa.Table) -> pa.Table:
    """``rows`` (normalised rows of one epoch) in :data:`ROW_ORDER`: the one place that decides
    the order in which an epoch's documents are fitted. Rows already in that order, as a
    replay reads them, come back as they are (no copy); tables without ``source`` and
    ``position`` columns too."""
    if rows.num_rows < 2 or not {"source", "position"} <= set(rows.column_names):
        return rows
    order = pc.sort_indices(rows, sort_keys=list(ROW_ORDER))
    idx = np.asarray(order.to_numpy(zero_copy_only=False), dtype=np.int64)
    if np.array_equal(idx, np.arange(idx.size)):
        return rows
    return rows.take(order)


def row_key(source: str, position: int) -> tuple[str, int]:
    """A row's place in :data:`ROW_ORDER` as a Python sort key (Python compares strings by code
    point, as Arrow compares their UTF-8 bytes), for code that compares single rows."""
    return source, int(position)


#: ``--epoch`` values offered when a replay's rows fall into too few epochs, widest first (what
#: :func:`suggest_epoch` chooses from)
EPOCH_CHOICES = ("100y", "10y", "5y", "2y", "year", "6mo", "3mo", "month", "2w", "1w", "1d", "6h", "1h", "15min",
                 "1min", "10s", "1s")
_DAY_US = 86_400_000_000


def epochs_spanned(spec: "EpochSpec", first_us: int, last_us: int) -> int:
    """How many epochs of ``spec`` (a time spec) run from the one holding ``first_us`` to the
    one holding ``last_us`` (microseconds since 1970), both included: what a replay of rows
    between those times fits, empty epochs included."""
    keys = spec.time_keys(pa.array([first_us, last_us], pa.int64()).cast(TIME_TYPE))
    return int(keys[1] - keys[0]) + 1


def nominal_width_us(spec: "EpochSpec") -> int:
    """The length of one epoch of a time spec in microseconds (years of 365.2425 days, months of
    a twelfth of that)."""
    if spec.kind == "fixed":
        return spec.width
    if spec.kind == "years":
        return int(spec.width * 365.2425 * _DAY_US)
    if spec.kind == "months":
        return int(spec.width * 365.2425 / 12 * _DAY_US)
    raise ValueError("column epochs have no width")


#: what times may be dated to, coarsest first: each an ``--epoch`` of :data:`EPOCH_CHOICES`
RESOLUTIONS = ("year", "month", "1d", "1h", "1min", "1s")


def time_resolution(times) -> str | None:
    """The coarsest of :data:`RESOLUTIONS` on whose starts every time of ``times`` (a timestamp
    array without nulls) falls: ``"year"`` for times that are years (January 1, midnight),
    ``"1d"`` for dates; None for times finer than seconds (or no times)."""
    levels = resolution_levels(times)
    return resolution_of_level(int(levels.max())) if levels.size else None


def resolution_levels(times) -> np.ndarray:
    """Per time of ``times`` (a timestamp array without nulls), the position in
    :data:`RESOLUTIONS` of the coarsest on whose starts it falls, ``len(RESOLUTIONS)`` for a
    time finer than seconds: the largest over some times is what they are dated to together
    (:func:`resolution_of_level`)."""
    if isinstance(times, pa.ChunkedArray):
        times = times.combine_chunks()
    us = int64_values(times)
    level = np.full(us.size, RESOLUTIONS.index("year"), dtype=np.int8)
    undecided = np.ones(us.size, dtype=bool)
    for unit in ("1s", "1min", "1h", "1d"):  # finest first: a time off the second is off the minute too
        off = undecided & (us % EpochSpec.parse(unit).width != 0)
        level[off] = RESOLUTIONS.index(unit) + 1
        undecided &= ~off
    if undecided.any():  # whole days: dates, months or years
        days = times.filter(pa.array(undecided))
        at = np.flatnonzero(undecided)
        not_first = int64_values(pc.day(days)) != 1
        level[at[not_first]] = RESOLUTIONS.index("1d")
        not_january = ~not_first & (int64_values(pc.month(days)) != 1)
        level[at[not_january]] = RESOLUTIONS.index("month")
    return level


def resolution_of_level(level: int) -> str | None:
    """The :data:`RESOLUTIONS` entry at ``level`` (see :func:`resolution_levels`); None past the
    finest (times finer than seconds)."""
    return RESOLUTIONS[level] if level < len(RESOLUTIONS) else None


def suggest_epoch(first_us: int, last_us: int, at_least: int = 5, resolution: str | None = None
                  ) -> tuple[str, int] | None:
    """The widest spec of :data:`EPOCH_CHOICES` that cuts the times ``first_us`` to ``last_us``
    into at least ``at_least`` epochs, with how many it makes; failing that the finest, if it
    makes more than one; None for times less than one second apart (the finest choice, a second,
    would only cut them when they straddle a second's start: no useful epoch separates them).
    Never one finer than the times' ``resolution`` (:func:`time_resolution`: years are not cut
    into months, most of which no row would fall in)."""
    if last_us - first_us < _US["s"]:
        return None
    finest = None
    for text in EPOCH_CHOICES:
        n = epochs_spanned(EpochSpec.parse(text), first_us, last_us)
        if n >= at_least:
            return text, n
        finest = (text, n)
        if text == resolution:
            break
    return finest if finest is not None and finest[1] > 1 else None


@dataclass(frozen=True)
class EpochSpec:
    """How rows map to epochs (see the module docstring).

    Attributes
    ----------
    kind : {"fixed", "years", "months", "column"}
    width : int
        Microseconds (``fixed``), years (``years``), months (``months``) or 1 (``column``).
    origin_us : int
        Start of epoch 0 for ``fixed`` specs, in microseconds since 1970-01-01 UTC.
    text : str
        The spec as parsed (for manifests and messages).
    """

    kind: str
    width: int
    origin_us: int = 0
    text: str = ""

    @property
    def iso_weeks(self) -> bool:
        """Whether epochs are whole weeks from :data:`WEEK_ORIGIN`: stores record it, because
        weeks used to start on Thursdays (counted from 1970-01-01) and a resumed run must not
        change its epochs' boundaries half-way."""
        week = 7 * 86_400_000_000
        return self.kind == "fixed" and self.width % week == 0 and self.origin_us == _origin_us(WEEK_ORIGIN)

    @classmethod
    def parse(cls, text: str, origin: str | datetime | None = None) -> "EpochSpec":
        """Parse ``"1h"``, ``"1d"``, ``"2w"``, ``"10y"``, ``"3mo"``, ``"month"``, ``"year"``,
        ``"decade"``, ``"century"``, ``"column"`` (and ``"day"``, ``"hour"``, ``"week"``;
        minutes are ``"15m"`` or ``"15min"``; ``"1M"`` is refused as ambiguous).

        ``origin`` (ISO string or datetime; naive means UTC) sets the start of epoch 0 for
        fixed widths (default 1970-01-01, or :data:`WEEK_ORIGIN`, a Monday, for weeks); it is
        not allowed for calendar specs, which align to the calendar.
        """
        if not isinstance(text, str):
            raise TypeError(f"epoch spec must be a string, got {type(text).__name__}")
        if _CAPITAL_M_RE.match(text):
            raise ValueError(f"epoch spec {text!r} is ambiguous: write '{text.strip()[:-1].strip()}mo' for months "
                             f"or '{text.strip()[:-1].strip()}min' for minutes")
        norm = text.strip().lower()
        if norm == "column":
            if origin is not None:
                raise ValueError("origin makes no sense for column epochs")
            return cls("column", 1, 0, "column")
        norm = _ALIASES.get(norm, norm)
        m = _SPEC_RE.match(norm)
        if not m:
            raise ValueError(
                f"cannot parse epoch spec {text!r}: expected e.g. '1h', '1d', '2w', '10y', '3mo', "
                "'month', 'year', 'decade' or 'column'"
            )
        n, unit = int(m.group(1)), m.group(2).replace("min", "m")
        if n < 1:
            raise ValueError(f"epoch width must be positive in {text!r}")
        if unit in ("y", "mo"):
            if origin is not None:
                raise ValueError(f"{text!r} is aligned to the calendar; origin applies to fixed widths only")
            return cls("years" if unit == "y" else "months", n, 0, text.strip())
        if origin is None and unit == "w":
            origin = WEEK_ORIGIN
        return cls("fixed", n * _US[unit], _origin_us(origin), text.strip())

    @classmethod
    def meaning(cls, text) -> tuple | object:
        """What a stored spec means, whatever its spelling (``decade`` and ``10y``, ``15m`` and
        ``15min`` alike): ``(kind, width, origin)``, or ``text`` itself if it is no spec. A width
        in capital M, refused by :meth:`parse` now, meant minutes when it was accepted."""
        if isinstance(text, str) and _CAPITAL_M_RE.match(text):
            text = text.strip()[:-1].strip() + "min"
        try:
            spec = cls.parse(text)
        except (TypeError, ValueError):
            return text
        return spec.kind, spec.width, spec.origin_us

    # ---- keys ------------------------------------------------------------------------
    def keys(self, rows: pa.Table | pa.RecordBatch) -> np.ndarray:
        """Epoch key (int64) of every row of a normalised table (vectorised)."""
        if self.kind == "column":
            if "epoch" not in rows.schema.names:
                raise ValueError("column epochs need rows with an 'epoch' column (open the source with epoch_col=)")
            return int64_values(rows.column("epoch"))
        if "time" not in rows.schema.names:
            raise ValueError(f"epoch spec {self.text!r} needs rows with a 'time' column (open the source with time_col=)")
        return self.time_keys(rows.column("time"))

    def time_keys(self, time) -> np.ndarray:
        """Keys of a ``timestamp[us, UTC]`` array without nulls."""
        if isinstance(time, pa.ChunkedArray):
            time = time.combine_chunks()
        if self.kind == "fixed":
            us = int64_values(time.cast(pa.int64()))
            return np.floor_divide(us - self.origin_us, self.width)
        year = int64_values(pc.year(time))
        if self.kind == "years":
            return np.floor_divide(year, self.width)
        if self.kind == "months":
            return np.floor_divide(12 * year + int64_values(pc.month(time)) - 1, self.width)
        raise ValueError("column epochs have no time keys")

    # ---- labels ----------------------------------------------------------------------
    def start(self, key: int) -> datetime | None:
        """Start time of epoch ``key`` (UTC), or None for column epochs."""
        key = int(key)
        if self.kind == "fixed":
            return _EPOCH0 + timedelta(microseconds=self.origin_us + key * self.width)
        if self.kind == "years":
            return datetime(key * self.width, 1, 1, tzinfo=timezone.utc)
        if self.kind == "months":
            y, m = divmod(key * self.width, 12)
            return datetime(y, m + 1, 1, tzinfo=timezone.utc)
        return None

    def label(self, key: int) -> str:
        """Human label of epoch ``key``: ``"1790s"``, ``"2026-03"``, ``"2026-03-14T10:00"``."""
        key = int(key)
        if self.kind == "column":
            return str(key)
        if self.kind == "years":
            y0 = key * self.width
            if self.width == 1:
                return f"{y0}"
            if self.width in (10, 100, 1000):
                return f"{y0}s"
            return f"{y0}-{y0 + self.width - 1}"
        if self.kind == "months":
            y, m = divmod(key * self.width, 12)
            return f"{y:04d}-{m + 1:02d}"
        start_us = self.origin_us + key * self.width
        day = _US["d"]
        unit, form = (("D", "%Y-%m-%d") if self.width % day == 0 and start_us % day == 0
                      else ("m", "%Y-%m-%dT%H:%M") if self.width % _US["m"] == 0 and start_us % _US["m"] == 0
                      else ("s", "%Y-%m-%dT%H:%M:%S"))
        try:
            return (_EPOCH0 + timedelta(microseconds=start_us)).strftime(form)
        except OverflowError:  # before year 1 or after 9999: ISO 8601's extended years, as NumPy writes them
            return str(np.datetime_as_string(np.datetime64(start_us, "us"), unit=unit))

    @property
    def fills_gaps(self) -> bool:
        """Whether keys are consecutive in time (all but column specs)."""
        return self.kind != "column"


@dataclass
class Epoch:
    """The rows of one epoch.

    Attributes
    ----------
    index : int
        0, 1, 2, ... in the order the bucketer yielded epochs (empty ones included): the
        ``epoch=`` argument of ``DTSSBP.partial_fit``.
    key, label : int, str
        From the :class:`EpochSpec`.
    rows : pyarrow.Table
        Normalised rows (``source``, ``position``, ``id``, ``text``, ``time``/``epoch``),
        in :data:`ROW_ORDER` (by file name, then position in the file) as :class:`Bucketer`
        and :class:`EpochReader` yield them; zero rows for an empty epoch.
    rejects : pyarrow.Table
        Rejects filed under this epoch (schema :data:`streamtree.records.REJECT_SCHEMA`).
    """

    index: int
    key: int
    label: str
    rows: pa.Table
    rejects: pa.Table = field(default_factory=empty_rejects)

    @property
    def n_rows(self) -> int:
        return self.rows.num_rows

    @property
    def is_empty(self) -> bool:
        return self.rows.num_rows == 0

    def reject(self, mask, reason: str) -> "Epoch":
        """A copy with ``rows[mask]`` moved to :attr:`rejects` under ``reason``.

        For example, rows empty after vocabulary filtering::

            X = vectorizer.transform(epoch.rows.column("text"))
            empty = vectorizer.empty_rows(X)
            epoch = epoch.reject(empty, EMPTY_AFTER_VOCABULARY)
            X = X[~empty]
        """
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != (self.rows.num_rows,):
            raise ValueError(f"mask has shape {mask.shape}, epoch has {self.rows.num_rows} rows")
        if not mask.any():
            return self
        moved = reject_rows(self.rows.filter(pa.array(mask)), reason)
        return Epoch(self.index, self.key, self.label, self.rows.filter(pa.array(~mask)),
                     pa.concat_tables([self.rejects, moved]))

    def first_of_text(self) -> np.ndarray:
        """For each row, the index of the first row of the epoch with exactly its text (its own
        index for the first of each text)."""
        if not self.rows.num_rows:
            return np.zeros(0, dtype=np.int64)
        codes = pc.dictionary_encode(self.rows.column("text"), null_encoding="encode").combine_chunks().indices
        codes = np.asarray(codes.to_numpy(zero_copy_only=False), dtype=np.int64)
        _, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
        return first[inverse].astype(np.int64)

    def repeated_texts(self) -> np.ndarray:
        """Boolean mask of the rows whose text is exactly that of an earlier row of the epoch
        (the first of each text is not marked)."""
        return self.first_of_text() != np.arange(self.rows.num_rows)


class Bucketer:
    """Group normalised rows by epoch key; see the module docstring.

    The rows waiting in open epochs are kept as the parts they arrived in, each under a part
    number, per epoch key. :meth:`waiting_with_ids` and :meth:`pop_ids` look ids up in an index
    of the waiting rows' ids to the parts holding them, built at the first look-up (a replay,
    which never looks ids up, never builds it) and then kept as rows are added, popped and
    emitted, so that a look-up reads only the parts that hold one of its ids, however many
    files wait in the open epochs.

    Parameters
    ----------
    spec : EpochSpec or str
        How rows map to epochs.
    """

    def __init__(self, spec: EpochSpec | str) -> None:
        self.spec = EpochSpec.parse(spec) if isinstance(spec, str) else spec
        self._rows: dict[int, dict[int, pa.Table]] = {}  # key -> {part number: rows}, in arrival order
        self._part_key: dict[int, int] = {}  # part number -> its key
        self._next_part = 0
        # id -> the number of the part holding it, or a list of them (an id in several parts)
        self._id_parts: dict[str, int | list[int]] | None = None
        self._rejects: dict[int, list[pa.Table]] = {}
        self._unplaced: list[pa.Table] = []
        self._schema: pa.Schema | None = None
        self._next_index = 0
        self._closed_through: int | None = None
        self._max_key: int | None = None
        self.n_rows = 0
        self.n_late = 0
        self.n_moved = 0  # late rows put in the next open epoch (late="next-epoch")

    @property
    def max_key(self) -> int | None:
        """Largest epoch key seen so far in the rows (None before any row).

        A streaming consumer that tolerates rows up to one epoch late calls
        ``pop_through(bucketer.max_key - 1)`` after each batch.
        """
        return self._max_key

    @property
    def closed_through(self) -> int | None:
        """Largest key already yielded (later rows for it or before it are late), or None."""
        return self._closed_through

    def add(self, batch: pa.RecordBatch | pa.Table, late: str = "reject") -> None:
        """Add normalised rows (any time order).

        ``late`` says what happens to rows of an already closed epoch: ``"reject"`` files
        them as rejects with reason ``"late row for a closed epoch"``; ``"next-epoch"`` puts
        them in the first epoch not yet closed (their ``time`` is kept as it was).
        """
        if late not in LATE_POLICIES:
            raise ValueError(f"late must be one of {LATE_POLICIES}, got {late!r}")
        table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        if self._schema is None:
            self._schema = table.schema
        elif table.schema != self._schema:
            table = table.cast(self._schema)
        if table.num_rows == 0:
            return
        keys = self.spec.keys(table)
        top = int(keys.max())
        self._max_key = top if self._max_key is None else max(self._max_key, top)
        if self._closed_through is not None:
            is_late = keys <= self._closed_through
            if is_late.any() and late == "next-epoch":
                self.n_moved += int(is_late.sum())
                keys = np.where(is_late, self._closed_through + 1, keys)
            elif is_late.any():
                self._late(table.filter(pa.array(is_late)))
                table, keys = table.filter(pa.array(~is_late)), keys[~is_late]
        self.n_rows += table.num_rows
        for key, part in _split(table, keys):
            self._store(key, part)

    def _store(self, key: int, part: pa.Table) -> None:
        """File waiting rows under ``key`` as a new part (indexed, once the index exists)."""
        number = self._next_part
        self._next_part += 1
        self._rows.setdefault(key, {})[number] = part
        self._part_key[number] = key
        if self._id_parts is not None:
            self._index({number: part})

    @staticmethod
    def _ids_of(parts: dict[int, pa.Table]) -> tuple[list, list[int]]:
        """The ids of ``parts`` (number -> rows) and, aligned, the number of each one's part."""
        ids: list = []
        numbers: list[int] = []
        for number, part in parts.items():
            ids += part.column("id").to_pylist()
            numbers += [number] * part.num_rows
        return ids, numbers

    def _index(self, parts: dict[int, pa.Table]) -> None:
        """Add the ids of ``parts`` (number -> rows) to the index: each id maps to its part's
        number, or to a list of numbers when several parts hold it."""
        index = self._id_parts
        ids, numbers = self._ids_of(parts)
        new = dict(zip(ids, numbers))
        if len(new) == len(ids) and None not in new and new.keys().isdisjoint(index.keys()):
            index.update(new)  # the usual case: ids not yet held, each once
            return
        for x, number in zip(ids, numbers):
            held = index.get(x)
            if x is None or held == number:
                continue
            if held is None:
                index[x] = number
            elif not isinstance(held, list):
                index[x] = [held, number]
            elif number not in held:
                held.append(number)

    def _unindex(self, parts: dict[int, pa.Table]) -> None:
        """Take the ids of ``parts`` (number -> rows), which leave the bucketer, out of the index."""
        index = self._id_parts
        for x, number in zip(*self._ids_of(parts)):
            held = index.pop(x, None)
            if held is None or held == number:
                continue
            if not isinstance(held, list):  # held by another part only
                index[x] = held
                continue
            left = [n for n in held if n != number]  # the id is in other parts too: they stay
            index[x] = left if len(left) > 1 else left[0]

    def _pop_key(self, key: int) -> list[pa.Table]:
        """Remove and return the parts waiting under ``key`` (none: an empty list)."""
        parts = self._rows.pop(key, {})
        for number in parts:
            del self._part_key[number]
        if parts and self._id_parts is not None:
            self._unindex(parts)
        return list(parts.values())

    def _id_index(self) -> dict[str, int | list[int]]:
        if self._id_parts is None:
            self._id_parts = {}
            parts = {n: t for held in self._rows.values() for n, t in held.items()}
            if parts:
                self._index(parts)
        return self._id_parts

    def add_rejects(self, rejects: pa.Table, place: bool = True) -> None:
        """File source rejects under their epoch (by ``time``/``epoch``) or the next one yielded;
        with ``place=False`` all of them go with the next one yielded (rows outside the time
        range: their own epochs are the ones the range keeps out)."""
        if rejects.num_rows == 0:
            return
        rejects = rejects.select(REJECT_SCHEMA.names).cast(REJECT_SCHEMA)
        if not place:
            self._unplaced.append(rejects)
            return
        col = "epoch" if self.spec.kind == "column" else "time"
        known = np.asarray(rejects.column(col).is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        if (~known).any():
            self._unplaced.append(rejects.filter(pa.array(~known)))
        if known.any():
            placed = rejects.filter(pa.array(known))
            keys = (int64_values(placed.column("epoch")) if col == "epoch"
                    else self.spec.time_keys(placed.column("time")))
            if self._closed_through is not None:
                late = keys <= self._closed_through
                if late.any():
                    self._unplaced.append(placed.filter(pa.array(late)))
                    placed, keys = placed.filter(pa.array(~late)), keys[~late]
            for key, part in _split(placed, keys):
                self._rejects.setdefault(key, []).append(part)

    def waiting_with_ids(self, ids) -> pa.Table:
        """The rows waiting in open epochs whose ``id`` is among ``ids`` (possibly none)."""
        return self._with_ids(ids, pop=False)

    def pop_ids(self, ids) -> pa.Table:
        """Remove and return the rows waiting in open epochs whose ``id`` is among ``ids``: a
        streaming consumer that keeps, of two rows with one id, the first in :data:`ROW_ORDER`
        takes out the one that came first but is not."""
        return self._with_ids(ids, pop=True)

    def _with_ids(self, ids, pop: bool) -> pa.Table:
        ids = list(dict.fromkeys(ids))
        index = self._id_index()
        # the parts holding one of the ids, in key order and, within a key, in arrival order
        held = (index.get(x) for x in ids)
        numbers = sorted({(self._part_key[n], n) for h in held if h is not None
                          for n in (h if isinstance(h, list) else (h,))})
        wanted = pa.array(ids, pa.string())
        found = []
        for key, number in numbers:
            part = self._rows[key][number]
            hit = np.asarray(pc.is_in(part.column("id"), value_set=wanted).to_numpy(zero_copy_only=False), dtype=bool)
            found.append(part.filter(pa.array(hit)))
            if pop:
                kept = part.filter(pa.array(~hit))
                if kept.num_rows:
                    self._rows[key][number] = kept
                else:
                    del self._rows[key][number], self._part_key[number]
                    if not self._rows[key]:
                        del self._rows[key]
        if pop:  # every row of these ids is out: every part holding one was read
            for x in ids:
                index.pop(x, None)
        out = pa.concat_tables(found) if found else (self._schema or pa.schema([])).empty_table()
        if pop:
            self.n_rows -= out.num_rows
        return out

    def pop_rows_before(self, key: int) -> pa.Table | None:
        """Remove and return the pending rows of the epochs before ``key`` (None if there are
        none), and send their filed rejects with the next epoch yielded: a streaming consumer
        that bounds how far back its first epoch may lie, before any epoch closed, so that one
        stray old row does not open every epoch since."""
        keys = sorted(k for k in self._rows if k < key)
        for k in sorted(k for k in self._rejects if k < key):
            self._unplaced.extend(self._rejects.pop(k))
        if not keys:
            return None
        out = pa.concat_tables([t for k in keys for t in self._pop_key(k)])
        self.n_rows -= out.num_rows
        return out

    def _late(self, rows: pa.Table) -> None:
        self.n_late += rows.num_rows
        self._unplaced.append(reject_rows(rows, LATE_ROW))

    def pop_through(self, key: int) -> Iterator[Epoch]:
        """Yield (and close) every epoch with key <= ``key`` in key order, empty gaps included.

        With a watermark, this is the streaming step: once the watermark passes an epoch it
        is yielded (empty if no row came) and later rows for it count as late.
        """
        key = int(key)
        if self._closed_through is None:
            # the first epoch is the first with rows: earlier rejects open no epochs (one row
            # dated centuries back would otherwise yield every empty epoch since), they go with it
            first = min((k for k in self._rows if k <= key), default=None)
            if first is None:
                return
            for k in sorted(k for k in self._rejects if k < first):
                self._unplaced.extend(self._rejects.pop(k))
        pending = sorted(k for k in set(self._rows) | set(self._rejects) if k <= key)
        if not self.spec.fills_gaps:
            order: Iterable[int] = pending
        elif self._closed_through is not None:
            order = range(self._closed_through + 1, key + 1)
        elif pending:
            order = range(pending[0], key + 1)
        else:
            order = ()
        for k in order:
            yield self._emit(k)

    def drain(self) -> Iterator[Epoch]:
        """Yield every pending epoch in key order (a replay: call after adding all rows).

        Key-less rejects go with the first epoch yielded; if there is none they stay in
        :meth:`leftover_rejects`.
        """
        if not self._rows:  # rejects alone open no epoch: they stay in leftover_rejects
            for k in sorted(self._rejects):
                self._unplaced.extend(self._rejects.pop(k))
            return
        last = max(self._rows)
        for k in sorted(k for k in self._rejects if k > last):  # no epochs after the last with rows
            self._rejects.setdefault(last, []).extend(self._rejects.pop(k))
        yield from self.pop_through(last)

    def leftover_rejects(self) -> pa.Table:
        """Rejects not yet attached to any epoch (no epoch yielded since they arrived)."""
        out = pa.concat_tables(self._unplaced) if self._unplaced else empty_rejects()
        self._unplaced = []
        return out

    def __iter__(self) -> Iterator[Epoch]:
        return self.drain()

    # ---- persistence (a streaming consumer checkpoints its open epochs) ----------------
    def state(self) -> tuple[dict, pa.Table, pa.Table, pa.Table]:
        """What :meth:`restore` needs: JSON scalars, the pending rows and the pending rejects
        filed under an epoch (both with their epoch in a ``key`` column: a row moved to the
        next epoch keeps its own time), and the rejects waiting for the next epoch."""
        scalars = {"next_index": self._next_index, "closed_through": self._closed_through,
                   "max_key": self._max_key, "n_rows": self.n_rows, "n_late": self.n_late, "n_moved": self.n_moved}
        rows = _keyed({k: list(parts.values()) for k, parts in self._rows.items()}, self._schema)
        rejects = _keyed(self._rejects, REJECT_SCHEMA)
        unplaced = pa.concat_tables(self._unplaced) if self._unplaced else empty_rejects()
        return scalars, rows, rejects, unplaced

    @classmethod
    def restore(cls, spec: EpochSpec | str, scalars: dict, rows: pa.Table, rejects: pa.Table,
                unplaced: pa.Table) -> "Bucketer":
        """A bucketer in the state :meth:`state` returned."""
        b = cls(spec)
        b._next_index = int(scalars["next_index"])
        b._closed_through = None if scalars["closed_through"] is None else int(scalars["closed_through"])
        b._max_key = None if scalars["max_key"] is None else int(scalars["max_key"])
        b.n_rows, b.n_late, b.n_moved = int(scalars["n_rows"]), int(scalars["n_late"]), int(scalars["n_moved"])
        if "key" in rows.column_names and rows.num_columns > 1:
            b._schema = rows.schema.remove(rows.schema.get_field_index("key"))
            for key, part in _split(rows.drop_columns(["key"]), int64_values(rows.column("key"))):
                b._store(key, part)
        for key, part in _split(rejects.select(REJECT_SCHEMA.names).cast(REJECT_SCHEMA),
                                int64_values(rejects.column("key"))):
            b._rejects.setdefault(key, []).append(part)
        if unplaced.num_rows:
            b._unplaced.append(unplaced.select(REJECT_SCHEMA.names).cast(REJECT_SCHEMA))
        return b

    def _emit(self, key: int) -> Epoch:
        parts = self._pop_key(key)
        if parts:
            rows = in_row_order(pa.concat_tables(parts))
        elif self._schema is not None:
            rows = self._schema.empty_table()
        else:
            rows = pa.table({})
        rej = self._rejects.pop(key, []) + self._unplaced
        self._unplaced = []
        rejects = pa.concat_tables(rej) if rej else empty_rejects()
        epoch = Epoch(self._next_index, int(key), self.spec.label(key), rows, rejects)
        self._next_index += 1
        self._closed_through = key if self._closed_through is None else max(self._closed_through, key)
        return epoch


def bucket(batches: Iterable[pa.RecordBatch], spec: EpochSpec | str) -> Iterator[Epoch]:
    """Replay: read all ``batches``, then yield epochs in key order (gaps as empty epochs).

    When ``batches`` is a source with a ``rejects`` log, its rejects are filed under their
    epochs as well. If every row was rejected there is no epoch to file them under: a
    ``ValueError`` says how many there were and why.
    """
    bucketer = Bucketer(spec)
    for batch in batches:
        bucketer.add(batch)
    log = getattr(batches, "rejects", None)
    if log is not None:
        bucketer.add_rejects(log.drain())
    yield from bucketer.drain()
    left = bucketer.leftover_rejects()
    if left.num_rows:
        reasons = sorted(set(left.column("reason").to_pylist()))
        raise ValueError(f"no rows to make epochs of: all {left.num_rows} were rejected ({'; '.join(reasons)})")


def _keyed(parts: dict[int, list[pa.Table]], schema: pa.Schema | None) -> pa.Table:
    """The tables of ``parts`` stacked, with their key in a ``key`` column."""
    tables = [t.append_column("key", pa.array(np.full(t.num_rows, k, dtype=np.int64)))
              for k, ts in sorted(parts.items()) for t in ts]
    if tables:
        return pa.concat_tables(tables)
    schema = schema if schema is not None else pa.schema([])
    return schema.append(pa.field("key", pa.int64())).empty_table()


def _split(table: pa.Table, keys: np.ndarray) -> Iterator[tuple[int, pa.Table]]:
    """(key, rows) groups of a table; stable, so rows keep arrival order within a key."""
    if keys.size == 0:
        return
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    cuts = np.flatnonzero(np.diff(sorted_keys)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [keys.size]))
    if starts.size == 1:
        yield int(sorted_keys[0]), table
        return
    taken = table.take(pa.array(order))
    for a, b in zip(starts, ends):
        yield int(sorted_keys[a]), taken.slice(a, b - a)


def id_hashes(ids) -> np.ndarray:
    """64-bit hashes of document ids (within one process: Python salts string hashes)."""
    return np.fromiter((hash(i) for i in ids), dtype=np.int64, count=len(ids))


def int64_values(values) -> np.ndarray:
    """The int64 values of an array without nulls (timestamps: microseconds since 1970)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if values.null_count:
        raise ValueError("epoch keys cannot be computed for null values (normalised rows have none)")
    return np.asarray(values.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)


def _origin_us(origin: str | datetime | None) -> int:
    if origin is None:
        return 0
    if isinstance(origin, str):
        origin = datetime.fromisoformat(origin.replace("Z", "+00:00"))
    if not isinstance(origin, datetime):
        raise TypeError(f"origin must be an ISO string or datetime, got {type(origin).__name__}")
    if origin.tzinfo is None:
        origin = origin.replace(tzinfo=timezone.utc)
    delta = origin - _EPOCH0
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


# ---------------------------------------------------------------------------------- replay reading
@dataclass(frozen=True)
class TimeRange:
    """Which times a replay keeps: ``"auto"`` (the default), ``"all"``, or ``"START..END"``.

    ``START`` and ``END`` are years (``1790``) or ISO dates/times (``2015-01-01``), either may
    be empty (``"..2020"``); both ends are inclusive (``END`` = the epoch holding that time).
    ``"auto"`` keeps the rows within the span of their central bulk on either side of it
    (see :func:`auto_key_range`) and rejects the rest as ``"out of range"``, so one stray
    row at year 9999 or 1 cannot create thousands of empty epochs.
    """

    text: str = "auto"
    start_us: int | None = None
    end_us: int | None = None

    @classmethod
    def parse(cls, text: str | None) -> "TimeRange":
        text = (text or "auto").strip()
        if text.lower() in ("auto", "all"):
            return cls(text.lower())
        if ".." not in text:
            raise ValueError(f"cannot parse time range {text!r}: expected 'auto', 'all' or START..END "
                             "(years like 1790..2020 or dates like 2015-01-01..2018-12-31)")
        a, b = (t.strip() for t in text.split("..", 1))
        start, end = _range_end(a, text, False), _range_end(b, text, True)
        if start is not None and end is not None and start > end:
            raise ValueError(f"time range {text!r} ends before it starts")
        return cls(text, start, end)

    def key_range(self, spec: EpochSpec) -> tuple[int | None, int | None]:
        def key(us):
            if us is None:
                return None
            return int(spec.time_keys(pa.array([us], pa.int64()).cast(TIME_TYPE))[0])
        return key(self.start_us), key(self.end_us)


def _range_end(text: str, whole: str, end: bool) -> int | None:
    if not text:
        return None
    if re.fullmatch(r"[+-]?\d{1,4}", text):
        year = int(text) + (1 if end else 0)
        us = (np.datetime64(f"{year:04d}-01-01") if year > 0 else np.datetime64(year - 1970, "Y"))
        return int(np.datetime64(us, "us").astype(np.int64)) - (1 if end else 0)
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"cannot read {text!r} in time range {whole!r}: use a year or an ISO date") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    delta = t - _EPOCH0
    us = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if end and len(text) == 10:  # a date: through the end of that day
        us += 86_400_000_000 - 1
    return us


def auto_key_range(keys: np.ndarray, counts: np.ndarray) -> tuple[int, int] | None:
    """The epoch keys an ``"auto"`` time range keeps, from the rows per key.

    The bulk runs from the key of the ``k``-th row to that of the ``k``-th last, with
    ``k = max(1, 1% of the rows)``; keys within the bulk's own span (at least 10 epochs) of
    it are kept. None (keep all) for fewer than 20 rows.
    """
    order = np.argsort(keys)
    keys, counts = np.asarray(keys)[order], np.asarray(counts)[order]
    n = int(counts.sum())
    if n < 20 or keys.size < 2:
        return None
    trim = max(1, int(0.01 * n))
    cum = np.cumsum(counts)
    lo = int(keys[np.searchsorted(cum, trim, side="right")])
    hi = int(keys[np.searchsorted(cum, n - trim - 1, side="right")])
    margin = max(hi - lo, 10)
    return lo - margin, hi + margin


class _IdSet:
    """Hashes of the ids seen so far, as sorted numpy runs (8 bytes per id, merged like a
    binary counter). Two different ids collide with probability about n^2 / 2^65."""

    def __init__(self) -> None:
        self._runs: list[np.ndarray] = []

    def first_seen(self, ids: list[str]) -> np.ndarray:
        """Mask of the ids not seen before (in earlier calls or earlier in ``ids``)."""
        h = id_hashes(ids)
        _, first = np.unique(h, return_index=True)
        fresh = np.zeros(h.size, dtype=bool)
        fresh[first] = True
        for run in self._runs:
            pos = np.searchsorted(run, h)
            hit = (pos < run.size) & (run[np.minimum(pos, run.size - 1)] == h)
            fresh &= ~hit
        new = np.sort(h[fresh])
        while self._runs and self._runs[-1].size <= new.size:
            new = np.sort(np.concatenate([self._runs.pop(), new]), kind="mergesort")
        if new.size:
            self._runs.append(new)
        return fresh


class IdWindow:
    """The ids a stream took lately, for ``"duplicate id"`` rejects in bounded memory: those of
    the rows waiting in open epochs, and those of the documents of the last ``n_epochs``
    published epochs (older ones are forgotten). Ids are kept as 64-bit hashes, 8 bytes each
    in the published window; two different ids collide with probability about n^2 / 2^65.

    The hashes are this process's (Python's ``hash``): a restarted service builds the window
    again from its open rows and its last published epochs.
    """

    def __init__(self, n_epochs: int) -> None:
        if int(n_epochs) < 1:
            raise ValueError(f"an id window holds at least 1 epoch, got {n_epochs}")
        self.n_epochs = int(n_epochs)
        self._open: dict[int, int] = {}  # hash -> rows waiting with it
        self._published: deque[np.ndarray] = deque(maxlen=self.n_epochs)  # sorted hashes per epoch

    def fresh(self, ids: list[str]) -> np.ndarray:
        """Mask of the ``ids`` not taken: not waiting, not in the window, not earlier in ``ids``."""
        h = id_hashes(ids)
        fresh = np.zeros(h.size, dtype=bool)
        fresh[np.unique(h, return_index=True)[1]] = True
        if self._open:
            fresh &= np.fromiter((x not in self._open for x in h.tolist()), dtype=bool, count=h.size)
        for run in self._published:
            if run.size:
                pos = np.minimum(np.searchsorted(run, h), run.size - 1)
                fresh &= run[pos] != h
        return fresh

    def take(self, ids) -> None:
        """The ``ids`` of rows now waiting in open epochs."""
        for x in id_hashes(ids).tolist():
            self._open[x] = self._open.get(x, 0) + 1

    def release(self, ids) -> None:
        """The ``ids`` of rows no longer waiting (fitted, or rejects after all)."""
        for x in id_hashes(ids).tolist():
            left = self._open.get(x, 0) - 1
            if left > 0:
                self._open[x] = left
            else:
                self._open.pop(x, None)

    def publish(self, ids) -> None:
        """The document ids of an epoch just published (the oldest in the window leaves it)."""
        self._published.append(np.sort(id_hashes(ids)))

    @property
    def n_ids(self) -> int:
        """Ids held: waiting and in the published window."""
        return len(self._open) + sum(r.size for r in self._published)


class EpochReader:
    """A replay's epochs read from a source in one pass and served one at a time.

    :meth:`scan` reads the source once: it computes each row's epoch key, rejects rows
    whose id was already seen (``"duplicate id"``, the first is kept) when ``unique_ids``,
    counts rows per key, and keeps the rows grouped by key, in memory up to
    ``memory_bytes`` and beyond that in sorted runs spilled to Arrow IPC files in a
    temporary directory (deleted by :meth:`close`). The time range (see :class:`TimeRange`)
    is then decided from the counts. :meth:`epochs` yields the epochs in key order
    (empty epochs between non-empty ones included, as :class:`Bucketer` does) reading each
    from the runs when it is needed, so memory holds one epoch plus at most
    ``memory_bytes`` of buffered rows, plus 8 bytes per row for duplicate detection.

    Rejects of the source are filed under their epoch; rejects with no usable time and
    rows out of range go with the first epoch.
    """

    def __init__(self, source: Iterable[pa.RecordBatch], spec: EpochSpec | str, *,
                 time_range: TimeRange | str | None = "auto", unique_ids: bool = False,
                 memory_bytes: int = 256 << 20) -> None:
        self.source = source
        self.spec = EpochSpec.parse(spec) if isinstance(spec, str) else spec
        self.time_range = time_range if isinstance(time_range, TimeRange) else TimeRange.parse(time_range)
        self.unique_ids = unique_ids
        self.memory_bytes = memory_bytes
        self.notes: list[str] = []
        self.keys: list[int] = []
        self.key_range: tuple[int | None, int | None] = (None, None)
        self.n_rows = 0
        self._schema: pa.Schema | None = None
        self._mem: dict[int, list[pa.Table]] = {}
        self._mem_bytes = 0
        self._runs: list[tuple[str, dict[int, int]]] = []
        self._tmpdir: str | None = None
        self._hist: dict[int, int] = {}
        self._rejects: list[pa.Table] = []
        self._reject_keys: dict[int, list[pa.Table]] = {}
        self._unplaced: list[pa.Table] = []
        self._out_of_range: list[int] = []
        self._times: dict[int, tuple[int, int]] = {}  # key -> earliest and latest time of its rows
        self._levels: dict[int, int] = {}  # key -> what its rows' times are dated to (resolution_levels)
        #: the earliest and latest time of the rows kept (microseconds since 1970), after
        #: :meth:`scan`; None for rows without times
        self.time_span_us: tuple[int, int] | None = None
        #: what the times of the rows kept are dated to (:func:`time_resolution`), after :meth:`scan`
        self.time_resolution: str | None = None
        self._scanned = False

    # ---- pass 1 ----------------------------------------------------------------------
    def scan(self) -> "EpochReader":
        ids = _IdSet() if self.unique_ids else None
        for batch in self.source:
            table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
            if self._schema is None:
                self._schema = table.schema
            if table.num_rows == 0:
                continue
            if ids is not None:
                fresh = ids.first_seen(table.column("id").to_pylist())
                if not fresh.all():
                    self._rejects.append(reject_rows(table.filter(pa.array(~fresh)), DUPLICATE_ID))
                    table = table.filter(pa.array(fresh))
            keys = self.spec.keys(table)
            uniq, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
            for k, c in zip(uniq.tolist(), counts.tolist()):
                self._hist[k] = self._hist.get(k, 0) + c
            if "time" in table.column_names:  # per key: the time range decides which keys are kept
                levels = np.zeros(uniq.size, dtype=np.int8)
                np.maximum.at(levels, inverse.ravel(), resolution_levels(table.column("time")))
                for k, v in zip(uniq.tolist(), levels.tolist()):
                    self._levels[k] = max(self._levels.get(k, v), v)
            self.n_rows += table.num_rows
            for key, part in _split(table, keys):
                self._mem.setdefault(key, []).append(part)
                self._mem_bytes += part.nbytes
                if "time" in part.column_names:
                    t = int64_values(part.column("time"))
                    lo, hi = self._times.get(key, (int(t.min()), int(t.max())))
                    self._times[key] = (min(lo, int(t.min())), max(hi, int(t.max())))
            if self._mem_bytes > self.memory_bytes:
                self._spill()
        log = getattr(self.source, "rejects", None)
        if log is not None:
            self._rejects.append(log.drain())
        self._plan()
        self._scanned = True
        return self

    def _spill(self) -> None:
        import tempfile

        if self._tmpdir is None:
            self._tmpdir = tempfile.mkdtemp(prefix="streamtree-epochs-")
        path = f"{self._tmpdir}/run-{len(self._runs):06d}.arrows"
        index = {}
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, self._schema) as writer:
            for i, key in enumerate(sorted(self._mem)):
                writer.write_table(pa.concat_tables(self._mem[key]).combine_chunks())
                index[key] = i
        self._runs.append((path, index))
        self._mem, self._mem_bytes = {}, 0

    def _plan(self) -> None:
        col = "epoch" if self.spec.kind == "column" else "time"
        rejects = pa.concat_tables([r.select(REJECT_SCHEMA.names).cast(REJECT_SCHEMA) for r in self._rejects]) \
            if self._rejects else empty_rejects()
        known = np.asarray(rejects.column(col).is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        if (~known).any():
            self._unplaced.append(rejects.filter(pa.array(~known)))
        placed = rejects.filter(pa.array(known))
        reject_keys = (int64_values(placed.column("epoch")) if col == "epoch"
                       else self.spec.time_keys(placed.column("time"))) if placed.num_rows else np.zeros(0, np.int64)
        lo, hi = None, None
        if self.spec.fills_gaps and self._hist:
            if self.time_range.text == "auto":
                keys = np.fromiter(self._hist, dtype=np.int64)
                got = auto_key_range(keys, np.fromiter(self._hist.values(), dtype=np.int64))
                if got is not None and (keys.min() < got[0] or keys.max() > got[1]):
                    lo, hi = got
            elif self.time_range.text != "all":
                lo, hi = self.time_range.key_range(self.spec)
        self.key_range = (lo, hi)

        def inside(k: int) -> bool:
            return (lo is None or k >= lo) and (hi is None or k <= hi)

        self._out_of_range = sorted(k for k in self._hist if not inside(k))
        n_out = sum(self._hist[k] for k in self._out_of_range)
        # the epochs span the rows kept; a reject outside that span opens no epoch (one blank row
        # dated centuries away would otherwise publish every empty epoch in between): one before
        # it goes with the first epoch, as rejects without a time do, one after it with the last
        kept = sorted(k for k in self._hist if inside(k))
        if kept and all(k in self._times for k in kept):
            self.time_span_us = (min(self._times[k][0] for k in kept), max(self._times[k][1] for k in kept))
            self.time_resolution = resolution_of_level(max(self._levels[k] for k in kept))
        for key, part in _split(placed, reject_keys):
            if not kept or not inside(key) or key < kept[0]:
                self._unplaced.append(part)
            else:  # within the span under its epoch, after it under the last (as Bucketer.drain)
                self._reject_keys.setdefault(min(key, kept[-1]), []).append(part)
        if self.spec.fills_gaps and kept:
            self._check_span(kept)
            self.keys = list(range(kept[0], kept[-1] + 1))
        else:
            self.keys = sorted(set(kept) | set(self._reject_keys))
        if lo is not None or hi is not None:
            span = f"{self.spec.label(lo) if lo is not None else '...'} to {self.spec.label(hi) if hi is not None else '...'}"
            how = "auto: the bulk of the rows and its span on either side" if self.time_range.text == "auto" \
                else f"--time-range {self.time_range.text}"
            self.notes.append(f"time range {span} ({how}): {counted(n_out, 'row')} outside it rejected as "
                              f"'{OUT_OF_RANGE}'" + ("; --time-range all keeps them" if n_out else ""))

    def _check_span(self, kept: list[int]) -> None:
        """Refuse a plan of mostly empty epochs in two groups far apart, which a misread time
        explains (a file in milliseconds read as seconds, dates read as epoch seconds): every
        epoch between the first and the last is fitted, about 1.7 ms each when empty, so such a
        span can run for hours. Sparse rows spread over a long span (one gap never holding half
        of it) are a stream of their own and pass; so does a range the user gave
        (``--time-range START..END``)."""
        n_span, n_held = kept[-1] - kept[0] + 1, len(kept)
        if self.time_range.text not in ("auto", "all") or n_span <= MAX_EMPTY_EPOCHS \
                or n_span <= EMPTY_SPAN_RATIO * n_held:
            return
        # sparse rows spread over the span are a stream of their own; rows in two groups far
        # apart, one gap holding most of the span, are the misread time
        if int(np.diff(np.asarray(kept, dtype=np.int64)).max()) <= n_span // 2:
            return
        first, last = self.spec.label(kept[0]), self.spec.label(kept[-1])
        counts = sorted(((self._hist[k], k) for k in kept), reverse=True)[:3]
        busiest = ", ".join(f"{self.spec.label(k)} ({counted(n, 'row')})" for n, k in counts)
        raise ValueError(
            f"the rows' times span {n_span:,} epochs of {self.spec.text!r} ({first} to {last}) but only "
            f"{n_held:,} of them hold rows (most: {busiest}), in two groups far apart; fitting every empty epoch "
            f"between them would take about {n_span * EMPTY_EPOCH_SECONDS / 60:,.0f} min. Usually a time column is "
            "read in the wrong unit or format in some files: check "
            "--time-unit and --time-format, or keep the stream's own period with --time-range START..END "
            "(rows outside it are rejected, not dropped)")

    def reject_counts(self) -> Counter:
        """Rejects so far by reason: the source's, duplicates and rows out of range."""
        counts: Counter = Counter()
        for table in self._rejects:
            counts.update(_reason_kind(r) for r in table.column("reason").to_pylist())
        n_out = sum(self._hist[k] for k in self._out_of_range)
        if n_out:
            counts[OUT_OF_RANGE] += n_out
        return counts

    # ---- pass 2 ----------------------------------------------------------------------
    @property
    def n_epochs(self) -> int:
        return len(self.keys)

    def _rows(self, key: int) -> pa.Table:
        parts = []
        for path, index in self._runs:
            if key in index:
                with pa.OSFile(path, "rb") as f:
                    parts.append(pa.Table.from_batches([pa.ipc.open_file(f).get_batch(index[key])]))
        parts.extend(self._mem.get(key, []))
        if parts:  # read in this order already (files in sorted path order): checked, not copied
            return in_row_order(pa.concat_tables(parts))
        return self._schema.empty_table() if self._schema is not None else pa.table({})

    def epochs(self, start: int = 0) -> Iterator[Epoch]:
        """Yield the epochs with index >= ``start`` in key order (earlier ones are not read)."""
        if not self._scanned:
            self.scan()
        for index, key in enumerate(self.keys):
            if index < start:
                continue
            rej = list(self._reject_keys.get(key, []))
            if index == 0:
                rej += self._unplaced
                for k in self._out_of_range:
                    rej.append(reject_rows(self._rows(k), OUT_OF_RANGE))
            rejects = pa.concat_tables([r.select(REJECT_SCHEMA.names).cast(REJECT_SCHEMA) for r in rej]) \
                if rej else empty_rejects()
            yield Epoch(index, int(key), self.spec.label(key), self._rows(key), rejects)

    def close(self) -> None:
        """Delete the spilled runs (the temporary directory this reader created)."""
        if self._tmpdir is not None:
            import shutil

            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
            self._runs = []

    def __enter__(self) -> "EpochReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
