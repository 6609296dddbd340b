"""The streamtree command line end to end on a slice of the SOU corpus, and its user errors."""

from __future__ import annotations

import itertools
import logging
import re

import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from connectors.stores.snapshot import SnapshotStore
from streamtree.cli import main
from test_replay import sou_slice

FAST = ["--sweeps", "3", "--kappa0", "100", "--max-features", "500", "--seed", "1"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamtree.cli", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return sou_slice(tmp_path_factory.mktemp("sou") / "slice.parquet", n=200)


@pytest.fixture(scope="module")
def store(corpus, tmp_path_factory):
    uri = str(tmp_path_factory.mktemp("cli") / "store")
    assert main(["replay", str(corpus), "--text-col", "text", "--time-col", "year", "--id-col", "doc_id",
                 "--epoch", "10y", "--quiet", "--store", uri, *FAST]) == 0
    return uri


def test_replay_and_show_through_the_console(corpus, tmp_path):
    uri = str(tmp_path / "store")
    r = run_cli("replay", str(corpus), "--text-col", "text", "--time-col", "year", "--epoch", "10y",
                "--store", uri, *FAST)
    assert r.returncode == 0, r.stderr
    assert "epochs: 3 (3 published now)" in r.stdout
    fitted = int(re.search(r"documents: (\d+) (?:fitted|published) .*of 200 records read", r.stdout).group(1))
    rejected = int(r.stdout.split("rejects: ")[1].split("\n")[0])
    assert fitted + rejected == 200
    if rejected:  # the slice has no other rejects, and the reason is said once
        assert r.stdout.count(f"empty after vocabulary filtering: {rejected}") == 1
    # stderr is not a terminal here: no progress bars, only the notes on what was chosen
    assert all(line.startswith("note: ") for line in r.stderr.splitlines()), r.stderr
    assert "note: vocabulary: " in r.stderr

    r = run_cli("show", uri, "--top-words", "5", "--all")
    assert r.returncode == 0, r.stderr
    from streamtree.relays import relay_chains

    store = SnapshotStore(uri)
    for e in store.epochs():
        stored = store.read(e["epoch"])
        tree = stored.tree
        assert f"epoch {e['epoch']} ({e['label']}): {tree.assignments.shape[0]} documents" in r.stdout
        words = [w[:5] for w in stored.top_words]  # the label words as published
        # the model's events reach the store: nodes that split from another carry that mark
        ev = store.events(e["epoch"]).to_pylist()
        split_from = {x["node_id"]: x["other_id"] for x in ev if x["event"] == "split_from"}
        moved = {x["node_id"] for x in ev if x["event"] == "parent_changed"}
        row = {int(n): k for k, n in enumerate(tree.node_ids)}

        def mark(nid):
            return ("<" if nid in split_from else "*" if tree.born[row[nid]] == tree.epoch else "^" if nid in moved
                    else " ")

        # every node on a line, indented by its depth less the relays above it, with its top words; a
        # relay (no documents of its own, one child) is on its child's line, ahead of it
        chains = relay_chains(tree.node_ids, tree.parent, tree.counts)
        relays = {r for chain in chains.values() for r in chain}
        assert len(relays) == sum(int(tree.counts[k]) == 0 and int((tree.parent == tree.node_ids[k]).sum()) == 1
                                  for k in range(tree.n_nodes))
        for k in range(tree.n_nodes):
            nid = int(tree.node_ids[k])
            if nid in relays:
                continue
            path = [*chains.get(nid, ()), nid]
            ids = mark(path[0]) + " > ".join(f"{mark(n).strip() if i else ''}[{n}]" for i, n in enumerate(path))
            level, up = 0, int(tree.parent[row[path[0]]])
            while up != -1:
                level += up not in relays
                up = int(tree.parent[row[up]])
            notes = [f"{n} split from {split_from[n]}" for n in path if n in split_from]
            note = (f" (split from {split_from[nid]})" if len(path) == 1 and notes else
                    f" ({', '.join(notes)})" if notes else "")
            line = (f"{'    ' * level}{ids} "
                    f"{int(tree.subtree_counts[k])} doc{'' if tree.subtree_counts[k] == 1 else 's'} "
                    f"({int(tree.counts[k])} here){note}: {' '.join(words[k])}")
            assert line in r.stdout.splitlines()
    assert "[a] > [b]: a holds no documents of its own and b is its only child" in r.stdout  # the legend says so


def test_published_words_are_the_terms_of_the_documents_below_each_node(corpus, store):
    """Each node holding documents below it publishes the terms with the largest counts over
    them, summed here document by document up the parent links (the order among equal counts
    is theta's, which the store keeps only compactly: not checked here)."""
    import numpy as np

    texts = dict(zip(*pq.read_table(corpus, columns=["doc_id", "text"]).to_pydict().values()))
    st = SnapshotStore(store)
    vec, vocab = st.vectorizer(), st.vocabulary()
    n_internal = 0
    for e in st.epochs():
        stored = st.read(e["epoch"])
        tree = stored.tree
        X = vec.transform([texts[d] for d in stored.doc_ids]).toarray()
        parent = dict(zip(tree.node_ids.tolist(), tree.parent.tolist()))
        sums = {int(n): np.zeros(vocab.size) for n in tree.node_ids}
        for x, node in zip(X, tree.assignments.tolist()):
            while node != -1:
                sums[node] += x
                node = parent[node]
        column = {w: i for i, w in enumerate(vocab)}
        for k, node in enumerate(tree.node_ids.tolist()):
            if tree.subtree_counts[k] == 0:
                continue
            words, c = stored.top_words[k], sums[node]
            got = c[[column[w] for w in words]]
            assert len(words) == min(10, np.count_nonzero(c)) and np.all(got > 0), (e["epoch"], node)
            assert np.all(np.diff(got) <= 0), (e["epoch"], node, words)
            assert {vocab[i] for i in np.flatnonzero(c > got[-1])} <= set(words), (e["epoch"], node, words)
            n_internal += int(tree.subtree_counts[k] > tree.counts[k])
    assert n_internal  # the check reached nodes whose documents sit below them


def test_show_one_epoch_min_docs_and_lineage(store, capsys):
    st = SnapshotStore(store)
    last = st.read(2).tree
    assert main(["show", store, "--epoch", "1810s", "--min-docs", "1000"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("epoch 2 (1810s)") and "epoch 1 (" not in out
    assert f"({last.n_nodes - 1} smaller or empty nodes not shown; --all shows every node)" in out
    assert main(["show", store, "--epoch", "1"]) == 0
    assert capsys.readouterr().out.startswith("epoch 1 (1800s)")

    assert main(["show", store, "--node", "0"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "node 0: born in epoch 0 (1790s), alive in the last epoch"
    assert sum(line.startswith("  epoch ") for line in out.splitlines()) == 3


def test_evaluate_runs_the_protocol(corpus, capsys):
    common = [str(corpus), "--text-col", "text", "--time-col", "year", "--epoch", "10y", "--variants", "dtssbp,t-dp",
              "--max-depth", "2", "--repeats", "2", "--kappa0-grid", "10,100", "--sweeps", "2", "--max-features",
              "300", "--quiet"]
    assert main(["evaluate", *common]) == 0
    out = capsys.readouterr().out
    assert out.startswith("protocol: documents.")
    assert "Held-out log density per test document" in out and "epochs weigh by their size" in out
    assert "selection documents per repeat:" in out
    header = next(line for line in out.splitlines() if line.startswith("model"))
    assert "log density/doc" in header and "NPMI" in header
    row = next(line for line in out.splitlines() if line.startswith("dtssbp"))
    assert row.count("+-") == 2  # log density and NPMI, each mean +- sd over the repeats
    assert "Paired differences in log density per test document, model - dtssbp" in out
    assert re.search(r"  t-dp      depth 2: [+-]\d+\.\d\d \+- \d+\.\d\d \(SE \d+\.\d\d\), ahead in [012]/2", out)
    assert re.search(r"  dtssbp depth 2: chose (10|100), .*10: .*100: ", out)
    assert "t-dp depth 2: kappa0=" in out and "the estimator's default (kappa0 plays no role)" in out

    assert main(["evaluate", *common, "--protocol", "paper", "--restarts", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("protocol: paper.")
    assert "unnormalised (paper)" in out and "not a density" in out
    assert "t-dp depth 2: kappa0=10 (seed 0) (kappa0 plays no role)" in out


@pytest.mark.parametrize("args, expected", [
    (["replay", "{corpus}", "--text-col", "body", "--time-col", "year", "--store", "{tmp}/s"],
     "text column 'body' not found; columns present: 'fileid', 'paragraph', 'year', 'text', 'doc_id'"),
    (["replay", "{corpus}", "--text-col", "text", "--time-col", "when", "--store", "{tmp}/s"],
     "time column 'when' not found"),
    (["replay", "{tmp}/corrupt.parquet", "--text-col", "text", "--time-col", "year", "--store", "{tmp}/s"],
     "corrupt.parquet: not a valid or readable Parquet file"),
    (["replay", "{tmp}/nothing.parquet", "--text-col", "text", "--time-col", "year", "--store", "{tmp}/s"],
     "nothing.parquet: no such file"),
    (["replay", "{corpus}", "--text-col", "text", "--time-col", "year", "--epoch", "7q", "--store", "{tmp}/s"],
     "cannot parse epoch spec '7q'"),
    (["replay", "{corpus}", "--text-col", "text", "--time-col", "year", "--sweeps", "0", "--store", "{tmp}/s"],
     "argument --sweeps: expected a positive integer, got '0'"),
    (["show", "{tmp}/no-store"], "no published epochs"),
    (["show", "{corpus}"], "is a file, not a snapshot store (STORE): give the folder that replay or serve wrote"),
    (["report", "{tmp}/no-store", "-o", "{tmp}"], "is a folder (-o/--output): name the HTML file to write"),
    (["replay", "{corpus}", "--text-col", "text", "--time-col", "year", "--likelihood", "VMF", "--store", "{tmp}/s"],
     "unknown likelihood 'VMF'; choose one of vmf, multinomial"),
    (["replay", "{corpus}", "--text-col", "text", "--time-col", "year", "--max-depth", "0", "--store", "{tmp}/s"],
     "'max_depth' parameter of DTSSBP must be an int in the range [1, inf)"),
    (["evaluate", "{corpus}", "--text-col", "text", "--time-col", "year", "--variants", "dtssbp,lda"],
     "unknown variant(s) lda"),
    (["evaluate", "{corpus}", "--text-col", "text", "--time-col", "year", "--selection-fraction", "1.5"],
     "--selection-fraction must be in (0, 1), got 1.5"),
    (["evaluate", "{corpus}", "--text-col", "text", "--time-col", "year", "--test-fraction", "0.5",
      "--selection-fraction", "0.5"], "must be positive and leave training documents"),
    (["evaluate", "{corpus}", "--text-col", "text", "--time-col", "year", "--max-depth", "3,4,3"],
     "argument --max-depth: depth 3 given more than once"),
    (["evaluate", "{corpus}", "--text-col", "text", "--time-col", "year", "--restarts", "2"],
     "--restarts applies to the paper protocol only (evaluate): drop it, or add --protocol paper"),
    (["evaluate", "{corpus}", "--text-col", "text", "--time-col", "year", "--protocol", "paper", "--tie-se", "2"],
     "--tie-se applies to the documents protocol only"),
    (["evaluate", "{corpus}", "--text-col", "text", "--time-col", "year", "--min-df", "0.9"],
     "with min_df=0.9 and max_df=0.5: max_df corresponds to < documents than min_df; lower min_df or raise max_df"),
])
def test_user_errors_are_one_clear_line(corpus, tmp_path, capsys, args, expected):
    (tmp_path / "corrupt.parquet").write_bytes(b"PAR1 this is not parquet at all")
    argv = [a.format(corpus=corpus, tmp=tmp_path) for a in args]
    rc = call(argv)
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert expected in lines[0]


def test_show_errors_name_the_choices(store, capsys):
    assert main(["show", store, "--epoch", "1900s"]) == 2
    err = capsys.readouterr().err
    assert "no published epoch '1900s'" in err and "0 (1790s), 1 (1800s), 2 (1810s)" in err
    assert main(["show", store, "--node", "99999"]) == 2
    assert "node 99999 never appears" in capsys.readouterr().err


def test_an_unknown_epoch_of_a_long_run_names_its_span_and_neighbours():
    """Weekly epochs over years: the error cannot list 500 labels, but gives the span and the
    published epochs either side of the label asked for (a date inside a week finds its week)."""
    from streamtree.cli import _UserError, resolve_epoch

    weeks = [{"epoch": 2 * k, "label": f"2010-{1 + k // 4:02d}-{1 + 7 * (k % 4):02d}"} for k in range(40)]
    assert resolve_epoch(weeks, "2010-03-08")["epoch"] == 18 and resolve_epoch(weeks, "6")["epoch"] == 6
    with pytest.raises(_UserError) as err:
        resolve_epoch(weeks, "2010-03-10")
    msg = str(err.value)
    assert "40 published epochs: 0 (2010-01-01), 2 (2010-01-08), 4 (2010-01-15) ... 78 (2010-10-22)" in msg
    assert "nearest to '2010-03-10': 18 (2010-03-08), 20 (2010-03-15)" in msg
    with pytest.raises(_UserError, match=r"nearest to '2009': 0 \(2010-01-01\) \("):
        resolve_epoch(weeks, "2009")
    with pytest.raises(_UserError) as err:
        resolve_epoch(weeks, "7")  # an index that is not published: index neighbours, no label ones
    assert "published indices nearest to 7: 6 (2010-01-22), 8 (2010-02-01)" in str(err.value)
    assert "labels nearest" not in str(err.value) and "... 78 (2010-10-22)" in str(err.value)
    # four digits may be an index or a year: both neighbours (an index was compared as a label only)
    minutes = [{"epoch": 2 * k, "label": f"2024-03-01T{k // 60:02d}:{k % 60:02d}"} for k in range(3000)]
    with pytest.raises(_UserError) as err:
        resolve_epoch(minutes, "3001")
    msg = str(err.value)
    assert "published indices nearest to 3001: 3000 (2024-03-01T25:00), 3002 (2024-03-01T25:01)" in msg
    assert "published labels nearest to '3001': 5998 (2024-03-01T49:59)" in msg


def test_existing_store_is_refused_with_advice(corpus, store, capsys):
    argv = ["replay", str(corpus), "--text-col", "text", "--time-col", "year", "--id-col", "doc_id",
            "--quiet", "--store", store, *FAST]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "already holds 3 published epochs" in err and "--overwrite" in err
    assert main([*argv, "--resume"]) == 0
    assert "epochs: 3 (0 published now, the store was already complete)" in capsys.readouterr().out


def test_rejects_reach_the_summary_and_the_store(tmp_path, capsys):
    texts = ["war army navy peace", "war army navy", "army navy peace", "war navy peace", "war army peace"]
    rows = {"text": texts + ["", "zebra"], "year": [1801] * 5 + [1802, 1803]}
    pq.write_table(pa.table(rows), tmp_path / "c.parquet")
    uri = str(tmp_path / "s")
    assert main(["replay", str(tmp_path / "c.parquet"), "--text-col", "text", "--time-col", "year",
                 "--quiet", "--store", uri, "--sweeps", "2", "--max-df", "1.0"]) == 0
    out = capsys.readouterr().out
    assert "rejects: 2\n  empty text: 1\n  empty after vocabulary filtering: 1\n" in out
    rj = SnapshotStore(uri).read(0).rejects
    assert sorted(rj.column("reason").to_pylist()) == ["empty after vocabulary filtering", "empty text"]


def test_a_replay_into_one_epoch_says_so_with_an_epoch_that_makes_several(tmp_path, capsys):
    """Data spanning less than one epoch of the default --epoch (a decade) fits one tree, which
    shows no evolution: the summary says how many epochs it made, the data's time span, and an
    --epoch that makes several (never finer than the times are dated to: years are not cut into
    months), also when a complete store is resumed. Before, it said nothing of it."""
    from service_corpus import day_rows, write_jsonl

    for d in range(1, 7):
        write_jsonl(str(tmp_path / "days" / f"day{d}.jsonl"), day_rows(d, 10, 0))
    argv = ["replay", str(tmp_path / "days"), "--text-col", "text", "--time-col", "time", "--quiet",
            "--store", str(tmp_path / "s"), "--sweeps", "2", "--min-df", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "epochs: 1 (1 published now)" in out
    hint = [line for line in out.splitlines() if line.startswith("hint: ")]
    assert len(hint) == 1, out
    assert hint[0].startswith("hint: the replay made 1 epoch of --epoch 10y (the default) for documents spanning "
                              "5.") and "(2026-03-01 .. 2026-03-06), less than one epoch" in hint[0]
    assert "no evolution; --epoch 1d would make 6 epochs" in hint[0]
    assert main([*argv, "--resume"]) == 0  # the store's summary keeps the span
    out = capsys.readouterr().out
    assert "the store was already complete" in out and hint[0] in out.splitlines()
    assert main([*argv[:-6], "--store", str(tmp_path / "d"), "--epoch", "1d", "--sweeps", "2", "--min-df", "1"]) == 0
    out = capsys.readouterr().out
    assert "epochs: 6 (6 published now)" in out and "hint" not in out
    # years: two epochs of 10y across a decade's end, over 4 years: --epoch year, not 6mo
    words = ["war army navy", "tax budget revenue", "school teacher college"]
    rows = {"text": [words[i % 3] + f" extra{i % 4}" for i in range(40)], "year": [1797 + i % 5 for i in range(40)]}
    pq.write_table(pa.table(rows), tmp_path / "years.parquet")
    assert main(["replay", str(tmp_path / "years.parquet"), "--text-col", "text", "--time-col", "year", "--quiet",
                 "--store", str(tmp_path / "y"), "--sweeps", "2", "--min-df", "1"]) == 0
    out = capsys.readouterr().out
    assert ("hint: the replay made 2 epochs of --epoch 10y (the default) for documents spanning 4 years "
            "(1797-01-01 .. 1801-01-01), less than one epoch, so the trees show little evolution; --epoch year "
            "would make 5 epochs") in out


def test_the_few_epochs_hint_calls_the_epoch_the_default_only_when_it_was_not_given(tmp_path, capsys):
    """``--epoch 10y`` typed out is the user's choice, though it equals the default: the hint
    names it without "(the default)". Before, it compared the value with the default, so a
    typed --epoch 10y read "(the default)" too."""
    from service_corpus import day_rows, write_jsonl

    write_jsonl(str(tmp_path / "days" / "day1.jsonl"), day_rows(1, 10, 0))
    write_jsonl(str(tmp_path / "days" / "day2.jsonl"), day_rows(2, 10, 0))
    argv = ["replay", str(tmp_path / "days"), "--text-col", "text", "--time-col", "time", "--quiet",
            "--sweeps", "2", "--min-df", "1"]
    assert main([*argv, "--store", str(tmp_path / "given"), "--epoch", "10y"]) == 0
    hint = [line for line in capsys.readouterr().out.splitlines() if line.startswith("hint: ")]
    assert len(hint) == 1, hint
    assert hint[0].startswith("hint: the replay made 1 epoch of --epoch 10y for documents spanning ")
    assert main([*argv, "--store", str(tmp_path / "not-given")]) == 0
    hint = [line for line in capsys.readouterr().out.splitlines() if line.startswith("hint: ")]
    assert len(hint) == 1, hint
    assert hint[0].startswith("hint: the replay made 1 epoch of --epoch 10y (the default) for documents spanning ")


def test_an_evaluation_on_one_epoch_says_so_with_an_epoch_that_makes_several(tmp_path, capsys):
    """evaluate buckets its source as replay does and gives the same hint when the epochs are
    too few, as soon as they are made (before the runs, and before the paper protocol's error
    for too few epochs, whose advice it makes concrete). Before, it said nothing of it."""
    from service_corpus import day_rows, write_jsonl

    for d in range(1, 7):
        write_jsonl(str(tmp_path / "days" / f"day{d}.jsonl"), day_rows(d, 10, 0))
    argv = ["evaluate", str(tmp_path / "days"), "--text-col", "text", "--time-col", "time", "--quiet",
            "--min-df", "1", "--variants", "dtssbp", "--max-depth", "2", "--repeats", "1", "--kappa0-grid", "100",
            "--sweeps", "2"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    hint = [line for line in lines if line.startswith("hint: ")]
    assert len(hint) == 1 and lines[0] == hint[0], lines
    assert hint[0].startswith("hint: the evaluation made 1 epoch of --epoch 10y (the default) for documents "
                              "spanning 5.") and "no evolution; --epoch 1d would make 6 epochs" in hint[0]
    assert lines[1].startswith("protocol: documents. 1 epoch ")
    assert main([*argv, "--protocol", "paper"]) == 2
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [hint[0]] and "at least 2 epochs with documents, found 1" in captured.err
    assert main([*argv, "--epoch", "1d"]) == 0
    assert "hint" not in capsys.readouterr().out


def test_a_replay_says_which_files_it_skipped_for_the_content_of_an_earlier_one(tmp_path):
    """A file re-delivered under another name: the console warns naming both files and the
    summary counts the files skipped, as the service's ledger records a duplicate."""
    from service_corpus import day_rows, write_jsonl

    for d in (1, 2):
        write_jsonl(str(tmp_path / "days" / f"day{d}.jsonl"), day_rows(d, 10, 0))
    shutil.copy(tmp_path / "days" / "day1.jsonl", tmp_path / "days" / "resent-day1.jsonl")
    r = run_cli("replay", str(tmp_path / "days"), "--text-col", "text", "--time-col", "time", "--epoch", "1d",
                "--store", str(tmp_path / "s"), "--sweeps", "2", "--min-df", "1")
    assert r.returncode == 0, r.stderr
    assert "documents: 20 fitted of 20 records read\nduplicate files skipped: 1 (same content as an earlier file: " \
           "resent-day1.jsonl = day1.jsonl)\n" in r.stdout
    warned = [line for line in r.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warned) == 1 and "resent-day1.jsonl has the same content as day1.jsonl" in warned[0]


def test_the_few_epochs_hint_for_times_under_a_second_apart_suggests_no_epoch_and_shows_them_apart():
    """Times less than a second apart: no --epoch separates them usefully (1s cuts them only when
    they straddle a second's start), and the ends are printed finely enough to differ. Before,
    the hint said they spanned 0.2 seconds, offered --epoch 1s for 2 epochs, and printed both
    ends to the second."""
    from datetime import datetime, timedelta, timezone

    from streamtree.cli import few_epochs_hint

    def us(*a):
        return (datetime(*a, tzinfo=timezone.utc) - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)

    straddling = few_epochs_hint(2, [us(1999, 12, 31, 23, 59, 59, 900_000), us(2000, 1, 1, 0, 0, 0, 100_000)], "10y",
                                 None, default=True)
    assert "spanning 0.2 seconds (1999-12-31T23:59:59.900 .. 2000-01-01T00:00:00.100)" in straddling
    assert "--epoch 1s" not in straddling and "within a second of one another, which no --epoch separates" in straddling
    within = few_epochs_hint(1, [us(2000, 1, 1, 0, 0, 0, 100_001), us(2000, 1, 1, 0, 0, 0, 900_000)], "1s", None)
    assert "(2000-01-01T00:00:00.100001 .. 2000-01-01T00:00:00.900000)" in within
    # a second or more apart: to the second, and an --epoch
    apart = few_epochs_hint(1, [us(2000, 1, 1, 0, 0, 0, 900_000), us(2000, 1, 1, 0, 0, 5, 100_000)], "10y", None)
    assert "(2000-01-01T00:00:00 .. 2000-01-01T00:00:05)" in apart and "--epoch 1s would make 6 epochs" in apart
    same = few_epochs_hint(1, [us(2000, 1, 1, 0, 0, 0, 250_000)] * 2, "10y", None)
    assert "every document has the same time (2000-01-01T00:00:00.250)" in same


def call(argv) -> int:
    """main()'s exit status, whether it returns it or argparse exits."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.slow
def test_ctrl_c_leaves_a_readable_store_and_resume_finishes_it(corpus, tmp_path):
    import signal

    uri = str(tmp_path / "store")
    argv = [sys.executable, "-m", "streamtree.cli", "replay", str(corpus), "--text-col", "text",
            "--time-col", "year", "--store", uri, *FAST, "--sweeps", "30"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    import time

    # no progress bars when stderr is not a terminal: wait for epoch 0's commit record
    deadline = time.monotonic() + 240
    while not (tmp_path / "store" / "commits" / "000000.json").exists() and proc.poll() is None:
        assert time.monotonic() < deadline, "no epoch published in time"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    done = SnapshotStore(uri).epochs()
    if proc.returncode == 0:  # the replay won the race and finished
        assert len(done) == 3
        return
    assert proc.returncode == 130, err
    assert 1 <= len(done) < 3
    last = done[-1]
    assert f"readable through epoch {last['epoch']} ({last['label']})" in err and "--resume" in err
    assert "Traceback" not in err
    SnapshotStore(uri).read(last["epoch"])
    r = run_cli("replay", str(corpus), "--text-col", "text", "--time-col", "year", "--store", uri, *FAST,
                "--sweeps", "30", "--resume", "--quiet")
    assert r.returncode == 0, r.stderr
    assert f"epochs: 3 ({3 - len(done)} published now)" in r.stdout


def test_a_sigterm_that_ray_turned_into_a_bare_interrupt_is_still_a_sigterm(monkeypatch):
    """Ray, waiting for results, turns the handler's exception into a bare KeyboardInterrupt:
    the last signal handled says which it was."""
    import signal

    from streamtree import cli

    monkeypatch.setattr(cli, "_last_signal", None)
    for sig, want in ((signal.SIGTERM, cli.Terminated), (signal.SIGINT, KeyboardInterrupt)):
        with pytest.raises(KeyboardInterrupt):
            cli._on_interrupt(sig, None)
        assert type(cli._interrupt_of(KeyboardInterrupt())) is want
        wrapped = RuntimeError("while waiting")
        wrapped.__context__ = KeyboardInterrupt()
        assert type(cli._interrupt_of(wrapped)) is want
    assert cli._interrupt_of(RuntimeError("no interrupt")) is None


@pytest.mark.parametrize("kind", ["task", "actor"])
def test_a_ray_worker_failure_is_an_engine_failure_not_a_usage_error(kind, corpus, tmp_path, monkeypatch, capsys):
    """A worker's ValueError comes back as an exception that is also a ValueError: it is reported
    as a failure of the Ray engine (exit 1, with the worker's error), not as bad arguments (2)."""
    import ray.exceptions

    import streamtree.replay as replay_module

    if kind == "task":
        error = ray.exceptions.RayTaskError("ShardWorker.sweep", "Traceback (most recent call last): ...",
                                            ValueError("shape mismatch in the kernel"), pid=1,
                                            ip="127.0.0.1").as_instanceof_cause()
        assert isinstance(error, ValueError)
    else:
        error = ray.exceptions.ActorDiedError()

    def failing(*args, **kwargs):
        raise error

    monkeypatch.setattr(replay_module, "replay", failing)
    code = main(["replay", str(corpus), "--text-col", "text", "--time-col", "year", "--store", str(tmp_path / "s"),
                 "--quiet", "--engine", "ray"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.startswith("streamtree replay: error: the Ray engine failed: ") and err.count("\n") == 1
    assert "check the arguments" not in err
    if kind == "task":
        assert "a worker raised ValueError: shape mismatch in the kernel" in err and "-vv" in err
    else:
        assert "ActorDiedError" in err and "run again" in err


def test_an_engine_that_cannot_run_the_sweeps_is_one_line_not_a_traceback(corpus, tmp_path, monkeypatch, capsys):
    """Shard actors that cannot be placed, keep dying or lost their connection raise the
    engine's own error, whose message says what to do: exit 1 with that line (it was shown as
    a traceback, like a bug)."""
    import streamtree.replay as replay_module
    from streamtree.engines.base import EngineFailure

    def failing(*args, **kwargs):
        raise EngineFailure("shard 0: sweep failed 4 times; giving up")

    monkeypatch.setattr(replay_module, "replay", failing)
    code = main(["replay", str(corpus), "--text-col", "text", "--time-col", "year", "--store", str(tmp_path / "s"),
                 "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and err == "streamtree replay: error: the engine failed: shard 0: sweep failed 4 times; giving up\n"


def test_multinomial_replay_and_evaluate_through_the_cli(corpus, tmp_path, capsys):
    """--likelihood multinomial: the store holds word distributions fitted on raw counts."""
    uri = str(tmp_path / "multi")
    assert main(["replay", str(corpus), "--text-col", "text", "--time-col", "year", "--id-col", "doc_id",
                 "--epoch", "10y", "--quiet", "--store", uri, "--likelihood", "multinomial", *FAST]) == 0
    store = SnapshotStore(uri)
    assert store.config()["replay"]["model"]["likelihood"] == "multinomial"
    assert store.vectorizer().norm is None  # raw counts
    for e in store.epochs():
        tree = store.read(e["epoch"]).tree
        assert tree.n_nodes >= 1 and tree.assignments.shape[0] > 0
        assert abs(tree.theta.sum(axis=1) - 1.0).max() < 1e-6  # word distributions (top entries kept)
    capsys.readouterr()
    rc = main(["evaluate", str(corpus), "--text-col", "text", "--time-col", "year", "--epoch", "10y",
               "--likelihood", "multinomial", "--variants", "dtssbp", "--max-depth", "2", "--repeats", "1",
               "--kappa0-grid", "100", "--sweeps", "2", "--max-features", "300", "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "multinomial likelihood" in out
    assert "dtssbp depth 2: kappa0=100, the only grid value, " in out
    assert main(["replay", str(corpus), "--text-col", "text", "--time-col", "year", "--store",
                 str(tmp_path / "g"), "--likelihood", "gaussian"]) == 2


def test_version_and_help_show_defaults(capsys):
    import streamtree

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"streamtree {streamtree.__version__}"
    from streamtree.cli import build_parser
    from streamtree.model import DTSSBP

    text = " ".join(build_parser()._subparsers._group_actions[0].choices["replay"].format_help().split())
    assert f"Gibbs sweeps per epoch (default: {DTSSBP().n_sweeps})" in text
    assert "(default: auto)" in text and "(default: 0.5)" in text and "(default: 10y)" in text


def test_python_m_streamtree_is_the_command():
    import streamtree

    out = subprocess.run([sys.executable, "-m", "streamtree", "--version"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"streamtree {streamtree.__version__}", out


def test_version_and_top_level_help_do_not_import_the_model():
    """``--version`` and ``--help`` print at once: no model, numba or scikit-learn import (the
    commands' options, whose defaults come from the estimator, are only built for a command)."""
    import streamtree
    from streamtree.cli import COMMAND_HELP

    probe = ("import sys; from streamtree.cli import main\n"
             "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
             "heavy = sorted(m for m in ('streamtree.model', 'numba', 'sklearn') if m in sys.modules)\n"
             "print('exit', code, 'imported', ','.join(heavy) or 'none')")
    for args, expect in ((["--version"], f"streamtree {streamtree.__version__}"),
                         (["-v", "--version"], f"streamtree {streamtree.__version__}"),
                         (["--help"], COMMAND_HELP["evaluate"])):
        out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=120)
        assert expect in " ".join(out.stdout.split()), out.stdout
        assert out.stdout.strip().endswith("exit 0 imported none"), out.stdout
    out = subprocess.run([sys.executable, "-c", probe, "show", "--help"], capture_output=True, text=True, timeout=120)
    assert "--top-words" in out.stdout and "exit 0" in out.stdout  # a command still gets its full parser


def test_every_option_of_every_command_names_its_default():
    """Options that take a value and are not required say what happens when they are not given,
    including defaults of 0 (which argparse's formatter would skip, since 0 == False)."""
    from streamtree.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    missing = []
    for name, parser in commands.items():
        helps = {a.dest: " ".join(parser._get_formatter()._expand_help(a).split())
                 for a in parser._actions if a.option_strings and a.help and a.nargs != 0 and not a.required}
        missing += [f"{name} {dest}: {text}" for dest, text in helps.items() if "default" not in text]
        assert all(a.help for a in parser._actions if a.option_strings), name
    assert not missing, missing
    show = {a.dest: a for a in commands["show"]._actions}
    assert "(default: 0)" in commands["show"]._get_formatter()._expand_help(show["min_docs"])


def test_show_into_a_closed_pipe_exits_quietly(store):
    import subprocess
    import sys

    proc = subprocess.run(f"{sys.executable} -m streamtree.cli show {store} --all | head -1", shell=True,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.startswith("epoch 0") and "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_tsv_source_with_format_and_delimiter(tmp_path, capsys):
    topics = ["congress treaty peace spain", "army navy frigate harbor", "tariff revenue debt treasury"]
    rows = ["year\ttext"] + [f"{1790 + i}\t{topics[i % 3]} {topics[(i + 1) % 3].split()[i % 4]}" for i in range(30)]
    path = tmp_path / "docs.txt"
    path.write_text("\n".join(rows) + "\n")
    args = ["replay", str(path), "--text-col", "text", "--time-col", "year", "--sweeps", "2", "--quiet",
            "--min-df", "1"]
    assert main(args + ["--store", str(tmp_path / "a")]) == 2  # unknown extension: the error names --format
    assert "--format" in capsys.readouterr().err
    assert main(args + ["--format", "tsv", "--store", str(tmp_path / "b")]) == 0
    assert "documents: 30 fitted of 30 records read" in capsys.readouterr().out
    assert main(args + ["--format", "csv", "--delimiter", "tab", "--store", str(tmp_path / "c")]) == 0


def test_an_epoch_header_counts_the_nodes_holding_its_documents():
    """Nodes alive only through the window's past documents are counted apart, so a tree of
    fading nodes does not read as a swarm."""
    import dataclasses
    from types import SimpleNamespace

    import numpy as np

    from streamtree.cli import format_epoch
    from test_store import make_tree

    tree = make_tree(3, [0, 1, 2, 3], [-1, 0, 0, 1], [0, 0, 1, 3], label="1850s")
    vocab = np.array([f"w{i}" for i in range(tree.theta.shape[1])])
    def head_of(t):  # the fields format_epoch reads of a stored epoch
        return format_epoch(SimpleNamespace(tree=t, top_words=[], theta_exact=True), vocab).splitlines()[0]

    head = head_of(tree)
    assert "4 nodes;" in head and "holding" not in head  # every node holds some (subtree counts >= 1)
    fading = dataclasses.replace(tree, subtree_counts=np.array([5, 5, 0, 3]), counts=np.array([0, 2, 0, 3]))
    assert fading.n_occupied == 3
    assert "4 nodes (3 holding them);" in head_of(fading)


def test_the_capped_view_does_not_fill_up_with_nodes_the_window_carries_empty():
    """A weekly epoch with one occupied leaf and nodes alive only through earlier weeks'
    documents: the default view shows the leaf with its ancestors and says how many nodes it
    left out, rather than listing the empty ones to fill its cap; ``--all`` lists them."""
    import dataclasses
    from types import SimpleNamespace

    import numpy as np

    from streamtree.cli import format_epoch
    from test_store import make_tree

    tree = make_tree(7, [0, 1, 2, 3, 4], [-1, 0, 0, 1, 2], [0, 1, 2, 3, 4], label="week 7")
    tree = dataclasses.replace(tree, counts=np.array([0, 0, 0, 4, 0]), subtree_counts=np.array([4, 4, 0, 4, 0]))
    vocab = np.array([f"w{i}" for i in range(tree.theta.shape[1])])
    stored = SimpleNamespace(tree=tree, top_words=[], theta_exact=True)

    def listed(text):  # the ids on the tree's lines (a relay chain's line lists several)
        return sorted(int(m) for line in text.splitlines() if re.search(r" docs? \(", line)
                      for m in re.findall(r"\[(\d+)\]", re.split(r" docs? \(", line)[0]))

    capped = format_epoch(stored, vocab, max_nodes=10)
    assert listed(capped) == [0, 1, 3]  # the occupied leaf 3 and its ancestors
    assert "(2 smaller or empty nodes not shown; --all shows every node)" in capped
    assert listed(format_epoch(stored, vocab, max_nodes=None)) == [0, 1, 2, 3, 4]
    # an empty node with an event this epoch (here: born) is still listed
    born_empty = SimpleNamespace(tree=dataclasses.replace(tree, born=np.array([0, 1, 7, 3, 4])), top_words=[],
                                 theta_exact=True)
    # (2 is a relay, no documents and one child: its line is that of 4, the empty leaf it leads to)
    assert listed(format_epoch(born_empty, vocab, max_nodes=10)) == [0, 1, 2, 3, 4]


def test_a_chain_of_empty_single_child_nodes_is_one_line():
    """Relays (no documents of their own, one child) are drawn on the line of the node they
    lead to, their ids and marks ahead of it, so no id is hidden and the subtree below is
    indented as if they were one node. A node with documents or two children is no relay."""
    import dataclasses
    from types import SimpleNamespace

    import numpy as np

    import pyarrow as pa

    from streamtree.cli import LEGEND, format_epoch
    from test_store import make_tree

    # 0 -> 1 -> 2 -> {3, 4}; 0 -> 5 -> 6 -> 7; 0 -> 8 (3 documents) -> 9; in depth-first order
    ids, parents = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [-1, 0, 1, 2, 2, 0, 5, 6, 0, 8]
    tree = make_tree(4, ids, parents, [0, 0, 0, 0, 4, 4, 4, 4, 0, 0], label="2004")
    counts = np.array([0, 0, 0, 6, 2, 0, 0, 5, 3, 1])
    subtree = np.array([17, 8, 8, 6, 2, 5, 5, 5, 4, 1])
    tree = dataclasses.replace(tree, counts=counts, subtree_counts=subtree)
    vocab = np.array([f"w{i}" for i in range(tree.theta.shape[1])])
    stored = SimpleNamespace(tree=tree, top_words=[[f"t{n}"] for n in ids], theta_exact=True)
    events = pa.table({"epoch": [4, 4], "node_id": [6, 1], "event": ["split_from", "parent_changed"],
                       "other_id": [2, 9]})  # as the store gives them
    text = format_epoch(stored, vocab, events=events, max_nodes=None)
    assert text.splitlines()[1:6] == [
        " [0] 17 docs (0 here): t0",
        "    ^[1] > [2] 8 docs (0 here): t2",            # 1 and 2 are relays: on 2's line, 2's words
        "         [3] 6 docs (6 here): t3",              # 2's children, one level below it
        "        *[4] 2 docs (2 here): t4",
        "    *[5] > <[6] > *[7] 5 docs (5 here) (6 split from 2): t7",  # every id keeps its mark
    ]
    assert text.splitlines()[6:8] == ["     [8] 4 docs (3 here): t8", "         [9] 1 doc (1 here): t9"]
    # capped, a relay on the way to a shown node is on that node's line, and counts as shown
    capped = format_epoch(stored, vocab, max_nodes=1)
    assert [line.split(" docs")[0].strip() for line in capped.splitlines()[1:3]] == ["[0] 17", "[1] > [2] 8"]
    assert "(6 smaller or empty nodes not shown" in capped  # 4, 5, 6, 7, 8, 9: 3 shown, with 0, 1, 2
    assert "[a] > [b]: a holds no documents of its own and b is its only child" in LEGEND
    # a node born by a split is counted among the born, said so, and listed under split: only
    tree = dataclasses.replace(make_tree(4, [0, 1, 2], [-1, 0, 0], [0, 4, 4], label="2004"),
                               counts=np.array([3, 2, 2]), subtree_counts=np.array([7, 2, 2]))
    stored = SimpleNamespace(tree=tree, top_words=[["t0"], ["t1"], ["t2"]], theta_exact=True)
    events = pa.table({"epoch": [4], "node_id": [2], "event": ["split_from"], "other_id": [0]})
    lines = format_epoch(stored, vocab[:tree.theta.shape[1]], events=events, max_nodes=None).splitlines()
    assert lines[0].endswith("; 2 born (1 by a split), 0 died, 1 split, 0 merged, 0 changed parent"), lines[0]
    assert "  born: [1] (t1)" in lines and "  split: [0] -> [2] (t2)" in lines, lines


def test_document_concentration_reaches_the_estimator(corpus, tmp_path):
    from streamtree.cli import _replay_config, build_parser, serve_config
    from streamtree.evaluate import EvaluationConfig

    parser = build_parser()
    src = ["--text-col", "text", "--time-col", "year"]
    args = parser.parse_args(["evaluate", str(corpus), *src, "--document-concentration", "auto"])
    assert EvaluationConfig(model=_replay_config(args).model).model_params()["document_concentration"] == "auto"
    args = parser.parse_args(["serve", str(tmp_path / "in"), "--store", str(tmp_path / "s"), *src,
                              "--document-concentration", "3.5"])
    assert serve_config(args).model["document_concentration"] == 3.5
    assert serve_config(args).duplicate_texts == "collapse"
    args = parser.parse_args(["serve", str(tmp_path / "in"), "--store", str(tmp_path / "s"), *src,
                              "--duplicate-texts", "reject"])
    assert serve_config(args).duplicate_texts == "reject"
    assert serve_config(args).identity()["duplicate_texts"] == "reject"
    args = parser.parse_args(["replay", str(corpus), *src, "--store", str(tmp_path / "r"), "--duplicate-texts",
                              "reject"])
    assert _replay_config(args).duplicate_texts == "reject"
    args = parser.parse_args(["replay", str(corpus), *src, "--store", str(tmp_path / "r"), "--duplicate-texts",
                              "collapse"])
    assert _replay_config(args).duplicate_texts == "collapse"
    args = parser.parse_args(["replay", str(corpus), *src, "--store", str(tmp_path / "r")])
    assert _replay_config(args).duplicate_texts == "collapse"
    assert "document_concentration" not in _replay_config(args).model  # unset: the estimator's default
    with pytest.raises(SystemExit):
        parser.parse_args(["replay", str(corpus), *src, "--store", "x", "--document-concentration", "-1"])
    # end to end: the replay fits bursty documents and records the setting
    uri = str(tmp_path / "store")
    assert main(["replay", str(corpus), *src, "--epoch", "10y", "--quiet", "--store", uri, *FAST,
                 "--document-concentration", "2.5"]) == 0
    assert SnapshotStore(uri).config()["replay"]["model"]["document_concentration"] == 2.5


def test_a_library_warning_reads_as_a_warning_line_with_what_to_do(tmp_path, capsys):
    words = ["war", "army", "navy", "peace", "trade", "bank", "tax", "farm", "ship", "port"]
    texts = [" ".join(c) for c in itertools.combinations(words, 3)][::3][:40]  # 40 distinct three-word texts
    rows = {"text": texts, "year": [1801] * 40}
    pq.write_table(pa.table(rows), tmp_path / "c.parquet")
    assert main(["replay", str(tmp_path / "c.parquet"), "--text-col", "text", "--time-col", "year", "--quiet",
                 "--store", str(tmp_path / "s"), "--sweeps", "2", "--max-df", "1.0"]) == 0
    err = capsys.readouterr().err
    assert "warning: these documents hold a median of fewer than 6 tokens" in err and "group short texts" in err
    assert "UserWarning" not in err and ".py:" not in err  # not Python's source location


def test_a_count_of_one_is_said_in_the_singular():
    """``1 doc``, ``1 node``, ``1 epoch``, ``1 term``: one rule (streamtree.wording) for every
    count the command line says, not ``1 docs``."""
    import dataclasses
    from types import SimpleNamespace

    import numpy as np

    from streamtree.cli import format_epoch, format_evolution
    from streamtree.replay import ReplaySummary
    from streamtree.wording import counted
    from test_store import make_tree

    assert [counted(1, "doc"), counted(0, "doc"), counted(2, "doc")] == ["1 doc", "0 docs", "2 docs"]
    assert counted(1, "leaf", "leaves") == "1 leaf" and counted(3, "leaf", "leaves") == "3 leaves"
    assert counted(np.int64(1), "node") == "1 node" and counted(1200, "epoch", spec=",") == "1,200 epochs"

    # 0 -> {1 (one document), 2 (none, a leaf)}; one document in the epoch
    tree = make_tree(3, [0, 1, 2], [-1, 0, 0], [0, 3, 0], n_docs=1, label="1850s")
    tree = dataclasses.replace(tree, counts=np.array([0, 1, 0]), subtree_counts=np.array([1, 1, 0]),
                               assignments=np.array([1]))
    vocab = np.array([f"w{i}" for i in range(tree.theta.shape[1])])
    stored = SimpleNamespace(tree=tree, top_words=[["a"], ["b"], ["c"]], theta_exact=True)
    text = format_epoch(stored, vocab, max_nodes=10)
    assert text.splitlines()[0].startswith("epoch 3 (1850s): 1 document, 3 nodes (2 holding them); 1 born, 0 died")
    assert "*[1] 1 doc (1 here): b" in text
    assert "(1 smaller or empty node not shown; --all shows every node)" in text
    assert "(1 node with fewer than 1 document not shown" in format_epoch(stored, vocab, min_docs=1)
    one = make_tree(3, [0], [-1], [3], n_docs=1)
    one = dataclasses.replace(one, counts=np.array([1]), subtree_counts=np.array([1]), assignments=np.array([0]))
    assert ": 1 document, 1 node; 1 born" in format_epoch(SimpleNamespace(tree=one, top_words=[["a"]],
                                                                          theta_exact=True), vocab)

    store = SimpleNamespace(events=lambda epoch: None)
    line = format_evolution(store, [{"epoch": 3, "label": "1850s", "n_nodes": 1}])
    assert line.startswith("evolution over 1 epoch (1850s .. 1850s): ")
    summary = ReplaySummary(n_epochs=1, n_published=1, n_documents=1, n_records=1, vocabulary_size=1,
                            seconds=1.0, fit_seconds=1.0).format()
    assert "documents: 1 fitted of 1 record read" in summary and "vocabulary: 1 term\n" in summary
    assert "1 document/s" not in summary  # a rate is per second, whatever its size


def test_a_node_that_merged_is_said_merged_not_also_died(tmp_path, capsys):
    """The store keeps a merged node's 'died' row beside its 'merged_into' (the data model: it is
    gone from the tree); show says how it ended once: merged into N, not died as well."""
    from streamtree.cli import format_lineage
    from test_report import hand_store

    # 0 -> {1, 2, 3}; then 2 merges into 0 and 3 dies
    store = hand_store(tmp_path / "store", [([0, 1, 2, 3], [-1, 0, 0, 0], [0, 3, 2, 1]),
                                            ([0, 1], [-1, 0], [1, 4], [(2, "merged_into", 0)])])
    assert {(e["node_id"], e["event"]) for e in store.events(1).to_pylist()} >= {(2, "died"), (2, "merged_into")}
    assert main(["show", store.uri]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("epoch 1 "))
    assert "1 died, 0 split, 1 merged" in head  # 3 died; 2 merged (and is not counted as died too)
    assert "  merged: [2] (t2) -> [0] (t0)" in out and "  died: [3] (t3)" in out
    assert "evolution over 2 epochs (2000 .. 2001): 4 born, 1 died, 0 split, 1 merged" in out
    lineage = format_lineage(store, 2)
    assert "merged into node 0 in epoch 1 (2001)" in lineage and "gone from" not in lineage
    assert "gone from epoch 1 (2001)" in format_lineage(store, 3)


def test_relay_changes_are_counted_apart_from_the_topics_events(tmp_path, capsys):
    """A relay (no documents of its own, one child) is drawn with its child: its birth, its end
    and a parent change that leaves a line where it was are no topic's. show counts them apart
    and does not list them; the other events are said as before."""
    from test_report import hand_store

    # 0 -> {1, 2 -> 3}: 2 a relay; then 2 merges into the root (3 now below the root), a relay 5
    # is born above 1, and 4 is born with documents of its own
    store = hand_store(tmp_path / "store", [([0, 1, 2, 3], [-1, 0, 0, 2], [1, 3, 0, 2]),
                                            ([0, 1, 3, 4, 5], [-1, 5, 0, 0, 0], [1, 3, 2, 2, 0],
                                             [(2, "merged_into", 0)])])
    kinds = {(e["node_id"], e["event"]) for e in store.events(1).to_pylist()}
    assert kinds == {(2, "died"), (2, "merged_into"), (4, "born"), (5, "born"), (1, "parent_changed"),
                     (3, "parent_changed")}  # the stored table keeps every event
    assert main(["show", store.uri]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("epoch 1 "))
    assert head.endswith("; 1 born, 0 died, 0 split, 0 merged, 0 changed parent (and 4 relay changes)")
    assert "  born: [4] (t4)" in out and "merged:" not in out and "died:" not in out
    assert " *[5] > ^[1] " in out  # every id keeps its mark (1 hangs below 5 now; its line is where it was)
    assert ("evolution over 2 epochs (2000 .. 2001): 4 born, 0 died, 0 split, 0 merged, 0 changed parent "
            "(and 5 relay changes)") in out


def test_a_topic_that_emptied_into_a_relay_ends_as_a_topic_in_show(tmp_path, capsys):
    """Node 1 holds documents, then none above its only child, then is gone: its end is a
    topic's death in every view of show, the whole run or its last epoch alone (which reads the
    earlier epochs to know that 1 had a line of its own)."""
    from test_report import hand_store

    store = hand_store(tmp_path / "store", [([0, 1, 2], [-1, 0, 1], [1, 4, 3]), ([0, 1, 2], [-1, 0, 1], [1, 0, 3]),
                                            ([0, 2], [-1, 0], [1, 3])])
    assert main(["show", store.uri]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("epoch 2 "))
    assert "; 0 born, 1 died, 0 split, 0 merged, 0 changed parent (and 1 relay change)" in head  # 2 re-hung
    assert "  died: [1]" in out
    assert "evolution over 3 epochs (2000 .. 2002): 3 born, 1 died, 0 split, 0 merged, 0 changed parent " \
           "(and 1 relay change)" in out
    assert main(["show", store.uri, "--epoch", "2002"]) == 0
    alone = capsys.readouterr().out
    assert "; 0 born, 1 died, 0 split, 0 merged, 0 changed parent (and 1 relay change)" in alone
    assert "  died: [1]" in alone


def test_a_node_that_ended_is_named_by_the_words_it_had_at_its_peak(tmp_path, capsys):
    """A node's last epoch may hold only a few leftover documents, whose words say little: a
    death or merge names the node by remembered words where there are some (show remembers
    each node's words from the epoch its subtree held the most documents), else by its last."""
    from streamtree.cli import format_epoch
    from test_report import hand_store

    store = hand_store(tmp_path / "store", [([0, 1, 2, 3], [-1, 0, 0, 0], [0, 3, 2, 1]),
                                            ([0, 1], [-1, 0], [1, 4], [(2, "merged_into", 0)])])
    before, now = store.read(0), store.read(1)
    text = format_epoch(now, store.vocabulary(), events=store.events(1), previous=before,
                        remembered={3: ["election", "vote"]})
    assert "  died: [3] (election vote)" in text and "  merged: [2] (t2) -> [0] (t0)" in text
    assert main(["show", store.uri]) == 0 and "  died: [3] (t3)" in capsys.readouterr().out


def test_unspaced_terms_reach_the_vectoriser_and_the_identity(corpus, tmp_path):
    """``--unspaced-terms`` sets how replay, serve and evaluate read Chinese and Japanese; the
    default is not recorded in a store's identity (stores written before it still match), and
    another value is, so a resume with it is told apart."""
    from streamtree.cli import _replay_config, build_parser, serve_config
    from streamtree.replay import identity_differences

    parser = build_parser()
    src = ["--text-col", "text", "--time-col", "year"]
    plain = _replay_config(parser.parse_args(["replay", str(corpus), *src, "--store", "r"]))
    runs = _replay_config(parser.parse_args(["replay", str(corpus), *src, "--store", "r", "--unspaced-terms", "runs"]))
    assert plain.vectorizer().unspaced_terms == "bigrams" and runs.vectorizer().unspaced_terms == "runs"
    assert "unspaced_terms" not in plain.identity() and runs.identity()["unspaced_terms"] == "runs"
    assert identity_differences(plain.identity(), runs.identity()) == "unspaced_terms: None in the store, 'runs' now"
    ev = _replay_config(parser.parse_args(["evaluate", str(corpus), *src, "--unspaced-terms", "runs"]))
    assert ev.vectorizer().unspaced_terms == "runs"
    served = serve_config(parser.parse_args(["serve", str(tmp_path / "in"), "--store", str(tmp_path / "s"), *src,
                                             "--unspaced-terms", "runs"]))
    assert served.vectorizer().unspaced_terms == "runs" and served.identity()["unspaced_terms"] == "runs"
    with pytest.raises(SystemExit):
        parser.parse_args(["replay", str(corpus), *src, "--store", "r", "--unspaced-terms", "words"])
    # end to end: the store's vocabulary keeps whole runs
    uri = str(tmp_path / "store")
    assert main(["replay", str(corpus), *src, "--epoch", "10y", "--quiet", "--store", uri, *FAST,
                 "--unspaced-terms", "runs"]) == 0
    from connectors.stores import SnapshotStore

    assert SnapshotStore(uri).vectorizer().unspaced_terms == "runs"


@pytest.mark.parametrize("flags, level", [([], logging.INFO), (["-v"], logging.INFO), (["-vv"], logging.DEBUG)])
def test_serve_logs_progress_by_default_and_debug_lines_only_at_vv(flags, level, tmp_path, monkeypatch, capsys):
    """A service logs its progress anyway; -v must not turn on every sweep's debug line."""
    import streamtree.service

    levels = []
    monkeypatch.setattr(streamtree.service, "configure_logging", lambda fmt, lvl: levels.append(lvl))
    # a poll interval of 0 is refused right after logging is set up, before anything is read
    # (in one line, or at -vv with its traceback)
    argv = [*flags, "serve", str(tmp_path / "landing"), "--store", str(tmp_path / "store"),
            "--text-col", "text", "--time-col", "time", "--poll-interval", "0"]
    if level == logging.DEBUG:
        with pytest.raises(Exception, match="--poll-interval must be positive"):
            main(argv)
    else:
        assert main(argv) == 2
        assert "--poll-interval must be positive" in capsys.readouterr().err
    assert levels == [level]
