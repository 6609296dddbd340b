"""Report size and page open time for the SOU store (24 epochs) and a 1,000-epoch store.

    python bench/bench_report.py [--sou runs/sotu] [--long runs/bench-report-1000] [--trials 3]

The SOU store is the demo's (made with ``make run``; built here if missing). The first 1,000-epoch
store is fitted here once (and reused): 1,000 epochs of 40-120 documents each, drawn from 30
planted word topics whose weights follow a random walk (topics fade out and come back, so
nodes are born and die), fitted by the dTSSBP at the demo's kind of settings (depth 3,
kappa0 100, window 2, 3 sweeps per epoch) and published epoch by epoch; its trees are small
(about 4 nodes per epoch). The second, "wide", has about 80 nodes per epoch from a random
evolving tree (see :func:`wide_store`), to load the report with 80,000 node-epochs.

For each store it prints the time to build the report (CPU), the file size (and how much of
it is plotly.js), and the page's open time in headless Chromium: navigation start to every
figure drawn (the page's own ``performance.now()``), median of ``--trials`` fresh browsers.
The baseline, measured in the same browsers, is a page holding only plotly.js: what any
plotly report pays before drawing anything.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from connectors.stores import SnapshotStore  # noqa: E402
from streamtree.report import ReportOptions, read_store, render, report_data  # noqa: E402
from streamtree.report.headless import HeadlessChromium  # noqa: E402
from streamtree.report.html import plotly_js  # noqa: E402

LONG_EPOCHS = 1000


def sou_store(path: Path) -> SnapshotStore:
    store = SnapshotStore(str(path))
    if len(store.epochs()) < 24:
        from streamtree import demo

        print(f"building the SOU store in {path} (the demo's replay) ...", flush=True)
        with contextlib.redirect_stdout(io.StringIO()):
            demo.main(["--store", str(path), "--report", str(path.parent / "sotu-report.html")])
    return store


def long_store(path: Path) -> SnapshotStore:
    """A 1,000-epoch store of fitted dTSSBP trees on drifting planted topics (see the docs)."""
    from streamtree.model import DTSSBP

    store = SnapshotStore(str(path))
    if len(store.epochs()) == LONG_EPOCHS:
        return store
    if store.epochs():
        store.fs.delete_dir_contents(store.root)
    print(f"fitting the {LONG_EPOCHS}-epoch store in {path} ...", flush=True)
    rng = np.random.default_rng(0)
    p, k, own, doc_len = 600, 30, 50, 24
    words = np.asarray([f"term{i}" for i in range(p)])
    topics = np.stack([rng.choice(p, size=own, replace=False) for _ in range(k)])
    log_w = rng.normal(scale=1.5, size=k)
    model = DTSSBP(likelihood="vmf", window=2, max_depth=3, kappa0=100.0, n_sweeps=3, random_state=0)
    store.set_config({"bench": "drifting planted topics", "epochs": LONG_EPOCHS, "terms": p, "topics": k})
    start = time.process_time()
    for t in range(LONG_EPOCHS):
        log_w += rng.normal(scale=0.25, size=k)
        w = np.exp(log_w - log_w.max())
        w /= w.sum()
        n = int(rng.integers(40, 121))
        z = rng.choice(k, size=n, p=w)
        cols = [np.unique(np.concatenate([topics[z[i], rng.integers(0, own, size=doc_len)],
                                          rng.integers(0, p, size=4)])) for i in range(n)]
        indptr = np.concatenate([[0], np.cumsum([c.size for c in cols])])
        X = sp.csr_matrix((rng.poisson(1.0, size=indptr[-1]) + 1.0, np.concatenate(cols), indptr), shape=(n, p))
        X = sp.csr_matrix(sp.diags(1.0 / np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())) @ X)
        model.partial_fit(X, epoch=t, label=f"day {t}")
        tree = model.trees_[-1]
        store.publish(tree, [f"{t}-{i}" for i in range(n)], top_words=tree.top_words(words, 8), label=f"day {t}")
        if (t + 1) % 100 == 0:
            print(f"  {t + 1} epochs, {time.process_time() - start:.0f} s CPU", flush=True)
    model.close()
    return store


def wide_store(path: Path) -> SnapshotStore:
    """A 1,000-epoch store of large trees (about 80 nodes per epoch), made without fitting:
    a random evolving tree where nodes die (their children move to the grandparent), are
    born under random nodes, and share 200-400 documents per epoch. It stresses the report's
    size and drawing, not the model."""
    from streamtree.epoch_tree import EpochTree

    store = SnapshotStore(str(path))
    if len(store.epochs()) == LONG_EPOCHS:
        return store
    if store.epochs():
        store.fs.delete_dir_contents(store.root)
    print(f"making the {LONG_EPOCHS}-epoch wide store in {path} ...", flush=True)
    rng = np.random.default_rng(1)
    vocab = np.asarray([f"word{i}" for i in range(3000)])
    parent = {0: -1}
    born = {0: 0}
    weight = {0: 1.0}
    next_id = 1
    for _ in range(79):
        parent[next_id] = int(rng.choice(list(parent)))
        born[next_id], weight[next_id] = 0, float(rng.gamma(1.0))
        next_id += 1
    store.set_config({"bench": "random evolving tree", "epochs": LONG_EPOCHS})
    for t in range(LONG_EPOCHS):
        died = [n for n in parent if n != 0 and rng.random() < 0.02]
        for n in died:
            for c in [c for c, q in parent.items() if q == n]:
                parent[c] = parent[n]
            del parent[n], weight[n]
        for _ in range(int(rng.poisson(1.6))):
            parent[next_id] = int(rng.choice(list(parent)))
            born[next_id], weight[next_id] = t, float(rng.gamma(1.0))
            next_id += 1
        for n in weight:
            weight[n] *= float(np.exp(rng.normal(scale=0.2)))
        order, stack = [], [0]  # depth-first, children by id
        kids: dict[int, list[int]] = {}
        for c, q in sorted(parent.items()):
            kids.setdefault(q, []).append(c)
        depth = {0: 0}
        while stack:
            n = stack.pop()
            order.append(n)
            for c in reversed(kids.get(n, [])):
                depth[c] = depth[n] + 1
                stack.append(c)
        ids = np.asarray(order, dtype=np.int64)
        w = np.asarray([weight[n] for n in order])
        n_docs = int(rng.integers(200, 401))
        assign = rng.choice(ids, size=n_docs, p=w / w.sum())
        counts = np.asarray([(assign == n).sum() for n in order], dtype=np.int64)
        sub = counts.copy()
        pos = {n: i for i, n in enumerate(order)}
        for n in reversed(order[1:]):
            sub[pos[parent[n]]] += sub[pos[n]]
        k = ids.size
        tree = EpochTree(epoch=t, node_ids=ids, parent=np.asarray([parent[n] for n in order], dtype=np.int64),
                         depth=np.asarray([depth[n] for n in order], dtype=np.int64), mass=w / w.sum() * 0.9,
                         counts=counts, subtree_counts=sub, window_counts=counts, theta=np.eye(k, 8),
                         concentration=np.ones(k), born=np.asarray([born[n] for n in order], dtype=np.int64),
                         assignments=assign, label=f"day {t}")
        words = [list(rng.choice(vocab, size=8, replace=False)) for _ in range(k)]
        store.publish(tree, [f"{t}-{i}" for i in range(n_docs)], top_words=words, label=f"day {t}")
    return store


def open_time(path: Path, warm_up: Path) -> tuple[float, float, list[str]]:
    """Wall ms (the page's own navigation-to-drawn time) and CPU s (all Chromium processes)
    of opening ``path`` in a fresh browser that has first opened a tiny page (so start-up
    is not counted, and nothing of ``path`` is cached)."""
    with HeadlessChromium(timeout=120) as browser:
        browser.load(warm_up)
        c0 = browser.cpu_seconds()
        load = browser.load(path)
        cpu = browser.cpu_seconds() - c0
    return load.ready_ms, cpu, load.errors + [f"network: {u}" for u in load.requests]


def open_times(path: Path, baseline: Path, warm_up: Path, trials: int):
    report_ms, base_ms, report_cpu, base_cpu, errors = [], [], [], [], []
    for _ in range(trials):
        ms, cpu, errs = open_time(baseline, warm_up)
        base_ms.append(ms)
        base_cpu.append(cpu)
        ms, cpu, errs = open_time(path, warm_up)
        report_ms.append(ms)
        report_cpu.append(cpu)
        errors += errs
    return report_ms, base_ms, report_cpu, base_cpu, errors


def save_screenshot(page: Path, out: Path, width: int = 1200) -> None:
    """The page's header and evolving tree, as a PNG (quantised with pngquant when present)."""
    import shutil
    import subprocess

    with HeadlessChromium(width=width, height=900) as browser:
        load = browser.load(page)
        if load.errors:
            raise RuntimeError(f"the page has errors: {load.errors[:2]}")
        bottom = browser.evaluate("document.getElementById('evolution').getBoundingClientRect().bottom + scrollY")
        out.write_bytes(browser.screenshot(clip=(0, 0, width, int(bottom) + 8)))
    if shutil.which("pngquant"):
        subprocess.run(["pngquant", "--force", "--skip-if-larger", "--output", str(out), "64", str(out)], check=False)
    print(f"  screenshot: {out} ({out.stat().st_size / 1e3:.0f} kB)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sou", default="runs/sotu")
    ap.add_argument("--long", default="runs/bench-report-1000")
    ap.add_argument("--wide", default="runs/bench-report-1000-wide")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--screenshot", help="also save a PNG of the top of the SOU page here (the README picture)")
    args = ap.parse_args()
    os.chdir(ROOT)  # store paths are relative to the checkout (the page shows the path it was given)
    js = plotly_js()
    tmp = Path(tempfile.mkdtemp(prefix="bench-report-"))
    baseline = tmp / "plotly-only.html"
    baseline.write_text("<!DOCTYPE html><html><head><script>" + js + "</script></head><body><script>"
                        "document.body.dataset.ready = String(Math.round(performance.now()));</script></body></html>")
    warm_up = tmp / "warm-up.html"
    warm_up.write_text("<!DOCTYPE html><html><body><script>document.body.dataset.ready = '1';</script></body></html>")
    print(f"plotly.js: {len(js.encode()) / 1e6:.2f} MB")
    rows = []
    stores = (("SOU", sou_store(Path(args.sou))), (f"{LONG_EPOCHS} epochs, fitted", long_store(Path(args.long))),
              (f"{LONG_EPOCHS} epochs, wide trees", wide_store(Path(args.wide))))
    for name, store in stores:
        entries = store.epochs()
        t0 = time.process_time()
        data = report_data(read_store(store), ReportOptions())
        page = render(data)
        cpu = time.process_time() - t0
        path = tmp / f"{name.replace(' ', '-').replace(',', '')}.html"
        path.write_text(page, encoding="utf-8")
        size = path.stat().st_size / 1e6
        ms, base, cpu_page, cpu_base, errors = open_times(path, baseline, warm_up, args.trials)
        ev = data["evolution"]
        lay = ev["layouts"][ev["default"]]
        print(f"\n{name}: {len(entries)} epochs, {sum(e['n_nodes'] for e in entries)} nodes over all epochs, "
              f"{data['summary']['n_node_ids']} node ids")
        print(f"  evolving tree: {ev['n_columns']} columns ({ev['per_column']} epochs each), default threshold "
              f"{lay['threshold']:.2%} shows {lay['n_bands']} bands; thresholds offered "
              + ", ".join(f"{x['threshold']:.2%} ({x['n_bands']})" for x in ev["layouts"]))
        print(f"  report built in {cpu:.2f} s CPU; file {size:.2f} MB ({size - len(js.encode()) / 1e6:.2f} MB "
              f"besides plotly.js)")
        print(f"  page open (navigation to all figures drawn), median of {args.trials}: "
              f"{statistics.median(ms) / 1000:.2f} s wall, {statistics.median(cpu_page):.2f} s CPU (all Chromium "
              f"processes); plotly.js-only page: {statistics.median(base) / 1000:.2f} s wall, "
              f"{statistics.median(cpu_base):.2f} s CPU; report wall times {[round(x / 1000, 2) for x in ms]}")
        if errors:
            print(f"  ERRORS: {errors[:3]}")
        rows.append((name, size, statistics.median(ms) / 1000, statistics.median(cpu_page),
                     statistics.median(base) / 1000, statistics.median(cpu_base)))
        if args.screenshot and name == "SOU":
            save_screenshot(path, Path(args.screenshot))
    print("\nstore | file MB | open s wall | open s CPU | plotly.js-only: s wall | s CPU")
    for r in rows:
        print(f"{r[0]} | {r[1]:.2f} | {r[2]:.2f} | {r[3]:.2f} | {r[4]:.2f} | {r[5]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
