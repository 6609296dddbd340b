"""Events between consecutive epoch trees: births, deaths, splits, merges, parent changes.

An event is one row ``(epoch, node_id, event, other_id)``:

* ``born``: ``node_id`` is in this epoch's tree and not in the previous one;
* ``died``: ``node_id`` was in the previous epoch's tree and is not in this one;
* ``split_from``: ``node_id`` was created from the documents of ``other_id``;
* ``merged_into``: ``node_id`` was absorbed by ``other_id``;
* ``parent_changed``: ``node_id`` is in both trees and its parent is now ``other_id``.

``other_id`` is -1 (null in the stored table) for ``born`` and ``died``. A node that merged
into another is gone from the tree, so it has both a ``died`` and a ``merged_into`` row; the
views (``streamtree show``, the report) say how it ended once, as the merge
(:func:`merged_deaths` finds the ``died`` rows they leave out). Births, deaths and
parent changes follow from the node ids and parents of two consecutive trees alone
(:func:`derive_events`); splits and merges need the sampler's knowledge of which move made a
node or where a new node's documents were in the previous tree, so only the model can record
them.

Pure: arrays in, arrays out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The event names, in the order rows of one epoch are listed.
EVENT_KINDS = ("born", "died", "split_from", "merged_into", "parent_changed")
#: Events that carry an ``other_id``.
WITH_OTHER = ("split_from", "merged_into", "parent_changed")
NO_OTHER = -1


@dataclass(frozen=True)
class Events:
    """Aligned event columns; ``other_id`` is -1 where an event has no other node."""

    epoch: np.ndarray
    node_id: np.ndarray
    event: np.ndarray
    other_id: np.ndarray

    def __len__(self) -> int:
        return int(self.node_id.shape[0])

    @classmethod
    def empty(cls) -> Events:
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z.copy(), np.zeros(0, dtype=object), z.copy())

    def of(self, kind: str) -> Events:
        """Only the events of one kind."""
        keep = self.event == kind
        return Events(self.epoch[keep], self.node_id[keep], self.event[keep], self.other_id[keep])


def derive_events(epoch: int, prev_ids, prev_parents, ids, parents) -> Events:
    """Births, deaths and parent changes of epoch ``epoch`` from two consecutive trees.

    Parameters
    ----------
    epoch : int
        The later epoch; every event is filed under it (a node that died at ``epoch`` was
        alive in the previous tree and is gone from this one).
    prev_ids, prev_parents : array-like of int
        Node ids and parent ids (-1 for the root) of the previous epoch's tree; empty for
        the first epoch (then every node is born).
    ids, parents : array-like of int
        The same for this epoch's tree.

    Returns
    -------
    Events
        Rows ordered by kind (born, died, parent_changed) and, within a kind, by node id.
    """
    prev_ids = np.asarray(prev_ids, dtype=np.int64).ravel()
    prev_parents = np.asarray(prev_parents, dtype=np.int64).ravel()
    ids = np.asarray(ids, dtype=np.int64).ravel()
    parents = np.asarray(parents, dtype=np.int64).ravel()
    if prev_ids.shape != prev_parents.shape or ids.shape != parents.shape:
        raise ValueError("each tree needs one parent per node id")
    for name, arr in (("previous", prev_ids), ("this", ids)):
        if np.unique(arr).size != arr.size:
            raise ValueError(f"the {name} epoch's tree repeats a node id")

    born = np.setdiff1d(ids, prev_ids)  # sorted
    died = np.setdiff1d(prev_ids, ids)
    both, i_prev, i_now = np.intersect1d(prev_ids, ids, return_indices=True)
    moved = prev_parents[i_prev] != parents[i_now]
    changed, new_parent = both[moved], parents[i_now][moved]

    node_id = np.concatenate([born, died, changed])
    other = np.concatenate([np.full(born.size + died.size, NO_OTHER, dtype=np.int64), new_parent])
    kind = np.array(["born"] * born.size + ["died"] * died.size + ["parent_changed"] * changed.size,
                    dtype=object)
    return Events(np.full(node_id.size, int(epoch), dtype=np.int64), node_id, kind, other)


def epoch_events(epoch: int, prev_ids, prev_parents, ids, parents, moves, origins=()) -> Events:
    """All events of an epoch: :func:`derive_events`, the sampler's accepted moves and the
    splits its documents show.

    ``moves`` holds ``(node_id, "split_from" | "merged_into", other_id)`` in the order they
    were accepted. A ``split_from`` is kept when its node was born in this epoch and is in this
    tree; a ``merged_into`` when its node was in the previous tree and is not in this one (the
    last such move of a node wins). The first epoch of a stream (no previous tree) has births
    only: its tree is where the stream starts, and how the sampler grew it from one node is no
    change a reader could follow. Rows are ordered by :data:`EVENT_KINDS`, then node id.

    Every ``other_id`` names a node of one of the two trees, so a reader can look it up. The
    chain may pass through nodes that live only within the epoch (born by one move and gone by
    another); an event that names one is traced to a node of the trees: a split to where the
    transient node itself was split from (``36`` split from ``35``, which was split from ``7``
    and then merged away: ``36`` split from ``7``), a merge to where the transient node went.
    A split or merge that cannot be traced so is left out (the node is still ``born`` or
    ``died``).

    ``origins`` holds ``(node_id, other_id)`` pairs: a node born in this epoch whose documents
    were at ``other_id`` in the previous tree (the sampler's lineage of the epoch's documents,
    :meth:`~streamtree.inference.epoch_sampler.EpochSampler._split_origins`). Where its node
    is born now and its origin is another node of the two trees, the origin is the node's
    ``split_from`` in place of any the moves give it: a move names where the chain made the
    node, often another node born in the same epoch, and the origin where its documents were
    before.
    """
    base = derive_events(epoch, prev_ids, prev_parents, ids, parents)
    now = set(np.asarray(ids, dtype=np.int64).tolist())
    before = set(np.asarray(prev_ids, dtype=np.int64).tolist())
    if not before:
        return base
    known = now | before
    origin = {int(n): int(o) for n, o in origins if n in now and n not in before and o in known and o != n}
    last: dict[tuple[int, str], int] = {}
    source: dict[int, int] = {}  # every node's last split origin and merge target, transient ones too
    target: dict[int, int] = {}
    for node, kind, other in moves:
        node, other = int(node), int(other)
        (source if kind == "split_from" else target)[node] = other
        if kind == "split_from" and node in now and node not in before and node not in origin:
            last[(node, kind)] = other
        elif kind == "merged_into" and node in before and node not in now:
            last[(node, kind)] = other

    def traced(node: int, links: dict[int, int]) -> int | None:
        seen = set()
        while node not in known and node in links and node not in seen:
            seen.add(node)
            node = links[node]
        return node if node in known else None

    rows = list(zip(base.node_id.tolist(), base.event.tolist(), base.other_id.tolist()))
    for (n, k), o in last.items():
        o = traced(o, source if k == "split_from" else target)
        if o is not None and o != n:
            rows.append((n, k, o))
    rows += [(n, "split_from", o) for n, o in origin.items()]
    rows.sort(key=lambda r: (EVENT_KINDS.index(r[1]), r[0]))
    if not rows:
        return Events.empty()
    node_id, kind, other = zip(*rows)
    return Events(np.full(len(rows), int(epoch), dtype=np.int64), np.asarray(node_id, dtype=np.int64),
                  np.asarray(kind, dtype=object), np.asarray(other, dtype=np.int64))


def merged_deaths(epoch, node_id, event) -> np.ndarray:
    """Which rows are the ``died`` of a node that merged into another in the same epoch.

    The table keeps both rows (the node is gone from the tree, and the sampler knows where its
    documents went); a view shows the merge alone, as the node's end.

    Parameters
    ----------
    epoch, node_id, event : array-like
        Aligned event columns (as in :class:`Events` or the stored table).

    Returns
    -------
    numpy.ndarray of bool
        True for each ``died`` row whose ``(epoch, node_id)`` also has a ``merged_into`` row.
    """
    epoch = np.asarray(epoch, dtype=np.int64).ravel()
    node_id = np.asarray(node_id, dtype=np.int64).ravel()
    event = np.asarray(event, dtype=object).ravel()
    merged = set(zip(epoch[event == "merged_into"].tolist(), node_id[event == "merged_into"].tolist()))
    return np.fromiter(((k == "died" and (e, n) in merged) for e, n, k in
                        zip(epoch.tolist(), node_id.tolist(), event.tolist())), dtype=bool, count=event.size)
