"""Replay a document source through the dTSSBP into a snapshot store, epoch by epoch.

Pipeline: check that the store can be written, take its writer lease -> read the source
once, bucketing rows into epochs (bounded memory, see :class:`~streamtree.epochs.EpochReader`;
duplicate ids and times far outside the bulk rejected) -> one vocabulary fitted over the
corpus -> per epoch: vectorise, move rows that are empty after vocabulary filtering to the
epoch's rejects, ``DTSSBP.partial_fit``, publish (tree, document ids, top words, rejects and
the model checkpoint, in one atomic commit) -> summary.

Every input record ends up either assigned to a node of some epoch's tree or in a rejects
table of the store, with its reason; a file of the source whose content an earlier file (in
name order) holds is skipped, as a service skips such a re-delivery
(:func:`connectors.sources.files.content_digest`), and logged and named in the summary and the
store. Epochs with no documents and no rejects are fitted (the stick window moves on) but not
written as folders: the next published epoch records the run (``empty_before``). Each publish
is atomic, so an interrupted replay leaves the store readable at the last published epoch;
``mode="resume"`` continues from the model checkpoint committed with that epoch, without
refitting anything before it, and gives a store identical to an uninterrupted run. Resuming a
complete store returns at once.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pyarrow as pa
import scipy.sparse as sp

import streamtree
from connectors.sources import open_source
from connectors.sources.files import canonical_uri, exists, nesting
from connectors.stores.snapshot import (THETA_STORAGE, CheckpointNotKeptError, CorruptStoreError, SnapshotStore,
                                       StoreAccessError, StoreError)
from streamtree.epochs import Epoch, EpochReader, EpochSpec, TimeRange
from streamtree.events import epoch_events
from streamtree.likelihoods.vmf import reads_document_weights
from streamtree.model import DTSSBP, RUN_LOCATION_PARAMS
from streamtree.records import (DEFAULT_DUPLICATE_TEXTS, DUPLICATE_TEXT, DUPLICATE_TEXTS,
                                DUPLICATE_TEXTS_BEFORE_COLLAPSE, EMPTY_AFTER_VOCABULARY, RejectLog)
from streamtree.snapshots import StaticOptions, document_directions, snapshot_name, static_snapshot
from streamtree.text import (DEFAULT_MAX_DF, DEFAULT_MAX_FEATURES, DEFAULT_MIN_DF, DEFAULT_TOP_WORDS,
                             DEFAULT_LENGTH_POWER, DEFAULT_UNSPACED_TERMS, DEFAULT_WEIGHTING, WEIGHTING_BEFORE_TFIDF,
                             TextVectorizer)
from streamtree.wording import counted

logger = logging.getLogger(__name__)

MODES = ("refuse", "resume", "overwrite")
#: ReplayConfig fields that say where and how fast a replay runs, not what it computes.
RUN_LOCATION = ("engine", "batch_size")


#: share of the documents repeating an earlier document's text in their epoch from which a
#: replay's summary and an evaluation advise --duplicate-texts collapse and a service warns (under "keep")
REPEATED_TEXTS_WARNING = 0.1

#: the seed of a replay unless one is given: a replay is reproducible (and resumable) by default
REPLAY_SEED = 0


def text_model_params(model: dict) -> dict:
    """All keyword arguments of :class:`streamtree.model.DTSSBP` for fitting text: ``model``
    over the estimator's defaults, seeded with :data:`REPLAY_SEED` unless it sets one (replay
    and serve share this, so both fit the same model from the same settings)."""
    from streamtree.likelihoods import LIKELIHOODS, TEXT_LIKELIHOODS
    from streamtree.model import DTSSBP

    params = DTSSBP(**{"random_state": REPLAY_SEED, **model}).get_params(deep=False)
    name = params["likelihood"]
    if name not in TEXT_LIKELIHOODS:  # checked here: the store's settings read it before any fit
        what = f"likelihood {name!r} does not model text" if name in LIKELIHOODS else f"unknown likelihood {name!r}"
        raise ValueError(f"{what}; choose one of {', '.join(TEXT_LIKELIHOODS)}")
    return params


def text_vectorizer(model_params: dict, min_df, max_df, max_features, weighting=DEFAULT_WEIGHTING,
                    unspaced_terms=DEFAULT_UNSPACED_TERMS) -> TextVectorizer:
    """The unfitted vectoriser for a model of :func:`text_model_params` whose rows suit the
    model's likelihood (its ``text_norm``), with documents weighted by length where the model
    reads row norms as weights (``document_weights``, by default;
    :data:`~streamtree.text.DEFAULT_LENGTH_POWER`), unit rows where it requires them; Chinese
    and Japanese as ``unspaced_terms`` says (:class:`~streamtree.text.TextVectorizer`)."""
    from streamtree.likelihoods import LIKELIHOODS

    family = LIKELIHOODS[model_params["likelihood"]]
    weighted = "document_weights" in family.params and reads_document_weights(model_params["document_weights"])
    power = DEFAULT_LENGTH_POWER if weighted else 0.0  # 0: unit rows
    return TextVectorizer(min_df=min_df, max_df=max_df, max_features=max_features, norm=family.text_norm,
                          weighting=weighting, length_power=power, unspaced_terms=unspaced_terms)


def row_form(vec: TextVectorizer) -> str:
    """What rows a vectoriser makes, in words (raw counts, unit rows or length-weighted rows)."""
    if vec.norm is None:
        return "raw counts"
    return f"rows of norm (tokens / median) ** {vec.length_power:g}" if vec.length_power else "unit rows"


def record_week_origin(identity: dict, epoch: str) -> None:
    """Add ``week_origin`` to a store's identity for week epochs (they start on Mondays now;
    stores written with Thursday weeks recorded nothing, so resuming them is refused rather
    than moving the boundaries). Other epochs record nothing, so their stores still match."""
    try:
        spec = EpochSpec.parse(epoch)
    except (TypeError, ValueError):
        return  # an invalid spec is reported where the epochs are read
    if spec.iso_weeks:
        identity["week_origin"] = "monday"


def drop_unset_weighting(identity: dict, model_params: dict) -> None:
    """Remove ``identity["weighting"]`` where it says nothing a store written before it was
    recorded did not: for row forms that ignore it (raw counts), and for the weighting those
    stores had (not the current default, which has changed since; comparing with it would take
    an older store's plain frequencies for tf-idf and refuse an explicit tf-idf store)."""
    from streamtree.likelihoods import LIKELIHOODS

    if (LIKELIHOODS[model_params["likelihood"]].text_norm is None
            or identity.get("weighting") == WEIGHTING_BEFORE_TFIDF):
        identity.pop("weighting", None)


def theta_storage(model_params: dict) -> dict:
    """How the store keeps node parameters (``SnapshotStore`` keyword arguments), as the
    likelihood's :attr:`~streamtree.likelihoods.base.Likelihood.param_storage` says: directions
    to cosine :data:`~connectors.stores.snapshot.THETA_COSINE`, word distributions as log
    probabilities to :data:`~connectors.stores.snapshot.THETA_LOG_STEP`, anything else exactly."""
    from streamtree.likelihoods import LIKELIHOODS

    return dict(THETA_STORAGE[LIKELIHOODS[model_params["likelihood"]].param_storage])


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
    time_format: str | None = None
    time_range: str = "auto"
    format: str | None = None
    delimiter: str | None = None
    min_df: int | float = DEFAULT_MIN_DF
    max_df: int | float = DEFAULT_MAX_DF
    max_features: int | str | None = DEFAULT_MAX_FEATURES
    weighting: str = DEFAULT_WEIGHTING
    #: Chinese and Japanese runs as character pairs or whole (``TextVectorizer(unspaced_terms)``)
    unspaced_terms: str = DEFAULT_UNSPACED_TERMS
    top_words: int = DEFAULT_TOP_WORDS
    batch_size: int = 8192
    model: dict = field(default_factory=dict)
    #: rows repeating an earlier row's text in their epoch: fitted (``"keep"``) or rejected
    duplicate_texts: str = DEFAULT_DUPLICATE_TEXTS

    def __post_init__(self) -> None:
        check_duplicate_texts(self.duplicate_texts)

    def model_params(self) -> dict:
        """All keyword arguments of :class:`streamtree.model.DTSSBP` for this replay."""
        return text_model_params(self.model)

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
        return text_vectorizer(self.model_params(), self.min_df, self.max_df, self.max_features, self.weighting,
                               self.unspaced_terms)

    def identity(self) -> dict:
        """The settings that must match for a resume: everything but where it runs, with the
        source spelled canonically (relative or absolute paths of one file are the same)."""
        d = {k: v for k, v in asdict(self).items() if k not in RUN_LOCATION}
        d["source"] = canonical_uri(self.source)
        return settings_identity(d, ReplayConfig, ("format", "delimiter", "duplicate_texts", "unspaced_terms"),
                                 self.model_params(), self.epoch)


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
    skipped: bool = False  # no documents and no rejects: fitted, recorded with the next publish


@dataclass
class ReplaySummary:
    n_epochs: int
    n_published: int
    n_documents: int
    n_records: int
    rejects: dict[str, int] = field(default_factory=dict)
    n_empty_after_filter: int = 0
    #: rows that repeated an earlier row's text in their epoch (published at their text's node,
    #: fitted, or rejected: :data:`~streamtree.records.DUPLICATE_TEXTS`); None for a store
    #: resumed from one written before they were counted
    n_repeated_texts: int | None = 0
    duplicate_texts: str = DEFAULT_DUPLICATE_TEXTS
    vocabulary_size: int = 0
    seconds: float = 0.0
    fit_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    complete_before: bool = False  # resume of a store that was already complete
    #: epochs with no records (gaps in the stream), fitted and not published; 0 for a store
    #: resumed from one written before they were counted
    n_quiet: int = 0
    #: the earliest and latest time of the rows kept (microseconds since 1970); None without a
    #: time column, and for a store whose summary was written before it was recorded
    time_span_us: list[int] | None = None
    #: what those times are dated to (:func:`streamtree.epochs.time_resolution`: "year", "1d" ...)
    time_resolution: str | None = None
    #: files skipped because an earlier file holds their content: name -> that file's name
    duplicate_files: dict[str, str] = field(default_factory=dict)

    @property
    def n_rejects(self) -> int:
        return sum(self.rejects.values())

    def format(self) -> str:
        copies = (self.n_repeated_texts or 0) if self.duplicate_texts == "collapse" else 0  # published, not fitted
        fitted = self.n_documents - copies
        documents = f"{self.n_documents} published ({fitted} distinct texts fitted)" if copies else f"{fitted} fitted"
        quiet = (f", {self.n_quiet} without records: gaps in the stream, fitted and not published"
                 if self.n_quiet else "")
        lines = [f"epochs: {self.n_epochs} ({self.n_published} published now"
                 + (", the store was already complete" if self.complete_before else "") + quiet + ")",
                 f"documents: {documents} of {counted(self.n_records, 'record')} read"]
        if self.duplicate_files:
            lines.append(f"duplicate files skipped: {len(self.duplicate_files)} (same content as an earlier file: "
                         f"{duplicates_note(self.duplicate_files)})")
        lines += [f"vocabulary: {counted(self.vocabulary_size, 'term')}", f"rejects: {self.n_rejects}"]
        for reason, n in sorted(self.rejects.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {reason}: {n}")
        if self.n_empty_after_filter and EMPTY_AFTER_VOCABULARY not in self.rejects:
            lines.append(f"empty after vocabulary filtering: {self.n_empty_after_filter}")
        repeated = repeated_texts_note(self.n_repeated_texts, self.n_documents, self.duplicate_texts)
        if repeated:
            lines.append(f"repeated texts: {repeated}")
        rate = fitted / self.fit_seconds if self.fit_seconds > 0 else float("nan")
        fitting = f"{self.fit_seconds:.1f}s fitting, {rate:.0f} documents/s"
        if self.complete_before:
            lines.append(f"time: {self.seconds:.1f}s (nothing left to fit; the replay that wrote the store: {fitting})")
        elif self.n_published + self.n_quiet < self.n_epochs:  # a resume: the fitting time is the whole replay's
            lines.append(f"time: {self.seconds:.1f}s this run, for {self.n_published} of the "
                         f"{self.n_epochs - self.n_quiet} epochs{' with records' if self.n_quiet else ''} "
                         f"(the whole replay so far: {fitting})")
        else:
            lines.append(f"time: {self.seconds:.1f}s ({fitting})")
        return "\n".join(lines)


def duplicates_note(duplicate_files: dict[str, str], shown: int = 3) -> str:
    """``"b.jsonl = a.jsonl, ..."``: files skipped for the content of an earlier file, the first
    ``shown`` of them."""
    pairs = [f"{name} = {first}" for name, first in sorted(duplicate_files.items())]
    return ", ".join(pairs[:shown]) + (f" and {len(pairs) - shown} more" if len(pairs) > shown else "")


def open_epochs(config: ReplayConfig) -> tuple[EpochReader, object]:
    """Open the source and read it once into an :class:`EpochReader` (and return the source). A
    file whose content an earlier file holds is skipped (:attr:`Source.duplicate_files`).

    Raises SourceError for unreadable sources and ValueError for bad epoch or time settings.
    """
    spec = EpochSpec.parse(config.epoch)
    if spec.kind == "column" and config.epoch_col is None:
        raise ValueError("--epoch column needs --epoch-col")
    time_range = TimeRange.parse(config.time_range)
    src = open_source(config.source, config.text_col, config.time_col, config.id_col, config.epoch_col,
                      batch_size=config.batch_size, time_unit=config.time_unit, time_format=config.time_format,
                      format=config.format, delimiter=config.delimiter, skip_duplicate_files=True)
    reader = EpochReader(src, spec, time_range=time_range, unique_ids=config.id_col is not None).scan()
    for note in src.notes + reader.notes:
        logger.info("%s", note)
    if reader.n_epochs == 0:
        reader.close()
        raise ValueError(_all_rejected(config, src, reader))
    return reader, src


def _all_rejected(config: ReplayConfig, src, reader: EpochReader) -> str:
    if src.n_read == 0:
        return (f"{config.source}: holds no records (an empty file, or a header only); check that it is the "
                "file you meant")
    counts = reader.reject_counts()
    shown = ", ".join(f"{reason}: {n}" for reason, n in counts.most_common())
    hint = ("check --time-col and give --time-format (e.g. '%d/%m/%Y') or --time-unit"
            if any(r.endswith("time") for r in counts) else "check the column names and the data")
    notes = "; ".join(src.notes + reader.notes)
    return (f"{config.source}: " + ("the one record read was rejected" if src.n_read == 1 else
                                    f"every one of the {src.n_read} records was rejected") + f" ({shown})"
            + (f" [{notes}]" if notes else "") + f"; {hint}")


def read_epochs(config: ReplayConfig) -> tuple[list[Epoch], int]:
    """Read and bucket the whole source into a list (for callers that need every epoch at
    once, e.g. evaluation); returns the epochs and the number of records read."""
    reader, src = open_epochs(config)
    with reader:
        return list(reader.epochs()), src.n_read


def fit_vocabulary(config: ReplayConfig, epochs) -> TextVectorizer:
    """One vocabulary over the whole corpus, so every epoch's theta has the same columns.

    ``epochs`` is a list of epochs or an :class:`EpochReader`. The texts are gathered for
    one fit (scikit-learn's vocabulary fit is not incremental): the only step of a replay
    whose memory grows with the corpus, and a resume never repeats it.
    """
    texts = vocabulary_texts(epochs.epochs() if isinstance(epochs, EpochReader) else epochs, config.duplicate_texts)
    if not texts:
        raise ValueError(f"{config.source}: no usable documents (every record was rejected)")
    vec = config.vectorizer()
    vec.fit(pa.chunked_array(texts, pa.string()))
    return vec


def vocabulary_note(vec: TextVectorizer) -> str:
    """What the text pipeline chose for this corpus, in one sentence (printed and stored)."""
    cap = (f"the {vec.max_features_}-term cap chosen for {counted(vec.n_fit_documents_, 'document')} "
           "(max_features=auto)"
           if vec.max_features == "auto" else f"max_features={vec.max_features}")
    stop = "English and reporting stop words" if vec.stop_words == "english" else "custom stop words"
    weights = ("raw counts" if vec.norm is None else f"{vec.weighting} weights, L2-normalised rows"
               + (f" times (tokens / {vec.reference_length_:g}) ** {vec.length_power:g}" if vec.length_power else ""))
    return (f"vocabulary: {counted(vec.vocabulary_.shape[0], 'term')} ({cap}; min_df={vec.min_df}, "
            f"max_df={vec.max_df}; "
            f"{stop}; {weights})")


def check_duplicate_texts(value: str) -> None:
    if value not in DUPLICATE_TEXTS:
        raise ValueError(f"duplicate_texts must be one of {DUPLICATE_TEXTS}, got {value!r}")


def vocabulary_texts(epochs, duplicate_texts: str) -> list[pa.Array]:
    """The text chunks a vocabulary is fitted on: every row of ``epochs`` (an iterable of
    :class:`~streamtree.epochs.Epoch`), or under ``duplicate_texts`` ``"reject"`` or
    ``"collapse"`` the first row of each text in each epoch (the rows that will be fitted)."""
    chunks = []
    for ep in epochs:
        texts = ep.rows.column("text")
        if duplicate_texts != "keep":
            texts = texts.filter(pa.array(~ep.repeated_texts()))
        chunks.extend(texts.chunks)
    return chunks


def repeated_texts_note(n_repeated: int, n_documents: int, duplicate_texts: str) -> str | None:
    """A sentence on the rows that repeated an earlier row's text in their epoch, or None; with
    advice when kept copies are :data:`REPEATED_TEXTS_WARNING` of the documents or more."""
    if not n_repeated:
        return None
    if duplicate_texts == "reject":
        return (f"{n_repeated} rows repeated the text of an earlier row of their epoch and were filed as "
                f"rejects ({DUPLICATE_TEXT!r}); the first of each was fitted")
    if duplicate_texts == "collapse":
        return (f"{n_repeated} of the {n_documents} documents repeat the text of an earlier document of their "
                "epoch: each text was fitted once and its copies published at its node")
    said = (f"{n_repeated} of the {n_documents} documents repeat the text of an earlier document of their "
            "epoch and were fitted as documents of their own")
    if n_repeated < REPEATED_TEXTS_WARNING * n_documents:
        return said
    return (f"{said}: copies count as independent evidence, which splits a topic into nodes of near copies; "
            "--duplicate-texts collapse fits each text once and publishes every copy at its node (reject "
            "files the copies as rejects instead)")


def settings_identity(settings: dict, config_class: type, added: tuple[str, ...], model_params: dict,
                      epoch: str) -> dict:
    """A replay's or service's identity (what must match for its store to be continued) from
    its ``settings`` as a dict: the settings of ``added`` (given later than the first stores)
    only where they differ from ``config_class``'s default, so that stores written before
    them still match; the weighting and week origin as :func:`drop_unset_weighting` and
    :func:`record_week_origin` record them; the model as :func:`identity_model`; all as JSON
    reads it back."""
    d = dict(settings)
    for name in added:
        if d[name] == setting_before_added(name, config_class):
            d.pop(name)
    drop_unset_weighting(d, model_params)
    record_week_origin(d, epoch)
    d["model"] = identity_model(model_params)
    return json.loads(json.dumps(d, default=str))


def setting_before_added(name: str, config_class: type):
    """The value of setting ``name`` in stores whose identity does not record it: the value
    stores had before it was recorded (its default then), which for ``duplicate_texts`` is not
    the default now."""
    if name == "duplicate_texts":
        return DUPLICATE_TEXTS_BEFORE_COLLAPSE
    return getattr(config_class, name, None)


def identity_model(params: dict) -> dict:
    """The model parameters a replay or service identity records: not where it runs
    (:data:`streamtree.model.RUN_LOCATION_PARAMS`), and a parameter of
    :data:`streamtree.model.PARAMS_BEFORE_ADDED` that the likelihood family does not have at
    its value there (what stores written before it recorded), so that a default the family
    ignores does not make an older store look different."""
    from streamtree.likelihoods import LIKELIHOODS
    from streamtree.model import PARAMS_BEFORE_ADDED, RUN_LOCATION_PARAMS

    family = LIKELIHOODS.get(params.get("likelihood"))
    model = {k: v for k, v in sorted(params.items()) if k not in RUN_LOCATION_PARAMS}
    if family is not None:
        of_families = {name for cls in LIKELIHOODS.values() for name in cls.params}  # not split_node
        model.update({name: before for name, before in PARAMS_BEFORE_ADDED.items()
                      if name in of_families and name not in family.params})
        if "document_weights" in family.params:  # "auto" and True read the same weights: one identity
            model["document_weights"] = reads_document_weights(model["document_weights"])
    return model


def stored_identity(identity: dict) -> dict:
    """A stored replay or service identity with the model parameters its store was written
    before given the values it was fitted with (:data:`streamtree.model.PARAMS_BEFORE_ADDED`)."""
    from streamtree.model import PARAMS_BEFORE_ADDED

    if not isinstance(identity.get("model"), dict):
        return identity
    return {**identity, "model": {**PARAMS_BEFORE_ADDED, **identity["model"]}}


def same_identity(stored: dict, now: dict) -> bool:
    """Whether a stored identity and the one now continue each other (the epochs compared by
    meaning, not spelling)."""
    if "epoch" in stored and "epoch" in now:
        stored = {**stored, "epoch": EpochSpec.meaning(stored["epoch"])}
        now = {**now, "epoch": EpochSpec.meaning(now["epoch"])}
    return stored == now


def identity_differences(stored: dict, now: dict, config_class: type | None = None) -> str:
    """The settings in which two replay identities differ, named down to the model parameter
    (``model.document_concentration: None in the store, 'auto' now``), at most four; a setting
    an identity leaves out at its default (:func:`settings_identity`'s ``added``) shown at
    ``config_class``'s default."""

    def shown(identity: dict, key: str):
        # an identity without a weighting has the one older stores had (drop_unset_weighting)
        if key == "weighting" and identity.get(key) is None:
            return WEIGHTING_BEFORE_TFIDF
        if key not in identity and config_class is not None:
            return setting_before_added(key, config_class)
        return identity.get(key)

    found = []
    for k in sorted(set(stored) | set(now)):
        a, b = shown(stored, k), shown(now, k)
        if a == b or (k == "epoch" and EpochSpec.meaning(a) == EpochSpec.meaning(b)):
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            found += [f"{k}.{j}: {a.get(j)!r} in the store, {b.get(j)!r} now"
                      for j in sorted(set(a) | set(b)) if a.get(j) != b.get(j)]
        else:
            found.append(f"{k}: {a!r} in the store, {b!r} now")
    return ", ".join(found[:4])


@dataclass
class _Start:
    """Where a replay starts: from scratch, from a checkpoint, or nothing to do."""

    resume_from: dict | None = None  # the last commit record
    complete: dict | None = None


def _start(store: SnapshotStore, config: ReplayConfig, mode: str) -> _Start:
    # Every commit record is validated (small JSON files, no data): a damaged store is an
    # error here rather than a resume that succeeds and leaves a store readers cannot read.
    manifest = store.manifest()
    last = manifest["epochs"][-1] if manifest["epochs"] else None
    if last is None or mode == "overwrite":
        return _Start()
    stored = stored_identity(manifest.get("config", {}).get("replay") or {})
    same = same_identity(stored, config.identity())
    if mode == "resume" and same:
        cut = store.cut_short_epoch()  # still there once the writer cleaned up: kept, see SnapshotStore
        if cut is not None:
            raise CorruptStoreError(f"{store.uri}: the commit record of epoch {cut} was cut short by a crash, and "
                                    "that epoch's folder holds the only model checkpoint (the one before it was "
                                    "already removed), so the run cannot be resumed: replay it again with "
                                    "--overwrite, or into another --store")
        if manifest.get("complete"):
            return _Start(last, manifest["complete"])
        if not last.get("checkpoint"):
            raise StoreError(f"{store.uri}: the store was written without model checkpoints (by an older "
                             "streamtree?) and cannot be resumed; use --overwrite or another --store")
        return _Start(last)
    if mode == "resume":
        raise StoreError(f"{store.uri}: the store holds a replay with a different configuration "
                         f"({identity_differences(stored, config.identity(), ReplayConfig)}); cannot resume it: give "
                         "the store's settings, or use --overwrite or another --store")
    what = "the same configuration" if same else \
        f"a different configuration ({identity_differences(stored, config.identity(), ReplayConfig)})"
    state = "complete" if manifest.get("complete") else "unfinished"
    hint = "--resume to finish it, " if same and state == "unfinished" else ""
    raise StoreError(f"{store.uri}: the store already holds {store.count_published()} published epochs of "
                     f"{what}, {state}, through {last['label']}; pass {hint}--overwrite to replace "
                     "them, or choose another --store")


def replay(
    config: ReplayConfig,
    store_uri: str,
    *,
    mode: str = "refuse",
    progress: Callable[[EpochProgress], None] | None = None,
    static: StaticOptions | None = None,
    lease_timeout: float | None = None,
    keep_checkpoints: str = "latest",
) -> ReplaySummary:
    """Replay ``config.source`` into the store at ``store_uri``.

    Parameters
    ----------
    config : ReplayConfig
    store_uri : str
        Snapshot store location (created if needed).
    mode : {"refuse", "resume", "overwrite"}
        What to do when the store already has published epochs: refuse (StoreError),
        resume a replay of the same configuration from its last checkpoint, or replace it
        (the old run stays readable until the new one commits its first epoch).
    progress : callable, optional
        Called with an :class:`EpochProgress` after each epoch; if it also has
        ``start_epoch(index, n_epochs, label, n_rows)`` and ``sweep(done, n_sweeps, n_live)``
        methods (e.g. :class:`streamtree.progress.ReplayProgress`), they are called before each
        epoch and after each of its sweeps.
    static : StaticOptions, optional
        Also fit a static hierarchy (see :mod:`streamtree.snapshots`) of each newly published
        epoch and store it as ``static/<method>-<over>.parquet``. It is written after the
        epoch's publish, so a reader may see an epoch before its static snapshot and must treat
        a missing one as "not yet". The options are committed with each epoch: a resume goes
        on with the last published epoch's when none are given, and first writes that epoch's
        snapshot, with the options it was published under, if the stopped run did not.
    lease_timeout : float, optional
        Seconds without a heartbeat after which this writer's lease counts as stale.
    keep_checkpoints : {"latest", "all"}, default "latest"
        Keep the full model checkpoint of the latest epoch only (what a resume needs; the
        trees of all epochs are stored compactly, as :func:`theta_storage` says) or of every
        epoch, so that
        :func:`load_model` can load any epoch's model (a store many times larger). A resumed
        store keeps the choice it was written with.

    Returns
    -------
    ReplaySummary

    Raises
    ------
    StoreBusyError
        Another writer holds the store.
    StoreError
        The store cannot be written, holds another run, or is damaged.
    SourceError, ValueError
        Unreadable source, bad settings, or every record rejected.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    where = nesting(config.source, store_uri)
    if where is not None and exists(config.source):
        # before the store is created: its own files would be read as data (or its clean-up
        # would touch the source's); a source that is not there is the source's error, later
        raise StoreError(f"{store_uri}: the store {where} the source {config.source}; put the store outside it "
                         "(a replay would read the store's own files as data)")
    start = time.perf_counter()
    store = SnapshotStore(store_uri, **theta_storage(config.model_params()),
                          keep_checkpoints=keep_checkpoints)
    created = not store.exists()
    try:
        store.check_writable()  # before the source is read
        kw = {} if lease_timeout is None else {"timeout": lease_timeout}
        with store.writer("replay", **kw):
            return _replay(store, config, mode, progress, static, start)
    except BaseException as exc:
        if isinstance(exc, StoreAccessError) and mode == "resume" and not created:
            # a resume of a finished run only reads: on a store this user may not write
            # (read-only, a reader's copy) it answers all the same
            begin = _start(store, config, mode)
            if begin.complete is not None:
                return _finished(store, config, begin, start)
        if created:  # a run that stopped before writing anything leaves no empty folder behind
            store.discard_if_empty()
        raise


def unfinished_note(store: SnapshotStore) -> str | None:
    """What a reader of a store (``show``, the report) should know when its replay has not
    finished; None for a finished replay and for a service's store, which is never finished."""
    if "replay" not in store.config() or store.complete():
        return None
    epochs = store.epochs()
    through = f", through {epochs[-1]['label']}" if epochs else ""
    return (f"this replay has not finished: {counted(len(epochs), 'epoch')} published{through} (still running, or "
            "stopped: the same `streamtree replay` command with --resume finishes it)")


def _finished(store, config, begin: _Start, start: float) -> ReplaySummary:
    """The summary of a resume of a run that had finished: nothing to do, once the source is
    checked to be the one the run read."""
    src = open_source(config.source, config.text_col, config.time_col, config.id_col, config.epoch_col,
                      time_unit=config.time_unit, time_format=config.time_format, format=config.format,
                      delimiter=config.delimiter)
    _check_source(store, src, store.config().get("source_files"))
    summary = ReplaySummary(n_published=0, complete_before=True, **begin.complete["summary"])
    summary.seconds = time.perf_counter() - start
    return summary


def _replay(store, config, mode, progress, static, start) -> ReplaySummary:
    from streamtree.model import DTSSBP

    begin = _start(store, config, mode)
    stored_files = store.config().get("source_files") if begin.resume_from is not None else None
    if begin.complete is not None:
        return _finished(store, config, begin, start)
    reader, src = open_epochs(config)
    try:
        notes = src.notes + reader.notes
        if begin.resume_from is not None:
            _check_source(store, src, stored_files)
            _check_duplicates(store, src)
            if store.keep_checkpoints == "all" and store.kept_checkpoints() == "latest":
                raise StoreError(f"{store.uri}: the store was written keeping the latest epoch's checkpoint only "
                                 "(the older ones are gone), so a resume cannot keep every epoch's: resume "
                                 "without keep_checkpoints='all' (--keep-checkpoints all), or replay it again "
                                 "with --overwrite")
            vec = store.vectorizer()
            arrays, meta = store.read_checkpoint(begin.resume_from["epoch"])
            params = config.model_params()
            model = DTSSBP.from_checkpoint(arrays, meta, **{k: params[k] for k in RUN_LOCATION_PARAMS})
            totals = dict(begin.resume_from["state"])
            totals.pop("static", None)  # the static options, committed with the totals
            totals.setdefault("repeated_texts", None)  # a store written before the count: unknown
            totals.setdefault("quiet", 0)  # likewise; said only when some were counted
            first = begin.resume_from["epoch"] + 1
            _check_numbering(store, reader, begin.resume_from)
            logger.info("resuming after epoch %d (%s)", begin.resume_from["epoch"], begin.resume_from["label"])
            run_static = _static_in_force(store, begin.resume_from, static)
            if static is None and run_static is not None:
                logger.info("static %s snapshots over %s, as the run being resumed wrote them",
                            run_static.method, run_static.over)
                static = run_static
            _finish_static(store, run_static, reader, EpochFitter(model, vec, config.duplicate_texts), model,
                           begin.resume_from, config.seed)
        else:
            vec = fit_vocabulary(config, reader)
            model = config.estimator()
            totals = {"documents": 0, "rejects": {}, "empty_after_filter": 0, "repeated_texts": 0, "fit_seconds": 0.0,
                      "epochs": 0, "quiet": 0}
            first = 0
        notes = notes + [vocabulary_note(vec)]  # on resume too: the summaries of both runs agree
        run = _Run(store, config, vec, model, reader, totals, progress, static,
                   begun=begin.resume_from is not None, source_files=src.fingerprint(),
                   duplicate_files=src.duplicate_files, notes=notes)
        try:
            n_published = run.fit(first)
        finally:
            model.close()  # release engine resources (Ray actors)
    finally:
        reader.close()
    t = run.totals
    summary = ReplaySummary(
        n_epochs=t["epochs"], n_published=n_published, n_quiet=t["quiet"], n_documents=t["documents"],
        n_records=src.n_read,
        rejects=dict(t["rejects"]), n_empty_after_filter=t["empty_after_filter"],
        n_repeated_texts=t["repeated_texts"], duplicate_texts=config.duplicate_texts,
        vocabulary_size=int(vec.vocabulary_.shape[0]), seconds=time.perf_counter() - start,
        fit_seconds=t["fit_seconds"], notes=notes,
        time_span_us=None if reader.time_span_us is None else list(reader.time_span_us),
        time_resolution=reader.time_resolution, duplicate_files=dict(src.duplicate_files),
    )
    # the store's totals; what this invocation published is not a property of the store
    store.finish({k: v for k, v in asdict(summary).items() if k not in ("n_published", "complete_before")})
    return summary


def _check_numbering(store: SnapshotStore, reader: EpochReader, last: dict) -> None:
    """A resume continues after the store's last epoch by its index, so the source's epochs must
    be numbered as when the store was written (a streamtree whose rules for which epochs exist
    differ, e.g. one that let rejects alone open epochs, numbers them otherwise): else the resume
    would skip or repeat epochs."""
    at, label = int(last["epoch"]), last["label"]
    now = reader.spec.label(reader.keys[at]) if at < reader.n_epochs else None
    if now != label:
        seen = f"is {now!r}" if now is not None else f"does not exist ({reader.n_epochs} epochs now)"
        raise StoreError(f"{store.uri}: the store's last epoch {at} is {label!r}, but the source's epoch {at} "
                         f"{seen}: its epochs are numbered differently from when the store was written (by "
                         "another streamtree version?); replay it again with --overwrite")


def source_changes(stored_files: list | None, now: list) -> list[str]:
    """The files added, removed or rewritten between a store's record of its source's files
    (``source_files``, :meth:`~connectors.sources.files.FileSource.fingerprint`) and ``now``;
    none when the store recorded none."""
    if stored_files is None or now == stored_files:
        return []
    before = {f[0]: f[1:] for f in stored_files}
    after = {f[0]: f[1:] for f in now}
    return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))


def _check_source(store: SnapshotStore, src, stored_files) -> None:
    changed = source_changes(stored_files, src.fingerprint())
    if changed:
        raise StoreError(f"{store.uri}: the source changed since the store was written "
                         f"({counted(len(changed), 'file')} added, removed or rewritten, e.g. {changed[0]!r}); "
                         "use --overwrite to replay it again")


def _check_duplicates(store: SnapshotStore, src) -> None:
    """A resume reads the files the store was begun with: a store written before a file holding
    the content of an earlier one was skipped fitted it, and would go on without it."""
    stored, now = store.config().get("duplicate_files"), src.duplicate_files
    if (stored or {}) == now:
        return
    if stored is None:
        raise StoreError(f"{store.uri}: the store was written fitting every file of the source, and "
                         f"{counted(len(now), 'file')} of them hold the content of an earlier one "
                         f"({duplicates_note(now)}), which a replay now skips as a re-delivery; replay it again "
                         "with --overwrite")
    raise StoreError(f"{store.uri}: the store was begun skipping {duplicates_note(stored) or 'no file'} for the "
                     f"content of an earlier file, but the source now has {duplicates_note(now) or 'none'}; "
                     "replay it again with --overwrite")


class _Run:
    """The epoch loop of one replay (fresh or resumed)."""

    def __init__(self, store, config, vec, model, reader, totals, progress, static, *, begun, source_files,
                 duplicate_files, notes):
        self.store, self.config, self.vec, self.model, self.reader = store, config, vec, model, reader
        self.totals, self.progress, self.static = totals, progress, static
        self.begun, self.source_files, self.duplicate_files, self.notes = begun, source_files, duplicate_files, notes

    def _begin(self) -> None:
        # the static options too: what the run was begun with (each commit records those in force)
        self.store.begin({"replay": self.config.identity(), "engine": self.config.engine,
                          "streamtree": streamtree.__version__, "source_files": self.source_files,
                          "duplicate_files": self.duplicate_files, "notes": self.notes,
                          "static": None if self.static is None else asdict(self.static)},
                         self.vec)
        self.begun = True

    def fit(self, first: int) -> int:
        cfg, model, t = self.config, self.model, self.totals
        quiet_run = QuietEpochs()  # a run of empty epochs not yet recorded
        n_published = 0
        last_index = self.reader.n_epochs - 1
        fitter = EpochFitter(model, self.vec, cfg.duplicate_texts)
        for ep in self.reader.epochs(start=first):
            t0 = time.perf_counter()
            empty_before = fitter.n_empty
            start = getattr(self.progress, "start_epoch", None)
            if start is not None:
                start(ep.index, self.reader.n_epochs, ep.label, ep.n_rows)
            fitted = fitter.fit(ep, callback=getattr(self.progress, "sweep", None))
            t["empty_after_filter"] += fitter.n_empty - empty_before
            if t["repeated_texts"] is not None:
                t["repeated_texts"] += fitter.last_repeated
            if fitted is None:  # the model needs documents in its first epoch: rejects carried
                continue
            ep, X, rejects, tree = fitted.epoch, fitted.X, fitted.rejects, fitted.tree
            t["fit_seconds"] += time.perf_counter() - t0
            t["documents"] += int(X.shape[0])
            t["epochs"] += 1
            log = RejectLog()
            log.add(rejects)
            for reason, n in log.counts.items():
                t["rejects"][reason] = t["rejects"].get(reason, 0) + n
            quiet = X.shape[0] == 0 and rejects.num_rows == 0 and ep.index != last_index
            if quiet:
                quiet_run.add(ep, tree, model.trees_[-2] if len(model.trees_) > 1 else None)
                t["quiet"] += 1
            else:
                if not self.begun:
                    self._begin()
                fitted = quiet_run.fold(fitted)
                # the static options in force are committed with the epoch: they decide the snapshot a
                # resume writes if this run stops before it does (see _static_in_force)
                state = {**t, "static": None if self.static is None else asdict(self.static)}
                fitted.publish(self.store, n_top_words=cfg.top_words, checkpoint=model.get_checkpoint(),
                               state=state, empty_before=quiet_run.take())
                n_published += 1
                if self.static is not None:
                    _write_static(self.store, self.static, ep, tree, X, cfg.seed)
            if self.progress is not None:
                self.progress(EpochProgress(ep.index, self.reader.n_epochs, ep.label, X.shape[0],
                                            rejects.num_rows, tree.n_nodes, time.perf_counter() - t0, quiet))
            # the store keeps the history (and the quiet run what it needs): memory stays flat
            # over a long stream, where every tree kept its parameters and assignments
            del model.trees_[:-1]
        if fitter.carried:  # no epoch had a document left
            raise ValueError(f"{cfg.source}: no document is left after vocabulary filtering "
                             f"({t['empty_after_filter']} empty rows); lower --min-df or raise --max-features")
        return n_published


@dataclass
class FittedEpoch:
    """One epoch fitted by :class:`EpochFitter`, ready to publish."""

    epoch: Epoch  # rows fitted (documents empty after vocabulary filtering moved to rejects)
    tree: object  # EpochTree
    X: sp.csr_matrix
    rejects: pa.Table  # this epoch's rejects, with those carried from leading empty epochs
    #: the terms of X's columns, to label nodes by their documents (None: the store labels them
    #: by theta, for families that do not label by documents)
    vocabulary: np.ndarray | None = None
    #: the rows of X the model fitted when it did not fit them all (repeated texts fitted once):
    #: the label words read those, so that a text's copies do not outweigh other texts
    fitted_rows: np.ndarray | None = None

    @property
    def n_documents(self) -> int:
        return int(self.X.shape[0])

    def publish(self, store: SnapshotStore, *, n_top_words: int, **commit) -> None:
        """Publish to ``store`` with each node's label words (``EpochTree.label_words``: the
        terms of the fitted documents in its subtree; without a :attr:`vocabulary`, the store's
        default, theta's largest entries); ``commit`` goes to ``SnapshotStore.publish``
        (``state``, ``checkpoint``, ``tables``: what is committed with the epoch)."""
        ep = self.epoch
        tree, X = self.tree, self.X
        if self.fitted_rows is not None:
            tree, X = replace(tree, assignments=np.asarray(tree.assignments)[self.fitted_rows]), X[self.fitted_rows]
        words = None if self.vocabulary is None else tree.label_words(self.vocabulary, X, n_top_words)
        store.publish(self.tree, ep.rows.column("id").to_pylist(), top_words=words, n_top_words=n_top_words,
                      rejects=self.rejects, key=ep.key, label=ep.label, events=self.tree.events, **commit)


class QuietEpochs:
    """A run of quiet epochs (no documents and no rejects: a gap in the stream) fitted since
    the last published epoch. They are not published as folders of their own: the next
    published epoch records the run (:meth:`take`, its ``empty_before``) and carries what
    happened in it (:meth:`fold`): its births, deaths and parent changes are counted against
    the last published tree, and the splits and merges the sampler made in the gap are kept
    where they still hold, so a node that died in the gap is a death of that epoch. Shared by
    replay and serve."""

    def __init__(self) -> None:
        self.run: dict | None = None
        self._before = None  # the last published tree (an EpochTree), or None before the first
        self._moves: list[tuple[int, str, int]] = []

    def add(self, ep: Epoch, tree, previous) -> None:
        """Record quiet epoch ``ep`` fitted as ``tree``; ``previous`` is the tree fitted before it."""
        if self.run is None:
            self.run = {"first": ep.index, "first_label": ep.label}
            self._before = previous
        self.run.update(last=ep.index, last_label=ep.label, n=ep.index - self.run["first"] + 1)
        self._moves += _moves_of(tree.events)

    def fold(self, fitted: FittedEpoch) -> FittedEpoch:
        """``fitted`` (the epoch after the run) with its events and deaths counted from the
        last published tree; unchanged when no quiet epoch came before it."""
        if self.run is None:
            return fitted
        tree, before = fitted.tree, self._before
        z = np.zeros(0, dtype=np.int64)
        prev_ids, prev_parents = (z, z) if before is None else (before.node_ids, before.parent)
        events = epoch_events(tree.epoch, prev_ids, prev_parents, tree.node_ids, tree.parent,
                              self._moves + _moves_of(tree.events))
        died = np.setdiff1d(np.asarray(prev_ids, dtype=np.int64), tree.node_ids)
        return replace(fitted, tree=replace(tree, events=events, died=died))

    def take(self) -> dict | None:
        """The run's record for the published epoch's ``empty_before``, and a fresh start."""
        run, self.run, self._before, self._moves = self.run, None, None, []
        return run


def _moves_of(events) -> list[tuple[int, str, int]]:
    """The sampler's accepted moves recorded in an epoch's events, in their order."""
    return [(int(n), str(k), int(o)) for n, k, o in zip(events.node_id, events.event, events.other_id)
            if k in ("split_from", "merged_into")]


class EpochFitter:
    """Vectorise and fit epochs in order: the per-epoch step shared by replay and serve.

    Rows whose text repeats an earlier row's in the epoch become, under
    ``duplicate_texts="reject"``, rejects of their epoch
    (:data:`~streamtree.records.DUPLICATE_TEXT`); under ``"collapse"`` documents that the
    model does not fit, published at the node of their text's first row
    (:meth:`published_tree`); :attr:`last_repeated` counts the rejected ones, or under
    ``"keep"`` and ``"collapse"`` those of them that are documents. Rows empty after vocabulary filtering become
    rejects of their epoch. Until the model has seen a document (it needs some in its first
    epoch), epochs without documents are not fitted: :meth:`fit` returns None and their
    rejects are carried into the next epoch's.
    """

    def __init__(self, model, vectorizer: TextVectorizer, duplicate_texts: str = DEFAULT_DUPLICATE_TEXTS) -> None:
        check_duplicate_texts(duplicate_texts)
        self.model = model
        self.vectorizer = vectorizer
        self.duplicate_texts = duplicate_texts
        self.carried: list[pa.Table] = []
        self.n_empty = 0
        #: the last epoch's rows repeating an earlier row's text: rejected, or documents (fitted
        #: under "keep", published at their text's node under "collapse")
        self.last_repeated = 0

    def documents(self, ep: Epoch) -> tuple[Epoch, sp.csr_matrix, int, int]:
        """The rows of ``ep`` that are documents and their vectors, fitting nothing.

        Returns
        -------
        ep : Epoch
            The epoch with its other rows (repeated texts under ``"reject"``, rows empty after
            vocabulary filtering) moved to its rejects.
        X : scipy.sparse.csr_matrix
            One row per document.
        n_empty : int
            Rows empty after vocabulary filtering.
        n_repeated : int
            What :attr:`last_repeated` counts for this epoch.
        """
        p = self.vectorizer.vocabulary_.shape[0]
        repeated = ep.repeated_texts()
        reject = self.duplicate_texts == "reject"
        if reject:
            ep = ep.reject(repeated, DUPLICATE_TEXT)
        empty = np.zeros(ep.n_rows, dtype=bool)
        if ep.n_rows:
            X = self.vectorizer.transform(ep.rows.column("text"))
            empty = self.vectorizer.empty_rows(X)
            ep = ep.reject(empty, EMPTY_AFTER_VOCABULARY)
            X = X[~empty]
        else:
            X = sp.csr_matrix((0, p))
        # rejected copies, or the kept copies that are documents (a copy left empty is a reject)
        n_repeated = int(repeated.sum() if reject else (repeated & ~empty).sum())
        return ep, X, int(empty.sum()), n_repeated

    def fitted_rows(self, ep: Epoch) -> tuple[np.ndarray, np.ndarray] | None:
        """Under ``"collapse"``, for the documents of ``ep`` (as :meth:`documents` returns it):
        the rows the model fits, the first of each text, and for every row the place among
        those of its text's first row; otherwise None (every document is fitted)."""
        if self.duplicate_texts != "collapse":
            return None
        first = ep.first_of_text()
        fitted = np.flatnonzero(first == np.arange(first.size))
        return fitted, np.searchsorted(fitted, first)

    @staticmethod
    def published_tree(tree, rows: tuple[np.ndarray, np.ndarray] | None):
        """The tree the model fitted as published: with every copy at its text's node
        (:meth:`EpochTree.with_copies`) when :meth:`fitted_rows` gave ``rows``, else as fitted."""
        return tree if rows is None else tree.with_copies(rows[1])

    def fit(self, ep: Epoch, callback=None) -> FittedEpoch | None:
        """Fit one epoch; ``callback(sweeps_done, n_sweeps, n_live)`` follows its sweeps."""
        ep, X, n_empty, self.last_repeated = self.documents(ep)
        self.n_empty += n_empty
        if self.last_repeated:
            logger.debug("epoch %s: %d rows repeat the text of an earlier row of the epoch (%s)", ep.label,
                         self.last_repeated, {"reject": "rejected", "collapse": "fitted once"}.get(
                             self.duplicate_texts, "fitted"))
        rejects = pa.concat_tables(self.carried + [ep.rejects]) if self.carried else ep.rejects
        if X.shape[0] == 0 and not hasattr(self.model, "trees_"):
            self.carried = [rejects]
            return None
        self.carried = []
        rows = self.fitted_rows(ep)
        self.model.partial_fit(X if rows is None else X[rows[0]], epoch=ep.index, label=ep.label, callback=callback)
        by_documents = type(self.model.likelihood_).labels_from_documents
        return FittedEpoch(ep, self.published_tree(self.model.trees_[-1], rows), X, rejects,
                           self.vectorizer.vocabulary_ if by_documents else None, None if rows is None else rows[0])


def _static_in_force(store: SnapshotStore, last: dict, given: StaticOptions | None) -> StaticOptions | None:
    """The static options in force when the epoch of commit record ``last`` was published.

    A resume may give other options than the run it resumes (``--static``), and a later resume
    must write a missing snapshot of an epoch that resume committed with that resume's options:
    they are committed with each epoch (its record's ``state["static"]``). Records written before
    that have the options the run was begun with (the manifest's); stores older still recorded
    none, and take ``given``.
    """
    state, config = last.get("state") or {}, store.config()
    if "static" in state:
        recorded = state["static"]
    elif "static" in config:
        recorded = config["static"]
    else:
        return given
    return None if recorded is None else StaticOptions(**recorded)


def _finish_static(store: SnapshotStore, opts: StaticOptions | None, reader: EpochReader, fitter: EpochFitter,
                   model, last: dict, seed: int) -> None:
    """Write the static snapshot of the last published epoch if the run stopped before it did.

    A replay writes an epoch's static snapshot right after committing the epoch, so a run killed
    in between leaves the epoch without it, and a resume, which starts after that epoch, would
    never write it. The checkpoint's tree is that epoch's (the model restored from it holds it)
    and its documents are vectorised again, so the snapshot is the one the run would have written.
    """
    if opts is None or snapshot_name(opts.method, opts.over) in last.get("static", []):
        return
    tree = model.trees_[-1]
    if int(tree.epoch) != int(last["epoch"]):
        raise StoreError(f"{store.uri}: the checkpoint of epoch {last['epoch']} holds the tree of epoch {tree.epoch}; "
                         "the store is damaged: replay it again with --overwrite")
    ep, X, _, _ = fitter.documents(next(reader.epochs(start=int(last["epoch"]))))
    logger.info("epoch %s: writing the static %s snapshot the stopped run did not write", ep.label, opts.method)
    _write_static(store, opts, ep, fitter.published_tree(tree, fitter.fitted_rows(ep)), X, seed)


def _write_static(store: SnapshotStore, opts: StaticOptions, ep: Epoch, tree, X, seed: int) -> None:
    """Fit and store the static snapshot of a just-published epoch (seeded per epoch)."""
    t0 = time.perf_counter()
    rng = np.random.default_rng([seed, ep.index])
    try:
        if opts.over == "nodes":
            res = static_snapshot(opts.method, node_theta=tree.theta, ids=tree.node_ids.tolist(),
                                  max_points=opts.max_points, rng=rng)
        else:
            res = static_snapshot(opts.method, document_directions(X), ids=ep.rows.column("id").to_pylist(),
                                  labels=tree.assignments, max_points=opts.max_points, rng=rng)
    except ValueError as exc:  # e.g. an epoch with a single document or node
        logger.warning("epoch %s: no static %s snapshot: %s", ep.label, opts.method, exc)
        return
    store.write_static(ep.index, snapshot_name(opts.method, opts.over), res.dendrogram, res.stats,
                       leaf_ids=res.leaf_ids)
    logger.info("epoch %s: static %s snapshot over %d %s in %.2fs", ep.label, opts.method,
                res.stats["n_points"], opts.over, time.perf_counter() - t0)


def stderr_progress(stream=None) -> Callable[[EpochProgress], None]:
    """A progress callback printing one line per epoch (rewritten in place on a terminal)."""
    stream = stream or sys.stderr
    tty = getattr(stream, "isatty", lambda: False)()

    def show(p: EpochProgress) -> None:
        rate = p.n_documents / p.seconds if p.seconds > 0 else 0.0
        tag = " (no documents: recorded with the next epoch)" if p.skipped else ""
        line = (f"[{p.index + 1}/{p.n_epochs}] {p.label}: {counted(p.n_documents, 'doc')}, {rate:.0f} docs/s, "
                f"{counted(p.n_nodes, 'live node')}, {counted(p.n_rejects, 'reject')}{tag}")
        stream.write(("\r\x1b[K" + line) if tty else line + "\n")
        if tty and p.index + 1 >= p.n_epochs:
            stream.write("\n")
        stream.flush()

    return show


class StoredTreeModel(DTSSBP):
    """The model of an epoch whose full checkpoint the store did not keep, rebuilt from the
    epoch's stored tree: ``predict``, ``transform`` and ``score_samples`` score documents
    against that tree, but it cannot be fitted further (``fit`` and ``partial_fit`` raise
    :class:`~connectors.stores.CheckpointNotKeptError`).

    Node parameters are the stored ones (vMF directions truncated to cosine
    :data:`~connectors.stores.snapshot.THETA_COSINE` with the full ones, ``theta_error_`` the
    largest relative L2 error of a node's direction; kept as stored, with norm at least that
    cosine, not rescaled to unit length: text rows put their weight on a node's kept entries,
    so the stored rows score them almost exactly, where rescaling would raise nearly every
    score, see BENCHMARKS.md; multinomial word distributions rebuilt
    from log probabilities coded to :data:`~connectors.stores.snapshot.THETA_LOG_STEP`,
    ``theta_error_`` the largest ``|log phi_hat - log phi|``, rows summing to 1); masses, concentrations, window counts,
    parameters and sampled hyperparameters are the epoch's own. Built by :func:`load_model`.
    """

    # load_model puts the store's own message here; this one is for copies such as clone()'s
    _not_kept = ("a StoredTreeModel scores documents against an epoch's stored tree and cannot be fitted: "
                 "fit a DTSSBP, or replay with keep_checkpoints='all' (--keep-checkpoints all) to load "
                 "any epoch's full model")

    def fit(self, *args, **kwargs):
        raise CheckpointNotKeptError(self._not_kept)

    def partial_fit(self, *args, **kwargs):
        raise CheckpointNotKeptError(self._not_kept)


def load_model(store_uri: str, epoch: int | None = None, **overrides) -> DTSSBP:
    """The model of a store as it was after ``epoch`` (default: the latest published one);
    ``overrides`` set run-location parameters such as the engine. Use the store's vectoriser
    (``SnapshotStore(uri).vectorizer()``) to turn new documents into rows.

    The latest epoch's model (and any epoch's, in a store replayed with
    ``keep_checkpoints="all"``) comes back from its full checkpoint, ready to ``partial_fit``
    further epochs. An older epoch of a store that kept only the latest checkpoint comes back
    as a :class:`StoredTreeModel`, which scores documents against that epoch's stored tree but
    cannot be fitted further.

    A model from a checkpoint holds its trees as fitted: where repeated texts were fitted once
    (``duplicate_texts="collapse"``), the last tree's assignments are those of the fitted rows,
    each text once, while the store's tree (``SnapshotStore.read``), and so a
    :class:`StoredTreeModel`'s, assigns every published document, copies included. Join
    assignments to document ids through the store.
    """
    store = SnapshotStore(store_uri)
    try:
        return DTSSBP.from_checkpoint(*store.read_checkpoint(epoch), **overrides)
    except CheckpointNotKeptError as exc:
        not_kept = str(exc)
    stored = store.read(epoch)
    own = store.read_checkpoint_meta(epoch)
    arrays, meta = store.read_checkpoint()
    tree = stored.tree
    arrays = {**arrays, **{f"last_{name}": np.asarray(getattr(tree, name)) for name in (
        "node_ids", "parent", "depth", "mass", "counts", "subtree_counts", "window_counts", "theta",
        "concentration", "born", "assignments", "died")}}
    # the latest chain's arrays only complete the checkpoint: a StoredTreeModel never samples
    meta = {**meta, "model": StoredTreeModel.__name__, "params": own["params"],
            "chain": {**meta["chain"], "hyper": own["chain"].get("hyper", {})},
            "last_epoch": int(tree.epoch), "last_label": tree.label}
    model = StoredTreeModel.from_checkpoint(arrays, meta, **overrides)
    model._not_kept = not_kept
    model.theta_error_ = stored.theta_error
    return model


__all__ = ["MODES", "REPLAY_SEED", "source_changes", "unfinished_note", "drop_unset_weighting", "row_form", "identity_differences", "identity_model", "same_identity", "settings_identity", "stored_identity", "record_week_origin", "theta_storage", "text_model_params", "text_vectorizer", "EpochFitter", "EpochProgress", "FittedEpoch", "QuietEpochs", "ReplayConfig", "ReplaySummary", "StoredTreeModel", "fit_vocabulary", "load_model",
           "open_epochs", "read_epochs", "replay", "stderr_progress"]
