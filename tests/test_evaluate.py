"""The held-out evaluation protocols: splits, kappa0 selection, repeats, scores, paired differences, coherence."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp

from streamtree.coherence import topic_npmi
from streamtree.evaluate import (EvaluationConfig, EvaluationRunError, ModelResult, choose_kappa0, describe_split,
                                 evaluate, format_results, kappa0_matters, load_and_evaluate, load_split_epochs,
                                 paired_differences, read_evaluation_epochs, repeated_texts_line, split_epochs)
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


def test_paper_split_is_ninety_ten_disjoint_and_subsampled(corpus):
    ev = EvaluationConfig(seed=5, protocol="paper")
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
    assert data.repeats_left_out  # the default fits each text once: its copies are counted, not split
    assert kept + data.n_dropped_train + data.n_dropped_test + data.n_repeated_texts == full.num_rows
    small = load_split_epochs(cfg(corpus), EvaluationConfig(seed=5, max_docs_per_epoch=20, max_epochs=3,
                                                            protocol="paper"))
    assert len(small.epochs) == 3
    assert all(e.X_train.shape[0] + e.X_test.shape[0] <= 20 for e in small.epochs)
    assert all(e.X_test.shape[0] >= 1 for e in small.epochs)


def test_paper_split_depends_on_the_seed_only(corpus):
    a = load_split_epochs(cfg(corpus), EvaluationConfig(seed=1, protocol="paper"), repeat=0)
    b = load_split_epochs(cfg(corpus), EvaluationConfig(seed=1, protocol="paper"), repeat=3)
    c = load_split_epochs(cfg(corpus), EvaluationConfig(seed=2, protocol="paper"))
    assert all((x.X_test != y.X_test).nnz == 0 for x, y in zip(a.epochs, b.epochs))
    assert any(x.X_test.shape != y.X_test.shape or (x.X_test != y.X_test).nnz for x, y in zip(a.epochs, c.epochs))


def test_kappa0_matters_only_with_depth_rule_links():
    assert kappa0_matters("dtssbp", 3) and kappa0_matters("o-tssbp", 3)
    for v in ("t-tssbp", "ddp", "o-dp", "t-dp"):
        assert not kappa0_matters(v, 3)


def test_paper_protocol_selects_on_first_half_and_scores_second_half(corpus):
    ev = EvaluationConfig(protocol="paper", variants=["dtssbp", "ddp"], depths=[2, 3], kappa0_grid=[10.0, 1000.0],
                          restarts=2, repeats=2, seed=11, model=dict(n_sweeps=2))
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
    assert "protocol: paper" in text and "Held-out log density per test document" in text
    assert "not a density" in text
    assert "multinomial likelihood (bursty documents, document_concentration=auto)" in text  # the document model
    row = next(line for line in text.splitlines() if line.startswith("dtssbp"))
    assert f"{np.mean(r.normalized):.2f} +- {np.std(r.normalized, ddof=1):.2f}" in row
    assert f"{np.mean(r.unnormalized):.2f} +- {np.std(r.unnormalized, ddof=1):.2f}" in row


def test_paper_protocol_needs_test_documents_in_each_half(tmp_path):
    # two full years, then three one-document years: the second half has no test documents, so
    # its figures would be empty (NaN) while the run looked complete
    years = [2000] * 30 + [2001] * 30 + [2002, 2003, 2004]
    texts = ["war army navy peace treaty"] * 60 + ["war army"] * 3
    pq.write_table(pa.table({"text": texts, "year": years}), tmp_path / "skew.parquet")
    with pytest.raises(ValueError, match=r"each half needs an epoch with test documents; found 2 of 2 and 0 of 3"):
        load_split_epochs(cfg(tmp_path / "skew.parquet", id_col=None, max_df=1.0, min_df=1, epoch="year",
                              duplicate_texts="keep"), EvaluationConfig(protocol="paper"))


def test_too_few_epochs_is_a_clear_error(tmp_path):
    pq.write_table(pa.table({"text": ["war army navy"] * 20, "year": [1801] * 20}), tmp_path / "one.parquet")
    with pytest.raises(ValueError, match="at least 2 epochs with documents, found 1"):
        load_split_epochs(cfg(tmp_path / "one.parquet", id_col=None, max_df=1.0, min_df=1),
                          EvaluationConfig(protocol="paper"))
    with pytest.raises(ValueError, match="at least 2 selection and 2 test documents"):
        load_split_epochs(cfg(tmp_path / "one.parquet", id_col=None, max_df=1.0, min_df=1, epoch="year"),
                          EvaluationConfig(max_docs_per_epoch=5))


# ------------------------------------------------------------------------- documents protocol
def skewed_stream(path, seed=0):
    """News-like months: six tiny early months (1-3 articles), then three months of ~150.

    Words come from three fixed word groups (not from the model), so the text has structure.
    """
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    groups = [[g + "".join(rng.choice(letters, 4)) for _ in range(40)] for g in ("war", "farm", "bank")]
    sizes = [2, 1, 3, 2, 1, 3, 150, 160, 140]
    texts, months = [], []
    for m, n in enumerate(sizes):
        for _ in range(n):
            g = groups[rng.integers(3)]
            texts.append(" ".join(rng.choice(g, size=rng.integers(8, 20))))
            months.append(f"2020-{m + 1:02d}-15")
    t = pa.table({"text": texts, "date": pa.array(np.array(months, dtype="datetime64[s]"))})
    pq.write_table(t, path)
    return path, sum(sizes)


def skewed_cfg(path):
    return ReplayConfig(source=str(path), text_col="text", time_col="date", epoch="month", min_df=1, max_df=1.0)


def test_document_split_gives_the_selection_enough_documents_on_a_skewed_stream(tmp_path):
    path, n = skewed_stream(tmp_path / "skew.parquet")
    paper = load_split_epochs(skewed_cfg(path), EvaluationConfig(protocol="paper"))
    assert len(paper.epochs) == 9
    # the paper's first half (4 tiny months) holds a handful of documents: a vacuous selection
    assert paper.n_docs("test", range(0, paper.middle)) <= 4
    for r in range(3):
        data = load_split_epochs(skewed_cfg(path), EvaluationConfig(), repeat=r)
        n_sel, n_test, n_train = data.n_docs("select"), data.n_docs("test"), data.n_docs("train")
        assert n_sel + n_test + n_train + data.n_dropped_train + data.n_dropped_select + data.n_dropped_test == n
        # about 10% each, whatever the months' sizes (random rounding: within a few documents)
        assert abs(n_sel - 0.1 * n) <= 8 and abs(n_test - 0.1 * n) <= 8
        assert all(e.X_train.shape[0] >= 1 for e in data.epochs)  # every month keeps training documents


def test_repeated_texts_are_counted_and_left_out_when_asked(tmp_path):
    path, n = skewed_stream(tmp_path / "skew.parquet")
    t = pq.read_table(path)
    copies = t.slice(t.num_rows - 60, 60)  # 60 rows of the last month, again
    pq.write_table(pa.concat_tables([t, copies]), path)
    ev = EvaluationConfig()
    keep = ReplayConfig(**{**skewed_cfg(path).__dict__, "duplicate_texts": "keep"})
    kept = load_split_epochs(keep, ev)
    assert kept.n_repeated_texts == 60 and not kept.repeats_left_out
    assert sum(kept.n_docs(p) for p in ("train", "select", "test")) == n + 60
    assert "held-out score optimistic" in repeated_texts_line(kept)  # 60 of 522: with the advice
    few = load_split_epochs(keep, EvaluationConfig(max_docs_per_epoch=60))
    assert 0 < few.n_repeated_texts < 60  # those among the rows drawn
    import dataclasses

    n_few = sum(few.n_docs(p) for p in ("train", "select", "test"))
    below = dataclasses.replace(few, n_repeated_texts=int(0.1 * n_few) - 1)
    assert repeated_texts_line(below).endswith("split like any other document.")  # under a tenth: counted only
    assert "optimistic" in repeated_texts_line(dataclasses.replace(few, n_repeated_texts=int(0.1 * n_few) + 1))
    config = ReplayConfig(**{**skewed_cfg(path).__dict__, "duplicate_texts": "reject"})
    left = load_split_epochs(config, ev)
    assert load_split_epochs(skewed_cfg(path), ev).repeats_left_out  # the default, collapse, leaves them out
    assert left.n_repeated_texts == 60 and left.repeats_left_out
    assert sum(left.n_docs(p) for p in ("train", "select", "test")) == n
    assert "left out, each text fitted and scored once" in repeated_texts_line(left)
    collapsed = load_split_epochs(ReplayConfig(**{**config.__dict__, "duplicate_texts": "collapse"}), ev)
    assert collapsed.repeats_left_out  # each text is fitted once: no copy is trained or held out
    assert len(collapsed.epochs) == len(left.epochs) > 1
    assert all(np.array_equal(a.X_train.toarray(), b.X_train.toarray()) for a, b in zip(left.epochs, collapsed.epochs))


def test_source_rejects_are_counted_by_reason_over_the_whole_source(tmp_path):
    rows = [{"text": "war army navy peace", "date": f"2020-{m:02d}-15"} for m in (1, 2, 3) for _ in range(20)]
    rows += [{"text": "war army", "date": f"not-a-date-{i}"} for i in range(3)]  # three values, one reason
    rows += [{"text": "", "date": "2020-03-20"}]  # filed with March
    path = tmp_path / "src.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = ReplayConfig(source=str(path), text_col="text", time_col="date", epoch="month", min_df=1, max_df=1.0,
                          duplicate_texts="keep")
    data = load_split_epochs(config, EvaluationConfig())
    assert data.source_rejects == {"unparsable time": 3, "empty text": 1}
    cut = load_split_epochs(config, EvaluationConfig(max_epochs=2))  # March left out: its rejects still count
    assert len(cut.epochs) == 2 and cut.source_rejects == data.source_rejects


def test_source_rejects_are_reported_not_dropped(tmp_path):
    path, n = skewed_stream(tmp_path / "skew.parquet")
    t = pq.read_table(path)
    bad = pa.table({"text": ["", "   ", "war words"], "date": t.column("date").take([0, 300, 400])})
    pq.write_table(pa.concat_tables([t, bad]), path)
    data = load_split_epochs(skewed_cfg(path), EvaluationConfig())
    assert data.source_rejects == {"empty text": 2}
    assert sum(data.n_docs(p) for p in ("train", "select", "test")) + data.n_dropped_train \
        + data.n_dropped_select + data.n_dropped_test == n + 1
    assert "source rows rejected before the split: 2 (empty text: 2)." in describe_split(data, EvaluationConfig())[0]


def test_document_splits_are_disjoint_and_vary_with_the_repeat(corpus):
    full = pq.read_table(corpus)
    ev = EvaluationConfig(seed=3)
    epochs = read_evaluation_epochs(cfg(corpus), ev)
    a0, a1 = split_epochs(epochs, cfg(corpus), ev, 0), split_epochs(epochs, cfg(corpus), ev, 1)
    again = split_epochs(epochs, cfg(corpus), ev, 0)
    assert all((x.X_test != y.X_test).nnz == 0 and (x.X_select != y.X_select).nnz == 0
               for x, y in zip(a0.epochs, again.epochs))
    assert any(x.X_test.shape != y.X_test.shape or (x.X_test != y.X_test).nnz for x, y in zip(a0.epochs, a1.epochs))
    for data in (a0, a1):
        kept = sum(data.n_docs(p) for p in ("train", "select", "test"))
        left_out = data.n_repeated_texts if data.repeats_left_out else 0  # copies of a text fitted once
        assert kept + data.n_dropped_train + data.n_dropped_select + data.n_dropped_test + left_out == full.num_rows
    # the three parts of an epoch are disjoint: as many distinct rows as rows (texts are distinct paragraphs)
    e = a0.epochs[1]
    rows = sp.vstack([e.X_train, e.X_select, e.X_test]).toarray()
    assert np.unique(rows.round(12), axis=0).shape[0] == rows.shape[0]


def test_choose_kappa0_breaks_ties_toward_the_default():
    rng = np.random.default_rng(0)
    base = [rng.normal(0, 1, 200) for _ in range(3)]
    # 10 is ahead by 0.01 nats per document against per-document noise of sd 1: a tie
    noisy = {1.0: [b + rng.normal(0, 1, 200) for b in base], 10.0: [b + 0.01 + rng.normal(0, 1, 200) for b in base],
             100.0: [b.copy() for b in base]}
    chosen, rows = choose_kappa0(noisy, default=100.0, tie_se=2.0)
    assert chosen == 100.0 and all(r.tied for r in rows if r.kappa0 in (10.0, 100.0))
    best = max(rows, key=lambda r: r.mean)
    assert best.diff == 0.0
    # a clear lead (1 nat per document, paired noise 0.1) wins even far from the default
    clear = {1.0: [b + 1.0 + rng.normal(0, 0.1, 200) for b in base], 100.0: [b.copy() for b in base]}
    chosen, rows = choose_kappa0(clear, default=100.0, tie_se=2.0)
    assert chosen == 1.0
    row = next(r for r in rows if r.kappa0 == 100.0)
    assert not row.tied and row.diff == pytest.approx(-np.mean(np.concatenate(clear[1.0]) - np.concatenate(base)))
    assert row.se == pytest.approx(np.std(np.concatenate(base) - np.concatenate(clear[1.0]), ddof=1) / np.sqrt(600))
    # an estimator whose default kappa0 is a rule rather than a number: no tie-break, the best mean wins
    chosen, _ = choose_kappa0(noisy, default="auto", tie_se=2.0)
    assert chosen == max(noisy, key=lambda k: np.concatenate(noisy[k]).mean()) != 100.0


def test_paired_differences_are_per_repeat_and_per_document():
    def result(variant, depth, docs):
        return ModelResult(variant, depth, 1.0, 0, {}, np.array([d.mean() for d in docs]),
                           np.zeros(len(docs)), 0.0, docs, np.zeros(len(docs)))

    ref = [np.array([1.0, 2.0, 3.0]), np.array([0.0, 0.0])]
    other = [np.array([2.0, 2.0, 5.0]), np.array([-1.0, 0.0])]
    diffs = paired_differences([result("dtssbp", 3, ref), result("ddp", 3, other), result("ddp", 4, other)])
    assert [(p.variant, p.depth) for p in diffs] == [("ddp", 3)]  # no dtssbp at depth 4: nothing to pair with
    p = diffs[0]
    assert p.reference == "dtssbp"
    assert np.allclose(p.per_repeat, [3.0 - 2.0, -0.5 - 0.0])
    assert p.mean == pytest.approx(0.25) and p.sd == pytest.approx(np.std([1.0, -0.5], ddof=1))
    per_doc = np.array([1.0, 0.0, 2.0, -1.0, 0.0])
    assert p.se_documents == pytest.approx(np.std(per_doc, ddof=1) / np.sqrt(5))
    assert p.wins == 1


def test_documents_protocol_pairs_models_varies_split_and_seed_and_reports_coherence(corpus):
    ev = EvaluationConfig(variants=["dtssbp", "t-dp"], depths=[2], kappa0_grid=[10.0, 1000.0], repeats=2, seed=4,
                          model=dict(n_sweeps=2))
    results, splits = load_and_evaluate(cfg(corpus), ev)
    assert [s.repeat for s in splits] == [0, 1]
    dt, tdp = results
    assert {k for k, _ in dt.selection} == {10.0, 1000.0}
    assert {k for k, _ in tdp.selection} == {DTSSBP().get_params()["kappa0"]}  # kappa0 plays no role: the default
    assert dt.kappa0 in (10.0, 1000.0) and len(dt.selection_rows) == 2

    # recompute repeat 1 by hand: its own split and sampler seed 4 + 1, every epoch scored,
    # all test documents pooled (epochs weigh by their size)
    data = splits[1]
    m = DTSSBP(variant="dtssbp", window=2, max_depth=2, kappa0=dt.kappa0, n_sweeps=2, random_state=5)
    test, select, npmi = [], [], []
    reference = sp.vstack([e.X_train for e in data.epochs], format="csr")
    for e in data.epochs:
        m.partial_fit(e.X_train, epoch=e.index)
        test.append(m.score_samples(e.X_test))
        select.append(m.score_samples(e.X_select))
        tree = m.trees_[-1]
        order = np.argsort(-tree.counts, kind="stable")
        order = order[tree.counts[order] > 0][:20]
        top = np.argsort(-tree.theta[order], axis=1, kind="stable")[:, :10]
        npmi.append(topic_npmi(top, reference))
    test = np.concatenate(test)
    assert np.allclose(dt.doc_scores[1], test, rtol=1e-12)
    assert dt.normalized[1] == pytest.approx(test.mean(), rel=1e-12)
    assert dt.selection[(dt.kappa0, 5)] == pytest.approx(np.concatenate(select).mean(), rel=1e-12)
    assert dt.npmi[1] == pytest.approx(np.concatenate(npmi).mean(), rel=1e-12)
    assert np.all((dt.npmi >= -1) & (dt.npmi <= 1))
    # the repeats differ in split: the test sets differ
    assert dt.doc_scores[0].shape != dt.doc_scores[1].shape or not np.allclose(dt.doc_scores[0], dt.doc_scores[1])

    (p,) = paired_differences(results)
    assert np.allclose(p.per_repeat, tdp.normalized - dt.normalized)
    assert all(a.shape == b.shape for a, b in zip(dt.doc_scores, tdp.doc_scores))  # same test documents

    text = format_results(results, splits, ev)
    assert "protocol: documents" in text and "log density per test document" in text
    row = next(line for line in text.splitlines() if line.startswith("dtssbp"))
    assert f"{np.mean(dt.normalized):.2f} +- {np.std(dt.normalized, ddof=1):.2f}" in row
    assert f"{np.mean(dt.npmi):.3f} +- {np.std(dt.npmi, ddof=1):.3f}" in row
    assert f"t-dp      depth 2: {p.mean:+.2f} +- {p.sd:.2f} (SE {p.se_documents:.2f}), ahead in {p.wins}/2" in text
    assert "unnormalised" not in text  # the paper's non-density is printed by the paper protocol only


def test_evaluation_config_rejects_bad_settings():
    with pytest.raises(ValueError, match="unknown protocol 'table1'"):
        EvaluationConfig(protocol="table1")
    with pytest.raises(ValueError, match="leave training documents"):
        EvaluationConfig(test_fraction=0.5, selection_fraction=0.5)
    with pytest.raises(ValueError, match="sets kappa0"):
        EvaluationConfig(model=dict(kappa0=10.0))


# ------------------------------------------------------------------------- runs in worker processes
def tiny(protocol, **kw):
    base = dict(protocol=protocol, variants=["dtssbp", "t-dp"], depths=[2, 3], kappa0_grid=[10.0, 1000.0],
                repeats=2, restarts=2, seed=4, model=dict(n_sweeps=2))
    base.update(kw)
    return EvaluationConfig(**base)


def without_cpu_times(text):
    return re.sub(r"\d+\.\ds CPU", "_s CPU", text)


@pytest.mark.parametrize("protocol", ["documents", "paper"])
def test_worker_processes_give_the_same_results_to_the_bit(corpus, protocol):
    one, splits = load_and_evaluate(cfg(corpus), tiny(protocol))
    lines = []
    two, _ = load_and_evaluate(cfg(corpus), tiny(protocol, workers=2), log=lines.append)
    assert [(r.variant, r.depth) for r in two] == [(r.variant, r.depth) for r in one]
    for a, b in zip(one, two):
        assert (a.kappa0, a.seed) == (b.kappa0, b.seed)
        assert list(a.selection.items()) == list(b.selection.items())  # same values, same order
        assert a.selection_rows == b.selection_rows
        for field in ("normalized", "unnormalized", "npmi"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), field
        assert len(a.doc_scores) == len(b.doc_scores) == 2
        assert all(np.array_equal(x, y) for x, y in zip(a.doc_scores, b.doc_scores))
    # seconds: CPU time of the model's runs, measured in the workers; a DP model's second depth reuses its runs
    assert [r.seconds > 0 for r in two] == [True, True, True, False]
    ev = tiny(protocol)
    assert without_cpu_times(format_results(one, splits, ev)) == without_cpu_times(format_results(two, splits, ev))
    # progress lines arrive in the parent, one per run as it finishes, counted against all runs
    n_runs = 2 * (2 * 2 + 1) if protocol == "documents" else 2 * (2 * 2 + 2) + (2 + 2)
    assert [line.split("]")[0] for line in lines] == [f"[{i}/{n_runs}" for i in range(1, n_runs + 1)]
    assert all(line.endswith("s CPU)") for line in lines)


def test_a_failing_run_is_named_and_the_workers_end(corpus):
    import multiprocessing

    broken = dict(n_sweeps=1, engine_options={"no_such_option": 1})  # valid parameters; the engine rejects them
    ev = tiny("documents", variants=["dtssbp"], depths=[2], kappa0_grid=[10.0], model=broken)
    data = [load_split_epochs(cfg(corpus), ev, repeat=r) for r in range(2)]
    with pytest.raises(EvaluationRunError, match=r"evaluation run dtssbp depth 2, kappa0=10, repeat 0 failed: "
                                                 r"TypeError: .*no_such_option") as caught:
        evaluate(data, ev)
    assert isinstance(caught.value.__cause__, TypeError)
    with pytest.raises(EvaluationRunError, match=r"evaluation run dtssbp depth 2, kappa0=10, repeat [01] failed in "
                                                 r"its worker process: TypeError: .*no_such_option"):
        evaluate(data, tiny("documents", variants=["dtssbp"], depths=[2], kappa0_grid=[10.0], model=broken,
                            workers=2))
    assert multiprocessing.active_children() == []


def test_an_interrupt_ends_the_workers_without_waiting_for_their_runs(corpus):
    import multiprocessing

    ev = tiny("documents", variants=["dtssbp"], depths=[2], workers=2)
    data = [load_split_epochs(cfg(corpus), ev, repeat=r) for r in range(2)]

    def interrupt(line):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        evaluate(data, ev, log=interrupt)  # at the first finished run: one run going, two pending
    assert multiprocessing.active_children() == []


def test_workers_setting_is_checked(corpus, capsys):
    from streamtree.cli import main

    assert EvaluationConfig(workers=3).n_workers() == 3 and EvaluationConfig().workers == 1
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="workers must be a number of processes >= 1, or -1"):
            EvaluationConfig(workers=bad)
    EvaluationConfig(model=dict(engine="ray"))  # one process: the Ray engine spreads each fit itself
    with pytest.raises(ValueError, match="needs the local engine, got engine='ray'"):
        EvaluationConfig(workers=2, model=dict(engine="ray"))
    with pytest.raises(ValueError, match="needs the local engine"):
        EvaluationConfig(workers=-1, model=dict(engine="ray"))
    rc = main(["evaluate", str(corpus), "--text-col", "text", "--time-col", "year", "--workers", "2",
               "--engine", "ray"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "use workers=1 with it (--workers 1)" in err
