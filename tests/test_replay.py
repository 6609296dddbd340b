"""Replay pipeline: every record fitted or rejected, determinism, rejects, refuse/resume/overwrite."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from service_corpus import MODEL, day_rows, store_epochs, write_jsonl, write_partition_copies

from connectors.sources import SourceError
from connectors.stores.snapshot import SnapshotStore, StoreAccessError, StoreError
from streamtree.records import DUPLICATE_TEXT, EMPTY_AFTER_VOCABULARY, EMPTY_TEXT, MISSING_TIME
from streamtree.replay import ReplayConfig, replay

SOU = Path(__file__).resolve().parent.parent / "examples" / "data" / "sotu_paragraphs.parquet"


def sou_slice(path: Path, n: int = 240, years=(1790, 1820), seed: int = 0) -> Path:
    """``n`` random paragraphs of the bundled corpus from ``years`` (three decades by default)."""
    t = pq.read_table(SOU, columns=["fileid", "paragraph", "year", "text"])
    t = t.filter(pc.and_(pc.greater_equal(t["year"], years[0]), pc.less(t["year"], years[1])))
    idx = np.sort(np.random.default_rng(seed).choice(t.num_rows, n, replace=False))
    t = t.take(pa.array(idx))
    ids = pc.binary_join_element_wise(pc.cast(t["fileid"], pa.string()), pc.cast(t["paragraph"], pa.string()), "#")
    t = t.append_column("doc_id", ids)
    pq.write_table(t, path)
    return path


MODEL_KEYS = {"n_sweeps", "kappa0", "random_state", "window", "engine", "n_shards", "likelihood", "document_concentration",
              "document_weights", "split_node"}


def config(path, **kw) -> ReplayConfig:
    base = dict(source=str(path), text_col="text", time_col="year", id_col="doc_id", epoch="10y",
                time_unit="year", max_features=500, min_df=2)
    model = dict(n_sweeps=3, kappa0=100.0, random_state=3)
    if "seed" in kw:
        kw["random_state"] = kw.pop("seed")
    model.update({k: kw.pop(k) for k in list(kw) if k in MODEL_KEYS})
    base.update(kw)
    return ReplayConfig(**base, model=model)


def store_tables(uri) -> dict[str, pa.Table]:
    out = {}
    for f in sorted(Path(uri).rglob("*.parquet")):
        out[str(f.relative_to(uri))] = pq.read_table(f)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return sou_slice(tmp_path_factory.mktemp("sou") / "slice.parquet")


@pytest.fixture(scope="module")
def replayed(corpus, tmp_path_factory):
    uri = str(tmp_path_factory.mktemp("store") / "run")
    return uri, replay(config(corpus), uri)


def test_every_record_is_fitted_or_rejected(corpus, replayed):
    uri, summary = replayed
    store = SnapshotStore(uri)
    entries = store.epochs()
    assert [e["label"] for e in entries] == ["1790s", "1800s", "1810s"]
    ids = []
    for e in entries:
        st = store.read(e["epoch"])
        ids += list(st.doc_ids)
        assert st.tree.assignments.shape[0] == e["n_documents"]
        assert set(st.tree.assignments.tolist()) <= set(st.tree.node_ids.tolist())
        if st.rejects is not None:
            ids += st.rejects.column("id").to_pylist()
    source_ids = pq.read_table(corpus, columns=["doc_id"]).column("doc_id").to_pylist()
    assert sorted(ids) == sorted(source_ids)  # each exactly once
    assert summary.n_documents + summary.n_rejects == summary.n_records == len(source_ids)
    assert summary.n_epochs == 3 and summary.n_published == 3
    assert summary.vocabulary_size == 500 and len(store.vocabulary()) == 500
    assert store.config()["replay"]["model"]["kappa0"] == 100.0
    assert store.last_commit()["state"]["documents"] == summary.n_documents


def test_same_seed_same_store_and_other_seed_differs(corpus, replayed, tmp_path):
    uri, _ = replayed
    replay(config(corpus), str(tmp_path / "again"))
    a, b = store_tables(uri), store_tables(tmp_path / "again")
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].equals(b[name]), name
    replay(config(corpus, seed=4), str(tmp_path / "other"))
    c = store_tables(tmp_path / "other")
    assert any(not a[n].equals(c[n]) for n in a if n.endswith("assignments.parquet"))


def test_rejects_are_counted_and_stored(tmp_path):
    texts = ["war army navy peace treaty"] * 6 + ["taxes revenue debt treasury money"] * 6
    years = [1791] * 6 + [1801] * 6
    rows = {
        "doc_id": [f"d{i}" for i in range(len(texts))] + ["empty", "notime", "stop", "rare"],
        "text": texts + ["   ", "war army", "the and of which", "zebra quokka"],
        "year": years + [1795, None, 1805, 1805],
    }
    pq.write_table(pa.table(rows), tmp_path / "c.parquet")
    uri = str(tmp_path / "s")
    # the repeated texts are fitted as documents of their own: the vocabulary's min_df=2 counts them
    summary = replay(config(tmp_path / "c.parquet", max_features=None, min_df=2, max_df=1.0, duplicate_texts="keep"),
                     uri)
    assert summary.rejects == {EMPTY_TEXT: 1, MISSING_TIME: 1, EMPTY_AFTER_VOCABULARY: 2}
    assert summary.n_empty_after_filter == 2
    assert summary.n_documents == 12
    assert "empty after vocabulary filtering: 2" in summary.format()
    store = SnapshotStore(uri)
    got = {}
    for e in store.epochs():
        rj = store.read(e["epoch"]).rejects
        if rj is not None:
            for i, r in zip(rj.column("id").to_pylist(), rj.column("reason").to_pylist()):
                got[i] = (e["label"], r)
    # key-less rejects go with the first epoch, the others with their own
    assert got == {"empty": ("1790s", EMPTY_TEXT), "notime": ("1790s", MISSING_TIME),
                   "stop": ("1800s", EMPTY_AFTER_VOCABULARY), "rare": ("1800s", EMPTY_AFTER_VOCABULARY)}


def _repeated_texts_source(tmp_path) -> dict:
    """Ten rows over two decades, written to ``c.parquet``; returns the vocabulary settings.
    "quokka" is in one distinct text only, repeated three times in its decade (d0-d2); the other
    texts repeat across decades, which is not a repeat within an epoch, apart from d7, a copy of
    d6; "the and of" is left empty by the vocabulary: its copy is no document."""
    texts = (["war army navy quokka"] * 3 + ["war army peace treaty", "taxes revenue debt"]
             + ["war army peace treaty", "taxes revenue debt treasury", "taxes revenue debt treasury"]
             + ["the and of"] * 2)
    rows = {"doc_id": [f"d{i}" for i in range(len(texts))], "text": texts,
            "year": [1791] * 5 + [1801] * 3 + [1801] * 2}
    pq.write_table(pa.table(rows), tmp_path / "c.parquet")
    return dict(max_features=None, min_df=2, max_df=1.0)


def test_repeated_texts_are_counted_and_fitted_or_rejected(tmp_path):
    kw = _repeated_texts_source(tmp_path)
    kept = replay(config(tmp_path / "c.parquet", duplicate_texts="keep", **kw), str(tmp_path / "keep"))
    assert kept.n_repeated_texts == 3 and kept.n_documents == 8 and kept.rejects == {EMPTY_AFTER_VOCABULARY: 2}
    assert "repeated texts: 3 of the 8 documents repeat" in kept.format()
    assert "--duplicate-texts collapse fits each text once" in kept.format()  # 3 of 8: with the advice
    from streamtree.replay import repeated_texts_note

    assert repeated_texts_note(3, 100, "keep").endswith("fitted as documents of their own")  # 3%: counted only
    assert repeated_texts_note(0, 100, "keep") is None
    # a store resumed from one written before the count: no count rather than a partial one
    from streamtree.replay import ReplaySummary

    assert "repeated texts" not in ReplaySummary(1, 1, 8, 8, n_repeated_texts=None).format()
    assert "quokka" in SnapshotStore(str(tmp_path / "keep")).vocabulary()
    uri = str(tmp_path / "reject")
    cfg = config(tmp_path / "c.parquet", duplicate_texts="reject", **kw)
    rejected = replay(cfg, uri)
    assert rejected.n_repeated_texts == 4 and rejected.n_documents == 5
    assert rejected.rejects == {DUPLICATE_TEXT: 4, EMPTY_AFTER_VOCABULARY: 1}
    assert "were filed as rejects" in rejected.format()
    store = SnapshotStore(uri)
    assert "quokka" not in store.vocabulary()  # the vocabulary counts each text once, as the fit does
    fitted, filed = [], {}
    for e in store.epochs():
        st = store.read(e["epoch"])
        fitted += list(st.doc_ids)
        if st.rejects is not None:
            filed.update(zip(st.rejects.column("id").to_pylist(), st.rejects.column("reason").to_pylist()))
    assert sorted(fitted) == ["d0", "d3", "d4", "d5", "d6"]  # the first of each text in each epoch
    assert filed == {"d1": DUPLICATE_TEXT, "d2": DUPLICATE_TEXT, "d7": DUPLICATE_TEXT, "d8": EMPTY_AFTER_VOCABULARY,
                     "d9": DUPLICATE_TEXT}
    # the setting is part of what a resume must match; "keep", what stores fitted before the setting
    # was recorded, is not recorded (older stores match it), the default "collapse" is
    assert "duplicate_texts" not in config(tmp_path / "c.parquet", duplicate_texts="keep").identity()
    assert config(tmp_path / "c.parquet").identity()["duplicate_texts"] == "collapse"
    assert cfg.identity()["duplicate_texts"] == "reject"
    # the store's setting and the default, both named
    with pytest.raises(StoreError, match="duplicate_texts: 'reject' in the store, 'collapse' now"):
        replay(config(tmp_path / "c.parquet", **kw), uri, mode="resume")
    # a store that records no setting was fitted keeping its copies: resumed at the default, both named
    with pytest.raises(StoreError, match="duplicate_texts: 'keep' in the store, 'collapse' now"):
        replay(config(tmp_path / "c.parquet", **kw), str(tmp_path / "keep"), mode="resume")
    with pytest.raises(ValueError, match="duplicate_texts must be one of"):
        config(tmp_path / "c.parquet", duplicate_texts="drop")


def test_collapsed_repeats_are_fitted_once_and_published_at_their_texts_node(tmp_path):
    """Under --duplicate-texts collapse the model fits what reject fits (the same trees), and
    every copy is published as a document at its text's node: nothing is filed as a reject, and
    the published counts hold the copies."""
    kw = _repeated_texts_source(tmp_path)
    rejected = replay(config(tmp_path / "c.parquet", duplicate_texts="reject", **kw), str(tmp_path / "reject"))
    cfg = config(tmp_path / "c.parquet", duplicate_texts="collapse", **kw)
    collapsed = replay(cfg, str(tmp_path / "collapse"))
    assert collapsed.n_documents == 8 and collapsed.rejects == {EMPTY_AFTER_VOCABULARY: 2}
    assert collapsed.n_repeated_texts == 3 and "fitted once and its copies published" in collapsed.format()
    assert "documents: 8 published (5 distinct texts fitted) of 10 records read" in collapsed.format()
    assert rejected.n_documents == 5
    a, b = SnapshotStore(str(tmp_path / "reject")), SnapshotStore(str(tmp_path / "collapse"))
    assert a.vocabulary().tolist() == b.vocabulary().tolist()  # each text counted once, as fitted
    node_of = {}
    for ea, eb in zip(a.epochs(), b.epochs(), strict=True):
        ta, tb = a.read(ea["epoch"]), b.read(eb["epoch"])
        for name in ("node_ids", "parent", "theta", "mass", "window_counts"):
            assert np.array_equal(getattr(ta.tree, name), getattr(tb.tree, name)), name
        assert ta.top_words == tb.top_words  # labels read each text once: copies do not outweigh others
        node_of.update(zip(tb.doc_ids.tolist(), tb.tree.assignments.tolist()))
        fitted = dict(zip(ta.doc_ids.tolist(), ta.tree.assignments.tolist()))
        assert all(node_of[d] == n for d, n in fitted.items())  # the fitted rows where reject has them
        assert tb.tree.counts.sum() == tb.doc_ids.size
        at = {int(n): i for i, n in enumerate(tb.tree.node_ids)}
        assert tb.tree.subtree_counts[0] == tb.doc_ids.size  # the root's subtree holds every document
        for n, c in zip(tb.tree.node_ids, tb.tree.counts):
            assert c == sum(1 for x in tb.tree.assignments if x == n)
            kids = tb.tree.children(int(n))
            assert tb.tree.subtree_counts[at[int(n)]] == c + sum(tb.tree.subtree_counts[at[int(k)]] for k in kids)
        assert tb.rejects is None or DUPLICATE_TEXT not in tb.rejects.column("reason").to_pylist()
    assert sorted(node_of) == ["d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7"]
    assert node_of["d1"] == node_of["d2"] == node_of["d0"] and node_of["d7"] == node_of["d6"]
    assert cfg.identity()["duplicate_texts"] == "collapse"


def _days_with_copies(root: Path) -> tuple[Path, Path]:
    """``root/one``: three daily files; ``root/two``: the same with two re-deliveries, a copy of
    day 2 under a name after it and a gzip-compressed copy of day 1."""
    one, two = root / "one", root / "two"
    for d in (1, 2, 3):
        write_jsonl(str(one / f"day{d}.jsonl"), day_rows(d, 20, 0))
    shutil.copytree(one, two)
    shutil.copy(two / "day2.jsonl", two / "resent-day2.jsonl")
    with gzip.open(two / "day1.jsonl.gz", "wb") as f:
        f.write((two / "day1.jsonl").read_bytes())
    return one, two


def _days_config(src: Path) -> ReplayConfig:
    return ReplayConfig(source=str(src), text_col="text", time_col="time", epoch="1d", model=dict(MODEL), min_df=1)


def test_a_file_holding_an_earlier_files_content_is_skipped_as_a_service_skips_it(tmp_path, caplog):
    """A re-delivered file (a copy under another name, compressed or not) is not read twice: the
    replay gives the trees of the folder without it, as a service taking the folder does, warns
    naming both files, and says so in its summary and the store."""
    one, two = _days_with_copies(tmp_path)
    replay(_days_config(one), str(tmp_path / "store-one"))
    with caplog.at_level("WARNING", logger="connectors.sources.files"):
        summary = replay(_days_config(two), str(tmp_path / "store-two"))
    assert store_epochs(tmp_path / "store-two") == store_epochs(tmp_path / "store-one")
    skipped = {"day1.jsonl.gz": "day1.jsonl", "resent-day2.jsonl": "day2.jsonl"}
    assert summary.duplicate_files == skipped
    assert summary.n_records == summary.n_documents == 60  # the records of the files read
    warned = sorted(r.getMessage() for r in caplog.records if "same content" in r.getMessage())
    assert len(warned) == 2
    assert warned[0].startswith("day1.jsonl.gz has the same content as day1.jsonl, ")
    assert warned[1].startswith("resent-day2.jsonl has the same content as day2.jsonl, ")
    assert ("duplicate files skipped: 2 (same content as an earlier file: day1.jsonl.gz = day1.jsonl, "
            "resent-day2.jsonl = day2.jsonl)") in summary.format()
    store = SnapshotStore(str(tmp_path / "store-two"))
    assert store.config()["duplicate_files"] == skipped
    assert store.manifest()["complete"]["summary"]["duplicate_files"] == skipped
    again = replay(_days_config(two), str(tmp_path / "store-two"), mode="resume")  # complete: its summary
    assert again.complete_before and again.duplicate_files == skipped


def test_a_resume_reads_the_files_its_store_was_begun_with(tmp_path):
    """Resuming a store whose replay skipped files for their content skips them again, and gives
    the store of an uninterrupted run; a store written before such files were skipped fitted them,
    so resuming it without them is refused, saying what to do."""
    _, two = _days_with_copies(tmp_path)
    uri = str(tmp_path / "part")

    def interrupt(p):
        if p.index == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replay(_days_config(two), uri, progress=interrupt)
    assert replay(_days_config(two), uri, mode="resume").n_published == 1
    replay(_days_config(two), str(tmp_path / "whole"))
    assert store_epochs(uri) == store_epochs(tmp_path / "whole")

    with pytest.raises(KeyboardInterrupt):
        replay(_days_config(two), uri, mode="overwrite", progress=interrupt)
    store = SnapshotStore(uri)
    with store.writer("older streamtree"):  # what a store begun before files were skipped records
        store.set_config({k: v for k, v in store.config().items() if k != "duplicate_files"})
    with pytest.raises(StoreError, match=r"written fitting every file of the source, and 2 files of them hold the "
                                         r"content of an earlier one \(day1.jsonl.gz = day1.jsonl, resent-day2.jsonl "
                                         r"= day2.jsonl\).*replay it again with --overwrite"):
        replay(_days_config(two), uri, mode="resume")
    assert [e["label"] for e in SnapshotStore(uri).epochs()] == ["2026-03-01", "2026-03-02"]


def test_byte_identical_files_in_two_partitions_are_two_files_a_copy_within_one_is_not(tmp_path, caplog):
    """``year=2020/part-0.parquet`` and ``year=2021/part-0.parquet`` hold the same bytes but not the
    same rows: the folder gives each its year. Both are fitted, each in its year, with no warning.
    Before, the second was skipped as a re-delivery of the first, and 2021 lost its rows. A copy
    within one partition still holds that partition's rows again, and is skipped."""
    root = tmp_path / "parts"
    write_partition_copies(str(root))
    cfg = ReplayConfig(source=str(root), text_col="text", time_col="year", epoch="1y", model=dict(MODEL), min_df=1)
    with caplog.at_level("WARNING", logger="connectors.sources.files"):
        summary = replay(cfg, str(tmp_path / "both"))
    assert not [r.getMessage() for r in caplog.records]
    assert summary.duplicate_files == {} and summary.n_records == summary.n_documents == 40
    epochs = store_epochs(tmp_path / "both")
    assert [(label, sorted({d.split(":")[0] for d in ids})) for _, label, *_, ids in epochs] == [
        ("2020", ["year=2020/part-0.parquet"]), ("2021", ["year=2021/part-0.parquet"])]

    shutil.copy(root / "year=2021" / "part-0.parquet", root / "year=2021" / "part-1.parquet")
    summary = replay(cfg, str(tmp_path / "copied"))
    assert summary.duplicate_files == {"year=2021/part-1.parquet": "year=2021/part-0.parquet"}
    assert store_epochs(tmp_path / "copied") == epochs


def interrupted_replay(corpus, uri: str) -> None:
    """A replay of ``corpus`` into ``uri`` interrupted after its second epoch."""

    def interrupt(p):
        if p.index == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replay(config(corpus), uri, progress=interrupt)


def test_refuse_resume_overwrite(corpus, replayed, tmp_path):
    uri, _ = replayed
    with pytest.raises(StoreError,
                       match="already holds 3 published epochs of the same configuration, complete") as info:
        replay(config(corpus), uri)
    assert "--resume" not in str(info.value)  # a finished run has nothing to resume
    with pytest.raises(StoreError, match="different configuration"):
        replay(config(corpus, kappa0=10.0), uri, mode="resume")
    # refused, it also says what differs
    with pytest.raises(StoreError, match=r"of a different configuration \(epoch: '10y' in the store, '20y' now\)"):
        replay(config(corpus, epoch="20y"), uri)

    # an interrupt after the second epoch leaves a readable store at that epoch ...
    part = str(tmp_path / "part")

    interrupted_replay(corpus, part)
    store = SnapshotStore(part)
    assert [e["label"] for e in store.epochs()] == ["1790s", "1800s"]
    store.read(1)
    with pytest.raises(StoreError, match="2 published epochs of the same configuration, unfinished.*--resume to finish"):
        replay(config(corpus), part)
    # ... and resuming it gives exactly the store of an uninterrupted run
    seen = []
    summary = replay(config(corpus), part, mode="resume", progress=seen.append)
    # only the missing epoch is fitted: the first two come from the checkpoint
    assert summary.n_published == 1 and [p.index for p in seen] == [2]
    assert summary.n_documents + summary.n_rejects == summary.n_records
    a, b = store_tables(uri), store_tables(part)
    assert a.keys() == b.keys() and all(a[n].equals(b[n]) for n in a)

    summary = replay(config(corpus, kappa0=10.0, n_sweeps=2), part, mode="overwrite")
    assert summary.n_published == 3
    assert SnapshotStore(part).config()["replay"]["model"]["kappa0"] == 10.0


def test_a_resume_of_a_finished_run_needs_no_write_access(corpus, replayed, monkeypatch):
    """Resuming a run that finished only reads the store: it answers on a store the user may not
    write (a read-only copy) instead of failing on the writer's checks."""
    uri, _ = replayed

    def refuse(self):
        raise StoreAccessError(f"{self.root}: not writable")

    monkeypatch.setattr(SnapshotStore, "check_writable", refuse)
    summary = replay(config(corpus), uri, mode="resume")
    assert summary.complete_before and summary.n_published == 0
    with pytest.raises(StoreAccessError):  # anything left to do still needs the writer
        replay(config(corpus), uri, mode="overwrite")


def test_overwrite_keeps_store_when_source_is_bad(replayed, tmp_path):
    uri, _ = replayed
    with pytest.raises(SourceError, match="missing.parquet: no such file"):
        replay(config(tmp_path / "missing.parquet"), uri, mode="overwrite")
    assert len(SnapshotStore(uri).epochs()) == 3


def test_resume_refuses_to_keep_every_checkpoint_of_a_store_that_kept_the_latest(corpus, tmp_path):
    """The older checkpoints of a store written with keep_checkpoints='latest' are gone: asking a
    resume to keep every one is refused, saying what to do, rather than silently ignored."""
    part = str(tmp_path / "part")

    interrupted_replay(corpus, part)
    with pytest.raises(StoreError, match="latest epoch's checkpoint only.*--overwrite"):
        replay(config(corpus), part, mode="resume", keep_checkpoints="all")
    assert replay(config(corpus), part, mode="resume").n_published == 1


def test_identity_weighting_matches_stores_written_before_the_tfidf_default():
    """Stores written while plain frequencies were the default recorded no weighting for them
    and ``"tfidf"`` when asked for: a resume with the same settings must match, a vMF resume
    on other weights must not, and the multinomial (raw counts) ignores the setting."""
    def ident(likelihood, **kw):
        return config("corpus.parquet", likelihood=likelihood, **kw).identity()

    assert "weighting" not in ident("vmf", weighting="tf")  # as the tf stores recorded
    assert ident("vmf", weighting="tfidf")["weighting"] == "tfidf"  # as explicit tf-idf stores did
    assert ident("vmf") != ident("vmf", weighting="tf")  # the new default is not an older store's tf
    assert ident("multinomial") == ident("multinomial", weighting="tf") == ident("multinomial", weighting="tfidf")
    assert "weighting" not in ident("multinomial")
    # the refusal names the weighting an older store has, not a missing value
    from streamtree.replay import identity_differences

    assert identity_differences(ident("vmf", weighting="tf"), ident("vmf")) == "weighting: 'tf' in the store, 'tfidf' now"


def test_refused_resume_names_the_model_parameter_that_differs():
    """A store fitted with independent tokens (the default before bursty documents) is not
    resumed under the new default; the refusal names the parameter, not two whole dicts."""
    from streamtree.replay import identity_differences

    old = config("corpus.parquet", document_concentration=None).identity()
    now = config("corpus.parquet").identity()
    assert old != now
    assert identity_differences(old, now) == "model.document_concentration: None in the store, 'auto' now"
    # a store written before the parameter existed was fitted with independent tokens
    from streamtree.replay import stored_identity

    before = dict(old, model={k: v for k, v in old["model"].items() if k != "document_concentration"})
    assert stored_identity(before) == old
    # the vMF has no document model: its stores, all recorded with None, match the new default
    assert config("corpus.parquet", likelihood="vmf", document_concentration=None).identity() == \
        config("corpus.parquet", likelihood="vmf").identity()


def test_identity_split_node_matches_stores_written_before_it():
    """Stores written before ``split_node`` existed held the split node's parameter: they
    resume under the default, not under ``"integrated"``, whatever the family."""
    from streamtree.replay import identity_differences, stored_identity

    for likelihood in ("multinomial", "vmf"):
        now = config("corpus.parquet", likelihood=likelihood).identity()
        assert now["model"]["split_node"] == "fixed"
        before = dict(now, model={k: v for k, v in now["model"].items() if k != "split_node"})
        assert stored_identity(before) == now
        integrated = config("corpus.parquet", likelihood=likelihood, split_node="integrated").identity()
        assert identity_differences(now, integrated) == "model.split_node: 'fixed' in the store, 'integrated' now"


def test_weighted_vmf_documents_replay_with_length_weighted_rows(corpus, tmp_path):
    """vMF by default (``document_weights="auto"``, as ``True``): the store's vocabulary weighs
    rows by the square root of their token counts over the median, the model reads the norms as
    weights; ``False`` keeps unit rows, and stores written before the parameter match those."""
    from streamtree.text import DEFAULT_LENGTH_POWER

    uri = str(tmp_path / "weighted")
    summary = replay(config(corpus, likelihood="vmf"), uri)
    store = SnapshotStore(uri)
    vec = store.vectorizer()
    assert vec.length_power == DEFAULT_LENGTH_POWER == 0.5 and vec.reference_length_ > 0
    assert summary.n_documents > 0 and len(store.epochs()) == 3
    texts = pq.read_table(corpus, columns=["text"]).column("text").to_pylist()[:20]
    X = vec.transform(texts)
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    lengths = np.asarray(vec._fixed.transform(texts).sum(axis=1)).ravel()
    np.testing.assert_allclose(norms[lengths > 0], np.sqrt(lengths[lengths > 0] / vec.reference_length_),
                               rtol=1e-12)
    assert config(corpus, likelihood="vmf", document_weights=True).vectorizer().length_power == 0.5
    assert config(corpus, likelihood="vmf", document_weights=False).vectorizer().length_power == 0.0
    assert config(corpus, likelihood="multinomial").vectorizer().norm is None
    from streamtree.replay import identity_differences, stored_identity

    unit = config("corpus.parquet", likelihood="vmf", document_weights=False).identity()
    before = dict(unit, model={k: v for k, v in unit["model"].items() if k != "document_weights"})
    assert stored_identity(before) == unit
    # an older (unit-row) store is not resumed under the new default: the refusal says what differs
    assert identity_differences(unit, config("corpus.parquet", likelihood="vmf").identity()) \
        == "model.document_weights: False in the store, True now"
    # "auto" and True read the same weights: a store of either resumes under the other
    assert config("corpus.parquet", likelihood="vmf").identity() == \
        config("corpus.parquet", likelihood="vmf", document_weights=True).identity()


def test_nodes_are_worded_by_their_documents_for_word_distributions_and_by_theta_for_directions(corpus, tmp_path):
    """Replay publishes a multinomial node's words from the documents below it
    (``EpochTree.label_words``: its flattened parameter says nothing of them) and a vMF node's
    from its direction's largest entries, taken from the full parameter before the store
    truncates it."""
    from streamtree.replay import EpochFitter, fit_vocabulary, load_model, read_epochs

    for likelihood, by_documents in (("multinomial", True), ("vmf", False)):
        cfg = config(corpus, likelihood=likelihood)
        uri = str(tmp_path / likelihood)
        replay(cfg, uri)
        store = SnapshotStore(uri)
        last = store.epochs()[-1]["epoch"]
        tree = load_model(uri).trees_[-1]  # the last epoch's tree at full precision
        by_theta = tree.top_words(store.vocabulary(), 10)
        assert (store.read(last).top_words == by_theta) is not by_documents, likelihood
        epochs, _ = read_epochs(cfg)
        fitted = EpochFitter(cfg.estimator(), fit_vocabulary(cfg, epochs)).fit(epochs[0])
        assert (fitted.vocabulary is not None) is by_documents, likelihood


def test_identity_records_iso_weeks_so_thursday_week_stores_are_not_resumed():
    """Week epochs start on Mondays now; a store written with Thursday weeks recorded no
    origin, so its identity differs (a resume is refused instead of moving the boundaries),
    while stores of other epochs match as before."""
    weekly = config("corpus.parquet", epoch="1w").identity()
    assert weekly["week_origin"] == "monday"
    assert config("corpus.parquet", epoch="2w").identity()["week_origin"] == "monday"
    for other in ("1d", "10y", "month"):
        assert "week_origin" not in config("corpus.parquet", epoch=other).identity()
    thursday_store = {k: v for k, v in weekly.items() if k != "week_origin"}
    assert thursday_store != weekly


def test_a_replay_keeps_no_more_trees_than_an_epoch_needs(corpus, tmp_path, monkeypatch):
    """Every fitted tree holds its parameters and assignments; a replay kept them all in the
    model (about 8 K V bytes an epoch, GBs over a long hourly stream) though the store holds
    the history. The model now holds the previous epoch's tree at most (what the events of
    a quiet run need: tests/test_events.py)."""
    from streamtree.model import DTSSBP

    held = []
    real = DTSSBP.partial_fit

    def counting(self, *args, **kwargs):
        held.append(len(getattr(self, "trees_", [])))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DTSSBP, "partial_fit", counting)
    uri = str(tmp_path / "run")
    replay(config(corpus, epoch="1y"), uri)
    assert len(held) > 20 and max(held) <= 1, held


def test_epochs_without_records_are_counted_apart_from_the_published(corpus, tmp_path):
    rows = pq.read_table(corpus)
    years = sorted(set(rows.column("year").to_pylist()))
    keep = pc.is_in(rows.column("year"), pa.array([years[0], years[1], years[-1]]))
    gappy = tmp_path / "gappy.parquet"
    pq.write_table(rows.filter(keep), gappy)
    uri = str(tmp_path / "run")
    summary = replay(config(gappy, epoch="1y"), uri)
    assert summary.n_quiet == years[-1] - years[1] - 1 > 0
    assert summary.n_published + summary.n_quiet == summary.n_epochs and summary.n_published == 3
    assert len(SnapshotStore(uri).epochs()) == 3
    lines = summary.format().splitlines()
    assert f"3 published now, {summary.n_quiet} without records" in lines[0]
    assert "this run" not in lines[-1]


def test_epochs_are_compared_by_meaning_not_spelling(corpus, tmp_path):
    """A store replayed by '10y' resumes under 'decade' (and '15m' under '15min'); a store
    written when '1M' was read as one minute continues under '1min', its meaning then (it is
    refused as ambiguous now, and the stored spelling blocked every restart)."""
    from streamtree.replay import same_identity

    part = str(tmp_path / "part")
    interrupted_replay(corpus, part)
    assert replay(config(corpus, epoch="decade"), part, mode="resume").n_published == 1
    base = config(corpus).identity()
    for stored, now in (("15m", "15min"), ("1M", "1min"), ("10y", "decade"), ("month", "1mo")):
        assert same_identity({**base, "epoch": stored}, {**base, "epoch": now}), (stored, now)
    for stored, now in (("1M", "1mo"), ("15m", "15h"), ("10y", "1y")):
        assert not same_identity({**base, "epoch": stored}, {**base, "epoch": now}), (stored, now)


def test_the_store_and_the_source_stay_apart(tmp_path):
    """A store inside the source folder would have its own files read as data on the next run,
    and a store holding the source could touch it: the replay refuses either before it writes
    anything. A hidden or _-prefixed folder of the source is never read, so a store may live there."""
    src = tmp_path / "src"
    write_jsonl(str(src / "day1.jsonl"), day_rows(1, 20, 0))
    (tmp_path / "link").symlink_to(src)
    cfg = _days_config(src)
    for store, where in ((src / "out", "is inside"), (src, "is"), (tmp_path / "link" / "out", "is inside"),
                         (tmp_path, "holds")):
        with pytest.raises(StoreError, match=f"the store {where} the source .*put the store outside it"):
            replay(cfg, str(store))
    assert sorted(p.name for p in src.iterdir()) == ["day1.jsonl"]
    with pytest.raises(StoreError, match="the store holds the source"):
        replay(_days_config(src / "day1.jsonl"), str(src))
    summary = replay(cfg, str(src / "_stores" / "run"))
    assert summary.n_published == 1 and sorted(p.name for p in src.iterdir()) == ["_stores", "day1.jsonl"]


def test_a_replay_that_reads_nothing_says_so_and_leaves_no_folder(tmp_path):
    """A header-only file is named as holding no records, not as 'every one of 0 records
    rejected'; a replay that stops before writing anything removes the store folder it created,
    and keeps one that was there before."""
    src = tmp_path / "header.csv"
    src.write_text("text,time\n")
    cfg = ReplayConfig(source=str(src), text_col="text", time_col="time", epoch="1d", model=dict(MODEL), min_df=1)
    with pytest.raises(ValueError, match=r"header\.csv: holds no records \(an empty file, or a header only\)"):
        replay(cfg, str(tmp_path / "new-store"))
    assert not (tmp_path / "new-store").exists()
    with pytest.raises(SourceError, match="text column 'body' not found"):
        replay(ReplayConfig(source=str(src), text_col="body", time_col="time", epoch="1d", model=dict(MODEL)),
               str(tmp_path / "new-store"))
    assert not (tmp_path / "new-store").exists()
    (tmp_path / "mine").mkdir()
    with pytest.raises(ValueError, match="holds no records"):
        replay(cfg, str(tmp_path / "mine"))
    assert (tmp_path / "mine").is_dir()


def test_the_summary_time_line_says_whose_time_it_is():
    """A resume's wall time is its own, its fitting time the whole replay's: the line says which,
    so fitting never reads as longer than the run."""
    from streamtree.replay import ReplaySummary

    base = dict(n_epochs=4, n_documents=400, n_records=400, seconds=21.0, fit_seconds=40.0)
    whole = ReplaySummary(n_published=4, **base).format().splitlines()[-1]
    assert whole == "time: 21.0s (40.0s fitting, 10 documents/s)"
    resumed = ReplaySummary(n_published=1, **base).format().splitlines()[-1]
    assert resumed == "time: 21.0s this run, for 1 of the 4 epochs (the whole replay so far: 40.0s fitting, 10 documents/s)"
    done = ReplaySummary(n_published=0, complete_before=True, **base).format().splitlines()[-1]
    assert done.startswith("time: 21.0s (nothing left to fit; the replay that wrote the store: 40.0s fitting")
    # epochs without records (a weekly replay of a stream with gaps) are not published, and a
    # run that fitted all the others reads as a whole run, not a resume
    gaps = ReplaySummary(n_published=3, n_quiet=1, **base).format().splitlines()
    assert gaps[0] == "epochs: 4 (3 published now, 1 without records: gaps in the stream, fitted and not published)"
    assert gaps[-1] == "time: 21.0s (40.0s fitting, 10 documents/s)"
    resumed = ReplaySummary(n_published=1, n_quiet=1, **base).format().splitlines()[-1]
    assert resumed.startswith("time: 21.0s this run, for 1 of the 3 epochs with records (the whole replay so far")


def test_show_and_report_say_when_a_replay_has_not_finished(corpus, replayed, tmp_path, capsys):
    from streamtree.cli import main

    part = str(tmp_path / "part")
    interrupted_replay(corpus, part)
    assert main(["show", part]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("note: this replay has not finished: 2 epochs published, through 1800s")
    assert "--resume" in first
    page = tmp_path / "r.html"
    assert main(["report", part, "-o", str(page)]) == 0
    assert 'id="unfinished">Note: this replay has not finished' in page.read_text()
    uri, _ = replayed  # a finished one says nothing
    assert main(["show", uri]) == 0 and "not finished" not in capsys.readouterr().out
    assert main(["report", uri, "-o", str(page)]) == 0 and 'id="unfinished"' not in page.read_text()
