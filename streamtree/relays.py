"""Relay chains: how ``streamtree show`` and the report draw runs of empty single-child nodes.

A *relay* is a node that holds no documents of its own and has exactly one child. The
multinomial family often grows them, sometimes several in a row (a parent whose documents
all moved to a child it keeps). A relay's subtree holds exactly its child's documents, and a
node's words are those of its subtree's documents, so a chain of relays reads as the same
line or box repeated. The views draw a chain and the node it leads to as one entry, the ids
of the relays shown on the way (``[209] > [212] > [213]`` in ``show``, ``209 › 212 › 213`` in
the report), so no id and no document is hidden; :func:`relay_chains` finds the chains, once
for both views.
"""

from __future__ import annotations

import numpy as np

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
