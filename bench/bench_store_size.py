"""Store size against input size, and what the compact store's truncation costs.

Two corpora, each replayed with weekly epochs (like a news feed):

* ``sou``: ``--docs`` paragraphs sampled (seeded) from the bundled State of the Union corpus
  and re-dated uniformly over one year (52 epochs of ~``docs/52`` documents);
* ``planted``: text generated from a planted evolving tree of hierarchical-Dirichlet topics
  (:func:`streamtree.synthetic.planted_dirichlet_tree`, not the model's own generator) over
  ``--planted-epochs`` weeks, each word index spelled as a letter string.

Each corpus is replayed once with ``keep_checkpoints="all"``, so that every epoch's full-
precision model is at hand; from that one run the bench measures, as file sizes of what the
store writes (not estimates):

* the store as this version writes it by default (vMF node directions to cosine 0.999 as
  float32, multinomial word distributions as log probabilities coded to step 0.02, the
  checkpoint arrays of the latest epoch only): the ``compact`` figure;
* the store as format version 2 wrote it (every node parameter exact in float64 and every
  epoch's checkpoint): the baseline, written from the same trees' full parameters;
* the input file, and both stores' ratio to it (target: at most 3x);
* the truncation's error: the largest and median error of a stored node parameter (from the
  commit records: a direction's relative L2 error, a word distribution's largest log
  probability error), and what it changes when documents are assigned: each epoch's own
  documents are scored by the epoch's exact model and by the same model with the stored
  parameters; the share whose MAP node differs and the change of the log densities.

The output names the node parameters as the family's
:attr:`~streamtree.likelihoods.base.Likelihood.param_storage` says (directions for the vMF,
word distributions for the multinomial).

Usage: python bench/bench_store_size.py [--corpus sou,planted] [--docs 3800] [--sweeps 5]
       [--likelihood multinomial]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from connectors.stores import SnapshotStore
from connectors.stores.snapshot import CHECKPOINT_ARRAYS, THETA_ENCODING, _theta_table
from streamtree.epoch_tree import EpochTree
from streamtree.likelihoods import LIKELIHOODS
from streamtree.model import DTSSBP
from streamtree.replay import ReplayConfig, read_epochs, replay, text_model_params
from streamtree.synthetic import planted_dirichlet_tree

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "sotu_paragraphs.parquet"
START = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
#: by the family's ``param_storage``: what its node parameters are called, and the error the
#: store records for a stored one
PARAM_LABELS = {
    "direction": ("directions", "relative L2 error of a node's direction"),
    "distribution": ("word distributions", "largest |log phi_hat - log phi| of a node's word"),
    "exact": ("parameters", "error of a node's stored parameter"),
}


def sou_weekly(path: Path, n_docs: int, seed: int = 0) -> None:
    table = pq.read_table(DATA, columns=["text"])
    rng = np.random.default_rng(seed)
    take = np.sort(rng.choice(table.num_rows, size=min(n_docs, table.num_rows), replace=False))
    seconds = np.sort(rng.uniform(0, 364 * 86400, size=take.size))
    times = [START + dt.timedelta(seconds=float(s)) for s in seconds]
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(take.size)],
                             "text": table.column("text").take(take), "time": pa.array(times)}), path)


def _word(i: int) -> str:
    """Word index i as letters ("qa", "qb", ...): the tokeniser drops digits."""
    out = ""
    i += 26
    while i:
        i, r = divmod(i, 26)
        out = chr(97 + r) + out
    return "q" + out


def planted_weekly(path: Path, n_epochs: int, docs_per_epoch: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    corpus = planted_dirichlet_tree(rng, n_features=3000, n_documents=docs_per_epoch, n_epochs=n_epochs,
                                    doc_length=(40, 120))
    words = np.asarray([_word(i) for i in range(corpus.n_features)], dtype=object)
    ids, texts, times = [], [], []
    for e, counts in enumerate(corpus.counts):
        counts = counts.tocsr()
        for r in range(counts.shape[0]):
            lo, hi = counts.indptr[r], counts.indptr[r + 1]
            tokens = np.repeat(words[counts.indices[lo:hi]], counts.data[lo:hi])
            rng.shuffle(tokens)
            ids.append(f"p{e}-{r}")
            texts.append(" ".join(tokens))
            times.append(START + dt.timedelta(days=7 * e, seconds=float(rng.uniform(0, 6 * 86400))))
    pq.write_table(pa.table({"id": ids, "text": texts, "time": pa.array(times)}), path)


def kind_of(name: str) -> str:
    for kind in ("theta", "checkpoint", "nodes", "assignments", "rejects", "events"):
        if name.startswith(kind):
            return kind
    return "other"


def sizes(root: Path) -> Counter:
    out: Counter = Counter()
    for dirpath, _, files in os.walk(root):
        for f in files:
            out[kind_of(f)] += os.path.getsize(os.path.join(dirpath, f))
    return out


def exact_tree(stored: EpochTree, arrays: dict) -> EpochTree:
    """The epoch's tree with the checkpoint's full-precision node parameters."""
    assert np.array_equal(arrays["last_node_ids"], stored.node_ids)
    return dataclasses.replace(stored, theta=np.asarray(arrays["last_theta"], dtype=np.float64))


def measure(name: str, source: Path, tmp: Path, sweeps: int | None, likelihood: str | None = None) -> None:
    store_dir = tmp / f"store-{name}"
    model = {} if sweeps is None else {"n_sweeps": sweeps}
    if likelihood is not None:
        model["likelihood"] = likelihood
    config = ReplayConfig(source=str(source), text_col="text", time_col="time", id_col="id", epoch="1w", model=model)
    family = text_model_params(model)["likelihood"]
    params_are, error_is = PARAM_LABELS[LIKELIHOODS[family].param_storage]
    t0 = time.process_time()
    summary = replay(config, str(store_dir), keep_checkpoints="all")
    cpu = time.process_time() - t0
    store = SnapshotStore(str(store_dir))
    entries = store.epochs()
    by_kind = sizes(store_dir)
    total = sum(by_kind.values())
    given = source.stat().st_size
    ckpt_files = {e["epoch"]: (store_dir / e["path"] / CHECKPOINT_ARRAYS).stat().st_size for e in entries}
    compact = total - sum(ckpt_files.values()) + ckpt_files[entries[-1]["epoch"]]

    # format version 2: every node parameter exact, float64; every checkpoint kept
    vec = store.vectorizer()
    epochs = {ep.index: ep for ep in read_epochs(config)[0]}
    exact_theta, changed, n_docs, dlog = 0, 0, 0, []
    for e in entries:
        stored = store.read(e["epoch"])
        arrays, meta = store.read_checkpoint(e["epoch"])
        table, _, _ = _theta_table(exact_tree(stored.tree, arrays), None)
        out = tmp / "theta.parquet"
        pq.write_table(table, out, compression="zstd", **THETA_ENCODING)
        exact_theta += out.stat().st_size
        # the same model scored with the stored parameters
        rows = epochs[e["epoch"]].rows
        keep = np.isin(np.asarray(rows.column("id").to_pylist(), dtype=object), stored.doc_ids)
        X = vec.transform(rows.column("text").filter(pa.array(keep)))
        exact = DTSSBP.from_checkpoint(arrays, meta)
        approx = DTSSBP.from_checkpoint({**arrays, "last_theta": stored.tree.theta}, meta)
        changed += int(np.sum(exact.predict(X) != approx.predict(X)))
        dlog.append(np.abs(exact.score_samples(X) - approx.score_samples(X)))
        n_docs += X.shape[0]
    v2 = total - by_kind["theta"] + exact_theta
    dlog = np.concatenate(dlog)
    errors = np.asarray([e["theta"]["error"] for e in entries])
    n_nodes = [e["n_nodes"] for e in entries]
    print(f"\n{name}: {summary.n_documents} documents, {len(entries)} weekly epochs, {len(vec.vocabulary_)} terms, "
          f"{summary.n_documents and sum(n_nodes) / len(n_nodes):.1f} nodes per epoch, "
          f"{sweeps or 'default'} sweeps, likelihood {family}; replay CPU {cpu:.1f}s")
    print(f"  input                           {given / 1e6:8.2f} MB")
    print(f"  store, format 2 (baseline)      {v2 / 1e6:8.2f} MB = {v2 / given:6.2f} x input")
    print(f"  store, compact (default now)    {compact / 1e6:8.2f} MB = {compact / given:6.2f} x input "
          f"({v2 / compact:.1f}x smaller)")
    compact_kinds = Counter(by_kind)
    compact_kinds["checkpoint"] += compact - total
    for kind, n in compact_kinds.most_common():
        print(f"    {kind:12s} {n / 1e6:8.3f} MB  {n / compact:6.1%}")
    print(f"  theta: exact {exact_theta / 1e6:.2f} MB, stored {by_kind['theta'] / 1e6:.2f} MB; {error_is}: "
          f"max {errors.max():.4f}, median over epochs of the epoch's max {np.median(errors):.4f}")
    print(f"  assigning each epoch's documents with stored instead of exact {params_are}: MAP node differs for "
          f"{changed} of {n_docs} ({changed / max(n_docs, 1):.2%}); log-density change median {np.median(dlog):.3g}, "
          f"largest {dlog.max():.3g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default="sou,planted")
    ap.add_argument("--docs", type=int, default=3800, help="SOU paragraphs")
    ap.add_argument("--planted-epochs", type=int, default=12)
    ap.add_argument("--planted-docs", type=int, default=300, help="planted documents per epoch")
    ap.add_argument("--sweeps", type=int, default=5, help="Gibbs sweeps per epoch (0: the model's default)")
    ap.add_argument("--likelihood", default=None, help="the model's likelihood (default: the model's default)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name in args.corpus.split(","):
            source = tmp / f"{name}.parquet"
            if name == "sou":
                sou_weekly(source, args.docs)
            elif name == "planted":
                planted_weekly(source, args.planted_epochs, args.planted_docs)
            else:
                raise SystemExit(f"unknown corpus {name!r}: sou or planted")
            measure(name, source, tmp, args.sweeps or None, args.likelihood)


if __name__ == "__main__":
    main()
