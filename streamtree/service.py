"""``streamtree serve``: the long-running ingestion service.

It watches a landing folder (:mod:`connectors.landing`), reads each new file once, buckets
its rows into event-time epochs, and when the watermark (:mod:`streamtree.watermark`) closes
an epoch it fits it with the dTSSBP and publishes it to a snapshot store, exactly like one
epoch of a replay (the per-epoch step is :class:`streamtree.replay.EpochFitter`).

Processing is a deterministic function of the sequence of landed files
-----------------------------------------------------------------------
Files are taken one at a time in the order they landed (see :mod:`connectors.landing`).
After each file the watermark moves and every epoch it closed is fitted and published; a row for an already closed epoch is late (rejected, or moved to the
next open epoch with ``late_policy="next-epoch"``). Within an epoch, rows are fitted in the
canonical order of :data:`streamtree.epochs.ROW_ORDER` (file name, then position in the file),
the order of a replay of the same folder, whatever order the files came in and however many
polls, ``--once`` runs or restarts took them. So the published epochs depend only on the file
sequence (and on idle closes, which are logged as events), not on poll timing.

Two bounds keep a stray time from taking the stream over: a row dated more than
``future_tolerance`` after its file landed is a ``future time`` reject (a live stream cannot
hold it; one row of 2099 would close every epoch up to it), and until the first epoch closes a
row more than ``max_backlog`` epochs behind the watermark's epoch is ``out of range`` (one row
of 1970 would open an epoch for every day since). Both read the file's landing time and the
files before it, not the clock, so they too depend on the file sequence only.

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
While it runs the service holds the store's writer lease. Each published epoch commits,
atomically with it (one commit record of the store): the model checkpoint, the ledger of
the files taken since the previous commit (:mod:`connectors.stores.ledger`), the rows and
rejects still waiting in open epochs, and the watermark and counters. A restart loads the
last commit and goes on with the files that are not in the ledger: the files taken after
the last commit are simply taken again, in the same order. So a kill at any point, then a
restart, ends in the same store as a service that was never stopped, and repeated
``--once`` runs as files arrive publish what one long-running service would. Resuming
reads one checkpoint and the ledger, not the history of the data; the landed files may be
archived once an epoch after them is committed.

Stopping
--------
SIGTERM or SIGINT: the service finishes the step it is in (reading a file, or fitting and
committing the epoch in progress), logs which epoch was committed last and what stays
uncommitted, and exits 0. A second signal abandons the epoch in progress at once (nothing of
it is committed; the store stays at the previous epoch) and exits 130.
"""

from __future__ import annotations

import errno
import json
import logging
import signal
import threading
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pyarrow as pa

import streamtree
from connectors.landing import LandedFile, LandedRead, LandingError, LandingNotReady, LandingZone, read_landed
from connectors.sources.files import file_format, nesting, partition_keys, partitioned_digest
from connectors.sources.times import TimeParser
from connectors.stores.ledger import LEDGER_TABLE, ledger_table, read_ledger
from connectors.stores.snapshot import SnapshotStore, StoreError
from streamtree.epochs import (LATE_POLICIES, Bucketer, Epoch, EpochSpec, IdWindow, TimeRange, int64_values,
                               row_key)
from streamtree.records import (DEFAULT_DUPLICATE_TEXTS, DUPLICATE_ID, EMPTY_AFTER_VOCABULARY, FUTURE_TIME,
                                OUT_OF_RANGE, REJECT_SCHEMA, _reason_kind, make_rejects, reject_rows)
from streamtree.model import RUN_LOCATION_PARAMS
from streamtree.replay import (REPEATED_TEXTS_WARNING, EpochFitter, QuietEpochs, check_duplicate_texts,
                               identity_differences, repeated_texts_note, row_form, same_identity, settings_identity,
                               stored_identity, text_model_params, text_vectorizer, theta_storage, vocabulary_texts)
from streamtree.text import (DEFAULT_MAX_DF, DEFAULT_MAX_FEATURES, DEFAULT_MIN_DF, DEFAULT_TOP_WORDS,
                             DEFAULT_UNSPACED_TERMS, DEFAULT_WEIGHTING)
from streamtree.text import TextVectorizer
from streamtree.watermark import YEAR1_US, Watermark, format_duration, is_idle
from streamtree.wording import counted

logger = logging.getLogger(__name__)

UNREADABLE_FILE = "unreadable file"  # reject reason, followed by the error: "unreadable file '...'"
EXIT_ABANDONED = 130
#: share of an epoch's rows left without a vocabulary term from which the service warns that the
#: vocabulary fixed at the warm-up no longer fits the stream
EMPTY_ROWS_WARNING = 0.2
#: a word the vocabulary lacks is warned about once it is in this share of an epoch's rows, and
#: in at least UNKNOWN_TERM_DOCUMENTS of them: as common as a topic's own words are in a topic
#: holding a few percent of the stream (a new topic's words, which the fixed vocabulary cannot see)
UNKNOWN_TERM_SHARE = 0.02
UNKNOWN_TERM_DOCUMENTS = 5


@dataclass
class ServeConfig:
    """Everything ``streamtree serve`` needs.

    ``model`` holds the keyword arguments of :class:`streamtree.model.DTSSBP`; the service
    does not interpret them (the run-location ones, ``engine``, ``engine_options`` and ``n_jobs``,
    only decide where the fit runs and may change between restarts).
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
    min_df: int | float = DEFAULT_MIN_DF
    max_df: int | float = DEFAULT_MAX_DF
    max_features: int | str | None = DEFAULT_MAX_FEATURES
    weighting: str = DEFAULT_WEIGHTING
    unspaced_terms: str = DEFAULT_UNSPACED_TERMS
    time_format: str | None = None
    time_range: str = "all"
    #: seconds a row's time may lie after its file landed (clock skew, time zones) before it is a
    #: ``future time`` reject; None: no bound
    future_tolerance: float | None = 86400.0
    #: before the first epoch closes, rows more than this many epochs behind the watermark's are
    #: ``out of range`` rejects (where the stream's first epoch may lie)
    max_backlog: int = 1000
    #: with ``id_col``: published epochs whose document ids are remembered, besides the rows of
    #: open epochs, to reject a row repeating one as ``duplicate id`` (8 bytes a published id, about 100 a waiting one)
    id_window: int = 10
    format: str | None = None
    delimiter: str | None = None
    top_words: int = DEFAULT_TOP_WORDS
    batch_size: int = 8192
    model: dict = field(default_factory=dict)
    #: rows repeating an earlier row's text in their epoch: fitted once and published at their
    #: text's node (``"collapse"``), fitted (``"keep"``) or rejected (``"reject"``)
    duplicate_texts: str = DEFAULT_DUPLICATE_TEXTS

    _RUNTIME = ("landing", "store", "poll_interval", "settle", "batch_size", "idle_timeout")

    def __post_init__(self) -> None:
        # a clear error now rather than at the first file; one spelling (tsv = csv + tab) in the identity
        self.format, self.delimiter = file_format(self.format, self.delimiter)
        check_duplicate_texts(self.duplicate_texts)
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
        if self.future_tolerance is not None and self.future_tolerance < 0:
            raise ValueError("future tolerance must be >= 0 (or None for no bound)")
        if int(self.max_backlog) < 1:
            raise ValueError("max backlog must be at least 1 epoch")
        if int(self.id_window) < 1:
            raise ValueError("the id window must hold at least 1 published epoch")
        if TimeRange.parse(self.time_range).text == "auto":
            raise ValueError("a service cannot tell the bulk of a stream in advance: give --time-range all or "
                             "START..END")
        spec = EpochSpec.parse(self.epoch)
        if spec.kind == "column":
            raise ValueError("serve needs event-time epochs (e.g. 1d, month, 10y): a watermark cannot close column epochs")

    @property
    def settle_seconds(self) -> float:
        return 2 * self.poll_interval if self.settle is None else self.settle

    #: guards against bad rows, which their warnings say to raise: a restart may change them (they
    #: decide only rows still to come; a restart with the same ones publishes what one run would)
    _GUARDS = ("future_tolerance", "max_backlog", "id_window")

    def identity(self) -> dict:
        """What must match for a restart to continue a store (not where or how often it runs, nor
        the guards against bad rows)."""
        d = {k: v for k, v in asdict(self).items() if k not in self._RUNTIME + self._GUARDS}
        added = ("time_format", "time_range", "format", "delimiter", "duplicate_texts", "unspaced_terms")
        return settings_identity(d, ServeConfig, added, self.model_params(), self.epoch)

    def model_params(self) -> dict:
        """All keyword arguments of :class:`streamtree.model.DTSSBP` (as a replay would use)."""
        return text_model_params(self.model)

    def vectorizer(self) -> TextVectorizer:
        return text_vectorizer(self.model_params(), self.min_df, self.max_df, self.max_features, self.weighting,
                               self.unspaced_terms)


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
        self.waiting_files = Gauge("streamtree_files_waiting", "Landed files that cannot be read yet (permission, "
                                   "I/O error, empty, still being written), retried at every poll", registry=r)
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
        # Held while a publish updates its metrics and while a scrape reads them, so a scrape
        # sees an epoch's publish whole (never the new epoch count beside stale pending rows).
        self.lock = threading.Lock()
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

        with self.lock:
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
    """Where the service stands when it stops (totals over the store's life)."""

    files: dict = field(default_factory=dict)
    rows_read: int = 0
    documents: int = 0
    rejected: int = 0
    pending_rows: int = 0
    pending_rejects: int = 0
    epochs_published: int = 0  # by this process
    last_epoch: tuple[int, str] | None = None
    stopped_by: str = "done"
    abandoned: bool = False  # a second signal left without committing the epoch in progress
    #: files that could not be read yet (name -> why); not taken, so the next run tries them again
    waiting: dict = field(default_factory=dict)

    def format(self) -> str:
        files = ", ".join(f"{n} {s}" for s, n in sorted(self.files.items())) or "none"
        last = f"epoch {self.last_epoch[0]} ({self.last_epoch[1]})" if self.last_epoch else "no epoch yet"
        text = (f"files: {files}\nrows read: {self.rows_read}; committed: {self.documents} fitted, "
                f"{counted(self.rejected, 'reject')}; waiting in open epochs: {counted(self.pending_rows, 'row')}, "
                f"{counted(self.pending_rejects, 'reject')}\n"
                f"published now: {counted(self.epochs_published, 'epoch')}; the store is committed through {last}")
        if self.waiting:
            text += ("\nnot read yet (tried again at the next start): "
                     + "; ".join(f"{name}: {why}" for name, why in sorted(self.waiting.items())))
        return text


class _Abandon(Exception):
    """Raised by a second stop signal: leave now, commit nothing more."""


def _abandoned(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a second stop signal's :class:`_Abandon`. Raised while the Ray engine
    waits for its shards (or compiled code runs a Python callback), it comes back wrapped, as a
    SystemError whose cause it is."""
    while isinstance(exc, SystemError):
        exc = exc.__cause__
    return isinstance(exc, _Abandon)


def _iso(us: int) -> str:
    """An instant as ISO 8601 to the second (any year NumPy can write, unlike ``datetime``)."""
    return str(np.datetime_as_string(np.datetime64(us, "us"), unit="s")) + "Z"


def _outside(keys: np.ndarray, lo: int | None, hi: int | None) -> np.ndarray:
    """Which epoch keys fall outside the time range's keys ``lo..hi`` (either end open: None)."""
    out = np.zeros(keys.shape, dtype=bool)
    if lo is not None:
        out |= keys < lo
    if hi is not None:
        out |= keys > hi
    return out


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
                                   require_success=config.require_success, format=config.format,
                                   delimiter=config.delimiter)
        self.store = SnapshotStore(config.store, **theta_storage(config.model_params()))
        self.summary = ServeSummary()
        self.bound_address: tuple[str, int] | None = None
        self._stop = threading.Event()
        self._signals = 0
        self._in_epoch: Epoch | None = None
        self._heartbeat = time.time()
        self._http: ThreadingHTTPServer | None = None
        self._new_state()

    def _new_state(self) -> None:
        from streamtree.model import DTSSBP

        c = self.config
        self.bucketer = Bucketer(self.spec)
        self.watermark = Watermark(self.spec, allowed_lateness_us=int(round(c.allowed_lateness * 1e6)))
        self.model = DTSSBP(**c.model_params())
        self.vectorizer: TextVectorizer | None = None
        self.fitter: EpochFitter | None = None
        self._queue: deque[Epoch] = deque()  # closed epochs waiting to be fitted (warm-up)
        self._warmup_n = 0  # documents of the queued epochs for the warm-up vocabulary
        self._unknown_warned: set[str] = set()  # words outside the vocabulary already warned about
        self._events: list[dict] = []  # taken since the last commit
        self._seq = 0
        self._target: int | None = None  # the epoch key the watermark closes through
        self._hashes: dict[str, str] = {}  # sha256 -> name of the ingested file
        self._taken: dict[str, tuple[int, int]] = {}  # name -> (size, mtime_ns) when taken
        self._changed_warned: set[str] = set()
        self._waiting: dict[str, str] = {}  # name -> why it cannot be read yet (not taken: retried)
        # how the stream's times are read: decided once, on the first ingested file that decides
        # (as a replay decides once for its source), and committed so that a restart keeps it
        self._time_parser = TimeParser(c.time_unit, c.time_format)
        # ids taken lately (--id-col): rows waiting in open epochs and the last published epochs'
        self._ids = IdWindow(c.id_window) if c.id_col is not None else None
        self._epoch_ready_ns: dict[int, int] = {}  # epoch key -> newest ready time of its files
        # when the newest taken file landed (LandedFile.arrived_ns): the idle clock. Not its
        # mtime, which a copy may have kept from long ago (the stream would look idle at once).
        self._last_arrival_ns: int | None = None
        self._totals: dict = {"rows_read": 0, "documents": 0, "epochs": 0, "files": {}, "rejected": {}}
        self._last_commit: tuple[int, str] | None = None
        self._quiet = QuietEpochs()  # a run of quiet epochs fitted since the last commit

    # ---- start -------------------------------------------------------------------------
    def _check_apart(self) -> None:
        """The store and the landing directory must not hold one another: the service would
        read its own store's files as landed data (documents fitted twice, every manifest a
        reject), or the store's clean-up would touch landed files."""
        where = nesting(self.config.landing, self.config.store)
        if where is not None:
            raise StoreError(f"{self.config.store}: the store {where} the landing directory {self.config.landing}; "
                             "put the store outside it (the service would read its own files as landed data)")

    def _open_store(self) -> None:
        """Check the store against the config; start a new run or restore the last commit."""
        self.landing.check()
        self.store.check_writable()
        epochs = self.store.epochs()
        stored = self.store.config().get("serve")
        stored = None if stored is None else stored_identity(stored)
        identity = self.config.identity()
        if epochs and stored is None:
            raise StoreError(f"{self.config.store}: the store holds {len(epochs)} epochs that are not from "
                             "`streamtree serve` (a replay?); give the service its own --store")
        if epochs and not same_identity(stored, identity):
            raise StoreError(f"{self.config.store}: the store was served with other settings "
                             f"({identity_differences(stored, identity, ServeConfig)}); restart with the store's "
                             "settings or give another --store")
        given = None
        if self.config.vocabulary_from:
            given = SnapshotStore(self.config.vocabulary_from).vectorizer()
            if given is None:
                raise StoreError(f"{self.config.vocabulary_from}: no vocabulary in this store (--vocabulary-from)")
            want = self.config.vectorizer()
            if (given.norm, given.length_power) != (want.norm, want.length_power):
                raise StoreError(f"{self.config.vocabulary_from}: its vocabulary makes {row_form(given)}, but this "
                                 f"service's model reads {row_form(want)} (--vocabulary-from); take the vocabulary "
                                 "of a store fitted with the same --likelihood and --document-weights")
        if not epochs:  # a new run (or one that never committed: its files are ours to set aside)
            self.store.begin({"serve": identity, "streamtree": streamtree.__version__}, given)
            if given is not None:
                self._set_vocabulary(given)
            return
        vec = self.store.vectorizer()
        if vec is None:
            raise StoreError(f"{self.config.store}: published epochs but no vocabulary; the store is damaged")
        if given is not None and given.vocabulary_hash() != vec.vocabulary_hash():
            raise StoreError(f"{self.config.store}: its vocabulary differs from the one in "
                             f"{self.config.vocabulary_from}; restart with the store's own vocabulary source")
        self._restore(vec)

    def _restore(self, vec: TextVectorizer) -> None:
        """Continue from the last commit: the model checkpoint, the open epochs, the ledger."""
        from streamtree.model import DTSSBP

        t0 = time.perf_counter()
        last = self.store.last_commit()
        state = (last.get("state") or {}).get("service")
        if state is None:
            raise StoreError(f"{self.config.store}: epoch {last['epoch']} carries no service state; "
                             "give the service a new --store")
        epoch = int(last["epoch"])
        runtime = {k: v for k, v in self.config.model.items() if k in RUN_LOCATION_PARAMS}
        self.model.close()
        self.model = DTSSBP.from_checkpoint(*self.store.read_checkpoint(epoch), **runtime)
        self._set_vocabulary(vec)
        table = lambda name: self.store.read_table(epoch, name)  # noqa: E731
        self.bucketer = Bucketer.restore(self.spec, state["bucketer"], table("pending_rows"),
                                         table("pending_rejects"), table("pending_unplaced"))
        self.watermark.max_time_us = state["max_time_us"]
        self._queue = deque(_queue_from(state["queue"], table("queued_rows"), table("queued_rejects")))
        self._seq = int(state["next_seq"])
        self._target = state["target"]
        # a state written before the landing-time clock: its ready times are modification times,
        # which a copy may have kept from long ago, so the clock starts at the restart instead
        self._last_arrival_ns = state.get("last_arrival_ns") or time.time_ns()
        self._epoch_ready_ns = {int(k): int(v) for k, v in state["epoch_ready_ns"].items()}
        self._drop_closed_ready()  # stores written before this pruning carry keys of published epochs
        self._totals = state["totals"]
        # a state written before the stream's time choices were kept: the next file decides
        self._time_parser = TimeParser(self.config.time_unit, self.config.time_format).with_choices(
            state.get("time_choices") or {})
        if self._ids is not None:  # what the service running all along remembers: rebuilt from the store
            _, rows, _, _ = self.bucketer.state()
            for table in [rows] + [e.rows for e in self._queue]:
                if "id" in table.column_names:
                    self._ids.take(table.column("id").to_pylist())
            for entry in self.store.epochs()[-self.config.id_window:]:
                self._ids.publish(self.store.doc_ids(entry["epoch"]).to_pylist())
        for ev in read_ledger(self.store).to_pylist():
            if ev["kind"] == "changed":
                self._changed_warned.add(ev["name"])
            if ev["kind"] == "file":
                self._taken[ev["name"]] = (ev["size"], ev["mtime_ns"])
                if ev["status"] == "ingested":
                    self._hashes[ev["sha256"]] = ev["name"]
                    # a ledger written before partition keys counted holds the hash of a partitioned
                    # file's bytes alone: a copy landing in its partition has this digest (derived
                    # from a digest that already counts them, it matches no file)
                    keys = partition_keys(ev["name"])
                    if keys:
                        self._hashes.setdefault(partitioned_digest(ev["sha256"], keys), ev["name"])
        m, tot = self.metrics, self._totals
        m.rows_read.inc(tot["rows_read"])
        m.documents.inc(tot["documents"])
        m.epochs.inc(tot["epochs"])
        for status, n in tot["files"].items():
            m.files.labels(status).inc(n)
        for reason, n in tot["rejected"].items():
            m.rows_rejected.labels(reason).inc(n)
        m.live_nodes.set(last["n_nodes"])
        m.committed(time.time())
        self._last_commit = (epoch, last["label"])
        self._update_gauges()
        logger.info("resumed after epoch %d (%s) in %.2fs: %d files in the ledger, %d rows in open epochs",
                    epoch, last["label"], time.perf_counter() - t0, len(self._taken), self._pending_rows())
        # epochs the committed files had closed but a stop kept from being committed
        self._close(self._target)

    def _set_vocabulary(self, vec: TextVectorizer) -> None:
        self.vectorizer = vec
        self.fitter = EpochFitter(self.model, vec, self.config.duplicate_texts)
        logger.info("vocabulary: %d terms", vec.vocabulary_.shape[0])

    # ---- taking files ------------------------------------------------------------------
    def _take(self, landed: LandedFile) -> bool:
        """Read one file, apply it, and close the epochs the watermark passed. False if the file
        cannot be read now (:class:`~connectors.landing.LandingNotReady`): it is not taken, and
        a later poll tries it again."""
        c = self.config
        read, error = None, None
        try:
            read = read_landed(self.landing.fs, landed, text_col=c.text_col, time_col=c.time_col,
                               id_col=c.id_col, time_unit=c.time_unit, batch_size=c.batch_size,
                               time_format=c.time_format, delimiter=self.landing.delimiter,
                               time_parser=self._time_parser,
                               empty_is_final=self.landing.require_success or
                               time.time_ns() - landed.mtime_ns >= c.settle_seconds * 1e9)
        except LandingNotReady as exc:
            self._not_ready(landed.name, str(exc).split(": ", 1)[-1])
            return False
        except LandingError as exc:
            error = exc
        if self._waiting.pop(landed.name, None) is not None:
            self.metrics.waiting_files.set(len(self._waiting))
            logger.info("landing: %s can be read now", landed.name)
        event = {"seq": self._seq, "kind": "file", "name": landed.name, "size": landed.size,
                 "mtime_ns": landed.mtime_ns, "ready_ns": landed.ready_ns, "sha256": None, "status": None,
                 "n_read": 0, "detail": None, "close_through": None}
        self._seq += 1
        if error is not None:
            msg = str(error).split(": ", 1)[-1]
            event.update(status="unreadable", detail=msg)
            logger.warning("landing: %s is unreadable, recorded as a reject: %s (a file is read once: land the "
                           "corrected data under a new name)", landed.name, msg)
            reason = f"{UNREADABLE_FILE} '{msg}'"
            self.bucketer.add_rejects(make_rejects(source=[landed.name], position=[None], id=[None], reason=[reason]))
        else:
            dup = self._hashes.get(read.sha256)
            event.update(sha256=read.sha256, n_read=read.n_read)
            if dup is not None:
                event.update(status="duplicate", detail=dup)
                logger.warning("landing: %s has the same content as %s, already ingested: skipped", landed.name, dup)
            else:
                event.update(status="ingested")
                self._hashes[read.sha256] = landed.name
                self._adopt_time_choices(landed.name, read)
                self._ingest(landed, read)
        self._taken[landed.name] = (landed.size, landed.mtime_ns)
        self._last_arrival_ns = max(self._last_arrival_ns or 0, landed.arrived_ns)
        status = event["status"]
        self._totals["files"][status] = self._totals["files"].get(status, 0) + 1
        self.metrics.files.labels(status).inc()
        self._events.append(event)
        logger.info("took %s: %s, %d rows", landed.name, status, event["n_read"])
        self._close(self.watermark.closable_through())
        return True

    def _adopt_time_choices(self, name: str, read: LandedRead) -> None:
        """Keep the time choices an ingested file made (the first file that decides decides for
        the stream) and log them; warn when the file's times, read on their own, would have been
        read otherwise (a day-first file after an ambiguous month-first one, say)."""
        col = self.config.time_col
        for note in read.time_parser.notes[len(self._time_parser.notes):]:
            log = logger.warning if "ambiguous" in note else logger.info
            log("time column %r: %s; decided on %s for the stream (and kept on restarts)", col, note, name)
        if read.time_alone is not None:
            logger.warning("%s: time column %r: %s; pass --time-format (or --time-unit) to a new store to read "
                           "every file alike", name, col, read.time_alone)
        self._time_parser = read.time_parser

    def _not_ready(self, name: str, reason: str) -> None:
        """Leave a file that cannot be read now for a later poll, warning once per reason (not at
        every poll); nothing of it is recorded, so a restart treats it as a file not yet taken."""
        if self._waiting.get(name) != reason:
            logger.warning("landing: %s cannot be read yet, left for a later poll: %s", name, reason)
        self._waiting[name] = reason
        self.metrics.waiting_files.set(len(self._waiting))

    def _file_rejects(self, rejects: pa.Table, lo: int | None, hi: int | None, limit_us: int | None) -> None:
        """The source's rejects under their epochs, those dated outside the time range or after
        ``limit_us`` (the future bound) with the next epoch closed (their epochs are kept out,
        as the rows' are: a reject there would wait for an epoch that never closes)."""
        if (rejects.num_rows == 0 or (lo is None and hi is None and limit_us is None)
                or "time" not in rejects.column_names):
            self.bucketer.add_rejects(rejects)
            return
        times = rejects.column("time")
        known = np.asarray(times.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        keys = np.zeros(rejects.num_rows, dtype=np.int64)
        later = np.zeros(rejects.num_rows, dtype=bool)
        if known.any():
            keys[known] = self.spec.time_keys(times.filter(pa.array(known)))
            if limit_us is not None:
                later[known] = int64_values(times.filter(pa.array(known))) > limit_us
        out = known & (_outside(keys, lo, hi) | later)
        self.bucketer.add_rejects(rejects.filter(pa.array(~out)))
        self.bucketer.add_rejects(rejects.filter(pa.array(out)), place=False)

    def _reject_taken_ids(self, name: str, rows: pa.Table) -> pa.Table:
        """``rows`` without those whose id a row took before (waiting in an open epoch, or a
        document of the last ``id_window`` published epochs) or earlier in the file: rejects
        ``duplicate id``, as a replay's, the first kept. Of two rows with one id that would both
        wait in open epochs, the one kept is the first in :data:`~streamtree.epochs.ROW_ORDER`
        (file name, then position), as in a replay of the folder, whichever landed first: the
        one waiting becomes the reject if this file comes before its own (:meth:`_first_in_order`)."""
        if self._ids is None or rows.num_rows == 0:
            return rows
        ids = rows.column("id").to_pylist()
        fresh = self._ids.fresh(ids)
        if fresh.all():
            return rows
        fresh = self._first_in_order(name, rows, ids, fresh)
        if fresh.all():
            return rows
        self.bucketer.add_rejects(reject_rows(rows.filter(pa.array(~fresh)), DUPLICATE_ID))
        logger.warning("%s: %d rows repeat the id of a row taken before (waiting in an open epoch or fitted in the "
                       "last %d published epochs) and are rejects '%s'; the first is kept", name, int((~fresh).sum()),
                       self.config.id_window, DUPLICATE_ID)
        return rows.filter(pa.array(fresh))

    def _first_in_order(self, name: str, rows: pa.Table, ids: list, fresh: np.ndarray) -> np.ndarray:
        """``fresh`` with the rows of file ``name`` that repeat the id of a row waiting in an open
        epoch but come before it in ROW_ORDER marked fresh, that row taken out of its epoch as a
        ``duplicate id`` reject instead (its id given up: the row of this file takes it). Only
        where this file's row will wait in an open epoch too: a late row cannot take the place
        of one waiting, and the rows of closed epochs (queued for the warm-up, or published) stay."""
        first = np.zeros(len(ids), dtype=bool)  # the first row of each id in this file
        first[np.unique(np.asarray(ids, dtype=object), return_index=True)[1]] = True
        closed = self.bucketer.closed_through
        can = ~fresh & first & (np.ones(len(ids), dtype=bool) if closed is None else self.spec.keys(rows) > closed)
        if not can.any():
            return fresh
        position = {ids[i]: int(p) for i, p in zip(np.flatnonzero(can).tolist(),
                                                    rows.column("position").to_numpy()[can].tolist())}
        waiting = self.bucketer.waiting_with_ids(list(position))
        after = [x for x, src, pos in zip(waiting.column("id").to_pylist(), waiting.column("source").to_pylist(),
                                          waiting.column("position").to_pylist())
                 if row_key(name, position[x]) < row_key(src, pos)]
        if not after:
            return fresh
        displaced = self.bucketer.pop_ids(after)
        self._ids.release(displaced.column("id").to_pylist())
        self.bucketer.add_rejects(reject_rows(displaced, DUPLICATE_ID))
        logger.info("%s: %d rows repeat the id of a row waiting in an open epoch from a file after it in name order "
                    "(%s): those rows become the rejects '%s', as in a replay, which keeps the first in file order",
                    name, displaced.num_rows, ", ".join(sorted(set(displaced.column("source").to_pylist()))),
                    DUPLICATE_ID)
        taken = set(after)
        return fresh | (can & np.fromiter((x in taken for x in ids), dtype=bool, count=len(ids)))

    def _future_limit_us(self, landed: LandedFile) -> int | None:
        """The latest time a row of ``landed`` may hold: when the file landed plus the future
        tolerance. The file's landing time, not the clock's, so that a restart reading the file
        again decides alike."""
        tol = self.config.future_tolerance
        return None if tol is None else landed.arrived_ns // 1000 + int(round(tol * 1e6))

    def _reject_future(self, landed: LandedFile, rows: pa.Table, limit_us: int | None) -> pa.Table:
        """``rows`` without those dated after ``limit_us``, which become ``future time`` rejects
        (with the next epoch closed: their own would never close), with a warning."""
        if limit_us is None or rows.num_rows == 0:
            return rows
        times = int64_values(rows.column("time"))
        later = times > limit_us
        if not later.any():
            return rows
        self.bucketer.add_rejects(reject_rows(rows.filter(pa.array(later)), FUTURE_TIME), place=False)
        logger.warning("%s: %d rows dated after the file landed plus --future-tolerance %s (the latest %s) are "
                       "rejects '%s': a live stream cannot hold them yet; fix the writer's clock or time zone, or "
                       "raise --future-tolerance", landed.name, int(later.sum()),
                       format_duration(self.config.future_tolerance), _iso(int(times[later].max())), FUTURE_TIME)
        return rows.filter(pa.array(~later))

    def _trim_backlog(self, name: str) -> None:
        """Before the first epoch closes, reject the pending rows dated more than ``max_backlog``
        epochs behind the watermark's epoch: the first epoch closed is the earliest epoch with
        rows, and one stray old row (a time of 0, a default date) would otherwise open, and have
        fitted, every epoch since."""
        wm = self.watermark.value_us
        if self.bucketer.closed_through is not None or wm is None or wm < YEAR1_US:
            return
        bound = self.watermark.key_of(wm) - int(self.config.max_backlog)
        old = self.bucketer.pop_rows_before(bound)
        if old is None:
            return
        if self._ids is not None:
            self._ids.release(old.column("id").to_pylist())
        self.bucketer.add_rejects(reject_rows(old, OUT_OF_RANGE), place=False)
        logger.warning("after %s: %d rows dated more than --max-backlog %d epochs before the watermark's epoch %s "
                       "(the earliest %s) are rejects '%s': the stream's first epoch may lie no further back; "
                       "raise --max-backlog to keep a longer backlog", name, old.num_rows, self.config.max_backlog,
                       self.spec.label(bound + int(self.config.max_backlog)),
                       _iso(int(int64_values(old.column("time")).min())), OUT_OF_RANGE)

    def _ingest(self, landed: LandedFile, read) -> None:
        rows = read.rows
        self._totals["rows_read"] += read.n_read
        self.metrics.rows_read.inc(read.n_read)
        lo, hi = TimeRange.parse(self.config.time_range).key_range(self.spec)
        limit_us = self._future_limit_us(landed)
        self._file_rejects(read.rejects, lo, hi, limit_us)
        rows = self._reject_future(landed, rows, limit_us)
        if rows.num_rows and (lo is not None or hi is not None):
            out = _outside(self.spec.keys(rows), lo, hi)
            if np.any(out):
                # with the next epoch closed, not under their own: the range keeps those out
                self.bucketer.add_rejects(reject_rows(rows.filter(pa.array(out)), OUT_OF_RANGE), place=False)
                rows = rows.filter(pa.array(~out))
        rows = self._reject_taken_ids(landed.name, rows)
        if rows.num_rows:
            for k in np.unique(self.spec.keys(rows)).tolist():
                self._epoch_ready_ns[k] = max(self._epoch_ready_ns.get(k, 0), landed.ready_ns)
            late_before, moved_before = self.bucketer.n_late, self.bucketer.n_moved
            if self._ids is not None:  # the rows that will wait in open epochs (not those late and rejected)
                closed = self.bucketer.closed_through
                waits = rows.filter(pa.array(self.spec.keys(rows) > closed)) \
                    if closed is not None and self.config.late_policy == "reject" else rows
                self._ids.take(waits.column("id").to_pylist())
            self.bucketer.add(rows, late=self.config.late_policy)
            if self.bucketer.n_late > late_before:
                logger.info("%s: %d late rows for closed epochs rejected", landed.name, self.bucketer.n_late - late_before)
            if self.bucketer.n_moved > moved_before:
                logger.info("%s: %d late rows for closed epochs moved to the next open epoch", landed.name,
                            self.bucketer.n_moved - moved_before)
            self.watermark.observe(rows.column("time"))
            self._trim_backlog(landed.name)
        self._update_gauges()

    # ---- closing epochs ----------------------------------------------------------------
    def _close(self, through: int | None) -> None:
        """Close, fit and publish every epoch through key ``through``, one commit each."""
        if through is None:
            return
        if self._target is None or through > self._target:
            self._target = through
        for ep in self.bucketer.pop_through(through):
            # its rows in ROW_ORDER, a replay's order, whatever order the files came in
            self._queue.append(ep)
            if self.vectorizer is None and not self._warm_up():
                if self._stop.is_set():  # nothing of the warm-up is committed: a restart derives it again
                    raise _StopNow()
                continue
            while self._queue:
                self._fit(self._queue[0])
                if self._stop.is_set():  # the rest is re-derived from the commit on restart
                    raise _StopNow()

    def _warm_up(self) -> bool:
        """Fit the vocabulary once the queued closed epochs hold enough documents. The count
        grows by the epoch just queued (the queue is read whole once, to fit), so a warm-up over
        many epochs costs time linear in them."""
        added = sum(len(c) for c in vocabulary_texts([self._queue[-1]], self.config.duplicate_texts))
        self._warmup_n += added
        if self._warmup_n < self.config.warmup_docs:
            if added:  # quiet epochs, a gap in the stream, are not worth a line each
                logger.info("warm-up: %d of %d documents for the vocabulary (epoch %s closed)", self._warmup_n,
                            self.config.warmup_docs, self._queue[-1].label)
            return False
        texts = vocabulary_texts(self._queue, self.config.duplicate_texts)  # the rows that will be fitted
        n = sum(len(c) for c in texts)
        vec = self.config.vectorizer()
        vec.fit(pa.chunked_array(texts, pa.string()))
        logger.info("vocabulary fitted on %d documents of %d warm-up epochs", n, len(self._queue))
        self.store.write_vocabulary(vec)
        self._set_vocabulary(vec)
        return True

    def _warn_vocabulary(self, ep: Epoch, n_empty: int) -> None:
        """Warn when the vocabulary no longer fits the stream: it was fixed on the warm-up
        epochs (or another store), so words that come later are invisible to the model. Two
        signs: many of an epoch's rows hold no term of it (they become the reject ``empty after
        vocabulary filtering``), or words it lacks have become common (a new topic's; its
        documents are then fitted on their other words only). Each such word is named once."""
        refresh = ("serve a new store with a larger --warmup-docs, or with --vocabulary-from a replay of recent "
                   "data")
        if ep.n_rows and n_empty >= EMPTY_ROWS_WARNING * ep.n_rows:
            logger.warning("epoch %s: %d of %d rows (%.0f%%) hold no term of the store's vocabulary and are "
                           "rejects (%s); if the stream's words have moved on since the warm-up, %s",
                           ep.label, n_empty, ep.n_rows, 100 * n_empty / ep.n_rows, EMPTY_AFTER_VOCABULARY,
                           refresh)
        if not ep.n_rows:
            return
        new = [(t, c) for t, c in self.vectorizer.unknown_terms(ep.rows.column("text"), UNKNOWN_TERM_SHARE,
                                                                 UNKNOWN_TERM_DOCUMENTS)
               if t not in self._unknown_warned]
        if new:
            self._unknown_warned.update(t for t, _ in new)
            shown = ", ".join(f"{t} ({c})" for t, c in new[:8]) + (", ..." if len(new) > 8 else "")
            logger.warning("epoch %s: %s common in its %d rows %s not in the store's vocabulary (rows holding "
                           "each): %s; the model cannot see them (a new topic's?): to follow them, %s",
                           ep.label, counted(len(new), "word"), ep.n_rows, "is" if len(new) == 1 else "are", shown,
                           refresh)

    def _fit(self, ep: Epoch) -> None:
        """Fit the first queued epoch and commit it (the queue still holds it while fitting)."""
        self._in_epoch = ep
        t0 = time.perf_counter()
        empty_before = self.fitter.n_empty
        fitted = self.fitter.fit(ep)
        self._heartbeat = time.time()
        self._warn_vocabulary(ep, self.fitter.n_empty - empty_before)
        repeated = self.fitter.last_repeated
        if (fitted is not None and self.config.duplicate_texts == "keep" and repeated
                and repeated >= REPEATED_TEXTS_WARNING * fitted.n_documents):
            logger.warning("epoch %s: %s", ep.label, repeated_texts_note(repeated, fitted.n_documents, "keep"))
        self._queue.popleft()
        if self._ids is not None:  # its rows wait no longer; its documents join the window once published
            self._ids.release(ep.rows.column("id").to_pylist())
        if fitted is None:  # no document yet: its rejects go with the next epoch
            self._in_epoch = None
            return
        fit_s = time.perf_counter() - t0
        if fitted.n_documents == 0 and fitted.rejects.num_rows == 0:
            # A quiet epoch (a gap in the stream) is not written as a folder: it is recorded with
            # the next published epoch, as a replay does. Until then nothing is committed, and a
            # restart derives it again from the last commit.
            trees = self.model.trees_
            self._quiet.add(ep, fitted.tree, trees[-2] if len(trees) > 1 else None)
            del self.model.trees_[:-1]
            self._in_epoch = None
            return
        self._totals["documents"] += fitted.n_documents
        self._totals["epochs"] += 1
        kinds = Counter(_reason_kind(r) for r in fitted.rejects.column("reason").to_pylist())
        for reason, n in kinds.items():
            self._totals["rejected"][reason] = self._totals["rejected"].get(reason, 0) + n
        self._commit(fitted, fit_s)
        if self._ids is not None:
            self._ids.publish(fitted.epoch.rows.column("id").to_pylist())
        del self.model.trees_[:-1]  # the store keeps the history; memory stays flat
        self._in_epoch = None
        with self.metrics.lock:
            self._update_gauges()
            self.metrics.live_nodes.set(fitted.tree.n_nodes)
            self.metrics.documents.inc(fitted.n_documents)
            for reason, n in kinds.items():
                self.metrics.rows_rejected.labels(reason).inc(n)
            self.metrics.epochs.inc()

    def _commit(self, fitted, fit_s: float) -> None:
        """Publish the epoch with everything a restart needs (one atomic commit)."""
        ep = fitted.epoch
        t0 = time.perf_counter()
        ready = self._epoch_ready_ns.get(ep.key)
        self._drop_closed_ready()  # this epoch's key included: the state must not outlive its epoch
        scalars, rows, rejects, unplaced = self.bucketer.state()
        q_rows, q_rejects = _queue_tables(self._queue, rows.schema.remove(rows.schema.get_field_index("key"))
                                          if rows.num_columns > 1 else None)
        state = {"service": {
            "epoch": ep.index, "next_seq": self._seq, "target": self._target, "max_time_us": self.watermark.max_time_us,
            "bucketer": scalars, "queue": [{"index": e.index, "key": e.key, "label": e.label} for e in self._queue],
            "last_arrival_ns": self._last_arrival_ns, "time_choices": self._time_parser.choices,
            "epoch_ready_ns": {str(k): v for k, v in self._epoch_ready_ns.items()},
            "totals": self._totals}}
        tables = {LEDGER_TABLE: ledger_table(self._events), "pending_rows": rows, "pending_rejects": rejects,
                  "pending_unplaced": unplaced, "queued_rows": q_rows, "queued_rejects": q_rejects}
        fitted = self._quiet.fold(fitted)
        fitted.publish(self.store, n_top_words=self.config.top_words, checkpoint=self.model.get_checkpoint(),
                       state=state, tables=tables, empty_before=self._quiet.take())
        self._events = []
        self._last_commit = (ep.index, ep.label)
        now = time.time()
        commit_s = time.perf_counter() - t0
        self.metrics.commit_seconds.observe(commit_s)
        self.metrics.fit_seconds.observe(fit_s)
        self.metrics.committed(now)
        if ready:
            self.metrics.latency.observe(max(0.0, now - ready / 1e9))
        self.summary.epochs_published += 1
        logger.info("published epoch %d (%s): %d documents, %d rejects, %d live nodes; fit %.2fs, commit %.2fs",
                    ep.index, ep.label, fitted.n_documents, fitted.rejects.num_rows, fitted.tree.n_nodes,
                    fit_s, commit_s)

    def _drop_closed_ready(self) -> None:
        """Forget the ready times of epochs that are closed and no longer queued: they were
        published (or their rows became rejects, or a late row named them), so no commit needs
        them, and keeping them would carry one more key into every later commit's state."""
        closed = self.bucketer.closed_through
        if closed is None:
            return
        queued = {e.key for e in self._queue}
        self._epoch_ready_ns = {k: v for k, v in self._epoch_ready_ns.items() if k > closed or k in queued}

    def _pending_rows(self) -> int:
        _, rows, _, _ = self.bucketer.state()
        return rows.num_rows + sum(e.n_rows for e in self._queue)

    def _update_gauges(self) -> None:
        self.metrics.pending_rows.set(self._pending_rows())
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
                "last_epoch": None if self._last_commit is None else self._last_commit[1],
                "seconds_since_heartbeat": round(time.time() - self._heartbeat, 3)}

    def poll_once(self, now: float | None = None) -> int:
        """One poll: take every ready file, then close epochs if the stream is idle. Returns files taken.

        ``now`` (wall-clock seconds, default the current time) decides which files have settled
        and how long the stream has been idle: since the newest taken file landed
        (:attr:`~connectors.landing.LandedFile.arrived_ns`).
        """
        now = time.time() if now is None else now
        files = self.landing.poll(skip=self._taken, now=now)
        self._warn_changed()
        for name in [n for n in self._waiting if self.landing.state_of(n) is None]:
            logger.info("landing: %s, which could not be read, is gone from the landing folder", name)
            del self._waiting[name]
            self.metrics.waiting_files.set(len(self._waiting))
        taken = 0
        for f in files:
            taken += self._take(f)
            self._heartbeat = time.time()
            if self._stop.is_set():
                raise _StopNow()
        last = None if self._last_arrival_ns is None else self._last_arrival_ns / 1e9
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
        return taken

    def _warn_changed(self) -> None:
        """A file taken before has changed (rewritten, or re-landed under its name): each file is
        read once, so the change is not read; it is logged and recorded in the ledger (kind
        ``"changed"``), once per name, so the store shows what was not read."""
        for name, state in self._taken.items():
            now_state = self.landing.state_of(name)
            if now_state is not None and now_state != state and name not in self._changed_warned:
                self._changed_warned.add(name)
                logger.warning("landing: %s changed after it was taken; the change is not read (land new data "
                               "as a new file)", name)
                self._events.append({"seq": self._seq, "kind": "changed", "name": name, "size": int(now_state[0]),
                                     "mtime_ns": int(now_state[1]), "ready_ns": None, "sha256": None,
                                     "status": "not read", "n_read": None, "close_through": None,
                                     "detail": f"changed after it was taken (size {state[0]}, mtime_ns {state[1]}); "
                                               "land new data as a new file"})
                self._seq += 1

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
            self._check_apart()  # before the lease, which creates the store directory
            self._start_http()
            with self.store.writer("serve"):
                try:
                    self._open_store()
                    logger.info("serving %s -> %s (epochs %s, allowed lateness %gs, late rows: %s)%s",
                                self.config.landing, self.config.store, self.config.epoch,
                                self.config.allowed_lateness, self.config.late_policy, " once" if once else "")
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
                except Exception as exc:
                    if not _abandoned(exc):
                        raise
                    self.summary.abandoned = True
            return self._finish()
        finally:
            self.model.close()
            if self._http is not None:
                self._http.shutdown()
                self._http.server_close()
            for sig, handler in old.items():
                signal.signal(sig, handler)

    def _finish(self) -> ServeSummary:
        s, tot = self.summary, self._totals
        s.files = dict(tot["files"])
        s.rows_read, s.documents = tot["rows_read"], tot["documents"]
        s.rejected = sum(tot["rejected"].values())
        _, rows, rejects, unplaced = self.bucketer.state()
        s.pending_rows = rows.num_rows + sum(e.n_rows for e in self._queue)
        s.pending_rejects = rejects.num_rows + unplaced.num_rows + sum(e.rejects.num_rows for e in self._queue)
        s.last_epoch = self._last_commit
        s.waiting = dict(self._waiting)
        if not s.abandoned:
            n = sum(1 for e in self._events if e["kind"] == "file")
            logger.info("stopped (%s): %s; %d rows wait in open epochs; %s taken since the last commit "
                        "are taken again on restart%s", s.stopped_by, self._where(), s.pending_rows,
                        counted(n, "file"),
                        f"; {counted(len(self._waiting), 'file')} could not be read yet" if self._waiting else "")
        return s

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
        last = self._last_commit
        return "the store is committed through " + (f"epoch {last[0]} ({last[1]})" if last else "no epoch")

    def _start_http(self) -> None:
        if self.metrics_addr is None:
            return
        handler = type("Handler", (_Handler,), {"service": self})
        try:
            self._http = ThreadingHTTPServer(self.metrics_addr, handler)
        except OSError as exc:
            raise MetricsAddressError(*self.metrics_addr, _listen_reason(exc)) from None
        self._http.daemon_threads = True
        threading.Thread(target=self._http.serve_forever, name="metrics", daemon=True).start()
        host, port = self._http.server_address[:2]
        self.bound_address = (host, port)
        logger.info("metrics on http://%s:%d/metrics, health on /healthz", host, port)


class MetricsAddressError(Exception):
    """The service cannot serve ``/metrics`` and ``/healthz`` at its metrics address (in use,
    not an address of this host, no permission): nothing was read or written.

    Attributes
    ----------
    host, port, reason : str, int, str
    """

    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(f"cannot listen on {host}:{port} for /metrics and /healthz: {reason}; choose another "
                         "metrics address, or none")
        self.host, self.port, self.reason = host, port, reason


def _listen_reason(exc: OSError) -> str:
    """Why a server socket cannot be bound, in words."""
    if exc.errno == errno.EADDRINUSE:
        return "the port is in use (another service, or another streamtree serve)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "not an address of this host"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied (ports below 1024 need privileges)"
    return exc.strerror or str(exc)


class _StopNow(Exception):
    """A stop was requested: leave the loop after the step just finished."""


def _queue_tables(queue, schema: pa.Schema | None) -> tuple[pa.Table, pa.Table]:
    """Rows and rejects of closed, not yet fitted epochs, with their place in the queue (``qpos``)."""
    rows = [e.rows.append_column("qpos", pa.array([i] * e.n_rows, pa.int64())) for i, e in enumerate(queue) if e.n_rows]
    rejects = [e.rejects.select(REJECT_SCHEMA.names).append_column("qpos", pa.array([i] * e.rejects.num_rows, pa.int64()))
               for i, e in enumerate(queue) if e.rejects.num_rows]
    qpos = pa.field("qpos", pa.int64())
    empty_rows = (schema or pa.schema([])).append(qpos).empty_table()
    return (pa.concat_tables(rows) if rows else empty_rows,
            pa.concat_tables(rejects) if rejects else REJECT_SCHEMA.append(qpos).empty_table())


def _queue_from(entries: list[dict], rows: pa.Table, rejects: pa.Table) -> list[Epoch]:
    import pyarrow.compute as pc

    out = []
    for i, e in enumerate(entries):
        r = rows.filter(pc.equal(rows.column("qpos"), i)).drop_columns(["qpos"]) if rows.num_rows else None
        j = rejects.filter(pc.equal(rejects.column("qpos"), i)).drop_columns(["qpos"])
        if r is None:
            r = rows.drop_columns(["qpos"]).slice(0, 0)
        out.append(Epoch(int(e["index"]), int(e["key"]), e["label"], r, j.cast(REJECT_SCHEMA)))
    return out


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


__all__ = ["EXIT_ABANDONED", "JsonFormatter", "MetricsAddressError", "ServeConfig", "ServeSummary", "Service",
           "ServiceMetrics", "configure_logging", "parse_address"]
