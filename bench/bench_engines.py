"""Local engine against the Ray engine: one z-sweep, same corpus, same candidates.

Corpus: synthetic sparse term frequencies (default 50,000 documents, V = 20,000, ~30 non-zeros
per row). The candidates of a random tree of ~100 live nodes (plus one placeholder per node
above the depth cap) are built directly, so only the sweep is timed, not the estimator around
it. Configurations, all in this process, in two phases timed round-robin (one sweep of each in
turn, so that a busy spell of a shared machine does not land on one configuration only):

1. local engine, 1 shard and 2 shards on 2 threads (the baselines); Ray engine on a
   single-node local cluster with 1 and 2 shard actors;
2. local engine, 2 shards on 2 threads again; Ray engine on a two-node cluster on loopback
   (head + one worker node, one CPU each) with 2 shard actors, one per node.

For each: seconds per sweep (median over ``--sweeps`` after one warm-up sweep, which compiles
the kernels in fresh actors), the ratio to the local engine with the same number of cores in
the same phase,
bytes per sweep through the object store (the broadcast candidates once, plus every shard's
returned statistics), seconds and bytes to load the shards, and peak resident memory of the
driver and of each actor. Every configuration's merged statistics are checked bit-identical to
the local engine's with the same shard count.

Usage: python bench/bench_engines.py [--docs 50000] [--vocab 20000] [--nnz 30] [--nodes 100]
                                     [--sweeps 3] [--no-cluster]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pickle
import resource
import time

import numpy as np

import streamtree  # noqa: F401
from streamtree.engines.base import shard_bounds
from streamtree.engines.local import LocalEngine
from streamtree.inference.enumerated import VMF, Candidates, SweepStats, sweep_rows
from streamtree.inference.sticks import log_masses, sample_sticks, stick_params
from streamtree.likelihoods.vmf import log_normalizer
from streamtree.synthetic import sparse_corpus
from streamtree.tree import TSSBTree

MB = 1024.0 ** 2


def make_candidates(rng: np.random.Generator, X, n_nodes: int, max_depth: int = 3) -> Candidates:
    """Candidates of a random tree, formed as the estimator forms them (vMF)."""
    tree = TSSBTree(max_depth)
    ids = [0]
    while len(ids) < n_nodes:
        open_ids = [i for i in ids if not tree.at_cap(i)]
        ids.append(tree.add_child(int(rng.choice(open_ids))))
    arrays = tree.arrays()
    p = X.shape[1]
    theta = np.empty((arrays.size, p))
    for k in range(arrays.size):  # directions: normalised sums of a few random documents
        v = np.asarray(X[rng.integers(0, X.shape[0], size=40)].sum(axis=0)).ravel() + 1e-3
        theta[k] = v / np.linalg.norm(v)
    params = stick_params(arrays, rng.integers(1, 500, size=arrays.size), alpha0=1.0, lam=0.5, gamma=0.5,
                          max_depth=max_depth)
    log_pi, log_res = log_masses(arrays, sample_sticks(params, rng))
    beta = rng.uniform(50.0, 400.0, size=arrays.size)
    ph = np.flatnonzero(np.isfinite(log_res))
    prior = np.full(ph.size, 1e4)
    ph_a = log_res[ph] + log_normalizer(p, beta[ph]) + log_normalizer(p, prior)
    return Candidates(VMF, np.ascontiguousarray(theta.T), log_pi + log_normalizer(p, beta), beta,
                      np.zeros(arrays.size), ph.astype(np.int64), ph_a, beta[ph], prior)


def nbytes(obj) -> int:
    """Serialised size as Ray stores it: pickle protocol 5 with out-of-band array buffers."""
    buffers: list = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return len(head) + sum(memoryview(b).nbytes for b in buffers)


def digest(st: SweepStats) -> str:
    """Fingerprint of merged statistics (kept instead of the dense statistics, ~15 MB each)."""
    h = hashlib.sha256()
    for a in (st.counts, st.occupied, st.sums, st.sumsq, np.array([st.loglik])):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def run_interleaved(engines: dict, X, cand, n_sweeps: int) -> dict:
    """Load every engine, one warm-up sweep each, then time them round-robin.

    Round-robin keeps a slow spell of a shared machine from landing on one configuration only.
    ``engines`` maps a name to ``(engine, seeds)``.
    """
    out = {}
    for name, (engine, seeds) in engines.items():
        t = time.perf_counter()
        engine.load(X, seeds)
        load_s = time.perf_counter() - t
        t = time.perf_counter()
        stats = [digest(engine.sweep(cand))]
        out[name] = {"load_s": load_s, "warm_s": time.perf_counter() - t, "stats": stats, "times": [],
                     "cores": engine.n_shards}
    for _ in range(n_sweeps):
        for name, (engine, _) in engines.items():
            t = time.perf_counter()
            st = engine.sweep(cand)
            out[name]["times"].append(time.perf_counter() - t)
            out[name]["stats"].append(digest(st))
            del st
    for name, (engine, _) in engines.items():
        r = out[name]
        r["sweep_s"] = float(np.median(r["times"]))
        r["labels"] = engine.labels()
        if hasattr(engine, "shard_info"):
            r["actors"] = engine.shard_info()
    return out


def shard_traffic(engine, X, cand, seeds) -> list[int]:
    """Bytes of each shard's returned statistics (recomputed in-process, same numbers)."""
    b = shard_bounds(X.shape[0], engine.n_shards)
    out = []
    for s in range(engine.n_shards):
        rng = np.random.Generator(np.random.PCG64(seeds[s]))
        out.append(nbytes(sweep_rows(X[b[s]:b[s + 1]], cand, rng)[1]))
    return out


def traffic_formula(K: int, P: int, V: int, nnz: int, shards: int) -> dict:
    """Bytes per sweep (upper bounds) through the object store, as a function of the tree's K
    live and P placeholder columns, the vocabulary V, the corpus non-zeros and the shards.

    * broadcast (driver -> each machine holding actors): theta 8 K V, per-column vectors
      8 (4 K + 4 P) (each shard builds its own new-node tables);
    * returned (all shards -> driver): per shard counts and sums of squares 16 (K + P), occupied
      columns 8 min(K + P, n_s), sparse sums 12 nnz(sums_s) + 4 (occupied + 1) with
      nnz(sums_s) <= min(occupied V, nnz(X_s)); summed: <= 12 nnz + shards (28 (K + P) + 4).
    """
    cols = K + P
    broadcast = 8 * K * V + 8 * 4 * cols
    returned = 12 * nnz + shards * (28 * cols + 4)
    dense_returned = shards * (8 * K * V + 16 * cols)  # before: dense per-node sums from every shard
    return {"broadcast": broadcast, "returned": returned, "dense_returned": dense_returned}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=50_000)
    ap.add_argument("--vocab", type=int, default=20_000)
    ap.add_argument("--nnz", type=int, default=30)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--sweeps", type=int, default=3, help="timed sweeps per configuration")
    ap.add_argument("--no-cluster", action="store_true", help="skip the two-node loopback cluster")
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    t = time.perf_counter()
    X = sparse_corpus(rng, n_docs=args.docs, p=args.vocab, nnz_per_row=args.nnz).X
    cand = make_candidates(rng, X, args.nodes)
    print(f"corpus {X.shape[0]:,} x {X.shape[1]:,}, {X.nnz / X.shape[0]:.1f} nnz/row, "
          f"{(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes) / MB:.1f} MB CSR; "
          f"{cand.n_live} live + {cand.n_placeholders} placeholder columns (built in {time.perf_counter() - t:.1f} s)")
    cand_bytes = nbytes(cand)
    print(f"broadcast candidates: {cand_bytes / MB:.2f} MB per sweep "
          f"(theta {cand.coef_T.nbytes / MB:.2f} MB; new-node tables are built by each shard)")

    seeds = {n: np.random.SeedSequence(1).spawn(n) for n in (1, 2)}
    traffic = {n: shard_traffic(LocalEngine(n_shards=n), X, cand, seeds[n]) for n in (1, 2)}

    from streamtree.engines.ray import RayEngine

    # phase 1: local engines and a single-node Ray (3 logical CPUs: 1 + 2 actors, never busy at once)
    t = time.perf_counter()
    ray1 = RayEngine(n_shards=1, init_kwargs={"num_cpus": 3})
    ray1._start()
    ray2 = RayEngine(n_shards=2)
    ray2._start()
    print(f"single-node Ray and 3 actors started in {time.perf_counter() - t:.1f} s")
    phases = [run_interleaved({
        "local 1 shard, 1 thread": (LocalEngine(n_shards=1, n_jobs=1), seeds[1]),
        "local 2 shards, 2 threads": (LocalEngine(n_shards=2, n_jobs=2), seeds[2]),
        "ray 1 node, 1 actor": (ray1, seeds[1]),
        "ray 1 node, 2 actors": (ray2, seeds[2]),
    }, X, cand, args.sweeps)]
    ray2.close()
    ray1.close()  # the owner of the local cluster: shuts it down

    if not args.no_cluster:
        import ray
        from ray.cluster_utils import Cluster

        from streamtree.engines.ray import _loopback_only, _set_auth_mode

        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        _set_auth_mode(os.environ.get("RAY_AUTH_MODE", "disabled"))
        t = time.perf_counter()
        with _loopback_only():
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
            cluster.add_node(num_cpus=1)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address)
        try:
            eng = RayEngine(n_shards=2)
            eng._start()
            print(f"two-node loopback cluster and 2 actors started in {time.perf_counter() - t:.1f} s")
            phase = run_interleaved({
                "local 2 shards, 2 threads ": (LocalEngine(n_shards=2, n_jobs=2), seeds[2]),
                "ray 2 nodes, 2 actors": (eng, seeds[2]),
            }, X, cand, args.sweeps)
            assert len({a["node_id"] for a in phase["ray 2 nodes, 2 actors"]["actors"]}) == 2, \
                "shards did not land on both nodes"
            phases.append(phase)
            eng.close()
        finally:
            ray.shutdown()
            cluster.shutdown()

    driver_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print()
    print(f"{'configuration':34s} {'s/sweep':>8s} {'vs local':>9s} {'1st sweep':>9s} {'load s':>7s} "
          f"{'MB/sweep':>9s} {'actor peak MB':>14s}  identical")
    rows = []
    for phase in phases:
        local = {r["cores"]: r for name, r in phase.items() if name.startswith("local")}
        rows += [(name, r, local[r["cores"]]) for name, r in phase.items()]
    for name, r, base in rows:
        n = r["cores"]
        ratio = r["sweep_s"] / base["sweep_s"]
        ok = r["stats"] == base["stats"] and np.array_equal(r["labels"], base["labels"])
        mb = (cand_bytes + sum(traffic[n])) / MB if name.startswith("ray") else 0.0
        peaks = ", ".join(f"{a['max_rss_bytes'] / MB:.0f}" for a in r.get("actors", []))
        print(f"{name:34s} {r['sweep_s']:8.3f} {ratio:8.2f}x {r['warm_s']:9.2f} {r['load_s']:7.2f} "
              f"{mb:9.1f} {peaks or '-':>14s}  {'yes' if ok else 'NO'}")
    K, P, V = cand.n_live, cand.n_placeholders, X.shape[1]
    for n in (1, 2):
        f = traffic_formula(K, P, V, X.nnz, n)
        print(f"returned statistics with {n} shard(s): " + ", ".join(f"{b / MB:.2f} MB" for b in traffic[n])
              + f" (sparse per-node sums; formula bound {f['returned'] / MB:.2f} MB in all; "
              f"dense K x V sums would be {f['dense_returned'] / MB:.1f} MB)")
    f = traffic_formula(K, P, V, X.nnz, 1)
    print(f"broadcast per machine: measured {cand_bytes / MB:.2f} MB, formula {f['broadcast'] / MB:.2f} MB")
    for nodes in (100, 300):
        for shards in (100,):
            g = traffic_formula(nodes, nodes // 3, V, X.nnz, shards)
            print(f"projection K={nodes} live nodes, {shards} shards on {shards} machines: returned <= "
                  f"{g['returned'] / MB:.1f} MB (dense sums: {g['dense_returned'] / MB:,.0f} MB), broadcast "
                  f"{g['broadcast'] / MB:.1f} MB per machine = {shards * g['broadcast'] / MB:,.0f} MB if every "
                  f"machine pulls from the driver")
    print(f"driver peak RSS: {driver_rss / MB:.0f} MB")


if __name__ == "__main__":
    main()
