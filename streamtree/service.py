"""``streamtree serve``: the long-running ingestion service.

It watches a landing folder (:mod:`connectors.landing`), reads each new file once, buckets
its rows into event-time epochs, and when the watermark (:mod:`streamtree.watermark`) closes
an epoch it fits it with the dTSSBP and publishes it to a snapshot store, exactly like one
epoch of a replay (the per-epoch step is :class:`streamtree.replay.EpochFitter`).

Processing is a deterministic function of the sequence of landed files
-----------------------------------------------------------------------
Files are taken one at a time in the order they became ready (see
:mod:`connectors.landing`). After each file the watermark moves and every epoch it closed is
fitted and published; a row for an already closed epoch is late (rejected, or moved to the
next open epoch with ``late_policy="next-epoch"``). Within an epoch, rows are fitted in
``(file name, position)`` order, the order of a replay of the same folder, whatever order the
files came in. So the published epochs depend only on the file sequence (and on idle
closes, which are logged as events), not on poll timing.

Vocabulary
----------
A service cannot fit its vocabulary over a corpus it has not seen. By default the
vocabulary is fitted once on a warm-up span: the first closed epochs, until they hold
``warmup_docs`` documents; those epochs wait (in memory) and are fitted and published as
soon as the vocabulary exists, and the vocabulary is then fixed for the life of the store
(theta columns must not change). Terms that first appear later are not in it; restart with
a new store (or ``vocabulary_from`` a replay over recent data) to refresh it. With
``vocabulary_from``, the vocabulary of another store is used from the start; a service run
with the vocabulary of a replay of the same files publishes exactly that replay's epochs
(except that a late row is a reject here and part of its epoch in the replay).

Exactly once and restarts
-------------------------
Each published epoch commits, atomically with it, the ledger of the files consumed since the
previous commit (:mod:`connectors.stores.ledger`). Rows of still-open epochs are not
committed: after a stop or a crash, the files that fed them are not in the ledger and are
simply read again. On start the service rebuilds its state from the committed ledger by
re-running the logged events (file reads and idle closes) in order without republishing,
which reproduces the model, the open epochs and the watermark bit for bit; then it goes on
with the files not in the ledger. This needs the ledgered files to still be in the landing
folder. A kill at any point, then a restart, therefore ends in the same store as a service
that was never stopped.

Stopping
--------
SIGTERM or SIGINT: the service finishes the step it is in (reading a file, or fitting and
committing the epoch in progress), logs which epoch was committed last and what stays
uncommitted, and exits 0. A second signal abandons the epoch in progress at once (nothing of
it is committed; the store stays at the previous epoch) and exits 130.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pyarrow as pa

import streamtree
from connectors.landing import LandedFile, LandingError, LandingZone, read_landed
from connectors.stores.ledger import Ledger
from connectors.stores.snapshot import SnapshotStore, StoreError
from streamtree.epochs import LATE_POLICIES, Bucketer, Epoch, EpochSpec
from streamtree.records import make_rejects
from streamtree.replay import EpochFitter
from streamtree.text import TextVectorizer
from streamtree.watermark import Watermark, is_idle

logger = logging.getLogger(__name__)

UNREADABLE_FILE = "unreadable file"  # reject reason, followed by the error: "unreadable file '...'"
EXIT_ABANDONED = 130


@dataclass
class ServeConfig:
    """Everything ``streamtree serve`` needs.

    ``model`` holds the keyword arguments of :class:`streamtree.model.DTSSBP`; the service
    does not interpret them (the engine ones, ``engine``, ``engine_options``, ``n_threads``,
    ``n_jobs``, only decide where the fit runs and may change between restarts).
    """

    landing: str
    store: str
    text_col: str
    time_col: str
    id_col: str | None = None
    time_unit: str = "auto"
    epoch: str = "1d"
    allowed_lateness: float = 0.0  # seconds
    late_policy: str = "reject"
    idle_timeout: float | None = None  # seconds
    poll_interval: float = 5.0
    settle: float | None = None  # default: 2 poll intervals
    require_success: bool = False
    vocabulary_from: str | None = None
    warmup_docs: int = 1000
    min_df: int | float = 2
    max_df: int | float = 0.5
    max_features: int | None = None
    top_words: int = 10
    batch_size: int = 8192
    model: dict = field(default_factory=dict)

    _RUNTIME = ("landing", "store", "poll_interval", "settle", "batch_size", "idle_timeout")
    _ENGINE_PARAMS = ("engine", "engine_options", "n_threads", "n_jobs")

    def __post_init__(self) -> None:
        if self.late_policy not in LATE_POLICIES:
            raise ValueError(f"late policy must be one of {LATE_POLICIES}, got {self.late_policy!r}")
        if self.allowed_lateness < 0:
            raise ValueError("allowed lateness must be >= 0")
        if self.poll_interval <= 0:
            raise ValueError("poll interval must be positive")
        if self.idle_timeout is not None and self.idle_timeout <= 0:
            raise ValueError("idle timeout must be positive")
        if int(self.warmup_docs) < 1:
            raise ValueError("warm-up documents must be at least 1")
        spec = EpochSpec.parse(self.epoch)
        if spec.kind == "column":
            raise ValueError("serve needs event-time epochs (e.g. 1d, month, 10y): a watermark cannot close column epochs")

    @property
    def settle_seconds(self) -> float:
        return 2 * self.poll_interval if self.settle is None else self.settle

    def identity(self) -> dict:
        """What must match for a restart to continue a store (not where or how often it runs)."""
        d = {k: v for k, v in asdict(self).items() if k not in self._RUNTIME}
        d["model"] = {k: v for k, v in sorted(self.model.items()) if k not in self._ENGINE_PARAMS}
        return json.loads(json.dumps(d, default=str))

    def vectorizer(self) -> TextVectorizer:
        return TextVectorizer(min_df=self.min_df, max_df=self.max_df, max_features=self.max_features)


# ------------------------------------------------------------------------------ metrics
class ServiceMetrics:
    """Prometheus metrics of one service (its own registry) and a health endpoint.

    Counters are totals over the store's life: on a restart they are rebuilt with the state.
    """

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter as PCounter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.rows_read = PCounter("streamtree_rows_read", "Rows read from landed files", registry=r)
        self.rows_rejected = PCounter("streamtree_rows_rejected", "Rejected rows committed with an epoch, by reason",
                                      ["reason"], registry=r)
        self.documents = PCounter("streamtree_documents_fitted", "Documents fitted in published epochs", registry=r)
        self.files = PCounter("streamtree_files", "Landed files taken, by status (ingested, duplicate, unreadable)",
                              ["status"], registry=r)
        self.epochs = PCounter("streamtree_epochs_published", "Epochs published to the store", registry=r)
        self.live_nodes = Gauge("streamtree_live_nodes", "Nodes of the last published tree", registry=r)
        self.pending_rows = Gauge("streamtree_pending_rows", "Rows waiting in open epochs (not yet committed)",
                                  registry=r)
        self.watermark = Gauge("streamtree_watermark_timestamp_seconds", "Event-time watermark (unix seconds)",
                               registry=r)
        self.max_event = Gauge("streamtree_max_event_timestamp_seconds", "Largest event time seen (unix seconds)",
                               registry=r)
        self.lag = Gauge("streamtree_event_time_lag_seconds",
                         "Wall clock minus the largest event time seen", registry=r)
        self.since_commit = Gauge("streamtree_seconds_since_last_commit", "Seconds since the last epoch commit",
                                  registry=r)
        self.commit_seconds = Histogram("streamtree_checkpoint_seconds",
                                        "Duration of an epoch commit (ledger, epoch files, manifest)", registry=r,
                                        buckets=(0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30))
        self.fit_seconds = Histogram("streamtree_fit_seconds", "Duration of fitting one epoch", registry=r,
                                     buckets=(0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000))
        self.latency = Histogram("streamtree_landing_to_publish_seconds",
                                 "From the newest file of an epoch landing to the epoch's publish", registry=r,
                                 buckets=(0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000, 3600))
        self._max_event_s: float | None = None
        self._last_commit: float | None = None
        self.lag.set_function(lambda: 0.0 if self._max_event_s is None else time.time() - self._max_event_s)
        self.since_commit.set_function(lambda: 0.0 if self._last_commit is None else time.time() - self._last_commit)

    def set_max_event(self, seconds: float | None) -> None:
        self._max_event_s = seconds
        if seconds is not None:
            self.max_event.set(seconds)

    def committed(self, at: float) -> None:
        self._last_commit = at

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class _Handler(BaseHTTPRequestHandler):
    service: "Service"  # set on the subclass made per server

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST

            self._send(200, self.service.metrics.exposition(), CONTENT_TYPE_LATEST)
        elif path in ("/healthz", "/health"):
            status = self.service.health()
            self._send(200 if status["healthy"] else 503, json.dumps(status).encode(), "application/json")
        else:
            self._send(404, b"not found: try /metrics or /healthz\n", "text/plain")

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args) -> None:  # scrapes are not worth a log line each
        logger.debug("http: " + fmt, *args)


def parse_address(text: str) -> tuple[str, int] | None:
    """``"127.0.0.1:9750"``, ``":9750"`` (loopback), ``"0.0.0.0:9750"``, ``"[::1]:9750"``; ``"off"``: None."""
    if text.strip().lower() in ("off", "none", ""):
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"cannot parse address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9750, or 'off'")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


# ------------------------------------------------------------------------------ the service
@dataclass
class ServeSummary:
    """Where the service stands when it stops."""

    files: Counter = field(default_factory=Counter)
    rows_read: int = 0
    documents: int = 0
    rejected: int = 0
    pending_rows: int = 0
    epochs_published: int = 0  # by this process
    last_epoch: tuple[int, str] | None = None
    stopped_by: str = "done"
    abandoned: bool = False  # a second signal left without committing the epoch in progress

    def format(self) -> str:
        files = ", ".join(f"{n} {s}" for s, n in sorted(self.files.items())) or "none"
        last = f"epoch {self.last_epoch[0]} ({self.last_epoch[1]})" if self.last_epoch else "no epoch yet"
        return (f"files: {files}\nrows read: {self.rows_read} = {self.documents} fitted + {self.rejected} rejected "
                f"+ {self.pending_rows} in open epochs (uncommitted)\n"
                f"published now: {self.epochs_published} epochs; store committed through {last}")


class _Abandon(Exception):
    """Raised by a second stop signal: leave now, commit nothing more."""


class Service:
    """The ingestion loop; see the module docstring.

    Parameters
    ----------
    config : ServeConfig
    metrics_addr : (host, port) or None
        Where to serve ``/metrics`` and ``/healthz`` (None: no HTTP server).
    """

    def __init__(self, config: ServeConfig, metrics_addr: tuple[str, int] | None = None) -> None:
        self.config = config
        self.metrics_addr = metrics_addr
        self.metrics = ServiceMetrics()
        self.spec = EpochSpec.parse(config.epoch)
        self.landing = LandingZone(config.landing, settle=config.settle_seconds,
                                   require_success=config.require_success)
        self.store = SnapshotStore(config.store)
        self.ledger = Ledger(self.store)
        self.summary = ServeSummary()
        self._stop = threading.Event()
        self._signals = 0
        self._in_epoch: Epoch | None = None
        self._heartbeat = time.time()
        self._http: ThreadingHTTPServer | None = None
        self._reset_state()

    def _reset_state(self) -> None:
        from streamtree.model import DTSSBP

        c = self.config
        self.bucketer = Bucketer(self.spec)
        self.watermark = Watermark(self.spec, allowed_lateness_us=int(round(c.allowed_lateness * 1e6)))
        self.model = DTSSBP(**c.model)
        self.vectorizer: TextVectorizer | None = None
        self.fitter: EpochFitter | None = None
        self._warmup: list[Epoch] = []
        self._events: list[dict] = []  # taken since the last commit
        self._seq = 0
        self._hashes: dict[str, str] = {}  # sha256 -> name of the ingested file
        self._taken: dict[str, tuple[int, int]] = {}  # name -> (size, mtime_ns) when taken
        self._changed_warned: set[str] = set()
        self._epoch_ready_ns: dict[int, int] = {}  # epoch key -> newest ready time of its files
        self._last_ready_ns: int | None = None
        self._committed: set[int] = set()
        self._replaying = False
        self._accepted = 0  # rows put into the bucketer
        self._emitted = 0  # rows of closed epochs

    # ---- start -------------------------------------------------------------------------
    def _open_store(self) -> None:
        """Check the store against the config, set the vocabulary, rebuild from the ledger."""
        self.landing.check()
        try:
            manifest = self.store.manifest()
        except StoreError:
            raise
        except OSError as exc:
            raise StoreError(f"{self.config.store}: cannot open the store: {exc}") from None
        epochs = manifest["epochs"]
        stored = (manifest.get("config") or {}).get("serve")
        identity = self.config.identity()
        if epochs and stored is None:
            raise StoreError(f"{self.config.store}: the store holds {len(epochs)} epochs that are not from "
                             "`streamtree serve` (a replay?); give the service its own --store")
        if epochs and stored != identity:
            diff = sorted(k for k in set(stored) | set(identity) if stored.get(k) != identity.get(k))
            raise StoreError(f"{self.config.store}: the store was served with other settings ({', '.join(diff)}); "
                             "restart with the same settings or give another --store")
        self._committed = {int(e["epoch"]) for e in epochs}
        self.ledger.remove_uncommitted(self._committed)
        if self.config.vocabulary_from:
            vec = SnapshotStore(self.config.vocabulary_from).vectorizer()
            if vec is None:
                raise StoreError(f"{self.config.vocabulary_from}: no vocabulary in this store (--vocabulary-from)")
            if epochs and self.store.vectorizer().vocabulary_hash() != vec.vocabulary_hash():
                raise StoreError(f"{self.config.store}: its vocabulary differs from the one in "
                                 f"{self.config.vocabulary_from}; restart with the store's own vocabulary source")
            self._set_vocabulary(vec, write=not epochs)
        elif epochs:
            vec = self.store.vectorizer()
            if vec is None:
                raise StoreError(f"{self.config.store}: published epochs but no vocabulary; the store is damaged")
            self._set_vocabulary(vec, write=False)
        if not epochs:
            self.store.set_config({"serve": identity, "streamtree": streamtree.__version__})
            return
        self._catch_up()

    def _catch_up(self) -> None:
        """Re-run the committed events in order (no publishing) to rebuild the state."""
        events = self.ledger.read(self._committed).to_pylist()
        t0 = time.perf_counter()
        self._replaying = True
        try:
            for ev in events:
                self._seq = ev["seq"] + 1
                if ev["kind"] == "idle":
                    self._close(int(ev["close_through"]))
                    continue
                landed = LandedFile(f"{self.landing.root}/{ev['name']}", ev["name"], ev["size"], ev["mtime_ns"],
                                    ev["ready_ns"], _format_of(ev["name"]))
                self._take(landed, committed=ev)
        finally:
            self._replaying = False
        last = max(self._committed)
        if self._in_model_through() < last:
            raise StoreError(f"{self.config.store}: rebuilding from the ledger reached epoch "
                             f"{self._in_model_through()} but the store holds epoch {last}; the ledger is incomplete")
        logger.info("resumed: rebuilt the state from %d ledger events through epoch %d in %.1fs",
                    len(events), last, time.perf_counter() - t0)

    def _in_model_through(self) -> int:
        trees = getattr(self.model, "trees_", None)
        return trees[-1].epoch if trees else -1

    def _set_vocabulary(self, vec: TextVectorizer, *, write: bool) -> None:
        self.vectorizer = vec
        self.fitter = EpochFitter(self.model, vec)
        if write:
            self.store.write_vocabulary(vec)
        logger.info("vocabulary: %d terms", vec.vocabulary_.shape[0])

    # ---- taking files ------------------------------------------------------------------
    def _take(self, landed: LandedFile, committed: dict | None = None) -> None:
        """Read one file and apply it; ``committed`` is its ledger event when rebuilding."""
        c = self.config
        event = {"seq": self._seq, "kind": "file", "name": landed.name, "size": landed.size,
                 "mtime_ns": landed.mtime_ns, "ready_ns": landed.ready_ns, "sha256": None, "status": None,
                 "n_read": 0, "detail": None, "close_through": None}
        self._seq += 1
        if committed is not None and committed["status"] == "duplicate":
            event.update(committed)
        elif committed is not None and committed["status"] == "unreadable":
            event.update(committed)
            self._unreadable(landed.name, committed["detail"])
        else:
            try:
                read = read_landed(self.landing.fs, landed, text_col=c.text_col, time_col=c.time_col,
                                   id_col=c.id_col, time_unit=c.time_unit, batch_size=c.batch_size)
            except LandingError as exc:
                if committed is not None:
                    raise StoreError(f"cannot rebuild from the ledger: {exc} (the file was read fine when it "
                                     "was ingested; restore it in the landing folder)") from None
                msg = str(exc).split(": ", 1)[-1]
                event.update(status="unreadable", detail=msg)
                logger.warning("landing: %s is unreadable, recorded as a reject: %s", landed.name, msg)
                self._unreadable(landed.name, msg)
            else:
                if committed is not None and read.sha256 != committed["sha256"]:
                    raise StoreError(f"cannot rebuild from the ledger: {landed.name} changed since it was ingested "
                                     "(content hash differs); put the original back in the landing folder")
                dup = self._hashes.get(read.sha256)
                event.update(sha256=read.sha256, n_read=read.n_read)
                if dup is not None:
                    event.update(status="duplicate", detail=dup)
                    logger.warning("landing: %s has the same content as %s, already ingested: skipped",
                                   landed.name, dup)
                else:
                    event.update(status="ingested")
                    self._hashes[read.sha256] = landed.name
                    self._ingest(landed, read)
        self._taken[landed.name] = (landed.size, landed.mtime_ns)
        self._last_ready_ns = max(self._last_ready_ns or 0, landed.ready_ns)
        self.summary.files[event["status"]] += 1
        self.metrics.files.labels(event["status"]).inc()
        if committed is None:
            self._events.append(event)
            logger.info("took %s: %s, %d rows", landed.name, event["status"], event["n_read"])
        self._close(self.watermark.closable_through())

    def _ingest(self, landed: LandedFile, read) -> None:
        rows = read.rows
        self.summary.rows_read += read.n_read
        self.metrics.rows_read.inc(read.n_read)
        self.bucketer.add_rejects(read.rejects)
        if rows.num_rows:
            keys = np.unique(self.spec.keys(rows))
            for k in keys.tolist():
                self._epoch_ready_ns[k] = max(self._epoch_ready_ns.get(k, 0), landed.ready_ns)
            late_before = self.bucketer.n_late
            self.bucketer.add(rows, late=self.config.late_policy)
            self._accepted += rows.num_rows - (self.bucketer.n_late - late_before)
            if self.bucketer.n_late > late_before:
                logger.info("%s: %d late rows for closed epochs (%s)", landed.name,
                            self.bucketer.n_late - late_before,
                            "moved to the next open epoch" if self.config.late_policy == "next-epoch" else "rejected")
            self.watermark.observe(rows.column("time"))
            self._update_gauges()

    def _unreadable(self, name: str, message: str) -> None:
        reason = f"{UNREADABLE_FILE} '{message}'"
        self.bucketer.add_rejects(make_rejects(source=[name], position=[None], id=[None], reason=[reason]))

    # ---- closing epochs ----------------------------------------------------------------
    def _close(self, through: int | None) -> None:
        if through is None:
            return
        for ep in self.bucketer.pop_through(through):
            self._emitted += ep.n_rows
            # Replay order: by file name, then position, whatever order the files came in.
            rows = ep.rows.sort_by([("source", "ascending"), ("position", "ascending")]) if ep.n_rows else ep.rows
            ep = Epoch(ep.index, ep.key, ep.label, rows, ep.rejects)
            if self.vectorizer is None:
                self._warm_up(ep)
            else:
                self._fit(ep)
            if self._stop.is_set() and not self._replaying:
                # leave the remaining closed epochs to the next start (they are re-derived)
                raise _StopNow()

    def _warm_up(self, ep: Epoch) -> None:
        self._warmup.append(ep)
        n = sum(e.n_rows for e in self._warmup)
        if n < self.config.warmup_docs:
            logger.info("warm-up: %d of %d documents for the vocabulary (epoch %s closed)", n,
                        self.config.warmup_docs, ep.label)
            return
        texts = pa.chunked_array([c for e in self._warmup for c in e.rows.column("text").chunks], pa.string())
        vec = self.config.vectorizer()
        vec.fit(texts)
        logger.info("vocabulary fitted on %d documents of %d warm-up epochs", n, len(self._warmup))
        self._set_vocabulary(vec, write=not self._replaying)
        queued, self._warmup = self._warmup, []
        for e in queued:
            self._fit(e)

    def _fit(self, ep: Epoch) -> None:
        self._in_epoch = ep
        t0 = time.perf_counter()
        fitted = self.fitter.fit(ep)
        self._heartbeat = time.time()
        if fitted is None:
            self._in_epoch = None
            return
        fit_s = time.perf_counter() - t0
        tree = fitted.tree
        # Rebuilding skips the epochs already in the store; an epoch that the committed events
        # closed but that a crash kept from being committed is committed now (as it would have been).
        if ep.index not in self._committed:
            self._commit(fitted, fit_s)
        del self.model.trees_[:-1]  # the store keeps the history; memory stays flat
        self.summary.documents += fitted.n_documents
        self.summary.rejected += fitted.rejects.num_rows
        self.metrics.documents.inc(fitted.n_documents)
        for reason, n in Counter(_reason_kind(r) for r in fitted.rejects.column("reason").to_pylist()).items():
            self.metrics.rows_rejected.labels(reason).inc(n)
        self.metrics.epochs.inc()
        self.metrics.live_nodes.set(tree.n_nodes)
        self.summary.last_epoch = (ep.index, ep.label)
        self._epoch_ready_ns.pop(ep.key, None)
        self._in_epoch = None
        self._update_gauges()

    def _commit(self, fitted, fit_s: float) -> None:
        ep = fitted.epoch
        t0 = time.perf_counter()
        events, self._events = self._events, []
        self.ledger.write(ep.index, events)
        fitted.publish(self.store, n_top_words=self.config.top_words,
                       checkpoint={"service": {"epoch": ep.index, "key": ep.key, "next_seq": self._seq,
                                               "watermark": self.watermark.state()}})
        self._committed.add(ep.index)
        now = time.time()
        commit_s = time.perf_counter() - t0
        self.metrics.commit_seconds.observe(commit_s)
        self.metrics.fit_seconds.observe(fit_s)
        self.metrics.committed(now)
        ready = self._epoch_ready_ns.get(ep.key)
        if ready:
            self.metrics.latency.observe(max(0.0, now - ready / 1e9))
        self.summary.epochs_published += 1
        logger.info("published epoch %d (%s): %d documents, %d rejects, %d live nodes; fit %.2fs, commit %.2fs",
                    ep.index, ep.label, fitted.n_documents, fitted.rejects.num_rows, fitted.tree.n_nodes,
                    fit_s, commit_s)

    def _update_gauges(self) -> None:
        pending = self._accepted - self._emitted + sum(e.n_rows for e in self._warmup)
        self.summary.pending_rows = pending
        self.metrics.pending_rows.set(pending)
        mx = self.watermark.max_time_us
        self.metrics.set_max_event(None if mx is None else mx / 1e6)
        if self.watermark.value_us is not None:
            self.metrics.watermark.set(self.watermark.value_us / 1e6)

    # ---- the loop ----------------------------------------------------------------------
    def health(self) -> dict:
        stalled = time.time() - self._heartbeat > max(60.0, 5 * self.config.poll_interval) and self._in_epoch is None
        ep = self._in_epoch
        return {"healthy": not stalled and not self._stop.is_set(), "stopping": self._stop.is_set(),
                "fitting": None if ep is None else ep.label,
                "last_epoch": None if self.summary.last_epoch is None else self.summary.last_epoch[1],
                "pending_rows": self.summary.pending_rows, "seconds_since_heartbeat": time.time() - self._heartbeat}

    def poll_once(self, now: float | None = None) -> int:
        """One poll: take every ready file, then close epochs if the stream is idle. Returns files taken."""
        now = time.time() if now is None else now
        files = self.landing.poll(skip=self._taken, now=now)
        self._warn_changed()
        for f in files:
            self._take(f)
            self._heartbeat = time.time()
            if self._stop.is_set():
                raise _StopNow()
        last = None if self._last_ready_ns is None else self._last_ready_ns / 1e9
        if is_idle(now, last, self.config.idle_timeout):
            target = self.watermark.closable_through(idle=True)
            done = self.bucketer.closed_through
            if target is not None and (done is None or target > done):
                logger.info("stream idle for %.0fs: closing epochs through %s", now - last, self.spec.label(target))
                self._events.append({"seq": self._seq, "kind": "idle", "name": None, "size": None, "mtime_ns": None,
                                     "ready_ns": None, "sha256": None, "status": None, "n_read": None,
                                     "detail": None, "close_through": int(target)})
                self._seq += 1
                self._close(target)
        self._heartbeat = time.time()
        return len(files)

    def _warn_changed(self) -> None:
        for name, state in self._taken.items():
            now_state = self.landing.state_of(name)
            if now_state is not None and now_state != state and name not in self._changed_warned:
                self._changed_warned.add(name)
                logger.warning("landing: %s changed after it was ingested; the change is ignored (land new data "
                               "as a new file)", name)

    def request_stop(self, reason: str = "stop requested") -> None:
        if not self._stop.is_set():
            self.summary.stopped_by = reason
        self._stop.set()

    def run(self, once: bool = False, install_signals: bool = True) -> ServeSummary:
        """Serve until stopped (or, with ``once``, take what is ready, publish what closed, return)."""
        old = {}
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                old[sig] = signal.signal(sig, self._on_signal)
        try:
            self._start_http()
            try:
                self._open_store()
            except _Abandon:
                self.summary.abandoned = True
                return self.summary
            logger.info("serving %s -> %s (epochs %s, allowed lateness %gs, late rows: %s)%s", self.config.landing,
                        self.config.store, self.config.epoch, self.config.allowed_lateness, self.config.late_policy,
                        " once" if once else "")
            try:
                if once:
                    # two listings one poll interval apart, so files still being written are seen growing
                    self.landing.poll(skip=self._taken)
                    self._stop.wait(self.config.poll_interval)
                    self.poll_once()
                else:
                    while not self._stop.is_set():
                        self.poll_once()
                        self._stop.wait(self.config.poll_interval)
            except _StopNow:
                pass
            except _Abandon:
                self.summary.abandoned = True
                return self.summary
            self._log_stop()
            return self.summary
        finally:
            self.model.close()
            if self._http is not None:
                self._http.shutdown()
                self._http.server_close()
            for sig, handler in old.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum, frame) -> None:
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            ep = self._in_epoch
            what = f"finishing and committing epoch {ep.index} ({ep.label}) first" if ep is not None else "no epoch in progress"
            logger.warning("%s: stopping (%s); send it again to abandon at once", name, what)
            self.request_stop(name)
        else:
            ep = self._in_epoch
            what = f"epoch {ep.index} ({ep.label}) abandoned, nothing of it committed" if ep else "nothing in progress"
            logger.warning("%s again: leaving now: %s; %s", name, what, self._where())
            raise _Abandon(what)

    def _where(self) -> str:
        last = self.summary.last_epoch
        return ("the store is committed through " + (f"epoch {last[0]} ({last[1]})" if last else
                                                      (f"epoch {max(self._committed)}" if self._committed else "no epoch")))

    def _log_stop(self) -> None:
        logger.info("stopped (%s): %s; %d rows of open epochs stay uncommitted and are re-read from their files "
                    "on restart", self.summary.stopped_by, self._where(), self.summary.pending_rows)

    def _start_http(self) -> None:
        if self.metrics_addr is None:
            return
        handler = type("Handler", (_Handler,), {"service": self})
        try:
            self._http = ThreadingHTTPServer(self.metrics_addr, handler)
        except OSError as exc:
            raise StoreError(f"cannot listen on {self.metrics_addr[0]}:{self.metrics_addr[1]} for metrics: {exc}; "
                             "use another --metrics-addr or 'off'") from None
        self._http.daemon_threads = True
        threading.Thread(target=self._http.serve_forever, name="metrics", daemon=True).start()
        host, port = self._http.server_address[:2]
        self.bound_address = (host, port)
        logger.info("metrics on http://%s:%d/metrics, health on /healthz", host, port)


class _StopNow(Exception):
    """A stop was requested: leave the loop after the step just finished."""


def _reason_kind(reason: str) -> str:
    cut = reason.find(" '")
    return reason if cut < 0 else reason[:cut]


def _format_of(name: str) -> str:
    from connectors.sources.files import format_of

    fmt = format_of(name)
    if fmt is None:
        raise StoreError(f"ledger names {name!r}, which is not a data file name")
    return fmt


# ------------------------------------------------------------------------------ logging
class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
               "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(fmt: str = "plain", level: int = logging.INFO) -> None:
    """Log to stderr, plain (``2026-03-14 10:00:00 INFO name: message``) or as JSON lines."""
    handler = logging.StreamHandler()
    if fmt == "json":
        formatter = JsonFormatter()
        formatter.converter = time.gmtime
    elif fmt == "plain":
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    else:
        raise ValueError(f"log format must be 'plain' or 'json', got {fmt!r}")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)


__all__ = ["EXIT_ABANDONED", "JsonFormatter", "ServeConfig", "ServeSummary", "Service", "ServiceMetrics",
           "configure_logging", "parse_address"]
