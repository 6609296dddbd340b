"""Replay a document source through the dTSSBP into a snapshot store, epoch by epoch.

Pipeline: source (bounded-size record batches, rejects logged) -> bucketing into epochs ->
one vocabulary fitted over the whole corpus -> per epoch: vectorise, move rows that are
empty after vocabulary filtering to the epoch's rejects, ``DTSSBP.partial_fit``, publish
(tree, document ids, top words, rejects) -> summary.

Every input record ends up either assigned to a node of some epoch's tree or in a rejects
table of the store, with its reason. Each publish is atomic, so an interrupted replay leaves
the store readable at the last published epoch; ``mode="resume"`` finishes it (the model is
re-run from the first epoch with the same seed, which reproduces the published trees bit for
bit, and only the missing epochs are published).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import scipy.sparse as sp

import streamtree
from connectors.sources import open_source
from connectors.stores.snapshot import SnapshotStore, StoreError
from streamtree.epochs import Epoch, EpochSpec, bucket
from streamtree.records import EMPTY_AFTER_VOCABULARY, RejectLog
from streamtree.snapshots import StaticOptions, static_snapshot
from streamtree.text import TextVectorizer

logger = logging.getLogger(__name__)

MODES = ("refuse", "resume", "overwrite")


#: the seed of a replay unless one is given: a replay is reproducible (and resumable) by default
REPLAY_SEED = 0


@dataclass
class ReplayConfig:
    """Everything that determines the content of a replayed store.

    The source columns and the epoch spec, the vocabulary settings and the model's parameters
    (``model``: keyword arguments of :class:`streamtree.model.DTSSBP`; whatever is not given
    takes the estimator's default, and ``random_state`` defaults to :data:`REPLAY_SEED`).
    :meth:`identity` goes into the store's manifest so that a resume can check it.
    """

    source: str
    text_col: str
    time_col: str | None
    id_col: str | None = None
    epoch_col: str | None = None
    epoch: str = "10y"
    time_unit: str = "auto"
    min_df: int | float = 2
    max_df: int | float = 0.5
    max_features: int | None = None
    top_words: int = 10
    batch_size: int = 8192
    model: dict = field(default_factory=dict)

    def model_params(self) -> dict:
        """All keyword arguments of :class:`streamtree.model.DTSSBP` for this replay."""
        from streamtree.likelihoods import LIKELIHOODS, TEXT_LIKELIHOODS
        from streamtree.model import DTSSBP

        params = DTSSBP(**{"random_state": REPLAY_SEED, **self.model}).get_params(deep=False)
        if params["likelihood"] in LIKELIHOODS and params["likelihood"] not in TEXT_LIKELIHOODS:
            raise ValueError(f"likelihood {params['likelihood']!r} does not model text; choose one of "
                             f"{', '.join(TEXT_LIKELIHOODS)}")
        return params

    def estimator(self):
        """A validated, unfitted :class:`streamtree.model.DTSSBP` for this replay."""
        from streamtree.model import DTSSBP

        model = DTSSBP(**self.model_params())
        model._check_params()
        return model

    @property
    def seed(self):
        return self.model_params()["random_state"]

    @property
    def engine(self):
        return self.model_params()["engine"]

    def vectorizer(self) -> TextVectorizer:
        from streamtree.likelihoods import LIKELIHOODS

        norm = LIKELIHOODS[self.model_params()["likelihood"]].text_norm
        return TextVectorizer(min_df=self.min_df, max_df=self.max_df, max_features=self.max_features, norm=norm)

    def identity(self) -> dict:
        """The settings that must match for a resume (where the model runs does not change results)."""
        from streamtree.model import RUN_LOCATION_PARAMS

        d = asdict(self)
        d.pop("batch_size")
        d["model"] = {k: v for k, v in self.model_params().items() if k not in RUN_LOCATION_PARAMS}
        return d


@dataclass
class EpochProgress:
    """What the progress callback receives after each published epoch."""

    index: int
    n_epochs: int
    label: str
    n_documents: int
    n_rejects: int
    n_nodes: int
    seconds: float
    skipped: bool = False  # already published (resume): fitted again but not republished


@dataclass
class ReplaySummary:
    n_epochs: int
    n_published: int
    n_documents: int
    n_records: int
    rejects: dict[str, int] = field(default_factory=dict)
    n_empty_after_filter: int = 0
    vocabulary_size: int = 0
    seconds: float = 0.0
    fit_seconds: float = 0.0

    @property
    def n_rejects(self) -> int:
        return sum(self.rejects.values())

    def format(self) -> str:
        lines = [f"epochs: {self.n_epochs} ({self.n_published} published now)",
                 f"documents: {self.n_documents} fitted of {self.n_records} records read",
                 f"vocabulary: {self.vocabulary_size} terms",
                 f"rejects: {self.n_rejects}"]
        for reason, n in sorted(self.rejects.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {reason}: {n}")
        lines.append(f"empty after vocabulary filtering: {self.n_empty_after_filter}")
        rate = self.n_documents / self.fit_seconds if self.fit_seconds > 0 else float("nan")
        lines.append(f"time: {self.seconds:.1f}s ({self.fit_seconds:.1f}s fitting, {rate:.0f} documents/s)")
        return "\n".join(lines)


def read_epochs(config: ReplayConfig) -> tuple[list[Epoch], int]:
    """Read and bucket the whole source; returns the epochs and the number of records read.

    Raises SourceError for unreadable sources and ValueError for a bad epoch spec.
    """
    spec = EpochSpec.parse(config.epoch)
    if spec.kind == "column" and config.epoch_col is None:
        raise ValueError("--epoch column needs --epoch-col")
    src = open_source(config.source, config.text_col, config.time_col, config.id_col, config.epoch_col,
                      batch_size=config.batch_size, time_unit=config.time_unit)
    epochs = list(bucket(src, spec))
    return epochs, src.n_read


def fit_vocabulary(config: ReplayConfig, epochs: list[Epoch]) -> TextVectorizer:
    """One vocabulary over the whole corpus, so every epoch's theta has the same columns."""
    texts = [c for e in epochs for c in e.rows.column("text").chunks]
    if not texts:
        raise ValueError(f"{config.source}: no usable documents (every record was rejected)")
    vec = config.vectorizer()
    vec.fit(pa.chunked_array(texts, pa.string()))
    return vec


def _check_store(store: SnapshotStore, config: ReplayConfig, mode: str) -> tuple[set[int], bool]:
    """Check the store against ``config``: the epochs already published (to skip on a
    resume) and whether its content must be deleted (overwrite) before writing."""
    manifest = store.manifest()
    done = {int(e["epoch"]) for e in manifest["epochs"]}
    if not done and manifest.get("vocabulary") is None:
        return set(), False
    if mode == "overwrite" or not done:
        return set(), True
    same = manifest.get("config", {}).get("replay") == _json(config.identity())
    if mode == "resume" and same:
        return done, False
    if mode == "resume":
        raise StoreError(f"{store.uri}: the store holds {len(done)} epochs of a replay with a different "
                         "configuration; cannot resume it: use --overwrite or another --store")
    what = "the same" if same else "a different"
    hint = "--resume to finish it, " if same else ""
    raise StoreError(f"{store.uri}: the store already holds {len(done)} published epochs of {what} "
                     f"configuration; pass {hint}--overwrite to replace them, or choose another --store")


def _json(value):
    import json

    return json.loads(json.dumps(value))


def replay(
    config: ReplayConfig,
    store_uri: str,
    *,
    mode: str = "refuse",
    progress: Callable[[EpochProgress], None] | None = None,
    epochs: list[Epoch] | None = None,
    n_records: int | None = None,
    static: StaticOptions | None = None,
) -> ReplaySummary:
    """Replay ``config.source`` into the store at ``store_uri``.

    Parameters
    ----------
    config : ReplayConfig
    store_uri : str
        Snapshot store location (created if needed).
    mode : {"refuse", "resume", "overwrite"}
        What to do when the store already has published epochs: refuse (StoreError),
        resume a replay of the same configuration, or delete the store's content first.
    progress : callable, optional
        Called with an :class:`EpochProgress` after each epoch.
    epochs, n_records : optional
        Pre-read epochs (from :func:`read_epochs`), to skip reading the source again.
    static : StaticOptions, optional
        Also fit a static hierarchy (see :mod:`streamtree.snapshots`) of each newly published
        epoch and store it as ``static/<method>.parquet``. It is written after the epoch's
        publish and becomes visible with the next manifest commit, so a reader may see an
        epoch before its static snapshot and must treat a missing one as "not yet".

    Returns
    -------
    ReplaySummary
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    start = time.perf_counter()
    store = SnapshotStore(store_uri)
    done, wipe = _check_store(store, config, mode)
    if epochs is None:
        epochs, n_records = read_epochs(config)
    vec = fit_vocabulary(config, epochs)
    if wipe:  # only now that the source has been read successfully
        store.fs.delete_dir_contents(store.root, missing_dir_ok=True)
    if done:
        stored = store.vectorizer()
        if stored is None or stored.vocabulary_hash() != vec.vocabulary_hash():
            raise StoreError(f"{store.uri}: the stored vocabulary differs from the one refitted on the source "
                             "(did the source change?); use --overwrite")
    else:
        engine = config.engine
        store.set_config({"replay": config.identity(), "engine": engine if isinstance(engine, str) else repr(engine),
                          "streamtree": streamtree.__version__})
        store.write_vocabulary(vec)
    model = config.estimator()
    try:
        log = RejectLog()
        n_docs = n_empty = n_published = 0
        fit_seconds = 0.0
        carried: list[pa.Table] = []  # rejects of leading epochs with no documents to fit
        p = vec.vocabulary_.shape[0]
        for ep in epochs:
            t0 = time.perf_counter()
            if ep.n_rows:
                X = vec.transform(ep.rows.column("text"))
                empty = vec.empty_rows(X)
                n_empty += int(empty.sum())
                ep = ep.reject(empty, EMPTY_AFTER_VOCABULARY)
                X = X[~empty]
            else:
                X = sp.csr_matrix((0, p))
            rejects = pa.concat_tables(carried + [ep.rejects]) if carried else ep.rejects
            if X.shape[0] == 0 and not hasattr(model, "trees_"):
                carried = [rejects]  # the model needs documents in its first epoch
                continue
            carried = []
            tree = model.partial_fit(X, epoch=ep.index, label=ep.label).trees_[-1]
            fit_seconds += time.perf_counter() - t0
            n_docs += X.shape[0]
            log.add(rejects)
            skipped = ep.index in done
            if not skipped:
                store.publish(tree, ep.rows.column("id").to_pylist(), n_top_words=config.top_words,
                              rejects=rejects, key=ep.key, label=ep.label, events=tree.events,
                              checkpoint={"last_epoch": ep.index, "documents": n_docs})
                n_published += 1
                if static is not None:
                    _write_static(store, static, ep, tree, X, config.seed)
            if progress is not None:
                progress(EpochProgress(ep.index, len(epochs), ep.label, X.shape[0], rejects.num_rows,
                                       tree.n_nodes, time.perf_counter() - t0, skipped))
    finally:
        model.close()  # release engine resources (Ray actors)
    if carried:  # no epoch had a document left
        raise ValueError(f"{config.source}: no document is left after vocabulary filtering "
                         f"({n_empty} empty rows); lower --min-df or raise --max-features")
    return ReplaySummary(
        n_epochs=len(model.trees_), n_published=n_published, n_documents=n_docs,
        n_records=int(n_records if n_records is not None else n_docs + log.total),
        rejects=dict(log.counts), n_empty_after_filter=n_empty, vocabulary_size=p,
        seconds=time.perf_counter() - start, fit_seconds=fit_seconds,
    )


def _write_static(store: SnapshotStore, opts: StaticOptions, ep: Epoch, tree, X, seed: int) -> None:
    """Fit and store the static snapshot of a just-published epoch (seeded per epoch)."""
    t0 = time.perf_counter()
    rng = np.random.default_rng([seed, ep.index])
    try:
        if opts.over == "nodes":
            res = static_snapshot(opts.method, node_theta=tree.theta, ids=tree.node_ids.tolist(),
                                  max_points=opts.max_points, rng=rng)
        else:
            res = static_snapshot(opts.method, X, ids=ep.rows.column("id").to_pylist(), labels=tree.assignments,
                                  max_points=opts.max_points, rng=rng)
    except ValueError as exc:  # e.g. an epoch with a single document or node
        logger.warning("epoch %s: no static %s snapshot: %s", ep.label, opts.method, exc)
        return
    store.write_static(ep.index, opts.method, res.dendrogram, res.stats, leaf_ids=res.leaf_ids)
    logger.info("epoch %s: static %s snapshot over %d %s in %.2fs", ep.label, opts.method,
                res.stats["n_points"], opts.over, time.perf_counter() - t0)


def stderr_progress(stream=None) -> Callable[[EpochProgress], None]:
    """A progress callback printing one line per epoch (rewritten in place on a terminal)."""
    stream = stream or sys.stderr
    tty = getattr(stream, "isatty", lambda: False)()

    def show(p: EpochProgress) -> None:
        rate = p.n_documents / p.seconds if p.seconds > 0 else 0.0
        tag = " (already published)" if p.skipped else ""
        line = (f"[{p.index + 1}/{p.n_epochs}] {p.label}: {p.n_documents} docs, {rate:.0f} docs/s, "
                f"{p.n_nodes} live nodes, {p.n_rejects} rejects{tag}")
        stream.write(("\r\x1b[K" + line) if tty else line + "\n")
        if tty and p.index + 1 >= p.n_epochs:
            stream.write("\n")
        stream.flush()

    return show


__all__ = ["MODES", "REPLAY_SEED", "EpochProgress", "ReplayConfig", "ReplaySummary", "fit_vocabulary", "read_epochs",
           "replay", "stderr_progress"]
