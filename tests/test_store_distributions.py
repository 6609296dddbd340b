"""Snapshot store: word distributions (multinomial node parameters) kept as log-coded rows."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from connectors.stores import SnapshotStore, StoreError
from connectors.stores.snapshot import THETA_LOG_STEP, THETA_STORAGE, _theta_table
from streamtree.likelihoods import LIKELIHOODS
from streamtree.model import DTSSBP
from streamtree.replay import theta_storage
from streamtree.synthetic import planted_dirichlet_tree
from test_store import make_tree


def distribution_tree(p=3000, seed=0, epoch=0):
    """A tree whose rows are word distributions as a multinomial fit makes them: a child is its
    parent's distribution reshaped by its own counts, every word kept above a floor."""
    rng = np.random.default_rng(seed)
    t = make_tree(epoch, [0, 1, 2, 3, 4, 5], [-1, 0, 0, 1, 1, 2], [0] * 6, p=p, seed=seed)
    rows = {}
    for i, par in enumerate(t.parent):
        base = np.full(p, 1.0 / p) if par < 0 else rows[int(par)]
        counts = rng.multinomial(400, rng.dirichlet(300 * base + 0.05))
        phi = counts + 50 * base * rng.lognormal(0, 0.5, p) + 0.01
        rows[int(t.node_ids[i])] = phi / phi.sum()
    return dataclasses.replace(t, theta=np.stack([rows[int(n)] for n in t.node_ids]))


def test_word_distributions_round_trip_within_the_log_step(tmp_path):
    t = distribution_tree()
    store = SnapshotStore(str(tmp_path), theta_log_step=0.02)
    store.publish(t, list("abcde"))
    got = store.read(0)
    phi = got.tree.theta
    assert np.all(phi > 0)
    np.testing.assert_allclose(phi.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    err = np.abs(np.log(phi) - np.log(t.theta)).max()
    assert 0 < err <= 0.02 and got.theta_error == pytest.approx(err, rel=1e-9)
    assert got.theta_log_step == 0.02 and not got.theta_exact
    assert store.manifest()["format_version"] == 4
    record = store.epochs()[0]["theta"]
    assert record["log_step"] == 0.02 and record["dtype"] == "int32" and record["error"] == pytest.approx(err)
    path = tmp_path / "epochs" / "000000" / "theta.parquet"
    assert pq.read_table(path).schema.field("values").type == pa.list_(pa.int32())
    # everything but the stored rows is exact
    for name in ("node_ids", "parent", "mass", "counts", "concentration", "assignments"):
        np.testing.assert_array_equal(getattr(got.tree, name), getattr(t, name))
    exact, _, _ = _theta_table(t, None)
    pq.write_table(exact, tmp_path / "exact.parquet", compression="zstd")
    assert path.stat().st_size < (tmp_path / "exact.parquet").stat().st_size / 3


def test_a_finer_step_gives_a_smaller_error(tmp_path):
    t = distribution_tree(p=500, seed=3)
    errors = []
    for step in (0.1, 0.01, 0.001):
        store = SnapshotStore(str(tmp_path / str(step)), theta_log_step=step)
        store.publish(t, list("abcde"))
        errors.append(store.read(0).theta_error)
        assert errors[-1] <= step
    assert errors[0] > errors[1] > errors[2]


def test_rows_that_are_not_distributions_are_refused(tmp_path):
    t = make_tree(0, [0, 1], [-1, 0], [0, 0], p=20)  # unit vectors with zeros and signs
    with pytest.raises(ValueError, match="strictly positive and sum to 1"):
        SnapshotStore(str(tmp_path), theta_log_step=0.02).publish(t, list("abcde"))
    assert SnapshotStore(str(tmp_path)).epochs() == []
    with pytest.raises(ValueError, match="excludes theta_cosine"):
        SnapshotStore(str(tmp_path), theta_log_step=0.02, theta_cosine=0.99)
    with pytest.raises(ValueError, match="theta_log_step must be"):
        SnapshotStore(str(tmp_path), theta_log_step=0)


def test_stores_without_distributions_stay_format_3(tmp_path):
    """vMF and exact stores are written as before, so older readers still read them; a store
    that gains log-coded rows says so in its format version before its first such epoch."""
    store = SnapshotStore(str(tmp_path), theta_cosine=0.999)
    store.publish(make_tree(0, [0, 1], [-1, 0], [0, 0]), list("abcde"))
    assert json.loads((tmp_path / "manifest.json").read_text())["format_version"] == 3
    assert "log_step" not in store.epochs()[0]["theta"] and store.read(0).theta_log_step is None
    later = SnapshotStore(str(tmp_path), theta_log_step=0.02)
    later.publish(distribution_tree(p=6, epoch=1), list("abcde"))
    assert json.loads((tmp_path / "manifest.json").read_text())["format_version"] == 4
    assert later.read(0).theta_log_step is None and later.read(1).theta_log_step == 0.02
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["format_version"] = 5
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match="newer than this reader"):
        SnapshotStore(str(tmp_path)).read(0)


def test_each_likelihood_says_how_its_parameters_are_stored():
    assert theta_storage({"likelihood": "multinomial"}) == {"theta_log_step": THETA_LOG_STEP}
    assert theta_storage({"likelihood": "vmf"}) == THETA_STORAGE["direction"]
    assert theta_storage({"likelihood": "gaussian"}) == {}
    assert {cls.param_storage for cls in LIKELIHOODS.values()} <= set(THETA_STORAGE)


def test_a_planted_multinomial_corpus_assigns_the_same_under_the_stored_rows(tmp_path):
    """Each epoch's own documents, scored by the fitted model and by the same model holding the
    rows read back from the store: the same MAP node, and log densities within the bound
    (``theta_error`` per token)."""
    rng = np.random.default_rng(11)
    corpus = planted_dirichlet_tree(rng, n_features=800, n_documents=240, n_epochs=3, branching=(3, 2))
    model = DTSSBP(likelihood="multinomial", n_sweeps=4, random_state=0)
    store = SnapshotStore(str(tmp_path), theta_log_step=THETA_LOG_STEP)
    changed = n = 0
    for e, X in enumerate(corpus.counts):
        model.partial_fit(X)
        arrays, meta = model.get_checkpoint()
        store.publish(model.trees_[-1], [f"d{i}" for i in range(X.shape[0])], checkpoint=(arrays, meta))
        got = store.read(e)
        assert got.theta_error <= THETA_LOG_STEP
        np.testing.assert_allclose(got.tree.theta.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        exact = DTSSBP.from_checkpoint(arrays, meta)
        approx = DTSSBP.from_checkpoint({**arrays, "last_theta": got.tree.theta}, meta)
        changed += int(np.sum(exact.predict(X) != approx.predict(X)))
        n += X.shape[0]
        tokens = np.asarray(X.sum(axis=1)).ravel()
        diff = np.abs(exact.score_samples(X) - approx.score_samples(X))
        assert np.all(diff <= got.theta_error * tokens + 1e-9)
    assert changed <= 0.01 * n
    # the latest checkpoint stays exact: a resume continues from the full rows
    back, _ = store.read_checkpoint()
    np.testing.assert_array_equal(back["last_theta"], model.trees_[-1].theta)
