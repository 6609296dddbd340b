"""Data path on the bundled State of the Union corpus: read, bucket, vectorise, publish.

Prints wall-clock seconds (best of ``--repeat``) for each stage of the pipeline

* read: ``open_source`` over the Parquet file in record batches (UTF-8 check, time parsing,
  reject routing) and bucketing into decades;
* vectorise: fitting the vocabulary over the whole corpus and transforming every epoch
  (two tokenising passes), or one ``fit_transform`` over the epochs in order sliced by epoch;
* publish: writing one stored epoch per decade (a one-node tree per epoch, so this measures
  the store's I/O, not the model);

and, measured in the same process, the baseline of each stage done with no data-path
machinery: ``pyarrow.parquet.read_table`` of the two columns plus a numpy group-by of the
year column, and a bare scikit-learn ``CountVectorizer.fit_transform`` plus L2 normalisation.

With ``--scale N`` it also writes the corpus N times over into one Parquet file and streams it
through the source (no bucketing), reporting rows per second and the peak of pyarrow's
allocated memory while streaming: bounded by a few batches, not by the file.

Usage: python bench/bench_datapath.py [--repeat 3] [--batch-size 8192] [--scale 0]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.preprocessing import normalize

import streamtree  # noqa: F401
from connectors.sources import open_source
from connectors.stores import SnapshotStore
from streamtree.epoch_tree import EpochTree
from streamtree.epochs import bucket
from streamtree.text import TOKEN_PATTERN, TextVectorizer

SOTU = Path(__file__).resolve().parents[1] / "examples" / "data" / "sotu_paragraphs.parquet"


def best_of(fn, repeat):
    best, out = np.inf, None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def read_and_bucket(batch_size):
    src = open_source(str(SOTU), "text", "year", batch_size=batch_size)
    return list(bucket(src, "decade"))


def all_texts(epochs):
    return pa.concat_arrays([e.rows.column("text").combine_chunks() for e in epochs])


def vectorise(epochs):
    """Fit on the whole corpus, then transform epoch by epoch (tokenises twice)."""
    vec = TextVectorizer(min_df=5, max_df=0.5)
    vec.fit(all_texts(epochs))
    out = []
    for e in epochs:
        X = vec.transform(e.rows.column("text"))
        out.append((X, vec.empty_rows(X)))
    return vec, out


def vectorise_once(epochs):
    """Replay shortcut: one fit_transform over the epochs in order, then row slices."""
    vec = TextVectorizer(min_df=5, max_df=0.5)
    X = vec.fit_transform(all_texts(epochs))
    empty = vec.empty_rows(X)
    bounds = np.cumsum([0] + [e.n_rows for e in epochs])
    return vec, [(X[a:b], empty[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def publish(epochs, vec, mats):
    p = vec.vocabulary_.shape[0]
    with tempfile.TemporaryDirectory() as d:
        store = SnapshotStore(d)
        store.write_vocabulary(vec)
        for e, (X, empty) in zip(epochs, mats):
            theta = np.asarray(X.sum(axis=0)).ravel()
            theta /= max(np.linalg.norm(theta), 1e-300)
            n = X.shape[0]
            tree = EpochTree(
                epoch=e.index, node_ids=np.array([0]), parent=np.array([-1]), depth=np.array([0]),
                mass=np.array([1.0]), counts=np.array([n]), subtree_counts=np.array([n]),
                window_counts=np.array([n]), theta=theta.reshape(1, p), concentration=np.array([1.0]),
                born=np.array([0]), assignments=np.zeros(n, dtype=np.int64), label=e.label)
            store.publish(tree, e.rows.column("id").to_pylist(), key=e.key)
        return len(store.epochs())


def baseline_read():
    t = pq.read_table(SOTU, columns=["text", "year"])
    decade = t.column("year").to_numpy() // 10
    order = np.argsort(decade, kind="stable")
    cuts = np.flatnonzero(np.diff(decade[order])) + 1
    return [t.take(pa.array(idx)) for idx in np.split(order, cuts)]


def baseline_vectorise(tables):
    texts = pa.concat_tables(tables).column("text").to_pylist()
    X = CountVectorizer(min_df=5, max_df=0.5, stop_words="english", token_pattern=TOKEN_PATTERN).fit_transform(texts)
    return normalize(X.astype(np.float64))


def stream_scaled(scale, batch_size):
    t = pq.read_table(SOTU, columns=["text", "year"])
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big.parquet"
        with pq.ParquetWriter(path, t.schema) as w:
            for _ in range(scale):
                w.write_table(t, row_group_size=16_384)
        del t
        size = path.stat().st_size
        base = pa.total_allocated_bytes()
        peak, n = 0, 0
        start = time.perf_counter()
        for batch in open_source(str(path), "text", "year", batch_size=batch_size):
            n += batch.num_rows
            peak = max(peak, pa.total_allocated_bytes() - base)
        return n, time.perf_counter() - start, peak, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--scale", type=int, default=0)
    args = parser.parse_args()

    t_read, epochs = best_of(lambda: read_and_bucket(args.batch_size), args.repeat)
    t_vec, (vec, mats) = best_of(lambda: vectorise(epochs), args.repeat)
    t_once, (_, mats_once) = best_of(lambda: vectorise_once(epochs), args.repeat)
    assert all((a[0] != b[0]).nnz == 0 for a, b in zip(mats, mats_once))
    t_pub, n_pub = best_of(lambda: publish(epochs, vec, mats), args.repeat)
    b_read, tables = best_of(baseline_read, args.repeat)
    b_vec, _ = best_of(lambda: baseline_vectorise(tables), args.repeat)

    n = sum(e.n_rows for e in epochs)
    empty = sum(int(m[1].sum()) for m in mats)
    print(f"corpus: {n} paragraphs, {len(epochs)} decades, vocabulary {vec.vocabulary_.shape[0]} terms, "
          f"{empty} rows empty after vocabulary filtering")
    print(f"{'stage':<28}{'streamtree s':>14}{'baseline s':>12}{'ratio':>8}")
    print(f"{'read + bucket':<28}{t_read:>14.3f}{b_read:>12.3f}{t_read / b_read:>8.2f}")
    print(f"{'vectorise (fit + transform)':<28}{t_vec:>14.3f}{b_vec:>12.3f}{t_vec / b_vec:>8.2f}")
    print(f"{'vectorise (fit_transform)':<28}{t_once:>14.3f}{b_vec:>12.3f}{t_once / b_vec:>8.2f}")
    print(f"{f'publish {n_pub} epochs':<28}{t_pub:>14.3f}{'-':>12}{'-':>8}")
    for name, t_v in (("fit + transform", t_vec), ("fit_transform", t_once)):
        total = t_read + t_v
        print(f"read + bucket + vectorise ({name}): {total:.2f} s ({n / total:,.0f} paragraphs/s)")
    if args.scale > 0:
        rows, secs, peak, size = stream_scaled(args.scale, args.batch_size)
        print(f"streamed {rows:,} rows ({size / 2**20:.0f} MiB Parquet) in {secs:.2f} s "
              f"({rows / secs:,.0f} rows/s); peak Arrow memory while streaming {peak / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
