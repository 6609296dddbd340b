"""Is a lumped planted topic a preference of the target or a miss of the split proposals?

Corpus: the first epoch of :func:`streamtree.synthetic.planted_dirichlet_tree` (as
``bench_planted.py``: V 2,000, 5,000 documents). Model: ``DTSSBP`` at its defaults but
``max_depth=3``. After the last sweep's exact moves, every model node that holds 20 or more
documents of a true node and of one of its true children ("lumped") is examined in that state:

1. **The target.** The sampler's own log target ratio (collapsed prior and marginals, the split
   node's parameter as the moves treat it; no proposal terms) of the oracle split that moves
   the true child's documents to a new node, as a new child of the lumped node and as a new
   sibling of it (a new child of its parent). Positive: the target prefers the true split.
2. **The proposal.** ``--launches`` launches from the oracle's place (a new child of the lumped
   node), with ``i`` drawn among the parent's documents and ``j`` among the child's, at each
   number of restricted scans in ``--scans``: the median size of the proposed new node against
   the true child's, and the mean acceptance probability, ``min(1, exp(log ratio))`` with the
   launch's proposal terms and the draw probabilities of the pair and of the reverse merge (the
   place's draw excepted: the oracle fixes it). At the depth cap there is no new child: "-". The baseline in
   the same run is the oracle itself: a launch that found the true child would propose its
   size and be accepted at the target's ratio.

Nothing is changed in the chain: the examination reads the moves' state and rejects every
proposal it scores (the moves' module functions are swapped while it runs and restored).

Usage: python bench/bench_split_oracle.py [--seed 0] [--likelihood multinomial] [--scans 3,10,30]
       [--launches 30]
"""

from __future__ import annotations

import argparse
import contextlib
import time

import numpy as np

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from streamtree.inference import split_merge
from streamtree.inference.epoch_sampler import EpochSampler
from streamtree.inference.split_merge import SplitMerge, SplitPlaces
from streamtree.model import DTSSBP
from streamtree.synthetic import planted_dirichlet_tree
from streamtree.text import reference_length

from bench_planted import model_input

MIN_GROUP = 20


def last_moves(X, likelihood: str, seed: int):
    """Fit ``X`` as one epoch; the moves' state and moves after the last sweep's exact moves."""
    captured = []
    exact = EpochSampler._split_merge

    def keep(self, rows, *args):
        out = exact(self, rows, *args)
        if self.sweep == self.settings.n_sweeps - 1:
            captured.append(out)
        return out

    EpochSampler._split_merge = keep
    try:
        DTSSBP(likelihood=likelihood, max_depth=3, random_state=seed).partial_fit(X, epoch=0)
    finally:
        EpochSampler._split_merge = exact
    return captured[-1]


@contextlib.contextmanager
def scored_not_taken(moves: SplitMerge, place: tuple, allocation=None):
    """While open: every split draws ``place``, its allocation is ``allocation(others)`` when
    given (else the launch's), every proposal is rejected, and the last split's log ratios are
    recorded in the yielded dict (``target``: without the proposal terms; ``ratio``: with the
    launch's, the place's draw excepted) with the new node's size."""
    seen: dict[str, float] = {}
    exact_ratio, exact_probs, exact_uniform = SplitMerge._log_ratio, split_merge.launch_probabilities, \
        split_merge._log_uniform

    def ratio(self, st, split, a, b, pl, docs, log_prior, log_place, log_q, *rest, **kw):
        out = exact_ratio(self, st, split, a, b, pl, docs, log_prior, log_place, log_q, *rest, **kw)
        seen.update(ratio=out + log_place, target=out + log_place + log_q, size=docs.n)
        return out

    SplitMerge._log_ratio = ratio
    moves.places = lambda *args: SplitPlaces([[place]])
    split_merge._log_uniform = lambda rng: np.inf
    if allocation is not None:
        split_merge.launch_probabilities = lambda log_odds, eps: allocation
    try:
        yield seen
    finally:
        SplitMerge._log_ratio = exact_ratio
        split_merge.launch_probabilities = exact_probs
        split_merge._log_uniform = exact_uniform
        del moves.places


def lumped(labels: np.ndarray, truth: np.ndarray, true_parent: np.ndarray) -> list[tuple[int, int, int]]:
    """(model node, true parent, true child) for each model node holding ``MIN_GROUP`` or more
    documents of a true node and of one of its true children."""
    out = []
    for a in np.unique(labels).tolist():
        held, n = np.unique(truth[labels == a], return_counts=True)
        big = set(held[n >= MIN_GROUP].tolist())
        out.extend((a, int(true_parent[c]), c) for c in sorted(big) if true_parent[c] in big)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--likelihood", default="multinomial")
    p.add_argument("--scans", default="3,10,30", help="restricted scans of the launches (comma-separated)")
    p.add_argument("--launches", type=int, default=30, help="launches per lumped pair and scan count")
    args = p.parse_args()
    corpus = planted_dirichlet_tree(np.random.default_rng(args.seed), n_features=2000, n_documents=5000, n_epochs=1)
    X = model_input(corpus.counts[0], args.likelihood, reference=reference_length(corpus.counts[0]))
    t0 = time.process_time()
    st, moves = last_moves(X, args.likelihood, args.seed)
    print(f"== planted tree, seed {args.seed}, epoch 0: DTSSBP(likelihood={args.likelihood!r}, max_depth=3) "
          f"({time.process_time() - t0:.1f} s CPU)")
    truth, true_parent, labels, tree = np.asarray(corpus.labels[0]), np.asarray(corpus.parent), st.labels, st.tree
    pairs = lumped(labels, truth, true_parent)
    if not pairs:
        print("   no model node holds a true node and one of its children")
        return
    scans = [int(s) for s in args.scans.split(",")]
    print("   oracle: the true child's documents moved to a new node, log target ratio; launches from that "
          "place: median new-node size, mean acceptance probability")
    print(f"   {'node':>5} {'docs':>5} {'true child (docs)':>18} {'as child':>9} {'as sibling':>11}  "
          + "  ".join(f"{s:>2} scans: size, accept" for s in scans))
    for a, parent, child in pairs:
        rows = np.flatnonzero(labels == a)
        moved, kept = rows[truth[rows] == child], rows[truth[rows] == parent]
        i, j = int(kept[0]), int(moved[0])
        others = rows[(rows != i) & (rows != j)]
        oracle = []
        for P in (a, tree.parent[a] if a != 0 else None):
            if P is None or tree.at_cap(P):
                oracle.append(float("nan"))
                continue
            with scored_not_taken(moves, ("new", P, len(tree.children[P]), 0),
                                  np.isin(others, moved).astype(np.float64)) as seen:
                moves._split(st, a, i, j, np.random.default_rng(0), 0, "launch")
            oracle.append(seen.get("target", float("nan")))
        cells = []
        for n_scans in (scans if not tree.at_cap(a) else []):
            moves.launch_scans = n_scans
            rng = np.random.default_rng(args.seed)
            sizes, accept = [], []
            with scored_not_taken(moves, ("new", a, len(tree.children[a]), 0)) as seen:
                for _ in range(args.launches):
                    seen.clear()
                    moves._split(st, a, int(rng.choice(kept)), int(rng.choice(moved)), rng, 0, "launch")
                    if "ratio" in seen:
                        size = int(seen["size"])
                        pair = (moves._log_select_merge(len(moves.index(st).rows) + 1, len(tree.children[a]) + 1,
                                                        size, rows.size - size)
                                - moves._log_select_split(labels.size, rows.size))
                        sizes.append(size)
                        accept.append(min(1.0, float(np.exp(min(seen["ratio"] + pair, 0.0)))))
            cells.append(f"{np.median(sizes):>9.0f}, {np.mean(accept):6.2f}" if sizes else f"{'-':>17}")
        shown = [f"{v:.1f}" if np.isfinite(v) else "-" for v in oracle]
        print(f"   {a:>5} {rows.size:>5} {child:>10} ({moved.size:>4}) {shown[0]:>9} {shown[1]:>11}  "
              + ("  ".join(cells) if cells else "(at the depth cap)"))


if __name__ == "__main__":
    main()
