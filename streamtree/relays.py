"""Relay chains: how ``streamtree show`` and the report draw runs of empty single-child nodes.

A *relay* is a node that holds no documents of its own and has exactly one child. The
multinomial family often grows them, sometimes several in a row (a parent whose documents
all moved to a child it keeps). A relay's subtree holds exactly its child's documents, and a
node's words are those of its subtree's documents, so a chain of relays reads as the same
line or box repeated. The views draw a chain and the node it leads to as one entry, the ids
of the relays shown on the way (``[209] > [212] > [213]`` in ``show``, ``209 › 212 › 213`` in
the report), so no id and no document is hidden; :func:`relay_chains` finds the chains, once
for both views. Events that only re-draw such a chain, *relay changes* (a relay born, a
relay that never had a line of its own gone, a node hung elsewhere with its line staying where
it was), are told apart from the topics' own events by :func:`relay_changes`.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

#: What a chain ``a > b`` means, for the legends of ``show`` and the report.
RELAY_LEGEND = ("a holds no documents of its own and b is its only child, so both are drawn as one, with b's "
                "documents and words")


def relay_chains(ids, parents, counts) -> dict[int, tuple[int, ...]]:
    """The relay chains of one tree.

    Parameters
    ----------
    ids : array-like of int, shape (K,)
        Node ids.
    parents : array-like of int, shape (K,)
        Parent id of each node; ``-1`` (or an id not in ``ids``) for a root.
    counts : array-like of int, shape (K,)
        Documents at each node itself (with those of any descendants the view folds into it).

    Returns
    -------
    dict of int to tuple of int
        For each node below one or more relays (a node that is not a relay whose parent is),
        the ids of those relays, top first. Every relay is in exactly one chain; a node absent
        from the keys has no relay above it.
    """
    ids = np.asarray(ids, dtype=np.int64)
    parents = np.asarray(parents, dtype=np.int64)
    counts = np.asarray(counts)
    if not ids.shape == parents.shape == counts.shape:
        raise ValueError(f"ids, parents and counts must have one entry per node, got shapes {ids.shape}, "
                         f"{parents.shape} and {counts.shape}")
    kids, n_kids = np.unique(parents[np.isin(parents, ids)], return_counts=True)
    single = set(kids[n_kids == 1].tolist())
    relay = {n for n, c in zip(ids.tolist(), counts.tolist()) if c == 0 and n in single}
    parent_of = dict(zip(ids.tolist(), parents.tolist()))
    chains = {}
    for nid in ids.tolist():
        if nid in relay or parent_of[nid] not in relay:
            continue
        above, at = [], parent_of[nid]
        while at in relay and len(above) < len(relay):  # the bound: parents that form a cycle
            above.append(at)
            at = parent_of[at]
        chains[nid] = tuple(reversed(above))
    return chains


#: a tree as the views read it: node ids, parent ids (-1 for the root), the epoch's documents at each
TreeColumns = tuple[ArrayLike, ArrayLike, ArrayLike]


def _lines(ids: ArrayLike, parents: ArrayLike, counts: ArrayLike) -> tuple[set[int], dict[int, int]]:
    """A tree's relays, and per node the id of the line drawn above its own (the node the top
    of its chain hangs from; -1 for a line at the top)."""
    ids = [int(i) for i in np.asarray(ids).ravel()]
    parent_of = dict(zip(ids, (int(p) for p in np.asarray(parents).ravel())))
    chains = relay_chains(ids, list(parent_of.values()), counts)
    end = {n: n for n in ids}
    end.update({r: e for e, chain in chains.items() for r in chain})
    relays = {r for chain in chains.values() for r in chain}
    above = {}
    for n in ids:
        top = chains.get(end[n], (end[n],))[0]
        p = parent_of[top]  # no relay: a relay's relay parent is in its chain
        above[n] = p if p in parent_of else -1
    return relays, above


def own_lines(ids: ArrayLike, parents: ArrayLike, counts: ArrayLike) -> set[int]:
    """The ids of a tree drawn on a line of their own: every node but the relays."""
    relays, _ = _lines(ids, parents, counts)
    return {int(i) for i in np.asarray(ids).ravel()} - relays


def relay_changes(node_id: ArrayLike, event: ArrayLike, before: TreeColumns | None, after: TreeColumns,
                  had_lines: set[int] | frozenset[int] = frozenset()) -> np.ndarray:
    """Which of an epoch's events only re-draw a relay chain (its *relay changes*).

    The views draw a relay chain and the node it leads to as one line, so such an event shows
    no topic being born, ending or moving: a relay born or split off in this epoch's tree (a
    new empty node above a node), the death or merge of a node that was a relay in the previous
    tree and never had a line of its own (a chain made shorter), and a parent change after
    which the node's line hangs below the same line as before (a relay put in or taken out
    between a node and its parent). A topic that emptied into a relay and then ends is a
    topic's end; a relay that takes its line to a new place is a move of that line. A relay
    born now that later holds documents has a line from then on, with no event of its own.

    Parameters
    ----------
    node_id, event : array-like
        Aligned event columns (as in :class:`~streamtree.events.Events` or the stored table).
    before, after : tuple of (ids, parents, counts), or None for ``before``
        The previous and this epoch's trees: node ids, parent ids (-1 for the root) and the
        epoch's documents at each node. ``before`` is None where the previous tree is not at
        hand; then deaths, merges and parent changes all count as the topics' own.
    had_lines : set of int
        Ids drawn on a line of their own (:func:`own_lines`) in any epoch before this one that
        the caller has read.

    Returns
    -------
    numpy.ndarray of bool
        True for each relay change.
    """
    node_id = np.asarray(node_id, dtype=np.int64).ravel()
    event = np.asarray(event, dtype=object).ravel()
    relays_now, above_now = _lines(*after)
    relays_then, above_then = _lines(*before) if before is not None else (set(), {})
    out = np.zeros(node_id.size, dtype=bool)
    for i, (n, kind) in enumerate(zip(node_id.tolist(), event.tolist())):
        if kind in ("born", "split_from"):
            out[i] = n in relays_now
        elif kind in ("died", "merged_into"):
            out[i] = n in relays_then and n not in had_lines
        elif kind == "parent_changed":
            out[i] = n in above_then and n in above_now and above_then[n] == above_now[n]
    return out


class RelayReader:
    """:func:`relay_changes` of a run's epochs in order: keeps the tree each epoch is read
    against and the ids that had a line of their own before it, for the views (``show``, its
    evolution line, the report). Each view says what it passes for an epoch it does not read:
    ``show``'s evolution line reads no tree for an epoch without an events table, the report
    reads every epoch's tree.

    Parameters
    ----------
    before : tuple of (ids, parents, counts), or None
        The tree of the epoch before the first one read, where it is at hand.
    had_lines : set of int
        Ids with a line of their own in the epochs before the first one read.
    """

    def __init__(self, before: TreeColumns | None = None, had_lines: set[int] | frozenset[int] = frozenset()) -> None:
        self.before = before
        self.had_lines: set[int] = set(had_lines)

    def read(self, node_id: ArrayLike, event: ArrayLike, after: TreeColumns) -> np.ndarray:
        """Which of this epoch's events (``after``: its tree) are relay changes. The reader then
        moves on: this epoch is the one the next is read against, so each epoch is read once."""
        flags = relay_changes(node_id, event, self.before, after, self.had_lines)
        self.passed(after)
        return flags

    def passed(self, after: TreeColumns | None) -> None:
        """Step over an epoch without reading its events: ``after`` its tree, or None where its
        tree is not read (the next epoch's deaths, merges and parent changes then all count as
        the topics' own)."""
        if after is not None:
            self.had_lines |= own_lines(*after)
        self.before = after
