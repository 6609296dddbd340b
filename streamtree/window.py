"""Windowed sufficient statistics of the dTSSBP: per-epoch node counts over the last h epochs.

Only the documents *at* each node (X) are stored, by node id; the descendant counts (Y) follow
from the tree because a node's parent never changes. The stick priors at epoch t use the counts of
epochs t-h .. t-1; the Gibbs conditionals add the live counts of epoch t.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class WindowedCounts:
    """Ring buffer of per-epoch ``{node id: count}`` maps with a running sum.

    Parameters
    ----------
    window : int or None
        Number of past epochs whose counts enter the stick priors: ``None`` is an infinite
        window (cumulative counts), ``0`` makes epochs independent.
    """

    def __init__(self, window: int | None) -> None:
        if window is not None and (not isinstance(window, (int, np.integer)) or window < 0):
            raise ValueError(f"window must be a non-negative int or None, got {window!r}")
        self.window = window
        self.history: deque[dict[int, int]] = deque()
        self.total: dict[int, int] = {}

    def counts(self, ids: np.ndarray) -> np.ndarray:
        """Summed past-window counts for each id (0 for ids never seen)."""
        return np.array([self.total.get(int(i), 0) for i in ids], dtype=np.int64)

    def commit(self, current: dict[int, int]) -> None:
        """Close an epoch: push its counts and drop the epoch that leaves the window."""
        if self.window == 0:
            return
        snapshot = {int(k): int(v) for k, v in current.items() if v}
        self.history.append(snapshot)
        for k, v in snapshot.items():
            self.total[k] = self.total.get(k, 0) + v
        if self.window is not None and len(self.history) > self.window:
            old = self.history.popleft()
            for k, v in old.items():
                left = self.total[k] - v
                if left:
                    self.total[k] = left
                else:
                    del self.total[k]

    def forget(self, ids) -> None:
        """Drop all counts of deleted nodes."""
        ids = {int(i) for i in ids}
        for snap in self.history:
            for i in ids & snap.keys():
                del snap[i]
        for i in ids & self.total.keys():
            del self.total[i]

    def merge(self, src: int, dst: int) -> None:
        """Move every past count of node ``src`` to node ``dst`` (the nodes were merged)."""
        for snap in self.history:
            if src in snap:
                snap[dst] = snap.get(dst, 0) + snap.pop(src)
        if src in self.total:
            self.total[dst] = self.total.get(dst, 0) + self.total.pop(src)

    def state(self) -> dict:
        """A JSON-serialisable checkpoint of the buffer."""
        return {"window": self.window,
                "history": [{str(k): v for k, v in snap.items()} for snap in self.history]}

    @classmethod
    def from_state(cls, state: dict) -> "WindowedCounts":
        obj = cls(state["window"])
        for snap in state["history"]:
            d = {int(k): int(v) for k, v in snap.items()}
            obj.history.append(d)
            for k, v in d.items():
                obj.total[k] = obj.total.get(k, 0) + v
        return obj


def subtree_sums(parent_index: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Totals over each node's subtree (node included), for rows in pre-order."""
    S = np.array(own, dtype=np.float64 if np.asarray(own).dtype.kind == "f" else np.int64, copy=True)
    for k in range(S.shape[0] - 1, 0, -1):  # reverse pre-order visits children before parents
        S[parent_index[k]] += S[k]
    return S
