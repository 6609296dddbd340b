"""z-sweep throughput against its floor, and one full epoch of the estimator on 1 and 2 threads.

Corpus: synthetic sparse term frequencies (default 50,000 documents, V = 20,000, ~30 non-zeros
per row, planted topics). Prints:

* the floor: time of the sparse-dense product ``X @ Theta.T`` alone (SciPy, one thread; what any
  enumerated sampler must at least pay), measured in the same process;
* one enumerated z-sweep over a tree of ~100 live nodes (plus one placeholder per non-cap node)
  on one thread and on ``--threads`` threads: seconds, throughput, ratio to the floor;
* one full epoch of ``DTSSBP(likelihood="vmf", max_depth=3)`` at its defaults otherwise (or
  ``--likelihood multinomial`` on the same documents as integer counts, or at ``--kappa0``; default 50 sweeps; ARI of its assignments against the planted topics) with ``n_jobs=1`` and
  ``n_jobs=--threads``, interleaved ``--repeat`` times: CPU seconds at n_jobs=1 (target < 30 s),
  wall speed-up (target >= 1.7x), whether every run gave the same tree, what the tree's nodes
  are (how many hold documents, how many fewer than ten, how many planted topics are cut into
  two or more nodes and how the pieces are related), and peak memory;
* with ``--parts``: one more ``n_jobs=1`` epoch with the thread CPU time of each step of the
  sweep loop, the share of the steps that run on ``n_jobs`` threads (the z-sweep's product and
  draw, the new-node table, the per-node sums, the MAP step's block passes) and the wall
  speed-up that share allows on ``--threads`` threads (Amdahl's bound), and each move kind's
  runs, acceptances and thread CPU (what the moves cost against what they change).

Usage: python bench/bench_zsweep.py [--docs 50000] [--vocab 20000] [--nodes 100] [--sweeps 50]
       [--threads 2] [--repeat 2] [--skip-epoch] [--parts] [--kappa0 K]
       [--likelihood vmf|multinomial]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import resource
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from sklearn.metrics import adjusted_rand_score
from threadpoolctl import threadpool_limits

import streamtree  # noqa: F401
from move_counts import move_counters, print_moves
from streamtree.inference.enumerated import VMF, Candidates, row_sq_norms, sweep_rows
from streamtree.inference.sticks import log_masses, sample_sticks, stick_params
from streamtree.likelihoods.vmf import log_normalizer
from streamtree.synthetic import l2_rows, sparse_corpus
from streamtree.tree import TSSBTree


def best_of(fn, repeat=3):
    best = np.inf
    out = None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def build_candidates(rng, X, n_nodes, max_depth=3):
    tree = TSSBTree(max_depth)
    ids = [0]
    while len(ids) < n_nodes:
        par = int(rng.choice([i for i in ids if not tree.at_cap(i)]))
        ids.append(tree.add_child(par))
    arrays = tree.arrays()
    p = X.shape[1]
    # node directions: normalised means of random document subsets (realistic sparsity/overlap)
    theta = np.empty((arrays.size, p))
    for k in range(arrays.size):
        rows = rng.integers(0, X.shape[0], size=50)
        v = np.asarray(X[rows].sum(axis=0)).ravel() + 1e-3
        theta[k] = v / np.linalg.norm(v)
    counts = rng.integers(1, 500, size=arrays.size)
    params = stick_params(arrays, counts, alpha0=1.0, lam=0.5, gamma=0.5, max_depth=max_depth)
    log_pi, log_res = log_masses(arrays, sample_sticks(params, rng))
    beta = rng.uniform(50, 400, size=arrays.size)
    ph = np.flatnonzero(np.isfinite(log_res))
    kappa = np.full(ph.size, 1e4)
    cand = Candidates(VMF, np.ascontiguousarray(theta.T), log_pi + log_normalizer(p, beta), beta,
                      np.zeros(arrays.size), ph.astype(np.int64),
                      log_res[ph] + log_normalizer(p, beta[ph]) + log_normalizer(p, kappa), beta[ph], kappa)
    return cand


def cpu_wall(fn):
    c, w = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c, time.perf_counter() - w, out


#: (module, owner, attribute, step name, runs on n_jobs threads) of the timed steps; nested
#: steps are timed inside their parents and reported indented
STEPS = (
    ("streamtree.engines.local", "LocalEngine", "sweep", "z-sweep (engine)", False),
    ("streamtree.inference.enumerated", None, "score_rows", "  product + draw + table", True),
    ("streamtree.inference.enumerated", None, "sweep_statistics", "  shard statistics", False),
    ("streamtree.inference.enumerated", None, "dense_column_sums", "    per-node sums", True),
    ("streamtree.inference.enumerated", "SweepStats", "combine", "  combine shards", False),
    ("streamtree.inference.epoch_sampler", "NodeTable", "theta_columns", "node columns for the kernel", False),
    ("streamtree.inference.epoch_sampler", "EpochSampler", "_materialise", "new nodes, per-node sums", False),
    ("streamtree.inference.epoch_sampler", "EpochSampler", "_split_merge", "split-merge + relocations", False),
    ("streamtree.inference.epoch_sampler", "EpochSampler", "_lift_moves", "lifts of empty nodes", False),
    ("streamtree.inference.epoch_sampler", "EpochSampler", "_merge_internal", "internal merge", False),
    ("streamtree.inference.epoch_sampler", None, "sample_hyperparameters", "stick hyperparameters", False),
    ("streamtree.inference.epoch_sampler", "EpochSampler", "_update_concentrations", "concentrations", False),
    ("streamtree.inference.epoch_sampler", "EpochSampler", "_update_theta", "MAP step", False),
    ("streamtree.inference.theta_map", None, "_vmf_block", "  block passes", True),
    ("streamtree.likelihoods.multinomial", None, "_solve_nodes_nb", "  node solves (multinomial)", True),
)


def tree_composition(tree, labels: np.ndarray) -> str:
    """What the live nodes of a fitted flat corpus are: how many hold documents, how many of the
    planted topics are cut into two or more nodes (each holding at least a tenth of the topic),
    how the two largest pieces are related, and how many nodes hold fewer than ten documents. The
    z-sweep and the node update cost in proportion to the live nodes; these say how many of them
    a right-sized tree would not have."""
    ids = tree.node_ids.tolist()
    row = {n: k for k, n in enumerate(ids)}
    counts = np.asarray(tree.counts)  # the epoch's documents at each node
    table = np.zeros((labels.max() + 1, len(ids)), dtype=np.int64)
    np.add.at(table, (labels, np.array([row[int(n)] for n in tree.assignments])), 1)
    table = table[table.sum(axis=1) > 0]  # the topics that drew documents
    share = table / table.sum(axis=1, keepdims=True)
    parent = {n: int(p) for n, p in zip(ids, tree.parent.tolist())}
    kinds: dict[str, int] = defaultdict(int)
    for t in range(table.shape[0]):
        pieces = [k for k in np.argsort(-share[t], kind="stable") if share[t, k] >= 0.1]
        if len(pieces) < 2:
            continue
        a, b = ids[pieces[0]], ids[pieces[1]]  # the two largest
        kinds["parent and child" if parent[a] == b or parent[b] == a else
              "siblings" if parent[a] == parent[b] else "further apart"] += 1
    n_cut = sum(kinds.values())
    return (f"{int((counts > 0).sum())} of {len(ids)} nodes hold documents, {int(((counts > 0) & (counts < 10)).sum())} "
            f"of them fewer than ten; {n_cut} of {table.shape[0]} planted topics cut into two or more nodes"
            + (f" ({', '.join(f'{k}: {v}' for k, v in sorted(kinds.items()))})" if n_cut else ""))


@contextlib.contextmanager
def step_timers(cpu: dict, wall: dict):
    """Thread CPU and wall seconds of each step in :data:`STEPS`, added up into ``cpu`` and
    ``wall`` while the block runs (the steps are wrapped, then restored)."""
    import importlib

    undo = []
    for module, owner, attr, name, _ in STEPS:
        host = importlib.import_module(module)
        host = getattr(host, owner) if owner else host
        fn = getattr(host, attr)

        def timed(*a, _fn=fn, _name=name, **k):
            c, w = time.thread_time(), time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                cpu[_name] += time.thread_time() - c
                wall[_name] += time.perf_counter() - w

        setattr(host, attr, functools.wraps(fn)(timed))
        undo.append((host, attr, fn))
    try:
        yield
    finally:
        for host, attr, fn in undo:
            setattr(host, attr, fn)


def epoch_parts(X, sweeps: int, threads: int, settings: dict, likelihood: str) -> None:
    """One ``n_jobs=1`` epoch with every step timed; prints the steps and Amdahl's bound."""
    import os

    from streamtree import DTSSBP

    cpu: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    moves: dict[tuple[str, str], list] = {}
    with step_timers(cpu, wall), move_counters(moves), DTSSBP(
            likelihood=likelihood, max_depth=3, n_sweeps=sweeps, random_state=0, n_jobs=1, **settings) as model:
        total, total_wall, m = cpu_wall(lambda: model.partial_fit(X))
    print(f"steps of one epoch at n_jobs=1 ({total:.1f} s CPU, {total_wall:.1f} s wall, load average "
          f"{os.getloadavg()[0]:.1f}, {m.trees_[-1].n_nodes} nodes; thread CPU per step):")
    for _, _, _, name, _ in STEPS:
        print(f"  {name:32s} {cpu[name]:7.2f} s  {100 * cpu[name] / total:5.1f}%")
    parallel = sum(cpu[name] for *_, name, par in STEPS if par)
    share = parallel / total
    print(f"share on n_jobs threads          : {100 * share:.1f}%  -> wall speed-up at most "
          f"{1 / (1 - share + share / threads):.2f}x on {threads} threads (Amdahl; target >= 1.7x)")
    print_moves(moves, total, "moves of the epoch (runs, accepted, thread CPU):")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=50_000)
    ap.add_argument("--vocab", type=int, default=20_000)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--sweeps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2, help="threads for the parallel side (default 2)")
    ap.add_argument("--repeat", type=int, default=2, help="interleaved repeats of the epoch runs (default 2)")
    ap.add_argument("--skip-epoch", action="store_true")
    ap.add_argument("--parts", action="store_true", help="one more epoch with each step of the sweep loop timed")
    ap.add_argument("--likelihood", choices=("vmf", "multinomial"), default="vmf",
                    help="family of the epoch runs (default vmf, on L2-normalised rows; multinomial fits "
                         "the same documents' integer counts); the z-sweep lines are the vMF kernel's")
    ap.add_argument("--kappa0", type=float, default=None,
                    help="pin the parent-link strength (default: the estimator's own default; rounds before "
                         "the default became 1e3 ran this bench at 1e4)")
    args = ap.parse_args()
    settings = {} if args.kappa0 is None else {"kappa0": args.kappa0}

    rng = np.random.default_rng(0)
    t = time.perf_counter()
    corpus = sparse_corpus(rng, n_docs=args.docs, p=args.vocab, nnz_per_row=30, n_topics=args.nodes,
                           normalise=False)
    X = l2_rows(corpus.X)  # the vMF kernel's rows; the multinomial fits the integer counts
    X_fit = X if args.likelihood == "vmf" else corpus.X
    print(f"corpus: {X.shape[0]} docs, V={X.shape[1]}, {X.nnz / X.shape[0]:.1f} nnz/row "
          f"(built in {time.perf_counter() - t:.1f}s)")
    cand = build_candidates(rng, X, args.nodes)
    K, P = cand.n_live, cand.n_placeholders
    sq = row_sq_norms(X)
    sweep_rows(X[:100], cand, np.random.default_rng(1), sq[:100])  # compile

    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(args.threads) as pool:
        floor, _ = best_of(lambda: X @ cand.coef_T)
        sweep, _ = best_of(lambda: sweep_rows(X, cand, np.random.default_rng(1), sq))
        par, _ = best_of(lambda: sweep_rows(X, cand, np.random.default_rng(1), sq, pool=pool,
                                            n_threads=args.threads))
    n = X.shape[0]
    print(f"tree: {K} live nodes + {P} placeholders = {K + P} candidate columns")
    print(f"floor  X @ Theta.T (scipy)   : {floor:.3f} s  ({n * K / floor / 1e6:.1f} M doc-node/s)")
    print(f"enumerated z-sweep, 1 thread : {sweep:.3f} s  ({n * (K + P) / sweep / 1e6:.1f} M doc-candidate/s, "
          f"{n * K / sweep / 1e6:.1f} M doc-live-node/s)")
    print(f"sweep / floor                : {sweep / floor:.2f}x  (target <= 2x)")
    print(f"z-sweep, {args.threads} threads (wall)   : {par:.3f} s  (speed-up {sweep / par:.2f}x)")

    if not args.skip_epoch:
        from streamtree import DTSSBP

        results = {1: [], args.threads: []}
        for r in range(args.repeat):  # interleave the sides so that both see the same machine load
            for jobs in ((1, args.threads) if r % 2 == 0 else (args.threads, 1)):
                with DTSSBP(likelihood=args.likelihood, max_depth=3, n_sweeps=args.sweeps, random_state=0,
                            n_jobs=jobs, **settings) as model:
                    cpu, wall, m = cpu_wall(lambda: model.partial_fit(X_fit))
                    tree = m.trees_[-1]
                results[jobs].append((cpu, wall, tree.n_nodes, tree.assignments.copy(),
                                      tree_composition(tree, corpus.labels)))
                print(f"   run {r}: n_jobs={jobs}: {cpu:.1f} s CPU, {wall:.1f} s wall, {tree.n_nodes} nodes", flush=True)
        one = min(results[1], key=lambda x: x[0])
        many = min(results[args.threads], key=lambda x: x[1])
        same = all(np.array_equal(a[3], one[3]) for a in results[1] + results[args.threads])
        ari = adjusted_rand_score(corpus.labels, one[3])
        print(f"one epoch, {args.sweeps} sweeps, n_jobs=1   : {one[0]:.1f} s CPU, {one[1]:.1f} s wall "
              f"({one[2]} live nodes at the end, ARI {ari:.3f} against the {args.nodes} planted topics; "
              f"{args.likelihood}, kappa0 {settings.get('kappa0', 'default')}; target < 30 s CPU)")
        print(f"  its tree                   : {one[4]}")
        print(f"one epoch, {args.sweeps} sweeps, n_jobs={args.threads}   : {many[1]:.1f} s wall, {many[0]:.1f} s CPU; "
              f"wall speed-up {one[1] / many[1]:.2f}x (target >= 1.7x); same trees: {same}")
        print(f"per sweep at n_jobs=1        : {one[0] / args.sweeps:.3f} s CPU = "
              f"{one[0] / args.sweeps / floor:.1f}x the floor at {K} nodes")
    if args.parts:
        epoch_parts(X_fit, args.sweeps, args.threads, settings, args.likelihood)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS                     : {peak:.0f} MiB (X itself: {(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes) / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
