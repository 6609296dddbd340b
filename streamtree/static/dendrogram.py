"""The common result type of the static hierarchical models: a binary dendrogram."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Dendrogram:
    """A rooted binary tree over ``n_leaves`` points, SciPy-shaped.

    Attributes
    ----------
    linkage : ndarray, shape (n_leaves - 1, 4)
        SciPy linkage matrix: row ``k`` merges clusters ``linkage[k, 0]`` and
        ``linkage[k, 1]`` (leaves are ``0..n-1``, merge ``k`` creates cluster ``n + k``) at
        height ``linkage[k, 2]``; ``linkage[k, 3]`` is the size of the new cluster. Usable with
        ``scipy.cluster.hierarchy.dendrogram`` and ``fcluster``.
    heights : ndarray, shape (n_leaves - 1,)
        Merge heights (the model's own notion: coalescent time, branch position, ...).
    stats : dict of str to ndarray
        Per-merge statistics, each of shape ``(n_leaves - 1,)`` (e.g. ``log_rk`` for BHC).
    """

    linkage: np.ndarray
    heights: np.ndarray
    stats: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def from_merges(cls, left, right, heights, n_leaves: int, stats: dict | None = None) -> "Dendrogram":
        """Build from merge lists in SciPy cluster numbering.

        ``left[k]`` and ``right[k]`` are cluster ids (leaves ``0..n-1``, merge ``j`` is
        ``n + j``), and each merge may only use clusters created before it.
        """
        left = np.asarray(left, dtype=np.int64)
        right = np.asarray(right, dtype=np.int64)
        heights = np.asarray(heights, dtype=np.float64)
        m = n_leaves - 1
        if not (left.shape == right.shape == heights.shape == (m,)):
            raise ValueError(f"a dendrogram over {n_leaves} leaves needs {m} merges")
        size = np.ones(n_leaves + m, dtype=np.int64)
        used = np.zeros(n_leaves + m, dtype=bool)
        for k in range(m):
            a, b = int(left[k]), int(right[k])
            if not (0 <= a < n_leaves + k and 0 <= b < n_leaves + k) or a == b or used[a] or used[b]:
                raise ValueError(f"merge {k} joins invalid or already merged clusters ({a}, {b})")
            used[a] = used[b] = True
            size[n_leaves + k] = size[a] + size[b]
        lo, hi = np.minimum(left, right), np.maximum(left, right)
        Z = np.column_stack([lo, hi, heights, size[n_leaves:]]).astype(np.float64)
        stats = {k: np.asarray(v) for k, v in (stats or {}).items()}
        for name, v in stats.items():
            if v.shape[0] != m:
                raise ValueError(f"statistic {name!r} has {v.shape[0]} entries, expected {m}")
        return cls(linkage=Z, heights=heights, stats=stats)

    @property
    def n_leaves(self) -> int:
        return int(self.linkage.shape[0]) + 1

    def leaves_order(self) -> np.ndarray:
        """Left-to-right leaf order of the tree as drawn."""
        n = self.n_leaves
        if n == 1:
            return np.zeros(1, dtype=np.int64)
        order: list[int] = []
        stack = [2 * n - 2]
        while stack:
            c = stack.pop()
            if c < n:
                order.append(c)
            else:
                row = self.linkage[c - n]
                stack.append(int(row[1]))
                stack.append(int(row[0]))
        return np.asarray(order, dtype=np.int64)

    def clusters_of(self) -> list[np.ndarray]:
        """Leaf sets of every internal node, indexed by merge number."""
        n = self.n_leaves
        members: list[np.ndarray] = [np.array([i]) for i in range(n)]
        for k in range(n - 1):
            a, b = int(self.linkage[k, 0]), int(self.linkage[k, 1])
            members.append(np.concatenate([members[a], members[b]]))
        return members[n:]

    def to_newick(self, labels=None, branch_lengths: bool = True) -> str:
        """Newick string; branch lengths are height differences (leaves at height 0)."""
        n = self.n_leaves
        names = [str(i) for i in range(n)] if labels is None else [_newick_label(str(x)) for x in labels]
        if len(names) != n:
            raise ValueError(f"{len(names)} labels for {n} leaves")
        height = np.concatenate([np.zeros(n), self.heights])

        def render(c: int, parent_h: float | None) -> str:
            if c < n:
                s = names[c]
            else:
                row = self.linkage[c - n]
                s = f"({render(int(row[0]), height[c])},{render(int(row[1]), height[c])})"
            if branch_lengths and parent_h is not None:
                s += f":{max(parent_h - height[c], 0.0):.6g}"
            return s

        import sys

        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 4 * n + 100))
        try:
            return render(2 * n - 2, None) + ";" if n > 1 else names[0] + ";"
        finally:
            sys.setrecursionlimit(limit)


_NEWICK_SPECIAL = set("()[]':;, \t\n")


def _newick_label(name: str) -> str:
    """A leaf name as Newick reads it back: quoted (``'...'``, inner quotes doubled) when it holds
    a character Newick gives a meaning, e.g. the ``:`` of ids like ``file.parquet:42``."""
    if any(c in _NEWICK_SPECIAL for c in name):
        return "'" + name.replace("'", "''") + "'"
    return name
