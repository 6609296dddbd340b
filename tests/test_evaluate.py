"""The held-out evaluation protocol: splits, the kappa0/restart selection, repeats, the two scores."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamtree.evaluate import EvaluationConfig, evaluate, format_results, kappa0_matters, load_split_epochs
from streamtree.model import DTSSBP
from streamtree.replay import ReplayConfig
from test_replay import sou_slice


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return sou_slice(tmp_path_factory.mktemp("sou") / "slice.parquet", n=240, years=(1790, 1830))


def cfg(path, **kw):
    base = dict(source=str(path), text_col="text", time_col="year", id_col="doc_id", epoch="10y",
                time_unit="year", max_features=300, min_df=2)
    base.update(kw)
    return ReplayConfig(**base)


def test_split_is_ninety_ten_disjoint_and_subsampled(corpus):
    ev = EvaluationConfig(seed=5)
    data = load_split_epochs(cfg(corpus), ev)
    full = pq.read_table(corpus)
    years = np.asarray(full.column("year"))
    assert [e.label for e in data.epochs] == ["1790s", "1800s", "1810s", "1820s"]
    assert data.middle == 2
    for e, decade in zip(data.epochs, (1790, 1800, 1810, 1820)):
        n = int(((years >= decade) & (years < decade + 10)).sum())
        n_test = int(round(0.1 * n))
        # documents empty after the (training) vocabulary are dropped, and counted
        assert e.X_test.shape[0] <= n_test and e.X_train.shape[0] <= n - n_test
    kept = sum(e.X_train.shape[0] + e.X_test.shape[0] for e in data.epochs)
    assert kept + data.n_dropped_train + data.n_dropped_test == full.num_rows
    small = load_split_epochs(cfg(corpus), EvaluationConfig(seed=5, max_docs_per_epoch=20, max_epochs=3))
    assert len(small.epochs) == 3
    assert all(e.X_train.shape[0] + e.X_test.shape[0] <= 20 for e in small.epochs)
    assert all(e.X_test.shape[0] >= 1 for e in small.epochs)


def test_split_depends_on_the_seed_only(corpus):
    a = load_split_epochs(cfg(corpus), EvaluationConfig(seed=1))
    b = load_split_epochs(cfg(corpus), EvaluationConfig(seed=1))
    c = load_split_epochs(cfg(corpus), EvaluationConfig(seed=2))
    assert all((x.X_test != y.X_test).nnz == 0 for x, y in zip(a.epochs, b.epochs))
    assert any(x.X_test.shape != y.X_test.shape or (x.X_test != y.X_test).nnz for x, y in zip(a.epochs, c.epochs))


def test_kappa0_matters_only_with_depth_rule_links():
    assert kappa0_matters("dtssbp", 3) and kappa0_matters("o-tssbp", 3)
    for v in ("t-tssbp", "ddp", "o-dp", "t-dp"):
        assert not kappa0_matters(v, 3)


def test_protocol_selects_on_first_half_and_scores_second_half(corpus):
    ev = EvaluationConfig(variants=["dtssbp", "ddp"], depths=[2, 3], kappa0_grid=[10.0, 1000.0], restarts=2,
                          repeats=2, seed=11, model=dict(n_sweeps=2))
    data = load_split_epochs(cfg(corpus), ev)
    results = evaluate(data, ev)
    assert [(r.variant, r.depth) for r in results] == [("dtssbp", 2), ("dtssbp", 3), ("ddp", 2), ("ddp", 3)]
    r = results[0]
    assert set(r.selection) == {(10.0, 11), (10.0, 12), (1000.0, 11), (1000.0, 12)}
    assert r.selection[(r.kappa0, r.seed)] == max(r.selection.values())
    # the DP baseline ignores kappa0 and depth: one grid value, and depth 3 reuses depth 2's runs
    assert set(results[2].selection) == {(10.0, 11), (10.0, 12)}
    assert np.array_equal(results[2].normalized, results[3].normalized)

    # recompute the selection score and repeat 1 by hand
    def by_hand(k0, seed, epochs, normalized):
        m = DTSSBP(variant="dtssbp", window=2, max_depth=2, kappa0=k0, n_sweeps=2, random_state=seed)
        per_epoch = []
        for i, e in enumerate(data.epochs[: epochs.stop]):
            m.partial_fit(e.X_train, epoch=e.index)
            if i in epochs:
                per_epoch.append(np.mean(m.score_samples(e.X_test, normalized=normalized)))
        return np.mean(per_epoch)

    assert r.selection[(10.0, 12)] == pytest.approx(by_hand(10.0, 12, range(0, 2), True), rel=1e-12)
    second = range(2, 4)
    assert r.normalized[1] == pytest.approx(by_hand(r.kappa0, r.seed + 1, second, True), rel=1e-12)
    assert r.unnormalized[1] == pytest.approx(by_hand(r.kappa0, r.seed + 1, second, False), rel=1e-12)
    assert r.normalized.shape == (2,) and np.all(np.isfinite(r.normalized))

    text = format_results(results, data, ev)
    assert "Normalised held-out log predictive density" in text and "not a density" in text
    row = next(line for line in text.splitlines() if line.startswith("dtssbp"))
    assert f"{np.mean(r.normalized):.2f} +- {np.std(r.normalized, ddof=1):.2f}" in row


def test_too_few_epochs_is_a_clear_error(tmp_path):
    pq.write_table(pa.table({"text": ["war army navy"] * 20, "year": [1801] * 20}), tmp_path / "one.parquet")
    with pytest.raises(ValueError, match="at least 2 epochs with test documents, found 1"):
        load_split_epochs(cfg(tmp_path / "one.parquet", id_col=None, max_df=1.0, min_df=1), EvaluationConfig())
