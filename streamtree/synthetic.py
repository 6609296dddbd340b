"""Synthetic corpora with known evolving trees, for tests, benchmarks and the examples.

Everything here is pure: parameters and a ``numpy.random.Generator`` in, arrays out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from streamtree.likelihoods.vmf import sample_vmf


@dataclass(frozen=True)
class SyntheticEpoch:
    X: np.ndarray | sp.csr_matrix
    labels: np.ndarray  # true node name per row


def vmf_tree_corpus(rng: np.random.Generator, *, p: int = 2000, branching=(3, 2, 2), kappa: float = 300.0,
                    kappa_growth: float = 3.0, beta: float = 1500.0, docs_per_node: int = 60,
                    leaves_only: bool = False) -> SyntheticEpoch:
    """Documents from a fixed-shape tree whose directions follow the model's parent links.

    The root direction is uniform on the sphere; a node at depth d has direction
    ``vMF(theta_parent, kappa * kappa_growth**(d-1))`` and its documents are ``vMF(theta, beta)``
    (so siblings are closer to each other the deeper they are, as the dTSSBP's links imply).
    ``branching[d]`` is the number of children of each node at depth d.
    """
    root = sample_vmf(np.ones(p) / np.sqrt(p), 0.0, 1, rng)[0]
    thetas = [root]
    depth = [0]
    frontier = [0]
    for d, k in enumerate(branching):
        nxt = []
        for par in frontier:
            for _ in range(k):
                thetas.append(sample_vmf(thetas[par], kappa * kappa_growth ** d, 1, rng)[0])
                depth.append(d + 1)
                nxt.append(len(thetas) - 1)
        frontier = nxt
    max_d = len(branching)
    rows, labels = [], []
    for node, th in enumerate(thetas):
        if leaves_only and depth[node] < max_d:
            continue
        rows.append(sample_vmf(th, beta, docs_per_node, rng))
        labels += [node] * docs_per_node
    X = np.vstack(rows)
    perm = rng.permutation(X.shape[0])
    return SyntheticEpoch(sp.csr_matrix(X[perm]), np.asarray(labels)[perm])


def sparse_corpus(rng: np.random.Generator, *, n_docs: int, p: int, nnz_per_row: int = 30,
                  n_topics: int = 100, topic_words: int = 400) -> SyntheticEpoch:
    """A large sparse term-frequency corpus (rows L2-normalised) with planted topics.

    Each topic owns a random set of ``topic_words`` words; a document draws its words mostly
    from its topic's set and the rest uniformly, with Poisson term counts.
    """
    topic_sets = np.stack([rng.choice(p, size=topic_words, replace=False) for _ in range(n_topics)])
    z = rng.integers(0, n_topics, size=n_docs)
    n_own = rng.binomial(nnz_per_row, 0.8, size=n_docs)
    indptr = np.zeros(n_docs + 1, dtype=np.int64)
    cols = []
    for i in range(n_docs):
        own = topic_sets[z[i], rng.integers(0, topic_words, size=n_own[i])]
        other = rng.integers(0, p, size=nnz_per_row - n_own[i])
        c = np.unique(np.concatenate([own, other]))
        cols.append(c)
        indptr[i + 1] = indptr[i] + c.size
    indices = np.concatenate(cols)
    data = rng.poisson(1.0, size=indices.size) + 1.0
    X = sp.csr_matrix((data, indices, indptr), shape=(n_docs, p))
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    X = sp.diags(1.0 / norms) @ X
    return SyntheticEpoch(sp.csr_matrix(X), z)


def gaussian_evolving_tree(rng: np.random.Generator, *, noise: float = 0.5, docs: int = 120
                           ) -> list[SyntheticEpoch]:
    """Three epochs of 2-D Gaussian data from a hand-made evolving tree (after the dTSSBP paper's Figure 2).

    Nodes (names are the true labels): ``root``; its children ``A`` and ``B``; ``A1`` under ``A``.
    Epoch 1: every mean drifts, the masses change and ``C`` is born under the root.
    Epoch 2: ``A1`` dies (no data), the means drift again.
    """
    means = [
        {"root": (0.0, 0.0), "A": (6.0, 0.0), "B": (-6.0, 0.0), "A1": (9.0, 5.0)},
        {"root": (0.0, 0.5), "A": (6.5, 0.5), "B": (-6.0, -1.0), "A1": (9.5, 5.5), "C": (0.0, 7.0)},
        {"root": (0.0, 1.0), "A": (7.0, 1.0), "B": (-6.0, -2.0), "C": (0.5, 8.0)},
    ]
    weights = [
        {"root": 1.0, "A": 1.0, "B": 1.0, "A1": 1.0},
        {"root": 1.0, "A": 1.5, "B": 0.6, "A1": 0.7, "C": 1.0},
        {"root": 1.0, "A": 1.0, "B": 0.8, "C": 1.6},
    ]
    out = []
    for m, w in zip(means, weights):
        rows, labels = [], []
        for name, mu in m.items():
            n = int(docs * w[name])
            rows.append(rng.normal(mu, noise, size=(n, 2)))
            labels += [name] * n
        X = np.vstack(rows)
        perm = rng.permutation(X.shape[0])
        out.append(SyntheticEpoch(X[perm], np.asarray(labels)[perm]))
    return out
