"""Static hierarchical snapshots of one epoch: BHC, Kingman's coalescent or the TMC.

Pure: arrays and a ``numpy.random.Generator`` in, a :class:`SnapshotResult` out; storing it
(``SnapshotStore.write_static``) is the caller's business.

The leaves are either the epoch's documents (their rows scaled to unit L2 norm by the caller,
:func:`document_directions`; a seeded random sample of at most ``max_points``) or the epoch tree's nodes (their theta directions). All
three models are Gaussian/Brownian on real vectors, so the rows are first projected to
``n_components`` dimensions with a truncated SVD (a multinomial BHC would need the raw term
counts, which the L2 rows no longer carry). Defaults, chosen so that a replay of the State of
the Union corpus with ``--static bhc`` adds well under a minute in total:

* ``max_points = 300``: greedy BHC and greedy-rate1 are O(n^2) merge scans;
* ``n_components = 20``: enough for the main topical directions, cheap NIW determinants; of
  those, only the leading ones holding 90% of their variance are kept (``stats["components"]``);
* ``tmc_sweeps = 20`` (``burn_in = 10``): the sampler starts from average linkage, so a few
  sweeps already refine it; this is a snapshot, not a converged posterior.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from streamtree.static.dendrogram import Dendrogram
from streamtree.wording import counted

METHODS = ("bhc", "coalescent", "tmc")
OVER = ("documents", "nodes")
DEFAULT_MAX_POINTS = 300
DEFAULT_COMPONENTS = 20
DEFAULT_TMC_SWEEPS = 20
VARIANCE_KEPT = 0.9


@dataclass(frozen=True)
class StaticOptions:
    """What a replay computes after each published epoch."""

    method: str
    over: str = "documents"
    max_points: int = DEFAULT_MAX_POINTS

    def __post_init__(self) -> None:
        check_method(self.method)
        if self.over not in OVER:
            raise ValueError(f"static snapshots are over one of {OVER}, got {self.over!r}")
        if int(self.max_points) < 2:
            raise ValueError(f"max_points must be at least 2, got {self.max_points}")


@dataclass
class SnapshotResult:
    """A fitted static snapshot.

    Attributes
    ----------
    dendrogram : Dendrogram
        Over ``len(leaf_ids)`` leaves; per-merge statistics in ``dendrogram.stats``.
    leaf_ids : list
        Id of each leaf in linkage order (document ids, node ids or row indices).
    rows : ndarray of int
        Row of the input each leaf came from.
    stats : dict
        Scalars describing the fit (method, over, n_points, n_total, sampled, components,
        and ``dtssbp_purity`` when labels were given).
    """

    dendrogram: Dendrogram
    leaf_ids: list
    rows: np.ndarray
    stats: dict = field(default_factory=dict)


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"unknown static method {method!r}; choose from {', '.join(METHODS)}")
    return method


def document_directions(X):
    """An epoch's document rows as the snapshots read them: each scaled to unit L2 norm (all-zero
    rows stay zero). Fitted rows carry a length (raw counts for word distributions, a weight for
    the vMF's rows) that is not a topic: left in, one long document dominates the SVD, which
    then keeps a single component."""
    from sklearn.preprocessing import normalize

    return normalize(X, norm="l2", axis=1, copy=True)


def project(X, n_components: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Rows of ``X`` in at most ``n_components`` SVD dimensions (fewer for few rows/columns).

    Returns the dense projection and the number of dimensions kept.
    """
    n, p = X.shape
    k = int(min(n_components, n - 1, p - 1))
    if k < 1:  # one column or two rows: nothing to reduce
        D = X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)
        return np.asarray(D, dtype=np.float64), D.shape[1]
    from sklearn.decomposition import TruncatedSVD

    svd = TruncatedSVD(n_components=k, random_state=int(rng.integers(2**31 - 1)))
    Y = svd.fit_transform(X)
    # Drop the trailing components that together hold less than 10% of the kept variance:
    # near-noise axes make the full-covariance Gaussian of BHC (and the Brownian models)
    # spend their evidence on noise and blur clusters that one or two axes separate.
    var = np.asarray(svd.explained_variance_, dtype=np.float64)
    if var.sum() > 0:
        k = int(min(k, np.searchsorted(np.cumsum(var) / var.sum(), VARIANCE_KEPT) + 1))
    return np.asarray(Y[:, :k], dtype=np.float64), k


def _fit(method: str, Y: np.ndarray, rng: np.random.Generator, tmc_sweeps: int) -> Dendrogram:
    if method == "bhc":
        from streamtree.static.bhc import BayesianHierarchicalClustering

        return BayesianHierarchicalClustering(likelihood="gaussian").fit(Y).dendrogram_
    seed = int(rng.integers(2**31 - 1))
    if method == "coalescent":
        from streamtree.static.coalescent import KingmanCoalescent

        # unit diffusion variance on standardised projections: the scale of the SVD axes varies
        sd = Y.std(axis=0)
        return KingmanCoalescent(likelihood="brownian", method="greedy-rate1", random_state=seed).fit(
            Y / np.where(sd > 0, sd, 1.0)).dendrogram_
    from streamtree.static.tmc import TimeMarginalizedCoalescent

    return TimeMarginalizedCoalescent(n_sweeps=tmc_sweeps, burn_in=tmc_sweeps // 2,
                                      random_state=seed).fit(Y).dendrogram_


def static_snapshot(
    method: str,
    X=None,
    *,
    node_theta=None,
    ids=None,
    labels=None,
    max_points: int = DEFAULT_MAX_POINTS,
    n_components: int = DEFAULT_COMPONENTS,
    tmc_sweeps: int = DEFAULT_TMC_SWEEPS,
    rng: np.random.Generator,
) -> SnapshotResult:
    """Fit a static hierarchy over an epoch's documents or its tree's node directions.

    Parameters
    ----------
    method : {"bhc", "coalescent", "tmc"}
        Gaussian BHC, Kingman's coalescent (Brownian, greedy-rate1) or the time-marginalised
        coalescent (``tmc_sweeps`` Gibbs sweeps, half burn-in; the best state kept).
    X : array or sparse matrix of shape (n_documents, p), optional
        The epoch's document rows; used when ``node_theta`` is None.
    node_theta : array of shape (n_nodes, p), optional
        Fit over the epoch tree's nodes instead (no sampling unless more than ``max_points``).
    ids : sequence, optional
        Id of each input row (document or node ids); default the row indices.
    labels : array of shape (n_rows,), optional
        A reference clustering of the rows (e.g. the dTSSBP node of each document): its
        dendrogram purity over the leaves goes to ``stats["dtssbp_purity"]``.
    max_points : int
        Cap on the leaves; above it a seeded uniform sample without replacement is used
        (``stats["sampled"]`` says so).
    n_components : int
        Truncated-SVD dimensions the models see.
    rng : numpy.random.Generator

    Returns
    -------
    SnapshotResult
    """
    check_method(method)
    over = "documents" if node_theta is None else "nodes"
    data = X if node_theta is None else node_theta
    if data is None:
        raise ValueError("give the documents X or node_theta")
    if not sp.issparse(data):
        data = np.asarray(data, dtype=np.float64)
        if data.ndim != 2:
            raise ValueError(f"expected a 2-d array of rows, got shape {data.shape}")
    n = data.shape[0]
    if int(max_points) < 2:
        raise ValueError(f"max_points must be at least 2, got {max_points}")
    if n < 2:
        raise ValueError(f"a static snapshot needs at least 2 {over}, got {n}")
    if ids is not None and len(ids) != n:
        raise ValueError(f"{len(ids)} ids for {n} rows")
    rows = np.arange(n) if n <= max_points else np.sort(rng.choice(n, int(max_points), replace=False))
    sub = data[rows]
    Y, k = project(sub, n_components, rng)
    dend = _fit(method, Y, rng, int(tmc_sweeps))
    leaf_ids = rows.tolist() if ids is None else [ids[i] for i in rows]
    leaf_ids = [x.item() if isinstance(x, np.generic) else x for x in leaf_ids]
    stats = {"method": method, "over": over, "n_points": int(rows.size), "n_total": int(n),
             "sampled": bool(rows.size < n), "components": int(k)}
    if method == "tmc":
        stats["tmc_sweeps"] = int(tmc_sweeps)
    if labels is not None:
        from streamtree.static.metrics import dendrogram_purity

        labels = np.asarray(labels)
        if labels.shape != (n,):
            raise ValueError(f"expected {n} labels, got shape {labels.shape}")
        stats["dtssbp_purity"] = float(dendrogram_purity(dend, labels[rows]))
    return SnapshotResult(dendrogram=dend, leaf_ids=leaf_ids, rows=rows, stats=stats)


def snapshot_name(method: str, over: str) -> str:
    """The stored name of a snapshot: one per (method, leaves), e.g. ``bhc-nodes``, so that a
    snapshot over documents never overwrites one over nodes."""
    return f"{check_method(method)}-{over}"


def format_static(snap, *, store=None, entry: dict | None = None, vocabulary=None, top_words: int = 8,
                  n_clusters: int = 6, full: bool = False, newick_chars: int = 240) -> str:
    """A compact text view of a stored static snapshot: its fit, then the clusters below the
    top merges (cut into at most ``n_clusters``), each with its size and top words.

    Words come from the epoch's stored tree: over nodes, the mean direction of the cluster's
    nodes; over documents, the mean direction of the nodes its documents were assigned to.
    ``full`` adds the Newick string (leaf names quoted where Newick needs it).
    """
    from scipy.cluster.hierarchy import fcluster

    linkage, heights, leaf_ids = snap.linkage, snap.heights, snap.leaf_ids
    n = linkage.shape[0] + 1
    scalars = {k: v for k, v in snap.stats.items() if np.ndim(v) == 0 and k not in ("method",)}
    shown = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in scalars.items())
    lines = [f"{counted(n, 'leaf', 'leaves')}, heights {float(np.min(heights)):.4g} .. "
             f"{float(np.max(heights)):.4g}; {shown}"]
    k = max(1, min(n_clusters, n))
    labels = fcluster(linkage, t=k, criterion="maxclust") if n > 1 else np.ones(1, dtype=int)
    theta, words_of = _leaf_directions(store, entry, leaf_ids, snap.stats.get("over"), n)
    order = sorted(np.unique(labels).tolist(), key=lambda c: -int(np.sum(labels == c)))
    for rank, c in enumerate(order, 1):
        members = np.flatnonzero(labels == c)
        text = ""
        if theta is not None and vocabulary is not None:
            rows = theta[members]
            rows = rows[np.any(rows != 0, axis=1)]
            if rows.shape[0]:
                mean = rows.mean(axis=0)
                text = ": " + " ".join(vocabulary[np.argsort(-mean, kind="stable")[:top_words]].tolist())
        elif words_of is not None:
            text = ": " + " ".join(words_of(members)[:top_words])
        lines.append(f"  cluster {rank}: {counted(members.size, 'leaf', 'leaves')}{text}")
    if full:
        dend = Dendrogram(linkage=linkage, heights=heights)
        lines.append("newick: " + dend.to_newick(labels=leaf_ids, branch_lengths=False))
    return "\n".join(lines)


def _leaf_directions(store, entry, leaf_ids, over, n: int):
    """Per leaf, the direction whose words describe it (rows of the epoch's node theta), or
    ``(None, words_of)`` when only the stored top words are available."""
    if store is None or entry is None or leaf_ids is None:
        return None, None
    stored = store.read(entry["epoch"])
    tree = stored.tree
    row_of_node = {int(v): i for i, v in enumerate(tree.node_ids)}
    if over == "nodes" or (over is None and all(str(x).lstrip("-").isdigit() for x in leaf_ids)):
        rows = np.asarray([row_of_node.get(int(x), -1) for x in leaf_ids])
    else:
        node_of_doc = {str(d): int(a) for d, a in zip(stored.doc_ids, tree.assignments)}
        rows = np.asarray([row_of_node.get(node_of_doc.get(str(x), -1), -1) for x in leaf_ids])
    if not stored.theta_exact:
        def words_of(members):
            counts: dict[str, int] = {}
            for r in rows[members]:
                for w in (stored.top_words[r] if r >= 0 else []):
                    counts[w] = counts.get(w, 0) + 1
            return sorted(counts, key=lambda w: -counts[w])
        return None, words_of
    theta = np.zeros((n, tree.theta.shape[1]))
    ok = rows >= 0
    theta[ok] = tree.theta[rows[ok]]
    return theta, None


__all__ = ["DEFAULT_COMPONENTS", "DEFAULT_MAX_POINTS", "DEFAULT_TMC_SWEEPS", "METHODS", "OVER", "SnapshotResult",
           "StaticOptions", "check_method", "document_directions", "format_static", "project", "snapshot_name",
           "static_snapshot"]
