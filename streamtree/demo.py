"""Demo (``python -m streamtree.demo``, what ``make run`` executes).

Replays the bundled State of the Union corpus (25,488 paragraphs, 1790-2018) decade by
decade into a snapshot store under ``runs/sotu/`` and prints the evolving topic trees.

Settings are chosen to finish in a few minutes on one core (about 2 minutes of CPU time
measured for the 24 decades) while giving a readable tree:
a 2,000-term vocabulary (terms in at least 5 paragraphs and at most half of them),
depth 3, kappa0 = 100 (children may move well away from their parent; kappa0 = 1e4 gives
many near-duplicate nodes and a slower run), a stick window of 1 decade and 10 Gibbs sweeps
per decade. Pass ``--sweeps``, ``--kappa0``, ``--max-features``, ``--window`` or
``--decades`` to change them; ``--store`` to write elsewhere. It ends by writing the HTML
report of the store (``--report``, default ``runs/sotu-report.html``) and printing its path.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq

from streamtree.cli import format_epoch
from streamtree.replay import ReplayConfig, replay, stderr_progress

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
    p.add_argument("--max-features", type=int, default=2000)
    p.add_argument("--window", type=int, default=1)
    p.add_argument("--max-depth", type=int, default=3)
    p.add_argument("--min-docs", type=int, default=15, help="hide nodes with fewer documents when printing")
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
                          time_unit="year" if _time_column(data) == "year" else "auto", min_df=5, max_df=0.5,
                          max_features=args.max_features, top_words=args.top_words, model=model)
    os.makedirs(args.store, exist_ok=True)
    print(f"replaying {data.name} by decade into {args.store} "
          f"({config.model_params()['likelihood']}, depth {args.max_depth}, kappa0 {args.kappa0:g}, {args.max_features} terms, "
          f"window {args.window}, {args.sweeps} sweeps per decade)", flush=True)
    summary = replay(config, args.store, mode="overwrite", progress=stderr_progress())
    print(summary.format())
    print()
    from connectors.stores.snapshot import SnapshotStore

    store = SnapshotStore(args.store)
    vocab = store.vocabulary()
    for entry in store.epochs():
        print(format_epoch(store.read(entry["epoch"]), vocab, top_words=args.top_words, min_docs=args.min_docs,
                           events=store.events(entry["epoch"])))
        print()
    print(f"store: {args.store}  (browse it with: streamtree show {args.store} --epoch 1860s, "
          f"or follow a node with --node ID)")
    from streamtree.report import write_report

    report = write_report(store, args.report)
    print(f"report: {report.resolve()}  (open it in a browser; it needs no network)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
