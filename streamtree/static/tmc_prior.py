"""The time-marginalised coalescent (TMC) prior over unordered binary tree topologies.

Kingman's coalescent joins a uniformly chosen pair among the ``i`` remaining clusters for
``i = n, ..., 2``; its times do not influence which pairs are joined, so marginalising them
leaves a uniform distribution over *ranked* trees (topology plus a total order of the merges):

    p(phi) = prod_{i=2}^{n} C(i, 2)^{-1}.

An unordered topology ``psi`` (labelled leaves, unordered children) is the image of

    T(psi) = (n - 1)! / prod_{v internal} m_v

ranked trees, where ``m_v`` counts the internal nodes of the subtree rooted at ``v`` (``v``
included): a ranking is a linear extension of the tree order on the ``n - 1`` internal nodes,
and the number of linear extensions of a rooted tree poset is ``(n-1)! / prod_v m_v``. Hence

    p(psi) = (n - 1)! / prod_v m_v * prod_{i=2}^{n} C(i, 2)^{-1}            (Boyles & Welling, eq. 1)

which is Aldous' beta-splitting model at beta = 0. A caterpillar has ``m = 1, ..., n-1`` and a
single ranking; balanced trees have many.
"""

from __future__ import annotations

from math import lgamma, log

import numpy as np


def log_num_ranked_trees(n_leaves: int) -> float:
    """log of ``prod_{i=2}^n C(i, 2)``, the number of ranked trees (coalescent histories)."""
    return float(sum(log(i * (i - 1) / 2.0) for i in range(2, n_leaves + 1)))


def internal_counts_from_linkage(Z: np.ndarray) -> np.ndarray:
    """``m`` for every merge of a SciPy linkage matrix: internal nodes in the merge's subtree."""
    Z = np.asarray(Z)
    n = Z.shape[0] + 1
    m = np.zeros(2 * n - 1, dtype=np.int64)
    for k in range(n - 1):
        a, b = int(Z[k, 0]), int(Z[k, 1])
        m[n + k] = m[a] + m[b] + 1
    return m[n:]


def log_num_rankings(m: np.ndarray) -> float:
    """log T(psi) = log (n-1)! - sum log m_v, from the internal-node counts ``m``."""
    m = np.asarray(m, dtype=np.float64)
    return lgamma(m.size + 1) - float(np.log(m).sum())


def log_tmc_prior(m: np.ndarray) -> float:
    """log p(psi) under the TMC prior, given ``m_v`` for the ``n - 1`` internal nodes."""
    m = np.asarray(m)
    return log_num_rankings(m) - log_num_ranked_trees(m.size + 1)


def log_tmc_prior_linkage(Z: np.ndarray) -> float:
    """log p(psi) of the topology of a SciPy linkage matrix (heights are ignored)."""
    return log_tmc_prior(internal_counts_from_linkage(Z))
