"""The ingestion service: memory over 200 epochs, ingest throughput, landing-to-publish latency.

Part 1 (bounded memory, throughput): 200 daily JSONL files of ``--docs`` documents each land
at once; one ``--once`` service run (warm-up vocabulary, depth 2, ``--sweeps`` sweeps) takes
them all and publishes 200 epochs. Resident memory (RSS) is sampled after every commit; the
script prints it every 20 epochs and the slope over the last 150 epochs. Throughput: rows per
second for the whole service run and for its ingest path alone (read, hash, normalise,
bucket), next to the baseline measured in the same run: a replay of the same folder (same
model settings and vocabulary), and the replay's source reading the folder.

Part 2 (latency): a live service (poll interval ``--poll``) while one file per second lands for
``--live`` days. For each published epoch: seconds from the landing of the file that closed it
(the next day's) to the publish, and from the landing of the epoch's own newest file.

Usage: python bench/bench_service.py [--docs 50] [--sweeps 5] [--live 15] [--poll 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from connectors.landing import LandingZone, read_landed
from connectors.sources import open_source
from streamtree.epochs import Bucketer
from streamtree.replay import ReplayConfig, replay
from streamtree.service import ServeConfig, Service

TOPICS = [["tax", "budget", "revenue", "treasury", "debt", "spending", "deficit", "bank"],
          ["army", "navy", "war", "troops", "defense", "enemy", "soldier", "fleet"],
          ["school", "education", "teacher", "student", "college", "learning", "child", "book"],
          ["farm", "crop", "harvest", "land", "rural", "farmer", "wheat", "cattle"],
          ["rail", "road", "canal", "bridge", "transport", "port", "freight", "station"]]
COMMON = ["the", "policy", "nation", "people", "year", "state", "law", "public"]


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def write_day(folder: str, day: int, n: int) -> str:
    rng = np.random.default_rng(day)
    t0 = np.datetime64("2026-01-01T00:00") + np.timedelta64(day, "D")
    path = f"{folder}/day{day:04d}.jsonl"
    tmp = f"{folder}/.day{day:04d}.jsonl"
    with open(tmp, "w") as f:
        for _ in range(n):
            k = rng.integers(len(TOPICS))
            words = rng.choice(TOPICS[k], size=10).tolist() + rng.choice(COMMON, size=4).tolist()
            t = t0 + np.timedelta64(int(rng.integers(0, 24 * 60)), "m")
            f.write(json.dumps({"text": " ".join(words), "time": f"{t}Z"}) + "\n")
    os.replace(tmp, path)
    return path


class MeasuredService(Service):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.rss: list[float] = []
        self.closer_latency: list[float] = []
        self._closer_ns = None

    def _take(self, landed):
        self._closer_ns = landed.ready_ns
        super()._take(landed)

    def _commit(self, fitted, fit_s):
        super()._commit(fitted, fit_s)
        self.rss.append(_rss_mib())
        if self._closer_ns is not None:
            self.closer_latency.append(time.time() - self._closer_ns / 1e9)


def _config(land, store, sweeps, **kw):
    model = dict(max_depth=2, n_sweeps=sweeps)
    return ServeConfig(landing=land, store=store, text_col="text", time_col="time", epoch="1d", model=model,
                       poll_interval=0.05, **kw)


def part1(tmp: str, docs: int, sweeps: int) -> None:
    land = f"{tmp}/land"
    os.makedirs(land)
    for d in range(200):
        write_day(land, d, docs)
    rows = 200 * docs
    print(f"== 200 daily files x {docs} documents = {rows} rows; depth 2, {sweeps} sweeps per epoch")

    # baseline 1: the replay source reading the folder
    w0 = time.perf_counter()
    src = open_source(land, "text", "time")
    n = sum(b.num_rows for b in src)
    src_s = time.perf_counter() - w0
    # the service's ingest path alone: read whole, hash, normalise, bucket
    zone = LandingZone(land, settle=0)
    w0 = time.perf_counter()
    b = Bucketer("1d")
    for f in zone.poll():
        r = read_landed(zone.fs, f, text_col="text", time_col="time")
        b.add(r.rows)
    ing_s = time.perf_counter() - w0
    print(f"ingest path:   {rows / ing_s:9.0f} rows/s  (read + hash + normalise + bucket, {ing_s:.2f}s)")
    print(f"baseline:      {n / src_s:9.0f} rows/s  (replay's source reading the folder, {src_s:.2f}s)")

    # baseline 2: a replay of the folder; then the service with that replay's vocabulary
    w0, c0 = time.perf_counter(), _cpu()
    replay(ReplayConfig(source=land, text_col="text", time_col="time", epoch="1d",
                        model=dict(max_depth=2, n_sweeps=sweeps), min_df=1), f"{tmp}/replay")
    rep_w, rep_c = time.perf_counter() - w0, _cpu() - c0
    svc = MeasuredService(_config(land, f"{tmp}/store", sweeps, vocabulary_from=f"{tmp}/replay", idle_timeout=1e-3))
    w0, c0 = time.perf_counter(), _cpu()
    svc.run(once=True, install_signals=False)
    svc_w, svc_c = time.perf_counter() - w0, _cpu() - c0
    print(f"service:       {rows / svc_w:9.0f} rows/s wall, {rows / svc_c:6.0f} rows/s CPU  "
          f"({svc_w:.1f}s wall, {svc_c:.1f}s CPU, {len(svc.rss)} epochs published)")
    print(f"baseline:      {rows / rep_w:9.0f} rows/s wall, {rows / rep_c:6.0f} rows/s CPU  "
          f"(replay of the same folder: {rep_w:.1f}s wall, {rep_c:.1f}s CPU); "
          f"service/replay CPU ratio {svc_c / rep_c:.2f}")
    rss = np.asarray(svc.rss)
    print("RSS (MiB) after epoch: " + ", ".join(f"{i + 1}: {rss[i]:.0f}" for i in range(0, len(rss), 20))
          + f", {len(rss)}: {rss[-1]:.0f}")
    tail = np.arange(50, len(rss))
    slope = np.polyfit(tail, rss[50:], 1)[0] if len(tail) > 2 else float("nan")
    print(f"RSS slope over epochs 51-{len(rss)}: {slope * 1024:+.1f} KiB per epoch "
          f"(min {rss[50:].min():.0f}, max {rss[50:].max():.0f} MiB)")


def part2(tmp: str, docs: int, sweeps: int, days: int, poll: float) -> None:
    land = f"{tmp}/live"
    os.makedirs(land)
    write_day(land, 0, docs)
    write_day(land, 1, docs)
    replay(ReplayConfig(source=land, text_col="text", time_col="time", epoch="1d",
                        model=dict(max_depth=2, n_sweeps=sweeps), min_df=1), f"{tmp}/live-vocab")
    shutil.rmtree(land)
    os.makedirs(land)
    cfg = _config(land, f"{tmp}/live-store", sweeps, vocabulary_from=f"{tmp}/live-vocab")
    cfg.poll_interval = poll
    svc = MeasuredService(cfg)
    th = threading.Thread(target=svc.run, kwargs={"install_signals": False})
    th.start()
    time.sleep(10)  # start-up (imports, numba)
    for d in range(days):
        write_day(land, d, docs)
        time.sleep(1.0)
    deadline = time.time() + 30
    while time.time() < deadline and svc.summary.epochs_published < days - 1:
        time.sleep(0.1)
    svc.request_stop()
    th.join(60)
    lat = np.asarray(svc.closer_latency)
    hist = svc.metrics.latency
    total = sum(s.value for m in hist.collect() for s in m.samples if s.name.endswith("_sum"))
    count = sum(s.value for m in hist.collect() for s in m.samples if s.name.endswith("_count"))
    print(f"== live: one file per second for {days} days, poll {poll}s, {docs} docs per file")
    print(f"closing file landed -> epoch published: median {np.median(lat):.2f}s, max {lat.max():.2f}s "
          f"over {lat.size} epochs (poll interval {poll}s + stability poll {poll}s + fit + commit)")
    print(f"epoch's own newest file landed -> published: mean {total / max(count, 1):.2f}s "
          f"(includes waiting for the next day's file to move the watermark)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=50)
    ap.add_argument("--sweeps", type=int, default=5)
    ap.add_argument("--live", type=int, default=15)
    ap.add_argument("--poll", type=float, default=0.5)
    ap.add_argument("--skip-live", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        part1(tmp, args.docs, args.sweeps)
        if not args.skip_live:
            part2(tmp, args.docs, args.sweeps, args.live, args.poll)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
