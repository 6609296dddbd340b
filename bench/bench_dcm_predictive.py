"""Held-out log density of SOU paragraphs, bursty (DCM) documents against multinomial ones.

The documents protocol of ``streamtree evaluate`` (80/10/10 per decade, a new split and
sampler seed per repeat) with the dTSSBP at one kappa0, run twice on each repeat's split: with
multinomial documents (``document_concentration=None``, the baseline) and with
``document_concentration="auto"`` (the estimator's default). Both densities include the multinomial coefficient, so they
are densities of the same counts and the paired difference per repeat is the figure that
matters. The bursty fit is also scored with the multinomial predictive on the same tree,
which separates what the DCM predictive adds from what the bursty fit changes in the tree.
Prints the log density per test paragraph, NPMI of the 20 largest nodes per epoch, the
sampled ``s`` and the CPU time of fitting and of scoring, per repeat and as mean +- sd.

``--planted``: the same comparison on the planted evolving tree, whose documents are plain
multinomial draws (10% of every epoch held out; a new corpus and seed per repeat).

Usage: python bench/bench_dcm_predictive.py [--max-docs-per-epoch 250] [--repeats 3]
       [--sweeps 10] [--kappa0 1000] [--max-features 2000] [--min-df 5] [--max-depth 3]
       [--planted [--planted-features 2000] [--planted-docs 5000]]
"""

from __future__ import annotations

import argparse
import resource
from pathlib import Path

import numpy as np
import scipy.sparse as sp

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from streamtree.evaluate import EvaluationConfig, largest_nodes_npmi, read_evaluation_epochs, split_epochs
from streamtree.likelihoods.document_tables import dcm_log_mixture
from streamtree.model import DTSSBP
from streamtree.replay import ReplayConfig

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "sotu_paragraphs.parquet"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(data, params: dict, reference) -> dict:
    """Fit every epoch, scoring each epoch's test documents after it; the bursty fit is also
    scored with multinomial documents on the same trees."""
    test, plain_test, npmi, nodes = [], [], [], []
    fit_cpu = score_cpu = 0.0
    with DTSSBP(**params) as model:
        for ep in data.epochs:
            c0 = _cpu()
            model.partial_fit(ep.X_train, epoch=ep.index, label=ep.label)
            c1 = _cpu()
            fit_cpu += c1 - c0
            if ep.X_test.shape[0]:
                test.append(model.score_samples(ep.X_test))
                score_cpu += _cpu() - c1
                if params.get("document_concentration") is not None:
                    setting = model.likelihood_.document_concentration
                    model.likelihood_.document_concentration = None
                    plain_test.append(model.score_samples(ep.X_test))
                    model.likelihood_.document_concentration = setting
            npmi.append(largest_nodes_npmi(model.trees_[-1], reference))
            nodes.append(int(np.sum(model.trees_[-1].counts > 0)))
        s = model.state_.hyper.get("document_concentration", np.nan)
    return dict(test=float(np.concatenate(test).mean()),
                plain=float(np.concatenate(plain_test).mean()) if plain_test else np.nan,
                npmi=float(np.concatenate(npmi).mean()), nodes=float(np.mean(nodes)), s=float(s), fit_cpu=fit_cpu, score_cpu=score_cpu)


def planted(args) -> list[tuple[dict, dict]]:
    """The planted evolving tree (multinomial documents, :func:`streamtree.synthetic.planted_dirichlet_tree`),
    one corpus per repeat, 10% of every epoch held out."""
    from streamtree.evaluate import SplitData, SplitEpoch
    from streamtree.synthetic import planted_dirichlet_tree

    rows = []
    for r in range(args.repeats):
        rng = np.random.default_rng(args.seed + r)
        corpus = planted_dirichlet_tree(rng, n_features=args.planted_features, n_documents=args.planted_docs)
        epochs = []
        for t, counts in enumerate(corpus.counts):
            counts = sp.csr_matrix(counts, dtype=np.float64)
            test = rng.random(counts.shape[0]) < 0.1
            epochs.append(SplitEpoch(t, str(t), counts[~test], counts[test]))
        data = SplitData(epochs, args.planted_features, 0, 0, repeat=r)
        base = dict(likelihood="multinomial", document_concentration=None, max_depth=args.max_depth,
                    n_sweeps=args.sweeps, random_state=args.seed + r)
        reference = sp.vstack([e.X_train for e in epochs], format="csr")
        rows.append((run(data, base, reference), run(data, dict(base, document_concentration="auto"), reference)))
        report(r, data, *rows[-1])
    return rows


def report(r: int, data, mult: dict, dcm: dict) -> None:
    print(f"repeat {r}: {data.n_docs('test')} test documents; log density/document multinomial "
          f"{mult['test']:.3f}, DCM {dcm['test']:.3f} (paired {dcm['test'] - mult['test']:+.3f}; the DCM fit "
          f"scored as multinomial {dcm['plain']:.3f}); NPMI {mult['npmi']:.4f} / {dcm['npmi']:.4f}; "
          f"s = {dcm['s']:.1f}; nodes {mult['nodes']:.1f} / {dcm['nodes']:.1f}; fit CPU {mult['fit_cpu']:.1f}s / "
          f"{dcm['fit_cpu']:.1f}s, scoring CPU {mult['score_cpu']:.2f}s / {dcm['score_cpu']:.2f}s", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-docs-per-epoch", type=int, default=250, help="0: every document")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sweeps", type=int, default=10)
    p.add_argument("--kappa0", type=float, default=1000.0)
    p.add_argument("--max-features", type=lambda v: v if v == "auto" else int(v), default=2000,
                   help="a number, or auto (the vectorizer's default rule)")
    p.add_argument("--min-df", type=int, default=5)
    p.add_argument("--max-depth", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--planted", action="store_true", help="the planted tree instead of SOU")
    p.add_argument("--planted-features", type=int, default=2000)
    p.add_argument("--planted-docs", type=int, default=5000)
    args = p.parse_args()

    # compile the DCM predictive before any timing
    dcm_log_mixture(sp.csr_matrix(np.array([[2.0, 1.0]])), np.full((1, 2), 0.5), np.zeros(1), np.ones((1, 2)),
                    np.zeros(1), 1.0)
    if args.planted:
        print(f"== planted tree (multinomial documents), V={args.planted_features}, {args.planted_docs} documents "
              f"per epoch, 3 epochs, 10% held out, dtssbp depth {args.max_depth} at its defaults, {args.sweeps} sweeps, "
              f"{args.repeats} repeats (corpus and sampler seed {args.seed} + r)", flush=True)
        summarize(planted(args), "document")
        return
    summarize(sou(args), "paragraph")


def sou(args) -> list[tuple[dict, dict]]:
    ev = EvaluationConfig(depths=[args.max_depth], kappa0_grid=[args.kappa0], repeats=args.repeats, seed=args.seed,
                          max_docs_per_epoch=args.max_docs_per_epoch or None, model=dict(n_sweeps=args.sweeps))
    config = ReplayConfig(source=str(DATA), text_col="text", time_col="year", time_unit="year", epoch="10y",
                          min_df=args.min_df, max_df=0.5, max_features=args.max_features)
    print(f"== SOU by decade, documents protocol, dtssbp depth {args.max_depth}, kappa0 {args.kappa0:g}, "
          f"{args.sweeps} sweeps, {args.max_docs_per_epoch or 'all'} docs/epoch, {args.repeats} repeats, vocabulary "
          f"min_df {args.min_df}, max_features {args.max_features}", flush=True)
    epochs = read_evaluation_epochs(config, ev)
    rows = []
    for r in range(args.repeats):
        data = split_epochs(epochs, config, ev, r)
        reference = data.reference()
        base = dict(ev.model_params(), variant="dtssbp", max_depth=args.max_depth, kappa0=args.kappa0,
                    random_state=args.seed + r, document_concentration=None)
        mult = run(data, base, reference)
        dcm = run(data, dict(base, document_concentration="auto"), reference)
        rows.append((mult, dcm))
        report(r, data, mult, dcm)
    return rows


def summarize(rows: list[tuple[dict, dict]], unit: str) -> None:
    def cell(values) -> str:
        v = np.asarray(values, dtype=np.float64)
        return f"{v.mean():.3f} +- {v.std(ddof=1) if v.size > 1 else 0.0:.3f}"

    m = {k: [a[k] for a, _ in rows] for k in rows[0][0]}
    d = {k: [b[k] for _, b in rows] for k in rows[0][1]}
    print("\n(mean +- sd over repeats)  multinomial documents (baseline)  |  DCM documents (auto s)")
    print(f"log density / {unit}:   {cell(m['test'])}  |  {cell(d['test'])}")
    print(f"paired difference DCM - multinomial: {cell(np.subtract(d['test'], m['test']))}")
    print(f"DCM fit, multinomial predictive: {cell(d['plain'])} (paired to the baseline "
          f"{cell(np.subtract(d['plain'], m['test']))})")
    print(f"NPMI:                      {cell(m['npmi'])}  |  {cell(d['npmi'])}")
    print(f"nodes with documents/epoch: {cell(m['nodes'])}  |  {cell(d['nodes'])}")
    print(f"sampled s:                 {cell(d['s'])}")
    print(f"fit CPU s:                 {cell(m['fit_cpu'])}  |  {cell(d['fit_cpu'])}  "
          f"(ratio {np.sum(d['fit_cpu']) / np.sum(m['fit_cpu']):.2f})")
    print(f"scoring CPU s:             {cell(m['score_cpu'])}  |  {cell(d['score_cpu'])}  "
          f"(ratio {np.sum(d['score_cpu']) / np.sum(m['score_cpu']):.2f})")


if __name__ == "__main__":
    main()
