"""The TSSB tree: persistent node ids, ordered children, depth cap, sticks in log space.

A node's identity is its integer id, never reused, so per-epoch counts and parameters can follow
it across epochs. The path of a node (child positions from the root) is derived on demand and is
only used where interval order matters (the slice sampler).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ROOT = 0


@dataclass(frozen=True)
class TreeArrays:
    """A flat, pre-ordered view of the tree for vectorised maths.

    ``ids[k]`` is the node at row ``k``; rows are in depth-first pre-order with children in
    stick order, so ``parent_index[k] < k`` for every non-root row and the root is row 0.
    """

    ids: np.ndarray  # int64 (K,)
    parent_index: np.ndarray  # int64 (K,), -1 for the root
    depth: np.ndarray  # int64 (K,)
    sibling_rank: np.ndarray  # int64 (K,), position among the parent's children (root: 0)

    @property
    def size(self) -> int:
        return int(self.ids.shape[0])

    def row_of(self) -> dict[int, int]:
        return {int(i): k for k, i in enumerate(self.ids)}


class TSSBTree:
    """A mutable tree-structured stick-breaking tree.

    Parameters
    ----------
    max_depth : int or None
        Depth cap: nodes at this depth have no children and nu = 1 (``None`` for no cap).
    """

    def __init__(self, max_depth: int | None = None) -> None:
        if max_depth is not None and max_depth < 0:
            raise ValueError(f"max_depth must be >= 0 or None, got {max_depth}")
        self.max_depth = max_depth
        self.parent: dict[int, int] = {ROOT: -1}
        self.children: dict[int, list[int]] = {ROOT: []}
        self.depth: dict[int, int] = {ROOT: 0}
        self.born: dict[int, int] = {ROOT: 0}  # a chain sets the root's to its first epoch
        self.next_id = ROOT + 1

    # -- structure -------------------------------------------------------------------------
    def __contains__(self, node_id: int) -> bool:
        return node_id in self.parent

    def __len__(self) -> int:
        return len(self.parent)

    def at_cap(self, node_id: int) -> bool:
        return self.max_depth is not None and self.depth[node_id] >= self.max_depth

    def add_child(self, parent_id: int, born: int = 0, position: int | None = None,
                  node_id: int | None = None) -> int:
        """Add a new child to ``parent_id`` (last, or at index ``position`` among its children)
        and return its fresh id (or ``node_id``: an id given out before that is not in the tree,
        a node coming back)."""
        if parent_id not in self.parent:
            raise KeyError(f"no node {parent_id}")
        if self.at_cap(parent_id):
            raise ValueError(f"node {parent_id} is at the depth cap {self.max_depth}")
        if node_id is None:
            nid = self.next_id
            self.next_id += 1
        elif node_id in self.parent or not 0 <= node_id < self.next_id:
            raise ValueError(f"node {node_id} is in the tree or was never given out")
        else:
            nid = node_id
        self.parent[nid] = parent_id
        self.children[nid] = []
        if position is None:
            self.children[parent_id].append(nid)
        else:
            self.children[parent_id].insert(position, nid)
        self.depth[nid] = self.depth[parent_id] + 1
        self.born[nid] = born
        return nid

    def add_parent_of_block(self, parent_id: int, position: int, n_adopted: int, born: int = 0,
                            node_id: int | None = None) -> int:
        """Add a new child to ``parent_id`` at index ``position`` that adopts the ``n_adopted``
        siblings after it as its children (their subtrees one level deeper); return its id
        (``node_id`` as in :meth:`add_child`)."""
        nid = self.add_child(parent_id, born=born, position=position, node_id=node_id)
        kids = self.children[parent_id][position + 1:position + 1 + n_adopted]
        del self.children[parent_id][position + 1:position + 1 + n_adopted]
        self.children[nid] = kids
        for c in kids:
            self.parent[c] = nid
            for g in self.subtree(c):
                self.depth[g] += 1
        return nid

    def remove_subtree(self, node_id: int) -> list[int]:
        """Delete ``node_id`` and its descendants; returns the removed ids."""
        if node_id == ROOT:
            raise ValueError("the root cannot be removed")
        removed = self.subtree(node_id)
        self.children[self.parent[node_id]].remove(node_id)
        for nid in removed:
            del self.parent[nid], self.children[nid], self.depth[nid], self.born[nid]
        return removed

    def merge_into_parent(self, node_id: int) -> int:
        """Delete ``node_id`` and give its children, in order, its place under its parent.

        The moved subtrees rise one level. Returns the parent's id.
        """
        if node_id == ROOT:
            raise ValueError("the root has no parent to merge into")
        par = self.parent[node_id]
        kids = self.children[node_id]
        siblings = self.children[par]
        pos = siblings.index(node_id)
        siblings[pos:pos + 1] = kids
        for k in kids:
            self.parent[k] = par
        for k in kids:
            for nid in self.subtree(k):
                self.depth[nid] -= 1
        del self.parent[node_id], self.children[node_id], self.depth[node_id], self.born[node_id]
        return par

    def rename(self, old: int, new: int, born: int) -> None:
        """Give node ``old`` the fresh id ``new`` (same place, children and depth)."""
        if old == ROOT:
            raise ValueError("the root keeps its id")
        par = self.parent.pop(old)
        sib = self.children[par]
        sib[sib.index(old)] = new
        self.parent[new] = par
        self.children[new] = self.children.pop(old)
        for k in self.children[new]:
            self.parent[k] = new
        self.depth[new] = self.depth.pop(old)
        del self.born[old]
        self.born[new] = born

    def subtree(self, node_id: int) -> list[int]:
        out, stack = [], [node_id]
        while stack:
            nid = stack.pop()
            out.append(nid)
            stack.extend(reversed(self.children[nid]))
        return out

    def preorder(self) -> list[int]:
        return self.subtree(ROOT)

    def path(self, node_id: int) -> tuple[int, ...]:
        """Child positions from the root (the root's path is ``()``)."""
        out = []
        while node_id != ROOT:
            par = self.parent[node_id]
            out.append(self.children[par].index(node_id))
            node_id = par
        return tuple(reversed(out))

    def arrays(self) -> TreeArrays:
        ids = self.preorder()
        row = {nid: k for k, nid in enumerate(ids)}
        parent_index = np.array([row[self.parent[i]] if i != ROOT else -1 for i in ids], dtype=np.int64)
        depth = np.array([self.depth[i] for i in ids], dtype=np.int64)
        rank = np.array([self.children[self.parent[i]].index(i) if i != ROOT else 0 for i in ids],
                        dtype=np.int64)
        return TreeArrays(np.asarray(ids, dtype=np.int64), parent_index, depth, rank)

    def copy(self) -> "TSSBTree":
        new = TSSBTree(self.max_depth)
        new.parent = dict(self.parent)
        new.children = {k: list(v) for k, v in self.children.items()}
        new.depth = dict(self.depth)
        new.born = dict(self.born)
        new.next_id = self.next_id
        return new
