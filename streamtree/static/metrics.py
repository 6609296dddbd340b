"""Scores of a dendrogram against known class labels of its leaves.

* :func:`dendrogram_purity` -- Heller and Ghahramani (2005): the expected purity of the smallest
  subtree containing two leaves drawn uniformly among the pairs of leaves of the same class.
* :func:`subtree_score` -- Teh, Daume III and Roy (2007): the number of internal nodes whose
  leaves all share one class, divided by its maximum ``n - n_classes``.
* :func:`leave_one_out_accuracy` -- each leaf predicted from its nearest leaves in the tree.

All accept a :class:`~streamtree.static.dendrogram.Dendrogram` or a SciPy linkage matrix.
"""

from __future__ import annotations

import numpy as np
from scipy.cluster.hierarchy import is_valid_linkage

from streamtree.static.dendrogram import Dendrogram

__all__ = ["dendrogram_purity", "subtree_score", "leave_one_out_accuracy", "class_counts"]


def _prepare(dendrogram_or_linkage, labels) -> tuple[np.ndarray, np.ndarray, int]:
    if isinstance(dendrogram_or_linkage, Dendrogram):
        Z = dendrogram_or_linkage.linkage
    else:
        Z = np.asarray(dendrogram_or_linkage, dtype=np.float64)
        if Z.ndim != 2 or Z.shape[1] != 4:
            raise ValueError(f"a linkage matrix has shape (n - 1, 4), got {Z.shape}")
        if Z.shape[0] > 0 and not is_valid_linkage(Z):
            raise ValueError("not a valid SciPy linkage matrix")
    n = Z.shape[0] + 1
    labels = np.asarray(labels)
    if labels.shape != (n,):
        raise ValueError(f"expected {n} labels (one per leaf), got shape {labels.shape}")
    _, y = np.unique(labels, return_inverse=True)
    return Z, y.ravel(), n


def class_counts(dendrogram_or_linkage, labels) -> np.ndarray:
    """Per-class leaf counts of every node: array of shape (2n - 1, n_classes).

    Rows ``0..n-1`` are the leaves, row ``n + k`` the node created by linkage row ``k``.
    Class order is that of ``numpy.unique(labels)``.
    """
    Z, y, n = _prepare(dendrogram_or_linkage, labels)
    return _counts(Z, y, n)


def _counts(Z: np.ndarray, y: np.ndarray, n: int) -> np.ndarray:
    n_classes = int(y.max()) + 1
    counts = np.zeros((2 * n - 1, n_classes), dtype=np.int64)
    counts[np.arange(n), y] = 1
    for k in range(n - 1):
        counts[n + k] = counts[int(Z[k, 0])] + counts[int(Z[k, 1])]
    return counts


def dendrogram_purity(dendrogram_or_linkage, labels) -> float:
    """Dendrogram purity (Heller and Ghahramani, 2005).

    Average, over all unordered pairs {i, j} of distinct leaves with the same label c, of the
    fraction of leaves with label c in the smallest subtree containing both. Computed bottom
    up: the pairs of class c whose least common ancestor is node k are the products of the
    class-c counts of its two children, so the cost is O(n n_classes).

    Raises ValueError if no two leaves share a label (the average is then empty).
    """
    Z, y, n = _prepare(dendrogram_or_linkage, labels)
    per_class = np.bincount(y)
    n_pairs = float((per_class * (per_class - 1) // 2).sum())
    if n_pairs == 0:
        raise ValueError("dendrogram purity is undefined when no two leaves share a label")
    counts = _counts(Z, y, n)
    a = counts[Z[:, 0].astype(np.int64)].astype(np.float64)
    b = counts[Z[:, 1].astype(np.int64)].astype(np.float64)
    size = (a + b).sum(axis=1, keepdims=True)
    total = (a * b * (a + b) / size).sum()
    return float(total / n_pairs)


def subtree_score(dendrogram_or_linkage, labels) -> float:
    """Subtree score (Teh, Daume III and Roy, 2007).

    The number of internal nodes whose leaves all carry the same label, divided by
    ``n - n_classes``, the largest number possible (a class of m leaves has at most m - 1 pure
    internal nodes). 1.0 iff every class forms a subtree.

    Raises ValueError when every leaf has its own label (the denominator is 0).
    """
    Z, y, n = _prepare(dendrogram_or_linkage, labels)
    n_classes = int(y.max()) + 1
    if n == n_classes:
        raise ValueError("the subtree score is undefined when every leaf has its own label")
    counts = _counts(Z, y, n)[n:]
    pure = (counts.max(axis=1) == counts.sum(axis=1)).sum()
    return float(pure / (n - n_classes))


def leave_one_out_accuracy(dendrogram_or_linkage, labels) -> float:
    """Leave-one-out accuracy of predicting each leaf's label from its nearest leaves in the tree.

    The nearest other leaves of leaf i, by the tree distance (the height, or depth, of the least
    common ancestor), are the leaves of its sibling subtree: they all share the lowest possible
    common ancestor with i, the parent of i, and are tied among themselves. The prediction is
    their majority label. Ties between labels are broken uniformly at random in expectation: a
    leaf whose label is one of t tied majority labels scores 1/t, so the result does not depend
    on how labels are named or ordered.
    """
    Z, y, n = _prepare(dendrogram_or_linkage, labels)
    if n < 2:
        raise ValueError("leave-one-out accuracy needs at least two leaves")
    counts = _counts(Z, y, n)
    score = 0.0
    for k in range(n - 1):
        a, b = int(Z[k, 0]), int(Z[k, 1])
        for leaf, sib in ((a, b), (b, a)):
            if leaf < n:
                c = counts[sib]
                top = c.max()
                if c[y[leaf]] == top:
                    score += 1.0 / np.count_nonzero(c == top)
    return float(score / n)
