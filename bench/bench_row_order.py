"""Row kernels that read each row's node's parameter row: rows in storage order against rows in
the order of their nodes (:func:`streamtree.inference.enumerated.rows_by_node`), same run.

Two kernels of a default multinomial sweep read ``theta[node of row r]`` at row ``r``'s terms:
the own-node adjustment (each document scored at its own node without its own counts) and the
table draws of bursty documents. A K x V matrix of doubles at K ~ 200, V = 20,000 is 32 MB,
beyond the caches; read in storage order every row's reads go to memory, in node order a
node's row is read from cache by all its documents in turn.

Corpus: the issue-10 synthetic epoch (50,000 documents, V = 20,000, ~30 non-zeros per row, 100
planted topics, integer counts); the rows' nodes are those of a short default fit
(``--sweeps``, default 10) and ``theta`` its node parameters. Prints, per kernel, the best of
``--repeat`` CPU times per call in each order, their ratio, and whether both orders give the
same values (they must, to the bit). Single-threaded.

Usage: python bench/bench_row_order.py [--docs 50000] [--vocab 20000] [--sweeps 10] [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from streamtree import DTSSBP
from streamtree.inference.enumerated import rows_by_node
from streamtree.likelihoods.document_tables import _tables_nb
from streamtree.likelihoods.multinomial_math import own_node_adjustment_nb
from streamtree.synthetic import sparse_corpus


def best_cpu(fn, repeat: int) -> float:
    """The least CPU seconds of ``repeat`` calls of ``fn``."""
    best = np.inf
    for _ in range(repeat):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=50_000)
    ap.add_argument("--vocab", type=int, default=20_000)
    ap.add_argument("--sweeps", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    X = sparse_corpus(np.random.default_rng(0), n_docs=args.docs, p=args.vocab, nnz_per_row=30, n_topics=100,
                      normalise=False).X.tocsr()
    with DTSSBP(likelihood="multinomial", max_depth=3, n_sweeps=args.sweeps, random_state=0, n_jobs=1) as model:
        tree = model.partial_fit(X).trees_[-1]
    at = {int(v): i for i, v in enumerate(tree.node_ids)}
    node = np.array([at[int(v)] for v in tree.assignments], dtype=np.int64)
    theta = np.ascontiguousarray(tree.theta, dtype=np.float64)
    K, n = theta.shape[0], X.shape[0]
    print(f"corpus: {n} documents, V = {X.shape[1]}, {X.nnz / n:.1f} non-zeros a row; {K} nodes after "
          f"{args.sweeps} sweeps (theta {theta.nbytes / 2**20:.0f} MiB); runs of one node in storage order: "
          f"{int(np.count_nonzero(np.diff(node))) + 1}")

    indptr, indices = X.indptr.astype(np.int64), X.indices.astype(np.int64)
    data = X.data.astype(np.float64)
    storage, by_node = np.arange(n, dtype=np.int64), rows_by_node(node)
    totals = np.full(K, float(data.sum()) / K)
    repeats = np.zeros(data.size + 1, dtype=np.int64)
    np.cumsum(np.maximum(data - 1.0, 0.0).astype(np.int64), out=repeats[1:])
    first = repeats[indptr[:-1]]
    u = np.random.default_rng(1).random(int(repeats[-1]))

    def adjustment(order):
        out = np.empty(n)
        own_node_adjustment_nb(indptr, indices, data, data, node, theta, totals, 1e-12, order, 0, n, out)
        return out

    def tables(order):
        out = np.empty_like(data)
        _tables_nb(indptr, indices, data, node, theta, 50.0, u, first, out, order, 0, n)
        return out

    print(f"{'kernel':28s} {'storage order':>14s} {'node order':>11s} {'ratio':>6s}  same values")
    for name, kernel in (("own-node adjustment", adjustment), ("table draws", tables)):
        same = np.array_equal(kernel(storage).view(np.int64), kernel(by_node).view(np.int64))
        slow = best_cpu(lambda: kernel(storage), args.repeat)
        fast = best_cpu(lambda: kernel(by_node), args.repeat)
        print(f"{name:28s} {1e3 * slow:11.1f} ms {1e3 * fast:8.1f} ms {slow / fast:5.2f}x  {same}")
    print(f"ordering the rows (rows_by_node): {1e3 * best_cpu(lambda: rows_by_node(node), args.repeat):.1f} ms")


if __name__ == "__main__":
    main()
