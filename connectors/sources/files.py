"""File sources: Parquet, Arrow IPC (file and stream), JSON Lines and CSV on any ``pyarrow.fs``.

A source is one file, a directory of files (recursively; names starting with ``.`` or ``_``
are skipped), or a hive-partitioned Parquet/Arrow dataset (``decade=1790/part-0.parquet``:
the partition keys are columns like any other and can be mapped as time or epoch). The URI
is a local path or anything ``pyarrow.fs.FileSystem.from_uri`` accepts (``file://``,
``s3://``, ``gs://``, ``hdfs://``...).

Reading is batched (``batch_size`` rows at most per batch; CSV and JSON are parsed block by
block), so memory stays bounded by a few batches whatever the source size. Files are read
one after the other in sorted path order; within a file rows keep their order, so the
``position`` column (0-based record index within the file) and the default ids
``"<file>:<position>"`` are stable across runs.

A directory read with ``skip_duplicate_files`` (as a replay reads its source) skips a file whose
content is that of an earlier file in path order (:func:`content_digest`: a re-delivery, which a
service skips too), with a warning naming both (:attr:`Source.duplicate_files`).

Format notes: CSV files need a header row; the text column is read as bytes and checked for
UTF-8 by us (so a bad row is rejected, not the file). JSON Lines are parsed by pyarrow, which
infers one type per field: a field must keep one JSON type throughout a file (a time that
is sometimes a number and sometimes a string is an error naming the file and the line), and a single
record may not exceed the 4 MiB parse block. Times written as strings are read as strings
and parsed row by row, so a bad one is a rejected row, wherever it is in the file. A
malformed line is an error naming the file and the line. In a directory, all files must share one format,
and a file lacking a mapped column is an error naming that file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.json as pajson

from connectors.sources.base import SourceError, check_columns, normalise, normalised_schema
from connectors.sources.times import TIME_UNITS, TimeParser
from streamtree.records import RejectLog
from streamtree.wording import counted

logger = logging.getLogger(__name__)

FORMATS = ("parquet", "ipc", "ipc-stream", "jsonl", "csv")
#: How Parquet files are read: Spark's legacy INT96 timestamps in microseconds, not pyarrow's
#: default nanoseconds, whose int64 ends in 2262 (a year-9999 "no end" date wrapped to 1816)
PARQUET_READ = {"coerce_int96_timestamp_unit": "us"}
_EXTENSIONS = {
    ".parquet": "parquet", ".pq": "parquet",
    ".arrow": "ipc", ".feather": "ipc", ".ipc": "ipc", ".arrows": "ipc-stream",
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
    ".csv": "csv", ".tsv": "csv",
}
#: pyarrow's codec of each extension of a compressed file (``.csv.gz`` is gzip-compressed CSV)
_CODECS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4"}
#: bytes of a file hashed at a time (:meth:`Source._digest`)
_DIGEST_CHUNK = 1 << 20
_BLOCK_BYTES = 4 << 20
_IPC_FILE_MAGIC = b"ARROW1"


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """File system and path of ``uri``; plain paths (also relative ones) are local."""
    if "://" in uri:
        try:
            return pafs.FileSystem.from_uri(uri)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
            raise SourceError(uri, f"cannot open file system: {exc}") from None
    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri))


def canonical_uri(uri: str) -> str:
    """One spelling per location: local paths (relative, ``~``, ``file://``, symlinks) become
    the absolute real path; other URIs become ``scheme://path`` without options."""
    if "://" not in uri or uri.startswith("file://"):
        path = uri[len("file://"):] if uri.startswith("file://") else uri
        return os.path.realpath(os.path.expanduser(path))
    scheme = uri.split("://", 1)[0].lower()
    try:
        _, path = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError):
        path = uri.split("://", 1)[1].split("?", 1)[0]
    return f"{scheme}://{path.rstrip('/')}"


def nesting(data_uri: str, store_uri: str) -> str | None:
    """How a store's location sits against a data location's (a source or a landing folder),
    compared as :func:`canonical_uri` spells them: ``"is"`` (the same), ``"is inside"``,
    ``"holds"``, or None when they are apart. A store under a hidden or ``_``-prefixed folder of
    the data counts as apart: no reader of the data opens those."""
    data, store = canonical_uri(data_uri).rstrip("/"), canonical_uri(store_uri).rstrip("/")
    if store == data:
        return "is"
    if store.startswith(data + "/"):
        below = store[len(data) + 1:].split("/")
        return None if any(p.startswith((".", "_")) for p in below) else "is inside"
    return "holds" if data.startswith(store + "/") else None


def exists(uri: str) -> bool:
    """Whether anything is at ``uri`` (True when that cannot be told)."""
    try:
        fs, path = resolve(uri)
        return fs.get_file_info(path).type != pafs.FileType.NotFound
    except (SourceError, OSError):
        return True


def misnamed(head: bytes, fmt: str) -> str | None:
    """What to tell a user whose file named as text (CSV, JSON Lines) starts with the bytes of
    a binary format (``head``: its first bytes, decompressed), or None when it does not."""
    if fmt not in ("csv", "jsonl"):
        return None
    kind = ("a Parquet", ".parquet", "parquet") if head.startswith(b"PAR1") else \
        ("an Arrow IPC", ".arrow", "ipc") if head.startswith(_IPC_FILE_MAGIC) else None
    if kind is None:
        return None
    what = "CSV" if fmt == "csv" else "JSON Lines"
    return (f"holds {kind[0]} file, not {what} as its name says: rename it to end in {kind[1]}, or pass "
            f"--format {kind[2]}")


def compression_extension(path: str) -> str | None:
    """The compression extension a file's name ends in, in lower case (``a.JSONL.GZ``: ``.gz``),
    or None: the one reading of it behind :func:`codec_of` and :func:`uncompressed_name`."""
    name = path.lower()
    return next((ext for ext in _CODECS if name.endswith(ext)), None)


def codec_of(path: str) -> str | None:
    """pyarrow's codec of a file compressed as its name says (``.jsonl.gz``: gzip), or None."""
    ext = compression_extension(path)
    return None if ext is None else _CODECS[ext]


def uncompressed_name(path: str) -> str:
    """The name in lower case without its compression extension (``Speeches.TSV.gz``:
    ``speeches.tsv``): the name of the data once decompressed."""
    name, ext = path.lower(), compression_extension(path)
    return name if ext is None else name[: -len(ext)]


def csv_parse_options(path: str, delimiter: str | None = None) -> pacsv.ParseOptions:
    """How a CSV file is parsed: the ``delimiter`` given, else a tab for a ``.tsv`` file
    (compressed or not) and a comma otherwise; quoted values may span lines."""
    if delimiter is None:
        delimiter = "\t" if uncompressed_name(path).endswith(".tsv") else ","
    return pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True)


def partition_keys(name: str) -> dict[str, str]:
    """The hive partition keys of a data file, from its ``name`` below the source or landing folder:
    each folder name ``key=value``, URL-decoded as pyarrow's hive partitioning decodes it, in path
    order (the first where a key repeats): ``{"year": "1790"}`` for ``year=1790/part-0.parquet``.
    They are columns of the file's rows (a landed file's where the file lacks them, a Parquet or
    Arrow dataset's), so they are part of its content (:func:`content_digest`)."""
    keys: dict[str, str] = {}
    for part in name.split("/")[:-1]:
        if "=" in part:
            key, value = part.split("=", 1)
            keys.setdefault(urllib.parse.unquote(key), urllib.parse.unquote(value))
    return keys


def content_digest(chunks: Iterable[bytes], partition_keys: Mapping[str, str] | None = None) -> str:
    """The identity of a data file's content: the sha256 (hex) of its bytes, decompressed where its
    name says it is compressed, given as ``chunks`` in order, and of its ``partition_keys``
    (:func:`partition_keys` of its name).

    Files with one digest hold the same data whatever their names and compression; the later one is
    a re-delivery. A service skips a landed file whose digest a file it ingested has (ledger status
    ``duplicate``), and a replay skips a file of its source whose digest an earlier file in path
    order has (``skip_duplicate_files`` of :func:`open_source`), so both fit the data once.

    The partition keys count because readers make them columns of the file's rows: byte-identical
    files in ``year=2020/`` and ``year=2021/`` hold rows of two years, and differ, whether or not a
    column is mapped to the key; a copy in the same partition (anywhere, for files with no
    partition key), under another name or compressed, does not. A file with no partition key has
    the sha256 of its bytes, as service ledgers recorded every file before partition keys
    counted; with keys it has :func:`partitioned_digest` of that.
    """
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return partitioned_digest(digest.hexdigest(), partition_keys or {})


def partitioned_digest(sha256: str, partition_keys: Mapping[str, str]) -> str:
    """The :func:`content_digest` of a file whose bytes have the hex ``sha256`` and that has the
    ``partition_keys``: that sha256 where it has none, else the sha256 of a header, the keys and
    values sorted by key (JSON) and the bytes' sha256. (A service resuming on a ledger written
    before partition keys counted derives the digest of its partitioned files with it.)"""
    if not partition_keys:
        return sha256
    keys = json.dumps(sorted(partition_keys.items()), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(b"partitioned file\n" + keys.encode() + b"\n" + bytes.fromhex(sha256)).hexdigest()


def format_of(path: str) -> str | None:
    """The format implied by a file name (``.csv.gz`` is CSV), or None."""
    return _EXTENSIONS.get(os.path.splitext(uncompressed_name(path))[1])


class Source:
    """Normalised record batches from a file source; build with :func:`open_source`.

    Iterating yields :class:`pyarrow.RecordBatch` with the schema :attr:`schema`:
    ``source`` (file, relative to the source root), ``position`` (record index in the file),
    ``id`` (string), ``text`` (valid, non-blank UTF-8), then ``time`` (timestamp[us, UTC])
    when a time column is mapped and ``epoch`` (int64) when an epoch column is mapped.
    Records that cannot be used go to :attr:`rejects` (a :class:`~streamtree.records.RejectLog`
    with per-reason counts) instead. A source can be iterated more than once; each pass
    re-reads the files and appends to the same reject log.
    """

    def __init__(self, uri, text_col, time_col, id_col, epoch_col, batch_size, time_unit, fmt, time_format=None,
                 delimiter=None, skip_duplicate_files=False):
        self.uri = uri
        self.delimiter = delimiter
        self.text_col = text_col
        self.time_col = time_col
        self.id_col = id_col
        self.epoch_col = epoch_col
        self.batch_size = batch_size
        self.time_unit = time_unit
        self.time_format = time_format
        self.time_parser = TimeParser(time_unit, time_format)
        self.fs, self.root = resolve(uri)
        self._sizes, self.is_dir = self._discover()
        #: files of a folder that are not data files (no known extension): left out, with a warning
        self.ignored: list[str] = []
        #: each file's format: ``fmt`` for all when given, else each file's own (a folder may mix them)
        self.formats = self._detect_formats(fmt)
        self.files = list(self.formats)
        found = set(self.formats.values())
        self.format = found.pop() if len(found) == 1 else "mixed"
        self.schema = normalised_schema(time_col is not None, epoch_col is not None)
        self.rejects = RejectLog()
        self.n_read = 0
        self.n_rows = 0
        self._check_columns()
        skipped = self._find_duplicates() if skip_duplicate_files else {}
        self._skipped = set(skipped)
        #: the files skipped because an earlier file holds their content: name -> that file's name
        self.duplicate_files = {self._relative(p): self._relative(first) for p, first in skipped.items()}

    # ---- discovery -------------------------------------------------------------------
    def _discover(self) -> tuple[dict[str, int | None], bool]:
        """The source's files (path -> size, in path order) and whether the source is a directory."""
        try:
            info = self.fs.get_file_info(self.root)
        except OSError as exc:
            raise SourceError(self.uri, f"cannot stat: {exc}") from None
        if info.type == pafs.FileType.NotFound:
            raise SourceError(self.uri, "no such file or directory")
        if info.type == pafs.FileType.File:
            return {self.root: info.size}, False
        selector = pafs.FileSelector(self.root, recursive=True)
        files = {
            f.path: f.size for f in sorted(self.fs.get_file_info(selector), key=lambda f: f.path)
            if f.type == pafs.FileType.File
            and not any(part.startswith((".", "_")) for part in self._relative(f.path).split("/"))
        }
        if not files:
            raise SourceError(self.uri, "directory holds no data files")
        return files, True

    def _find_duplicates(self) -> dict[str, str]:
        """Each file whose content (:func:`content_digest`) an earlier file in path order holds,
        to that earlier file, with a warning. Only files that may hold another's content are
        hashed: those that share their partition keys with another file and, unless some file is
        compressed, their size too."""
        if len(self.files) < 2:
            return {}
        keys = {path: partition_keys(self._relative(path)) for path in self.files}
        compressed = any(codec_of(p) is not None for p in self.files)
        group = {path: (tuple(sorted(keys[path].items())), None if compressed else self._sizes[path])
                 for path in self.files}
        groups = Counter(group.values())
        first: dict[str, str] = {}  # digest -> the first file holding it
        found = {}
        for path in self.files:
            if groups[group[path]] < 2:
                continue
            digest = self._digest(path)
            if digest not in first:
                first[digest] = path
                continue
            found[path] = first[digest]
            logger.warning("%s has the same content as %s, which comes before it in name order: skipped (a "
                           "re-delivery; a service skips it too)", self._relative(path), self._relative(first[digest]))
        return found

    def _digest(self, path: str) -> str:
        """:func:`content_digest` of the file at ``path`` (with the partition keys of its name below
        the source), read (and decompressed) a chunk at a time."""
        with self._wrap(path), self.fs.open_input_stream(path, compression=codec_of(path)) as f:
            return content_digest(iter(lambda: f.read(_DIGEST_CHUNK), b""),
                                  partition_keys=partition_keys(self._relative(path)))

    def _relative(self, path: str) -> str:
        # Path below the source root for directories, the bare file name for a single file.
        prefix = self.root.rstrip("/") + "/"
        return path[len(prefix):] if path.startswith(prefix) else os.path.basename(path)

    def _detect_formats(self, fmt: str | None) -> dict[str, str]:
        files = list(self._sizes)
        if fmt is not None:
            return dict.fromkeys(files, fmt)
        if not self.is_dir:
            found = format_of(files[0])
            # a file without a known extension, or an .arrow file (an IPC file or stream), is
            # told by its first bytes
            return {files[0]: self._sniff(files[0]) if found in (None, "ipc") else found}
        out = {f: format_of(f) for f in files}
        self.ignored = [self._relative(f) for f, k in out.items() if k is None]
        if self.ignored:
            logger.warning("%s: ignoring %s (expected .parquet, .arrow, .arrows, .jsonl, .csv, .tsv; pass "
                           "--format to read every file as one format): %s", self.uri, self._ignored_text(),
                           ", ".join(self.ignored[:5]) + (", ..." if len(self.ignored) > 5 else ""))
        out = {f: k for f, k in out.items() if k is not None}
        if not out:
            raise SourceError(self.uri, f"directory holds no data files (expected .parquet, .arrow, .arrows, .jsonl, "
                                        f".csv, .tsv; it holds {', '.join(self.ignored[:5])}); pass --format to "
                                        "read them as one format")
        return out

    def _sniff(self, path: str) -> str:
        # Arrow IPC files start with the magic "ARROW1"; a stream starts with a message.
        try:
            with self.fs.open_input_file(path) as f:
                head = f.read(8)
        except OSError as exc:
            raise SourceError(path, f"cannot open: {exc}") from None
        if head.startswith(_IPC_FILE_MAGIC):
            return "ipc"
        if head.startswith(b"PAR1"):
            return "parquet"
        if head[:4] == b"\xff\xff\xff\xff":
            return "ipc-stream"
        raise SourceError(path, "unknown file type (expected .parquet, .arrow, .arrows, .jsonl, .csv, .tsv); pass format= (--format)")

    def _mapped(self) -> dict[str, str | None]:
        return {"text": self.text_col, "time": self.time_col, "id": self.id_col, "epoch": self.epoch_col}

    def _columns(self) -> list[str]:
        return list(dict.fromkeys(c for c in self._mapped().values() if c is not None))

    def _check_columns(self) -> None:
        # each format's first file (or its dataset's schema); every file is checked again as it is read
        first: dict[str, str] = {}
        for path, fmt in self.formats.items():
            first.setdefault(fmt, path)
        for fmt, path in first.items():
            try:
                check_columns(self.uri if self.is_dir and self.format != "mixed" else path,
                              self._present_columns(fmt, path), self._mapped())
            except SourceError:
                self._check_named_format(path, fmt)  # the clearer error, if that is what is wrong
                raise

    def _check_named_format(self, path: str, fmt: str) -> None:
        """A text file (CSV, JSON Lines) that is really Parquet or Arrow is an error saying so,
        where parsing it as text would list its binary header as column names."""
        if fmt not in ("csv", "jsonl"):
            return
        with self._wrap(path, fmt), self._open_text(path) as f:
            message = misnamed(f.read(8), fmt)
        if message is not None:
            raise SourceError(path, message)

    def _present_columns(self, fmt: str, path: str) -> list[str]:
        if fmt in ("parquet", "ipc"):
            return self._dataset(fmt).schema.names
        if fmt == "ipc-stream":
            with self._wrap(path):
                with self.fs.open_input_stream(path) as f:
                    return pa.ipc.open_stream(f).schema.names
        if fmt == "csv":
            with self._wrap(path):
                with self._open_text(path) as f:
                    return pacsv.open_csv(f, read_options=self._csv_read(),
                                          parse_options=csv_parse_options(path, self.delimiter)).schema.names
        with self._wrap(path):
            with self._open_text(path) as f:
                return pajson.open_json(f, read_options=pajson.ReadOptions(block_size=_BLOCK_BYTES)).schema.names

    def _dataset(self, fmt: str) -> ds.Dataset:
        """The dataset of the source's files of format ``fmt`` (``parquet`` or ``ipc``), with the
        hive keys of their folders below the root."""
        kind = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(**PARQUET_READ)) if fmt == "parquet" \
            else "ipc"
        if not self.is_dir:
            with self._wrap(self.files[0], fmt):
                return ds.dataset(self.files[0], filesystem=self.fs, format=kind)
        files = [f for f in self.files if self.formats[f] == fmt]
        with self._wrap(self.root if len(files) == len(self.files) else files[0], fmt):
            return ds.dataset(files, filesystem=self.fs, format=kind, partitioning="hive",
                              partition_base_dir=self.root)

    def _wrap(self, path: str, fmt: str | None = None):
        fmt = fmt or self.formats.get(path, self.format)
        return _Wrap(path, fmt, (lambda: self._json_fault(path)) if fmt == "jsonl" else None)

    def _open_text(self, path: str):
        return self.fs.open_input_stream(path, compression="detect")

    def _json_reader(self, path: str, f, stack: contextlib.ExitStack):
        """A JSON Lines reader of ``path`` (open as ``f``). pyarrow types each field from the
        first block; when it types the time field as a time, one later value it cannot convert
        (``"n/a"``, or a form it did not see in the first block) would fail the whole file, so
        the file is read again with that field as text, which the time parser reads row by row
        (a bad time is then one rejected row, as in CSV)."""
        read = pajson.ReadOptions(block_size=_BLOCK_BYTES)
        reader = pajson.open_json(f, read_options=read)
        schema = reader.schema
        typed = [c for c in (self.time_col,) if c is not None and c in schema.names
                 and pa.types.is_temporal(schema.field(c).type)]
        if not typed:
            return reader
        again = stack.enter_context(self._open_text(path))
        return pajson.open_json(again, read_options=read, parse_options=pajson.ParseOptions(
            explicit_schema=pa.schema([(c, pa.string()) for c in typed]), unexpected_field_behavior="infer"))

    def _csv_read(self) -> pacsv.ReadOptions:
        return pacsv.ReadOptions(block_size=_BLOCK_BYTES)

    # ---- reading ---------------------------------------------------------------------
    def _raw(self) -> Iterator[tuple[str, pa.RecordBatch]]:
        """(file path, raw batch) pairs, in file order and row order."""
        cols = self._columns()
        fragments = {}
        for fmt in sorted({"parquet", "ipc"} & set(self.formats.values())):
            dataset = self._dataset(fmt)
            fragments.update({fr.path: (fr, dataset, fmt) for fr in dataset.get_fragments()})
        for path in self.files:
            if path in self._skipped:
                continue
            if path in fragments:
                yield from self._fragment_batches(*fragments[path], cols)
            else:
                yield from self._file_batches(path, self.formats[path], cols)

    def _fragment_batches(self, fragment, dataset: ds.Dataset, fmt: str,
                          cols: list[str]) -> Iterator[tuple[str, pa.RecordBatch]]:
        """A Parquet or IPC file's batches, read through its dataset's fragment."""
        scan_options = ds.ParquetFragmentScanOptions(pre_buffer=False) if fmt == "parquet" else None
        with self._wrap(fragment.path, fmt):
            # The dataset schema comes from the first file; check each file's own.
            keys = ds.get_partition_keys(fragment.partition_expression)
            present = fragment.physical_schema.names + [
                n for n in keys if n not in fragment.physical_schema.names]
            check_columns(fragment.path, present, self._mapped())
            # Each file is read with its own column types: the dataset's (the first
            # file's) would cast another file's integer seconds to a timestamp in
            # microseconds, or fail a string column of zoned times; the rows are
            # normalised batch by batch, whatever each file's types.
            own = pa.schema([fragment.physical_schema.field(n) if n in fragment.physical_schema.names
                             else dataset.schema.field(n) for n in cols])
            # No read-ahead and no Parquet pre-buffering: with pyarrow's defaults the
            # scanner holds many batches and the raw column chunks of the whole file
            # in memory (measured: ~the file size), which undoes the bounded memory.
            scanner = ds.Scanner.from_fragment(
                fragment, schema=own, columns=cols, batch_size=self.batch_size,
                batch_readahead=0, fragment_scan_options=scan_options,
            )
            for batch in scanner.to_batches():
                yield fragment.path, batch

    def _file_batches(self, path: str, fmt: str, cols: list[str]) -> Iterator[tuple[str, pa.RecordBatch]]:
        """A CSV, JSON Lines or IPC stream file's batches."""
        try:
            yield from self._read_file(path, fmt, cols)
        except SourceError:
            self._check_named_format(path, fmt)  # the clearer error, if that is what is wrong
            raise

    def _json_fault(self, path: str) -> str | None:
        """The first line of a JSON Lines file that is not a JSON object, or whose field has
        another JSON type than on an earlier line (pyarrow reads one type per field), said with
        its line number and what to do; None if no line is at fault that way."""
        kinds: dict[str, tuple[str, int]] = {}  # field -> (JSON type, the line it was first seen)
        with self._open_text(path) as f:
            for n, raw in enumerate(_lines(f), start=1):
                line = raw.strip()
                if not line:
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    return f"line {n}, column {exc.colno}: not valid JSON ({exc.msg}); mend or remove that line"
                except ValueError:  # not UTF-8
                    return f"line {n}: not valid JSON (not UTF-8 text); mend or remove that line"
                if not isinstance(record, dict):
                    return f"line {n} is not a JSON object ({_json_kind(record)}); each line must be one record"
                for field, value in record.items():
                    kind = _json_kind(value)
                    if kind == "null":
                        continue
                    first = kinds.setdefault(field, (kind, n))
                    if first[0] != kind:
                        return (f"line {n}: field {field!r} is a {kind} ({json.dumps(value)[:40]}) where line "
                                f"{first[1]} has a {first[0]}; a field keeps one JSON type throughout a file: "
                                f"write every {field!r} as a {first[0]}, or convert the file to CSV or Parquet")
        return None

    def _read_file(self, path: str, fmt: str, cols: list[str]) -> Iterator[tuple[str, pa.RecordBatch]]:
        with self._wrap(path, fmt), contextlib.ExitStack() as stack:
            f = stack.enter_context(self._open_text(path) if fmt in ("csv", "jsonl")
                                    else self.fs.open_input_stream(path))
            if fmt == "ipc-stream":
                reader = pa.ipc.open_stream(f)
            elif fmt == "csv":
                mapped = {c: pa.string() for c in cols}
                mapped[self.text_col] = pa.binary()  # validated by us: invalid UTF-8 -> reject
                reader = pacsv.open_csv(
                    f, read_options=self._csv_read(), parse_options=csv_parse_options(path, self.delimiter),
                    convert_options=pacsv.ConvertOptions(
                        include_columns=cols, column_types=mapped,
                        null_values=[""], strings_can_be_null=True,
                    ),
                )
            else:
                reader = self._json_reader(path, f, stack)
            check_columns(path, reader.schema.names, self._mapped())
            for batch in reader:
                batch = batch.select(cols)
                for off in range(0, batch.num_rows, self.batch_size):
                    yield path, batch.slice(off, self.batch_size)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        positions: dict[str, int] = {}
        for path, raw in self._raw():
            start = positions.get(path, 0)
            positions[path] = start + raw.num_rows
            name = self._relative(path)
            good, rejects = normalise(
                raw, name, start, text_col=self.text_col, time_col=self.time_col,
                id_col=self.id_col, epoch_col=self.epoch_col, time_parser=self.time_parser,
            )
            self.n_read += raw.num_rows
            self.n_rows += good.num_rows
            if rejects.num_rows:
                self.rejects.add(rejects)
                logger.debug("%s: %d rows rejected in batch at %d", name, rejects.num_rows, start)
            if good.num_rows:
                yield good

    @property
    def notes(self) -> list[str]:
        """What the source chose automatically (time units, formats), one sentence each."""
        notes = [f"time column {self.time_col!r}: {n}" for n in self.time_parser.notes]
        if self.ignored:
            notes.append(f"ignored {self._ignored_text()}: {', '.join(self.ignored[:5])}"
                         f"{', ...' if len(self.ignored) > 5 else ''}")
        return notes

    def _ignored_text(self) -> str:
        n = len(self.ignored)
        return f"{counted(n, 'file')} that {'is not a data file' if n == 1 else 'are not data files'}"

    def fingerprint(self) -> list[list]:
        """``[relative path, size, mtime in ns]`` of each file: cheap (no data is read) and it
        changes when a file is written, even at the same size (copies that keep the time,
        ``cp -p``, keep it too)."""
        out = []
        for path in self.files:
            info = self.fs.get_file_info(path)
            mtime = int(info.mtime_ns) if info.mtime_ns is not None else None
            out.append([self._relative(path), int(info.size or 0), mtime])
        return out

    def read_all(self) -> pa.Table:
        """All good rows as one table (rejects go to :attr:`rejects` as usual)."""
        return pa.Table.from_batches(list(self), schema=self.schema)


def _lines(f, chunk: int = 1 << 20) -> Iterator[bytes]:
    """The lines of a binary stream (pyarrow's streams have no line reading)."""
    rest = b""
    while block := f.read(chunk):
        lines = (rest + block).split(b"\n")
        rest = lines.pop()
        yield from lines
    if rest:
        yield rest


def _json_kind(value) -> str:
    """The JSON type of a parsed value, as pyarrow's JSON reader tells types apart."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "list", dict: "object"}[type(value)]


class _Wrap:
    """Turns pyarrow's I/O and format errors into :class:`SourceError` naming the file."""

    def __init__(self, path: str, fmt: str, locate: Callable[[], str | None] | None = None) -> None:
        self.path, self.fmt, self.locate = path, fmt, locate

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, (SourceError, GeneratorExit)):
            return False
        if isinstance(exc, pa.ArrowInvalid) and self.locate is not None:
            # pyarrow names a row counted from the start of its block: say the line itself
            found = self.locate()
            if found is not None:
                raise SourceError(self.path, f"not a valid JSON Lines file: {found}") from exc
        if isinstance(exc, (pa.ArrowException, OSError, ValueError)):
            what = {"parquet": "Parquet", "ipc": "Arrow IPC file", "ipc-stream": "Arrow IPC stream",
                    "jsonl": "JSON Lines", "csv": "CSV"}[self.fmt]
            raise SourceError(self.path, f"not a valid or readable {what} file: {exc}") from exc
        return False


#: what ``format=`` accepts: :data:`FORMATS` and ``tsv`` (CSV with tab delimiters)
FORMAT_CHOICES = FORMATS + ("tsv",)


def file_format(format: str | None, delimiter: str | None) -> tuple[str | None, str | None]:
    """``(format, delimiter)`` checked and normalised: ``tsv`` becomes ``csv`` with a tab,
    ``tab`` or ``\\t`` a tab character (the one reading of ``--format``/``--delimiter`` for
    sources and landing folders). Raises ValueError for anything else."""
    if format == "tsv":
        format, delimiter = "csv", "\t" if delimiter is None else delimiter
    if format is not None and format not in FORMATS:
        raise ValueError(f"format must be one of {FORMAT_CHOICES}, got {format!r}")
    if delimiter is not None:
        if delimiter in ("\\t", "tab"):
            delimiter = "\t"
        if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in "\r\n\"":
            raise ValueError(f"delimiter must be one character other than a quote or newline, got {delimiter!r}")
        if format not in (None, "csv"):
            raise ValueError(f"delimiter is for CSV sources, not format {format!r}")
    return format, delimiter


def open_source(
    uri: str,
    text_col: str,
    time_col: str | None,
    id_col: str | None = None,
    epoch_col: str | None = None,
    batch_size: int = 8192,
    *,
    time_unit: str = "auto",
    format: str | None = None,
    time_format: str | None = None,
    delimiter: str | None = None,
    skip_duplicate_files: bool = False,
    untimed: bool = False,
) -> Source:
    """Open a file source and map its columns.

    Parameters
    ----------
    uri : str
        A file, a directory, or a hive-partitioned dataset; local path or ``pyarrow.fs`` URI.
    text_col : str
        Column with the document text (string, or binary holding UTF-8).
    time_col : str or None
        Column with the document time; see :mod:`connectors.sources.times` for how
        timestamps, dates, ISO strings, integer years and epoch seconds are read. May be
        None when ``epoch_col`` is given.
    id_col : str, optional
        Column with document ids (cast to string). Without it the id is
        ``"<file>:<position>"``, stable as long as the files do not change.
    epoch_col : str, optional
        Column holding an explicit integer epoch (for ``EpochSpec.parse("column")``).
    batch_size : int
        Maximum rows per yielded batch.
    time_unit : {"auto", "year", "yyyymmdd", "s", "ms", "us", "ns"}
        How numeric times are read; ``"auto"`` decides once per source from the first
        values and says so in :attr:`Source.notes`.
    time_format : str, optional
        ``strptime`` pattern for time strings that are not ISO 8601 (default: detect one of
        the common formats, see :mod:`connectors.sources.times`).
    format : str, optional
        One of ``parquet``, ``ipc``, ``ipc-stream``, ``jsonl``, ``csv``, ``tsv`` (CSV with tab
        delimiters); by default from the file extension (or magic bytes for a single file with
        no known extension).
    delimiter : str, optional
        Field delimiter of CSV files, one character (default ``,``, or a tab for ``.tsv``
        files and ``format="tsv"``).
    skip_duplicate_files : bool, default False
        Skip a file of a directory whose content (:func:`content_digest`) an earlier file in
        path order holds, as a service skips a re-delivered file; each is logged as a warning
        naming both and listed in :attr:`Source.duplicate_files`.
    untimed : bool, default False
        Rows may have no time at all (neither ``time_col`` nor ``epoch_col``): for documents that
        are scored, not bucketed into epochs.

    Raises
    ------
    SourceError
        Missing file, unknown format, a mapped column absent (the message lists the
        columns present), or a file that is not of its format or is corrupt.
    """
    if not isinstance(text_col, str) or not text_col:
        raise ValueError("text_col must be a column name")
    if time_col is None and epoch_col is None and not untimed:
        raise ValueError("give time_col, epoch_col, or both")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit must be one of {TIME_UNITS}, got {time_unit!r}")
    format, delimiter = file_format(format, delimiter)
    if time_format is not None and (not isinstance(time_format, str) or "%" not in time_format):
        raise ValueError(f"time_format must be a strptime pattern such as '%d/%m/%Y', got {time_format!r}")
    return Source(uri, text_col, time_col, id_col, epoch_col, batch_size, time_unit, format, time_format, delimiter,
                  skip_duplicate_files)
