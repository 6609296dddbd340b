"""The report page in a real headless Chromium: no errors, no network, the figures hold the
store's counts of nodes and epochs, and a screenshot that is not blank."""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np
import pytest

from streamtree.relays import relay_chains
from streamtree.report import ReportOptions, read_store, report_data, write_report
from streamtree.report.headless import HeadlessChromium, find_chromium
from test_report import build_store  # tests/ is on sys.path under pytest

pytestmark = [
    pytest.mark.browser,
    # in CI (.ci/run installs chromium) a missing browser fails the tests instead of skipping them
    pytest.mark.skipif(find_chromium() is None and not os.environ.get("CI"),
                       reason="no Chromium on this machine: run `make browser` (apt-get install chromium)"),
]


def decode_png(png: bytes) -> np.ndarray:
    """An 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes) as an (h, w, channels) array."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        body = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    w, h, bits, colour, _, _, interlace = header
    assert bits == 8 and colour in (2, 6) and interlace == 0
    ch = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, 1 + w * ch)
    out = np.zeros((h, w * ch), dtype=np.int32)
    prev = np.zeros(w * ch, dtype=np.int32)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        cur = np.zeros(w * ch, dtype=np.int32)
        if f in (0, 2):
            cur = (line + (prev if f == 2 else 0)) % 256
        else:  # sub, average, Paeth depend on the pixel to the left: go pixel by pixel
            for x in range(w * ch):
                a = cur[x - ch] if x >= ch else 0
                b, c = prev[x], prev[x - ch] if x >= ch else 0
                if f == 1:
                    pred = a
                elif f == 3:
                    pred = (a + b) // 2
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                cur[x] = (line[x] + pred) % 256
        out[y] = cur
        prev = cur
    return out.reshape(h, w, ch)[:, :, :3].astype(np.uint8)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = tmp_path_factory.mktemp("report-browser")
    store = build_store(root / "store")
    options = ReportOptions(thresholds=(0.0, 0.02, 0.06, 0.12, 0.3))
    path = write_report(store, root / "report.html", options)
    data = report_data(read_store(store), options)
    with HeadlessChromium(width=1280, height=900) as browser:
        load = browser.load(path)
        yield store, data, browser, load


def plot_data(browser, div: str):
    """The plotly traces a div holds, as drawn (numbers and strings only)."""
    return browser.evaluate(
        f"JSON.parse(JSON.stringify(document.getElementById({div!r}).data.map(t => ({{"
        "type: t.type, meta: t.meta || null, ids: t.ids || null, labels: t.labels || null, parents: t.parents || null, "
        "x: t.x || null, y: t.y || null}))))")


def test_page_opens_without_errors_or_network(page):
    _, _, _, load = page
    assert load.errors == []
    assert load.requests == []
    assert load.ready_ms > 0


def test_evolution_holds_the_bands_and_epochs(page):
    store, data, browser, _ = page
    ev = data["evolution"]
    default = ev["layouts"][ev["default"]]
    traces = plot_data(browser, "evolution")
    assert sum(t["meta"] and t["meta"]["kind"] == "band" for t in traces) == default["n_bands"]
    ticks = browser.evaluate("document.getElementById('evolution').layout.xaxis.ticktext")
    assert ticks == [e["label"] for e in store.epochs()]  # one column per epoch
    n_ids = len(set(data["nodes"]["id"]))
    # the threshold control: the finest layout shows one band per node id
    browser.evaluate("(() => { const s = document.getElementById('threshold'); s.value = '0';"
                     " s.dispatchEvent(new Event('change')); return 1; })()")
    traces = plot_data(browser, "evolution")
    bands = [t for t in traces if t["meta"] and t["meta"]["kind"] == "band"]
    assert len(bands) == n_ids == ev["layouts"][0]["n_bands"]
    assert {t["meta"]["node"] for t in bands} == set(data["nodes"]["id"])
    hover = next(t for t in traces if t["meta"] and t["meta"]["kind"] == "hover")
    relays = sum(len(b.get("relay", [])) for b in ev["layouts"][0]["bands"])  # hovered with the node below
    assert len(hover["x"]) == len(data["nodes"]["id"]) - relays  # every other node of every epoch
    marks = {t["meta"]["event"]: len(t["x"]) for t in traces if t["meta"] and t["meta"]["kind"] == "event"}
    drawn = ev["layouts"][0]["marks"]
    assert marks == {kind: len(m["x"]) for kind, m in drawn.items()} and marks["split_from"] == 1
    assert sum(len(i) for i in drawn["born"]["i"]) == data["summary"]["event_counts"]["born"]
    assert browser.evaluate("document.getElementById('threshold').options.length") == len(ev["layouts"])


def test_epoch_tree_holds_each_epochs_nodes(page):
    store, _, browser, _ = page
    for i, e in enumerate(store.epochs()):
        browser.evaluate(f"(() => {{ const s = document.getElementById('epoch'); s.value = '{i}';"
                         " s.dispatchEvent(new Event('change')); return 1; })()")
        (trace,) = plot_data(browser, "epoch-tree")
        assert trace["type"] == "icicle" and trace["meta"]["epoch"] == i
        # one box per node, a relay chain's in the box of the node it leads to, named in its label
        nodes = store.nodes(e["epoch"])
        chains = relay_chains(*(nodes.column(c).to_numpy() for c in ("id", "parent", "count")))
        relays = {r for chain in chains.values() for r in chain}
        assert sorted(int(x[1:]) for x in trace["ids"]) == sorted(set(nodes.column("id").to_pylist()) - relays)
        for box, label, parent in zip(trace["ids"], trace["labels"], trace["parents"]):
            path = [*chains.get(int(box[1:]), ()), int(box[1:])]
            assert label.split(": ")[0] == " › ".join(map(str, path))
            assert parent == "" or int(parent[1:]) not in relays
    assert browser.evaluate("document.getElementById('epoch').options.length") == len(store.epochs())
    for chart in ("treemap", "sunburst", "icicle"):
        browser.evaluate(f"(() => {{ const s = document.getElementById('epoch-chart'); s.value = '{chart}';"
                         " s.dispatchEvent(new Event('change')); return 1; })()")
        assert plot_data(browser, "epoch-tree")[0]["type"] == chart
    browser.evaluate("document.getElementById('epoch-prev').click() || 1")
    assert browser.evaluate("document.getElementById('epoch').value") == str(len(store.epochs()) - 2)
    assert browser.errors() == []


def test_lineage_and_summary_and_dendrograms(page):
    store, data, browser, _ = page
    lineage = store.lineage()
    nid = max(lineage, key=lambda n: len(lineage[n].epochs))
    browser.evaluate(f"(() => {{ document.getElementById('node-id').value = '{nid}';"
                     " document.getElementById('node-show').click(); return 1; })()")
    rows = browser.evaluate("document.querySelectorAll('#lineage-table tr').length")
    died = 0 if lineage[nid].died is None else 1
    assert rows == 1 + len(lineage[nid].epochs) + died  # header, one row per epoch alive, its death
    share = next(t for t in plot_data(browser, "lineage-plot") if t["meta"] and t["meta"]["kind"] == "lineage-share")
    assert sum(v is not None for v in share["y"]) == len(lineage[nid].epochs)
    docs = next(t for t in plot_data(browser, "documents-plot") if t["meta"] and t["meta"]["kind"] == "documents")
    assert docs["y"] == [e["n_documents"] for e in store.epochs()]
    (segments, _) = plot_data(browser, "dendrogram")
    assert segments["meta"]["leaves"] == data["static"][0]["n_leaves"] == store.read(1).tree.n_nodes
    reasons = browser.evaluate("[...document.querySelectorAll('#rejects-table td')].map(td => td.textContent)")
    assert reasons == ["empty text", "2", "unparsable time", "1"]
    # links in the lineage lead to other nodes' lineages
    parent = browser.evaluate("(() => { const a = document.querySelector('#lineage-section a.node');"
                              " const id = a.textContent; a.click(); return id; })()")
    assert browser.evaluate("document.getElementById('node-id').value") == parent
    assert browser.errors() == []


def test_screenshot_is_not_blank(page, tmp_path):
    _, _, browser, _ = page
    browser.evaluate("window.scrollTo(0, 0) || 1")
    png = browser.screenshot()
    img = decode_png(png)
    assert img.shape[:2] == (900, 1280)
    not_white = np.any(img < 245, axis=2).mean()
    colours = np.unique(img.reshape(-1, 3)[::7], axis=0).shape[0]
    assert not_white > 0.2, f"only {not_white:.1%} of the screenshot is not white"
    assert colours > 50, f"only {colours} colours in the screenshot"


def texts(browser, selector: str) -> list[str]:
    return browser.evaluate(f"[...document.querySelectorAll({selector!r})].map(e => e.textContent)")


def test_a_count_of_one_reads_in_the_singular(tmp_path):
    """One epoch, one node holding one document, one reject: the page says '1 epoch', '1 node',
    '1 document', '1 band' (not '1 epochs', ...), in its key figures, notes, options and hovers."""
    from test_report import hand_store

    store = hand_store(tmp_path / "store", [([0], [-1], [1])], rejects=["empty text"])
    path = write_report(store, tmp_path / "report.html")
    with HeadlessChromium(width=1280, height=900) as browser:
        load = browser.load(path)
        assert load.errors == []
        figures = texts(browser, "#key-figures .figure")
        for said in ("1epoch", "1document", "1rejected record", "1node id", "1node over all epochs", "1birth",
                     "0deaths"):
            assert said in figures, figures
        assert browser.evaluate("document.getElementById('evolution-note').textContent") == \
            "1 band shown, 0 nodes folded"
        assert texts(browser, "#threshold option") == ["0.00% (1 band)"]
        assert browser.evaluate("document.getElementById('epoch-note').textContent") == \
            "1 node, 1 document, 1 born, 0 died, 0 merged, 1 reject"
        hover = next(t for t in plot_data(browser, "evolution") if t["meta"] and t["meta"]["kind"] == "hover")
        assert "1 document in the band" in browser.evaluate(
            "document.getElementById('evolution').data.find(t => t.meta && t.meta.kind === 'hover').text[0]")
        assert len(hover["x"]) == 1
        box = browser.evaluate("document.getElementById('epoch-tree').data[0].text[0]")
        assert "1 document in the subtree" in box and "1 at the node" in box
        head = browser.evaluate("document.getElementById('lineage-head').textContent")
        assert "alive in 1 of 1 epoch." in head
        assert browser.errors() == []


def test_a_node_that_merged_ends_as_merged_not_also_died(tmp_path):
    """Node 2 merges into 1 (the store also has its 'died' row), node 3 dies: 2's lineage ends
    with one row, 'merged into 1'; the evolving tree marks 2's end with the merge alone."""
    from test_report import hand_store

    store = hand_store(tmp_path / "store", [([0, 1, 2, 3], [-1, 0, 0, 0], [1, 3, 2, 1]),
                                            ([0, 1], [-1, 0], [1, 6], [(2, "merged_into", 1)])])
    path = write_report(store, tmp_path / "report.html")
    with HeadlessChromium(width=1280, height=900) as browser:
        assert browser.load(path).errors == []
        for nid, end in ((2, "merged into 1"), (3, "died")):
            browser.evaluate(f"(() => {{ document.getElementById('node-id').value = '{nid}';"
                             " document.getElementById('node-show').click(); return 1; })()")
            rows = browser.evaluate("[...document.querySelectorAll('#lineage-table tr')].slice(1)"
                                    ".map(tr => tr.lastElementChild.textContent)")
            assert rows == ["born", end], (nid, rows)
        marks = browser.evaluate("document.getElementById('evolution').data.filter(t => t.meta && t.meta.kind === "
                                 "'event').map(t => [t.meta.event, t.customdata])")
        ends = {kind: ids for kind, ids in marks if kind in ("died", "merged_into")}
        assert ends == {"died": [3], "merged_into": [2]}
        assert browser.evaluate("document.getElementById('epoch-next').click() || "
                                "document.getElementById('epoch-note').textContent").endswith(
            "0 born, 1 died, 1 merged, 0 rejects")
        assert browser.errors() == []


def test_relay_changes_are_said_apart_on_the_page(tmp_path):
    """The relay 2 merges into the root and a relay 5 is born above 1: the key figures, the
    epoch's note and the events table count them as relay changes, not as a merge and a birth;
    their marks are still drawn."""
    from test_report import hand_store

    store = hand_store(tmp_path / "store", [([0, 1, 2, 3], [-1, 0, 0, 2], [1, 3, 0, 2]),
                                            ([0, 1, 3, 4, 5], [-1, 5, 0, 0, 0], [1, 3, 2, 2, 0],
                                             [(2, "merged_into", 0)])])
    path = write_report(store, tmp_path / "report.html")
    with HeadlessChromium(width=1280, height=900) as browser:
        assert browser.load(path).errors == []
        figures = texts(browser, "#key-figures .figure")
        assert "4births" in figures and "0merges" in figures and "5relay changes" in figures, figures
        events = texts(browser, "#events-table td")
        assert events[:10] == ["born", "4", "died", "0", "split from", "0", "merged into", "0", "parent changed", "0"]
        assert events[10].startswith("relay changes") and events[11] == "5"
        assert browser.evaluate("document.getElementById('epoch-next').click() || "
                                "document.getElementById('epoch-note').textContent").endswith(
            "1 born, 0 died, 0 merged, 4 relay changes, 0 rejects")
        marks = browser.evaluate("document.getElementById('evolution').data.filter(t => t.meta && "
                                 "t.meta.kind === 'event').map(t => t.meta.event)")
        assert "merged_into_root" in marks  # the relay's merge is still marked
        assert browser.errors() == []


def test_an_empty_node_with_children_is_drawn_as_a_visible_band(tmp_path):
    """The root holds no documents and has two children: its band (grey, at the top of the
    column) is a few pixels high on the screen, not a line of no height."""
    from streamtree.report.data import ROOT_COLOUR
    from test_report import hand_store

    store = hand_store(tmp_path / "store", [([0, 1, 2], [-1, 0, 0], [0, 6, 4]), ([0, 1, 2], [-1, 0, 0], [0, 5, 5])])
    path = write_report(store, tmp_path / "report.html")
    with HeadlessChromium(width=1280, height=900) as browser:
        assert browser.load(path).errors == []
        browser.evaluate("document.getElementById('evolution').scrollIntoView() || 1")
        # the plot area on the page, and the middle of the first column in it
        x, y, h = browser.evaluate(
            "(() => { const d = document.getElementById('evolution'), r = d.getBoundingClientRect(),"
            " s = d._fullLayout._size, xa = d._fullLayout.xaxis;"
            " return [scrollX + r.left + s.l + xa.l2p(0), scrollY + r.top + s.t, s.h]; })()")
        img = decode_png(browser.screenshot(clip=(int(x) - 2, int(y), 5, int(h))))
        grey = np.array([int(ROOT_COLOUR[i:i + 2], 16) for i in (1, 3, 5)])
        rows = np.abs(img[:, 2, :].astype(int) - grey).max(axis=1) <= 6
        assert rows[: int(0.05 * h)].sum() >= 4, f"{rows[: int(0.05 * h)].sum()} grey rows at the top of the column"
        assert browser.errors() == []


def test_a_merge_into_the_root_is_a_mark_without_a_line_across_the_view(tmp_path):
    """2 merges into the root and 3 into 1: 3's merge is joined to 1's band by a dotted line,
    2's is a mark of its own ('merged into the root', in the legend) with no line to the root's
    band at the top."""
    from test_report import hand_store

    store = hand_store(tmp_path / "store", [([0, 1, 2, 3], [-1, 0, 0, 0], [1, 3, 2, 1]),
                                            ([0, 1], [-1, 0], [2, 5], [(2, "merged_into", 0), (3, "merged_into", 1)])])
    path = write_report(store, tmp_path / "report.html")
    with HeadlessChromium(width=1280, height=900) as browser:
        assert browser.load(path).errors == []
        traces = browser.evaluate(
            "document.getElementById('evolution').data.filter(t => t.meta && t.meta.kind.startsWith('event'))"
            ".map(t => ({kind: t.meta.kind, event: t.meta.event, name: t.name || null, ids: t.customdata || null,"
            " text: t.text || null, x: t.x}))")
        marks = {t["event"]: t for t in traces if t["kind"] == "event"}
        lines = [t for t in traces if t["kind"] == "event-line"]
        assert marks["merged_into"]["ids"] == [3] and marks["merged_into_root"]["ids"] == [2]
        assert marks["merged_into_root"]["name"] == "merged into the root"
        assert marks["merged_into_root"]["text"] == ["node 2 merged into the root (node 0) (2001)"]
        assert [t["event"] for t in lines] == ["merged_into"] and len(lines[0]["x"]) == 3  # one segment, to 1
        events = texts(browser, "#events-table td")
        assert events == ["born", "4", "died", "0", "split from", "0", "merged into", "2", "parent changed", "0"]
        assert browser.errors() == []
