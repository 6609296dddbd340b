"""Held-out evaluation of the dTSSBP and its baselines, following the dTSSBP paper's protocol.

Protocol
--------
1. Every epoch's documents are split at random into 90% training and 10% test documents
   (``test_fraction``); the vocabulary is fitted on the training documents of all epochs, and
   rows left empty by it are dropped (and counted).
2. The epochs are split at the middle. On the **first half**, every ``kappa0`` of the grid
   and ``restarts`` seeds are run; each run is scored by its mean held-out log predictive
   density (below) over the first-half epochs, and the best (kappa0, seed) is chosen. Models
   in which kappa0 plays no role (t-tssbp and the DP models: no parent link, or a time link
   of fixed strength xi) are run with the first grid value only.
3. On the **second half**, ``repeats`` runs restart from the first epoch with the chosen
   kappa0 (repeat 0 with the chosen seed, repeat r with that seed + r) and are scored on the
   second-half epochs only.

Scores
------
After fitting epoch t on its training documents, every test document x of epoch t is scored
under the epoch's predictive mixture (posterior-mean sticks pi_e, node directions theta_e and
concentrations beta_e, plus the new-node terms):

* **normalised** log predictive density: ``log sum_e pi_e C_p(beta_e) exp(beta_e theta_e . x)``
  (``DTSSBP.score_samples(X, normalized=True)``), a proper log density on the unit sphere;
  this is what selects kappa0 and the restart.
* **unnormalised** score, the paper's: ``log sum_e pi_e exp(beta_e theta_e . x)``
  (``normalized=False``): the vMF normalisers C_p(beta) are dropped, so it is not a density
  and favours models with large concentrations; reported for comparison with the paper.

The figure of a run is the mean over scored epochs of the mean over the epoch's test
documents; the tables give mean +- sd over the repeats.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import scipy.sparse as sp

from streamtree.replay import ReplayConfig, read_epochs
from streamtree.variants import VARIANTS, resolve_variant


@dataclass
class EvaluationConfig:
    """Settings of :func:`evaluate` (see the module docstring).

    ``model`` holds the other keyword arguments of :class:`streamtree.model.DTSSBP` (likelihood,
    window, sweeps, engine, ...); the protocol sets ``variant``, ``max_depth``, ``kappa0`` and
    ``random_state`` of every run itself, and everything else takes the estimator's defaults.
    """

    variants: list[str] = field(default_factory=lambda: list(VARIANTS))
    depths: list[int] = field(default_factory=lambda: [3, 4])
    kappa0_grid: list[float] = field(default_factory=lambda: [1.0, 10.0, 100.0, 1000.0, 10000.0])
    restarts: int = 5
    repeats: int = 5
    seed: int = 0
    test_fraction: float = 0.1
    max_docs_per_epoch: int | None = None
    max_epochs: int | None = None
    model: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        fixed = {"variant", "max_depth", "kappa0", "random_state"} & set(self.model)
        if fixed:
            raise ValueError(f"the protocol sets {', '.join(sorted(fixed))} itself; use variants, depths, "
                             "kappa0_grid and seed instead")

    def model_params(self) -> dict:
        """All DTSSBP keyword arguments shared by the protocol's runs."""
        from streamtree.model import DTSSBP

        return DTSSBP(**self.model).get_params(deep=False)


@dataclass
class SplitEpoch:
    index: int
    label: str
    X_train: sp.csr_matrix
    X_test: sp.csr_matrix


@dataclass
class SplitData:
    epochs: list[SplitEpoch]
    vocabulary_size: int
    n_dropped_train: int
    n_dropped_test: int

    @property
    def middle(self) -> int:
        """Index (into ``epochs``) of the first second-half epoch."""
        return len(self.epochs) // 2


@dataclass
class ModelResult:
    variant: str
    depth: int
    kappa0: float
    seed: int
    selection: dict[tuple[float, int], float]  # (kappa0, seed) -> first-half normalised score
    normalized: np.ndarray  # one figure per repeat
    unnormalized: np.ndarray
    seconds: float


def load_split_epochs(config: ReplayConfig, ev: EvaluationConfig) -> SplitData:
    """Read the source, subsample and split every epoch, fit the vocabulary on the training part."""
    epochs, _ = read_epochs(config)
    if ev.max_epochs is not None:
        epochs = epochs[: ev.max_epochs]
    rng = np.random.default_rng(np.random.SeedSequence([ev.seed, 7]))
    parts = []
    for ep in epochs:
        n = ep.n_rows
        order = rng.permutation(n)
        if ev.max_docs_per_epoch is not None:
            order = order[: ev.max_docs_per_epoch]
        n_test = int(round(ev.test_fraction * order.size)) if order.size >= 2 else 0
        n_test = min(max(n_test, 1 if order.size >= 2 else 0), order.size - 1) if order.size else 0
        texts = ep.rows.column("text")
        test = texts.take(pa.array(np.sort(order[:n_test]))) if n_test else pa.array([], pa.string())
        train = texts.take(pa.array(np.sort(order[n_test:]))) if order.size else pa.array([], pa.string())
        parts.append((ep, train, test))
    train_all = [c for _, tr, _ in parts for c in (tr.chunks if isinstance(tr, pa.ChunkedArray) else [tr])]
    if not any(len(c) for c in train_all):
        raise ValueError(f"{config.source}: no documents to evaluate on")
    from streamtree.likelihoods import LIKELIHOODS, TEXT_LIKELIHOODS

    likelihood = ev.model_params()["likelihood"]
    if likelihood not in TEXT_LIKELIHOODS:
        raise ValueError(f"likelihood {likelihood!r} does not model text; choose one of {', '.join(TEXT_LIKELIHOODS)}")
    vec = config.vectorizer().set_params(norm=LIKELIHOODS[likelihood].text_norm)
    vec.fit(pa.chunked_array(train_all, pa.string()))
    p = vec.vocabulary_.shape[0]
    out: list[SplitEpoch] = []
    dropped_train = dropped_test = 0
    for ep, train, test in parts:
        Xtr, Xte = sp.csr_matrix((0, p)), sp.csr_matrix((0, p))
        if len(train):
            Xtr = vec.transform(train)
            empty = vec.empty_rows(Xtr)
            dropped_train += int(empty.sum())
            Xtr = Xtr[~empty]
        if len(test):
            Xte = vec.transform(test)
            empty = vec.empty_rows(Xte)
            dropped_test += int(empty.sum())
            Xte = Xte[~empty]
        if not out and Xtr.shape[0] == 0:
            continue  # the model's first epoch needs documents
        out.append(SplitEpoch(ep.index, ep.label, Xtr, Xte))
    scored = sum(1 for e in out if e.X_test.shape[0])
    if len(out) < 2 or scored < 2:
        raise ValueError(f"{config.source}: evaluation needs at least 2 epochs with test documents, "
                         f"found {scored}; use a finer --epoch or more data")
    return SplitData(out, p, dropped_train, dropped_test)


def _variant_config(variant: str, depth: int, params: dict | None = None):
    from streamtree.model import DTSSBP

    p = params or DTSSBP().get_params(deep=False)
    return resolve_variant(variant, window=p["window"], max_depth=depth, gamma=p["gamma"], xi=p["xi"])


def kappa0_matters(variant: str, depth: int) -> bool:
    """Whether kappa0 enters the model (a parent link, or a time link of depth-rule strength)."""
    c = _variant_config(variant, depth)
    return c.parent_link or (c.time_link and c.time_kappa is None)


def run_model(data: SplitData, params: dict, scored: range) -> tuple[float, float]:
    """Fit all epochs up to the last scored one; mean held-out scores over ``scored`` epochs.

    Returns (normalised, unnormalised): each the mean over scored epochs (with test
    documents) of the mean per-document score.
    """
    from streamtree.model import DTSSBP

    norm, unnorm = [], []
    with DTSSBP(**params) as model:
        for i, ep in enumerate(data.epochs[: scored.stop]):
            model.partial_fit(ep.X_train, epoch=ep.index, label=ep.label)
            if i in scored and ep.X_test.shape[0]:
                norm.append(float(np.mean(model.score_samples(ep.X_test, normalized=True))))
                unnorm.append(float(np.mean(model.score_samples(ep.X_test, normalized=False))))
    return float(np.mean(norm)), float(np.mean(unnorm))


def evaluate(data: SplitData, ev: EvaluationConfig,
             log: Callable[[str], None] | None = None) -> list[ModelResult]:
    """Run the protocol for every variant and depth (see the module docstring)."""
    results: list[ModelResult] = []
    first, second = range(0, data.middle), range(data.middle, len(data.epochs))
    done: dict[tuple[str, int | None], ModelResult] = {}
    shared = ev.model_params()
    for variant in ev.variants:
        for depth in ev.depths:
            same = (variant, _variant_config(variant, depth, shared).max_depth)
            if same in done:  # DP models are one level deep at any depth: no need to rerun
                old = done[same]
                results.append(ModelResult(variant, depth, old.kappa0, old.seed, old.selection, old.normalized,
                                           old.unnormalized, 0.0))
                continue
            t0 = time.perf_counter()
            base = dict(shared, variant=variant, max_depth=depth)
            grid = ev.kappa0_grid if kappa0_matters(variant, depth) else ev.kappa0_grid[:1]
            selection: dict[tuple[float, int], float] = {}
            for k0 in grid:
                for r in range(ev.restarts):
                    seed = ev.seed + r
                    score, _ = run_model(data, dict(base, kappa0=k0, random_state=seed), first)
                    selection[(k0, seed)] = score
                    if log:
                        log(f"{variant} depth {depth}: kappa0={k0:g} seed={seed} first half {score:.4g}")
            (k0, seed), _ = max(selection.items(), key=lambda kv: (kv[1], -kv[0][1]))
            norm, unnorm = [], []
            for j in range(ev.repeats):
                a, b = run_model(data, dict(base, kappa0=k0, random_state=seed + j), second)
                norm.append(a)
                unnorm.append(b)
                if log:
                    log(f"{variant} depth {depth}: kappa0={k0:g} repeat {j} second half {a:.4g} (unnormalised {b:.4g})")
            res = ModelResult(variant, depth, k0, seed, selection, np.array(norm), np.array(unnorm),
                              time.perf_counter() - t0)
            done[same] = res
            results.append(res)
    return results


def _cell(values: np.ndarray) -> str:
    sd = float(np.std(values, ddof=1)) if values.size > 1 else math.nan
    return f"{np.mean(values):.2f} +- {sd:.2f}" if values.size > 1 else f"{np.mean(values):.2f}"


def format_results(results: list[ModelResult], data: SplitData, ev: EvaluationConfig) -> str:
    """Tables like the paper's Table 1, one per score, plus the chosen kappa0 per model."""
    depths = sorted({r.depth for r in results})
    variants = list(dict.fromkeys(r.variant for r in results))
    by = {(r.variant, r.depth): r for r in results}
    n_test = sum(e.X_test.shape[0] for e in data.epochs[data.middle:])
    lines = [
        f"{len(data.epochs)} epochs ({data.epochs[0].label} .. {data.epochs[-1].label}); kappa0 and restart "
        f"chosen on the first {data.middle}, scored on the last {len(data.epochs) - data.middle} "
        f"({n_test} test documents); vocabulary {data.vocabulary_size} terms; "
        f"{ev.model_params()['likelihood']} likelihood, {ev.model_params()['n_sweeps']} sweeps/epoch; "
        f"{ev.repeats} repeats (mean +- sd).",
        f"empty after vocabulary filtering, dropped: {data.n_dropped_train} training, "
        f"{data.n_dropped_test} test documents.",
    ]
    for title, attr in (
        ("Normalised held-out log predictive density per document, "
         "log sum_e pi_e f(x | theta_e, beta_e) (higher is better):", "normalized"),
        ("Unnormalised held-out score per document as in the paper, the same with the likelihood's "
         "normalising constants dropped (vMF: log sum_e pi_e exp(beta_e theta_e.x); not a density):",
         "unnormalized"),
    ):
        cells = {(v, d): _cell(getattr(by[(v, d)], attr)) if (v, d) in by else "-" for v in variants for d in depths}
        width = max(len(c) for c in cells.values()) + 3
        lines += ["", title, f"{'model':<10}" + "".join(f"{'depth ' + str(d):>{width}}" for d in depths)]
        for v in variants:
            lines.append(f"{v:<10}" + "".join(f"{cells[(v, d)]:>{width}}" for d in depths))
    lines += ["", "chosen kappa0 (seed), time:"]
    for r in results:
        note = "" if kappa0_matters(r.variant, r.depth) else " (kappa0 plays no role)"
        lines.append(f"  {r.variant} depth {r.depth}: kappa0={r.kappa0:g} (seed {r.seed}){note}, {r.seconds:.1f}s")
    lines.append("DP models (ddp, o-dp, t-dp) are one level deep whatever the depth column.")
    return "\n".join(lines)


__all__ = ["EvaluationConfig", "ModelResult", "SplitData", "SplitEpoch", "evaluate", "format_results",
           "kappa0_matters", "load_split_epochs", "run_model"]
