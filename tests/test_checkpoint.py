"""A checkpointed and restored model continues exactly as an undisturbed one."""

import json

import numpy as np
import pytest
import scipy.sparse as sp

from streamtree import DTSSBP
from streamtree.synthetic import vmf_tree_corpus

FIELDS = ("node_ids", "parent", "depth", "mass", "counts", "subtree_counts", "window_counts", "theta",
          "concentration", "born", "assignments", "died")


def vmf_epochs(rng):
    return [vmf_tree_corpus(rng, p=200, branching=(2, 2), kappa=40.0, beta=300.0, docs_per_node=15).X
            for _ in range(4)]


def gaussian_epochs(rng):
    centres = rng.normal(0, 5, size=(4, 3))
    return [np.vstack([rng.normal(c + 0.3 * t, 0.5, size=(25, 3)) for c in centres]) for t in range(4)]


def multinomial_epochs(rng):
    V = 120
    topics = rng.dirichlet(np.full(V, 0.1), size=4)
    out = []
    for _ in range(4):
        rows = [rng.multinomial(rng.integers(20, 60), topics[k]) for k in range(4) for _ in range(25)]
        out.append(sp.csr_matrix(np.array(rows, dtype=np.float64)))
    return out


CASES = {
    "vmf": (vmf_epochs, dict(kappa0=100.0)),
    "gaussian": (gaussian_epochs, dict(sigma0=10.0, noise_var=0.25)),
    "multinomial": (multinomial_epochs, dict(kappa0=50.0)),
}


@pytest.mark.usefixtures("threads_always")
@pytest.mark.parametrize("likelihood", sorted(CASES))
def test_restored_model_continues_bit_identically(likelihood):
    make, extra = CASES[likelihood]
    epochs = make(np.random.default_rng(3))
    params = dict(likelihood=likelihood, n_sweeps=6, max_depth=2, n_shards=2, random_state=7, **extra)
    whole = DTSSBP(**params).fit(epochs)

    first = DTSSBP(**params)
    for X in epochs[:2]:
        first.partial_fit(X)
    arrays, meta = first.get_checkpoint()
    assert all(isinstance(a, np.ndarray) and a.dtype.kind in "biuf" for a in arrays.values())
    meta = json.loads(json.dumps(meta))
    restored = DTSSBP.from_checkpoint({k: v.copy() for k, v in arrays.items()}, meta, n_jobs=2)
    assert len(restored.trees_) == 1 and restored.trees_[0].epoch == 1
    assert restored.n_jobs == 2 and restored.get_params()["kappa0"] == whole.get_params()["kappa0"]
    for X in epochs[2:]:
        restored.partial_fit(X)
    assert [t.epoch for t in restored.trees_] == [1, 2, 3]
    assert whole.trees_[-1].n_nodes > 1
    for a, b in zip(whole.trees_[1:], restored.trees_):
        for f in FIELDS:
            x, y = getattr(a, f), getattr(b, f)
            assert x.dtype == y.dtype and np.array_equal(x, y), (likelihood, a.epoch, f)
    test = epochs[-1][:5]
    assert np.array_equal(whole.score_samples(test), restored.score_samples(test))


def test_checkpoint_holds_one_tree_and_the_window_only():
    epochs = vmf_epochs(np.random.default_rng(1))
    model = DTSSBP(likelihood="vmf", n_sweeps=3, max_depth=2, kappa0=100.0, window=1, random_state=0)
    for X in epochs + epochs:
        model.partial_fit(X)
        arrays, meta = model.get_checkpoint()
        last = model.trees_[-1]
        assert np.array_equal(arrays["last_node_ids"], last.node_ids)
        assert arrays["node_ids"].size <= last.n_nodes  # nodes alive after the epoch closed
        assert meta["chain"]["window_epochs"] <= 1 and set(arrays["window_epoch"].tolist()) <= {0}


def test_checkpoint_rejects_foreign_input_and_model_overrides():
    model = DTSSBP(likelihood="vmf", n_sweeps=2, random_state=0).fit([vmf_epochs(np.random.default_rng(0))[0]])
    arrays, meta = model.get_checkpoint()
    with pytest.raises(ValueError, match="only engine, n_jobs, engine_options"):
        DTSSBP.from_checkpoint(arrays, meta, kappa0=5.0)
    with pytest.raises(ValueError, match="checkpoint of format"):
        DTSSBP.from_checkpoint(arrays, dict(meta, format=99))


def test_where_a_checkpoint_ran_is_not_restored_with_it():
    """A checkpoint written on Ray with a cluster address came back on Ray at that address
    when restored without overrides, and restoring it with engine="local" failed with a
    TypeError (the stored address went to the local engine). Where a model runs is not part
    of its chain: the restored model takes the estimator's defaults unless told otherwise,
    and continues the same chain."""
    epochs = vmf_epochs(np.random.default_rng(0))
    model = DTSSBP(likelihood="vmf", n_sweeps=2, random_state=0).fit(epochs[:2])
    arrays, meta = model.get_checkpoint()
    meta = json.loads(json.dumps(meta))
    meta["params"].update(engine="ray", n_jobs=2, engine_options={"address": "ray://elsewhere:10001"})
    defaults = DTSSBP().get_params()
    for overrides in ({}, {"engine": "local"}):
        restored = DTSSBP.from_checkpoint(arrays, meta, **overrides)
        assert (restored.engine, restored.n_jobs, restored.engine_options) == (
            "local", defaults["n_jobs"], defaults["engine_options"])
    two = DTSSBP.from_checkpoint(arrays, meta, n_jobs=2)
    assert (two.engine, two.n_jobs) == ("local", 2)
    restored.partial_fit(epochs[2])
    model.partial_fit(epochs[2])
    np.testing.assert_array_equal(restored.trees_[-1].assignments, model.trees_[-1].assignments)
