"""What the report shows, as plain JSON-ready data.

Two steps: :func:`read_store` reads a snapshot store into a :class:`StoreContent` (arrays,
the only I/O), and :func:`report_data` turns that into the dict the page draws from (pure:
same content, same dict). The figures' geometry is computed here, so that it can be
checked against the store's numbers without a browser; the page only maps it to plotly
traces.

**The evolving tree** is an alluvial view: one column per epoch, one band per node whose
height in a column is its share of that column's documents (the documents at the node itself
plus those of its descendants folded into it). In every column the bands are stacked in the
tree's depth-first order, a node above its children and siblings by id, so a subtree always
occupies one contiguous stretch: bands follow the parent links. A node is shown when its
subtree held at least ``threshold`` of the documents in some column; smaller nodes are folded
into their nearest shown ancestor. Layouts are computed for a ladder of thresholds (the
page's control), keeping only those that show at most ``max_bands`` bands.

**Relay chains** (:mod:`streamtree.relays`): a node with no documents of its own and one child
is drawn with the node it leads to, as one box of the epoch's tree and, in a column of the
evolving tree where it holds nothing after folding and has one shown child, as part of that
child's band (its hover and its event marks are the child's, naming it).

**Events** are the store's, less the ``died`` row of a node that merged into another in that
epoch (:func:`~streamtree.events.merged_deaths`): the page says a node's end once, and a merge
is its end; the counts of deaths are of nodes that ended without merging. The counts are the
topics' events: the relay changes (a relay born, a relay that never had a box of its own gone
or merged, a parent change that leaves a box below the same box,
:func:`~streamtree.relays.relay_changes`) are counted apart and still marked.

**Long runs** (more epochs than ``max_columns``) are aggregated: consecutive epochs are
grouped into ``ceil(n_epochs / max_columns)`` per column; a node's documents are summed over
its column's epochs, and its parent is the one of the last epoch of the column in which it
appears. The one-epoch tree, the lineage and the run summary always keep every epoch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from streamtree.events import EVENT_KINDS, merged_deaths
from streamtree.relays import RelayReader, relay_chains

#: Colours of the top-level branches (colour-blind friendly, after Okabe and Ito, and Tol).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
           "#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#AA4499", "#882255")
ROOT_COLOUR = "#9aa0a6"
#: Height (share of a column) of the band of a node that holds no documents of its own and has two
#: or more shown children, so it shows as a thin band above its children instead of a line; the
#: other bands of the column share the rest in proportion to their documents.
EMPTY_BAND = 0.01
#: At most this share of a column goes to such bands (each gets less when there are more).
EMPTY_BANDS_MAX = 0.06
#: The marks of merges into the root, a kind of their own: drawn at the merged node's end with
#: no line to the root's band (which tops every column, so the line would run across the view).
ROOT_MERGE = "merged_into_root"


@dataclass(frozen=True)
class ReportOptions:
    """Knobs of the report; the defaults suit runs from a few to thousands of epochs.

    Attributes
    ----------
    top_words : int
        Words shown per node.
    thresholds : tuple of float
        Candidate fold thresholds (share of a column's documents) offered by the page; one
        that folds no more nodes than a smaller one is left out.
    max_bands : int
        Thresholds that would show more bands than this are not offered; if even the
        largest candidate does, the threshold that keeps the ``max_bands`` largest nodes is.
    readable_bands : int
        The page opens at the smallest offered threshold showing at most this many bands.
    max_columns : int
        Columns of the evolving tree; longer runs are aggregated (see the module docs).
    max_dendrograms : int
        Static dendrograms embedded at most (evenly spaced over the epochs that have them).
    """

    top_words: int = 8
    thresholds: tuple[float, ...] = (0.0, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1)
    max_bands: int = 400
    readable_bands: int = 100
    max_columns: int = 200
    max_dendrograms: int = 48

    def __post_init__(self) -> None:
        for name in ("top_words", "max_bands", "readable_bands", "max_columns", "max_dendrograms"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not self.thresholds or any(not 0 <= t < 1 for t in self.thresholds):
            raise ValueError(f"thresholds must be shares in [0, 1), got {self.thresholds!r}")


@dataclass
class StaticContent:
    """One stored static dendrogram."""

    epoch: int
    method: str
    linkage: np.ndarray
    leaf_ids: list[str] | None
    over: str | None


@dataclass
class StoreContent:
    """A store's published content, as arrays (what :func:`report_data` needs).

    Per epoch (in publish order): ``epoch``, ``label``, ``n_documents``, ``n_rejects``.
    Per node and epoch (``node_*``, ordered by epoch then the tree's depth-first order):
    the row's epoch, id, parent, depth, documents at the node (``count``) and in its subtree,
    mass, epoch of birth and words (as published). Events as in :mod:`streamtree.events`.
    """

    uri: str
    config: dict
    vocabulary_size: int | None
    epoch: np.ndarray
    label: list[str]
    n_documents: np.ndarray
    n_rejects: np.ndarray
    rejects_by_reason: dict[str, int]
    node_epoch: np.ndarray
    node_id: np.ndarray
    node_parent: np.ndarray
    node_depth: np.ndarray
    node_count: np.ndarray
    node_subtree: np.ndarray
    node_mass: np.ndarray
    node_born: np.ndarray
    node_words: list[list[str]]
    event_epoch: np.ndarray
    event_node: np.ndarray
    event_kind: np.ndarray
    event_other: np.ndarray
    static: list[StaticContent] = field(default_factory=list)
    versions: dict = field(default_factory=dict)
    unfinished: str | None = None  # why the run shown may not be whole (a replay not finished)


def read_store(store, *, max_dendrograms: int = ReportOptions.max_dendrograms) -> StoreContent:
    """Read everything the report needs from a :class:`~connectors.stores.SnapshotStore`."""
    from streamtree.records import RejectLog
    from streamtree.replay import unfinished_note

    manifest = store.manifest()
    entries = manifest["epochs"]
    nodes = store.all_nodes(["epoch", "id", "parent", "depth", "count", "subtree_count", "mass", "born",
                             "top_words"])
    events = store.events()
    log = RejectLog()
    for e in entries:
        if e["n_rejects"]:
            log.add(store.rejects(e["epoch"]))
    with_static = [(e["epoch"], m) for e in entries for m in e.get("static", [])]
    if len(with_static) > max_dendrograms:
        keep = np.unique(np.linspace(0, len(with_static) - 1, max_dendrograms).round().astype(int))
        with_static = [with_static[i] for i in keep]
    static = []
    for ep, method in with_static:
        snap = store.read_static(ep, method)
        over = snap.stats.get("over")
        static.append(StaticContent(ep, method, snap.linkage, snap.leaf_ids, over if isinstance(over, str) else None))
    i64 = lambda name: np.asarray(nodes.column(name).to_numpy(), dtype=np.int64)  # noqa: E731
    other = events.column("other_id").fill_null(-1)
    vocab = manifest.get("vocabulary")
    return StoreContent(
        uri=str(store.uri), config=dict(manifest.get("config") or {}),
        vocabulary_size=None if vocab is None else int(vocab["size"]),
        epoch=np.asarray([e["epoch"] for e in entries], dtype=np.int64),
        label=[str(e["label"]) if e.get("label") is not None else str(e["epoch"]) for e in entries],
        n_documents=np.asarray([e["n_documents"] for e in entries], dtype=np.int64),
        n_rejects=np.asarray([e["n_rejects"] for e in entries], dtype=np.int64),
        rejects_by_reason=dict(log.counts),
        node_epoch=i64("epoch"), node_id=i64("id"), node_parent=i64("parent"), node_depth=i64("depth"),
        node_count=i64("count"), node_subtree=i64("subtree_count"),
        node_mass=np.asarray(nodes.column("mass").to_numpy(), dtype=np.float64), node_born=i64("born"),
        node_words=[list(w or []) for w in nodes.column("top_words").to_pylist()],
        event_epoch=np.asarray(events.column("epoch").to_numpy(), dtype=np.int64),
        event_node=np.asarray(events.column("node_id").to_numpy(), dtype=np.int64),
        event_kind=np.asarray(events.column("event").to_pylist(), dtype=object),
        event_other=np.asarray(other.to_numpy(), dtype=np.int64),
        static=static, versions=dict(manifest.get("versions") or {}), unfinished=unfinished_note(store),
    )


# ------------------------------------------------------------------------------- evolution
@dataclass
class Columns:
    """Node rows aggregated per column of the evolving tree (one entry per column and id)."""

    n_columns: int
    per_column: int
    docs: np.ndarray            # (n_columns,) documents of each column
    first_epoch: np.ndarray     # (n_columns,) position of the column's first epoch
    col: np.ndarray             # per entry: column
    id: np.ndarray
    parent: np.ndarray          # parent at the last epoch of the column where the id appears
    count: np.ndarray           # documents at the node, summed over the column's epochs
    subtree: np.ndarray
    row: np.ndarray             # node row of that last epoch (for words and hover)


def aggregate_columns(epoch_pos: np.ndarray, ids, parents, counts, subtree, n_documents, max_columns: int) -> Columns:
    """Group the node rows of ``len(n_documents)`` epochs into at most ``max_columns`` columns.

    ``epoch_pos`` is each row's epoch position (0 .. n_epochs-1); rows must be in epoch
    order. One entry per (column, id).
    """
    n_epochs = int(len(n_documents))
    per = max(1, math.ceil(n_epochs / max_columns))
    n_cols = max(1, math.ceil(n_epochs / per))
    col_of_row = np.asarray(epoch_pos, dtype=np.int64) // per
    docs = np.bincount(np.arange(n_epochs) // per, weights=np.asarray(n_documents, dtype=np.float64),
                       minlength=n_cols).astype(np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    key = col_of_row * (int(ids.max(initial=0)) + 2) + ids
    uniq, inverse = np.unique(key, return_inverse=True)
    # the last row of each (column, id): rows are in epoch order, so the largest row index
    last = np.zeros(uniq.size, dtype=np.int64)
    np.maximum.at(last, inverse, np.arange(ids.size))
    order = np.lexsort((ids[last], col_of_row[last]))
    last = last[order]
    remap = np.empty(uniq.size, dtype=np.int64)
    remap[order] = np.arange(uniq.size)
    entry = remap[inverse]
    return Columns(
        n_columns=n_cols, per_column=per, docs=docs, first_epoch=np.arange(n_cols) * per,
        col=col_of_row[last], id=ids[last], parent=np.asarray(parents, dtype=np.int64)[last],
        count=np.bincount(entry, weights=np.asarray(counts, dtype=np.float64), minlength=uniq.size).astype(np.int64),
        subtree=np.bincount(entry, weights=np.asarray(subtree, dtype=np.float64), minlength=uniq.size).astype(np.int64),
        row=last,
    )


def peak_shares(cols: Columns) -> dict[int, float]:
    """Per id, the largest share of a column's documents its subtree held."""
    share = cols.subtree / np.maximum(cols.docs[cols.col], 1)
    peak: dict[int, float] = {}
    for nid, s in zip(cols.id.tolist(), share.tolist()):
        if s > peak.get(nid, -1.0):
            peak[nid] = s
    return peak


def evolution_layout(cols: Columns, shown: set[int]) -> dict[int, dict]:
    """Bands of the shown ids: per id, parallel lists ``col``, ``y0``, ``y1`` (shares, top
    down from 0), ``docs`` (documents in the band) and ``row`` (node row for the words).

    Roots (parent -1, or a parent absent from the column) are always shown. A hidden
    entry's documents go to its nearest shown ancestor in that column. Where a shown entry
    holds no documents after that and has one shown child (a relay), the band's ``relay``
    lists the entry's position in its lists, and the band of the node the chain leads to has
    the chain's ids, top first, under that entry's position in ``via`` (both only when there
    are such entries). Where it holds none and has two or more shown children, its band is
    :data:`EMPTY_BAND` high (together at most :data:`EMPTY_BANDS_MAX` of the column), the other
    bands sharing the rest by their documents, and the band's ``empty`` maps the entry's
    position to the documents below it in that column.
    """
    bands: dict[int, dict] = {}
    starts = np.searchsorted(cols.col, np.arange(cols.n_columns + 1))
    for c in range(cols.n_columns):
        lo, hi = int(starts[c]), int(starts[c + 1])
        if lo == hi:
            continue
        ids = cols.id[lo:hi].tolist()
        present = set(ids)
        children: dict[int, list[int]] = {}
        roots = []
        for j, (nid, par) in enumerate(zip(ids, cols.parent[lo:hi].tolist())):
            if par == -1 or par not in present:
                roots.append(j)
            else:
                children.setdefault(par, []).append(j)  # ids ascend within a column: siblings by id
        height = np.zeros(hi - lo, dtype=np.int64)
        order: list[int] = []       # shown entries, depth-first
        drawn_parent: list[int] = []  # the id of each one's nearest shown ancestor (-1: none)
        seen = np.zeros(hi - lo, dtype=bool)
        stack = [(j, j) for j in reversed(roots)]  # (entry, shown entry that takes its documents)
        while stack:
            j, owner = stack.pop()
            if seen[j]:
                continue  # a parent cycle from aggregation: visit each entry once
            seen[j] = True
            nid = ids[j]
            if nid in shown or owner == j:
                drawn_parent.append(-1 if owner == j else ids[owner])
                owner = j
                order.append(j)
            height[owner] += cols.count[lo + j]
            for k in reversed(children.get(nid, [])):
                stack.append((k, owner))
        chains = relay_chains([ids[j] for j in order], drawn_parent, height[order])
        relays = {r for chain in chains.values() for r in chain}
        # documents below each shown entry, and its shown children (depth-first: children after parents)
        below = {ids[j]: 0 for j in order}
        n_kids = dict.fromkeys(below, 0)
        for j, up in zip(reversed(order), reversed(drawn_parent)):
            if up != -1:
                below[up] += below[ids[j]] + int(height[j])
                n_kids[up] += 1
        empty = {ids[j] for j in order if height[j] == 0 and n_kids[ids[j]] >= 2}
        total = max(int(cols.docs[c]), 1)
        thin = min(EMPTY_BAND, EMPTY_BANDS_MAX / len(empty)) if empty and cols.docs[c] > 0 else 0.0
        scale = (1.0 - thin * len(empty)) / total
        y = 0.0
        for j in order:
            h = thin if ids[j] in empty else height[j] * scale
            band = bands.setdefault(ids[j], {"col": [], "y0": [], "y1": [], "docs": [], "row": []})
            if ids[j] in empty:
                band.setdefault("empty", {})[len(band["col"])] = below[ids[j]]
            if ids[j] in relays:
                band.setdefault("relay", []).append(len(band["col"]))
            if ids[j] in chains:
                band.setdefault("via", {})[len(band["col"])] = list(chains[ids[j]])
            band["col"].append(c)
            band["y0"].append(round(y, 5))
            band["y1"].append(round(y + h, 5))
            band["docs"].append(int(height[j]))
            band["row"].append(int(cols.row[lo + j]))
            y += h
    return bands


def band_colours(cols: Columns, bands: dict[int, dict]) -> dict[int, str]:
    """Each band's colour: one hue per branch, lighter with each level below the branch's
    top; the trunk grey.

    The trunk is the root and, from it down, every child with children of its own whose
    subtree held more than half of its parent's documents over the run (a node that holds most
    of the stream, as a general-purpose node under the root often does, would otherwise colour
    nearly every band alike). A branch is a node below the trunk whose parent is on it. A band's place in the
    tree is read in the column where its subtree held its largest share.
    """
    share = cols.subtree / np.maximum(cols.docs[cols.col], 1)
    peak: dict[int, tuple[float, int]] = {}  # id -> (largest share, its column)
    total: dict[int, int] = {}  # id -> documents in its subtree, summed over the columns
    parent_at: dict[tuple[int, int], int] = {}
    for c, nid, par, s, n in zip(cols.col.tolist(), cols.id.tolist(), cols.parent.tolist(), share.tolist(),
                                 cols.subtree.tolist()):
        parent_at[(c, nid)] = par
        total[nid] = total.get(nid, 0) + n
        if s > peak.get(nid, (-1.0, 0))[0]:
            peak[nid] = (s, c)
    parent = {nid: parent_at[(c, nid)] for nid, (_, c) in peak.items()}
    children: dict[int, list[int]] = {}
    for nid, par in parent.items():
        children.setdefault(par, []).append(nid)
    trunk, todo = set(), [nid for nid, par in parent.items() if par == -1 or par not in parent]
    while todo:
        nid = todo.pop()
        if nid in trunk:
            continue
        trunk.add(nid)
        todo += [k for k in children.get(nid, []) if 2 * total[k] > total[nid] and k in children]
    branch_rank: dict[int, int] = {}
    out = {}
    for nid in sorted(bands):
        node, hops = nid, 0
        while node not in trunk and parent.get(node, -1) not in trunk and hops < 64:
            node, hops = parent[node], hops + 1
        if node in trunk:
            out[nid] = ROOT_COLOUR
            continue
        rank = branch_rank.setdefault(node, len(branch_rank))
        out[nid] = _tint(PALETTE[rank % len(PALETTE)], min(0.55, 0.18 * hops))
    return out


def _tint(hex_colour: str, amount: float) -> str:
    """``hex_colour`` mixed with white by ``amount`` (0 = unchanged)."""
    rgb = [int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(v + (255 - v) * amount):02x}" for v in rgb)


def offered_thresholds(peak: dict[int, float], options: ReportOptions) -> list[float]:
    """The thresholds the page offers (see :class:`ReportOptions`), ascending."""
    values = np.sort(np.fromiter(peak.values(), dtype=np.float64, count=len(peak)))[::-1]
    n_at = lambda t: int(np.count_nonzero(values >= t))  # noqa: E731
    ok, shown = [], None
    for t in sorted({float(t) for t in options.thresholds}):
        n = n_at(t)
        if n <= options.max_bands and n != shown:  # a threshold that folds nothing more is not offered
            ok.append(t)
            shown = n
    if not ok:  # keep the max_bands largest nodes
        t = float(values[options.max_bands - 1])
        while n_at(t) > options.max_bands:  # ties: step just above
            t = float(np.nextafter(t, 1.0))
        ok = [t]
    return ok


# ------------------------------------------------------------------------------- the data
def report_data(content: StoreContent, options: ReportOptions | None = None) -> dict:
    """Everything the page shows, as JSON-ready dicts and lists (see the module docs)."""
    options = options or ReportOptions()
    n_epochs = int(content.epoch.size)
    pos_of_epoch = {int(e): i for i, e in enumerate(content.epoch.tolist())}
    node_pos = np.asarray([pos_of_epoch[int(e)] for e in content.node_epoch.tolist()], dtype=np.int64)
    words = [" ".join(w[:options.top_words]) for w in content.node_words]
    epochs = {
        "epoch": content.epoch.tolist(), "label": list(content.label),
        "n_documents": content.n_documents.tolist(), "n_rejects": content.n_rejects.tolist(),
        "n_nodes": np.bincount(node_pos, minlength=n_epochs).tolist(),
    }
    nodes = {
        "e": node_pos.tolist(), "id": content.node_id.tolist(), "parent": content.node_parent.tolist(),
        "depth": content.node_depth.tolist(), "count": content.node_count.tolist(),
        "subtree": content.node_subtree.tolist(), "mass": [float(f"{m:.4g}") for m in content.node_mass.tolist()],
        "born": content.node_born.tolist(), "words": words, "via": _relay_rows(content, node_pos, n_epochs),
    }
    # a node that merged into another also has a "died" row in the store; the page says its end
    # once, as the merge (its marks, its lineage, the counts)
    keep = ~merged_deaths(content.event_epoch, content.event_node, content.event_kind)
    ev_kind = [str(k) for k in content.event_kind[keep]]
    ev_pos = [pos_of_epoch.get(int(e), -1) for e in content.event_epoch[keep].tolist()]
    relay = _relay_changes(content, node_pos, n_epochs, ev_pos, content.event_node[keep], ev_kind)
    events = {"e": ev_pos, "id": content.event_node[keep].tolist(), "kind": ev_kind,
              "other": content.event_other[keep].tolist()}
    # the counts are the topics' events; the relay changes are counted apart
    epochs["born"], epochs["died"], epochs["merged"] = [0] * n_epochs, [0] * n_epochs, [0] * n_epochs
    epochs["relay"] = [0] * n_epochs
    for p, kind, relay_only in zip(ev_pos, ev_kind, relay.tolist()):
        if p >= 0 and relay_only:
            epochs["relay"][p] += 1
        elif p >= 0 and kind in ("born", "died", "merged_into"):
            epochs["merged" if kind == "merged_into" else kind][p] += 1
    topic_kinds = [k for k, relay_only in zip(ev_kind, relay.tolist()) if not relay_only]

    evolution = _evolution(content, node_pos, events, options) if n_epochs else None
    return {
        "title": _title(content),
        "store": content.uri,
        "unfinished": content.unfinished,
        "options": {"top_words": options.top_words, "max_columns": options.max_columns,
                    "max_bands": options.max_bands},
        "summary": {
            "n_epochs": n_epochs, "n_documents": int(content.n_documents.sum()),
            "n_rejects": int(content.n_rejects.sum()), "n_node_ids": int(np.unique(content.node_id).size),
            "n_node_epochs": int(content.node_id.size), "vocabulary_size": content.vocabulary_size,
            "rejects_by_reason": dict(sorted(content.rejects_by_reason.items(), key=lambda kv: (-kv[1], kv[0]))),
            "config": _flatten(content.config), "versions": dict(content.versions),
            "event_counts": {k: topic_kinds.count(k) for k in EVENT_KINDS},  # "died": not by a merge
            "relay_changes": int(relay.sum()),
        },
        "epochs": epochs, "nodes": nodes, "events": events, "evolution": evolution,
        "static": [_dendrogram(s, content, pos_of_epoch, words) for s in content.static],
    }


def _relay_changes(content: StoreContent, node_pos: np.ndarray, n_epochs: int, ev_pos: list[int], ev_node,
                   ev_kind: list[str]) -> np.ndarray:
    """Which events are relay changes (:func:`~streamtree.relays.relay_changes`), each epoch's
    read against the tree of the epoch before it in the report and the ids with a line of
    their own in the epochs before."""
    out = np.zeros(len(ev_kind), dtype=bool)
    pos = np.asarray(ev_pos, dtype=np.int64)
    node = np.asarray(ev_node, dtype=np.int64)
    kind = np.asarray(ev_kind, dtype=object)
    starts = np.searchsorted(node_pos, np.arange(n_epochs + 1))  # rows are in epoch order
    by_epoch = np.argsort(pos, kind="stable")  # the events of each epoch, found once
    ev_starts = np.searchsorted(pos[by_epoch], np.arange(n_epochs + 1))
    relays = RelayReader()
    for p, (lo, hi) in enumerate(zip(starts[:-1].tolist(), starts[1:].tolist())):
        after = (content.node_id[lo:hi], content.node_parent[lo:hi], content.node_count[lo:hi])
        mine = by_epoch[ev_starts[p]:ev_starts[p + 1]]
        if mine.size:
            out[mine] = relays.read(node[mine], kind[mine], after)
        else:
            relays.passed(after)
    return out


def _relay_rows(content: StoreContent, node_pos: np.ndarray, n_epochs: int) -> dict[int, list[int]]:
    """Per node row below a relay chain in its epoch's tree, the rows of the chain, top first
    (the epoch view draws them as one box)."""
    via = {}
    starts = np.searchsorted(node_pos, np.arange(n_epochs + 1))  # rows are in epoch order
    for lo, hi in zip(starts[:-1].tolist(), starts[1:].tolist()):
        ids = content.node_id[lo:hi]
        chains = relay_chains(ids, content.node_parent[lo:hi], content.node_count[lo:hi])
        row = {nid: lo + k for k, nid in enumerate(ids.tolist())}
        via.update({row[end]: [row[r] for r in chain] for end, chain in chains.items()})
    return via


def _evolution(content: StoreContent, node_pos: np.ndarray, events: dict, options: ReportOptions) -> dict:
    cols = aggregate_columns(node_pos, content.node_id, content.node_parent, content.node_count,
                             content.node_subtree, content.n_documents, options.max_columns)
    peak = peak_shares(cols)
    is_root = cols.parent == -1
    # the root per column: its published id can change from one epoch to the next (a hand-over)
    roots = set(zip(cols.col[is_root].tolist(), cols.id[is_root].tolist()))
    layouts = []
    for t in offered_thresholds(peak, options):
        shown = {nid for nid, s in peak.items() if s >= t} | {nid for _, nid in roots}
        bands = evolution_layout(cols, shown)
        colours = band_colours(cols, bands)
        layouts.append({
            "threshold": t, "n_bands": len(bands), "n_folded": len(peak) - len(bands),
            "bands": [{"id": nid, "colour": colours[nid], **bands[nid]} for nid in sorted(bands)],
            "marks": _event_marks(bands, events, cols.per_column, roots),
        })
    readable = [i for i, lay in enumerate(layouts) if lay["n_bands"] <= options.readable_bands]
    labels = content.label
    col_labels = [labels[int(f)] if cols.per_column == 1 else
                  f"{labels[int(f)]} .. {labels[min(int(f) + cols.per_column, len(labels)) - 1]}"
                  for f in cols.first_epoch]
    return {
        "n_columns": cols.n_columns, "per_column": cols.per_column, "column_labels": col_labels,
        "column_documents": cols.docs.tolist(), "layouts": layouts,
        "default": readable[0] if readable else len(layouts) - 1,
    }


def _event_marks(bands: dict[int, dict], events: dict, per_column: int, roots=frozenset()) -> dict[str, dict]:
    """Where each event of a shown node is drawn: ``x`` (column +- half), ``y`` (band
    middle), the indices in ``events`` of the events drawn there (a list: events of one kind
    at one point, such as the births of a relay chain and of the node it leads to, are one
    mark), and for events with another shown node the point of that node (``x2``, ``y2``)
    for a connecting line. A relay's point is that of the node its chain leads to. A merge
    into the root of its column, ``(column, id)`` in ``roots``, is a :data:`ROOT_MERGE` mark,
    with no line (a merge into a node that was a root in another column only is not: the
    root's id can change between epochs)."""
    end_of = {(b["col"][i], r): nid for nid, b in bands.items() for i, chain in b.get("via", {}).items()
              for r in chain}

    def at(nid: int, col: int, clamp: bool = True):
        b = bands.get(nid)
        if b is None:
            return None
        # the band's column nearest to ``col`` from below (a node is drawn where it was); with
        # ``clamp``, a node first shown after ``col`` is drawn at its first column
        i = int(np.searchsorted(b["col"], col, side="right")) - 1
        if i < 0:
            if not clamp:
                return None
            i = 0
        col = b["col"][i]
        end = end_of.get((col, nid))
        if end is not None:  # a relay there: drawn on the band of the node its chain leads to
            b = bands[end]
            i = b["col"].index(col)
        return col, (b["y0"][i] + b["y1"][i]) / 2

    def end(point, mark_col: int, side: float):
        # the other node's end of a connector: the edge of its band that faces the mark's
        # column (the mark's own edge when both are in one column, so the line stays beside
        # the bands instead of crossing them)
        col, y = point
        return (col + 0.3 if col < mark_col else col - 0.3 if col > mark_col else col + side), y

    marks = {k: {"x": [], "y": [], "i": [], "x2": [], "y2": []} for k in (*EVENT_KINDS, ROOT_MERGE)}
    drawn: dict[tuple, int] = {}  # (kind, x, y, x2, y2) -> position of its mark
    for i, (p, nid, kind, other) in enumerate(zip(events["e"], events["id"], events["kind"], events["other"])):
        if p < 0 or nid not in bands:
            continue
        col = p // per_column
        if kind == "died" or kind == "merged_into":  # drawn at the end of the node's band
            here = at(nid, col - 1 if p % per_column == 0 else col)
            side = 0.3
        else:  # born, split_from, parent_changed: at the start of the node's band in this column
            here = at(nid, col)
            side = -0.3
        if here is None:
            continue
        there = None
        if kind == "split_from" and other in bands:
            # the parent where the child left it: in the previous column when the split opens this
            # column's first epoch and the parent was shown there, else beside the child
            before = at(other, col - 1, clamp=False) if p % per_column == 0 else None
            there = before or at(other, col)
        elif kind == "merged_into" and (col, other) in roots:
            kind = ROOT_MERGE
        elif kind == "merged_into" and other in bands:
            there = at(other, col)
        if there is not None:
            there = end(there, here[0], side)
        point = (here[0] + side, round(here[1], 5), None if there is None else there[0],
                 None if there is None else round(there[1], 5))
        m = marks[kind]
        if (kind, *point) in drawn:
            m["i"][drawn[kind, *point]].append(i)
            continue
        drawn[kind, *point] = len(m["x"])
        for key, value in zip(("x", "y", "x2", "y2"), point):
            m[key].append(value)
        m["i"].append([i])
    return {k: v for k, v in marks.items() if v["x"]}


def _dendrogram(s: StaticContent, content: StoreContent, pos_of_epoch: dict, words: list[str]) -> dict:
    """A stored dendrogram as line segments (SciPy's drawing coordinates) and leaf labels."""
    from scipy.cluster.hierarchy import dendrogram

    n = s.linkage.shape[0] + 1
    leaf_ids = s.leaf_ids if s.leaf_ids is not None else [str(i) for i in range(n)]
    labels = list(leaf_ids)
    if s.over == "nodes":  # name node leaves by their words in that epoch
        rows = np.flatnonzero(content.node_epoch == s.epoch)
        word_of = {str(int(content.node_id[r])): words[r] for r in rows}
        labels = [f"node {i}: {' '.join(word_of.get(str(i), '').split()[:4])}" for i in leaf_ids]
    d = dendrogram(s.linkage, no_plot=True, labels=labels)
    x, y = [], []
    for xs, ys in zip(d["icoord"], d["dcoord"]):
        x += [round(v, 3) for v in xs] + [None]
        y += [float(f"{v:.5g}") for v in ys] + [None]
    return {"epoch": pos_of_epoch[int(s.epoch)], "label": content.label[pos_of_epoch[int(s.epoch)]],
            "method": s.method, "over": s.over, "n_leaves": n, "x": x, "y": y,
            "leaf_labels": list(d["ivl"]), "leaf_x": [5 + 10 * i for i in range(n)]}


def _flatten(config: dict, prefix: str = "") -> list[list[str]]:
    """The stored settings as (dotted key, text) rows; a list of texts one item per line (not
    its Python form, which showed the replay's notes as one bracketed, quoted string)."""
    rows = []
    for k in sorted(config):
        v = config[k]
        if isinstance(v, dict):
            rows += _flatten(v, f"{prefix}{k}.")
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, str) for x in v):
            rows.append([f"{prefix}{k}", "\n".join(map(str, v))])
        else:
            rows.append([f"{prefix}{k}", "" if v is None else str(v)])
    return rows


def _title(content: StoreContent) -> str:
    src = (content.config.get("replay") or {}).get("source")
    name = str(src).replace("\\", "/").rstrip("/").split("/")[-1] if src else content.uri.rstrip("/").split("/")[-1]
    span = f"{content.label[0]} to {content.label[-1]}" if content.label else "no epochs"
    return f"streamtree report: {name}, {span}"
