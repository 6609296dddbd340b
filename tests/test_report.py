"""`streamtree report`: the page's data against the store's numbers (no browser here)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from scipy.cluster.hierarchy import linkage

from connectors.stores import SnapshotStore
from streamtree.events import Events
from streamtree.model import DTSSBP
from streamtree.records import make_rejects
from streamtree.report import ReportOptions, read_store, report_data, write_report
from streamtree.report.data import (_event_marks, aggregate_columns, band_colours, evolution_layout,
                                    offered_thresholds, peak_shares)
from streamtree.synthetic import vmf_tree_corpus

N_EPOCHS = 5


def build_store(path) -> SnapshotStore:
    """A small store of fitted dTSSBP trees: planted vMF tree data whose branches come and
    go, rejects in one epoch, model events (a split and a merge) in one epoch, and a static
    dendrogram over the nodes of two epochs."""
    rng = np.random.default_rng(7)
    data = vmf_tree_corpus(rng, p=120, branching=(3, 2), kappa=60.0, beta=400.0, docs_per_node=12)
    labels = data.labels
    model = DTSSBP(likelihood="vmf", window=1, max_depth=3, kappa0=100.0, n_sweeps=6, random_state=3)
    store = SnapshotStore(str(path))
    words = np.asarray([f"w{i}" for i in range(120)])
    planted = np.unique(labels)
    for t in range(N_EPOCHS):
        # epochs drop different planted leaves, so nodes are born and die
        gone = planted[(planted % N_EPOCHS) == t][-1:]
        keep = ~np.isin(labels, gone) & (rng.random(labels.size) < 0.8)
        model.partial_fit(data.X[keep], epoch=t, label=f"{2000 + t}")
        tree = model.trees_[-1]
        events = None
        if t == 3:
            # model-recorded events (the sampler will write these; here they exercise the marks)
            kids = tree.node_ids[tree.parent == tree.node_ids[0]]
            events = Events(np.array([t, t]), np.array([kids[-1], 999_999]),
                            np.array(["split_from", "merged_into"], dtype=object), np.array([kids[0], kids[0]]))
        rejects = None
        if t == 1:
            rejects = make_rejects(["src"] * 3, [1, 2, 3], ["a", "b", "c"],
                                   ["empty text", "empty text", "unparsable time '17 Brumaire'"])
        store.publish(tree, [f"d{t}-{i}" for i in range(int(keep.sum()))],
                      top_words=tree.top_words(words, 8), label=f"{2000 + t}", rejects=rejects, events=events)
    store.set_config({"replay": {"source": "planted.parquet", "window": 1}, "engine": "local"})
    for t in (1, 3):
        tree = store.read(t).tree
        store.write_static(t, "average", linkage(tree.theta, "average", metric="cosine"),
                           stats={"over": "nodes"}, leaf_ids=tree.node_ids.tolist())
    return store


def hand_store(path, epochs, rejects=None) -> SnapshotStore:
    """A store of hand-made trees, one per entry of ``epochs``: ``(ids, parents, counts)`` or
    ``(ids, parents, counts, moves)``, with ``moves`` the sampler's ``(node, "split_from" |
    "merged_into", other)``; events as the model records them (:func:`epoch_events`: a node that
    merged into another also died). Node ``n``'s word is ``t{n}``; ``rejects`` (reasons) go to
    the first epoch."""
    from streamtree.epoch_tree import EpochTree
    from streamtree.events import epoch_events

    store = SnapshotStore(str(path))
    prev_ids, prev_parents, born_at = np.zeros(0, np.int64), np.zeros(0, np.int64), {}
    for t, spec in enumerate(epochs):
        ids, parents, counts = (np.asarray(x, dtype=np.int64) for x in spec[:3])
        moves = spec[3] if len(spec) > 3 else []
        subtree = counts.copy()
        for k in range(ids.size):  # add each node's documents to its ancestors'
            up = parents[k]
            while up != -1:
                j = int(np.flatnonzero(ids == up)[0])
                subtree[j] += counts[k]
                up = parents[j]
        depth = np.zeros(ids.size, dtype=np.int64)
        for k in range(ids.size):
            up, d = parents[k], 0
            while up != -1:
                d, up = d + 1, parents[int(np.flatnonzero(ids == up)[0])]
            depth[k] = d
        for n in ids.tolist():
            born_at.setdefault(n, t)
        theta = np.eye(max(ids.size, 2))[: ids.size]
        tree = EpochTree(epoch=t, node_ids=ids, parent=parents, depth=depth, mass=np.full(ids.size, 1.0 / (ids.size + 1)),
                         counts=counts, subtree_counts=subtree, window_counts=counts, theta=theta,
                         concentration=np.ones(ids.size), born=np.array([born_at[n] for n in ids.tolist()]),
                         assignments=np.repeat(ids, counts), died=np.setdiff1d(prev_ids, ids), label=f"{2000 + t}")
        events = epoch_events(t, prev_ids, prev_parents, ids, parents, moves)
        rej = None
        if t == 0 and rejects:
            rej = make_rejects(["src"] * len(rejects), list(range(len(rejects))), [f"r{i}" for i in range(len(rejects))],
                               list(rejects))
        store.publish(tree, [f"d{t}-{i}" for i in range(int(counts.sum()))], top_words=[[f"t{n}"] for n in ids],
                      label=f"{2000 + t}", rejects=rej, events=events)
        prev_ids, prev_parents = ids, parents
    return store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("report") / "store")


@pytest.fixture(scope="module")
def data(store):
    # thresholds between the planted nodes' shares, so that some layouts fold nodes
    return report_data(read_store(store), ReportOptions(thresholds=(0.0, 0.02, 0.06, 0.12, 0.3)))


def test_tiny_layout_exact():
    # one epoch, 10 documents: root 0 (2 own), 1 under 0 (4), 3 under 1 (2), 2 under 0 (2)
    cols = aggregate_columns(np.zeros(4, int), [0, 1, 3, 2], [-1, 0, 1, 0], [2, 4, 2, 2], [10, 6, 2, 2], [10], 200)
    bands = evolution_layout(cols, shown={0, 1, 2, 3})
    assert {k: (v["y0"], v["y1"], v["docs"]) for k, v in bands.items()} == {
        0: ([0.0], [0.2], [2]), 1: ([0.2], [0.6], [4]), 3: ([0.6], [0.8], [2]), 2: ([0.8], [1.0], [2])}
    assert peak_shares(cols) == {0: 1.0, 1: 0.6, 2: 0.2, 3: 0.2}
    folded = evolution_layout(cols, shown={0, 1})  # 3 folds into 1, 2 into the root
    assert {k: (v["y0"], v["y1"], v["docs"]) for k, v in folded.items()} == {
        0: ([0.0], [0.4], [4]), 1: ([0.4], [1.0], [6])}


def test_a_relay_is_drawn_with_the_node_its_chain_leads_to():
    """One epoch: 0 -> 1 -> 2 -> {3 (4 documents), 4 (2)} and 0 -> 5 (1). Node 1 holds no
    documents and has one child: a relay, hovered and marked on 2's band. Folding 3 and 4
    into 2 gives 2 documents, so 2 stays no relay; folding 2 into 1 ends the chain."""
    cols = aggregate_columns(np.zeros(6, int), [0, 1, 2, 3, 4, 5], [-1, 0, 1, 2, 2, 0], [0, 0, 0, 4, 2, 1],
                             [7, 6, 6, 4, 2, 1], [7], 200)
    bands = evolution_layout(cols, shown={0, 1, 2, 3, 4, 5})
    assert bands[1]["relay"] == [0] and bands[2]["via"] == {0: [1]}
    assert all("relay" not in bands[n] and "via" not in bands[n] for n in (0, 3, 4, 5))
    folded = evolution_layout(cols, shown={0, 1, 2, 5})  # 3 and 4 fold into 2
    assert folded[1]["relay"] == [0] and folded[2]["docs"] == [6]
    into_1 = evolution_layout(cols, shown={0, 1, 5})  # 2, 3 and 4 fold into 1: no relay left
    assert all("relay" not in b and "via" not in b for b in into_1.values())
    # births of 1 and 2 are one mark, on 2's band; 5's is its own
    events = {"e": [0, 0, 0], "id": [1, 2, 5], "kind": ["born"] * 3, "other": [-1, -1, -1]}
    born = _event_marks(bands, events, per_column=1)["born"]
    assert born["i"] == [[0, 1], [2]]
    assert born["y"][0] == round((bands[2]["y0"][0] + bands[2]["y1"][0]) / 2, 5)


def test_relay_rows_of_the_epoch_view(data):
    """``nodes.via``: per node row below a relay chain, the rows of the chain in its epoch."""
    from types import SimpleNamespace

    from streamtree.report.data import _relay_rows

    # epoch 0: 0 -> 1 -> 2 (relay 1); epoch 1: 0 -> 1 -> 2 -> 3, all empty but 3 (relays 0, 1, 2)
    content = SimpleNamespace(node_id=np.array([0, 1, 2, 0, 1, 2, 3]), node_parent=np.array([-1, 0, 1, -1, 0, 1, 2]),
                              node_count=np.array([2, 0, 3, 0, 0, 0, 5]))
    assert _relay_rows(content, np.array([0, 0, 0, 1, 1, 1, 1]), 2) == {2: [1], 6: [3, 4, 5]}
    assert isinstance(data["nodes"]["via"], dict)  # in the page's data


def test_colours_follow_the_branches_below_a_dominant_node():
    """Root 0 with 1 holding most documents (an internal node) and 9 a few: 1 is trunk (grey),
    and its children 2 and 3 each get a hue of their own (3, a leaf, though it holds most of
    1's documents), their children a lighter tint."""
    from streamtree.report.data import PALETTE, ROOT_COLOUR, _tint

    ids, parents = [0, 1, 2, 3, 4, 9], [-1, 0, 1, 1, 2, 0]
    counts, subtree = [0, 0, 1, 6, 4, 2], [13, 11, 5, 6, 4, 2]  # 3 holds most of 1's, but is a leaf
    cols = aggregate_columns(np.zeros(6, int), ids, parents, counts, subtree, [14], 200)
    colours = band_colours(cols, evolution_layout(cols, shown=set(ids)))
    assert colours[0] == colours[1] == ROOT_COLOUR
    assert len({colours[2], colours[3], colours[9]}) == 3 and ROOT_COLOUR not in (colours[2], colours[3], colours[9])
    assert colours[4] == _tint(colours[2], 0.18) and colours[2].upper() in PALETTE


def test_aggregated_columns_sum_documents_and_take_the_last_parent():
    # 4 epochs into 2 columns; node 5 moves from parent 1 to parent 2 in epoch 1
    pos = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3])
    ids = np.array([0, 1, 2, 5, 0, 1, 2, 5, 0, 1, 0, 1])
    par = np.array([-1, 0, 0, 1, -1, 0, 0, 2, -1, 0, -1, 0])
    cnt = np.array([1, 2, 3, 4, 1, 1, 1, 1, 5, 5, 2, 8])
    cols = aggregate_columns(pos, ids, par, cnt, cnt, [10, 4, 10, 10], max_columns=2)
    assert (cols.n_columns, cols.per_column) == (2, 2)
    assert cols.docs.tolist() == [14, 20]
    got = {(c, i): (p, n) for c, i, p, n in zip(cols.col, cols.id, cols.parent, cols.count)}
    assert got == {(0, 0): (-1, 2), (0, 1): (0, 3), (0, 2): (0, 4), (0, 5): (2, 5), (1, 0): (-1, 7), (1, 1): (0, 13)}


def test_offered_thresholds_respect_max_bands():
    peak = {i: s for i, s in enumerate([1.0, 0.5, 0.3, 0.3, 0.2, 0.05, 0.01])}
    opts = ReportOptions(thresholds=(0.0, 0.1, 0.25, 0.4), max_bands=4)
    assert offered_thresholds(peak, opts) == [0.25, 0.4]
    same = ReportOptions(thresholds=(0.0, 0.005, 0.02, 0.1), max_bands=10)  # 0.005 folds nothing more than 0
    assert offered_thresholds(peak, same) == [0.0, 0.02, 0.1]
    only = offered_thresholds(peak, ReportOptions(thresholds=(0.0,), max_bands=3))
    assert len(only) == 1 and sum(s >= only[0] for s in peak.values()) <= 3


def test_report_numbers_match_the_store(store, data):
    entries = store.epochs()
    assert data["epochs"]["n_nodes"] == [e["n_nodes"] for e in entries]
    assert data["epochs"]["n_documents"] == [e["n_documents"] for e in entries]
    assert data["epochs"]["label"] == [e["label"] for e in entries]
    nodes = store.all_nodes()
    assert data["nodes"]["id"] == nodes.column("id").to_pylist()
    assert data["nodes"]["subtree"] == nodes.column("subtree_count").to_pylist()
    assert data["nodes"]["words"] == [" ".join(w) for w in nodes.column("top_words").to_pylist()]
    s = data["summary"]
    assert s["n_documents"] == sum(e["n_documents"] for e in entries)
    assert s["n_node_ids"] == len(set(nodes.column("id").to_pylist()))
    assert s["n_rejects"] == 3 and s["rejects_by_reason"] == {"empty text": 2, "unparsable time": 1}
    events = store.events().to_pylist()
    merges = {(e["epoch"], e["node_id"]) for e in events if e["event"] == "merged_into"}
    for kind in ("born", "died", "split_from", "merged_into", "parent_changed"):  # a merged node's end: its merge
        assert s["event_counts"][kind] == sum(e["event"] == kind and not (kind == "died" and (e["epoch"], e["node_id"])
                                                                          in merges) for e in events)
    assert s["event_counts"]["split_from"] == 1 and s["event_counts"]["merged_into"] == 1
    assert data["epochs"]["born"] == [sum(e["event"] == "born" and e["epoch"] == x["epoch"] for e in events)
                                      for x in entries]
    assert ["replay.source", "planted.parquet"] in s["config"]


def test_a_list_of_texts_setting_is_its_items_one_per_line():
    from streamtree.report.data import _flatten

    rows = _flatten({"replay": {"notes": ["vocabulary: 500 terms", "time unit: s"], "bounds": [0.001, 1e6],
                                "seed": None}})
    assert rows == [["replay.bounds", "[0.001, 1000000.0]"], ["replay.notes", "vocabulary: 500 terms\ntime unit: s"],
                    ["replay.seed", ""]]


def test_every_layout_tiles_each_column_with_its_documents(store, data):
    ev = data["evolution"]
    entries = store.epochs()
    assert ev["n_columns"] == N_EPOCHS and ev["per_column"] == 1
    assert ev["column_documents"] == [e["n_documents"] for e in entries]
    ids = set(data["nodes"]["id"])
    assert ev["layouts"][0]["threshold"] == 0.0 and ev["layouts"][0]["n_bands"] == len(ids)
    for lay in ev["layouts"]:
        assert lay["n_bands"] == len(lay["bands"]) and lay["n_bands"] + lay["n_folded"] == len(ids)
        per_col = {}
        for b in lay["bands"]:
            for c, y0, y1, docs in zip(b["col"], b["y0"], b["y1"], b["docs"]):
                per_col.setdefault(c, []).append((y0, y1, docs))
        for c, spans in per_col.items():
            spans.sort()
            assert sum(d for _, _, d in spans) == ev["column_documents"][c]  # every document once
            assert spans[0][0] == 0 and abs(spans[-1][1] - 1) < 1e-4
            assert all(abs(a[1] - b[0]) < 1e-4 for a, b in zip(spans, spans[1:]))  # no gap, no overlap
    # threshold 0: each band is exactly its node's own documents in each epoch
    zero = {b["id"]: b for b in ev["layouts"][0]["bands"]}
    for e, nid, count in zip(data["nodes"]["e"], data["nodes"]["id"], data["nodes"]["count"]):
        b = zero[nid]
        assert b["docs"][b["col"].index(e)] == count


def test_layouts_show_exactly_the_nodes_above_the_threshold(store, data):
    nodes = store.all_nodes()
    docs = {e["epoch"]: e["n_documents"] for e in store.epochs()}
    peak = {}
    for nid, par, ep, sub in zip(*(nodes.column(c).to_pylist() for c in ("id", "parent", "epoch", "subtree_count"))):
        peak[nid] = max(peak.get(nid, 0), sub / docs[ep])
    roots = set(np.asarray(nodes.column("id"))[np.asarray(nodes.column("parent")) == -1].tolist())
    layouts = data["evolution"]["layouts"]
    assert len(layouts) >= 3 and layouts[-1]["n_folded"] > 0
    for lay in layouts:
        expected = {n for n, s in peak.items() if s >= lay["threshold"]} | roots
        assert {b["id"] for b in lay["bands"]} == expected


def test_event_marks_and_dendrograms(store, data):
    lay = data["evolution"]["layouts"][0]
    split = lay["marks"]["split_from"]
    assert len(split["x"]) == 1 and split["x2"][0] is not None  # the source is shown: a connecting line
    assert "merged_into" not in lay["marks"]  # node 999999 is in no tree: nothing to draw it on
    born = lay["marks"]["born"]
    assert sum(len(i) for i in born["i"]) == data["summary"]["event_counts"]["born"]  # every birth, once
    assert [d["label"] for d in data["static"]] == ["2001", "2003"]
    for d in data["static"]:
        tree = store.read(int(d["label"]) - 2000).tree
        assert d["n_leaves"] == tree.n_nodes and len(d["leaf_labels"]) == tree.n_nodes
        assert sum(v is None for v in d["x"]) == tree.n_nodes - 1  # one segment group per merge
        assert {re.match(r"node (\d+):", s).group(1) for s in d["leaf_labels"]} == set(map(str, tree.node_ids))


def test_connectors_stay_beside_the_bands():
    """A split or merge whose two nodes are in one column joins them along the mark's own edge;
    across columns it joins the facing edges (before, a split in the first column ran from the
    child's left edge to the parent's right edge, across both bands)."""
    from streamtree.report.data import _event_marks

    bands = {1: {"col": [0, 1], "y0": [0.0, 0.0], "y1": [0.4, 0.4]},
             2: {"col": [0, 1], "y0": [0.5, 0.5], "y1": [1.0, 1.0]},
             3: {"col": [1], "y0": [0.6, 0.6], "y1": [0.8, 0.8]}}
    events = {"e": [0, 1, 1], "id": [2, 3, 2], "kind": ["split_from", "split_from", "merged_into"],
              "other": [1, 1, 1]}
    marks = _event_marks(bands, events, per_column=1)
    split, merged = marks["split_from"], marks["merged_into"]
    assert (split["x"][0], split["x2"][0]) == (-0.3, -0.3)  # epoch 0: child and parent in column 0
    assert (split["x"][1], split["x2"][1]) == (0.7, 0.3)  # epoch 1: the parent's right edge in column 0
    assert (merged["x"][0], merged["x2"][0]) == (0.3, 0.7)  # node 2 ends in column 0, node 1 goes on in 1


def test_long_runs_are_aggregated(store):
    small = report_data(read_store(store), ReportOptions(max_columns=2))
    ev = small["evolution"]
    assert (ev["n_columns"], ev["per_column"]) == (2, 3)
    assert ev["column_documents"] == [sum(small["epochs"]["n_documents"][:3]), sum(small["epochs"]["n_documents"][3:])]
    assert ev["column_labels"] == ["2000 .. 2002", "2003 .. 2004"]
    assert len(small["nodes"]["id"]) == len(report_data(read_store(store))["nodes"]["id"])  # nodes all kept


def test_write_report_is_one_offline_file(store, tmp_path, capsys):
    from streamtree.cli import main

    out = tmp_path / "r.html"
    assert main(["report", store.uri, "-o", str(out), "--top-words", "5"]) == 0
    assert str(out) in capsys.readouterr().out
    page = out.read_text(encoding="utf-8")
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", page)  # nothing loaded from elsewhere
    payload = page.split('<script type="application/json" id="report-data">')[1].split("</script>")[0]
    data = json.loads(payload)
    assert data["options"]["top_words"] == 5
    assert all(len(w.split()) <= 5 for w in data["nodes"]["words"])
    assert write_report(store, out).stat().st_size > 1e6  # plotly.js is inlined
    assert main(["report", str(tmp_path / "missing"), "-o", str(out)]) == 2
    assert "no published epochs" in capsys.readouterr().err


def test_script_json_cannot_close_the_script_element():
    from streamtree.report.html import _script_json

    text = _script_json({"w": "</script><script>alert(1)</script> & <!--"})
    assert "</" not in text and "<!--" not in text
    assert json.loads(text) == {"w": "</script><script>alert(1)</script> & <!--"}


def test_relay_changes_are_counted_apart_and_still_marked(tmp_path):
    """A relay is drawn in the box of the node it leads to: its birth, its merge and a parent
    change that leaves a box below the same box are no topic's event. The counts leave them
    out and count them apart; the page still has every event, so each keeps its mark."""
    # 0 -> {1, 2 -> 3}: 2 a relay; then 2 merges into the root, a relay 5 is born above 1, 4 is born
    store = hand_store(tmp_path / "store", [([0, 1, 2, 3], [-1, 0, 0, 2], [1, 3, 0, 2]),
                                            ([0, 1, 3, 4, 5], [-1, 5, 0, 0, 0], [1, 3, 2, 2, 0],
                                             [(2, "merged_into", 0)])])
    data = report_data(read_store(store))
    s, ev = data["summary"], data["events"]
    assert s["event_counts"] == {"born": 4, "died": 0, "split_from": 0, "merged_into": 0, "parent_changed": 0}
    assert s["relay_changes"] == 5  # 2 born at first (a relay then), 5 born; 2 merged; 1 and 3 re-hung
    assert data["epochs"]["born"] == [3, 1] and data["epochs"]["merged"] == [0, 0]
    assert data["epochs"]["relay"] == [1, 4]
    assert len(ev["kind"]) == 9  # 4 + 1 births, 2's merge, two parent changes: all on the page


def test_a_topic_that_emptied_into_a_relay_ends_as_a_topic_on_the_page(tmp_path):
    """Node 1 holds documents, then none above its only child, then is gone: the page counts
    its end as a death, as show does."""
    store = hand_store(tmp_path / "store", [([0, 1, 2], [-1, 0, 1], [1, 4, 3]), ([0, 1, 2], [-1, 0, 1], [1, 0, 3]),
                                            ([0, 2], [-1, 0], [1, 3])])
    data = report_data(read_store(store))
    assert data["epochs"]["died"] == [0, 0, 1] and data["epochs"]["relay"] == [0, 0, 1]
    assert data["summary"]["event_counts"]["died"] == 1 and data["summary"]["relay_changes"] == 1


def test_a_node_that_merged_ends_as_merged_not_also_died(tmp_path):
    """The store has a 'died' and a 'merged_into' row for a node that merged; the page's events
    keep the merge alone (its marks, its lineage and the counts say it once), another death stays."""
    # 0 -> {1, 2, 3}; then 2 merges into 1 and 3 dies
    store = hand_store(tmp_path / "store", [([0, 1, 2, 3], [-1, 0, 0, 0], [1, 3, 2, 1]),
                                            ([0, 1], [-1, 0], [1, 6], [(2, "merged_into", 1)])])
    stored = [(e["node_id"], e["event"]) for e in store.events(1).to_pylist()]
    assert (2, "died") in stored and (2, "merged_into") in stored  # the data model keeps both
    data = report_data(read_store(store))
    ev = data["events"]
    ends = sorted((n, k, o) for p, n, k, o in zip(ev["e"], ev["id"], ev["kind"], ev["other"]) if p == 1)
    assert ends == [(2, "merged_into", 1), (3, "died", -1)]
    assert data["summary"]["event_counts"]["died"] == 1 and data["summary"]["event_counts"]["merged_into"] == 1
    assert data["epochs"]["died"] == [0, 1] and data["epochs"]["merged"] == [0, 1]
    marks = data["evolution"]["layouts"][0]["marks"]
    died = [ev["id"][i] for group in marks["died"]["i"] for i in group]
    merged = [ev["id"][i] for group in marks["merged_into"]["i"] for i in group]
    assert died == [3] and merged == [2]



def test_a_merge_into_a_former_root_is_not_drawn_as_a_merge_into_the_root(tmp_path):
    """The root's published id changes (0, then 5, 0 staying as its child): in 2002, 2 merges into
    0, the root of 2000 only, which is a merge into a node (a line to 0's band), not into the root;
    in 2003, 1 merges into 5, the root then, which is the root's mark."""
    from streamtree.report.data import ROOT_MERGE

    store = hand_store(tmp_path / "store", [([0, 1, 2, 3], [-1, 0, 0, 0], [1, 3, 2, 1]),
                                            ([0, 1, 2, 5], [5, 5, 5, -1], [3, 3, 2, 1]),
                                            ([0, 1, 5], [5, 5, -1], [5, 3, 1], [(2, "merged_into", 0)]),
                                            ([0, 5], [5, -1], [5, 4], [(1, "merged_into", 5)])])
    data = report_data(read_store(store))
    ev = data["events"]
    for lay in data["evolution"]["layouts"]:
        marks = lay["marks"]
        kinds = {(ev["e"][i], ev["id"][i]): k for k, m in marks.items() for group in m["i"] for i in group}
        assert kinds[2, 2] == "merged_into" and kinds[3, 1] == ROOT_MERGE
        merge = next(i for i, row in enumerate(zip(ev["e"], ev["id"], ev["kind"])) if row == (2, 2, "merged_into"))
        into_node = marks["merged_into"]["i"].index([merge])
        assert marks["merged_into"]["x2"][into_node] is not None  # joined to 0's band


def test_an_empty_node_with_children_is_a_thin_band_not_a_line():
    """Root 0 holds no documents and has children 1 (6) and 2 (4); 2 holds none and has children
    3 (2) and 4 (2); 5 is an empty leaf. The two empty internal nodes get a band of
    ``EMPTY_BAND`` each, the others share the rest by their documents, the column stays tiled; an
    empty leaf holds nothing and stays flat, and a relay is still drawn with its child."""
    from streamtree.report.data import EMPTY_BAND

    ids, parents = [0, 1, 2, 3, 4, 5], [-1, 0, 0, 2, 2, 0]
    cols = aggregate_columns(np.zeros(6, int), ids, parents, [0, 6, 0, 2, 2, 0], [10, 6, 4, 2, 2, 0], [10], 200)
    bands = evolution_layout(cols, shown=set(ids))
    rest = 1 - 2 * EMPTY_BAND
    heights = {n: round(b["y1"][0] - b["y0"][0], 4) for n, b in bands.items()}
    assert heights == {0: EMPTY_BAND, 1: round(0.6 * rest, 4), 2: EMPTY_BAND, 3: round(0.2 * rest, 4),
                       4: round(0.2 * rest, 4), 5: 0.0}
    assert bands[0]["empty"] == {0: 10} and bands[2]["empty"] == {0: 4}  # the documents below each
    assert all("empty" not in bands[n] for n in (1, 3, 4, 5))
    assert [bands[n]["docs"][0] for n in ids] == [0, 6, 0, 2, 2, 0]  # the documents are unchanged
    spans = sorted((b["y0"][0], b["y1"][0]) for b in bands.values())
    assert spans[0][0] == 0 and abs(spans[-1][1] - 1) < 1e-4
    assert all(abs(a[1] - b[0]) < 1e-4 for a, b in zip(spans, spans[1:]))
    # with 3 folded into 2, 2 holds 3's documents: a band of that size
    folded = evolution_layout(cols, shown={0, 1, 2, 4, 5})
    assert folded[2]["docs"] == [2] and "empty" not in folded[2]
    assert folded[0]["empty"] == {0: 10} and round(folded[0]["y1"][0], 4) == EMPTY_BAND
    relay = evolution_layout(aggregate_columns(np.zeros(3, int), [0, 1, 2], [-1, 0, 1], [0, 0, 5], [5, 5, 5], [5], 200),
                             shown={0, 1, 2})
    assert all("empty" not in b for b in relay.values()) and relay[0]["relay"] == [0]


def test_a_merge_into_the_root_is_a_mark_of_its_own_without_a_line():
    """0 -> {1, 2, 3}; then 2 merges into the root and 3 into 1. The merge into 1 is joined to 1's
    band by a line; the merge into the root, whose band tops the column, is a mark of its own
    kind at the end of 2's band, with no line across the bands above it."""
    from streamtree.report.data import ROOT_MERGE

    bands = {0: {"col": [0, 1], "y0": [0.0, 0.0], "y1": [0.01, 0.01]},
             1: {"col": [0, 1], "y0": [0.01, 0.01], "y1": [0.4, 1.0]},
             2: {"col": [0], "y0": [0.4], "y1": [0.8]},
             3: {"col": [0], "y0": [0.8], "y1": [1.0]}}
    events = {"e": [1, 1], "id": [2, 3], "kind": ["merged_into", "merged_into"], "other": [0, 1]}
    marks = _event_marks(bands, events, per_column=1, roots={(0, 0), (1, 0)})
    assert marks["merged_into"]["i"] == [[1]] and marks["merged_into"]["x2"] == [0.7]
    root = marks[ROOT_MERGE]
    assert root["i"] == [[0]] and (root["x"], root["y"]) == ([0.3], [0.6]) and root["x2"] == [None]
    # without roots (as before), it would be a line to the root's band
    assert _event_marks(bands, events, per_column=1)["merged_into"]["x2"] == [0.7, 0.7]


def test_a_column_of_several_epochs_has_one_root_when_the_root_takes_another_id(tmp_path):
    """The root's published id changes only by a hand-over in which the root is the heir: it
    takes a child's id and that child goes on under the root's old id, in the same tree. A column
    of several epochs takes each id's parent from the id's last epoch in the column, so it has one
    root, the root of its last epoch, whose band tops it; a column of the same tree over its
    epochs draws what a column of one of them draws."""
    # 0 -> {1 -> 3, 2}; then the root is published as 1 and its child 1 as 0: 1 -> {0 -> 3, 2}
    after = ([0, 1, 2, 3], [1, -1, 1, 0], [1, 5, 3, 1])
    content = read_store(hand_store(tmp_path / "store", [([0, 1, 2, 3], [-1, 0, 0, 1], [2, 4, 3, 1]),
                                                        after, after, after]))

    def spans(max_columns: int, col: int) -> dict[int, tuple]:
        bands = report_data(content, ReportOptions(max_columns=max_columns))["evolution"]["layouts"][0]["bands"]
        return {b["id"]: (b["y0"][i], b["y1"][i], b["docs"][i]) for b in bands for i, c in enumerate(b["col"])
                if c == col}

    pos = np.repeat(np.arange(4), 4)
    cols = aggregate_columns(pos, content.node_id, content.node_parent, content.node_count, content.node_subtree,
                             content.n_documents, max_columns=2)
    roots = [(c, i) for c, i, p in zip(cols.col.tolist(), cols.id.tolist(), cols.parent.tolist()) if p == -1]
    assert roots == [(0, 1), (1, 1)]  # (column, id)
    # the hand-over's column: the root (1) on top, each id's documents summed over the two epochs
    assert spans(2, 0) == {1: (0.0, 0.45, 9), 0: (0.45, 0.6, 3), 3: (0.6, 0.7, 2), 2: (0.7, 1.0, 6)}
    # two epochs of one tree: the shares of one of them, twice the documents
    one = spans(4, 2)
    assert spans(2, 1) == {nid: (y0, y1, 2 * docs) for nid, (y0, y1, docs) in one.items()}
