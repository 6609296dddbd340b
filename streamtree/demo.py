"""Demo (``python -m streamtree.demo``, what ``make run`` executes).

Replays the bundled State of the Union corpus (25,488 paragraphs, 1790-2018) decade by
decade into a snapshot store under ``runs/sotu/`` and prints the evolving topic trees.

The text pipeline runs at the defaults every command uses (the vocabulary cap chosen from the
corpus size, English and reporting stop words, ``min_df``/``max_df``); the model settings it
changes are the ones it prints as ``streamtree replay`` flags (depth 3, kappa0 100, a stick
window of 1 decade and 10 sweeps per decade, chosen to finish in a few minutes on one core).
Pass ``--sweeps``, ``--kappa0``, ``--max-features``, ``--window`` to change them; ``--store``
to write elsewhere. It prints each decade's largest nodes and what changed, and ends by
writing the HTML report of the store (``--report``, default ``runs/sotu-report.html``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq

from streamtree.cli import LEGEND, _max_features, format_epoch, format_evolution
from streamtree.progress import ReplayProgress
from streamtree.replay import ReplayConfig, replay
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
    p.add_argument("--sweeps", type=int, default=10)
    p.add_argument("--kappa0", type=float, default=100.0)
    p.add_argument("--max-features", type=_max_features, default=DEFAULT_MAX_FEATURES)
    p.add_argument("--window", type=int, default=1)
    p.add_argument("--max-depth", type=int, default=3)
    p.add_argument("--nodes", type=int, default=6, help="largest nodes printed per decade")
    p.add_argument("--top-words", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", default="runs/sotu-report.html",
                   help="HTML report written at the end (default runs/sotu-report.html)")
    p.add_argument("--likelihood", default=None, help="vmf or multinomial (default: the model's)")
    args = p.parse_args(argv)
    data = Path(args.data)
    if not data.exists():
        print(f"demo: {data} not found (the corpus ships with the repository under examples/data/)",
              file=sys.stderr)
        return 2
    model = dict(window=args.window, max_depth=args.max_depth, kappa0=args.kappa0, n_sweeps=args.sweeps,
                 random_state=args.seed)
    if args.likelihood is not None:
        model["likelihood"] = args.likelihood
    config = ReplayConfig(source=str(data), text_col="text", time_col=_time_column(data), epoch="10y",
                          time_unit="year" if _time_column(data) == "year" else "auto",
                          max_features=args.max_features, top_words=args.top_words, model=model)
    os.makedirs(args.store, exist_ok=True)
    flags = (f"--epoch 10y --max-depth {args.max_depth} --kappa0 {args.kappa0:g} --window {args.window} "
             f"--sweeps {args.sweeps}" + ("" if args.max_features == DEFAULT_MAX_FEATURES
                                          else f" --max-features {args.max_features}"))
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
    previous = None
    entries = store.epochs()
    for entry in entries:
        stored = store.read(entry["epoch"])
        print(format_epoch(stored, vocab, top_words=args.top_words, events=store.events(entry["epoch"]),
                           max_nodes=args.nodes, previous=previous, max_ids=4))
        previous = stored
    print()
    print(format_evolution(store, entries))
    print(f"({LEGEND})")
    print(f"store: {args.store}  (browse it with: streamtree show {args.store} --epoch 1860s, "
          f"or follow a node with --node ID)")
    from streamtree.report import write_report

    report = write_report(store, args.report)
    print(f"report: {report.resolve()}  (open it in a browser; it needs no network)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
