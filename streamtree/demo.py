"""Demo (``python -m streamtree.demo``, what ``make run`` executes).

Replays the bundled State of the Union corpus (25,488 paragraphs, 1790-2026) decade by
decade into a snapshot store under ``runs/sotu/`` and prints the evolving topic trees.

The text pipeline and the model run at the defaults every command uses (the vocabulary cap
chosen from the corpus size, English and reporting stop words; the model's link strength,
stick window, depth and sweeps): the demo is the same as the ``streamtree replay`` command it
prints. ``--sweeps``, ``--kappa0``, ``--window``, ``--max-depth``, ``--max-features`` and
``--likelihood`` change them (and are then printed as flags); ``--store`` writes elsewhere. It
prints each decade's largest nodes and what changed, and ends by writing the HTML report of
the store (``--report``, default ``runs/sotu-report.html``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq

from streamtree.cli import LEGEND, _kappa0, _max_features, format_epochs, format_evolution
from streamtree.progress import ReplayProgress
from streamtree.replay import REPLAY_SEED, ReplayConfig, replay
from streamtree.text import DEFAULT_MAX_FEATURES

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "sotu_paragraphs.parquet"


def _time_column(path: Path) -> str:
    names = pq.read_schema(path).names
    for name in ("year", "date"):
        if name in names:
            return name
    raise SystemExit(f"{path}: neither a 'year' nor a 'date' column; columns present: {', '.join(names)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m streamtree.demo", description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(DATA), help="the SOU paragraphs Parquet file")
    p.add_argument("--store", default="runs/sotu", help="snapshot store directory (default runs/sotu)")
    p.add_argument("--sweeps", type=int, default=None, help="Gibbs sweeps per decade (default: the model's)")
    p.add_argument("--kappa0", type=_kappa0, default=None, help="link strength (default: the model's)")
    p.add_argument("--window", type=int, default=None, help="stick window in decades (default: the model's)")
    p.add_argument("--max-depth", type=int, default=None, help="deepest node depth (default: the model's)")
    p.add_argument("--max-features", type=_max_features, default=DEFAULT_MAX_FEATURES,
                   help="vocabulary cap (default: chosen from the corpus size)")
    p.add_argument("--nodes", type=int, default=6, help="largest nodes printed per decade")
    p.add_argument("--top-words", type=int, default=8, help="words printed per node (default 8)")
    p.add_argument("--seed", type=int, default=REPLAY_SEED, help=f"random seed (default {REPLAY_SEED})")
    p.add_argument("--report", default="runs/sotu-report.html",
                   help="HTML report written at the end (default runs/sotu-report.html)")
    p.add_argument("--likelihood", default=None, help="vmf or multinomial (default: the model's)")
    args = p.parse_args(argv)
    data = Path(args.data)
    if not data.exists():
        print(f"demo: {data} not found (the corpus ships with the repository under examples/data/)",
              file=sys.stderr)
        return 2
    given = dict(n_sweeps=args.sweeps, kappa0=args.kappa0, window=args.window, max_depth=args.max_depth,
                 likelihood=args.likelihood)
    model = {k: v for k, v in given.items() if v is not None}
    model["random_state"] = args.seed
    config = ReplayConfig(source=str(data), text_col="text", time_col=_time_column(data), epoch="10y",
                          time_unit="year" if _time_column(data) == "year" else "auto",
                          max_features=args.max_features, model=model)
    os.makedirs(args.store, exist_ok=True)
    names = dict(n_sweeps="--sweeps", kappa0="--kappa0", window="--window", max_depth="--max-depth",
                 likelihood="--likelihood")
    flags = " ".join(["--epoch 10y"] + [f"{names[k]} {v:g}" if isinstance(v, float) else f"{names[k]} {v}"
                                         for k, v in model.items() if k in names])
    if args.max_features != DEFAULT_MAX_FEATURES:
        flags += f" --max-features {args.max_features}"
    if args.seed != REPLAY_SEED:
        flags += f" --seed {args.seed}"
    print(f"replaying {data.name} by decade into {args.store}; the same as:\n"
          f"  streamtree replay {data} --text-col text --time-col {config.time_col} {flags} "
          f"--store {args.store} --overwrite", flush=True)
    progress = ReplayProgress()
    try:
        summary = replay(config, args.store, mode="overwrite", progress=progress)
    finally:
        progress.close()
    print(summary.format())
    print()
    from connectors.stores.snapshot import SnapshotStore

    store = SnapshotStore(args.store)
    vocab = store.vocabulary()
    entries = store.epochs()
    for text in format_epochs(store, entries, vocab, top_words=args.top_words, max_nodes=args.nodes, max_ids=4):
        print(text)
    print()
    print(format_evolution(store, entries))
    print(f"({LEGEND})")
    middle = entries[len(entries) // 2]["label"]  # an epoch the store holds, whatever the data
    print(f"store: {args.store}  (browse it with: streamtree show {args.store} --epoch {middle}, "
          f"or follow a node with --node ID)")
    from streamtree.report import write_report

    report = write_report(store, args.report)
    print(f"report: {report.resolve()}  (open it in a browser; it needs no network)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
