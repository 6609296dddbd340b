"""A landing zone: a folder (local or any ``pyarrow.fs`` URI prefix) where data files arrive.

:class:`LandingZone` lists the folder on every poll and hands out the files that are *ready*,
oldest first; :func:`read_landed` reads one of them whole into normalised rows and rejects
(the same normalisation, ids and reject reasons as a replay's file source).

When is a file ready?
---------------------
A file still being written must never be read half-way. The conventions, from the most to
the least robust:

* **Write elsewhere, then rename into place.** Names (or folders) starting with ``.`` or
  ``_`` and names ending in ``.tmp``, ``.part``, ``.partial``, ``.inprogress``,
  ``.crdownload``, ``.swp`` or ``~`` are never read, so a writer can write ``.x.parquet`` or
  ``x.parquet.tmp`` and rename it when done (atomic on local and HDFS file systems; object
  stores publish an object only once its upload is complete, so there a plain upload is
  already safe).
* **A ``_SUCCESS`` marker** (what Spark and Hadoop jobs write): with
  ``require_success=True`` a file is read only once its folder holds ``_SUCCESS``. Its files
  then land when the marker does.
* **Size stability** (the fallback for writers that write in place): a file is ready once its
  size and modification time were the same on two successive polls, or its modification
  time is at least ``settle`` seconds old. A writer that pauses longer than that in the
  middle of a file defeats this rule; use one of the conventions above for such writers.

Files are handed out in the order they landed, ``(landing time, name)``: the landing time
(:attr:`LandedFile.arrived_ns`) is, on a local disk, the file's status-change time, which a
write, a copy, a rename into the folder or a chmod sets and no copy can carry over from its
source (``cp -p`` and ``rsync -a`` keep the modification time, so that cannot be the order);
on an object store the upload time; with a ``_SUCCESS`` marker the later of the file's and
the marker's. A file that is ready waits while a file that landed before it is still
settling. So a restarted service that finds several files at once takes them in the order a
service running all along took them. (A file that a service could not read yet and that
becomes readable without a change of its own, e.g. through a folder's permissions or an
I/O error that passes, keeps its old landing time: a restart may take it before files a
service running all along took before it.)

Files with an unknown extension (``README.txt``) are listed in :attr:`LandingZone.ignored`
and logged once; they are not data.

A ready file that cannot be read *now* (no permission, an I/O error, empty, or changing while
it is read) raises :class:`LandingNotReady` rather than :class:`LandingError`: the caller
leaves it for a later poll, since a chmod, or the end of a write, does not change what the
file will hold. Only a file malformed as it stands is a :class:`LandingError`.

Polling, not OS file events: a poll is one listing (cheap next to fitting an epoch), it works
the same on local disks, NFS and object stores (which have no inotify), and a missed event
cannot lose a file. An event library would only shorten the latency below the poll interval.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.ipc as paipc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from connectors.sources.base import SourceError, check_columns, normalise, normalised_schema
from connectors.sources.files import (PARQUET_READ, codec_of, compression_extension, content_digest,
                                      csv_parse_options, file_format, format_of, misnamed, partition_keys,
                                      resolve)
from connectors.sources.times import UNIT_NAMES, TimeParser
from streamtree.records import REJECT_SCHEMA, empty_rejects

logger = logging.getLogger(__name__)

SUCCESS_MARKER = "_SUCCESS"
PARTIAL_SUFFIXES = (".tmp", ".part", ".partial", ".inprogress", ".crdownload", ".swp", "~")
_BLOCK_BYTES = 4 << 20


class LandingError(SourceError):
    """A landed file cannot be read (corrupt, wrong format, a mapped column missing)."""


class LandingNotReady(SourceError):
    """A landed file cannot be read *now*, though it may be later: no permission to read it, an
    I/O error, no byte in it yet, or its size or modification time changed while it was read.
    It is left for a later poll, not recorded as unreadable."""


@dataclass(frozen=True)
class LandedFile:
    """A ready file in the landing zone.

    Attributes
    ----------
    path : str
        Path on the landing file system.
    name : str
        Path below the landing root (the ``source`` column of its rows, and default ids
        ``"<name>:<position>"``, as in a replay of the landing folder).
    size : int
    mtime_ns : int
        Modification time (nanoseconds since 1970); on object stores the upload time.
    ready_ns : int
        When the file became complete: its ``mtime_ns``, or its ``_SUCCESS`` marker's.
    format : str
    arrived_ns : int
        When the file landed, the order files are taken in and a service's idle clock
        (nanoseconds since 1970): on a local disk its status-change time (a copy, move or
        rename into the folder sets it, and unlike
        the modification time no copy can carry it over from its source, so a file copied in
        with old times kept does not look old); elsewhere ``mtime_ns`` (an object store's upload
        time). With a ``_SUCCESS`` marker, the later of that and the marker's own; never later
        than the poll (a clock running ahead cannot hold the idle clock off). It is the file's,
        not this process's, so restarts and separate ``--once`` runs read the same value.
    """

    path: str
    name: str
    size: int
    mtime_ns: int
    ready_ns: int
    format: str
    arrived_ns: int


@dataclass
class LandingZone:
    """The files of a landing folder, handed out once each as they become ready.

    Parameters
    ----------
    uri : str
        Local folder or ``pyarrow.fs`` URI prefix (``s3://bucket/landing/``).
    settle : float
        A file whose modification time is this many seconds old is ready even if it was
        not seen on the previous poll (so a restart need not wait two polls for old files).
    require_success : bool
        Read a file only when its folder holds a ``_SUCCESS`` marker.
    format : str, optional
        Force one format (one of ``parquet``, ``ipc``, ``ipc-stream``, ``jsonl``, ``csv``,
        ``tsv``) instead of reading it from the extension.
    delimiter : str, optional
        Field delimiter of CSV files (default ``,``, or a tab for ``.tsv`` files and
        ``format="tsv"``); read as a replay's source reads it
        (:func:`connectors.sources.files.file_format`).
    """

    uri: str
    settle: float = 10.0
    require_success: bool = False
    format: str | None = None
    delimiter: str | None = None
    ignored: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.format, self.delimiter = file_format(self.format, self.delimiter)
        self.fs, root = resolve(self.uri)
        self.root = root.rstrip("/")
        self._seen: dict[str, tuple[int, int]] = {}  # name -> (size, mtime_ns) at the last poll
        self._local = isinstance(self.fs, pafs.LocalFileSystem)

    def check(self) -> None:
        """Raise :class:`SourceError` if the landing folder does not exist or is a file."""
        try:
            info = self.fs.get_file_info(self.root)
        except OSError as exc:
            raise SourceError(self.uri, f"cannot stat the landing folder: {exc}") from None
        if info.type == pafs.FileType.File:
            raise SourceError(self.uri, "the landing location is a file; give the folder files land in")
        if info.type == pafs.FileType.NotFound and "://" not in self.uri:
            raise SourceError(self.uri, "no such landing folder; create it (files land in it) or fix the path")

    def name_of(self, path: str) -> str:
        prefix = self.root + "/"
        return path[len(prefix):] if path.startswith(prefix) else os.path.basename(path)

    def poll(self, skip=frozenset(), now: float | None = None) -> list[LandedFile]:
        """The ready files whose names are not in ``skip``, in ``(arrived_ns, name)`` order (the
        order they landed in), but none that landed after a file still settling."""
        now = time.time() if now is None else now
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.root, recursive=True, allow_not_found=True))
        except OSError as exc:
            logger.warning("landing %s: cannot list: %s (retrying at the next poll)", self.uri, exc)
            return []
        markers: dict[str, int] = {}
        candidates = []
        for info in infos:
            if info.type != pafs.FileType.File:
                continue
            name = self.name_of(info.path)
            parts = name.split("/")
            if parts[-1] == SUCCESS_MARKER:
                markers["/".join(parts[:-1])] = (_mtime_ns(info), self._landed_ns(info, now))
                continue
            if any(p.startswith((".", "_")) for p in parts) or parts[-1].lower().endswith(PARTIAL_SUFFIXES):
                continue
            candidates.append((info, name))
        seen, ready = {}, []
        unsettled = None  # the earliest landing time of a file not ready yet
        for info, name in candidates:
            state = (int(info.size), _mtime_ns(info))
            seen[name] = state
            if name in skip:
                continue
            fmt = self.format or format_of(name)
            if fmt is None:
                if name not in self.ignored:
                    self.ignored.add(name)
                    logger.warning("landing: ignoring %s: not a data file (expected .parquet, .arrow, .arrows, "
                                   ".jsonl, .csv, optionally compressed)", name)
                continue
            folder = "/".join(name.split("/")[:-1])
            if folder in markers:
                marker_ns, marker_landed = markers[folder]
                ready.append(LandedFile(info.path, name, state[0], state[1], marker_ns, fmt,
                                        max(self._landed_ns(info, now), marker_landed)))
            elif self.require_success:
                continue  # lands with its marker, later than anything listed now
            elif self._seen.get(name) == state or now - state[1] / 1e9 >= self.settle:
                ready.append(LandedFile(info.path, name, state[0], state[1], state[1], fmt, self._landed_ns(info, now)))
            else:
                landed = self._landed_ns(info, now)
                unsettled = landed if unsettled is None else min(unsettled, landed)
        self._seen = seen
        # A file that landed after one still settling waits for it, so that files are taken in
        # the order they landed whatever the polls saw (a restart takes them in that order).
        if unsettled is not None:
            ready = [f for f in ready if f.arrived_ns <= unsettled]
        return sorted(ready, key=lambda f: (f.arrived_ns, f.name))

    def _landed_ns(self, info: pafs.FileInfo, now: float) -> int:
        """:attr:`LandedFile.arrived_ns` of a file listed at ``now`` (seconds)."""
        landed = _mtime_ns(info)
        if self._local:
            try:
                landed = os.stat(info.path).st_ctime_ns
            except OSError:  # gone since the listing: its read will say so
                pass
        return min(landed, int(now * 1e9))

    def state_of(self, name: str) -> tuple[int, int] | None:
        """(size, mtime_ns) of ``name`` at the last poll (None if it was not there)."""
        return self._seen.get(name)


@dataclass
class LandedRead:
    """One landed file read whole: normalised good rows, rejects, rows read, content hash, and
    the time parser after it (the choices it made, :attr:`TimeParser.notes` for them) with, if
    its times read on their own would be read otherwise, a sentence saying how (``time_alone``)."""

    rows: pa.Table
    rejects: pa.Table
    n_read: int
    sha256: str
    time_parser: TimeParser | None = None
    time_alone: str | None = None


def read_landed(
    fs: pafs.FileSystem,
    landed: LandedFile,
    *,
    text_col: str,
    time_col: str | None,
    id_col: str | None = None,
    epoch_col: str | None = None,
    time_unit: str = "auto",
    batch_size: int = 8192,
    time_format: str | None = None,
    delimiter: str | None = None,
    time_parser: TimeParser | None = None,
    empty_is_final: bool = False,
) -> LandedRead:
    """Read one landed file whole and normalise it (all or nothing).

    ``time_parser`` carries the choices of a stream's earlier files (how numbers and non-ISO
    strings are read: :class:`~connectors.sources.times.TimeParser`), so that every file is
    read as the first one that decided; it is not changed (a copy makes this file's choices).
    Without it the file decides alone, as a file of its own.

    The file is read into memory once and, if its name ends in ``.gz``, ``.bz2``, ``.zst`` or
    ``.lz4``, decompressed once; its content (decompressed) gives the hash of the ledger
    (:func:`~connectors.sources.files.content_digest`, by which a replay compares the files of
    its source too), so a compressed copy of an ingested file is a duplicate, and is parsed from
    memory, so a file that fails anywhere contributes no row.
    Hive partition keys in its folder names (``year=1790/part.parquet``) are columns like
    the file's own (as strings, which the time and id parsing accept), and part of its hash: the
    same bytes in another partition are other rows, not a duplicate.

    Raises
    ------
    LandingNotReady
        Not readable now (permission, I/O error), empty (unless ``empty_is_final``: then it is
        read as a file of no rows), or changing while read: worth reading again at a later poll.
    LandingError
        Corrupt or not of its format, or a mapped column missing: the file as it stands.
    """
    name = landed.name
    # the stream's choices (or, alone, this file's own) hold for every batch
    parser = time_parser.copy() if time_parser is not None else TimeParser(time_unit, time_format)
    if landed.size == 0:
        if not empty_is_final:
            raise LandingNotReady(name, "it is empty (still being created?); it is read once it holds data, or "
                                        "taken as empty once it has not changed for the settle time")
        # an empty file that stayed empty (or whose folder is marked complete): Spark writes
        # them for empty partitions. Taken, with no rows, and ledgered like any other
        schema = normalised_schema(time_col is not None, epoch_col is not None)
        return LandedRead(schema.empty_table(), empty_rejects(), 0,
                          content_digest([], partition_keys=partition_keys(name)), parser)
    try:
        # compression=None: pyarrow would otherwise decompress by the extension already, and
        # the bytes are decompressed here, once, for every format
        with fs.open_input_stream(landed.path, compression=None) as f:
            data = f.read()
    except OSError as exc:
        raise LandingNotReady(name, f"cannot read it: {_read_reason(exc)}") from None
    if len(data) != landed.size or _state(fs, landed.path) != (landed.size, landed.mtime_ns):
        # a writer still at it: what was read may be a part, which must not become a reject
        raise LandingNotReady(name, "it changed while it was read (still being written?); it is read once its "
                                    "size and modification time hold still")
    data = _decompressed(data, name)
    digest = content_digest([data], partition_keys=partition_keys(name))
    mapped = {"text": text_col, "time": time_col, "id": id_col, "epoch": epoch_col}
    cols = list(dict.fromkeys(c for c in mapped.values() if c is not None))
    try:
        table, present = _parse(data, name, landed.format, cols, text_col, delimiter)
        table = _add_partition_keys(table, name, cols)
        check_columns(name, present + [c for c in table.column_names if c not in present], mapped)
    except LandingError:
        raise
    except SourceError as exc:
        raise LandingError(exc.path, str(exc).split(": ", 1)[-1]) from None
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise LandingError(name, f"not a valid {landed.format} file: {exc}") from None
    table = table.select(cols)
    decided = parser.choices
    good, rejects = [], []
    start = 0
    for batch in table.to_batches(max_chunksize=batch_size):
        try:
            g, r = normalise(batch, name, start, text_col=text_col, time_col=time_col, id_col=id_col,
                             epoch_col=epoch_col, time_parser=parser)
        except SourceError as exc:  # a column of a type no row of it can be read from (a bool time)
            raise LandingError(name, str(exc).split(": ", 1)[-1]) from None
        except (TypeError, ValueError, pa.ArrowException) as exc:
            raise LandingError(name, f"cannot read its columns: {exc}") from None
        start += batch.num_rows
        good.append(g)
        if r.num_rows:
            rejects.append(r.select(REJECT_SCHEMA.names).cast(REJECT_SCHEMA))
    schema = normalised_schema(time_col is not None, epoch_col is not None)
    rows = pa.Table.from_batches(good, schema=schema) if good else schema.empty_table()
    alone = None
    if time_col is not None and time_parser is not None and decided != time_parser.with_choices({}).choices:
        alone = _read_alone(table.column(time_col), batch_size, time_parser.with_choices(decided),
                            time_parser.with_choices({}))
    return LandedRead(rows, pa.concat_tables(rejects) if rejects else empty_rejects(), table.num_rows, digest,
                      parser, alone)


def _read_alone(times: pa.ChunkedArray, batch_size: int, stream: TimeParser, alone: TimeParser) -> str | None:
    """How a file's times would be read if it were the first of the stream (``alone``, a parser
    that has decided nothing), when that differs from how the stream reads them (``stream``, with
    the choices of earlier files): which choice differs and how many rows it changes, or None."""
    n = differ = 0
    for chunk in times.chunks:
        for off in range(0, len(chunk), batch_size):
            values = chunk.slice(off, batch_size)
            a, b = stream.parse(values)[0], alone.parse(values)[0]
            same = pc.fill_null(pc.equal(a, b), False)
            both_null = pc.and_(a.is_null(), b.is_null())
            differ += len(values) - int(pc.sum(pc.or_(same, both_null)).as_py() or 0)
            n += len(values)
    if not differ:
        return None
    said = []
    s, a = stream.choices, alone.choices
    if s["number_unit"] != a["number_unit"]:
        said.append(f"numbers as {UNIT_NAMES.get(a['number_unit'], a['number_unit'])}, not as "
                    f"{UNIT_NAMES.get(s['number_unit'], s['number_unit'])}")
    if s["string_format"] != a["string_format"]:
        said.append(f"strings with the format {a['string_format']!r}, not {s['string_format']!r}")
    return (f"its times would be read otherwise on their own than as the stream reads them (decided on an "
            f"earlier file): {' and '.join(said)}; {differ} of its {n} rows get another time or none")


def _parse(data: bytes, name: str, fmt: str, cols: list[str], text_col: str,
           delimiter: str | None = None) -> tuple[pa.Table, list[str]]:
    """The file's table from its (decompressed) bytes, and the names of all the columns the file
    holds (a CSV's table keeps only the mapped ones; an error about a missing column lists all)."""
    message = misnamed(data[:8], fmt)
    if message is not None:
        raise LandingError(name, message)
    buf = pa.BufferReader(data)
    if fmt == "parquet":
        table = pq.read_table(buf, **PARQUET_READ)
    elif fmt == "ipc":
        table = paipc.open_file(buf).read_all()
    elif fmt == "ipc-stream":
        table = paipc.open_stream(buf).read_all()
    elif fmt == "jsonl":
        table = pajson.read_json(pa.BufferReader(data), read_options=pajson.ReadOptions(block_size=_BLOCK_BYTES))
    else:
        return _parse_csv(data, name, cols, text_col, delimiter)
    return table, table.column_names


def _parse_csv(data: bytes, name: str, cols: list[str], text_col: str,
               delimiter: str | None) -> tuple[pa.Table, list[str]]:
    # CSV as a replay's source reads it: mapped columns as text, the text as bytes (checked for
    # UTF-8 by the normalisation, so one bad row is a reject and not a failed file). The header
    # comes from the first block only.
    present = pacsv.open_csv(pa.BufferReader(data), read_options=pacsv.ReadOptions(block_size=_BLOCK_BYTES),
                             parse_options=csv_parse_options(name, delimiter)).schema.names
    types = {c: pa.string() for c in cols if c in present}
    if text_col in types:
        types[text_col] = pa.binary()
    table = pacsv.read_csv(pa.BufferReader(data), read_options=pacsv.ReadOptions(block_size=_BLOCK_BYTES),
                           parse_options=csv_parse_options(name, delimiter),
                           convert_options=pacsv.ConvertOptions(
                               include_columns=[c for c in cols if c in present], column_types=types,
                               null_values=[""], strings_can_be_null=True))
    return table, present


def _decompressed(data: bytes, name: str) -> bytes:
    """``data`` decompressed by the name's extension (as it is when the name has none)."""
    codec = codec_of(name)
    if codec is None:
        return data
    try:
        with pa.CompressedInputStream(pa.BufferReader(data), codec) as stream:
            return stream.read()
    except (pa.ArrowException, OSError) as exc:
        raise LandingError(name, f"cannot decompress it as {codec} (its name ends in "
                                 f"{compression_extension(name)}): {exc}") from None


def _add_partition_keys(table: pa.Table, name: str, cols: list[str]) -> pa.Table:
    """Constant columns for the mapped hive keys ``k=v`` in the folder names that the file lacks
    (:func:`~connectors.sources.files.partition_keys`)."""
    for key, value in partition_keys(name).items():
        if key in cols and key not in table.column_names:
            table = table.append_column(key, pa.array([value] * table.num_rows, pa.string()))
    return table


def _state(fs: pafs.FileSystem, path: str) -> tuple[int, int] | None:
    """(size, mtime_ns) of ``path`` now, None if it cannot be listed."""
    try:
        info = fs.get_file_info(path)
    except OSError:
        return None
    return (int(info.size), _mtime_ns(info)) if info.type == pafs.FileType.File else None


def _read_reason(exc: OSError) -> str:
    """Why a file could not be opened or read, with what to do where that is clear."""
    if isinstance(exc, PermissionError):
        return "permission denied; make it readable by the user the service runs as"
    if isinstance(exc, FileNotFoundError):
        return "it is gone (moved or deleted since it was listed)"
    return str(exc).strip() or type(exc).__name__


def _mtime_ns(info: pafs.FileInfo) -> int:
    ns = info.mtime_ns
    return int(ns) if ns is not None else 0


__all__ = ["LandedFile", "LandedRead", "LandingError", "LandingNotReady", "LandingZone", "PARTIAL_SUFFIXES",
           "SUCCESS_MARKER", "read_landed"]
