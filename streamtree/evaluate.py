"""Held-out evaluation of the dTSSBP and its baselines: held-out log density and coherence.

Two protocols share the scoring code.

Protocol ``"documents"`` (the default)
--------------------------------------
The split is by *documents*, not by epochs, so that choosing kappa0 always rests on as many
documents as the final score, however skewed the stream is over time.

1. In every epoch the documents are drawn at random into training (80%), selection
   (``selection_fraction``, 10%) and test (``test_fraction``, 10%) documents. Counts are
   randomly rounded (``floor(f n + u)``, u uniform), so even epochs of one or two documents
   contribute their expected share, and every non-empty epoch keeps at least one training
   document. The vocabulary is fitted on the split's training documents of all epochs; rows
   left empty by it are dropped and counted.
2. Repeat ``r`` draws its own split *and* uses its own sampler seed (``seed + r``). Within a
   repeat every model and every kappa0 sees the same split and the same seed, so differences
   between models are *paired*.
3. For every kappa0 of the grid (models in which kappa0 plays no role run the estimator's
   default kappa0 only) the model is fitted on the training documents epoch by epoch; after
   each epoch its selection and test documents are scored under the epoch's tree.
4. Selection: kappa0 maximises the mean log density per selection document, pooled over all
   epochs and repeats. Grid values whose paired difference to the best is within
   ``tie_se`` standard errors (per-document differences) are tied with it, and among tied
   values the one closest (on a log scale) to the estimator's default kappa0 is chosen: a
   difference the selection cannot resolve never moves the choice away from the default.
5. The figure of a repeat is the mean log density per *test document*, pooled over all
   epochs: every document weighs the same, so an epoch weighs in proportion to its size.
   (Averaging per-epoch means instead would let a month with one test document count as
   much as one with five hundred, and the figure would estimate no quantity of the stream.)
   Tables give mean +- sd over repeats and each model's paired difference to a reference
   model (same splits, same seeds): mean +- sd over repeats, the standard error over
   documents, and in how many repeats the model is ahead.

Protocol ``"paper"`` (the dTSSBP paper's Table 1)
-------------------------------------------------
Per epoch a random 90/10 train/test split (one split for the whole run). The epochs are cut
at the middle: on the first half every kappa0 of the grid and ``restarts`` seeds are run and
the best (kappa0, seed) by mean held-out score over the first-half epochs is chosen; on the
second half ``repeats`` runs (seeds chosen + r) restart from the first epoch and are scored
on the second-half epochs only. A run's figure is the mean over scored epochs of the mean
per test document (each epoch weighs the same), as in the paper. On a stream whose early
epochs are small the selection then rests on a handful of documents: prefer the default.

Scores
------
After fitting epoch t, every held-out document x of epoch t is scored under the epoch's
predictive mixture (posterior-mean sticks pi_e, node parameters theta_e and concentrations
beta_e, plus the new-node terms):

* **log predictive density**: ``log sum_e pi_e f(x | theta_e, beta_e)``
  (``DTSSBP.score_samples(X, normalized=True)``); for the vMF a proper log density on the
  unit sphere. This selects kappa0 and is the reported figure.
* **unnormalised** score, the paper's (paper protocol only): the same with the family's
  normalising constants dropped (vMF: ``log sum_e pi_e exp(beta_e theta_e . x)``); not a
  density, and it favours large concentrations.
* **coherence**: mean NPMI (:mod:`streamtree.coherence`) of the top-10 words of each scored
  epoch's 20 largest nodes (by the epoch's own documents), with probabilities from the
  document co-occurrence of the split's training documents (the corpus itself).

Parallel runs
-------------
Every fit of a protocol (a model, depth, kappa0 and repeat or restart) is independent of the
others given its split and seed, so ``workers`` processes can run them side by side. Each
run keeps its seed and results are assembled in the same order whatever the worker count, so
the tables are the same to the bit. Workers are started with ``spawn`` (forking a process
that holds numba and BLAS thread pools is unsafe) and each receives only its run's split and
parameters. A model's ``seconds`` are the CPU seconds of its runs (``time.process_time`` in
the process that fits, all of its threads), the same quantity at any worker count (a fresh
worker's first runs also load the compiled kernels); given free cores, more workers shorten
the wall time of the evaluation, not its CPU time. A script that calls :func:`evaluate` with
more than one worker must guard its entry point with ``if __name__ == "__main__":`` (spawned
workers import the calling script).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import numbers
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from streamtree.variants import VARIANTS, resolve_variant
from streamtree.wording import counted

if TYPE_CHECKING:  # the CLI reads this module's defaults when it builds its parser: keep that import light
    import scipy.sparse as sp

    from streamtree.replay import ReplayConfig

PROTOCOLS = ("documents", "paper")
#: coherence: top words per node, largest nodes per epoch
N_TOP_WORDS = 10
N_TOP_NODES = 20


@dataclass
class EvaluationConfig:
    """Settings of :func:`evaluate` (see the module docstring).

    ``model`` holds the other keyword arguments of :class:`streamtree.model.DTSSBP` (likelihood,
    window, sweeps, engine, ...); the protocol sets ``variant``, ``max_depth``, ``kappa0`` and
    ``random_state`` of every run itself, and everything else takes the estimator's defaults.
    ``restarts`` is used by the paper protocol only; ``selection_fraction`` and ``tie_se`` by
    the documents protocol only. ``workers`` is the number of processes fitting runs side by
    side (``-1``: all CPUs, ``-2``: all but one); each run also uses the model's ``n_jobs``
    threads, so up to ``workers x n_jobs`` threads are busy. Results do not depend on it.
    More than one worker needs the local engine: the Ray engine already spreads each fit over
    its cluster.
    """

    protocol: str = "documents"
    variants: list[str] = field(default_factory=lambda: list(VARIANTS))
    depths: list[int] = field(default_factory=lambda: [3, 4])
    kappa0_grid: list[float] = field(default_factory=lambda: [1.0, 10.0, 100.0, 1000.0, 10000.0])
    restarts: int = 5
    repeats: int = 5
    seed: int = 0
    test_fraction: float = 0.1
    selection_fraction: float = 0.1
    tie_se: float = 2.0
    max_docs_per_epoch: int | None = None
    max_epochs: int | None = None
    model: dict = field(default_factory=dict)
    workers: int = 1

    def __post_init__(self) -> None:
        fixed = {"variant", "max_depth", "kappa0", "random_state"} & set(self.model)
        if fixed:
            raise ValueError(f"the protocol sets {', '.join(sorted(fixed))} itself; use variants, depths, "
                             "kappa0_grid and seed instead")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r}; choose one of {', '.join(PROTOCOLS)}")
        held = self.test_fraction + (self.selection_fraction if self.protocol == "documents" else 0.0)
        if not (0 < self.test_fraction < 1 and 0 < self.selection_fraction < 1 and held < 1):
            raise ValueError(f"test and selection fractions must be positive and leave training documents, "
                             f"got test {self.test_fraction}, selection {self.selection_fraction}")
        if self.repeats < 1 or self.restarts < 1:
            raise ValueError("repeats and restarts must be at least 1")
        if self.tie_se < 0:
            raise ValueError(f"tie_se must be >= 0, got {self.tie_se}")
        if not self.kappa0_grid or min(self.kappa0_grid) <= 0:
            raise ValueError(f"kappa0_grid must hold positive values, got {self.kappa0_grid}")
        if not isinstance(self.workers, numbers.Integral) or isinstance(self.workers, bool) or self.workers == 0:
            raise ValueError(f"workers must be a number of processes >= 1, or -1 for all CPUs (-2: all but one), "
                             f"got {self.workers!r}")
        engine = self.model_params()["engine"] if self.workers != 1 else "local"
        if engine != "local":
            # Each worker would start or join its own Ray runtime for runs the cluster already spreads.
            raise ValueError(f"workers={self.workers} fits runs in parallel local processes and needs the local "
                             f"engine, got engine={engine!r}; the Ray engine already spreads each fit over its "
                             "cluster: use workers=1 with it (--workers 1), or the local engine with more workers")

    def model_params(self) -> dict:
        """All DTSSBP keyword arguments shared by the protocol's runs."""
        from streamtree.model import DTSSBP

        return DTSSBP(**self.model).get_params(deep=False)

    def n_workers(self) -> int:
        """The number of worker processes ``workers`` stands for on this machine."""
        from joblib import effective_n_jobs

        return max(1, int(effective_n_jobs(self.workers)))


@dataclass
class SplitEpoch:
    index: int
    label: str
    X_train: sp.csr_matrix
    X_test: sp.csr_matrix
    X_select: sp.csr_matrix | None = None  # documents protocol only


@dataclass
class SplitData:
    epochs: list[SplitEpoch]
    vocabulary_size: int
    n_dropped_train: int
    n_dropped_test: int
    protocol: str = "paper"
    repeat: int = 0
    n_dropped_select: int = 0
    #: rows that repeated an earlier row's text in their epoch (left out under
    #: ``duplicate_texts`` ``"reject"`` or ``"collapse"``, which fit each text once; under
    #: ``"keep"`` those among the rows drawn, split like any other)
    n_repeated_texts: int = 0
    repeats_left_out: bool = False
    #: source rows rejected before any split (empty text, bad time, repeated id...), by reason
    #: (without the offending values), over the whole source: reported, never silently gone
    source_rejects: dict[str, int] = field(default_factory=dict)

    @property
    def middle(self) -> int:
        """Index (into ``epochs``) of the first second-half epoch (paper protocol)."""
        return len(self.epochs) // 2

    def n_docs(self, part: str, epochs: range | None = None) -> int:
        """Documents of ``part`` ("train", "select", "test") over ``epochs`` (default all)."""
        eps = self.epochs if epochs is None else self.epochs[epochs.start:epochs.stop]
        mats = [getattr(e, "X_" + part) for e in eps]
        return sum(m.shape[0] for m in mats if m is not None)

    def reference(self) -> sp.csr_matrix:
        """The split's training documents of all epochs: the coherence reference corpus."""
        import scipy.sparse as sp

        return sp.vstack([e.X_train for e in self.epochs], format="csr")


@dataclass
class RunScores:
    """Held-out scores of one fitted run, per scored epoch (empty arrays for none)."""

    select: list[np.ndarray]
    test: list[np.ndarray]
    test_unnormalized: list[np.ndarray]
    npmi: list[np.ndarray]  # NPMI of each scored epoch's largest nodes

    def pooled(self, part: str) -> np.ndarray:
        arrays = getattr(self, part)
        return np.concatenate(arrays) if arrays else np.zeros(0)

    def epoch_mean(self, part: str) -> float:
        """Mean over epochs of the mean per document (the paper's figure)."""
        return float(np.mean([a.mean() for a in getattr(self, part) if a.size]))


@dataclass
class SelectionRow:
    """One grid value of a model's kappa0 selection (documents protocol)."""

    kappa0: float
    mean: float  # mean log density per selection document, pooled over repeats
    sd: float  # sd over repeats of the per-repeat mean
    diff: float  # paired difference to the best value (0 for the best)
    se: float  # its standard error over documents
    tied: bool  # within tie_se standard errors of the best


@dataclass
class ModelResult:
    variant: str
    depth: int
    kappa0: float
    seed: int
    selection: dict[tuple[float, int], float]  # (kappa0, seed) -> selection score of that run
    normalized: np.ndarray  # one figure per repeat
    unnormalized: np.ndarray
    seconds: float  # CPU seconds of the model's runs, any worker count (0 where a DP model reuses runs)
    doc_scores: list[np.ndarray] = field(default_factory=list)  # per repeat: every scored test document
    npmi: np.ndarray = field(default_factory=lambda: np.zeros(0))  # one figure per repeat
    selection_rows: list[SelectionRow] = field(default_factory=list)


@dataclass
class PairedDifference:
    """``model - reference`` on the same splits and seeds."""

    variant: str
    depth: int
    reference: str
    per_repeat: np.ndarray  # difference of the per-repeat figures
    se_documents: float  # standard error of the mean per-document difference (pooled repeats)

    @property
    def mean(self) -> float:
        return float(self.per_repeat.mean())

    @property
    def sd(self) -> float:
        return float(np.std(self.per_repeat, ddof=1)) if self.per_repeat.size > 1 else math.nan

    @property
    def wins(self) -> int:
        return int(np.sum(self.per_repeat > 0))


# ----------------------------------------------------------------------------- splitting
def read_evaluation_epochs(config: ReplayConfig, ev: EvaluationConfig,
                           on_epochs: Callable[[int, tuple[int, int] | None, str | None], None] | None = None
                           ) -> list:
    """Read and bucket the source once; the splits are drawn from these epochs.

    ``on_epochs``, if given, is called once the source is bucketed (before ``ev.max_epochs``
    leaves any out) with the number of epochs, the earliest and latest time of the rows kept
    (microseconds since 1970; None without times) and what those times are dated to
    (:func:`streamtree.epochs.time_resolution`), as a replay's summary reports them: e.g. to
    say at once that the epochs are too few to show evolution.
    """
    import pyarrow as pa

    from streamtree.replay import open_epochs

    reader, _ = open_epochs(config)
    with reader:
        epochs = list(reader.epochs())
    if on_epochs is not None:
        on_epochs(len(epochs), reader.time_span_us, reader.time_resolution)
    if ev.max_epochs is not None and len(epochs) > ev.max_epochs:
        # the source's rejects are reported whole: those filed with the epochs left out go with
        # the last one kept (where they are counted, not fitted)
        kept, rest = epochs[: ev.max_epochs], epochs[ev.max_epochs:]
        last = kept[-1]
        tail = [e.rejects for e in rest if e.rejects.num_rows]
        if tail:
            kept[-1] = dataclasses.replace(last, rejects=pa.concat_tables([last.rejects, *tail]))
        epochs = kept
    return epochs


def _random_round(x: float, rng: np.random.Generator) -> int:
    return int(math.floor(x + rng.random()))


def split_epochs(epochs: list, config: ReplayConfig, ev: EvaluationConfig, repeat: int = 0) -> SplitData:
    """Subsample and split every epoch's documents; fit the vocabulary on the training part.

    The documents protocol draws a new split for every ``repeat``; the paper protocol has one
    split (``repeat`` is ignored).
    """
    import pyarrow as pa
    import scipy.sparse as sp

    from streamtree.records import DUPLICATE_TEXT, RejectLog

    documents = ev.protocol == "documents"
    key = [ev.seed, repeat, 7] if documents else [ev.seed, 7]
    rng = np.random.default_rng(np.random.SeedSequence(key))
    empty = pa.array([], pa.string())
    parts = []
    n_repeated = 0
    source_rejects = RejectLog()  # counted by reason, without the offending values
    for ep in epochs:
        source_rejects.add(ep.rejects)
        repeated = ep.repeated_texts()
        if config.duplicate_texts != "keep":  # each text is fitted once: a copy is neither trained nor held out
            ep = ep.reject(repeated, DUPLICATE_TEXT)
            n_repeated += int(repeated.sum())
        order = rng.permutation(ep.n_rows)
        if ev.max_docs_per_epoch is not None:
            order = order[: ev.max_docs_per_epoch]
        if config.duplicate_texts == "keep":
            n_repeated += int(repeated[order].sum())  # those among the rows drawn
        m = order.size
        if documents:
            n_test = _random_round(ev.test_fraction * m, rng)
            n_sel = _random_round(ev.selection_fraction * m, rng)
            while m and n_test + n_sel > m - 1:  # keep one training document
                if n_sel >= n_test:
                    n_sel -= 1
                else:
                    n_test -= 1
        else:
            n_sel = 0
            n_test = int(round(ev.test_fraction * m)) if m >= 2 else 0
            n_test = min(max(n_test, 1 if m >= 2 else 0), m - 1) if m else 0
        texts = ep.rows.column("text")

        def take(idx: np.ndarray):
            return texts.take(pa.array(np.sort(idx))) if idx.size else empty

        parts.append((ep, take(order[n_test + n_sel:]), take(order[n_test:n_test + n_sel]), take(order[:n_test])))
    train_all = [c for _, tr, _, _ in parts for c in (tr.chunks if isinstance(tr, pa.ChunkedArray) else [tr])]
    if not any(len(c) for c in train_all):
        raise ValueError(f"{config.source}: no documents to evaluate on")
    from streamtree.likelihoods import LIKELIHOODS, TEXT_LIKELIHOODS

    likelihood = ev.model_params()["likelihood"]
    if likelihood not in TEXT_LIKELIHOODS:
        raise ValueError(f"likelihood {likelihood!r} does not model text; choose one of {', '.join(TEXT_LIKELIHOODS)}")
    vec = config.vectorizer().set_params(norm=LIKELIHOODS[likelihood].text_norm)
    vec.fit(pa.chunked_array(train_all, pa.string()))
    p = vec.vocabulary_.shape[0]
    dropped = {"train": 0, "select": 0, "test": 0}

    def matrix(texts, part: str) -> sp.csr_matrix:
        if not len(texts):
            return sp.csr_matrix((0, p))
        X = vec.transform(texts)
        rows_empty = vec.empty_rows(X)
        dropped[part] += int(rows_empty.sum())
        return X[~rows_empty]

    out: list[SplitEpoch] = []
    for ep, train, select, test in parts:
        Xtr, Xsel, Xte = matrix(train, "train"), matrix(select, "select"), matrix(test, "test")
        if not out and Xtr.shape[0] == 0:
            dropped["select"] += Xsel.shape[0]
            dropped["test"] += Xte.shape[0]
            continue  # the model's first epoch needs documents
        out.append(SplitEpoch(ep.index, ep.label, Xtr, Xte, Xsel if documents else None))
    data = SplitData(out, p, dropped["train"], dropped["test"], ev.protocol, repeat, dropped["select"], n_repeated,
                     config.duplicate_texts != "keep", dict(source_rejects.counts.most_common()))
    if documents:
        n_sel, n_test = data.n_docs("select"), data.n_docs("test")
        if n_sel < 2 or n_test < 2:
            raise ValueError(f"{config.source}: evaluation needs at least 2 selection and 2 test documents, "
                             f"found {n_sel} and {n_test}; use more data or larger --test-fraction/"
                             "--selection-fraction")
    else:
        # kappa0 is chosen on the first half's test documents and the second half's are scored:
        # each half needs some, or the choice is arbitrary or the figures empty
        halves = (data.epochs[:data.middle], data.epochs[data.middle:])
        scored = [sum(1 for e in half if e.X_test.shape[0]) for half in halves]
        if len(out) < 2:
            raise ValueError(f"{config.source}: evaluation needs at least 2 epochs with documents, found "
                             f"{len(out)}; use a finer --epoch or more data")
        if min(scored) < 1:
            raise ValueError(f"{config.source}: the paper protocol chooses kappa0 on the first half of the epochs "
                             f"and scores the second half, so each half needs an epoch with test documents; "
                             f"found {scored[0]} of {len(halves[0])} and {scored[1]} of {len(halves[1])}; use a "
                             "finer --epoch, more data or --protocol documents")
    return data


def load_split_epochs(config: ReplayConfig, ev: EvaluationConfig, repeat: int = 0) -> SplitData:
    """Read the source and draw the split of ``repeat`` (see :func:`split_epochs`)."""
    return split_epochs(read_evaluation_epochs(config, ev), config, ev, repeat)


# ----------------------------------------------------------------------------- runs
def _variant_config(variant: str, depth: int, params: dict | None = None):
    from streamtree.model import DTSSBP

    p = params or DTSSBP().get_params(deep=False)
    return resolve_variant(variant, window=p["window"], max_depth=depth, gamma=p["gamma"], xi=p["xi"])


def kappa0_matters(variant: str, depth: int) -> bool:
    """Whether kappa0 enters the model (a parent link, or a time link of depth-rule strength)."""
    c = _variant_config(variant, depth)
    return c.parent_link or (c.time_link and c.time_kappa is None)


def largest_nodes_npmi(tree, reference: sp.csr_matrix) -> np.ndarray:
    """NPMI of the top words of the tree's largest nodes (by the epoch's own documents)."""
    from streamtree.coherence import topic_npmi

    order = np.argsort(-tree.counts, kind="stable")
    order = order[tree.counts[order] > 0][:N_TOP_NODES]
    if order.size == 0:
        return np.zeros(0)
    top = np.argsort(-tree.theta[order], axis=1, kind="stable")[:, :N_TOP_WORDS]
    return topic_npmi(top, reference)


def run_model(data: SplitData, params: dict, scored: range, reference: sp.csr_matrix | None = None) -> RunScores:
    """Fit all epochs up to the last scored one and score the held-out documents of ``scored``.

    ``reference`` (documents x terms) enables the coherence of every scored epoch's tree.
    """
    from streamtree.model import DTSSBP

    out = RunScores([], [], [], [])
    with DTSSBP(**params) as model:
        for i, ep in enumerate(data.epochs[: scored.stop]):
            model.partial_fit(ep.X_train, epoch=ep.index, label=ep.label)
            if i not in scored:
                continue
            if ep.X_select is not None and ep.X_select.shape[0]:
                out.select.append(model.score_samples(ep.X_select, normalized=True))
            if ep.X_test.shape[0]:
                out.test.append(model.score_samples(ep.X_test, normalized=True))
                out.test_unnormalized.append(model.score_samples(ep.X_test, normalized=False))
            if reference is not None:
                out.npmi.append(largest_nodes_npmi(model.trees_[-1], reference))
    return out


# ----------------------------------------------------------------------------- runs in parallel
class EvaluationRunError(RuntimeError):
    """A run of the protocol failed: the message names the run, ``__cause__`` is the error
    (from a worker process, with the worker's traceback chained to it)."""


@dataclass
class _Run:
    """One fit of a protocol: what its process needs, where its result goes and its name."""

    order: tuple  # its place in the one-process schedule: pending runs are dispatched in this order
    key: tuple
    name: str  # e.g. "dtssbp depth 3, kappa0=10, repeat 1": for progress lines and errors
    data: SplitData
    params: dict
    scored: range
    coherence: bool  # score the NPMI of the scored epochs' trees (reference: the split's training documents)

    def payload(self) -> tuple:
        """The arguments of :func:`_fit_run`: runs scoring no coherence get the epochs they fit only."""
        data = self.data
        if not self.coherence and self.scored.stop < len(data.epochs):
            data = dataclasses.replace(data, epochs=data.epochs[: self.scored.stop])
        return data, self.params, self.scored, self.coherence


def _checked(params: dict) -> dict:
    """``params``, validated here, so that a bad setting fails before any run starts."""
    from streamtree.model import DTSSBP

    DTSSBP(**params)._check_params()
    return params


def _fit_run(data: SplitData, params: dict, scored: range, coherence: bool) -> tuple[RunScores, float]:
    """A run, in the process that fits it: its scores and CPU seconds (all of its threads)."""
    reference = data.reference() if coherence else None
    t0 = time.process_time()
    scores = run_model(data, params, scored, reference)
    return scores, time.process_time() - t0


def _ignore_interrupts() -> None:
    # Ctrl-C reaches the whole process group; the parent alone decides to stop, and ends its workers.
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _RunPool:
    """Runs :class:`_Run` objects in ``workers`` processes (in this process for one worker),
    dispatching pending runs in their ``order`` and yielding each run as it finishes. Leaving
    the ``with`` block on an error or an interrupt ends the workers at once."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pending: list[tuple[tuple, _Run]] = []
        self._executor = None

    def add(self, run: _Run) -> None:
        heapq.heappush(self._pending, (run.order, run))  # orders are unique: runs are never compared

    def __enter__(self) -> _RunPool:
        if self.workers > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn: forking a process that holds numba's and BLAS's thread pools is unsafe
            self._executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_ignore_interrupts)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._executor is None:
            return
        if exc_type is not None:  # do not wait for runs that may take many minutes
            terminate = getattr(self._executor, "terminate_workers", None)  # Python >= 3.14
            if terminate is not None:
                terminate()
            else:
                for process in list((getattr(self._executor, "_processes", None) or {}).values()):
                    process.terminate()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._executor = None

    def finished(self) -> Iterator[tuple[_Run, RunScores, float]]:
        """(run, scores, CPU seconds) of every run as it finishes, until none is pending (runs
        added meanwhile included)."""
        from concurrent.futures import FIRST_COMPLETED, wait
        from concurrent.futures.process import BrokenProcessPool

        running: dict = {}
        while self._pending or running:
            if self._executor is None:
                _, run = heapq.heappop(self._pending)
                try:
                    scores, seconds = _fit_run(*run.payload())
                except Exception as exc:
                    raise EvaluationRunError(f"evaluation run {run.name} failed: {type(exc).__name__}: {exc}") from exc
                yield run, scores, seconds
                continue
            while self._pending and len(running) < self.workers:
                _, run = heapq.heappop(self._pending)
                running[self._executor.submit(_fit_run, *run.payload())] = run
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: running[f].order):
                run = running.pop(future)
                try:
                    scores, seconds = future.result()
                except BrokenProcessPool as exc:
                    raise EvaluationRunError(
                        f"evaluation run {run.name} failed: its worker process ended abruptly (killed, out of "
                        "memory, or a calling script that starts workers without an `if __name__ == "
                        "'__main__':` guard); rerun with fewer workers, or workers=1 to run in this process"
                    ) from exc
                except Exception as exc:
                    raise EvaluationRunError(f"evaluation run {run.name} failed in its worker process: "
                                             f"{type(exc).__name__}: {exc}") from exc
                yield run, scores, seconds


def _positive_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) and value > 0


def choose_kappa0(select: dict[float, list[np.ndarray]], default, tie_se: float) -> tuple[float, list[SelectionRow]]:
    """The documents protocol's selection (module docstring, step 4).

    ``select[k0][r]`` holds the per-document selection scores of repeat ``r``; the documents
    are the same for every ``k0`` of a repeat, so differences are paired document by document.
    ``default`` is the estimator's kappa0; if it is not a number (a rule rather than a value),
    ties are not broken toward it and the best mean wins.
    """
    if not _positive_number(default):
        tie_se = 0.0
        default = 1.0
    pooled = {k: np.concatenate(v) for k, v in select.items()}
    means = {k: float(s.mean()) for k, s in pooled.items()}
    best = max(means, key=lambda k: (means[k], -abs(math.log(k / default))))
    rows = []
    for k in sorted(pooled):
        d = pooled[k] - pooled[best]
        se = float(np.std(d, ddof=1) / math.sqrt(d.size)) if d.size > 1 else 0.0
        per_repeat = np.array([s.mean() for s in select[k]])
        sd = float(np.std(per_repeat, ddof=1)) if per_repeat.size > 1 else math.nan
        rows.append(SelectionRow(k, means[k], sd, float(d.mean()), se, k == best or d.mean() >= -tie_se * se))
    tied = [r.kappa0 for r in rows if r.tied]
    chosen = min(tied, key=lambda k: (abs(math.log(k / default)), k))
    return chosen, rows


def _evaluate_documents(splits: list[SplitData], ev: EvaluationConfig,
                        log: Callable[[str], None] | None) -> list[ModelResult]:
    shared = ev.model_params()
    default_k0 = shared["kappa0"]
    models: list[tuple[str, int]] = [(v, d) for v in ev.variants for d in ev.depths]
    canonical: dict[tuple[str, int], tuple[str, int]] = {}  # DP models are one level deep at any depth
    first_of: dict[tuple[str, int | None], tuple[str, int]] = {}
    for v, d in models:
        canonical[(v, d)] = first_of.setdefault((v, _variant_config(v, d, shared).max_depth), (v, d))
    schedule: list[_Run] = []
    for r, data in enumerate(splits):
        seed = ev.seed + r
        for i, m in enumerate(models):
            if canonical[m] != m:
                continue
            v, d = m
            grid = ev.kappa0_grid if kappa0_matters(v, d) else [default_k0]
            for j, k0 in enumerate(grid):
                params = _checked(dict(shared, variant=v, max_depth=d, kappa0=k0, random_state=seed))
                schedule.append(_Run((r, i, j), (m, k0, r), f"{v} depth {d}, kappa0={_k(k0)}, repeat {r}", data,
                                     params, range(len(data.epochs)), True))
    finished: dict[tuple, RunScores] = {}
    seconds: dict[tuple[str, int], float] = dict.fromkeys(models, 0.0)
    with _RunPool(min(ev.n_workers(), len(schedule))) as pool:
        for run in schedule:
            pool.add(run)
        for n, (run, res, cpu) in enumerate(pool.finished(), 1):
            m, k0, r = run.key
            finished[run.key] = res
            seconds[m] += cpu
            if log:
                log(f"[{n}/{len(schedule)}] {m[0]} depth {m[1]} repeat {r}: kappa0={_k(k0)} selection "
                    f"{res.pooled('select').mean():.4g} test {res.pooled('test').mean():.4g} per document "
                    f"({cpu:.1f}s CPU)")
    runs: dict[tuple[str, int], dict[tuple[float, int], RunScores]] = {}
    for run in schedule:  # in the schedule's order, whatever order the runs finished in
        m, k0, r = run.key
        runs.setdefault(m, {})[(k0, r)] = finished[run.key]
    results = []
    for m in models:
        v, d = m
        c = canonical[m]
        mruns = runs[c]
        grid = list(dict.fromkeys(k for k, _ in mruns))
        select = {k: [mruns[(k, r)].pooled("select") for r in range(len(splits))] for k in grid}
        if len(grid) > 1:
            k0, rows = choose_kappa0(select, default_k0, ev.tie_se)
        else:  # kappa0 plays no role, or a one-value grid: nothing to choose
            k0, rows = grid[0], []
        chosen = [mruns[(k0, r)] for r in range(len(splits))]
        docs = [s.pooled("test") for s in chosen]
        results.append(ModelResult(
            v, d, k0, ev.seed, {(k, ev.seed + r): float(s.pooled("select").mean()) for (k, r), s in mruns.items()},
            np.array([x.mean() for x in docs]), np.array([s.pooled("test_unnormalized").mean() for s in chosen]),
            seconds[c] if c == m else 0.0, docs, np.array([s.pooled("npmi").mean() for s in chosen]), rows))
    return results


def _evaluate_paper(data: SplitData, ev: EvaluationConfig,
                    log: Callable[[str], None] | None) -> list[ModelResult]:
    first, second = range(0, data.middle), range(data.middle, len(data.epochs))
    shared = ev.model_params()
    models: list[tuple[str, int]] = [(v, d) for v in ev.variants for d in ev.depths]
    canonical: dict[tuple[str, int], tuple[str, int]] = {}  # DP models are one level deep at any depth
    first_of: dict[tuple[str, int | None], tuple[str, int]] = {}
    for v, d in models:
        canonical[(v, d)] = first_of.setdefault((v, _variant_config(v, d, shared).max_depth), (v, d))
    fitted = [m for m in models if canonical[m] == m]
    grids = {m: ev.kappa0_grid if kappa0_matters(*m) else ev.kappa0_grid[:1] for m in fitted}
    selection_runs: dict[tuple[str, int], list[_Run]] = {}
    for i, m in enumerate(fitted):
        v, d = m
        selection_runs[m] = [
            _Run((i, 0, j, r), (m, "select", k0, ev.seed + r), f"{v} depth {d}, kappa0={_k(k0)}, seed "
                 f"{ev.seed + r} (first-half selection)", data,
                 _checked(dict(shared, variant=v, max_depth=d, kappa0=k0, random_state=ev.seed + r)), first, False)
            for j, k0 in enumerate(grids[m]) for r in range(ev.restarts)]
    n_runs = sum(len(s) for s in selection_runs.values()) + len(fitted) * ev.repeats
    selection: dict[tuple[str, int], dict[tuple[float, int], float]] = {}
    best: dict[tuple[str, int], tuple[float, int]] = {}
    scores: dict[tuple, RunScores] = {}
    seconds: dict[tuple[str, int], float] = dict.fromkeys(fitted, 0.0)
    with _RunPool(min(ev.n_workers(), n_runs)) as pool:
        for runs in selection_runs.values():
            for run in runs:
                pool.add(run)
        for n, (run, res, cpu) in enumerate(pool.finished(), 1):
            m, part, k0, index = run.key  # index: the seed of a selection run, the number of a repeat
            v, d = m
            scores[run.key] = res
            seconds[m] += cpu
            if part == "select":
                if log:
                    log(f"[{n}/{n_runs}] {v} depth {d}: kappa0={k0:g} seed={index} first half "
                        f"{res.epoch_mean('test'):.4g} ({cpu:.1f}s CPU)")
                if all(s.key in scores for s in selection_runs[m]):  # the model's selection is complete
                    # in the schedule's order, so that ties resolve as in one process
                    selection[m] = {s.key[2:]: scores[s.key].epoch_mean("test") for s in selection_runs[m]}
                    (k0, seed), _ = max(selection[m].items(), key=lambda kv: (kv[1], -kv[0][1]))
                    best[m] = (k0, seed)
                    i = fitted.index(m)
                    for j in range(ev.repeats):
                        pool.add(_Run((i, 1, j), (m, "repeat", k0, j), f"{v} depth {d}, kappa0={_k(k0)}, repeat {j} "
                                      f"(seed {seed + j}, second half)", data,
                                      dict(shared, variant=v, max_depth=d, kappa0=k0, random_state=seed + j),
                                      second, True))
            elif log:
                log(f"[{n}/{n_runs}] {v} depth {d}: kappa0={k0:g} repeat {index} second half "
                    f"{res.epoch_mean('test'):.4g} (unnormalised {res.epoch_mean('test_unnormalized'):.4g}) "
                    f"({cpu:.1f}s CPU)")
    results: list[ModelResult] = []
    done: dict[tuple[str, int], ModelResult] = {}
    for m in models:
        v, d = m
        c = canonical[m]
        if c in done:  # DP models are one level deep at any depth: the same runs
            old = done[c]
            results.append(ModelResult(v, d, old.kappa0, old.seed, old.selection, old.normalized,
                                       old.unnormalized, 0.0, old.doc_scores, old.npmi))
            continue
        k0, seed = best[m]
        repeats = [scores[(m, "repeat", k0, j)] for j in range(ev.repeats)]
        res = ModelResult(v, d, k0, seed, selection[m], np.array([s.epoch_mean("test") for s in repeats]),
                          np.array([s.epoch_mean("test_unnormalized") for s in repeats]), seconds[m],
                          [s.pooled("test") for s in repeats], np.array([float(s.pooled("npmi").mean())
                                                                         for s in repeats]))
        done[c] = res
        results.append(res)
    return results


def evaluate(data: SplitData | list[SplitData], ev: EvaluationConfig,
             log: Callable[[str], None] | None = None) -> list[ModelResult]:
    """Run the protocol for every variant and depth (see the module docstring).

    ``data``: for the documents protocol one split per repeat (:func:`split_epochs` with
    ``repeat = 0, 1, ...``); for the paper protocol the one split.
    """
    splits = data if isinstance(data, list) else [data]
    if ev.protocol == "paper":
        if len(splits) != 1:
            raise ValueError("the paper protocol uses one split; pass one SplitData")
        return _evaluate_paper(splits[0], ev, log)
    if len(splits) != ev.repeats or [s.repeat for s in splits] != list(range(ev.repeats)):
        raise ValueError(f"the documents protocol needs the splits of repeats 0..{ev.repeats - 1}, one per repeat")
    return _evaluate_documents(splits, ev, log)


def load_and_evaluate(config: ReplayConfig, ev: EvaluationConfig, log: Callable[[str], None] | None = None,
                      on_epochs: Callable[[int, tuple[int, int] | None, str | None], None] | None = None
                      ) -> tuple[list[ModelResult], list[SplitData]]:
    """Read the source once, draw the protocol's split(s) and run it (``on_epochs``: see
    :func:`read_evaluation_epochs`)."""
    epochs = read_evaluation_epochs(config, ev, on_epochs)
    n_splits = ev.repeats if ev.protocol == "documents" else 1
    splits = [split_epochs(epochs, config, ev, r) for r in range(n_splits)]
    return evaluate(splits if ev.protocol == "documents" else splits[0], ev, log), splits


# ----------------------------------------------------------------------------- reporting
def paired_differences(results: list[ModelResult], reference: str | None = None) -> list[PairedDifference]:
    """Every model minus the reference model at the same depth (default: the first variant).

    Figures are paired by repeat: in the documents protocol the same split and seed, in the
    paper protocol the same test documents (the seeds follow each model's chosen restart).
    """
    if not results:
        return []
    reference = reference or results[0].variant
    by = {(r.variant, r.depth): r for r in results}
    out = []
    for r in results:
        ref = by.get((reference, r.depth))
        if ref is None or r.variant == reference:
            continue
        per_doc = np.concatenate([a - b for a, b in zip(r.doc_scores, ref.doc_scores)]) if r.doc_scores else np.zeros(0)
        se = float(np.std(per_doc, ddof=1) / math.sqrt(per_doc.size)) if per_doc.size > 1 else math.nan
        out.append(PairedDifference(r.variant, r.depth, reference, r.normalized - ref.normalized, se))
    return out


def _k(value) -> str:
    """A kappa0 for printing: a number, or the estimator's rule if it is not one."""
    return f"{value:g}" if _positive_number(value) else str(value)


def _cell(values: np.ndarray, digits: int = 2) -> str:
    if values.size > 1:
        return f"{np.mean(values):.{digits}f} +- {np.std(values, ddof=1):.{digits}f}"
    return f"{np.mean(values):.{digits}f}"


def _document_model(params: dict) -> str:
    """How the report names the fitted document model, for a family that has one."""
    from streamtree.likelihoods import LIKELIHOODS

    family = LIKELIHOODS.get(params["likelihood"])
    if family is None or "document_concentration" not in family.params:
        return ""
    setting = params.get("document_concentration")
    return (" (independent tokens)" if setting is None
            else f" (bursty documents, document_concentration={setting})")


def repeated_texts_line(data: SplitData) -> str:
    """What the split did with the rows repeating an earlier row's text in their epoch; with
    advice when they are :data:`~streamtree.replay.REPEATED_TEXTS_WARNING` of the split's
    documents or more (as a replay's summary)."""
    from streamtree.replay import REPEATED_TEXTS_WARNING

    said = f"{data.n_repeated_texts} rows repeat the text of an earlier row of their epoch"
    if data.repeats_left_out:
        return f"{said}: left out, each text fitted and scored once (--duplicate-texts reject or collapse)."
    n = sum(data.n_docs(p) for p in ("train", "select", "test"))
    if data.n_repeated_texts < REPEATED_TEXTS_WARNING * n:
        return f"{said}, split like any other document."
    return (f"{said}: split like any other document, so a copy held out with its twin in training makes the "
            "held-out score optimistic, most for models that fit single documents; --duplicate-texts collapse "
            "(or reject) leaves them out.")


def describe_split(data: SplitData | list[SplitData], ev: EvaluationConfig) -> tuple[list[str], str]:
    """The lines that say what was evaluated (protocol, documents, vocabulary, what was left out
    and why) and the title of the score, for :func:`format_results`."""
    splits = data if isinstance(data, list) else [data]
    first = splits[0]
    params = ev.model_params()
    n_ep = len(first.epochs)
    if ev.protocol == "documents":
        n_sel = [s.n_docs("select") for s in splits]
        n_test = [s.n_docs("test") for s in splits]
        head = [
            f"protocol: documents. {counted(n_ep, 'epoch')} ({first.epochs[0].label} .. {first.epochs[-1].label}); "
            f"in every epoch {1 - ev.test_fraction - ev.selection_fraction:.0%} training, "
            f"{ev.selection_fraction:.0%} selection and {ev.test_fraction:.0%} test documents, drawn anew for "
            f"each of {counted(ev.repeats, 'repeat')} (repeat r: its own split and sampler seed {ev.seed} + r, "
            "shared by every model).",
            f"selection documents per repeat: {min(n_sel)}-{max(n_sel)}; test documents per repeat: "
            f"{min(n_test)}-{max(n_test)}; vocabulary {min(s.vocabulary_size for s in splits)}-"
            f"{max(s.vocabulary_size for s in splits)} terms (fitted on each split's training documents).",
            f"dropped as empty after vocabulary filtering (all repeats): "
            f"{sum(s.n_dropped_train for s in splits)} training, {sum(s.n_dropped_select for s in splits)} "
            f"selection, {sum(s.n_dropped_test for s in splits)} test documents.",
        ]
        score_title = ("log density per test document: mean over all test documents (epochs weigh by their "
                       "size), mean +- sd over repeats")
    else:
        n_test_2 = first.n_docs("test", range(first.middle, n_ep))
        head = [
            f"protocol: paper. {counted(n_ep, 'epoch')} ({first.epochs[0].label} .. {first.epochs[-1].label}); "
            "kappa0 and "
            f"restart chosen on the first {counted(first.middle, 'epoch')} "
            f"({counted(first.n_docs('test', range(0, first.middle)), 'test document')}), scored on the last "
            f"{n_ep - first.middle} ({counted(n_test_2, 'test document')}); "
            f"{counted(ev.repeats, 'repeat')} (seeds vary, the split does not).",
            f"vocabulary {counted(first.vocabulary_size, 'term')}; dropped as empty after vocabulary filtering: "
            f"{first.n_dropped_train} training, {first.n_dropped_test} test documents.",
        ]
        score_title = ("log density per test document: mean over epochs of the epoch's mean (each epoch "
                       "weighs the same, as in the paper), mean +- sd over repeats")
    if first.source_rejects:
        head.append(f"source rows rejected before the split: {sum(first.source_rejects.values())} ("
                    + ", ".join(f"{reason}: {n}" for reason, n in first.source_rejects.items()) + ").")
    if first.n_repeated_texts:
        head.append(repeated_texts_line(first))
    head.append(f"{params['likelihood']} likelihood{_document_model(params)}, "
                f"{counted(params['n_sweeps'], 'sweep')}/epoch, "
                f"window {params['window']}.")
    return head, score_title


def format_results(results: list[ModelResult], data: SplitData | list[SplitData], ev: EvaluationConfig) -> str:
    """One row per model and depth: log density per test document, coherence, paired differences."""
    head, score_title = describe_split(data, ev)
    lines = head + ["", f"Held-out {score_title}; NPMI: mean coherence of the top-{N_TOP_WORDS} words of each "
                        f"scored epoch's {N_TOP_NODES} largest nodes, from the training documents' "
                        "co-occurrence (higher is better for both):"]
    cells = [(r, _cell(r.normalized), _cell(r.npmi, 3) if r.npmi.size else "-",
              _cell(r.unnormalized) if ev.protocol == "paper" else None) for r in results]
    w1 = max(len("log density/doc"), *(len(c[1]) for c in cells)) + 2
    w2 = max(len("NPMI"), *(len(c[2]) for c in cells)) + 2
    header = f"{'model':<9}{'depth':>6}{'kappa0':>9}{'log density/doc':>{w1}}{'NPMI':>{w2}}"
    if ev.protocol == "paper":
        w3 = max(len("unnormalised (paper)"), *(len(c[3]) for c in cells)) + 2
        header += f"{'unnormalised (paper)':>{w3}}"
    lines.append(header)
    for r, c1, c2, c3 in cells:
        row = f"{r.variant:<9}{r.depth:>6}{_k(r.kappa0):>9}{c1:>{w1}}{c2:>{w2}}"
        if c3 is not None:
            row += f"{c3:>{w3}}"
        lines.append(row)
    if ev.protocol == "paper":
        lines.append("unnormalised: the paper's score, the likelihood's normalising constants dropped "
                     "(vMF: log sum_e pi_e exp(beta_e theta_e.x)); not a density.")

    diffs = paired_differences(results)
    if diffs:
        pairing = "same split and seed" if ev.protocol == "documents" else "same test documents"
        lines += ["", f"Paired differences in log density per test document, model - {diffs[0].reference} "
                      f"at the same depth ({pairing} per repeat): mean +- sd over repeats, standard error over "
                      "documents, repeats ahead:"]
        for p in diffs:
            sd = f" +- {p.sd:.2f}" if p.per_repeat.size > 1 else ""
            lines.append(f"  {p.variant:<9} depth {p.depth}: {p.mean:+.2f}{sd} (SE {p.se_documents:.2f}), "
                         f"ahead in {p.wins}/{p.per_repeat.size}")

    lines += ["", "kappa0 selection (and the CPU time of each model's runs):" if ev.protocol == "documents"
              else "chosen kappa0 (seed), CPU time of the model's runs:"]
    for r in results:
        note = "" if kappa0_matters(r.variant, r.depth) else " (kappa0 plays no role)"
        if ev.protocol == "paper":
            lines.append(f"  {r.variant} depth {r.depth}: kappa0={_k(r.kappa0)} (seed {r.seed}){note}, {r.seconds:.1f}s CPU")
            continue
        if len(r.selection_rows) <= 1:
            what = "the estimator's default" if note else "the only grid value"
            lines.append(f"  {r.variant} depth {r.depth}: kappa0={_k(r.kappa0)}, {what}{note}, {r.seconds:.1f}s CPU")
            continue
        cells_sel = "; ".join(
            f"{s.kappa0:g}: {s.mean:.2f}" + (f" +- {s.sd:.2f}" if not math.isnan(s.sd) else "")
            + (" (best)" if s.diff == 0 and s.tied else f" ({s.diff:+.2f}, SE {s.se:.2f}{', tied' if s.tied else ''})")
            for s in r.selection_rows)
        lines.append(f"  {r.variant} depth {r.depth}: chose {_k(r.kappa0)}, {r.seconds:.1f}s CPU. {cells_sel}")
    if ev.protocol == "documents":
        lines.append(f"  (mean selection log density per document +- sd over repeats; in brackets the paired "
                     f"difference to the best; values within {ev.tie_se:g} SE of the best are tied, and the "
                     f"tied value closest to the default kappa0 {_k(ev.model_params()['kappa0'])} is chosen)")
    lines.append("DP models (ddp, o-dp, t-dp) are one level deep whatever the depth column (the same runs).")
    return "\n".join(lines)


__all__ = ["EvaluationConfig", "EvaluationRunError", "ModelResult", "PROTOCOLS", "PairedDifference", "RunScores", "SelectionRow",
           "SplitData", "SplitEpoch", "choose_kappa0", "describe_split", "evaluate", "format_results", "kappa0_matters",
           "largest_nodes_npmi", "load_and_evaluate", "load_split_epochs", "paired_differences",
           "read_evaluation_epochs", "run_model", "split_epochs"]
