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
                  n_topics: int = 100, topic_words: int = 400, normalise: bool = True) -> SyntheticEpoch:
    """A large sparse term-frequency corpus with planted topics.

    Each topic owns a random set of ``topic_words`` words; a document draws its words mostly
    from its topic's set and the rest uniformly, with Poisson term counts. Rows are
    L2-normalised, or with ``normalise=False`` left as the integer counts (for the
    multinomial family).
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
    return SyntheticEpoch(l2_rows(X) if normalise else X, z)


def l2_rows(X: sp.csr_matrix) -> sp.csr_matrix:
    """``X`` with every row scaled to unit L2 norm (how :func:`sparse_corpus` normalises)."""
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    return sp.csr_matrix(sp.diags(1.0 / norms) @ X)


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


@dataclass(frozen=True)
class PlantedTreeCorpus:
    """Epochs of word counts drawn from a planted evolving tree (see :func:`planted_dirichlet_tree`).

    Node ids are persistent: an id names the same true node in every epoch it is alive in.
    Per-epoch arrays (``node_ids``, ``masses``, ``word_dists``) are aligned with each other.
    """

    counts: list[sp.csr_matrix]  # per epoch, (n_documents, n_features) int64 token counts
    labels: list[np.ndarray]  # per epoch, true node id of each document (row)
    node_ids: list[np.ndarray]  # per epoch, ids of the nodes alive (sorted)
    masses: list[np.ndarray]  # per epoch, planted probability of a document coming from each node
    word_dists: list[np.ndarray]  # per epoch, (K_t, n_features) word distribution of each node
    parent: np.ndarray  # over all ids ever used: parent id, -1 for the root
    depth: np.ndarray  # over all ids ever used
    born: list[np.ndarray]  # per epoch, ids born in that epoch (all nodes at epoch 0)
    died: list[np.ndarray]  # per epoch, ids alive at the previous epoch and gone in this one
    n_features: int


def _token_counts(rng: np.random.Generator, labels: np.ndarray, lengths: np.ndarray, dist: dict,
                  n_features: int) -> sp.csr_matrix:
    """Documents x terms counts: document ``i`` draws ``lengths[i]`` tokens from ``dist[labels[i]]``."""
    rows, cols = [], []
    for nid in np.unique(labels):
        docs = np.flatnonzero(labels == nid)
        n_tok = lengths[docs]
        rows.append(np.repeat(docs, n_tok))
        cols.append(rng.choice(n_features, size=int(n_tok.sum()), p=dist[int(nid)]))
    r = np.concatenate(rows)
    c = np.concatenate(cols)
    X = sp.csr_matrix((np.ones(r.size, dtype=np.int64), (r, c)), shape=(labels.size, n_features))
    X.sum_duplicates()
    X.sort_indices()
    return X


class _Epochs:
    """Collects a planted corpus epoch by epoch: documents drawn from the live nodes' masses
    and word distributions (:func:`_token_counts`)."""

    def __init__(self, n_documents: int, n_features: int) -> None:
        self.n_documents, self.n_features = n_documents, n_features
        self.counts, self.labels, self.ids, self.masses, self.dists = [], [], [], [], []

    def draw(self, rng: np.random.Generator, alive, mass: dict, dist: dict, lengths) -> None:
        """One epoch: each document picks a live node by mass, a length from ``lengths(n)``,
        then its tokens."""
        ids = np.asarray(sorted(alive), dtype=np.int64)
        m = np.array([mass[i] for i in ids])
        m /= m.sum()
        labels = ids[rng.choice(ids.size, size=self.n_documents, p=m)]
        self.counts.append(_token_counts(rng, labels, lengths(self.n_documents), dist, self.n_features))
        self.labels.append(labels)
        self.ids.append(ids)
        self.masses.append(m)
        self.dists.append(np.stack([dist[int(i)] for i in ids]))

    def corpus(self, parent, depth, born, died) -> PlantedTreeCorpus:
        return PlantedTreeCorpus(counts=self.counts, labels=self.labels, node_ids=self.ids, masses=self.masses,
                                 word_dists=self.dists, parent=np.asarray(parent, dtype=np.int64),
                                 depth=np.asarray(depth, dtype=np.int64), born=born, died=died,
                                 n_features=self.n_features)


def planted_dirichlet_tree(rng: np.random.Generator, *, n_features: int = 2000, n_documents: int = 5000,
                           n_epochs: int = 3, branching: tuple[int, ...] = (3, 3, 2),
                           root_concentration: float = 0.5, child_concentration: float = 1500.0,
                           drift_concentration: float = 20000.0, mass_concentration: float = 5.0,
                           doc_length: tuple[int, int] = (30, 100)) -> PlantedTreeCorpus:
    """Word counts from an evolving tree of hierarchical-Dirichlet topics (not the dTSSBP's own model).

    Epoch 0's tree has ``branching[d]`` children under every node at depth ``d`` (the default
    ``(3, 3, 2)`` gives 1 + 3 + 9 + 18 = 31 nodes of depth up to 3). The root's word
    distribution is ``Dirichlet(root_concentration * 1)`` (a skewed, Zipf-like spread) and
    every child's is ``Dirichlet(child_concentration * parent's)``: children share their
    parent's frequent words and differ in the details, siblings differ more from each other
    than from the parent. Every node, internal or leaf, emits documents: a document picks a node
    with the planted masses (``Dirichlet(mass_concentration * 1)`` over the live nodes at epoch
    0), then a length uniform in ``doc_length`` and its tokens i.i.d. from the node's words.

    From one epoch to the next every node drifts (its distribution is
    ``Dirichlet(drift_concentration * previous)``), the masses drift likewise
    (``Dirichlet(50 * K * previous)`` renormalised), one leaf dies (a random one among the
    original leaves still alive) and one node is born: a new child, with mass ``1 / K``, of a
    random live node above the deepest level, drawn as a child is at epoch 0 from its parent's
    current distribution. So epoch 1 has one death and one birth, and so does epoch 2.

    Parameters
    ----------
    rng : numpy.random.Generator
    n_features : int
        Vocabulary size V.
    n_documents : int
        Documents per epoch.
    n_epochs : int
        Number of epochs (>= 1).
    branching : tuple of int
        Children per node at each depth of epoch 0's tree.
    root_concentration, child_concentration, drift_concentration, mass_concentration : float
        Dirichlet concentrations described above. Larger ``child_concentration`` makes nodes
        harder to tell apart (at the defaults, k-means given the true number of nodes reaches
        an adjusted Rand index of about 0.5 on L2-normalised term frequencies); larger
        ``drift_concentration`` makes the drift smaller.
    doc_length : (int, int)
        Inclusive range of document lengths in tokens.

    Returns
    -------
    PlantedTreeCorpus
    """
    if n_epochs < 1 or n_documents < 1 or n_features < 2:
        raise ValueError("need n_epochs >= 1, n_documents >= 1 and n_features >= 2")
    if not branching or min(branching) < 1:
        raise ValueError(f"branching must be a non-empty tuple of positive ints, got {branching}")
    lo, hi = doc_length
    if not 1 <= lo <= hi:
        raise ValueError(f"doc_length must satisfy 1 <= low <= high, got {doc_length}")

    def dirichlet(alpha: np.ndarray) -> np.ndarray:
        # gamma draws with a floor: small concentrations underflow to exact zeros otherwise
        g = rng.standard_gamma(np.maximum(alpha, 1e-300))
        g = np.maximum(g, 1e-300)
        return g / g.sum()

    parent, depth = [-1], [0]
    dist = {0: dirichlet(np.full(n_features, root_concentration))}
    frontier = [0]
    for k in branching:
        nxt = []
        for par in frontier:
            for _ in range(k):
                nid = len(parent)
                parent.append(par)
                depth.append(depth[par] + 1)
                dist[nid] = dirichlet(child_concentration * dist[par])
                nxt.append(nid)
        frontier = nxt
    max_depth = len(branching)
    alive = list(range(len(parent)))
    mass = dict(zip(alive, rng.dirichlet(np.full(len(alive), mass_concentration))))
    original_leaves = set(frontier)

    out = _Epochs(n_documents, n_features)
    born, died = [], []
    for t in range(n_epochs):
        if t == 0:
            born.append(np.asarray(alive, dtype=np.int64))
            died.append(np.zeros(0, dtype=np.int64))
        else:
            # drift of the survivors, parents first so a newborn child sees its parent's new words
            for nid in alive:
                dist[nid] = dirichlet(drift_concentration * dist[nid])
            m = np.array([mass[i] for i in alive])
            m = rng.dirichlet(50.0 * len(alive) * m)
            mass = dict(zip(alive, m))
            candidates = sorted(original_leaves.intersection(alive))
            dead = int(rng.choice(candidates))
            alive.remove(dead)
            del mass[dead]
            par = int(rng.choice([i for i in alive if depth[i] < max_depth]))
            nid = len(parent)
            parent.append(par)
            depth.append(depth[par] + 1)
            dist[nid] = dirichlet(child_concentration * dist[par])
            mass[nid] = 1.0 / len(alive)
            alive.append(nid)
            born.append(np.array([nid], dtype=np.int64))
            died.append(np.array([dead], dtype=np.int64))
        out.draw(rng, alive, mass, dist, lambda n: rng.integers(lo, hi + 1, size=n))
    return out.corpus(parent, depth, born, died)


def planted_topic_mixture(rng: np.random.Generator, *, n_features: int = 3000, n_documents: int = 4000,
                          n_epochs: int = 3, n_branches: int = 5, leaves_per_branch: int = 4,
                          background: float = 0.3, branch_share: float = 0.3, words_per_topic: int = 40,
                          zipf_exponent: float = 1.05, drift: float = 0.1, mass_concentration: float = 3.0,
                          median_length: float = 50.0, length_sigma: float = 0.8) -> PlantedTreeCorpus:
    """Word counts from a two-level tree of mixed topics whose documents all sit at the leaves.

    A second planted family, built differently from :func:`planted_dirichlet_tree` (and from
    the dTSSBP): no Dirichlet links, documents only at leaves, skewed lengths. Every branch
    (depth 1) has a sparse topic over ``1.5 * words_per_topic`` random words, every leaf
    (depth 2) one over ``words_per_topic`` words of its own (weights ``Dirichlet(1)``), and a
    leaf's word distribution is the mixture ``background * zipf + branch_share * branch +
    (1 - background - branch_share) * own``, with ``zipf`` a Zipf law of exponent
    ``zipf_exponent`` over a random ordering of the vocabulary shared by all leaves. A
    document picks a leaf with the planted masses (``Dirichlet(mass_concentration * 1)``; small
    values give a few dominant leaves), a length from a log-normal of median
    ``median_length`` and log-sd ``length_sigma`` (at least 5 tokens), and its tokens i.i.d.
    from the leaf's words.

    From one epoch to the next every leaf drifts, ``(1 - drift) * previous + drift * fresh``
    with ``fresh`` half background and half a new sparse topic; the masses are redrawn around
    the previous ones (``Dirichlet(50 * K * previous)``); one leaf dies and one is born under a
    random branch (mass ``1 / K``).

    Returns
    -------
    PlantedTreeCorpus
        Ids: 0 the root, then the branches, then the leaves; ``node_ids``, ``masses`` and
        ``word_dists`` list the leaves only (the nodes documents come from).
    """
    if n_epochs < 1 or n_documents < 1 or n_features < 2:
        raise ValueError("need n_epochs >= 1, n_documents >= 1 and n_features >= 2")
    if n_branches < 1 or leaves_per_branch < 1:
        raise ValueError(f"need n_branches >= 1 and leaves_per_branch >= 1, got {n_branches}, {leaves_per_branch}")
    if not (0 <= background and 0 <= branch_share and background + branch_share < 1):
        raise ValueError(f"background and branch_share must be >= 0 with a sum below 1, got {background}, "
                         f"{branch_share}")
    if not 0 <= drift <= 1:
        raise ValueError(f"drift must be in [0, 1], got {drift}")
    if not (1 <= words_per_topic and int(1.5 * words_per_topic) <= n_features):
        raise ValueError(f"words_per_topic must be between 1 and n_features / 1.5, got {words_per_topic}")

    def sparse_topic(k: int) -> np.ndarray:
        v = np.zeros(n_features)
        v[rng.choice(n_features, size=k, replace=False)] = rng.dirichlet(np.ones(k))
        return v

    zipf = 1.0 / np.arange(1, n_features + 1) ** zipf_exponent
    zipf = (zipf / zipf.sum())[rng.permutation(n_features)]
    own = 1.0 - background - branch_share
    parent, depth = [-1], [0]
    branch_topic = {}
    for _ in range(n_branches):
        branch_topic[len(parent)] = sparse_topic(int(1.5 * words_per_topic))
        parent.append(0)
        depth.append(1)
    dist: dict[int, np.ndarray] = {}

    def new_leaf(branch: int) -> int:
        nid = len(parent)
        parent.append(branch)
        depth.append(2)
        dist[nid] = background * zipf + branch_share * branch_topic[branch] + own * sparse_topic(words_per_topic)
        return nid

    alive = [new_leaf(b) for b in branch_topic for _ in range(leaves_per_branch)]
    mass = dict(zip(alive, rng.dirichlet(np.full(len(alive), mass_concentration))))
    out = _Epochs(n_documents, n_features)
    born, died = [], []
    for t in range(n_epochs):
        if t == 0:
            born.append(np.asarray([0, *branch_topic, *alive], dtype=np.int64))
            died.append(np.zeros(0, dtype=np.int64))
        else:
            for nid in alive:
                fresh = 0.5 * zipf + 0.5 * sparse_topic(words_per_topic)
                dist[nid] = (1.0 - drift) * dist[nid] + drift * fresh
            m = rng.dirichlet(50.0 * len(alive) * np.array([mass[i] for i in alive]))
            mass = dict(zip(alive, m))
            dead = int(rng.choice(alive))
            alive.remove(dead)
            del mass[dead]
            nid = new_leaf(int(rng.choice(list(branch_topic))))
            mass[nid] = 1.0 / len(alive)
            alive.append(nid)
            born.append(np.array([nid], dtype=np.int64))
            died.append(np.array([dead], dtype=np.int64))
        out.draw(rng, alive, mass, dist,
                 lambda n: np.maximum(rng.lognormal(np.log(median_length), length_sigma, size=n), 5).astype(np.int64))
    return out.corpus(parent, depth, born, died)
