"""New documents against the current tree: DTSSBP.predict / transform and `streamtree assign`."""

import numpy as np
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
from scipy.special import gammaln, logsumexp
from sklearn.exceptions import NotFittedError

from connectors.stores.snapshot import THETA_COSINE, THETA_LOG_STEP, CheckpointNotKeptError, SnapshotStore
from streamtree import DTSSBP
from streamtree.replay import load_model
from streamtree.inference.epoch_sampler import predictive_masses
from streamtree.likelihoods.vmf import log_normalizer
from streamtree.synthetic import vmf_tree_corpus


def _vmf_model():
    rng = np.random.default_rng(3)
    X = vmf_tree_corpus(rng, p=40, branching=(2, 2), kappa=40.0, beta=200.0, docs_per_node=15).X
    model = DTSSBP(likelihood="vmf", kappa0=20.0, max_depth=3, n_sweeps=6, random_state=0).fit([X[:60], X[60:]])
    return model, X


def _multinomial_model(document_concentration=None):
    rng = np.random.default_rng(2)
    topics = np.array([[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7], [0.1, 0.7, 0.1, 0.1]])
    X = sp.csr_matrix(np.array([rng.multinomial(8, topics[i % 3]) for i in range(60)], dtype=float))
    model = DTSSBP(likelihood="multinomial", kappa0=20.0, max_depth=2, n_sweeps=6, random_state=0,
                   document_concentration=document_concentration).fit([X])
    return model, X


def _dcm_model():
    return _multinomial_model("auto")


def _brute_force_log_weights(model, X):
    """log pi_k + log f(x | node k), written out per family from the tree's parameters."""
    tree = model.trees_[-1]
    log_pi, _, _ = predictive_masses(tree, model._settings(model.variant_config_))
    Xd = X.toarray()
    if model.likelihood == "vmf":
        kappa = tree.concentration
        loglik = log_normalizer(X.shape[1], kappa)[None, :] + kappa[None, :] * (Xd @ tree.theta.T)
    elif model.document_concentration is None:
        loglik = Xd @ np.log(tree.theta).T
    else:  # bursty documents: DCM(x | s phi) at the chain's sampled s
        s = model.state_.hyper["document_concentration"]
        a = s * tree.theta[None, :, :]
        x = Xd[:, None, :]
        loglik = (gammaln(s) - gammaln(s + Xd.sum(axis=1)))[:, None] + (gammaln(a + x) - gammaln(a)).sum(axis=2)
    return log_pi[None, :] + loglik


@pytest.mark.parametrize("make", [_vmf_model, _multinomial_model, _dcm_model], ids=["vmf", "multinomial", "dcm"])
def test_transform_and_predict_match_brute_force(make):
    model, X = make()
    tree = model.trees_[-1]
    P = model.transform(X)
    assert P.shape == (X.shape[0], tree.n_nodes)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)
    W = _brute_force_log_weights(model, X)
    want = np.exp(W - logsumexp(W, axis=1, keepdims=True))
    np.testing.assert_allclose(P, want, atol=1e-6)
    labels = model.predict(X)
    assert labels.dtype == np.int64
    np.testing.assert_array_equal(labels, tree.node_ids[np.argmax(P, axis=1)])
    np.testing.assert_array_equal(labels, tree.node_ids[np.argmax(W, axis=1)])
    assert len(np.unique(labels)) > 1  # the tiny corpora have more than one topic


def test_live_posterior_is_below_the_full_predictive():
    """transform drops the new-node mass that score_samples includes: the live mixture's log
    density can only be below the full one."""
    model, X = _vmf_model()
    W = _brute_force_log_weights(model, X)
    assert np.all(logsumexp(W, axis=1) <= model.score_samples(X) + 1e-9)


def test_predict_and_transform_check_state_and_input():
    model = DTSSBP()
    X = sp.csr_matrix(np.eye(3))
    with pytest.raises(NotFittedError):
        model.predict(X)
    with pytest.raises(NotFittedError):
        model.transform(X)
    fitted, Xf = _vmf_model()
    with pytest.raises(ValueError, match="features"):
        fitted.predict(sp.csr_matrix(np.ones((2, Xf.shape[1] + 1)) / np.sqrt(Xf.shape[1] + 1)))


def test_predict_after_checkpoint_round_trip():
    model, X = _vmf_model()
    restored = DTSSBP.from_checkpoint(*model.get_checkpoint())
    np.testing.assert_array_equal(restored.predict(X), model.predict(X))
    np.testing.assert_allclose(restored.transform(X), model.transform(X))


# ---------------------------------------------------------------------------------- streamtree assign
FAST = ["--sweeps", "3", "--kappa0", "100", "--max-features", "500", "--seed", "1"]


@pytest.fixture(scope="module")
def sou_store(tmp_path_factory):
    from streamtree.cli import main
    from test_replay import sou_slice

    corpus = sou_slice(tmp_path_factory.mktemp("sou") / "slice.parquet", n=150)
    uri = str(tmp_path_factory.mktemp("assign") / "store")
    assert main(["replay", str(corpus), "--text-col", "text", "--time-col", "year", "--id-col", "doc_id",
                 "--epoch", "10y", "--quiet", "--store", uri, "--keep-checkpoints", "all", *FAST]) == 0
    return uri, corpus


def test_assign_cli_matches_the_model_of_the_epoch(sou_store, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from connectors.stores.snapshot import SnapshotStore
    from streamtree.cli import main

    uri, corpus = sou_store
    rows = pq.read_table(corpus)
    new = pa.table({"doc_id": ["a", "d", "b", "c"],
                    "text": [rows.column("text")[0].as_py(), None, rows.column("text")[5].as_py(),
                             "zzzqx qqqzy"],
                    "year": [1800, 1800, 1800, 1800]})
    source = tmp_path / "new.parquet"
    pq.write_table(new, source)
    store = SnapshotStore(uri)
    first = store.epochs()[0]
    out = tmp_path / "out.parquet"
    assert main(["assign", uri, str(source), "--epoch", str(first["epoch"]), "-o", str(out)]) == 0
    summary = capsys.readouterr().out
    assert "assigned 2 of 4 documents" in summary and "empty after vocabulary filtering: 1" in summary
    got = pq.read_table(out).to_pydict()
    assert got["id"] == ["a", "d", "b", "c"]  # nothing dropped, in the source's order
    by_id = {i: k for k, i in enumerate(got["id"])}
    assert got["node"][by_id["c"]] is None and got["reason"][by_id["c"]] == "empty after vocabulary filtering"
    assert got["node"][by_id["d"]] is None and got["reason"][by_id["d"]]  # unreadable record, with its reason
    model = DTSSBP.from_checkpoint(*store.read_checkpoint(first["epoch"]))
    X = store.vectorizer().transform([new.column("text")[0].as_py(), new.column("text")[2].as_py()])
    want_nodes = model.predict(X)
    want_p = model.transform(X).max(axis=1)
    for k, doc in enumerate(["a", "b"]):
        i = by_id[doc]
        assert got["reason"][i] is None
        assert got["node"][i] == want_nodes[k]
        assert got["probability"][i] == pytest.approx(want_p[k])
        assert got["log_density"][i] == pytest.approx(model.score_samples(X[k])[0])


def test_assign_cli_errors(sou_store, tmp_path, capsys):
    from streamtree.cli import main

    uri, corpus = sou_store
    assert main(["assign", uri, str(corpus), "--epoch", "nope", "-o", str(tmp_path / "o.parquet")]) == 2
    assert "no published epoch 'nope'" in capsys.readouterr().err
    assert main(["assign", uri, str(corpus), "--text-col", "body", "-o", str(tmp_path / "o.parquet")]) == 2
    # times play no part: a source without the replay's time column is assigned all the same,
    # and one given with --time-col must be there
    untimed = tmp_path / "untimed.parquet"
    pq.write_table(pq.read_table(corpus).drop_columns(["year"]).slice(0, 5), untimed)
    capsys.readouterr()
    assert main(["assign", uri, str(untimed), "-o", str(tmp_path / "u.parquet")]) == 0
    assert "assigned 5 of 5 documents" in capsys.readouterr().out
    assert main(["assign", uri, str(untimed), "--time-col", "year", "-o", str(tmp_path / "u.parquet")]) == 2
    assert "time column 'year' not found" in capsys.readouterr().err


def test_outputs_never_go_over_inputs_stores_or_files_streamtree_did_not_write(sou_store, tmp_path, capsys):
    """`assign -o` and `report -o` are checked before any work: not over the input, not inside
    the store, not into a missing folder, and not over a file someone else wrote (--force
    replaces it); a file of their own kind from an earlier run is replaced."""
    import os

    from streamtree.cli import main

    uri, corpus = sou_store
    store_files = {p: os.path.getmtime(os.path.join(uri, p)) for p in ("manifest.json", "vocabulary.parquet")}
    before = corpus.read_bytes()
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    copy = tmp_path / "docs"
    copy.mkdir()
    (copy / "part.parquet").write_bytes(before)
    cases = [
        (["assign", uri, str(corpus), "-o", str(corpus)], "is the input"),
        (["assign", uri, str(copy), "-o", str(copy / "out.parquet")], "inside the input folder"),
        (["assign", uri, str(corpus), "-o", os.path.join(uri, "manifest.json")], "inside the store"),
        (["assign", uri, str(corpus), "-o", str(tmp_path / "missing" / "o.parquet")], "no such folder"),
        (["assign", uri, str(corpus), "-o", str(notes)], "not a file streamtree wrote"),
        (["report", uri, "-o", os.path.join(uri, "manifest.json")], "inside the store"),
        (["report", uri, "-o", str(notes)], "not a file streamtree wrote"),
        (["report", uri, "-o", str(tmp_path)], "is a folder"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert corpus.read_bytes() == before and notes.read_text() == "mine"
    assert sorted(p.name for p in copy.iterdir()) == ["part.parquet"]
    assert {p: os.path.getmtime(os.path.join(uri, p)) for p in store_files} == store_files
    # an earlier run's own output is replaced; someone's file only with --force
    out, page = tmp_path / "o.parquet", tmp_path / "r.html"
    for _ in range(2):
        assert main(["assign", uri, str(corpus), "-o", str(out)]) == 0
        assert main(["report", uri, "-o", str(page)]) == 0
    assert b"streamtree.assign" in pq.read_schema(out).metadata
    assert main(["assign", uri, str(corpus), "-o", str(notes), "--force"]) == 0
    assert pq.read_table(notes).num_rows == pq.read_table(out).num_rows
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("likelihood", ["vmf", "multinomial"])
def test_an_older_epoch_of_a_compact_store_scores_against_its_stored_tree(tmp_path, capsys, likelihood):
    """A store keeps the latest epoch's full model only: an older epoch's comes back from its
    stored tree, scores as the full model did (within the stored form's error: log probabilities coded to a step,
    multinomial; within the truncation for vMF) and refuses to be fitted further."""
    from streamtree.cli import main
    from streamtree.replay import StoredTreeModel
    from test_replay import sou_slice

    corpus = sou_slice(tmp_path / "slice.parquet", n=150)
    args = ["replay", str(corpus), "--text-col", "text", "--time-col", "year", "--id-col", "doc_id", "--epoch", "10y",
            "--quiet", "--likelihood", likelihood, *FAST]
    full, compact = str(tmp_path / "full"), str(tmp_path / "compact")
    assert main([*args, "--store", full, "--keep-checkpoints", "all"]) == 0
    assert main([*args, "--store", compact]) == 0
    store = SnapshotStore(compact)
    first, last = store.epochs()[0], store.epochs()[-1]
    want, got = load_model(full, epoch=first["epoch"]), load_model(compact, epoch=first["epoch"])
    assert type(want) is DTSSBP and isinstance(got, StoredTreeModel)
    assert type(load_model(compact)) is DTSSBP  # the latest epoch's model is kept
    with pytest.raises(CheckpointNotKeptError, match="latest epoch"):
        got.partial_fit(sp.csr_matrix((1, got.n_features_in_)))
    X = store.vectorizer().transform(pq.read_table(corpus).column("text"))
    X = X[~store.vectorizer().empty_rows(X)]
    if likelihood == "multinomial":  # word distributions as log probabilities within THETA_LOG_STEP
        assert 0 < got.theta_error_ <= THETA_LOG_STEP
        assert np.mean(got.predict(X) == want.predict(X)) >= 0.99
        tokens = np.asarray(X.sum(axis=1)).ravel()  # a document's log density moves by at most error per token
        assert np.all(np.abs(got.score_samples(X) - want.score_samples(X)) <= got.theta_error_ * tokens + 1e-9)
    else:
        assert 0 < got.theta_error_ <= np.sqrt(1 - THETA_COSINE ** 2) + 1e-6
        assert np.mean(got.predict(X) == want.predict(X)) >= 0.95
        exact = want.score_samples(X)  # of every epoch's documents, scored on the first epoch's tree
        assert np.median(np.abs(got.score_samples(X) - exact) / np.abs(exact)) < 1e-4
    capsys.readouterr()
    out = tmp_path / "o.parquet"
    assert main(["assign", compact, str(corpus), "--epoch", str(first["epoch"]), "-o", str(out)]) == 0
    assert "kept its tree but not its full model" in capsys.readouterr().err
    assert pq.read_table(out).column("node").to_pylist()[:5] == got.predict(X[:5]).tolist()
    assert last["epoch"] != first["epoch"]


def test_a_stored_tree_model_without_a_store_refuses_fitting_with_the_reason():
    """clone() of a StoredTreeModel (scikit-learn's way to refit) gives one that was not loaded
    from a store: fitting it raises the same CheckpointNotKeptError, not an AttributeError."""
    from sklearn.base import clone

    from streamtree.replay import StoredTreeModel

    X = sp.csr_matrix(np.eye(3))
    for model in (StoredTreeModel(), clone(StoredTreeModel(n_sweeps=2))):
        with pytest.raises(CheckpointNotKeptError, match="keep-checkpoints all"):
            model.partial_fit(X)
        with pytest.raises(CheckpointNotKeptError, match="keep-checkpoints all"):
            model.fit(X)
