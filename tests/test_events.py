"""Events between consecutive trees, and the store's nodes/events tables for other tools."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from connectors.stores import SnapshotStore, StoreError
from connectors.stores.snapshot import EVENT_SCHEMA
from streamtree.events import Events, derive_events, epoch_events
from test_store import make_tree  # tests/ is on sys.path under pytest


def rows(ev: Events):
    return list(zip(ev.epoch.tolist(), ev.node_id.tolist(), ev.event.tolist(), ev.other_id.tolist()))


def test_derive_events_born_died_parent_changed():
    # 0 root; 1, 2 under 0; 3 under 1.  Next: 2 gone, 3 moved under 0, 5 born under 1.
    ev = derive_events(4, [0, 1, 2, 3], [-1, 0, 0, 1], [0, 1, 3, 5], [-1, 0, 0, 1])
    assert rows(ev) == [(4, 5, "born", -1), (4, 2, "died", -1), (4, 3, "parent_changed", 0)]
    assert rows(ev.of("died")) == [(4, 2, "died", -1)]


def test_derive_events_first_epoch_all_born_and_no_change_is_empty():
    ev = derive_events(0, [], [], [7, 3, 9], [-1, 7, 7])
    assert rows(ev) == [(0, 3, "born", -1), (0, 7, "born", -1), (0, 9, "born", -1)]
    assert len(derive_events(1, [7, 3], [-1, 7], [3, 7], [7, -1])) == 0  # order does not matter


def test_derive_events_rejects_bad_input():
    with pytest.raises(ValueError, match="one parent per node"):
        derive_events(1, [0, 1], [-1], [0], [-1])
    with pytest.raises(ValueError, match="repeats a node id"):
        derive_events(1, [0, 0], [-1, 0], [0], [-1])


def three_epochs(tmp_path, events_of_1=None):
    store = SnapshotStore(str(tmp_path / "run"))
    store.publish(make_tree(0, [0, 1, 2], [-1, 0, 0], [0, 0, 0], label="a"), list("abcde"))
    store.publish(make_tree(1, [0, 1, 2, 3], [-1, 0, 1, 0], [0, 0, 0, 1], seed=1, label="b"), list("abcde"),
                  events=events_of_1)
    store.publish(make_tree(2, [0, 2, 3], [-1, 0, 0], [0, 0, 1], seed=2, died=[1], label="c"), list("abcde"))
    return store


def test_store_derives_events_from_the_stored_trees(tmp_path):
    store = three_epochs(tmp_path)
    got = store.events()
    assert got.schema == EVENT_SCHEMA
    assert got.to_pylist() == [
        {"epoch": 0, "node_id": 0, "event": "born", "other_id": None},
        {"epoch": 0, "node_id": 1, "event": "born", "other_id": None},
        {"epoch": 0, "node_id": 2, "event": "born", "other_id": None},
        {"epoch": 1, "node_id": 3, "event": "born", "other_id": None},
        {"epoch": 1, "node_id": 2, "event": "parent_changed", "other_id": 1},
        {"epoch": 2, "node_id": 1, "event": "died", "other_id": None},
        {"epoch": 2, "node_id": 2, "event": "parent_changed", "other_id": 0},
    ]
    assert store.events(2).to_pylist() == got.to_pylist()[5:]
    assert store.events(1).to_pylist() == got.to_pylist()[3:5]
    with pytest.raises(StoreError, match="not published"):
        store.events(7)


def test_store_reads_the_models_events_where_published(tmp_path):
    model_events = Events(np.array([1, 1]), np.array([3, 2]), np.array(["split_from", "merged_into"], dtype=object),
                          np.array([1, 0]))
    store = three_epochs(tmp_path, events_of_1=model_events)
    on_disk = pq.read_table(tmp_path / "run" / "epochs" / "000001" / "events.parquet")
    assert on_disk.schema == EVENT_SCHEMA
    assert store.events(1).to_pylist() == [
        {"epoch": 1, "node_id": 3, "event": "split_from", "other_id": 1},
        {"epoch": 1, "node_id": 2, "event": "merged_into", "other_id": 0}]
    assert [r["event"] for r in store.events().to_pylist()][3:] == ["split_from", "merged_into", "died",
                                                                   "parent_changed"]
    assert not (tmp_path / "run" / "epochs" / "000002" / "events.parquet").exists()


def test_publish_refuses_bad_events(tmp_path):
    store = SnapshotStore(str(tmp_path))
    tree = make_tree(0, [0, 1], [-1, 0], [0, 0])
    bad_kind = pa.table({"epoch": [0], "node_id": [1], "event": ["exploded"], "other_id": [None]})
    with pytest.raises(ValueError, match="unknown event kind"):
        store.publish(tree, list("abcde"), events=bad_kind)
    wrong_epoch = pa.table({"epoch": [3], "node_id": [1], "event": ["born"], "other_id": [None]})
    with pytest.raises(ValueError, match="other epochs"):
        store.publish(tree, list("abcde"), events=wrong_epoch)
    assert store.epochs() == []


def test_all_nodes_is_every_epochs_nodes_in_one_table(tmp_path):
    store = three_epochs(tmp_path)
    table = store.all_nodes()
    assert table.num_rows == 3 + 4 + 3
    assert table.column_names[-1] == "label"
    assert table.column("epoch").to_pylist() == [0] * 3 + [1] * 4 + [2] * 3
    assert table.column("label").to_pylist() == ["a"] * 3 + ["b"] * 4 + ["c"] * 3
    for e in store.epochs():
        part = table.filter(pa.compute.equal(table.column("epoch"), e["epoch"])).drop_columns(["label"])
        assert part.equals(store.nodes(e["epoch"]))
    sub = store.all_nodes(["id", "label", "count"])
    assert sub.column_names == ["id", "label", "count"] and sub.num_rows == 10
    with pytest.raises(ValueError, match="unknown node column"):
        store.all_nodes(["nope"])
    empty = SnapshotStore(str(tmp_path / "empty")).all_nodes()
    assert empty.num_rows == 0 and "label" in empty.column_names


def test_pandas_frames_when_pandas_is_installed(tmp_path):
    pd = pytest.importorskip("pandas", reason="pandas is optional; the Arrow tables are tested above")
    store = three_epochs(tmp_path)
    nodes = store.all_nodes(pandas=True)
    events = store.events(pandas=True)
    assert isinstance(nodes, pd.DataFrame) and len(nodes) == 10
    assert events["event"].tolist().count("born") == 4


def test_show_marks_events(tmp_path, capsys):
    from streamtree.cli import main

    model_events = Events(np.array([1, 1, 1]), np.array([3, 2, 9]),
                          np.array(["split_from", "parent_changed", "merged_into"], dtype=object), np.array([1, 1, 0]))
    store = three_epochs(tmp_path, events_of_1=model_events)
    assert main(["show", store.uri, "--epoch", "b"]) == 0
    out = capsys.readouterr().out
    assert "1 split, 1 merged, 1 changed parent" in out.splitlines()[0]
    assert "    <[3] " in out and "(split from 1)" in out
    assert "    ^[2] " in out
    assert "merged: [9]" in out and "-> [0]" in out
    assert "< born by splitting from another node, ^ parent changed" in out
    assert main(["show", store.uri, "--epoch", "c"]) == 0  # derived events: the parent change of node 2
    out = capsys.readouterr().out
    assert "0 changed parent" not in out and "1 changed parent" in out and "    ^[2] " in out


def test_epoch_events_keep_the_moves_the_trees_show():
    from streamtree.events import epoch_events

    moves = [(7, "split_from", 1), (8, "split_from", 1), (8, "merged_into", 1),  # 8 born and gone
             (2, "merged_into", 1), (3, "merged_into", 0), (3, "merged_into", 1)]
    ev = epoch_events(4, [0, 1, 2, 3], [-1, 0, 0, 0], [0, 1, 7], [-1, 0, 1], moves)
    rows = list(zip(ev.node_id.tolist(), ev.event.tolist(), ev.other_id.tolist()))
    assert rows == [(7, "born", -1), (2, "died", -1), (3, "died", -1), (7, "split_from", 1),
                    (2, "merged_into", 1), (3, "merged_into", 1)]
    assert set(ev.epoch.tolist()) == {4}


def test_model_trees_carry_their_events():
    import scipy.sparse as sp

    from streamtree import DTSSBP
    from streamtree.events import derive_events
    from streamtree.synthetic import vmf_tree_corpus

    rng = np.random.default_rng(3)
    corpus = vmf_tree_corpus(rng, p=200, branching=(3, 2), kappa=20.0, beta=300.0, docs_per_node=40)
    X = sp.csr_matrix(corpus.X)
    labels = np.asarray(corpus.labels)
    later = np.isin(labels, np.unique(labels)[-3:])  # three nodes whose documents come in epoch 1
    m = DTSSBP(likelihood="vmf", n_sweeps=8, max_depth=2, kappa0=100.0, random_state=0)
    t0 = m.partial_fit(X[~later]).trees_[-1]
    t1 = m.partial_fit(X).trees_[-1]
    # the first epoch is where the stream starts: every node is born, and nothing split or merged
    assert set(t0.events.of("born").node_id.tolist()) == set(t0.node_ids.tolist())
    assert len(t0.events) == t0.n_nodes
    # the new documents' nodes split from the ones they were in before their split move
    splits = t1.events.of("split_from")
    assert len(splits) > 0 and set(splits.node_id.tolist()) <= set(t1.events.of("born").node_id.tolist())
    for prev, tree in ((None, t0), (t0, t1)):  # every event names nodes of its two trees
        known = set(tree.node_ids.tolist()) | (set() if prev is None else set(prev.node_ids.tolist()))
        ev = tree.events
        assert set(ev.other_id[ev.other_id >= 0].tolist()) <= known
    base = derive_events(1, t0.node_ids, t0.parent, t1.node_ids, t1.parent)
    for kind in ("born", "died", "parent_changed"):
        assert t1.events.of(kind).node_id.tolist() == base.of(kind).node_id.tolist()


def test_merged_deaths_are_the_died_rows_of_nodes_that_merged():
    """A node that merged is gone from the tree: the table has its 'died' and its 'merged_into'
    rows, and ``merged_deaths`` marks the 'died' one, which the views leave out."""
    from streamtree.events import merged_deaths

    ev = epoch_events(1, [0, 1, 2, 3], [-1, 0, 0, 0], [0, 1], [-1, 0], [(2, "merged_into", 1)])
    rows = list(zip(ev.node_id.tolist(), ev.event.tolist()))
    assert rows == [(2, "died"), (3, "died"), (2, "merged_into")]
    assert merged_deaths(ev.epoch, ev.node_id, ev.event).tolist() == [True, False, False]
    # only the same epoch's merge counts; no rows, no marks
    assert merged_deaths([1, 2], [5, 5], ["merged_into", "died"]).tolist() == [False, False]
    assert merged_deaths([], [], []).tolist() == []


def test_epoch_events_name_only_nodes_of_the_two_trees():
    """A move may name a node that lived only within the epoch; its events are traced to a
    node a reader can look up: a split to where the transient node was split from, a merge to
    where it went, and left out when neither is known."""
    moves = [(35, "split_from", 7), (36, "split_from", 35), (35, "merged_into", 13),  # 35 transient
             (40, "split_from", 39),  # 39 transient, its origin unknown: 40 is only born
             (41, "split_from", 42), (42, "split_from", 41),  # a cycle of transients
             (5, "merged_into", 50), (50, "merged_into", 13),  # 5 merged into a transient 50
             (6, "merged_into", 60)]  # ... into one whose end is unknown
    ev = epoch_events(2, [0, 5, 6, 7, 13], [-1, 0, 0, 0, 0], [0, 7, 13, 36, 40, 41],
                      [-1, 0, 0, 7, 0, 0], moves)
    rows = list(zip(ev.node_id.tolist(), ev.event.tolist(), ev.other_id.tolist()))
    assert (36, "split_from", 7) in rows and (5, "merged_into", 13) in rows
    assert not [r for r in rows if r[0] in (40, 41, 6) and r[1] in ("split_from", "merged_into")]
    known = {0, 5, 6, 7, 13, 36, 40, 41}
    assert {o for _, k, o in rows if k in ("split_from", "merged_into", "parent_changed")} <= known
