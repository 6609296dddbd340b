"""Event-time watermark: when an epoch of a live stream is complete and may be fitted.

Documents arrive out of order. The service keeps the largest event time seen so far, ``max``,
and trusts that no document older than ``max - allowed_lateness`` is still on its way: that
time is the *watermark*. Epoch ``k`` (``[start(k), start(k + 1))`` of an
:class:`~streamtree.epochs.EpochSpec`) is *closed* once the watermark reaches its end,
``start(k + 1) <= watermark``; it is then fitted and published, and a row that arrives for it
later is *late* (a reject with reason ``"late row for a closed epoch"``, or moved to the first
open epoch with ``late="next-epoch"``).

A quiet stream would hold its newest epoch open forever, because only newer documents move
the watermark. With an idle timeout, once nothing new has landed for that long the stream
counts as *idle* and every epoch up to and including the one holding ``max`` is closed.

Pure: integers (microseconds since 1970-01-01 UTC) in, epoch keys out; no clock, no I/O.
The caller decides when the stream is idle (it owns the clock).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from streamtree.epochs import EpochSpec
from streamtree.records import TIME_TYPE

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|m|h|d|w|y)?\s*$")
# Seconds per unit; "y" is the mean Gregorian year (for calendar epochs such as decades).
YEAR1_US = -62_135_596_800 * 1_000_000  # 0001-01-01T00:00Z
_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0, "y": 365.2425 * 86400.0}


def parse_duration(text: str) -> float:
    """Seconds in ``"0"``, ``"90s"``, ``"15m"``, ``"2h"``, ``"1d"``, ``"2w"``, ``"1.5y"``.

    A bare number is seconds. ``y`` is the mean Gregorian year (365.2425 days).
    """
    m = _DURATION_RE.match(str(text).lower())
    if not m:
        raise ValueError(f"cannot parse duration {text!r}: expected e.g. '0', '30s', '15m', '2h', '1d', '2w', '1y'")
    return float(m.group(1)) * _SECONDS[m.group(2) or "s"]


def format_duration(seconds: float) -> str:
    """``86400.0`` as ``"1d"``, ``5400.0`` as ``"90m"``, ``2.5`` as ``"2.5s"``: a duration as
    :func:`parse_duration` reads it, in the largest whole unit of days, hours or minutes."""
    for unit in ("d", "h", "m"):
        n = _SECONDS[unit]
        if seconds >= n and seconds % n == 0:
            return f"{int(seconds // n)}{unit}"
    return f"{seconds:g}s"


@dataclass
class Watermark:
    """Largest event time seen and the epochs it closes.

    Parameters
    ----------
    spec : EpochSpec
        Time-based epochs (``fixed``, ``years`` or ``months``); column epochs carry no event
        time and cannot be closed by a watermark.
    allowed_lateness_us : int
        How far behind the newest document a document may still arrive, in microseconds.
    max_time_us : int or None
        Largest event time observed so far (None before the first document).
    """

    spec: EpochSpec
    allowed_lateness_us: int = 0
    max_time_us: int | None = None

    def __post_init__(self) -> None:
        if self.spec.kind == "column":
            raise ValueError("a watermark needs event-time epochs (e.g. '1d', 'month', '10y'), not column epochs")
        if int(self.allowed_lateness_us) < 0:
            raise ValueError(f"allowed lateness must be >= 0, got {self.allowed_lateness_us}")
        self.allowed_lateness_us = int(self.allowed_lateness_us)

    def observe(self, times) -> None:
        """Take the event times of newly accepted rows (timestamp array or int64 microseconds)."""
        if isinstance(times, (pa.Array, pa.ChunkedArray)):
            if len(times) == 0 or times.null_count == len(times):
                return
            import pyarrow.compute as pc

            top = pc.max(times.cast(TIME_TYPE).cast(pa.int64())).as_py()
        else:
            arr = np.asarray(times, dtype=np.int64)
            if arr.size == 0:
                return
            top = int(arr.max())
        if top is not None and (self.max_time_us is None or top > self.max_time_us):
            self.max_time_us = int(top)

    @property
    def value_us(self) -> int | None:
        """The watermark, ``max_time - allowed_lateness`` (None before the first document)."""
        return None if self.max_time_us is None else self.max_time_us - self.allowed_lateness_us

    def key_of(self, time_us: int) -> int:
        """Epoch key holding the instant ``time_us``."""
        return int(self.spec.time_keys(pa.array([int(time_us)], pa.int64()).cast(TIME_TYPE))[0])

    def closable_through(self, *, idle: bool = False) -> int | None:
        """Largest epoch key the watermark has closed (None: none yet).

        An epoch is closed when its end is at or before the watermark, i.e. every key below
        the one holding the watermark. When the stream is ``idle``, the epoch holding the
        newest event time is closed as well (lateness no longer holds anything back).
        """
        if self.max_time_us is None:
            return None
        if idle:
            return self.key_of(self.max_time_us)
        if self.value_us < YEAR1_US:  # lateness reaches before the calendar: nothing closed
            return None
        return self.key_of(self.value_us) - 1

    def state(self) -> dict:
        """JSON state for a checkpoint."""
        return {"max_time_us": self.max_time_us, "allowed_lateness_us": self.allowed_lateness_us}


def is_idle(now_s: float, last_arrival_s: float | None, idle_timeout_s: float | None) -> bool:
    """Whether a stream whose last file arrived at ``last_arrival_s`` counts as idle at ``now_s``
    (seconds on one clock: the service's is the wall clock, against the time its newest file
    landed)."""
    if idle_timeout_s is None or last_arrival_s is None:
        return False
    return now_s - last_arrival_s >= idle_timeout_s


__all__ = ["YEAR1_US", "Watermark", "format_duration", "is_idle", "parse_duration"]
