"""Where a planted-tree miss comes from: the first epoch from the root, from the planted tree, from a k-means tree.

Corpus: the first epoch of :func:`streamtree.synthetic.planted_dirichlet_tree` (as
``bench_planted.py``: V 2,000, 5,000 documents, 31 true nodes of depth up to 3, documents at
every node). Model: ``DTSSBP`` at its defaults but ``max_depth``, on the product's row form of
each family (``bench_planted.model_input``), with the chain started in these ways:

* **root**: the default, every document at a root fitted to all of them;
* **planted**: the chain's tree is the planted tree before its first sweep, each node's parameter
  fitted to its own true documents by the family (``Likelihood.initial_root`` of those rows;
  a node's concentration is the one a new node at its depth starts with). The tree and its
  parameters are planted, not the documents' places: the first sweep draws those, with every
  document counted at the root in its sticks, as in any first epoch;
* **kmeans** (with ``--branching``, e.g. ``3,3,2``): a tree of recursive k-means clusters of the
  L2-normalised rows, ``branching[d]`` children under each node at depth ``d``, each node's
  parameter fitted to the rows of its cluster (no true labels read).

Only the start changes: the same target, moves and sweeps follow.

The start does not change the target, but the chain is not a plain sampler of it (the node
update is a mode-finding step), so the figures say where the chain goes, not which state the
target ranks higher. A planted start that the chain keeps (node count and ARI near the truth's)
while the root start ends elsewhere says the root start's miss is where its search settles; a
planted start that the chain leaves for the same lumps says the chain's own steps make them.

Baselines in the same run: k-means given the true number of nodes (L2-normalised term
frequencies, as ``bench_planted.py``), and the planted parameters' own classification (each
document to the node of largest planted mass times likelihood of its counts): what the
documents allow when the parameters are known.

Figures per chain and start: nodes holding >= 1% of the documents (truth: 30-31 of the 31), ARI
against the true nodes, live nodes, the share of documents at nodes with children (the truth's
share beside it), CPU seconds of the fit (for the k-means start, building its tree included).

The start is made by swapping the sampler's ``run`` while the fit runs (restored after), a
diagnostic seam, not an option of the product.

Usage: python bench/bench_planted_start.py [--seeds 0-3] [--likelihood vmf,multinomial]
       [--max-depth 3] [--sweeps N] [--split-node fixed|integrated] [--branching 3,3,2]
"""

from __future__ import annotations

import argparse
import contextlib
import time

import numpy as np
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score
from sklearn.preprocessing import normalize

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from bench_planted import big_nodes, model_input, parse_integers
from streamtree.inference.epoch_sampler import EpochSampler
from streamtree.model import DTSSBP
from streamtree.synthetic import PlantedTreeCorpus, planted_dirichlet_tree
from streamtree.text import reference_length
from streamtree.tree import ROOT

KMEANS_SEED = 0


def plant(state, likelihood, X, corpus: PlantedTreeCorpus, epoch: int) -> None:
    """Give an empty chain state the planted tree of the first epoch: each true node a node,
    its parameter fitted by the family to its own true documents (its parent's where it has
    none), its concentration a new node's at its depth."""
    labels = corpus.labels[0]
    theta_all, concentration = likelihood.initial_root(X)
    ids = sorted(corpus.node_ids[0].tolist(), key=lambda i: (corpus.depth[i], i))
    node_of: dict[int, int] = {}
    theta_of: dict[int, np.ndarray] = {}
    for i in ids:
        rows = np.flatnonzero(labels == i)
        parent = int(corpus.parent[i])
        theta = likelihood.initial_root(X[rows])[0] if rows.size else theta_of.get(parent, theta_all)
        theta_of[i] = theta
        if parent < 0:
            state.nodes.add(ROOT, theta, concentration)
            state.tree.born[ROOT] = epoch
            node_of[i] = ROOT
            continue
        node = state.tree.add_child(node_of[parent], born=epoch)
        state.nodes.add(node, theta, likelihood.new_node_concentration(concentration, int(corpus.depth[i])))
        node_of[i] = node


def plant_kmeans(state, likelihood, X, branching: tuple[int, ...], epoch: int) -> None:
    """Give an empty chain state a tree of recursive k-means clusters of the L2-normalised rows
    (``branching[d]`` under each node at depth ``d``; a cluster of fewer than twice that many
    rows is not divided), each node's parameter fitted by the family to its cluster's rows."""
    theta, concentration = likelihood.initial_root(X)
    state.nodes.add(ROOT, theta, concentration)
    state.tree.born[ROOT] = epoch
    Y = normalize(X.astype(np.float64))

    def grow(node: int, rows: np.ndarray, depth: int) -> None:
        if depth >= len(branching) or rows.size < 2 * branching[depth]:
            return
        km = KMeans(n_clusters=branching[depth], random_state=KMEANS_SEED, n_init=3).fit(Y[rows])
        for k in range(branching[depth]):
            cluster = rows[km.labels_ == k]
            if cluster.size:
                child = state.tree.add_child(node, born=epoch)
                state.nodes.add(child, likelihood.initial_root(X[cluster])[0],
                                likelihood.new_node_concentration(concentration, depth + 1))
                grow(child, cluster, depth + 1)

    grow(ROOT, np.arange(X.shape[0]), 0)


@contextlib.contextmanager
def chain_start(make):
    """While open, a chain that starts without nodes starts from ``make(state, likelihood, X,
    epoch)``'s tree instead of the root alone."""
    original = EpochSampler.run

    def run(self, X, epoch, label, shard_seeds, previous):
        if len(self.state.nodes) == 0:
            make(self.state, self.likelihood, X, epoch)
        return original(self, X, epoch, label, shard_seeds, previous)

    EpochSampler.run = run
    try:
        yield
    finally:
        EpochSampler.run = original


def planted_classification(corpus: PlantedTreeCorpus) -> np.ndarray:
    """Each document's node under the planted parameters: largest log mass plus log likelihood."""
    scores = corpus.counts[0] @ np.log(corpus.word_dists[0]).T + np.log(corpus.masses[0])
    return corpus.node_ids[0][np.argmax(scores, axis=1)]


def inner_share(assignments: np.ndarray, parent_of) -> float:
    """Share of documents at nodes that have children."""
    inner = {int(p) for p in parent_of if int(p) >= 0}
    return float(np.isin(assignments, list(inner)).mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-3")
    p.add_argument("--likelihood", default="vmf,multinomial")
    p.add_argument("--max-depth", type=int, default=3)
    p.add_argument("--sweeps", type=int, default=None)
    p.add_argument("--split-node", choices=("fixed", "integrated"), default=None,
                   help="the model's split_node (default: the model's)")
    p.add_argument("--branching", default=None,
                   help="also start from a recursive k-means tree with these children per depth, e.g. 3,3,2")
    args = p.parse_args()
    likelihoods = args.likelihood.split(",")
    starts = ["root", "planted"] + (["kmeans"] if args.branching else [])
    branching = tuple(int(b) for b in args.branching.split(",")) if args.branching else ()
    if len(branching) > args.max_depth:
        p.error(f"--branching {args.branching} makes a tree {len(branching)} deep: --max-depth must be at least that")
    print(f"{'seed':>4} {'family':>12} {'start':>8} {'nodes>=1%':>10} {'truth':>5} {'ratio':>6} {'ARI':>6} "
          f"{'live K':>6} {'at inner':>8} {'truth':>6} {'CPU s':>6}")
    summary: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for seed in parse_integers(args.seeds):
        corpus = planted_dirichlet_tree(np.random.default_rng(seed), n_features=2000, n_documents=5000, n_epochs=1)
        if int(corpus.depth[corpus.node_ids[0]].max()) > args.max_depth:
            p.error(f"the planted tree is {int(corpus.depth.max())} deep: --max-depth must be at least that")
        truth = corpus.labels[0]
        true_big = big_nodes(truth)
        true_inner = inner_share(truth, corpus.parent[corpus.node_ids[0]])
        km = KMeans(n_clusters=np.unique(truth).size, random_state=seed).fit(
            normalize(corpus.counts[0].astype(np.float64)))
        print(f"{seed:>4} baselines: k-means (true k) ARI {adjusted_rand_score(truth, km.labels_):.3f}; "
              f"planted parameters' classification ARI {adjusted_rand_score(truth, planted_classification(corpus)):.3f}")
        makers = {"root": None,
                  "planted": lambda st, lik, X, epoch: plant(st, lik, X, corpus, epoch),
                  "kmeans": lambda st, lik, X, epoch: plant_kmeans(st, lik, X, branching, epoch)}
        counts = corpus.counts[0]
        inputs = {f: model_input(counts, f, reference=reference_length(counts)) for f in likelihoods}
        for likelihood, start in ((f, s) for f in likelihoods for s in starts):
            X = inputs[likelihood]
            params = {"likelihood": likelihood, "max_depth": args.max_depth, "random_state": seed}
            if args.sweeps is not None:
                params["n_sweeps"] = args.sweeps
            if args.split_node is not None:
                params["split_node"] = args.split_node
            c0 = time.process_time()
            with chain_start(makers[start]) if makers[start] else contextlib.nullcontext():
                model = DTSSBP(**params).partial_fit(X)
            cpu = time.process_time() - c0
            tree = model.trees_[-1]
            labels = np.asarray(tree.assignments)
            big = big_nodes(labels)
            ari = adjusted_rand_score(truth, labels)
            at_inner = inner_share(labels, tree.parent)
            summary.setdefault((likelihood, start), []).append((big / true_big, ari))
            print(f"{seed:>4} {likelihood:>12} {start:>8} {big:>10} {true_big:>5} {big / true_big:>6.2f} {ari:>6.3f} "
                  f"{tree.n_nodes:>6} {at_inner:>8.2f} {true_inner:>6.2f} {cpu:>6.1f}")
    print("\nmean over the seeds (node ratio, ARI):")
    for (likelihood, start), rows in summary.items():
        ratio, ari = np.mean(rows, axis=0)
        print(f"  {likelihood:>12} {start:>8}: {ratio:.2f}x, {ari:.3f}")


if __name__ == "__main__":
    main()
