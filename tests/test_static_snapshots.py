"""Static snapshots beside each epoch's tree: the pure fit, replay --static, snapshot and show --static."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy.cluster.hierarchy import is_valid_linkage

from connectors.stores.snapshot import SnapshotStore
from streamtree.cli import main
from streamtree.replay import replay
from streamtree.snapshots import METHODS, StaticOptions, document_directions, static_snapshot
from test_replay import config, sou_slice


def two_blobs(n_per: int = 12, d: int = 30, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Unit rows around two orthogonal directions: every method must split them at the root."""
    rng = np.random.default_rng(seed)
    centres = np.zeros((2, d))
    centres[0, :d // 2] = 1.0
    centres[1, d // 2:] = 1.0
    y = np.repeat([0, 1], n_per)
    X = centres[y] + 0.05 * rng.standard_normal((2 * n_per, d))
    return X / np.linalg.norm(X, axis=1, keepdims=True), y


@pytest.mark.parametrize("method", METHODS)
def test_each_method_gives_a_valid_tree_whose_root_separates_the_blobs(method):
    X, y = two_blobs()
    ids = [f"doc{i}" for i in range(X.shape[0])]
    res = static_snapshot(method, X, ids=ids, labels=y, rng=np.random.default_rng(1))
    Z = res.dendrogram.linkage
    assert Z.shape == (X.shape[0] - 1, 4) and is_valid_linkage(Z)
    assert res.leaf_ids == ids and res.rows.tolist() == list(range(X.shape[0]))
    root_children = res.dendrogram.clusters_of()
    n = X.shape[0]
    a, b = (int(c) for c in Z[-1, :2])
    sides = [set(root_children[c - n]) if c >= n else {c} for c in (a, b)]
    assert sorted(sorted(y[list(s)].tolist()) for s in sides) == [[0] * 12, [1] * 12]
    assert res.stats["dtssbp_purity"] == pytest.approx(1.0)
    assert res.stats["over"] == "documents" and not res.stats["sampled"]


def test_sample_cap_is_seeded_and_ids_follow_the_rows():
    X, y = two_blobs(n_per=20)
    ids = np.arange(100, 140)
    a = static_snapshot("bhc", X, ids=ids, max_points=15, rng=np.random.default_rng(5))
    b = static_snapshot("bhc", X, ids=ids, max_points=15, rng=np.random.default_rng(5))
    assert a.dendrogram.n_leaves == 15 and a.stats["sampled"] and a.stats["n_total"] == 40
    assert a.rows.tolist() == b.rows.tolist() and np.array_equal(a.dendrogram.linkage, b.dendrogram.linkage)
    assert a.leaf_ids == (ids[a.rows]).tolist() and len(set(a.rows.tolist())) == 15


def test_over_nodes_uses_theta_rows_and_node_ids():
    theta, _ = two_blobs(n_per=3)
    res = static_snapshot("coalescent", node_theta=theta, ids=[7, 8, 9, 10, 11, 12], rng=np.random.default_rng(0))
    assert res.stats["over"] == "nodes" and sorted(res.leaf_ids) == [7, 8, 9, 10, 11, 12]
    assert is_valid_linkage(res.dendrogram.linkage)


def test_bad_inputs_raise_clear_errors():
    X, _ = two_blobs(n_per=2)
    with pytest.raises(ValueError, match="unknown static method"):
        static_snapshot("ward", X, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="at least 2"):
        static_snapshot("bhc", X[:1], rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="over one of"):
        StaticOptions("bhc", over="words")


def test_documents_are_read_as_directions_whatever_their_length(tmp_path):
    """A multinomial replay fits raw counts; its snapshot over documents reads unit rows, so one
    document 500 times longer than the others does not become the SVD's only component."""
    path = sou_slice(tmp_path / "slice.parquet", n=120, years=(1790, 1800))
    t = pq.read_table(path)
    long_text = " ".join(t.column("text").to_pylist() * 5)
    longer = t.set_column(t.schema.get_field_index("text"), "text",
                          pa.array([long_text] + t.column("text").to_pylist()[1:]))
    pq.write_table(longer, path)
    uri = str(tmp_path / "store")
    replay(config(path, likelihood="multinomial"), uri, static=StaticOptions("bhc", max_points=200))
    store = SnapshotStore(uri)
    snap = store.read_static(0, "bhc-documents")
    assert snap.stats["components"] > 1
    stored = store.read(0)
    X = store.vectorizer().transform(pq.read_table(path).column("text"))  # the epoch's rows, in the stored order
    by_id = {d: i for i, d in enumerate(pq.read_table(path).column("doc_id").to_pylist())}
    X = X[[by_id[d] for d in stored.doc_ids]]
    again = static_snapshot("bhc", document_directions(X), ids=stored.doc_ids.tolist(), labels=stored.tree.assignments,
                            max_points=200, rng=np.random.default_rng([3, 0]))
    assert np.array_equal(again.dendrogram.linkage, snap.linkage)


@pytest.fixture(scope="module")
def static_store(tmp_path_factory):
    path = sou_slice(tmp_path_factory.mktemp("sou") / "slice.parquet", n=150)
    uri = str(tmp_path_factory.mktemp("static") / "store")
    replay(config(path), uri, static=StaticOptions("bhc", max_points=40))
    return path, uri


def test_replay_with_static_bhc_writes_a_readable_parquet_per_epoch(static_store):
    _, uri = static_store
    store = SnapshotStore(uri)
    entries = store.epochs()
    assert len(entries) == 3
    for e in entries:
        assert e["static"] == ["bhc-documents"]
        stored = store.read(e["epoch"])
        snap = store.read_static(e["epoch"], "bhc-documents")
        n_docs = len(stored.doc_ids)
        assert len(snap.leaf_ids) == min(n_docs, 40) == snap.linkage.shape[0] + 1
        assert is_valid_linkage(snap.linkage)
        assert set(snap.leaf_ids) <= set(stored.doc_ids.tolist())
        assert snap.stats["method"] == "bhc" and snap.stats["n_total"] == n_docs
        assert 0.0 < snap.stats["dtssbp_purity"] <= 1.0
        table = pq.read_table(f"{uri}/{e['path']}/static/bhc-documents.parquet")
        assert table.num_rows == snap.linkage.shape[0] and "stat_log_rk" in table.column_names


def test_snapshot_command_over_nodes_and_documents_then_show(static_store, capsys):
    path, uri = static_store
    assert main(["snapshot", uri, "--method", "tmc", "--epoch", "1", "--over", "nodes"]) == 0
    out = capsys.readouterr().out
    store = SnapshotStore(uri)
    tree = store.read(1).tree
    snap = store.read_static(1, "tmc-nodes")
    assert sorted(int(i) for i in snap.leaf_ids) == sorted(tree.node_ids.tolist())
    assert f"{tree.n_nodes} leaves" in out and "heights" in out
    assert main(["snapshot", uri, "--method", "coalescent", "--epoch", "0", "--over", "documents",
                 "--source", str(path), "--max-points", "30"]) == 0
    out = capsys.readouterr().out
    assert "30 leaves (a sample of" in out and "dendrogram purity vs dTSSBP nodes" in out
    assert set(store.read_static(0, "coalescent-documents").leaf_ids) <= set(store.read(0).doc_ids.tolist())
    # over nodes and over documents are two snapshots: neither overwrites the other
    assert main(["snapshot", uri, "--method", "tmc", "--epoch", "1", "--over", "documents"]) == 0
    capsys.readouterr()
    assert store.epochs()[1]["static"] == ["bhc-documents", "tmc-documents", "tmc-nodes"]
    assert main(["show", uri, "--static", "tmc-nodes"]) == 0
    out = capsys.readouterr().out
    assert "static tmc-nodes:" in out and "cluster 1:" in out and "not computed for 2 of 3 epochs: 1790s, 1810s" in out
    assert "newick" not in out  # --all adds it
    # a method names both variants: an epoch without either is listed once, not once per variant
    assert main(["show", uri, "--static", "tmc"]) == 0
    assert "(tmc not computed for 2 of 3 epochs: 1790s, 1810s)" in capsys.readouterr().out
    # an epoch without the method points to the epochs that have it
    assert main(["show", uri, "--static", "tmc", "--epoch", "0"]) == 2
    assert "stored in epoch 1800s" in capsys.readouterr().err
    assert main(["show", uri, "--static", "tmc", "--epoch", "1", "--all"]) == 0
    out = capsys.readouterr().out
    assert "static tmc-documents:" in out and "static tmc-nodes:" in out and "newick: (" in out
    vocab = set(store.vocabulary().tolist())
    cluster_words = [w for line in out.splitlines() if line.strip().startswith("cluster")
                     for w in line.split(": ", 2)[2].split()]
    assert cluster_words and set(cluster_words) <= vocab


def test_snapshot_over_documents_refuses_a_source_changed_since_the_replay(tmp_path, capsys):
    """The documents are read back from the source by id: a source rewritten since the replay
    could hand back other texts under the same ids, so it is refused, naming a changed file;
    a source given with --source is taken as the user's word."""
    import os

    path = sou_slice(tmp_path / "slice.parquet", n=60)
    uri = str(tmp_path / "store")
    replay(config(path), uri)
    argv = ["snapshot", uri, "--method", "tmc", "--epoch", "0", "--over", "documents"]
    assert main(argv) == 0
    capsys.readouterr()
    later = os.stat(path).st_mtime_ns + 10**9
    os.utime(path, ns=(later, later))  # rewritten (the same bytes, as a copy or a re-export would be)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "the source changed since the store was written (1 file added, removed or rewritten, e.g. 'slice.parquet')" \
        in err and "--over nodes" in err
    assert main([*argv, "--source", str(path)]) == 0


@pytest.mark.parametrize("args", [["--static", "foo"], ["--static", "coalescent", "--epoch", "2"]])
def test_show_static_unknown_or_missing_is_an_error(static_store, capsys, args):
    _, uri = static_store
    assert main(["show", uri, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--static" in err


@pytest.mark.parametrize("args, expected", [
    (["--method", "ward", "--epoch", "0"], "unknown method 'ward'"),
    (["--method", "bhc", "--epoch", "1900s"], "no published epoch '1900s'"),
])
def test_snapshot_errors_are_one_line(static_store, capsys, args, expected):
    _, uri = static_store
    assert main(["snapshot", uri, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("streamtree snapshot: error:") and expected in err and "\n" not in err


def test_snapshot_over_documents_of_a_service_store(tmp_path, capsys):
    """A service records its columns and epochs but not its landing folder, and numbers its
    epochs from the first it published: the command read only a replay's settings and matched
    epochs by index, so on a service's store it named stored ids "not in the source" (or "the
    source has no epoch 2"). It now reads the service's settings, needs the landing folder as
    --source, matches epochs by their time span, and reads back every time the service kept (a
    replay's automatic range dropped the service's first epoch, two rows weeks before the rest)."""
    from service_corpus import MODEL, day_rows, write_jsonl

    from streamtree.service import ServeConfig, Service

    land = tmp_path / "land"
    early = [dict(r, time="2026-01-20T10:00:00Z") for r in day_rows(9, 2, 1)]
    write_jsonl(str(land / "early.jsonl"), early)
    for d in (3, 4, 5, 6):
        write_jsonl(str(land / f"day{d}.jsonl"), day_rows(d, 50, 0))
    uri = str(tmp_path / "served")
    config = ServeConfig(landing=str(land), store=uri, text_col="text", time_col="time", epoch="1d",
                         poll_interval=0.05, idle_timeout=1e-3, warmup_docs=20, min_df=1, model=dict(MODEL))
    Service(config).run(once=True, install_signals=False)
    store = SnapshotStore(uri)
    assert [e["label"] for e in store.epochs()][:2] == ["2026-01-20", "2026-03-03"]
    assert main(["snapshot", uri, "--method", "bhc", "--epoch", "2026-03-03", "--over", "documents"]) == 2
    assert "give --source" in capsys.readouterr().err
    index = {e["label"]: e["epoch"] for e in store.epochs()}
    for label, n in (("2026-03-03", 50), ("2026-01-20", 2)):
        assert main(["snapshot", uri, "--method", "bhc", "--epoch", label, "--over", "documents",
                     "--source", str(land)]) == 0
        assert f"{n} leaves" in capsys.readouterr().out
        epoch = index[label]
        assert set(store.read_static(epoch, "bhc-documents").leaf_ids) == set(store.read(epoch).doc_ids.tolist())
