"""Versioned, atomically committed snapshot store of epoch trees on ``pyarrow.fs``.

Layout of a store (one run)::

    manifest.json                 the run: config, versions, vocabulary, run id, completion
    vocabulary.parquet            index, term, document_frequency
    commits/000000.json           the commit record of epoch 0 (its commit point)
    epochs/000000/nodes.parquet   one row per node (see NODE_SCHEMA)
    epochs/000000/theta.parquet   node_id, indices (list<int32> or null), values (list<float32>; float64 if exact)
    epochs/000000/assignments.parquet   doc_id, node_id
    epochs/000000/rejects.parquet       only when the epoch had rejects
    epochs/000000/checkpoint.parquet    the model state after this epoch (see below; latest epoch only)
    epochs/000000/checkpoint.json       its JSON metadata (parameters, seed state, ...)
    epochs/000000/<name>.parquet        extra tables committed with the epoch (e.g. a file ledger)
    epochs/000000/static/<method>-<over>.parquet   dendrograms of static snapshots
    lease.json                    the writer lease while a writer runs (see connectors.stores.lease)

Commit protocol
---------------
Publishing an epoch writes its files under ``epochs/.tmp-<epoch>-<uuid>/``, renames that
folder to ``epochs/<epoch>``, checks that the writer still holds the lease, and then
writes the epoch's *commit record* ``commits/<epoch>.json`` (to a temporary name, renamed
into place). The commit record is the commit point: readers list ``commits/`` and trust
nothing else, so a folder without a record is invisible, and a crash at any step leaves
the store readable at the previous epoch. The cost of a commit is one folder and one small
record, whatever the number of epochs already published; ``manifest.json`` is written when
a run begins and once when it completes. Renames are atomic on local and HDFS file
systems; on object stores (S3, GCS) each record is a single object put, which is atomic,
while an epoch folder appears object by object (harmless: it has no record yet).

On a local disk every file is flushed (fsync) before the rename that publishes it, and the
folder holding the new name right after it (on POSIX; where folders cannot be flushed, as on
Windows, that step is skipped, and so is a flush the file system refuses, as some FUSE and
network ones do), so a power cut cannot leave a record or a folder naming bytes that never
reached the disk. A store written before writers flushed can hold a latest record
cut short by a power cut (empty, zeros, or JSON cut off): readers take the store as committed
through the epoch before it, with a warning (a run marked complete through a later epoch reads
as unfinished), and the next writer removes that record (and its epoch's folder) and publishes
the epoch again; where that folder holds the store's only checkpoint, both are kept and the run
cannot be resumed (:meth:`SnapshotStore.cut_short_epoch`). Any other bad record (a whole record
followed by stray bytes too: a crash cannot add bytes after it), and a record cut short before a
later one, is damage; a writer removes no folder of an epoch whose record it cannot read.

Only what the store can show it wrote is ever deleted or moved: the temporary folders and
files it creates, known by their exact names (one of its prefixes and a 32-digit id, e.g.
``epochs/.tmp-000003-<id>``, ``.manifest.json.tmp-<id>``, ``.replaced-<id>``; a name that merely
looks temporary, such as ``.old-photos``, is someone else's) and its own epoch folders,
records and files (a static snapshot's temporary file, ``static/.tmp-<method>-<id>``, at the
next static write into that epoch), in a directory whose ``manifest.json`` is a streamtree store's (or, while a
replacement is under way or was stopped, whose set-aside run holds one). Inside its own folders
too (an epoch folder it replaces or never committed, a run a replacement set aside), it deletes
only the names it writes there: a file someone put in one stays, with the folders that hold it,
and the writer warns, naming it, until it is moved out; an epoch whose folder name is taken so
is published to a folder of its own. A new store writes its
manifest before anything else, whole (through a temporary file of the store's own name, renamed
into place), so no other file of it ever lies in a directory without that proof; a manifest that
a crash tore in such a first write by an earlier writer (which created it in place: empty,
zeros or cut off, with nothing of a run beside it) is known as ours, and replaced. A directory
without it that holds store-named files (``vocabulary.parquet``, ``commits``, ``epochs``, an
aside, a lease that is not a streamtree lease), or whose ``manifest.json`` is someone else's, is
refused by every writer, naming what it found, and left as it is
(:meth:`SnapshotStore.check_writable`, and again when the lease is taken).

Replacing a run
---------------
A new run over an existing one (:meth:`SnapshotStore.begin` on a store holding a run, the
``--overwrite`` of a replay) never shows readers an empty store: they see the old run whole
until the new run's first epoch is committed, and the new run from then on. When the new run
begins (a replay begins it just before its first commit) the old run's files are moved into
``.replaced-<uuid>/``, its manifest first; the new run's vocabulary, first epoch folder and
commit record are written in their places, and its manifest is written last, with that
commit (until then the writer keeps it in memory). While the store's folder has no
``manifest.json``, a reader reads the run from the aside that holds one, each of
``manifest.json``, ``vocabulary.parquet``, ``commits`` and ``epochs`` from the aside where it
is there (moved already) and from the store's folder where not (not yet); an old run without
records gets an empty ``commits`` in its aside, so that none of the new run's show through.
A reader reads the manifest before the records, so it checks after reading them that the run is
still the one it read and where it read it (not set aside, put back or replaced meanwhile), and
reads again if not.
Once the new manifest is in place the aside is deleted. A store with no manifest but an aside holding one is therefore a replacement stopped
before its first commit: the next writer moves that aside back over what the stopped writer
wrote (:meth:`SnapshotStore.clean_leftovers`), and the old run is whole again.

Checkpoints
-----------
An epoch may carry the model's checkpoint, ``(arrays, meta)``: named numeric numpy arrays
go to ``checkpoint.parquet``, one row per array with columns ``name`` (string), ``dtype``
(numpy dtype string, e.g. ``<f8``), ``shape`` (list<int64>) and ``data`` (the C-order bytes
of the array, full precision), and ``meta`` goes to ``checkpoint.json``. Both are written
inside the epoch folder, so they are committed with the epoch. Object arrays are refused.

The arrays are the bulk of a store (dense node parameters), and only a resume needs them,
from the latest epoch: with ``keep_checkpoints="latest"`` (the default, recorded in the
manifest as ``checkpoints``) publishing an epoch with a checkpoint deletes the previous
epoch's ``checkpoint.parquet``, *after* the new commit record is written (and, on a local
disk, flushed to it with the new checkpoint), so a crash at any point leaves at least the
latest committed epoch's checkpoint (a writer removes a superseded one it finds, see
:meth:`SnapshotStore.clean_leftovers`). ``checkpoint.json`` (small: the
parameters and sampled hyperparameters of that epoch) stays with every epoch.
``keep_checkpoints="all"`` keeps every epoch's arrays, so any epoch's model can be loaded.

Theta storage: node directions are stored sparse and compact (format version 3). Per node,
the largest entries by absolute value that keep the stored row's cosine to the full one at
least ``theta_cosine`` (replay and serve use :data:`THETA_COSINE`, 0.999: a relative L2 error
of at most sqrt(1 - 0.999^2) = 0.045), optionally at most ``theta_top_n`` of them, as float32
(``indices`` delta-encoded, ``values`` byte-stream-split, zstd). ``theta_cosine=None``
stores every nonzero exactly, as float64 (dense rows when more than two thirds are nonzero).
The commit record (``theta.exact``, ``theta.error``, ``theta.cosine``, ``theta.top_n``) and
:attr:`StoredEpoch.theta_exact` / :attr:`StoredEpoch.theta_error` say what was kept, the
error being the largest relative L2 distance of a node's stored row from its full one.
Words taken from theta are computed from the full rows before truncation and stored exactly.

Word distributions (rows that are strictly positive and sum to 1, e.g. multinomial topics)
are stored by their logarithms instead (``theta_log_step``; replay and serve use
:data:`THETA_LOG_STEP`, 0.02): per node the integer codes ``c = round((log phi - log
phi_hat_parent) / step)`` relative to the parent's stored row (the root's relative to the
uniform distribution), dense, dictionary-encoded and zstd-compressed; the reader rebuilds
``phi_hat`` proportional to ``exp(log phi_hat_parent + c step)``, parents first, and
normalises it, so every row sums to 1 and every word keeps a positive probability (scoring a
document never meets log 0). Rounding moves each log probability by at most ``step / 2`` and
the normalisation by at most as much again, so the error, the largest ``|log phi_hat_w - log
phi_w|`` over nodes and words (``theta.error``, measured when written), is at most ``step``;
it bounds the change of a document's log likelihood under a node to ``step`` per token. The
tail of tiny probabilities is where vMF truncation would drop entries; for a distribution
those words carry the floor every document can hit, so they are kept, coarsely. A store
holding such rows has ``format_version`` 4 (the commit record's ``theta.log_step`` says which
epochs), so that older readers refuse it instead of reading codes as probabilities; a store
without them stays format 3.

Everything is Parquet or JSON: no pickle anywhere, readable by any Parquet tool. A store
has one writer at a time, enforced by the writer lease; any number of readers may read it
while it is being written. A damaged manifest or commit record (bad JSON, missing fields,
an epoch path outside ``epochs/``) is a :class:`CorruptStoreError`, never silently skipped.
"""

from __future__ import annotations

import copy
import errno
import functools
import json
import logging
import os
import platform
import re
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

import streamtree
from connectors.sources.base import SourceError
from connectors.sources.files import resolve
from connectors.stores.errors import (CheckpointNotKeptError, CorruptStoreError, StoreAccessError, StoreBusyError,
                                      StoreError)
from connectors.stores.faults import write_point
from connectors.stores.lease import DEFAULT_TIMEOUT, LEASE, Lease, os_reason, sync_file
from streamtree.epoch_tree import EpochTree
from streamtree.records import REJECT_SCHEMA
from streamtree.text import DEFAULT_TOP_WORDS
from streamtree.wording import counted

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


def _one_run(read: Callable[..., _T]) -> Callable[..., _T]:
    """A reader of several files of the store, done again where a writer moved the run while
    it read (:meth:`SnapshotStore._settled`): a replacement setting the old run aside, putting
    it back, or committing the new run and dropping the aside could otherwise fail the read
    midway ("damaged") or hand it one file of each run."""

    @functools.wraps(read)
    def settled(self, *args, **kwargs):
        return self._settled(lambda _manifest: read(self, *args, **kwargs))

    return settled

FORMAT = "streamtree-snapshots"
FORMAT_VERSION = 4
#: the format version of a store without log-coded distributions (readable by older readers)
_PLAIN_FORMAT_VERSION = 3
#: Cosine to the full node direction that the stored, truncated one keeps at least (see
#: the module docstring): theta is the bulk of a store, and the heavy tail of small entries
#: hardly moves a node's top words or its documents' scores.
THETA_COSINE = 0.999
#: Step of the stored log probabilities of a word distribution (see the module docstring): a
#: stored row's log probabilities are within this of the full ones, so a document's log
#: likelihood under a node moves by at most this per token.
THETA_LOG_STEP = 0.02
#: Store settings for each form of node parameter a likelihood declares
#: (:attr:`streamtree.likelihoods.base.Likelihood.param_storage`).
THETA_STORAGE = {"exact": {}, "direction": {"theta_cosine": THETA_COSINE},
                 "distribution": {"theta_log_step": THETA_LOG_STEP}}
#: Which epochs keep their model checkpoint's arrays: "latest" (what a resume needs) or "all".
KEEP_CHECKPOINTS = ("latest", "all")
MANIFEST = "manifest.json"
VOCABULARY = "vocabulary.parquet"
COMMITS = "commits"
EPOCHS = "epochs"
CHECKPOINT_ARRAYS = "checkpoint.parquet"
CHECKPOINT_META = "checkpoint.json"
_OWN_NAMES = (MANIFEST, VOCABULARY, COMMITS, EPOCHS, LEASE)
_UUID = "[0-9a-f]{32}"
#: The temporary names the store makes, by the folder it makes them in (the root: ""): a file
#: being written (``.<name>.tmp-<uuid>``), the writability probe, the lease's stale and
#: heartbeat files, an epoch folder being written (``.tmp-<epoch>-<uuid>``; ``.old-`` in earlier
#: versions). Only names of exactly this form are removed as leftovers: one that merely looks
#: temporary (``.old-photos``) may be someone's file, and a directory holding such a name and no
#: store is refused as a new store like any other.
_TEMPORARY = {
    "": re.compile(rf"^\.(probe-|{re.escape(LEASE)}\.(stale|tmp)-|({re.escape(MANIFEST)}|{re.escape(VOCABULARY)})"
                   rf"\.tmp-){_UUID}$"),
    EPOCHS: re.compile(rf"^\.(tmp|old)-\d{{6,}}-{_UUID}$"),
    COMMITS: re.compile(rf"^\.\d{{6,}}\.json\.tmp-{_UUID}$"),
    # an epoch's static/ folder: a snapshot being written (cleaned by the next write there)
    "static": re.compile(rf"^\.tmp-[A-Za-z0-9][A-Za-z0-9_.-]*-{_UUID}$"),
}
#: the folder a replacement moves the previous run into (see begin)
_ASIDE_RE = re.compile(rf"^\.replaced-{_UUID}$")
_DENSE_FRACTION = 2 / 3
#: errors of opening or syncing a folder where the OS or file system does not allow it
_DIR_SYNC_REFUSED = {errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EISDIR, errno.EACCES, errno.EPERM}
_METHOD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_RECORD_RE = re.compile(r"^(\d{6,})\.json$")

NODE_SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("parent", pa.int64(), nullable=False),
    pa.field("depth", pa.int64(), nullable=False),
    pa.field("epoch", pa.int64(), nullable=False),
    pa.field("count", pa.int64(), nullable=False),
    pa.field("subtree_count", pa.int64(), nullable=False),
    pa.field("window_count", pa.int64(), nullable=False),
    pa.field("mass", pa.float64(), nullable=False),
    pa.field("concentration", pa.float64(), nullable=False),
    pa.field("born", pa.int64(), nullable=False),
    pa.field("top_words", pa.list_(pa.string())),
])
THETA_SCHEMA = pa.schema([
    pa.field("node_id", pa.int64(), nullable=False),
    pa.field("indices", pa.list_(pa.int32())),
    pa.field("values", pa.list_(pa.float32()), nullable=False),
])
#: the theta schema of stores written with ``theta_cosine=None`` (and of format version 2)
THETA_EXACT_SCHEMA = pa.schema([THETA_SCHEMA.field("node_id"), THETA_SCHEMA.field("indices"),
                                pa.field("values", pa.list_(pa.float64()), nullable=False)])
#: the theta schema of log-coded word distributions (``theta_log_step``; indices null: dense rows)
THETA_LOG_SCHEMA = pa.schema([THETA_SCHEMA.field("node_id"), THETA_SCHEMA.field("indices"),
                              pa.field("values", pa.list_(pa.int32()), nullable=False)])
ASSIGNMENT_SCHEMA = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("node_id", pa.int64(), nullable=False),
])
# Node parameters are floats that rarely repeat: a dictionary only costs space, while
# splitting each value's bytes into streams lets zstd compress the exponent bytes (28%
# smaller than the defaults on a weekly news-like store, bench/bench_store_size.py); sorted
# column indices shrink further as deltas.
THETA_ENCODING = {"use_dictionary": False, "column_encoding": {"values.list.element": "BYTE_STREAM_SPLIT",
                                                               "indices.list.element": "DELTA_BINARY_PACKED"}}
CHECKPOINT_SCHEMA = pa.schema([
    pa.field("name", pa.string(), nullable=False),
    pa.field("dtype", pa.string(), nullable=False),
    pa.field("shape", pa.list_(pa.int64()), nullable=False),
    pa.field("data", pa.large_binary(), nullable=False),
])


@dataclass
class StoredEpoch:
    """One published epoch as read back from the store.

    Attributes
    ----------
    tree : EpochTree
        The tree; ``theta`` is dense (K, p), rebuilt from the stored form.
    doc_ids : ndarray of str
        Document id of each row of ``tree.assignments``.
    top_words : list of list of str
        Per node, as published.
    theta_exact : bool
        False when the store kept theta compactly: only its largest entries (``theta_cosine``,
        ``theta_top_n``; the other entries of ``tree.theta`` then read as 0) or, for word
        distributions, log probabilities coded to ``theta_log_step`` (every entry positive).
    theta_error : float
        The compact form's error (0 for stores written exactly in float64). For directions
        truncated by cosine: the largest, over nodes, of ``||theta_k - stored_k|| /
        ||theta_k||`` (float32 rounding included). For log-coded word distributions
        (:attr:`theta_log_step` set): the largest, over nodes and words, of ``|log
        stored_kw - log theta_kw|``, at most ``theta_log_step``.
    theta_log_step : float or None
        The step of log-coded word distributions, None for other forms.
    key, label : int or None, str or None
        Epoch key and label from the manifest.
    rejects : pyarrow.Table or None
        Rejects filed under this epoch.
    """

    tree: EpochTree
    doc_ids: np.ndarray
    top_words: list[list[str]]
    theta_exact: bool
    key: int | None
    label: str | None
    rejects: pa.Table | None
    theta_error: float = 0.0
    theta_log_step: float | None = None


@dataclass
class NodeLineage:
    """History of one node id across the published epochs."""

    node_id: int
    born: int
    died: int | None
    epochs: list[int] = field(default_factory=list)
    parents: dict[int, int] = field(default_factory=dict)
    parent_changes: list[tuple[int, int, int]] = field(default_factory=list)


@dataclass
class StaticSnapshot:
    """A stored static dendrogram: SciPy linkage, model heights, statistics, leaf ids."""

    linkage: np.ndarray
    heights: np.ndarray
    stats: dict
    leaf_ids: list[str] | None


#: filesystems whose move of a folder is one rename (an interrupted move leaves it whole)
RENAMING_FILESYSTEMS = ("local", "hdfs")


class SnapshotStore:
    """Snapshot store rooted at ``uri`` (a local directory, created when a run begins, or any
    URI ``pyarrow.fs`` supports).

    Reading needs nothing; writing (``begin``, ``publish``, ``write_static``, ``finish``)
    needs the writer lease: ``with store.writer("replay"): ...``.

    Parameters
    ----------
    uri : str
        Root folder of the run.
    theta_cosine : float in (0, 1] or None, default None
        Per node keep the fewest largest theta entries whose cosine to the full row is at
        least this (replay and serve write :data:`THETA_COSINE`); None (or 1.0) keeps every
        nonzero entry exactly.
    theta_top_n : int or None, default None
        Also keep at most this many entries per node (lossy).
    theta_log_step : float > 0 or None, default None
        Store node parameters that are word distributions (strictly positive rows summing
        to 1) as log probabilities coded to this step, relative to the parent's stored row
        (replay and serve write :data:`THETA_LOG_STEP` for likelihoods whose parameters are
        distributions); excludes ``theta_cosine`` and ``theta_top_n``.
    keep_checkpoints : {"latest", "all"}, default "latest"
        Checkpoint arrays kept for a new run: the latest epoch's only, or every epoch's
        (a resumed run keeps its manifest's choice).
    """

    def __init__(self, uri: str, theta_top_n: int | None = None, *, theta_cosine: float | None = None,
                 theta_log_step: float | None = None, keep_checkpoints: str = "latest") -> None:
        if theta_top_n is not None and (not isinstance(theta_top_n, int) or theta_top_n < 1):
            raise ValueError(f"theta_top_n must be a positive integer or None, got {theta_top_n!r}")
        if theta_cosine is not None and not (isinstance(theta_cosine, (int, float)) and 0 < theta_cosine <= 1):
            raise ValueError(f"theta_cosine must be in (0, 1] or None, got {theta_cosine!r}")
        if theta_log_step is not None and not (isinstance(theta_log_step, (int, float)) and 0 < theta_log_step < 1):
            raise ValueError(f"theta_log_step must be in (0, 1) or None, got {theta_log_step!r}")
        if theta_log_step is not None and (theta_top_n is not None or theta_cosine is not None):
            raise ValueError("theta_log_step stores word distributions whole; it excludes theta_cosine and theta_top_n")
        if keep_checkpoints not in KEEP_CHECKPOINTS:
            raise ValueError(f"keep_checkpoints must be one of {KEEP_CHECKPOINTS}, got {keep_checkpoints!r}")
        self.uri = uri
        self.theta_top_n = theta_top_n
        self.theta_cosine = None if theta_cosine is None or theta_cosine >= 1 else float(theta_cosine)
        self.theta_log_step = None if theta_log_step is None else float(theta_log_step)
        self.keep_checkpoints = keep_checkpoints
        try:
            self.fs, root = resolve(uri)
        except SourceError as exc:
            raise StoreError(str(exc)) from None
        self.root = root.rstrip("/")
        self._lease: Lease | None = None
        self._aside_pending = False
        self._warned_kept: set[str] = set()  # files of others kept in the store's folders, warned of
        # A replacement's new manifest, written only with its first commit: until then the
        # store's manifest is the old run's, set aside with the rest of it (see begin).
        self._pending: dict | None = None
        # A reader's paths while a replacement is under way: each of the store's own names taken
        # from the set-aside run when it is there (see _base_manifest); None: the root.
        self._view: dict[str, str] | None = None
        # (epoch, path) of the latest committed epoch with checkpoint arrays, as this writer
        # knows it (looked up once per lease, then kept: a commit costs the same at any epoch)
        self._checkpointed: tuple[int, str] | None = None
        self._checkpointed_known = False

    # ---- paths and low-level I/O -----------------------------------------------------
    def _path(self, *parts: str) -> str:
        if self._view is not None and self._lease is None and parts:
            return "/".join((self._view.get(parts[0].split("/", 1)[0], self.root), *parts))
        return "/".join((self.root, *parts))

    @staticmethod
    def epoch_dir(epoch: int) -> str:
        return f"{EPOCHS}/{int(epoch):06d}"

    @staticmethod
    def record_name(epoch: int) -> str:
        return f"{COMMITS}/{int(epoch):06d}.json"

    def _exists(self, path: str) -> bool:
        try:
            return self.fs.get_file_info(path).type != pafs.FileType.NotFound
        except OSError as exc:
            raise StoreAccessError(f"{path}: cannot stat: {os_reason(exc)}") from None

    def _write_parquet(self, table: pa.Table, path: str) -> None:
        name = path.rsplit('/', 1)[-1]
        write_point(f"write {name}")
        # log codes repeat (a dictionary pays); float values rarely do
        options = THETA_ENCODING if name == "theta.parquet" and table.schema != THETA_LOG_SCHEMA else {}
        pq.write_table(table, path, filesystem=self.fs, compression="zstd", **options)
        self._sync_file(path)

    def _sync_file(self, path: str) -> None:
        """Flush a written file to the disk before a rename publishes it: otherwise the OS may
        write the rename back before the data, and a power cut leaves a committed name over
        missing or torn bytes. An object store has an object durable once its write returned;
        a file system that cannot flush files (some FUSE and network ones) is left to do its best."""
        if not isinstance(self.fs, pafs.LocalFileSystem):
            return
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                sync_file(fd, path)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreAccessError(f"{path}: cannot flush to disk: {os_reason(exc)}") from None

    def _sync_dir(self, path: str) -> None:
        """Flush a folder's entries (the names a rename or a create just put there) to the disk.
        Only where folders can be opened and synced (POSIX); elsewhere (Windows) and on file
        systems that refuse it this is skipped, and the rename is as durable as the OS makes it."""
        if not isinstance(self.fs, pafs.LocalFileSystem) or os.name != "posix":
            return
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            if exc.errno in _DIR_SYNC_REFUSED:
                logger.debug("%s: cannot open the folder to flush it (%s); skipped", path, exc)
                return
            raise StoreAccessError(f"{path}: cannot flush to disk: {os_reason(exc)}") from None
        try:
            os.fsync(fd)
        except OSError as exc:
            if exc.errno not in _DIR_SYNC_REFUSED:
                raise StoreAccessError(f"{path}: cannot flush to disk: {os_reason(exc)}") from None
            logger.debug("%s: the file system does not flush folders (%s); skipped", path, exc)
        finally:
            os.close(fd)

    def _read_parquet(self, path: str, columns=None) -> pa.Table:
        try:
            return pq.read_table(path, filesystem=self.fs, columns=columns)
        except (OSError, pa.ArrowException) as exc:
            raise CorruptStoreError(f"{path}: cannot read: {exc}") from None

    def _write_text(self, path: str, text: str) -> None:
        """Write ``text`` to a temporary name next to ``path`` and rename it into place."""
        folder, name = path.rsplit("/", 1)
        tmp = f"{folder}/.{name}.tmp-{uuid.uuid4().hex}"
        write_point(f"write {name}")
        with self.fs.open_output_stream(tmp) as f:
            f.write(text.encode("utf-8"))
        self._sync_file(tmp)  # the bytes are on disk before the rename publishes them
        write_point(f"rename {name}")
        self.fs.move(tmp, path)
        self._sync_dir(folder)  # and the rename itself

    def _read_json(self, path: str, what: str):
        try:
            with self.fs.open_input_stream(path) as f:
                return json.loads(f.read().decode("utf-8"))
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StoreAccessError(f"{path}: cannot read the {what}: {os_reason(exc)}") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptStoreError(f"{path}: the {what} is not valid JSON ({exc}); the store is damaged: "
                                    "restore it from a copy, or replay into a new --store") from None

    def _ls(self, path: str) -> list[pafs.FileInfo]:
        try:
            return self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        except FileNotFoundError:
            # The folder appeared while it was listed (a writer creating the store, or its commits
            # folder at the first commit): Arrow then reports the failed listing, not an empty one.
            # It held nothing when it was listed.
            return []
        except OSError as exc:
            raise StoreAccessError(f"{path}: cannot list: {os_reason(exc)}") from None

    # ---- writer side: checks, lease, clean-up --------------------------------------------
    def exists(self) -> bool:
        """Whether anything (a directory or a file) is at the store's location."""
        try:
            return self.fs.get_file_info(self.root).type != pafs.FileType.NotFound
        except OSError as exc:
            raise StoreAccessError(f"{self.root}: cannot stat: {os_reason(exc)}") from None

    def discard_if_empty(self) -> None:
        """Remove the store's directory if it holds nothing: for a run that created it and
        stopped before it wrote anything (a source it could not read). Anything in it is kept."""
        if not self.exists() or self._ls(self.root):
            return  # never made (its parent not writable, say), or holding something
        try:
            self.fs.delete_dir(self.root)
        except OSError as exc:
            logger.warning("%s: could not remove the empty store directory: %s", self.root, os_reason(exc))

    def check_writable(self) -> None:
        """Fail early, with one line naming the path, if the store cannot be written here:
        a file in the way, no permission, a read-only or full file system, or a directory
        that holds files that are not a store's. Creates the store directory."""
        info = self.fs.get_file_info(self.root)
        if info.type == pafs.FileType.File:
            raise StoreAccessError(f"{self.root}: is a file, not a store directory; choose another --store "
                                   "or move the file")
        try:
            self.fs.create_dir(self.root, recursive=True)
        except OSError as exc:
            raise StoreAccessError(f"{self.root}: cannot create the store directory: {os_reason(exc)}") from None
        probe = self._path(f".probe-{uuid.uuid4().hex}")
        try:
            with self.fs.open_output_stream(probe) as f:
                f.write(b"\0" * 65536)
        except OSError as exc:
            raise StoreAccessError(f"{self.root}: cannot write to the store: {os_reason(exc)}") from None
        finally:
            try:
                self.fs.delete_file(probe)
            except OSError:
                pass
        if not self._check_ours():
            foreign = sorted(i.base_name for i in self._ls(self.root) if i.base_name not in _OWN_NAMES
                             and not _TEMPORARY[""].match(i.base_name) and not _ASIDE_RE.match(i.base_name))
            if foreign:
                raise StoreError(f"{self.root}: the directory holds files that are not a streamtree store "
                                 f"(e.g. {foreign[0]!r}); choose an empty or new --store directory")

    def _check_ours(self) -> bool:
        """Whether a store of ours is here, proven by its manifest (or, while a replacement is
        under way or was stopped, by the manifest of the run it set aside): only then may a
        writer delete or move anything. A directory without such proof that holds what a
        writer would touch (store-named data, or a lease that is not a streamtree lease) is
        refused, naming what was found; False for one holding nothing of a store's."""
        names = {i.base_name: i for i in self._ls(self.root)}
        if MANIFEST in names:
            path = f"{self.root}/{MANIFEST}"
            try:
                manifest = self._read_json(path, "manifest")
            except FileNotFoundError:
                return self._check_ours()  # moved aside while we listed
            except CorruptStoreError:
                if self._unfinished_claim():
                    return True  # a new store's claim torn by a crash: the writer removes it
                raise
            if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
                raise StoreError(f"{path}: not the manifest of a streamtree store, so this directory is not one and "
                                 "nothing in it is touched; choose an empty or new --store directory")
            return True
        if self._saved_runs():
            return True
        found = [n for n in (VOCABULARY, COMMITS, EPOCHS) if n in names]
        # anything named like an aside, not only the names this code makes: refused, not guessed at
        found += sorted(n for n, i in names.items() if n.startswith(".replaced-") and
                        (i.type != pafs.FileType.Directory or self._ls(i.path)))
        if LEASE in names and not _is_lease(self.fs, names[LEASE].path):
            found.append(LEASE)
        if found == [VOCABULARY] and all(n in (VOCABULARY, LEASE) or _TEMPORARY[""].match(n) for n in names):
            # the layout of an older writer (it wrote the vocabulary before its manifest) stopped
            # before its manifest: most likely ours, but nothing proves it, so say what to do
            raise StoreError(f"{self.root}: holds {VOCABULARY} but no streamtree manifest ({MANIFEST}). Earlier "
                             f"streamtree versions wrote {VOCABULARY} before the manifest, so this may be a run of "
                             "theirs (replay or serve) stopped before publishing anything: if so, remove "
                             f"{names[VOCABULARY].path} and rerun the same command. If not, nothing shows that a "
                             "store wrote it and it is left as it is: choose an empty or new --store directory, or "
                             "move it out of this one")
        if found:
            raise StoreError(f"{self.root}: holds {', '.join(found)} but no streamtree manifest ({MANIFEST}), so "
                             "nothing shows that a store wrote them and they are left as they are; choose an empty "
                             "or new --store directory, or move them out of this one")
        return False

    def _saved_runs(self) -> list[tuple[int, str]]:
        """``(mtime_ns, path)`` of each aside of a replacement (``.replaced-*``) that holds the
        manifest of a streamtree store (the run it set aside)."""
        found = []
        for info in self._ls(self.root):
            if _ASIDE_RE.match(info.base_name) and info.type == pafs.FileType.Directory:
                saved = self.fs.get_file_info(f"{info.path}/{MANIFEST}")
                if saved.type != pafs.FileType.File:
                    continue
                try:
                    manifest = self._read_json(saved.path, "manifest")
                except (FileNotFoundError, StoreError):
                    continue
                if isinstance(manifest, dict) and manifest.get("format") == FORMAT:
                    found.append((saved.mtime_ns or 0, info.path))
        return found

    def writer(self, command: str = "write", timeout: float = DEFAULT_TIMEOUT) -> Lease:
        """Take the writer lease (a context manager); raises :class:`StoreBusyError` naming
        the holder when another writer has it. Cleans the temporary leftovers of crashed
        writers once the lease is held."""
        try:
            self.fs.create_dir(self.root, recursive=True)
        except OSError as exc:
            raise StoreAccessError(f"{self.root}: cannot create the store directory: {os_reason(exc)}") from None
        store = self

        class _Writer(Lease):
            def acquire(self):
                store._check_ours()  # before a stale lease is taken over: it must be a streamtree lease
                super().acquire()
                store._lease = self
                try:
                    store.clean_leftovers()
                except BaseException:
                    self.release()
                    raise
                return self

            def release(self):
                super().release()
                if store._lease is self:
                    store._lease = None

        return _Writer(self.fs, self.root, command=command, timeout=timeout)

    def _require_lease(self) -> None:
        if self._lease is None:
            raise StoreError(f"{self.root}: writing needs the writer lease: use `with store.writer(...):`")
        self._lease.check()

    @contextmanager
    def _writing(self):
        """Hold the lease for one write: the writer's own, or one taken just for this call."""
        if self._lease is not None:
            self._lease.check()
            yield
            return
        with self.writer("write"):
            yield

    def clean_leftovers(self) -> list[str]:
        """Delete what crashed writers left behind: temporary files and folders, epoch folders
        without a commit record (an epoch whose record cannot be read keeps its folders). Needs
        the lease; returns the paths removed. Nothing that does not carry one of the store's own
        names is touched."""
        self._require_lease()
        if not self._check_ours():
            return []  # nothing of a store's here: nothing to clean
        if self._unfinished_claim_to_drop():
            return [MANIFEST]
        removed = self._restore_interrupted_aside()
        removed += self._drop_cut_short_record()
        records = self._records(validate=False)
        committed = {e.get("path") for e in records}
        # A record that cannot be read (damaged, or cut short and kept: see _drop_cut_short_record)
        # keeps every folder of its epoch: which one it names is unknown, and damage is not a crash.
        unread = {int(_RECORD_RE.match(i.base_name).group(1)) for i in self._record_infos()}
        unread -= {e["epoch"] for e in records}
        for where, folder in (("", self.root), (EPOCHS, self._path(EPOCHS)), (COMMITS, self._path(COMMITS))):
            for info in self._ls(folder):
                name = info.base_name
                rel = info.path[len(self.root) + 1:]
                leftover = bool(_TEMPORARY[where].match(name))
                if where == EPOCHS and _FOLDER_RE.match(name) and rel not in committed \
                        and int(name.split("-")[0]) not in unread:
                    leftover = True  # an epoch folder whose commit never happened
                if leftover:
                    if where == EPOCHS and _FOLDER_RE.match(name):
                        kept = self._remove_own(info, "epoch")
                        self._warn_kept(kept, "an uncommitted epoch folder")
                        if kept:
                            continue
                    else:
                        self._delete(info)
                    removed.append(rel)
        self._checkpointed_known = False
        removed += self._drop_superseded_checkpoints()
        if any(_ASIDE_RE.match(i.base_name) for i in self._ls(self.root)):
            if committed:  # the new run has committed: the old one it replaced can go
                removed += self._drop_asides()
            else:
                self._aside_pending = True
        if removed:
            logger.info("removed leftovers of an interrupted writer: %s", ", ".join(removed))
        return removed

    def _unfinished_claim_to_drop(self) -> bool:
        """Delete a torn claim (see :meth:`_unfinished_claim`): no run ever began here, so the
        writer begins one afresh. True if there was one."""
        path = self._path(MANIFEST)
        try:
            self._read_json(path, "manifest")
            return False
        except (FileNotFoundError, CorruptStoreError):
            if not self._unfinished_claim():
                return False
        logger.warning("%s: empty or cut off, in a folder holding nothing of a run: the first write of a new "
                       "store (its manifest), torn by a crash; this store's own, removed: the run begins afresh", path)
        self._delete(self.fs.get_file_info(path))
        return True

    def _restore_interrupted_aside(self) -> list[str]:
        """Undo a replacement that stopped before its new run's first commit.

        :meth:`begin` moves the old manifest aside first, and the new one is written only with
        the new run's first commit, so a store with no ``manifest.json`` but an aside holding
        one is a replacement whose run never committed (readers meanwhile read the old run from
        the aside). Left so, the next writer would see any old commit records still in place,
        take them for the new run's and delete the aside (the old manifest), leaving commits
        without a manifest. Instead the newest such aside (by its manifest's time) is moved
        back: first its other files, over any the stopped writer had written for its own run
        (a vocabulary, records, epoch folders), then its manifest, so a stop during this leaves
        the same state to restore again. What is not in the aside stays: the old run's files
        not moved yet, or the stopped run's where the old run had none (epoch folders without
        a record, removed as such; a vocabulary its manifest does not name; records cannot be,
        as :meth:`begin` gives a run without records an empty ``commits`` in its aside).
        Returns the paths of the stopped writer's files it removed. A writer does not undo its
        own replacement (:attr:`_pending`).

        This relies on a folder's move being one rename, as on local disks and HDFS. Where a
        move copies and then deletes (object stores), a stop in the middle of moving the
        ``epochs`` folder aside can leave objects of the old run in the store's folder only,
        and restoring the aside's partial copy over them would lose them: there the store is
        left as it is and the writer stops with an error naming the aside.
        """
        if self._pending is not None or self._exists(self._path(MANIFEST)):
            return []
        found = self._saved_runs()
        if not found:
            return []
        aside = max(found)[1]
        if self.fs.type_name not in RENAMING_FILESYSTEMS:
            raise CorruptStoreError(
                f"{self.root}: a replacement of this store stopped before its first commit, with the previous "
                f"run moved aside into {aside}; on this filesystem ({self.fs.type_name}) a move is not one rename, "
                "so it is not restored automatically: check that folder against the store's, move the previous "
                "run back by hand or start over with --overwrite")
        removed = []
        for item in sorted(self._ls(aside), key=lambda i: i.base_name == MANIFEST):
            if item.base_name not in _OWN_NAMES:
                continue
            present = self.fs.get_file_info(self._path(item.base_name))
            if present.type != pafs.FileType.NotFound:
                kept = self._remove_own(present, present.base_name) if present.base_name in (COMMITS, EPOCHS) \
                    else self._delete(present)
                if kept:
                    raise StoreError(f"{self.root}: a replacement of this store stopped before its first commit, "
                                     f"and restoring the previous run (in {aside}) would go over files that "
                                     f"streamtree did not write: {', '.join(kept[:5])}; move them out and run again")
                removed.append(item.base_name)
            write_point(f"restore {item.base_name}")
            self.fs.move(item.path, self._path(item.base_name))
        self._sync_dir(self.root)
        if not self._ls(aside):
            self._delete(self.fs.get_file_info(aside))
        logger.warning("%s: a replacement of this store stopped before its first commit; restored the previous "
                       "run", self.root)
        return removed

    def _drop_cut_short_record(self) -> list[str]:
        """Delete the latest commit record if a crash cut it short (see :func:`_cut_short`): its
        epoch then counts as never committed, its folder is removed as such, and the writer
        publishes the epoch again. Kept, with a warning, when the epoch before it no longer has
        its checkpoint while the cut record's folder does: that folder is the only way back."""
        infos = self._record_infos()
        if not infos or not self._cut_short_latest(infos):
            return []
        last = infos[-1]
        epoch = int(_RECORD_RE.match(last.base_name).group(1))
        before = self.last_commit()  # the epoch before it
        if before is not None and before.get("checkpoint") and \
                not self._exists(self._path(before["path"], CHECKPOINT_ARRAYS)) and \
                self._exists(self._path(self.epoch_dir(epoch), CHECKPOINT_ARRAYS)):
            logger.warning("%s: the latest commit record was cut short by a crash, but only its epoch's folder "
                           "holds a model checkpoint; both are kept: this store cannot be resumed, replay it "
                           "again with --overwrite", last.path)
            return []
        self._delete(last)
        return [last.path[len(self.root) + 1:]]

    def kept_checkpoints(self) -> str:
        """The store's checkpoint policy, ``"latest"`` or ``"all"`` (a new store: this writer's)."""
        return self._checkpoint_policy(self._base_manifest())

    def _checkpoint_policy(self, manifest: dict) -> str:
        """``"latest"`` or ``"all"``; stores of format version 2 kept every epoch's."""
        return manifest.get("checkpoints", "all" if manifest.get("format_version", 1) < 3 else "latest")

    def _drop_superseded_checkpoints(self) -> list[str]:
        """Under ``keep_checkpoints="latest"``, delete the checkpoint arrays of epochs before the
        latest committed epoch that has a checkpoint (left by a writer that stopped between
        its commit and the deletion). Only the store's own ``checkpoint.parquet`` files."""
        try:
            if not self._exists(self._path(MANIFEST)):
                return []  # no recorded policy (e.g. a replacement stopped while moving the old run aside)
            manifest = self._base_manifest()
        except StoreError:
            return []
        if self._checkpoint_policy(manifest) != "latest":
            return []
        records = [e for e in self._records(validate=False) if e.get("checkpoint") and isinstance(e.get("path"), str)]
        if not records:
            return []
        latest = max(records, key=lambda e: e["epoch"])
        if not self._exists(self._path(latest["path"], CHECKPOINT_ARRAYS)):
            return []  # the latest one is missing (a damaged store): keep what there is
        removed = []
        for e in records:
            path = self._path(e["path"], CHECKPOINT_ARRAYS)
            if e["epoch"] < latest["epoch"] and _FOLDER_RE.match(e["path"].rsplit("/", 1)[-1]) and self._exists(path):
                if not removed:
                    self._sync_commit(latest["path"], latest["epoch"])
                self._delete(self.fs.get_file_info(path))
                removed.append(f"{e['path']}/{CHECKPOINT_ARRAYS}")
        return removed

    def _remove_own(self, info: pafs.FileInfo, level: str, entry: dict | None = None,
                    records: dict[str, dict] | None = None) -> list[str]:
        """Delete the store's folder (or file) ``info``, a ``level`` of a run (``"aside"``: a
        run set aside by a replacement; ``"epochs"``, ``"commits"``, ``"epoch"``: one epoch's
        folder, whose commit record is ``entry`` if known; ``"static"``), and of what it holds
        only what the store writes there, by name: a file someone put in it stays, and so does
        each folder that still holds one. Returns the paths kept, relative to the store."""
        if info.type != pafs.FileType.Directory:
            self._delete(info)
            return []
        kept = []
        if level == "aside":  # its epoch folders' records, for the extra tables they name
            records = {}
            for rec in self._ls(f"{info.path}/{COMMITS}"):
                if _RECORD_RE.match(rec.base_name):
                    try:
                        found = self._read_record(rec.path)
                    except (FileNotFoundError, CorruptStoreError):
                        continue
                    if isinstance(found, dict) and isinstance(found.get("path"), str):
                        records[found["path"].rsplit("/", 1)[-1]] = found
        for child in self._ls(info.path):
            inner = _own_entry(level, child, entry)
            if inner is None:
                kept.append(child.path[len(self.root) + 1:])
            elif inner == "":
                self._delete(child)
            else:
                below = (records or {}).get(child.base_name) if inner == "epoch" else entry
                kept += self._remove_own(child, inner, below, records)
        if not kept:
            self._delete(info)
        return kept

    def _warn_kept(self, kept: list[str], what: str) -> None:
        kept = [k for k in kept if k not in self._warned_kept]  # once a writer, not at each clean-up
        self._warned_kept.update(kept)
        if kept:
            logger.warning("%s: kept %s that streamtree did not write in %s: %s; move %s out (the folders "
                           "holding them are removed once they are empty)", self.root,
                           counted(len(kept), "entry", "entries"), what,
                           ", ".join(kept[:5]) + (f" ... (+{len(kept) - 5} more)" if len(kept) > 5 else ""),
                           "it" if len(kept) == 1 else "them")

    def _delete(self, info: pafs.FileInfo) -> None:
        write_point(f"delete {info.base_name}")
        try:
            if info.type == pafs.FileType.Directory:
                self.fs.delete_dir(info.path)
            else:
                self.fs.delete_file(info.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StoreAccessError(f"{info.path}: cannot delete: {os_reason(exc)}") from None

    # ---- manifest and commit records ---------------------------------------------------
    def manifest(self) -> dict:
        """The committed state: the run's manifest plus ``epochs``, the validated commit
        records in epoch order (a fresh empty manifest if nothing was committed yet)."""
        return self._settled(self._with_records)

    def _settled(self, read: Callable[[dict], _T]) -> _T:
        """``read(manifest)`` of the run :meth:`_base_manifest` finds, done again if a writer
        moved that run meanwhile (another run's manifest, or the run's files elsewhere: set aside,
        put back, or replaced and the aside dropped). A reader reads the manifest first and the
        commit records after it, so without this it could see the old run with no epochs, or the
        new run's records under the old manifest. A writer has the store to itself: read once."""
        for _ in range(3):
            manifest = self._base_manifest()
            seen = (manifest.get("run"), self._view)
            try:
                out = read(manifest)
            except Exception:  # noqa: BLE001 - files of two runs can fail in any way: re-read
                if self._lease is None and self._moved(seen):
                    continue
                raise
            if self._lease is not None or not self._moved(seen):
                return out
        raise StoreError(f"{self.root}: the store was being replaced while it was read, three times; try again")

    def _moved(self, seen: tuple) -> bool:
        """Whether the run and where its files are differ from ``seen`` (see :meth:`_settled`)."""
        try:
            return (self._base_manifest().get("run"), self._view) != seen
        except StoreError:
            return True

    def _with_records(self, manifest: dict) -> dict:
        """``manifest`` (as :meth:`_base_manifest` read it) plus its run's commit records."""
        if manifest.get("format_version") == 1:
            entries = manifest.get("epochs")
            if not isinstance(entries, list):
                raise CorruptStoreError(f"{self._path(MANIFEST)}: 'epochs' is not a list")
            for e in entries:
                _check_entry(e, self._path(MANIFEST), None)
            manifest["epochs"] = sorted(entries, key=lambda e: e["epoch"])
            return manifest
        manifest["epochs"] = self._records(run=manifest.get("run"))
        self._complete_as_committed(manifest, manifest["epochs"][-1] if manifest["epochs"] else None)
        return manifest

    def _complete_as_committed(self, manifest: dict, last: dict | None) -> None:
        """Clear ``manifest["complete"]`` if the run was marked complete through a later epoch
        than the last committed one (a crash cut that epoch's record short, and a writer removed
        it or readers skip it): the run is unfinished until a resume publishes that epoch again."""
        done = manifest.get("complete")
        through = done.get("last_epoch") if isinstance(done, dict) else None
        if isinstance(through, int) and (last is None or last["epoch"] < through):
            logger.warning("%s: the run was marked complete through epoch %d, but its epochs are committed only "
                           "through %s; it reads as unfinished: resume it (replay --resume) to publish the rest",
                           self.root, through, "none" if last is None else f"epoch {last['epoch']}")
            manifest["complete"] = None

    def _base_manifest(self) -> dict:
        """The run's manifest, validated. A writer in the middle of a replacement gets its new
        run's (not written yet); a reader that finds no manifest while a replacement is under
        way, or was stopped, reads the run set aside (and sets :attr:`_view` so that every path
        of the read is that run's), so it sees the old run whole until the new one commits."""
        if self._pending is not None:
            return copy.deepcopy(self._pending)
        for _ in range(3):  # a writer may put the new run in place and drop the aside meanwhile
            self._view = None
            path = f"{self.root}/{MANIFEST}"
            try:
                manifest = self._read_json(path, "manifest")
                break
            except CorruptStoreError:
                if self._unfinished_claim():  # no run ever began here (the next writer removes it)
                    return self._new_manifest()
                raise
            except FileNotFoundError:
                saved = self._saved_runs() if self._lease is None else []
                if not saved:
                    return self._new_manifest()
            aside = max(saved)[1]
            path = f"{aside}/{MANIFEST}"
            try:
                manifest = self._read_json(path, "manifest")
            except FileNotFoundError:
                continue
            self._view = {name: aside for name in (MANIFEST, VOCABULARY, COMMITS, EPOCHS)
                          if self._exists(f"{aside}/{name}")}
            break
        else:
            raise StoreError(f"{self.root}: the store was being replaced while it was read, three times; try again")
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise CorruptStoreError(f"{path}: not a streamtree snapshot manifest; the store is damaged or "
                                    "this is not a store")
        version = manifest.get("format_version")
        if not isinstance(version, int) or version < 1:
            raise CorruptStoreError(f"{path}: format_version {version!r} is not valid")
        if version > FORMAT_VERSION:
            raise StoreError(f"{path}: format version {version} is newer than this reader; upgrade streamtree")
        for key, kind in (("config", dict), ("vocabulary", (dict, type(None)))):
            if not isinstance(manifest.get(key), kind):
                raise CorruptStoreError(f"{path}: {key!r} is missing or of the wrong type; the store is damaged")
        voc = manifest["vocabulary"]
        if voc is not None and (voc.get("file") != VOCABULARY or not isinstance(voc.get("size"), int)
                                or not isinstance(voc.get("hash"), str)):
            raise CorruptStoreError(f"{path}: the vocabulary entry is not valid; the store is damaged")
        return manifest

    def _new_manifest(self) -> dict:
        now = _now()
        version = FORMAT_VERSION if self.theta_log_step is not None else _PLAIN_FORMAT_VERSION
        return {"format": FORMAT, "format_version": version, "created": now, "updated": now,
                "versions": _versions(), "run": None, "config": {}, "vocabulary": None, "complete": None,
                "checkpoints": self.keep_checkpoints, "epochs": []}

    def _record_infos(self) -> list[pafs.FileInfo]:
        """The commit records' files, in epoch order (read none)."""
        return sorted((i for i in self._ls(self._path(COMMITS)) if _RECORD_RE.match(i.base_name)),
                      key=lambda i: i.base_name)

    def _read_record(self, path: str) -> dict | None:
        """A commit record as JSON data, or None if a crash cut it short (see :func:`_cut_short`)."""
        try:
            with self.fs.open_input_stream(path) as f:
                raw = f.read()
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StoreAccessError(f"{path}: cannot read the commit record: {os_reason(exc)}") from None
        try:
            return json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            if _cut_short(raw):
                return None
            raise CorruptStoreError(f"{path}: the commit record is not valid JSON ({exc}); the store is damaged: "
                                    "restore it from a copy, or replay into a new --store") from None

    def _records(self, run: str | None = None, validate: bool = True) -> list[dict]:
        out = []
        infos = self._record_infos()
        for i, info in enumerate(infos):
            m = _RECORD_RE.match(info.base_name)
            try:
                entry = self._read_record(info.path)
            except FileNotFoundError:
                continue  # replaced while we listed
            except CorruptStoreError:
                if validate:
                    raise
                continue
            if entry is None:
                if validate and i + 1 < len(infos):
                    raise CorruptStoreError(f"{info.path}: the commit record is cut short, yet later epochs are "
                                            "committed; the store is damaged: restore it from a copy, or replay "
                                            "into a new --store")
                if validate:
                    logger.warning("%s: the latest commit record was cut short by a crash; the store reads as "
                                   "committed through the epoch before it (a writer removes the record and "
                                   "publishes the epoch again)", info.path)
                continue
            if validate:
                _check_entry(entry, info.path, run)
                if entry["epoch"] != int(m.group(1)):
                    raise CorruptStoreError(f"{info.path}: the record is for epoch {entry['epoch']}; the store is damaged")
            elif not isinstance(entry, dict) or not isinstance(entry.get("epoch"), int):
                continue
            out.append(entry)
        return out

    def _write_manifest(self, manifest: dict) -> None:
        manifest = {k: v for k, v in manifest.items() if k != "epochs"}
        manifest["updated"] = _now()
        manifest["versions"] = _versions()
        if self._pending is not None:  # a replacement: written with its first commit
            self._pending = manifest
            return
        text = json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False)
        if self._exists(self._path(MANIFEST)):
            self._write_text(self._path(MANIFEST), text)
        else:
            self._claim(text)

    def _publish_pending(self) -> None:
        """Write a replacement's manifest: from this rename on, readers see the new run."""
        manifest, self._pending = self._pending, None
        self._write_text(self._path(MANIFEST), json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False))

    def _claim(self, text: str) -> None:
        """Write the manifest of a new store as the first file of the directory: the proof that
        what the store writes after it is its own (see :meth:`_check_ours`). Whole or not at all:
        through a temporary name renamed into place where a rename is atomic (local disks, HDFS),
        as one object put elsewhere. A crash before the rename leaves only the temporary file,
        whose name is the store's own (:data:`_TEMPORARY`): the next claim removes it."""
        path = self._path(MANIFEST)
        try:
            if self.fs.type_name in RENAMING_FILESYSTEMS:
                self._write_text(path, text)
            else:
                write_point(f"write {MANIFEST}")
                with self.fs.open_output_stream(path) as f:  # one object put: whole or absent
                    f.write(text.encode("utf-8"))
        except OSError as exc:
            raise StoreAccessError(f"{path}: cannot write the store's manifest: {os_reason(exc)}") from None
        self.clean_leftovers()  # now that the directory is proven ours

    def _unfinished_claim(self) -> bool:
        """Whether the store's ``manifest.json`` is a claim that a crash tore (writers before the
        claim was renamed into place created it in place): empty, zeros, or the start of a new
        store's manifest cut off, in a directory holding nothing else but a streamtree lease and
        the store's temporary names, as a claim does. Such a file is ours and holds no run."""
        names = {i.base_name: i for i in self._ls(self.root)}
        if MANIFEST not in names or not all(n in (MANIFEST, LEASE) or _TEMPORARY[""].match(n) for n in names):
            return False
        if LEASE in names and not _is_lease(self.fs, names[LEASE].path):
            return False
        try:
            with self.fs.open_input_stream(names[MANIFEST].path) as f:
                raw = f.read()
        except OSError:
            return False
        text = raw.rstrip(b"\0").rstrip()
        return _cut_short(raw) and (text.startswith(_CLAIM_START) or _CLAIM_START.startswith(text))

    def _commit_record(self, entry: dict) -> None:
        if not self._exists(self._path(COMMITS)):
            self.fs.create_dir(self._path(COMMITS), recursive=True)
            self._sync_dir(self.root)
        self._require_lease()
        self._write_text(self._path(self.record_name(entry["epoch"])),
                         json.dumps(entry, indent=1, sort_keys=True, allow_nan=False))

    def begin(self, config: dict, vectorizer=None) -> None:
        """Start a new run with ``config`` (JSON data) and a fitted vectoriser: writes the
        vocabulary and the manifest. The files of a run already in the store are moved aside
        first, the new manifest is written only with the new run's first commit, and the old
        run is deleted after it (see the module docstring): readers see the old run until then."""
        with self._writing():
            config = _to_json(config, "config")
            present = [n for n in (MANIFEST, VOCABULARY, COMMITS, EPOCHS) if self._exists(self._path(n))]
            manifest = self._new_manifest()
            manifest["run"] = uuid.uuid4().hex
            manifest["config"] = config
            if present:
                aside = self._path(f".replaced-{uuid.uuid4().hex}")
                self.fs.create_dir(aside)
                for name in present:  # the manifest first: from then on readers read the run from the aside
                    write_point(f"set aside {name}")
                    self.fs.move(self._path(name), f"{aside}/{name}")
                if COMMITS not in present:  # a run without records: none of the new run's may show through
                    self.fs.create_dir(f"{aside}/{COMMITS}")
                self._sync_dir(aside)
                self._sync_dir(self.root)
                self._aside_pending = True
                self._pending = manifest
                logger.info("moved the previous run aside to %s until the new run commits", aside)
            self._checkpointed, self._checkpointed_known = None, True  # the new run has none yet
            if vectorizer is not None:
                self._put_vocabulary(vectorizer, manifest)
            self._write_manifest(manifest)

    def set_config(self, config: dict) -> None:
        """Record the run configuration (any JSON-serialisable dict) in the manifest."""
        with self._writing():
            manifest = self._base_manifest()
            manifest["config"] = _to_json(config, "config")
            self._write_manifest(manifest)

    def config(self) -> dict:
        return self._base_manifest()["config"]

    def finish(self, summary: dict) -> None:
        """Mark the run complete (``summary`` is JSON data shown on a later resume)."""
        with self._writing():
            manifest = self._base_manifest()
            last = self.last_commit()
            manifest["complete"] = {"summary": _to_json(summary, "summary"), "finished": _now(),
                                    "last_epoch": None if last is None else last["epoch"]}
            self._write_manifest(manifest)
            if self._pending is not None:  # a replacing run that finished without an epoch
                self._publish_pending()
                self._drop_asides()

    def complete(self) -> dict | None:
        """The completion record of a finished run (None while it is unfinished, and when epochs
        it was marked complete through are no longer committed)."""
        def complete_of(manifest: dict) -> dict | None:
            self._complete_as_committed(manifest, self._last_commit(manifest))
            return manifest.get("complete")

        return self._settled(complete_of)

    def count_published(self) -> int:
        """Number of published epochs (lists the commit records, reads the latest only)."""
        def count(manifest: dict) -> int:  # of the manifest's run: during a replacement, the one set aside
            infos = self._record_infos()
            return len(infos) - int(bool(infos) and self._cut_short_latest(infos))

        return self._settled(count)

    def cut_short_epoch(self) -> int | None:
        """The epoch of the latest commit record if a crash cut it short (None otherwise). A
        writer removes such a record when it takes the lease, unless that epoch's folder holds
        the store's only model checkpoint: a run left so cannot be resumed."""
        def cut(manifest: dict) -> int | None:
            infos = self._record_infos()
            if infos and self._cut_short_latest(infos):
                return int(_RECORD_RE.match(infos[-1].base_name).group(1))
            return None

        return self._settled(cut)

    def _cut_short_latest(self, infos: list[pafs.FileInfo]) -> bool:
        """Whether the latest of the (non-empty) records ``infos`` was cut short by a crash."""
        try:
            return self._read_record(infos[-1].path) is None
        except (FileNotFoundError, CorruptStoreError):
            return False

    def last_commit(self) -> dict | None:
        """The commit record of the latest published epoch (None if none); reads one record (two
        when a crash cut the latest one short: the epoch before it is then the latest)."""
        return self._settled(self._last_commit)

    def _last_commit(self, manifest: dict) -> dict | None:
        """:meth:`last_commit` of the run of ``manifest`` (as :meth:`_base_manifest` read it)."""
        infos = self._record_infos()
        if manifest.get("format_version") == 1:
            entries = self._with_records(manifest)["epochs"]
            return entries[-1] if entries else None
        for info in infos[::-1][:2]:
            entry = self._read_record(info.path)
            if entry is None and info is infos[-1]:
                continue
            if entry is None:
                raise CorruptStoreError(f"{info.path}: the commit record is cut short, yet later epochs are "
                                        "committed; the store is damaged: restore it from a copy, or replay into "
                                        "a new --store")
            _check_entry(entry, info.path, manifest.get("run"))
            return entry
        return None

    # ---- vocabulary ------------------------------------------------------------------
    def write_vocabulary(self, vectorizer) -> None:
        """Save a fitted :class:`~streamtree.text.TextVectorizer` (its ``to_arrow`` table).

        The vocabulary fixes the theta columns, so it cannot change once epochs exist.
        """
        with self._writing():
            manifest = self.manifest()
            old = manifest.get("vocabulary")
            if old is not None and old["hash"] != vectorizer.vocabulary_hash() and manifest["epochs"]:
                raise StoreError("the store already has epochs with a different vocabulary (hash mismatch)")
            self._put_vocabulary(vectorizer, manifest)
            self._write_manifest(manifest)

    def _put_vocabulary(self, vectorizer, manifest: dict) -> None:
        if self._pending is None and not self._exists(self._path(MANIFEST)):
            self._write_manifest(manifest)  # the claim comes first (see _check_ours)
        table = vectorizer.to_arrow()
        tmp = self._path(f".{VOCABULARY}.tmp-{uuid.uuid4().hex}")
        self._write_parquet(table, tmp)
        write_point(f"rename {VOCABULARY}")
        self.fs.move(tmp, self._path(VOCABULARY))
        self._sync_dir(self.root)
        manifest["vocabulary"] = {"hash": vectorizer.vocabulary_hash(), "size": int(table.num_rows),
                                  "file": VOCABULARY}

    def vocabulary(self) -> np.ndarray | None:
        """Terms in column order (None if no vocabulary was written)."""
        if self._base_manifest().get("vocabulary") is None:
            return None
        table = self._read_parquet(self._path(VOCABULARY))
        order = np.argsort(table.column("index").to_numpy(), kind="stable")
        return np.asarray(table.column("term").to_pylist(), dtype=str)[order]

    def vectorizer(self):
        """The stored vectoriser, ready to ``transform`` (None if no vocabulary)."""
        from streamtree.text import TextVectorizer

        info = self._base_manifest().get("vocabulary")
        if info is None:
            return None
        try:
            vec = TextVectorizer.from_arrow(self._read_parquet(self._path(VOCABULARY)))
        except (ValueError, KeyError) as exc:
            raise CorruptStoreError(f"{self._path(VOCABULARY)}: {exc}") from None
        if vec.vocabulary_hash() != info["hash"]:
            raise CorruptStoreError(f"{self._path(VOCABULARY)}: does not match the manifest's vocabulary hash")
        return vec

    # ---- publish ---------------------------------------------------------------------
    def publish(
        self,
        tree: EpochTree,
        doc_ids,
        *,
        top_words: list[list[str]] | None = None,
        n_top_words: int = DEFAULT_TOP_WORDS,
        rejects: pa.Table | None = None,
        key: int | None = None,
        label: str | None = None,
        checkpoint: tuple[dict, dict] | None = None,
        state: dict | None = None,
        tables: dict[str, pa.Table] | None = None,
        empty_before: dict | None = None,
        replace: bool = False,
        events=None,
    ) -> None:
        """Atomically add one epoch to the store (needs the writer lease).

        Parameters
        ----------
        tree : EpochTree
            The epoch's tree; its ``epoch`` names the folder.
        doc_ids : sequence of str
            Document id of each row of ``tree.assignments``.
        top_words : list of list of str, optional
            Per node; by default the ``n_top_words`` largest theta entries over the stored
            vocabulary (empty lists when the store has no vocabulary).
        rejects : pyarrow.Table, optional
            Rows rejected in this epoch (:data:`~streamtree.records.REJECT_SCHEMA`).
        key, label : optional
            Epoch key and label (label defaults to ``tree.label``).
        checkpoint : (dict of ndarray, dict), optional
            The model state after this epoch (``DTSSBP.get_checkpoint()``), committed with it.
        state : dict, optional
            JSON data committed in the epoch's record (e.g. a writer's running totals);
            numpy arrays and scalars are stored as lists and numbers.
        tables : dict of str to pyarrow.Table, optional
            Extra tables committed with the epoch as ``<name>.parquet`` (e.g. a file ledger).
            Names are letters, digits, ``_``, ``.`` and ``-``, and not those of the epoch's own
            files (``nodes``, ``theta``, ``assignments``, ``rejects``, ``events``,
            ``checkpoint``) in any case.
        empty_before : dict, optional
            A run of epochs with no documents and no rejects fitted just before this one and
            not written as folders: ``{"first": i, "last": j, "first_label": .., "last_label": ..}``.
        replace : bool, default False
            Allow replacing an epoch that is already published.
        events : streamtree.events.Events or pyarrow.Table, optional
            The epoch's events as the model recorded them (:data:`EVENT_SCHEMA`), written
            to ``events.parquet``; without it, :meth:`events` derives births, deaths and
            parent changes from the stored trees.
        """
        epoch = int(tree.epoch)
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        doc_ids = np.asarray([str(d) for d in doc_ids], dtype=object)
        if doc_ids.shape[0] != tree.assignments.shape[0]:
            raise ValueError(f"{doc_ids.shape[0]} doc_ids for {tree.assignments.shape[0]} assignments")
        state = None if state is None else _to_json(state, "state")
        tables = dict(tables or {})
        for name in tables:
            if not _METHOD_RE.match(name) or name.casefold() in _RESERVED_TABLES:
                raise ValueError(f"table name {name!r} is reserved (the epoch's own "
                                 f"{sorted(_RESERVED_TABLES)} and names differing from them only in "
                                 f"case) or not a simple name (letters, digits, '_', '.', '-'); "
                                 f"rename the table")
        ckpt = None if checkpoint is None else _checkpoint_table(*checkpoint)
        with self._writing():
            manifest = self._base_manifest()
            if self._exists(self._path(self.record_name(epoch))) and not replace:
                raise StoreError(f"epoch {epoch} is already published (pass replace=True to overwrite)")
            if top_words is None:
                vocab = self.vocabulary()
                top_words = (tree.top_words(vocab, n_top_words) if vocab is not None
                             else [[] for _ in range(tree.n_nodes)])
            if len(top_words) != tree.n_nodes:
                raise ValueError(f"{len(top_words)} top-word lists for {tree.n_nodes} nodes")
            vocab_info = manifest.get("vocabulary")
            if vocab_info is not None and tree.theta.shape[1] != vocab_info["size"]:
                raise ValueError(f"theta has {tree.theta.shape[1]} columns, the vocabulary {vocab_info['size']} terms")
            if manifest.get("run") is None:  # a store written through the low-level API only
                manifest["run"] = uuid.uuid4().hex
                self._write_manifest(manifest)
            if self.theta_log_step is not None and manifest["format_version"] < FORMAT_VERSION:
                manifest["format_version"] = FORMAT_VERSION  # older readers must not read codes as values
                self._write_manifest(manifest)

            record = self._path(self.record_name(epoch))
            replaced = self._read_json(record, "commit record") if self._exists(record) else None
            previous = replaced.get("path") if replaced is not None else None
            superseded = None
            if ckpt is not None and self._checkpoint_policy(manifest) == "latest":
                if not self._checkpointed_known:
                    last = self.last_commit()
                    self._checkpointed = (last["epoch"], last["path"]) if last and last.get("checkpoint") else None
                    self._checkpointed_known = True
                if self._checkpointed is not None and self._checkpointed[0] < epoch:
                    superseded = self._checkpointed[1]
            # A replacement goes to a new folder, so the record switch stays the only commit point.
            rel = self.epoch_dir(epoch) if previous is None else f"{self.epoch_dir(epoch)}-{uuid.uuid4().hex[:8]}"
            final = self._path(rel)
            if self._exists(final):  # an orphan folder of a crash before its commit: ours to replace
                kept = self._remove_own(self.fs.get_file_info(final), "epoch")
                self._warn_kept(kept, "an uncommitted epoch folder")
                if kept:  # someone's files stay there: the epoch goes to a folder of its own
                    rel = f"{self.epoch_dir(epoch)}-{uuid.uuid4().hex[:8]}"
                    final = self._path(rel)
            tmp = self._path(EPOCHS, f".tmp-{epoch:06d}-{uuid.uuid4().hex}")
            new_epochs = not self._exists(self._path(EPOCHS))
            try:
                exact, theta_error = self._write_epoch_files(tmp, tree, top_words, doc_ids, rejects, ckpt, tables, events)
                self._sync_dir(tmp)  # its files' names, before the folder is renamed into place
            except OSError as exc:
                try:  # our own temporary folder; a crash instead leaves it to clean_leftovers
                    self.fs.delete_dir(tmp)
                except OSError:
                    pass
                raise StoreAccessError(f"{self.root}: cannot write epoch {epoch}: {os_reason(exc)}") from None
            n_rejects = 0 if rejects is None else int(rejects.num_rows)
            write_point("rename epoch folder")
            self.fs.move(tmp, final)
            self._sync_dir(self._path(EPOCHS))  # before the record names the folder
            if new_epochs:
                self._sync_dir(self.root)
            entry = {
                "run": manifest["run"], "epoch": epoch, "key": None if key is None else int(key),
                "label": label if label is not None else tree.label,
                "path": rel, "n_nodes": tree.n_nodes,
                "n_documents": int(tree.assignments.shape[0]), "n_rejects": n_rejects,
                "died": [int(i) for i in tree.died],
                "theta": {"dim": int(tree.theta.shape[1]), "exact": exact, "top_n": self.theta_top_n,
                          "cosine": self.theta_cosine, "error": theta_error,
                          "dtype": "float64" if exact else "float32" if self.theta_log_step is None else "int32",
                          **({} if self.theta_log_step is None else {"log_step": self.theta_log_step})},
                "static": [], "published": _now(), "checkpoint": ckpt is not None,
                "tables": sorted(tables), "state": state, "empty_before": empty_before,
            }
            try:
                self._commit_record(entry)
                if self._pending is not None:  # a replacement's first commit: its run replaces the old one
                    self._publish_pending()
            except OSError as exc:
                raise StoreAccessError(f"{self.root}: cannot commit epoch {epoch}: {os_reason(exc)}") from None
            if previous is not None and previous != rel and _FOLDER_RE.match(previous.rsplit("/", 1)[-1]):
                self._warn_kept(self._remove_own(self.fs.get_file_info(self._path(previous)), "epoch", replaced),
                                f"the replaced folder of epoch {epoch}")
            if ckpt is not None and (self._checkpointed is None or self._checkpointed[0] <= epoch):
                self._checkpointed = (epoch, rel)
            if superseded is not None and _FOLDER_RE.match(superseded.rsplit("/", 1)[-1]):
                # only now that the new checkpoint is committed (and on disk): a crash before this
                # line leaves two, and the next writer's clean_leftovers removes the older one
                self._sync_commit(rel, epoch)
                old = self.fs.get_file_info(self._path(superseded, CHECKPOINT_ARRAYS))
                if old.type != pafs.FileType.NotFound:
                    self._delete(old)
            if self._aside_pending:
                self._drop_asides()

    def _drop_asides(self) -> list[str]:
        """Delete the runs a replacement set aside, once the new run is in place: all that the
        store wrote in them. Returns the asides removed whole."""
        removed, kept = [], []
        for info in self._ls(self.root):
            if _ASIDE_RE.match(info.base_name):
                left = self._remove_own(info, "aside")
                kept += left
                if not left:
                    removed.append(info.base_name)
        self._warn_kept(kept, "the previous run's folders")
        self._aside_pending = False
        return removed

    def _sync_commit(self, rel: str, epoch: int) -> None:
        """On a local disk, flush epoch ``epoch``'s checkpoint, its commit record and the folder
        entries that name them, so that a power cut after the previous checkpoint is deleted
        cannot leave a record pointing at unwritten data (the OS writes renamed files back
        lazily). A writer flushes each file as it writes it; this covers an epoch committed by
        an older writer, which did not. An object store has an object durable once its write
        returned."""
        for path in (self._path(rel, CHECKPOINT_ARRAYS), self._path(rel, CHECKPOINT_META),
                     self._path(self.record_name(epoch))):
            self._sync_file(path)
        for path in (self._path(rel), self._path(EPOCHS), self._path(COMMITS)):
            self._sync_dir(path)

    def _write_epoch_files(self, tmp, tree, top_words, doc_ids, rejects, ckpt, tables,
                           events=None) -> tuple[bool, float]:
        self.fs.create_dir(tmp, recursive=True)
        self._write_parquet(_nodes_table(tree, top_words), f"{tmp}/nodes.parquet")
        if self.theta_log_step is not None:
            theta_table, exact, theta_error = _log_theta_table(tree, self.theta_log_step)
        else:
            theta_table, exact, theta_error = _theta_table(tree, self.theta_top_n, self.theta_cosine)
        self._write_parquet(theta_table, f"{tmp}/theta.parquet")
        self._write_parquet(pa.Table.from_arrays(
            [pa.array(doc_ids.tolist(), pa.string()), pa.array(tree.assignments, pa.int64())],
            schema=ASSIGNMENT_SCHEMA), f"{tmp}/assignments.parquet")
        if rejects is not None and rejects.num_rows:
            self._write_parquet(rejects.select(REJECT_SCHEMA.names).cast(REJECT_SCHEMA), f"{tmp}/rejects.parquet")
        if events is not None:
            self._write_parquet(_events_table(events, int(tree.epoch)), f"{tmp}/events.parquet")
        if ckpt is not None:
            table, meta = ckpt
            self._write_parquet(table, f"{tmp}/{CHECKPOINT_ARRAYS}")
            write_point(f"write {CHECKPOINT_META}")
            with self.fs.open_output_stream(f"{tmp}/{CHECKPOINT_META}") as f:
                f.write(json.dumps(meta, indent=1, sort_keys=True, allow_nan=False).encode("utf-8"))
            self._sync_file(f"{tmp}/{CHECKPOINT_META}")
        for name, table in tables.items():
            self._write_parquet(table, f"{tmp}/{name}.parquet")
        return exact, theta_error

    # ---- checkpoints and extra tables --------------------------------------------------
    def read_checkpoint(self, epoch: int | None = None) -> tuple[dict[str, np.ndarray], dict]:
        """The model checkpoint ``(arrays, meta)`` committed with ``epoch`` (default: the
        latest published epoch); ``DTSSBP.from_checkpoint(*store.read_checkpoint())``
        continues from it."""
        for _ in range(3):  # a writer may commit a later one and delete this one while we read
            entry = self.last_commit() if epoch is None else self._entry(epoch)
            if entry is None:
                raise StoreError(f"{self.root}: no published epoch, so no checkpoint")
            if not entry.get("checkpoint"):
                raise StoreError(f"{self.root}: epoch {entry['epoch']} was published without a model checkpoint "
                                 "(written by an older streamtree?); replay into a new --store")
            base = self._path(entry["path"])
            try:
                self._check_checkpoint_kept(entry)
                try:
                    table = self._read_parquet(f"{base}/{CHECKPOINT_ARRAYS}")
                except CorruptStoreError:
                    self._check_checkpoint_kept(entry)  # superseded meanwhile: say so, not "damaged"
                    raise
            except CheckpointNotKeptError:
                if epoch is None:
                    continue  # the latest epoch moved on while we read: take the new one
                raise
            try:
                meta = self._read_json(f"{base}/{CHECKPOINT_META}", "checkpoint metadata")
            except FileNotFoundError:
                raise CorruptStoreError(f"{base}/{CHECKPOINT_META}: missing; the store is damaged") from None
            return _checkpoint_arrays(table, f"{base}/{CHECKPOINT_ARRAYS}"), meta
        raise StoreError(f"{self.root}: the latest checkpoint changed while it was read, three times; try again")

    def _check_checkpoint_kept(self, entry: dict) -> None:
        later = self.checkpoint_epoch()
        if later is not None and later > entry["epoch"] and self._checkpoint_policy(self._base_manifest()) == "latest":
            raise CheckpointNotKeptError(
                f"{self.root}: epoch {entry['epoch']}'s model checkpoint is not kept: the store keeps the full "
                f"model only for its latest epoch ({later}), which a resume needs; epoch {entry['epoch']}'s tree "
                f"is stored (SnapshotStore.read, node parameters to {self._cosine_of(entry)}), or "
                "replay with keep_checkpoints='all' (--keep-checkpoints all) to load any epoch's model")

    @_one_run
    def read_checkpoint_meta(self, epoch: int | None = None) -> dict:
        """The JSON metadata of the checkpoint committed with ``epoch`` (default: the latest
        published epoch): kept for every epoch, also where the arrays were not."""
        entry = self.last_commit() if epoch is None else self._entry(epoch)
        if entry is None or not entry.get("checkpoint"):
            raise StoreError(f"{self.root}: epoch {epoch} was published without a model checkpoint")
        path = self._path(entry["path"], CHECKPOINT_META)
        try:
            return self._read_json(path, "checkpoint metadata")
        except FileNotFoundError:
            raise CorruptStoreError(f"{path}: missing; the store is damaged") from None

    def checkpoint_epoch(self) -> int | None:
        """The latest published epoch committed with a model checkpoint (None if none)."""
        last = self.last_commit()
        if last is None:
            return None
        if last.get("checkpoint"):
            return int(last["epoch"])
        done = [e["epoch"] for e in self.manifest()["epochs"] if e.get("checkpoint")]
        return max(done) if done else None

    @staticmethod
    def _cosine_of(entry: dict) -> str:
        step = entry["theta"].get("log_step")
        if step is not None:
            return f"log probabilities within {step:g}"
        cos = entry["theta"].get("cosine")
        return "cosine >= 1 (exact)" if cos is None else f"cosine >= {cos:g}"

    @_one_run
    def read_table(self, epoch: int, name: str) -> pa.Table:
        """An extra table committed with ``epoch`` (see ``publish(tables=...)``)."""
        entry = self._entry(epoch)
        if name not in entry.get("tables", []):
            raise StoreError(f"epoch {epoch} has no table {name!r} (has {entry.get('tables', [])})")
        return self._read_parquet(self._path(entry["path"], f"{name}.parquet"))

    # ---- read ------------------------------------------------------------------------
    def epochs(self) -> list[dict]:
        """Completed epochs in order: dicts with ``epoch``, ``key``, ``label``,
        ``n_nodes``, ``n_documents``, ``n_rejects``, ``static`` and more."""
        return [dict(e) for e in self.manifest()["epochs"]]

    def _entry(self, epoch: int, manifest: dict | None = None) -> dict:
        if manifest is None and self._base_manifest().get("format_version", FORMAT_VERSION) >= 2:
            path = self._path(self.record_name(epoch))
            entry = self._read_record(path) if self._exists(path) else None
            if entry is not None:
                _check_entry(entry, path, self._base_manifest().get("run"))
                return entry
            # absent, or cut short by a crash: the listing says whether that is damage
            done = [e["epoch"] for e in self.manifest()["epochs"]]
            raise StoreError(f"epoch {epoch} is not published (published: {done})")
        manifest = manifest or self.manifest()
        for e in manifest["epochs"]:
            if e["epoch"] == int(epoch):
                return e
        done = [e["epoch"] for e in manifest["epochs"]]
        raise StoreError(f"epoch {epoch} is not published (published: {done})")

    @_one_run
    def read(self, epoch: int) -> StoredEpoch:
        """Read one published epoch back (theta rebuilt dense)."""
        entry = self._entry(epoch)
        base = self._path(entry["path"])
        nodes = self._read_parquet(f"{base}/nodes.parquet")
        theta_t = self._read_parquet(f"{base}/theta.parquet")
        assign = self._read_parquet(f"{base}/assignments.parquet")
        rejects = self._read_parquet(f"{base}/rejects.parquet") if entry["n_rejects"] else None
        col = lambda name, t=np.int64: np.asarray(nodes.column(name).to_numpy(), dtype=t)  # noqa: E731
        node_ids = col("id")
        log_step = entry["theta"].get("log_step")
        if log_step is not None:
            theta = _log_theta(theta_t, node_ids, col("parent"), entry["theta"]["dim"], float(log_step))
        else:
            theta = _dense_theta(theta_t, node_ids, entry["theta"]["dim"])
        tree = EpochTree(
            epoch=int(entry["epoch"]), node_ids=node_ids, parent=col("parent"), depth=col("depth"),
            mass=col("mass", np.float64), counts=col("count"), subtree_counts=col("subtree_count"),
            window_counts=col("window_count"), theta=theta,
            concentration=col("concentration", np.float64), born=col("born"),
            assignments=np.asarray(assign.column("node_id").to_numpy(), dtype=np.int64),
            died=np.asarray(entry["died"], dtype=np.int64), label=entry["label"],
        )
        return StoredEpoch(
            tree=tree, doc_ids=np.asarray(assign.column("doc_id").to_pylist(), dtype=object),
            top_words=[list(w or []) for w in nodes.column("top_words").to_pylist()],
            theta_exact=bool(entry["theta"]["exact"]), key=entry["key"], label=entry["label"],
            rejects=rejects, theta_error=float(entry["theta"].get("error", 0.0)),
            theta_log_step=None if log_step is None else float(log_step),
        )

    @_one_run
    def nodes(self, epoch: int) -> pa.Table:
        """The ``nodes.parquet`` table of a published epoch (for reports and ``show``)."""
        return self._read_parquet(self._path(self._entry(epoch)["path"], "nodes.parquet"))

    @_one_run
    def rejects(self, epoch: int) -> pa.Table | None:
        """The rejects filed under a published epoch (None if it had none)."""
        entry = self._entry(epoch)
        if not entry["n_rejects"]:
            return None
        return self._read_parquet(self._path(entry["path"], "rejects.parquet"))

    @_one_run
    def doc_ids(self, epoch: int) -> pa.ChunkedArray:
        """The ids of a published epoch's documents, in its assignments' order (read without the
        tree: a service rebuilding the ids it remembers reads only these)."""
        entry = self._entry(epoch)
        return self._read_parquet(self._path(entry["path"], "assignments.parquet"), columns=["doc_id"]).column(0)

    @_one_run
    def lineage(self) -> dict[int, NodeLineage]:
        """Per node id: epoch born, epoch it died (first published epoch after its last
        appearance, None if alive in the last one), its parent in every epoch it was alive,
        and the parent changes ``(epoch, old_parent, new_parent)``."""
        entries = self.manifest()["epochs"]
        out: dict[int, NodeLineage] = {}
        order = [e["epoch"] for e in entries]
        for e in entries:
            t = self._read_parquet(self._path(e["path"], "nodes.parquet"), columns=["id", "parent", "born"])
            for nid, par, born in zip(t.column("id").to_pylist(), t.column("parent").to_pylist(),
                                      t.column("born").to_pylist()):
                rec = out.get(nid)
                if rec is None:
                    rec = out[nid] = NodeLineage(node_id=nid, born=born, died=None)
                if rec.epochs and rec.parents[rec.epochs[-1]] != par:
                    rec.parent_changes.append((e["epoch"], rec.parents[rec.epochs[-1]], par))
                rec.epochs.append(e["epoch"])
                rec.parents[e["epoch"]] = par
        for rec in out.values():
            i = order.index(rec.epochs[-1])
            rec.died = order[i + 1] if i + 1 < len(order) else None
        return out

    # ---- static snapshots ------------------------------------------------------------
    def write_static(self, epoch: int, method: str, dendrogram_linkage, stats: dict | None = None,
                     leaf_ids=None) -> None:
        """Store a static dendrogram of a published epoch under ``static/<method>.parquet``.

        ``dendrogram_linkage`` is a SciPy linkage matrix (n-1, 4) or an object with
        ``linkage`` (and optionally ``heights`` and ``stats``, like
        :class:`streamtree.static.Dendrogram`). ``stats`` values of length n-1 become
        per-merge columns ``stat_<name>``; scalars go to the metadata. ``leaf_ids`` names
        the leaves (e.g. document ids) in linkage order.
        """
        if not _METHOD_RE.match(method or ""):
            raise ValueError(f"method must be a simple name like 'bhc', got {method!r}")
        with self._writing():
            entry = self._entry(epoch)
            linkage = getattr(dendrogram_linkage, "linkage", dendrogram_linkage)
            linkage = np.asarray(linkage, dtype=np.float64)
            if linkage.ndim != 2 or linkage.shape[1] != 4:
                raise ValueError(f"linkage must have shape (n-1, 4), got {linkage.shape}")
            m = linkage.shape[0]
            heights = np.asarray(getattr(dendrogram_linkage, "heights", linkage[:, 2]), dtype=np.float64)
            all_stats = dict(getattr(dendrogram_linkage, "stats", {}) or {})
            all_stats.update(stats or {})
            cols = {"left": pa.array(linkage[:, 0].astype(np.int64)), "right": pa.array(linkage[:, 1].astype(np.int64)),
                    "distance": pa.array(linkage[:, 2]), "size": pa.array(linkage[:, 3].astype(np.int64)),
                    "height": pa.array(heights)}
            scalars = {}
            for name, value in all_stats.items():
                arr = np.asarray(value)
                if arr.ndim == 1 and arr.shape[0] == m:
                    cols[f"stat_{name}"] = pa.array(arr)
                else:
                    scalars[name] = value
            scalars = _to_json(scalars, "scalar stats")
            meta = {"method": method, "epoch": int(epoch), "scalars": scalars,
                    "leaf_ids": None if leaf_ids is None else [str(i) for i in leaf_ids]}
            table = pa.table(cols).replace_schema_metadata({b"streamtree.static": json.dumps(meta).encode()})
            folder = self._path(entry["path"], "static")
            new_folder = not self._exists(folder)
            self.fs.create_dir(folder, recursive=True)
            if not new_folder:
                # a crashed write of a snapshot here left its temporary file: readers never see
                # it, and no other writer runs (the lease), so it goes now
                for info in self._ls(folder):
                    if _TEMPORARY["static"].match(info.base_name):
                        self._delete(info)
            tmp = f"{folder}/.tmp-{method}-{uuid.uuid4().hex}"
            self._write_parquet(table, tmp)
            write_point(f"rename static {method}")
            self.fs.move(tmp, f"{folder}/{method}.parquet")
            self._sync_dir(folder)  # before the record names the snapshot
            if new_folder:
                self._sync_dir(self._path(entry["path"]))
            entry["static"] = sorted(set(entry.get("static", [])) | {method})
            if self._base_manifest().get("format_version") == 1:
                raise StoreError(f"{self.root}: a store of format version 1 is read-only; replay into a new --store")
            self._commit_record(entry)

    @_one_run
    def read_static(self, epoch: int, method: str) -> StaticSnapshot:
        entry = self._entry(epoch)
        if method not in entry.get("static", []):
            raise StoreError(f"epoch {epoch} has no static snapshot {method!r} (has {entry.get('static', [])})")
        table = self._read_parquet(self._path(entry["path"], "static", f"{method}.parquet"))
        meta = json.loads(table.schema.metadata[b"streamtree.static"])
        linkage = np.column_stack([np.asarray(table.column(c).to_numpy(), dtype=np.float64)
                                   for c in ("left", "right", "distance", "size")]).reshape(-1, 4)
        stats = {c[5:]: table.column(c).to_numpy() for c in table.column_names if c.startswith("stat_")}
        stats.update(meta["scalars"])
        return StaticSnapshot(linkage=linkage, heights=table.column("height").to_numpy(),
                              stats=stats, leaf_ids=meta["leaf_ids"])

    # ---- tables for analysis: nodes of all epochs, events --------------------------------
    @_one_run
    def all_nodes(self, columns: list[str] | None = None, *, pandas: bool = False):
        """The nodes of every published epoch as one table (one row per node and epoch).

        The columns of ``nodes.parquet`` (:data:`NODE_SCHEMA`, or ``columns`` of them) plus
        ``label``, the epoch's label from the manifest. ``pandas=True`` returns a
        ``pandas.DataFrame`` (pandas is not a dependency of streamtree: install it first).
        """
        entries = self.manifest()["epochs"]
        wanted = None if columns is None else [c for c in columns if c != "label"]
        if wanted is not None and (bad := sorted(set(wanted) - set(NODE_SCHEMA.names))):
            raise ValueError(f"unknown node column(s) {bad}; the columns are {NODE_SCHEMA.names + ['label']}")
        schema = NODE_SCHEMA if wanted is None else pa.schema([NODE_SCHEMA.field(c) for c in wanted])
        tables = []
        for e in entries:
            t = self._read_parquet(self._path(e["path"], "nodes.parquet"), columns=wanted)
            t = t.select(schema.names).cast(schema)
            tables.append(t.append_column(pa.field("label", pa.string()),
                                          pa.array([e["label"]] * t.num_rows, pa.string())))
        table = (pa.concat_tables(tables) if tables
                 else schema.empty_table().append_column(pa.field("label", pa.string()), pa.array([], pa.string())))
        if columns is not None:
            table = table.select(list(columns))
        return _as_pandas(table) if pandas else table

    @_one_run
    def events(self, epoch: int | None = None, *, pandas: bool = False):
        """Events of one published epoch, or of all (:data:`EVENT_SCHEMA`, see
        :mod:`streamtree.events`).

        An epoch published with ``events`` reads its ``events.parquet``; any other epoch's
        births, deaths and parent changes are derived from its tree and the previous
        published epoch's (every node of the first published epoch is born). ``pandas=True``
        returns a ``pandas.DataFrame``.
        """
        from streamtree.events import derive_events

        entries = self.manifest()["epochs"]
        if epoch is not None:
            self._entry(epoch)  # a clear error for an unpublished epoch
        tables = []
        prev = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        for i, e in enumerate(entries):
            path = self._path(e["path"], "events.parquet")
            want = epoch is None or e["epoch"] == int(epoch)
            needs_tree = want or (i + 1 < len(entries) and (epoch is None or entries[i + 1]["epoch"] == int(epoch)))
            if want and self._exists(path):
                tables.append(self._read_parquet(path).select(EVENT_SCHEMA.names).cast(EVENT_SCHEMA))
            if not needs_tree:
                continue
            t = self._read_parquet(self._path(e["path"], "nodes.parquet"), columns=["id", "parent"])
            now = (np.asarray(t.column("id").to_numpy(), np.int64), np.asarray(t.column("parent").to_numpy(), np.int64))
            if want and not self._exists(path):
                tables.append(_events_table(derive_events(e["epoch"], *prev, *now), e["epoch"]))
            prev = now
        table = pa.concat_tables(tables) if tables else EVENT_SCHEMA.empty_table()
        return _as_pandas(table) if pandas else table


_FOLDER_RE = re.compile(r"^\d{6,}(-[0-9a-f]{8})?$")
_ENTRY_TYPES = {"epoch": int, "n_nodes": int, "n_documents": int, "n_rejects": int, "died": list, "theta": dict,
                "path": str}


#: the fields of a lease (see connectors.stores.lease), all written by every streamtree version
_LEASE_FIELDS = ("token", "owner", "host", "pid", "command")


#: the files an epoch's folder holds besides its extra tables (named in its commit record)
_EPOCH_FILES = frozenset({"nodes.parquet", "theta.parquet", "assignments.parquet", "rejects.parquet",
                          "events.parquet", CHECKPOINT_ARRAYS, CHECKPOINT_META})
#: extra table names whose files would land on the epoch's own (on a case-blind file system,
#: also names differing only in case: compared casefolded)
_RESERVED_TABLES = frozenset(n.split(".")[0].casefold() for n in _EPOCH_FILES)


def _own_entry(level: str, child: pafs.FileInfo, entry: dict | None) -> str | None:
    """What ``child`` of a store's folder at ``level`` is to :meth:`SnapshotStore._remove_own`:
    ``""`` a file or temporary folder of the store's own (deleted whole), a level to walk into,
    or None if the store does not write that name there (someone else's, kept)."""
    name, folder = child.base_name, child.type == pafs.FileType.Directory
    if level == "aside":
        if name in (COMMITS, EPOCHS) and folder:
            return name
        return "" if (name in _OWN_NAMES and not folder) or _TEMPORARY[""].match(name) else None
    if level == COMMITS:
        return "" if (_RECORD_RE.match(name) and not folder) or _TEMPORARY[COMMITS].match(name) else None
    if level == EPOCHS:
        if _FOLDER_RE.match(name) and folder:
            return "epoch"
        return "" if _TEMPORARY[EPOCHS].match(name) else None
    if level == "epoch":
        if name == "static" and folder:
            return "static"
        if folder:
            return None
        if name in _EPOCH_FILES:
            return ""
        stem = name[:-len(".parquet")] if name.endswith(".parquet") else None
        # an epoch folder whose record is unknown (never committed) may hold any extra table
        tables = entry.get("tables") if entry is not None else None
        ours = stem is not None and (stem in tables if isinstance(tables, list) else bool(_METHOD_RE.match(stem)))
        return "" if ours else None
    if level == "static":
        if _TEMPORARY["static"].match(name):
            return ""
        stem = name[:-len(".parquet")] if name.endswith(".parquet") and not folder else None
        methods = entry.get("static") if entry is not None else None
        ours = stem is not None and (stem in methods if isinstance(methods, list) else bool(_METHOD_RE.match(stem)))
        return "" if ours else None
    raise ValueError(f"unknown level of a store's folder: {level!r}")


def _is_lease(fs: pafs.FileSystem, path: str) -> bool:
    """Whether ``path`` holds a streamtree writer lease (a JSON object with the fields every
    lease has written: a token, its owner, host, process and command), or one a writer is
    creating this moment (still empty). Anything else, a JSON object with only a ``token``
    included, is someone else's file."""
    try:
        with fs.open_input_stream(path) as f:
            raw = f.read()
    except FileNotFoundError:
        return True  # released while we looked
    except OSError:
        return False
    if not raw:
        return True
    try:
        lease = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return False
    return (isinstance(lease, dict) and isinstance(lease.get("token"), str)
            and all(k in lease for k in _LEASE_FIELDS))


#: how a new store's manifest begins (JSON with sorted keys; every new manifest has "checkpoints")
_CLAIM_START = b'{\n "checkpoints": '
_PARTIAL_TOKEN = re.compile(r"(-|[.eE][-+]?|t|tr|tru|f|fa|fal|fals|n|nu|nul)?")


def _cut_short(raw: bytes) -> bool:
    """Whether ``raw`` is what a crash can leave of a JSON object whose bytes were not flushed
    before its rename (writers before this one did not flush): nothing, zeros, or the object
    cut off at some byte. Any other bad JSON is damage, a whole object followed by anything in
    particular: a crash cannot add bytes after a complete record."""
    text = raw.rstrip(b"\0").rstrip()
    if not text:
        return True
    if not text.startswith(b"{"):
        return False
    try:
        json.loads(text.decode("ascii"))  # records are written as ASCII
    except UnicodeDecodeError:
        return False
    except json.JSONDecodeError as exc:
        if exc.msg.startswith("Extra data"):  # the object parsed whole: what follows it is damage
            return False
        # cut inside a string, or the error is at the end: nothing but an unfinished token after it
        return exc.msg.startswith("Unterminated string") or bool(_PARTIAL_TOKEN.fullmatch(exc.doc[exc.pos:]))
    return False


def _check_entry(entry, where: str, run: str | None) -> None:
    """Raise :class:`CorruptStoreError` unless ``entry`` is a well-formed commit record."""
    def bad(what: str):
        return CorruptStoreError(f"{where}: {what}; the store is damaged: restore it from a copy, "
                                 "or replay into a new --store")

    if not isinstance(entry, dict):
        raise bad("the commit record is not a JSON object")
    for key, kind in _ENTRY_TYPES.items():
        if not isinstance(entry.get(key), kind) or isinstance(entry.get(key), bool):
            raise bad(f"field {key!r} is missing or not a {kind.__name__}")
    if entry["epoch"] < 0 or entry["n_nodes"] < 1 or entry["n_documents"] < 0 or entry["n_rejects"] < 0:
        raise bad("negative or zero counts")
    path = entry["path"]
    head, _, name = path.partition("/")
    if head != EPOCHS or not _FOLDER_RE.match(name) or int(name.split("-")[0]) != entry["epoch"]:
        raise bad(f"epoch path {path!r} is not the epoch's folder under {EPOCHS}/")
    if not isinstance(entry["theta"].get("dim"), int) or not isinstance(entry["theta"].get("exact"), bool):
        raise bad("field 'theta' is not valid")
    step = entry["theta"].get("log_step")
    if step is not None and (not isinstance(step, float) or not 0 < step < 1):
        raise bad("field 'theta.log_step' is not valid")
    if not all(isinstance(i, int) for i in entry["died"]):
        raise bad("field 'died' holds non-integers")
    if not isinstance(entry.get("label"), (str, type(None))) or not isinstance(entry.get("key"), (int, type(None))):
        raise bad("field 'label' or 'key' has the wrong type")
    static = entry.get("static", [])
    if not isinstance(static, list) or not all(isinstance(m, str) and _METHOD_RE.match(m) for m in static):
        raise bad("field 'static' is not a list of method names")
    tables = entry.get("tables", [])
    if not isinstance(tables, list) or not all(isinstance(t, str) and _METHOD_RE.match(t) for t in tables):
        raise bad("field 'tables' is not a list of table names")
    if run is not None and entry.get("run") != run:
        raise bad(f"the record belongs to run {entry.get('run')!r}, the manifest to run {run!r}")


def _checkpoint_table(arrays: dict, meta: dict) -> tuple[pa.Table, dict]:
    names, dtypes, shapes, data = [], [], [], []
    for name, value in arrays.items():
        arr = np.asarray(value)
        if arr.dtype.kind not in "biufc":
            raise TypeError(f"checkpoint array {name!r} has dtype {arr.dtype}; only numeric arrays are stored")
        names.append(str(name))
        dtypes.append(arr.dtype.str)
        shapes.append([int(s) for s in arr.shape])
        data.append(np.ascontiguousarray(arr).tobytes())
    table = pa.Table.from_arrays([pa.array(names, pa.string()), pa.array(dtypes, pa.string()),
                                  pa.array(shapes, pa.list_(pa.int64())), pa.array(data, pa.large_binary())],
                                 schema=CHECKPOINT_SCHEMA)
    return table, _to_json(meta, "checkpoint meta")


def _checkpoint_arrays(table: pa.Table, where: str) -> dict[str, np.ndarray]:
    out = {}
    try:
        for name, dtype, shape, data in zip(*(table.column(c).to_pylist() for c in CHECKPOINT_SCHEMA.names)):
            dt = np.dtype(dtype)
            if dt.kind not in "biufc":
                raise ValueError(f"dtype {dtype}")
            out[name] = np.frombuffer(data, dtype=dt).reshape(shape).copy()
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptStoreError(f"{where}: not a valid checkpoint table ({exc}); the store is damaged") from None
    return out


def _nodes_table(tree: EpochTree, top_words) -> pa.Table:
    k = tree.n_nodes
    for name in ("parent", "depth", "mass", "counts", "subtree_counts", "window_counts",
                 "concentration", "born"):
        if np.asarray(getattr(tree, name)).shape != (k,):
            raise ValueError(f"tree.{name} must have shape ({k},)")
    if tree.theta.ndim != 2 or tree.theta.shape[0] != k:
        raise ValueError(f"tree.theta must have shape ({k}, p), got {tree.theta.shape}")
    i64 = lambda a: pa.array(np.asarray(a, dtype=np.int64))  # noqa: E731
    f64 = lambda a: pa.array(np.asarray(a, dtype=np.float64))  # noqa: E731
    return pa.Table.from_arrays([
        i64(tree.node_ids), i64(tree.parent), i64(tree.depth), i64(np.full(k, tree.epoch)),
        i64(tree.counts), i64(tree.subtree_counts), i64(tree.window_counts), f64(tree.mass),
        f64(tree.concentration), i64(tree.born),
        pa.array([[str(w) for w in ws] for ws in top_words], pa.list_(pa.string())),
    ], schema=NODE_SCHEMA)


def _theta_table(tree: EpochTree, top_n: int | None, cosine: float | None = None) -> tuple[pa.Table, bool, float]:
    """The theta table, whether it is exact, and the largest relative L2 error of a row.

    Per row: the fewest largest-|value| entries whose cosine to the row is at least ``cosine``
    (the cosine of a row's restriction to a set S is ||theta_S|| / ||theta||), at most
    ``top_n`` of them, as float32 (the error counts the rounding); with neither, every
    nonzero as float64 (lossless).
    """
    theta = np.asarray(tree.theta, dtype=np.float64)
    p = theta.shape[1]
    indices, values = [], []
    exact = top_n is None and cosine is None
    error = 0.0
    for row in theta:  # one iteration per node, not per document
        nz = np.flatnonzero(row)
        if not exact and nz.size:
            order = nz[np.argsort(-np.abs(row[nz]), kind="stable")]
            keep = order.size
            if cosine is not None:
                kept = np.cumsum(row[order] ** 2)
                keep = int(np.searchsorted(kept, cosine * cosine * kept[-1] * (1 - 1e-12))) + 1
            if top_n is not None:
                keep = min(keep, top_n)
            nz = np.sort(order[:keep])
        stored = row[nz] if exact else row[nz].astype(np.float32)
        norm = np.linalg.norm(row)
        if norm > 0:
            full = row.copy()
            full[nz] -= stored
            error = max(error, float(np.linalg.norm(full) / norm))
        if exact and nz.size > _DENSE_FRACTION * p:
            indices.append(None)
            values.append(row)
        else:
            indices.append(nz.astype(np.int32))
            values.append(stored)
    table = pa.Table.from_arrays([
        pa.array(np.asarray(tree.node_ids, dtype=np.int64)),
        pa.array(indices, pa.list_(pa.int32())),
        pa.array(values, pa.list_(pa.float64() if exact else pa.float32())),
    ], schema=THETA_SCHEMA if not exact else THETA_EXACT_SCHEMA)
    return table.replace_schema_metadata({b"streamtree.theta_dim": str(p).encode()}), exact, error


def _dense_theta(table: pa.Table, node_ids: np.ndarray, p: int) -> np.ndarray:
    theta = np.zeros((node_ids.shape[0], p), dtype=np.float64)
    row_of = {int(n): i for i, n in enumerate(node_ids)}
    for nid, idx, val in zip(table.column("node_id").to_pylist(), table.column("indices").to_numpy(zero_copy_only=False),
                             table.column("values").to_numpy(zero_copy_only=False)):
        r = row_of[nid]
        if idx is None:
            theta[r] = val
        else:
            theta[r, np.asarray(idx, dtype=np.int64)] = val
    return theta


def _parents_first(node_ids: np.ndarray, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows in an order with every parent before its children, and each row's parent row (-1: root)."""
    row_of = {int(n): i for i, n in enumerate(node_ids)}
    parent_row = np.asarray([row_of.get(int(q), -1) for q in parent], dtype=np.int64)
    depth = np.zeros(len(node_ids), dtype=np.int64)
    for r in range(len(node_ids)):  # depth by walking up: trees are shallow
        q, d = parent_row[r], 0
        while q >= 0 and d <= len(node_ids):
            q, d = parent_row[q], d + 1
        if d > len(node_ids):
            raise ValueError("the tree's parent links form a cycle")
        depth[r] = d
    return np.argsort(depth, kind="stable"), parent_row


def _log_rebuild(base: np.ndarray, codes: np.ndarray, step: float) -> np.ndarray:
    """log phi_hat from the parent's (``base``) and a row's codes: normalised in log space.
    The writer and the reader both call this, so the stored error is the reader's."""
    q = base + codes * step
    top = q.max()
    return q - (top + np.log(np.exp(q - top).sum()))


def _log_theta_table(tree: EpochTree, step: float) -> tuple[pa.Table, bool, float]:
    """The log-coded theta table of word distributions (see the module docstring), False (not
    exact) and the largest |log phi_hat - log phi| over nodes and words."""
    theta = np.asarray(tree.theta, dtype=np.float64)
    k, p = theta.shape
    if not np.all(theta > 0) or not np.allclose(theta.sum(axis=1), 1.0, rtol=0, atol=1e-6):
        raise ValueError("theta_log_step stores word distributions: every row of tree.theta must be strictly "
                         "positive and sum to 1 (store other parameters with theta_cosine or exactly)")
    order, parent_row = _parents_first(tree.node_ids, tree.parent)
    log_hat = np.empty_like(theta)
    codes = [None] * k
    error = 0.0
    uniform = np.full(p, -np.log(p))
    for r in order:  # one iteration per node
        base = log_hat[parent_row[r]] if parent_row[r] >= 0 else uniform
        log_phi = np.log(theta[r])
        c = np.rint((log_phi - base) / step)
        if np.abs(c).max() >= 2 ** 31:
            raise ValueError(f"node {tree.node_ids[r]}: log probabilities out of range for step {step}")
        codes[r] = c.astype(np.int32)
        log_hat[r] = _log_rebuild(base, codes[r], step)
        error = max(error, float(np.abs(log_hat[r] - log_phi).max()))
    table = pa.Table.from_arrays([
        pa.array(np.asarray(tree.node_ids, dtype=np.int64)),
        pa.array([None] * k, pa.list_(pa.int32())),
        pa.array(codes, pa.list_(pa.int32())),
    ], schema=THETA_LOG_SCHEMA)
    return table.replace_schema_metadata({b"streamtree.theta_dim": str(p).encode()}), False, error


def _log_theta(table: pa.Table, node_ids: np.ndarray, parent: np.ndarray, p: int, step: float) -> np.ndarray:
    """Word distributions rebuilt from a log-coded theta table (rows sum to 1, all positive)."""
    codes_of = dict(zip(table.column("node_id").to_pylist(), table.column("values").to_numpy(zero_copy_only=False)))
    order, parent_row = _parents_first(node_ids, parent)
    log_hat = np.empty((node_ids.shape[0], p), dtype=np.float64)
    uniform = np.full(p, -np.log(p))
    for r in order:
        base = log_hat[parent_row[r]] if parent_row[r] >= 0 else uniform
        log_hat[r] = _log_rebuild(base, np.asarray(codes_of[int(node_ids[r])], dtype=np.float64), step)
    return np.exp(log_hat)


def _to_json(value, what: str):
    """``value`` as plain JSON data (numpy arrays and scalars become lists and numbers)."""
    def default(obj):
        if isinstance(obj, (np.ndarray, np.generic)):
            return obj.tolist()
        raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")

    try:
        return json.loads(json.dumps(value, allow_nan=False, default=default))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON-serialisable (dicts, lists, str, finite numbers, "
                        f"numpy arrays): {exc}") from None


def _versions() -> dict:
    return {"streamtree": streamtree.__version__, "pyarrow": pa.__version__, "numpy": np.__version__,
            "python": platform.python_version()}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


#: Schema of ``events.parquet`` and of :meth:`SnapshotStore.events`; ``other_id`` is the
#: source node of ``split_from``, the target of ``merged_into``, the new parent of
#: ``parent_changed``, and null for ``born`` and ``died``.
EVENT_SCHEMA = pa.schema([
    pa.field("epoch", pa.int64(), nullable=False),
    pa.field("node_id", pa.int64(), nullable=False),
    pa.field("event", pa.string(), nullable=False),
    pa.field("other_id", pa.int64()),
])


def _events_table(events, epoch: int) -> pa.Table:
    """An :class:`~streamtree.events.Events` (or a table) as an events table of ``epoch``."""
    from streamtree.events import EVENT_KINDS, NO_OTHER

    if isinstance(events, pa.Table):
        missing = sorted(set(EVENT_SCHEMA.names) - set(events.column_names))
        if missing:
            raise ValueError(f"events table lacks column(s) {missing}")
        table = events.select(EVENT_SCHEMA.names).cast(EVENT_SCHEMA)
    else:
        other = np.asarray(events.other_id, dtype=np.int64)
        table = pa.Table.from_arrays([
            pa.array(np.asarray(events.epoch, dtype=np.int64)), pa.array(np.asarray(events.node_id, dtype=np.int64)),
            pa.array([str(k) for k in events.event], pa.string()),
            pa.array(other, pa.int64(), mask=other == NO_OTHER)], schema=EVENT_SCHEMA)
    kinds = set(table.column("event").to_pylist())
    if bad := sorted(kinds - set(EVENT_KINDS)):
        raise ValueError(f"unknown event kind(s) {bad}; events are {', '.join(EVENT_KINDS)}")
    if table.num_rows and set(table.column("epoch").to_pylist()) != {int(epoch)}:
        raise ValueError(f"events of epoch {epoch} carry other epochs")
    return table


def _as_pandas(table: pa.Table):
    try:
        import pandas  # noqa: F401
    except ImportError:
        raise ImportError("pandas=True needs pandas, which streamtree does not install: "
                          "pip install pandas (or use the Arrow table)") from None
    return table.to_pandas()
