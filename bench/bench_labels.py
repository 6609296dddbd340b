"""Node labels: theta's largest entries against the terms of the documents below each node.

Replays a text corpus as ``streamtree replay`` does at its defaults (the bundled State of the
Union paragraphs by decade unless ``--data`` is given) and, for every epoch, compares the two
ways to label a node that holds documents in its subtree:

* **theta words** (the baseline: what the store published before, and still publishes for
  vMF directions): the ten largest entries of the node's parameter;
* **label words** (:meth:`streamtree.epoch_tree.EpochTree.label_words`, what it publishes now
  for word distributions): the ten terms weighing most in the epoch's documents in the node's
  subtree.

Per kind of node (internal: with children; leaf), over all epochs: how far theta's entropy sits
below the uniform one (``log V - H``, nats; 0 is uniform), how many of the ten words the two
labels share (at most the label's length: nodes over a few short documents have fewer than
ten), the share of the subtree's weight (tokens, for word distributions) that the words cover
(label words maximise it by construction: the figure says how little theta words cover), and
the mean NPMI of each label's words (co-occurrence in all the fitted documents; labels of ten
words). Also the CPU seconds of the label words against those of the fits (vectorising
included).

Usage: python bench/bench_labels.py [--data PATH --text-col text --time-col year --epoch 10y]
       [--likelihood multinomial|vmf] [--max-features auto]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from streamtree.coherence import topic_npmi
from streamtree.replay import EpochFitter, ReplayConfig, fit_vocabulary, read_epochs

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "sotu_paragraphs.parquet"
N_WORDS = 10


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--text-col", default="text")
    p.add_argument("--time-col", default="year")
    p.add_argument("--time-unit", default="year")
    p.add_argument("--epoch", default="10y")
    p.add_argument("--likelihood", default=None, help="model family (default: the model's)")
    p.add_argument("--max-features", default=None, help="vocabulary cap (default: replay's)")
    args = p.parse_args()

    model = {} if args.likelihood is None else {"likelihood": args.likelihood}
    extra = {} if args.max_features is None else {
        "max_features": args.max_features if args.max_features == "auto" else int(args.max_features)}
    config = ReplayConfig(source=args.data, text_col=args.text_col, time_col=args.time_col, time_unit=args.time_unit,
                          epoch=args.epoch, model=model, **extra)
    epochs, _ = read_epochs(config)
    vec = fit_vocabulary(config, epochs)
    estimator = config.estimator()
    fitter = EpochFitter(estimator, vec, config.duplicate_texts)
    vocab = np.asarray(vec.vocabulary_)
    index = {w: i for i, w in enumerate(vocab)}
    print(f"== {Path(args.data).name}: {len(epochs)} epochs of {args.epoch}, V = {vocab.size}, "
          f"{type(estimator).__name__}(likelihood={estimator.likelihood!r}) at replay's defaults")
    rows = {"internal": [], "leaf": []}
    tops = {"internal": ([], []), "leaf": ([], [])}  # per kind: theta's and the label's word indices
    fitted_rows = []
    fit_cpu = label_cpu = 0.0
    for ep in epochs:
        t0 = time.process_time()
        fitted = fitter.fit(ep)
        fit_cpu += time.process_time() - t0
        if fitted is None or fitted.n_documents == 0:
            continue
        tree, X = fitted.tree, fitted.X
        fitted_rows.append(X)
        t0 = time.process_time()
        label = tree.label_words(vocab, X, N_WORDS)
        label_cpu += time.process_time() - t0
        by_theta = tree.top_words(vocab, N_WORDS)
        sums = tree.subtree_row_sums(X)
        theta = np.asarray(tree.theta)
        # entropy below the uniform one, for word distributions (directions are not distributions)
        simplex = np.all(theta >= 0) and np.allclose(theta.sum(axis=1), 1.0)
        gap = (np.log(theta.shape[1]) + np.sum(theta * np.log(np.maximum(theta, 1e-300)), axis=1) if simplex
               else np.full(theta.shape[0], np.nan))
        has_kids = np.isin(tree.node_ids, tree.parent)
        for k in np.flatnonzero(tree.subtree_counts > 0):
            shared = len(set(label[k]) & set(by_theta[k]))
            row = dict(zip(sums.indices[sums.indptr[k]:sums.indptr[k + 1]].tolist(),
                           sums.data[sums.indptr[k]:sums.indptr[k + 1]].tolist()))
            total = sum(row.values())
            cover = (sum(row.get(index[w], 0.0) for w in by_theta[k]) / total,
                     sum(row.get(index[w], 0.0) for w in label[k]) / total)
            kind = "internal" if has_kids[k] else "leaf"
            rows[kind].append((gap[k], shared, *cover))
            if len(label[k]) == N_WORDS:
                tops[kind][0].append([index[w] for w in by_theta[k]])
                tops[kind][1].append([index[w] for w in label[k]])
    reference = sp.vstack(fitted_rows, format="csr")
    print(f"{'nodes':>9} {'n':>5}  {'log V - H(theta)':>17}  {'words shared':>12}  "
          f"{'tokens covered: theta words':>28}  {'label words':>11}  {'NPMI: theta words':>17}  {'label words':>11}")
    for kind, r in rows.items():
        if not r:
            continue
        a = np.array(r, dtype=np.float64)
        by_theta, by_label = (topic_npmi(np.array(t), reference) if t else np.full(1, np.nan) for t in tops[kind])
        print(f"{kind:>9} {a.shape[0]:5d}  {np.nanmedian(a[:, 0]) if np.isfinite(a[:, 0]).any() else np.nan:17.3f}  "
              f"{np.median(a[:, 1]):12.1f}  {np.nanmedian(a[:, 2]):28.3f}  {np.nanmedian(a[:, 3]):11.3f}  "
              f"{by_theta.mean():17.3f}  {by_label.mean():11.3f}   (medians; NPMI: means)")
        print(f"{'':>9} {'':5}  {'':17}  {'none: ' + str(int(np.sum(a[:, 1] == 0))):>12}")
    print(f"-- CPU: label words {label_cpu:.2f} s for all epochs; the fits {fit_cpu:.1f} s "
          f"({label_cpu / max(fit_cpu, 1e-9):.2%} of them)")
    estimator.close()


if __name__ == "__main__":
    main()
