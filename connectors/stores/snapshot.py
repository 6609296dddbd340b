"""Versioned, atomically published snapshot store of epoch trees on ``pyarrow.fs``.

Layout of a store (one run)::

    manifest.json                 the commit point: config, versions, vocabulary hash,
                                  completed epochs (with labels), latest checkpoint
    vocabulary.parquet            index, term, document_frequency
    epochs/000000/nodes.parquet   one row per node (see NODE_SCHEMA)
    epochs/000000/theta.parquet   node_id, indices (list<int32> or null), values (list<float64>)
    epochs/000000/assignments.parquet   doc_id, node_id
    epochs/000000/rejects.parquet       only when the epoch had rejects
    epochs/000000/static/<method>.parquet   dendrograms of static snapshots

Publishing writes an epoch under a temporary folder name, renames it to its final name and
only then rewrites the manifest (itself written to a temporary file and renamed). Readers
trust only the manifest, so an epoch folder not listed there is invisible, and a crash
between the rename and the manifest commit leaves the store readable at the previous
epoch; the next publish of that epoch replaces the orphan folder. Renames are atomic on
local and HDFS file systems; on object stores (S3, GCS) the manifest is a single object
write, which is atomic there too, while the epoch folder appears object by object (harmless
because it is not yet in the manifest).

Theta storage: each node's direction is stored *exactly* (float64). Rows with at most
two thirds nonzero entries are stored sparse (``indices`` + ``values``: 12 bytes per
nonzero), denser rows dense (``indices`` null, ``values`` of length p: 8 bytes per entry),
whichever is smaller. vMF mean directions are sparse in practice (a node's direction only
covers words of its documents and its ancestors'), so most rows are sparse. With
``theta_top_n`` set, only the top-N entries by absolute value are kept (lossy, for very
large vocabularies); the manifest and :attr:`StoredEpoch.theta_exact` say so.

Everything is Parquet or JSON: no pickle anywhere, readable by any Parquet tool. A store
has one writer at a time (the replay or the service); any number of readers may read it
while it is being written.
"""

from __future__ import annotations

import json
import logging
import platform
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

import streamtree
from connectors.sources.base import SourceError
from connectors.sources.files import resolve
from streamtree.epoch_tree import EpochTree
from streamtree.records import REJECT_SCHEMA

logger = logging.getLogger(__name__)

FORMAT = "streamtree-snapshots"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
VOCABULARY = "vocabulary.parquet"
_DENSE_FRACTION = 2 / 3
_METHOD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

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
    pa.field("values", pa.list_(pa.float64()), nullable=False),
])
ASSIGNMENT_SCHEMA = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("node_id", pa.int64(), nullable=False),
])


class StoreError(Exception):
    """The store is unreadable or the requested object is not in it."""


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
        False when the store kept only the top-N entries of theta (see ``theta_top_n``):
        the other entries of ``tree.theta`` then read as 0.
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


class SnapshotStore:
    """Snapshot store rooted at ``uri`` (a local directory, created if needed, or any
    URI ``pyarrow.fs`` supports).

    Parameters
    ----------
    uri : str
        Root folder of the run.
    theta_top_n : int or None, default None
        Keep only the top-N theta entries per node (lossy); None stores theta exactly.
    """

    def __init__(self, uri: str, theta_top_n: int | None = None) -> None:
        if theta_top_n is not None and (not isinstance(theta_top_n, int) or theta_top_n < 1):
            raise ValueError(f"theta_top_n must be a positive integer or None, got {theta_top_n!r}")
        self.uri = uri
        self.theta_top_n = theta_top_n
        try:
            self.fs, root = resolve(uri)
        except SourceError as exc:
            raise StoreError(str(exc)) from None
        self.root = root.rstrip("/")

    # ---- paths and low-level I/O -----------------------------------------------------
    def _path(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    @staticmethod
    def epoch_dir(epoch: int) -> str:
        return f"epochs/{int(epoch):06d}"

    def _exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def _write_parquet(self, table: pa.Table, path: str) -> None:
        pq.write_table(table, path, filesystem=self.fs, compression="zstd")

    def _read_parquet(self, path: str, columns=None) -> pa.Table:
        try:
            return pq.read_table(path, filesystem=self.fs, columns=columns)
        except (OSError, pa.ArrowException) as exc:
            raise StoreError(f"{path}: cannot read: {exc}") from None

    # ---- manifest --------------------------------------------------------------------
    def manifest(self) -> dict:
        """The committed manifest (a fresh empty one if nothing was committed yet)."""
        path = self._path(MANIFEST)
        if not self._exists(path):
            return self._new_manifest()
        try:
            with self.fs.open_input_stream(path) as f:
                manifest = json.loads(f.read().decode("utf-8"))
        except (OSError, ValueError) as exc:
            raise StoreError(f"{path}: unreadable manifest: {exc}") from None
        if manifest.get("format") != FORMAT:
            raise StoreError(f"{path}: not a streamtree snapshot manifest")
        if manifest.get("format_version", 0) > FORMAT_VERSION:
            raise StoreError(f"{path}: format version {manifest['format_version']} is newer than this reader")
        return manifest

    def _new_manifest(self) -> dict:
        now = _now()
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "created": now, "updated": now,
                "versions": _versions(), "config": {}, "vocabulary": None, "epochs": [],
                "checkpoint": None}

    def _commit(self, manifest: dict) -> None:
        manifest["updated"] = _now()
        manifest["versions"] = _versions()
        manifest["epochs"].sort(key=lambda e: e["epoch"])
        self._write_manifest(json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False))

    def _write_manifest(self, text: str) -> None:
        """Write the manifest to a temporary file and rename it over the old one."""
        self.fs.create_dir(self.root, recursive=True)
        tmp = self._path(f".{MANIFEST}.tmp-{uuid.uuid4().hex}")
        with self.fs.open_output_stream(tmp) as f:
            f.write(text.encode("utf-8"))
        self.fs.move(tmp, self._path(MANIFEST))

    def set_config(self, config: dict) -> None:
        """Record the run configuration (any JSON-serialisable dict) in the manifest."""
        manifest = self.manifest()
        manifest["config"] = _to_json(config, "config")
        self._commit(manifest)

    def config(self) -> dict:
        return self.manifest()["config"]

    def checkpoint(self) -> dict | None:
        """The checkpoint blob committed with the latest publish (None if none)."""
        return self.manifest()["checkpoint"]

    # ---- vocabulary ------------------------------------------------------------------
    def write_vocabulary(self, vectorizer) -> None:
        """Save a fitted :class:`~streamtree.text.TextVectorizer` (its ``to_arrow`` table).

        The vocabulary fixes the theta columns, so it cannot change once epochs exist.
        """
        table = vectorizer.to_arrow()
        digest = vectorizer.vocabulary_hash()
        manifest = self.manifest()
        old = manifest.get("vocabulary")
        if old is not None and old["hash"] != digest and manifest["epochs"]:
            raise StoreError("the store already has epochs with a different vocabulary (hash mismatch)")
        self.fs.create_dir(self.root, recursive=True)
        tmp = self._path(f".{VOCABULARY}.tmp-{uuid.uuid4().hex}")
        self._write_parquet(table, tmp)
        self.fs.move(tmp, self._path(VOCABULARY))
        manifest["vocabulary"] = {"hash": digest, "size": int(table.num_rows), "file": VOCABULARY}
        self._commit(manifest)

    def vocabulary(self) -> np.ndarray | None:
        """Terms in column order (None if no vocabulary was written)."""
        if self.manifest().get("vocabulary") is None:
            return None
        table = self._read_parquet(self._path(VOCABULARY))
        order = np.argsort(table.column("index").to_numpy(), kind="stable")
        return np.asarray(table.column("term").to_pylist(), dtype=str)[order]

    def vectorizer(self):
        """The stored vectoriser, ready to ``transform`` (None if no vocabulary)."""
        from streamtree.text import TextVectorizer

        if self.manifest().get("vocabulary") is None:
            return None
        return TextVectorizer.from_arrow(self._read_parquet(self._path(VOCABULARY)))

    # ---- publish ---------------------------------------------------------------------
    def publish(
        self,
        tree: EpochTree,
        doc_ids,
        *,
        top_words: list[list[str]] | None = None,
        n_top_words: int = 10,
        rejects: pa.Table | None = None,
        key: int | None = None,
        label: str | None = None,
        checkpoint: dict | None = None,
        replace: bool = False,
        events=None,
    ) -> None:
        """Atomically add one epoch to the store.

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
        checkpoint : dict, optional
            State to resume from, committed with the manifest: JSON data, where numpy
            arrays and scalars are stored as lists and numbers.
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
        if checkpoint is not None:
            checkpoint = _to_json(checkpoint, "checkpoint")
        manifest = self.manifest()
        published = {e["epoch"]: e for e in manifest["epochs"]}
        if epoch in published and not replace:
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

        final = self._path(self.epoch_dir(epoch))
        tmp = self._path("epochs", f".tmp-{epoch:06d}-{uuid.uuid4().hex}")
        self.fs.create_dir(tmp, recursive=True)
        self._write_parquet(_nodes_table(tree, top_words), f"{tmp}/nodes.parquet")
        theta_table, exact = _theta_table(tree, self.theta_top_n)
        self._write_parquet(theta_table, f"{tmp}/theta.parquet")
        self._write_parquet(pa.Table.from_arrays(
            [pa.array(doc_ids.tolist(), pa.string()), pa.array(tree.assignments, pa.int64())],
            schema=ASSIGNMENT_SCHEMA), f"{tmp}/assignments.parquet")
        n_rejects = 0
        if rejects is not None and rejects.num_rows:
            rejects = rejects.select(REJECT_SCHEMA.names).cast(REJECT_SCHEMA)
            self._write_parquet(rejects, f"{tmp}/rejects.parquet")
            n_rejects = rejects.num_rows
        if events is not None:
            self._write_parquet(_events_table(events, epoch), f"{tmp}/events.parquet")

        old = None
        if self._exists(final):
            if epoch in published:
                old = self._path("epochs", f".old-{epoch:06d}-{uuid.uuid4().hex}")
                self.fs.move(final, old)
            else:  # an orphan from a crash before its manifest commit
                logger.info("replacing unpublished leftover folder %s", final)
                self.fs.delete_dir(final)
        self.fs.move(tmp, final)

        entry = {
            "epoch": epoch, "key": None if key is None else int(key),
            "label": label if label is not None else tree.label,
            "path": self.epoch_dir(epoch), "n_nodes": tree.n_nodes,
            "n_documents": int(tree.assignments.shape[0]), "n_rejects": n_rejects,
            "died": [int(i) for i in tree.died],
            "theta": {"dim": int(tree.theta.shape[1]), "exact": exact, "top_n": self.theta_top_n},
            "static": [], "published": _now(),
        }
        manifest["epochs"] = [e for e in manifest["epochs"] if e["epoch"] != epoch] + [entry]
        if checkpoint is not None:
            manifest["checkpoint"] = checkpoint
        self._commit(manifest)
        if old is not None:
            self.fs.delete_dir(old)

    # ---- read ------------------------------------------------------------------------
    def epochs(self) -> list[dict]:
        """Completed epochs in order: dicts with ``epoch``, ``key``, ``label``,
        ``n_nodes``, ``n_documents``, ``n_rejects``, ``static`` and more."""
        return [dict(e) for e in self.manifest()["epochs"]]

    def _entry(self, epoch: int, manifest: dict | None = None) -> dict:
        manifest = manifest or self.manifest()
        for e in manifest["epochs"]:
            if e["epoch"] == int(epoch):
                return e
        done = [e["epoch"] for e in manifest["epochs"]]
        raise StoreError(f"epoch {epoch} is not published (published: {done})")

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
            rejects=rejects,
        )

    def nodes(self, epoch: int) -> pa.Table:
        """The ``nodes.parquet`` table of a published epoch (for reports and ``show``)."""
        return self._read_parquet(self._path(self._entry(epoch)["path"], "nodes.parquet"))

    def rejects(self, epoch: int) -> pa.Table | None:
        """The rejects filed under a published epoch (None if it had none)."""
        entry = self._entry(epoch)
        if not entry["n_rejects"]:
            return None
        return self._read_parquet(self._path(entry["path"], "rejects.parquet"))

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
        manifest = self.manifest()
        entry = self._entry(epoch, manifest)
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
        self.fs.create_dir(folder, recursive=True)
        tmp = f"{folder}/.{method}.tmp-{uuid.uuid4().hex}"
        self._write_parquet(table, tmp)
        self.fs.move(tmp, f"{folder}/{method}.parquet")
        entry["static"] = sorted(set(entry.get("static", [])) | {method})
        self._commit(manifest)

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


def _theta_table(tree: EpochTree, top_n: int | None) -> tuple[pa.Table, bool]:
    theta = np.asarray(tree.theta, dtype=np.float64)
    p = theta.shape[1]
    indices, values = [], []
    exact = True
    for row in theta:  # one iteration per node, not per document
        nz = np.flatnonzero(row)
        if top_n is not None and nz.size > top_n:
            keep = nz[np.argsort(-np.abs(row[nz]), kind="stable")[:top_n]]
            nz = np.sort(keep)
            exact = False
        if top_n is None and nz.size > _DENSE_FRACTION * p:
            indices.append(None)
            values.append(row)
        else:
            indices.append(nz.astype(np.int32))
            values.append(row[nz])
    table = pa.Table.from_arrays([
        pa.array(np.asarray(tree.node_ids, dtype=np.int64)),
        pa.array(indices, pa.list_(pa.int32())),
        pa.array(values, pa.list_(pa.float64())),
    ], schema=THETA_SCHEMA)
    return table.replace_schema_metadata({b"streamtree.theta_dim": str(p).encode()}), exact


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
