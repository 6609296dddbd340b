"""Short documents: does a default fit find flat topics when each document holds a few tokens?

Data (this script's own generator, not the model's): ``--topics`` flat topics, each a
``Dirichlet(--topic-concentration)`` draw over ``--vocabulary`` terms (at 0.05 over 3,000 terms a
topic puts most of its mass on about a hundred terms, so topics barely share words), and
``--documents`` documents, each from one uniformly drawn topic with ``1 + Poisson(L - 1)`` tokens
for each mean length ``L`` in ``--lengths``. No hierarchy and no time: one epoch.

Model: ``DTSSBP`` at its defaults apart from ``max_depth=3`` (``--likelihood``; the vMF reads the
L2-normalised counts; ``--split-node integrated`` for the split-merge moves' other mode).
Baselines, in the same run and on the same documents, both given the true number of topics:
scikit-learn's ``KMeans`` on the L2-normalised counts, and a mixture of unigrams fitted by EM
(the best of three random starts by log likelihood; a reference, not a ceiling: one local
optimum, which the model sometimes beats).

Per length and seed: whether the fit warned that the documents are too short
(``DTSSBP``'s short-documents warning), nodes holding >= 1% of the documents against the truth (target
0.67-1.5x, as the planted benchmark's), occupied nodes (holding documents, themselves or below
them), how many of those are relays (no documents of their own and one child; on flat topics
most leaves end at the depth cap below them), the share of the documents in nodes
holding < 1% (a scatter of small nodes the first count does not show), ARI against the topics (target: at or
above the better baseline; on short documents k-means falls to about 0, so the planted
benchmark's bar, k-means alone, would pass a model that recovers nothing), and CPU seconds of
each side.

Usage: python bench/bench_short_documents.py [--lengths 3,4,5,6,8,12] [--seeds 0-1]
       [--likelihood multinomial[,vmf]] [--topics 10] [--documents 3000] [--vocabulary 3000]
       [--topic-concentration 0.05] [--split-node fixed|integrated]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import scipy.sparse as sp
from scipy.special import logsumexp
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score
from sklearn.preprocessing import normalize

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from bench_planted import parse_integers
from bench_relays import occupied_relays
from streamtree.model import DTSSBP

EM_STARTS = 3
EM_ITERATIONS = 200
EM_SMOOTHING = 0.01  # pseudo-count per term and topic


def flat_topics(n_topics: int, n_docs: int, mean_length: float, n_terms: int, concentration: float,
                seed: int) -> tuple[sp.csr_matrix, np.ndarray]:
    """Token counts of ``n_docs`` documents from ``n_topics`` flat topics, and each document's topic."""
    rng = np.random.default_rng(seed)
    phi = rng.dirichlet(np.full(n_terms, concentration), n_topics)
    topic = rng.integers(n_topics, size=n_docs)
    lengths = 1 + rng.poisson(max(mean_length - 1.0, 0.0), n_docs)
    counts = np.stack([rng.multinomial(n, phi[k]) for k, n in zip(topic, lengths)]).astype(np.float64)
    return sp.csr_matrix(counts), topic


def unigram_mixture(C: sp.csr_matrix, k: int, seed: int) -> np.ndarray:
    """Hard labels of the best of :data:`EM_STARTS` EM fits of a ``k``-topic mixture of unigrams."""
    rng = np.random.default_rng(seed)
    best, best_ll = None, -np.inf
    for _ in range(EM_STARTS):
        resp = rng.dirichlet(np.ones(k), C.shape[0])
        for _ in range(EM_ITERATIONS):
            words = (C.T @ resp).T + EM_SMOOTHING
            log_phi = np.log(words / words.sum(axis=1, keepdims=True))
            log_weight = np.log((resp.sum(axis=0) + 1e-12) / C.shape[0])
            joint = C @ log_phi.T + log_weight
            norm = logsumexp(joint, axis=1, keepdims=True)
            resp = np.exp(joint - norm)
        ll = float(norm.sum())
        if ll > best_ll:
            best, best_ll = resp.argmax(axis=1), ll
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="3,4,5,6,8,12", help="mean document lengths in tokens, comma-separated")
    p.add_argument("--seeds", default="0-1", help="seeds of corpus and sampler alike, e.g. 0-3 or 0,2")
    p.add_argument("--likelihood", default="multinomial", help="comma-separated, e.g. multinomial,vmf")
    p.add_argument("--topics", type=int, default=10)
    p.add_argument("--documents", type=int, default=3000)
    p.add_argument("--vocabulary", type=int, default=3000)
    p.add_argument("--topic-concentration", type=float, default=0.05)
    p.add_argument("--split-node", choices=("fixed", "integrated"), default=None,
                   help="DTSSBP's split_node (default: the estimator's)")
    args = p.parse_args()
    settings = {} if args.split_node is None else {"split_node": args.split_node}
    lengths = [float(s) for s in args.lengths.split(",") if s.strip()]
    seeds = parse_integers(args.seeds)
    likelihoods = [s.strip() for s in args.likelihood.split(",") if s.strip()]
    k = args.topics
    print(f"== short documents: {k} flat topics, Dirichlet({args.topic_concentration:g}) over "
          f"{args.vocabulary} terms, {args.documents} documents; DTSSBP at defaults, max_depth=3"
          + "".join(f", {name}={value}" for name, value in settings.items()))
    print(f"{'model':>12} {'length':>6} {'seed':>4} {'nodes>=1%':>9} {'ratio':>6} {'(0.67-1.5x)':>11} "
          f"{'occupied':>8} {'relays':>6} {'in <1%':>6} {'ARI':>6} {'k-means':>7} {'EM mixture':>10} {'(>= both)':>9} {'warned':>6} {'CPU s':>6} "
          f"{'k-means CPU':>11} {'EM CPU':>6}")
    met = {lik: 0 for lik in likelihoods}
    total = 0
    for length in lengths:
        for seed in seeds:
            C, topic = flat_topics(k, args.documents, length, args.vocabulary, args.topic_concentration, seed)
            rows = normalize(C)
            c0 = time.process_time()
            km = KMeans(n_clusters=k, random_state=seed, n_init=3).fit(rows)
            km_cpu = time.process_time() - c0
            km_ari = adjusted_rand_score(topic, km.labels_)
            c0 = time.process_time()
            em_ari = adjusted_rand_score(topic, unigram_mixture(C, k, seed))
            em_cpu = time.process_time() - c0
            total += 2
            for lik in likelihoods:
                model = DTSSBP(likelihood=lik, max_depth=3, random_state=seed, **settings)
                c0 = time.process_time()
                with warnings.catch_warnings(record=True) as caught:  # shown as a column instead
                    warnings.simplefilter("always")
                    model.partial_fit(C if lik == "multinomial" else rows)
                cpu = time.process_time() - c0
                warned = any("tokens" in str(w.message) for w in caught)
                model.close()
                tree = model.trees_[-1]
                big = int(np.sum(tree.counts >= 0.01 * args.documents))
                scattered = float(tree.counts[tree.counts < 0.01 * args.documents].sum()) / args.documents
                ratio = big / k
                ari = adjusted_rand_score(topic, tree.assignments)
                size_ok, ari_ok = 0.67 <= ratio <= 1.5, ari >= max(km_ari, em_ari)
                met[lik] += size_ok + ari_ok
                print(f"{lik:>12} {length:>6g} {seed:>4} {big:>9} {ratio:>5.2f}x {'met' if size_ok else 'NOT met':>11} "
                      f"{tree.n_occupied:>8} {occupied_relays(tree):>6} {scattered:>6.1%} {ari:>6.3f} {km_ari:>7.3f} {em_ari:>10.3f} {'met' if ari_ok else 'NOT met':>9} "
                      f"{'yes' if warned else 'no':>6} {cpu:>6.1f} {km_cpu:>11.1f} {em_cpu:>6.1f}", flush=True)
    for lik in likelihoods:
        print(f"   {lik}: {met[lik]} of {total} targets met")


if __name__ == "__main__":
    main()
