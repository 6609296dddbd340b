"""Right-sized trees and stable ids on a planted evolving tree (the targets of issue 9).

Corpus: :func:`streamtree.synthetic.planted_dirichlet_tree`, a generator that is not the
model's own: 31 hierarchical-Dirichlet topics of depth 3, documents of 30-100 tokens, one
leaf dying and one child born at each later epoch, every node drifting slightly. With
``--generator mixture``: :func:`streamtree.synthetic.planted_topic_mixture`, a second family
built differently (no Dirichlet links): 5 branches of 4 leaves whose word distributions mix a
Zipf background, the branch's topic and their own, documents at the leaves only, log-normal
lengths (median 50 tokens), drift by mixing in fresh words; its options set the branch share,
how skewed the leaf masses are and the median length.

Model: ``DTSSBP`` at its defaults except ``max_depth`` (and ``likelihood``); vMF input is the
product's row form for term frequencies (:func:`streamtree.text.weighted_rows`: unit rows times
each document's weight, its token count over the first epoch's median to the power
``--length-power``, by default the product's), multinomial input the raw counts. Baseline in the
same run: scikit-learn's ``KMeans`` given the true number of nodes of the epoch, on the
L2-normalised term frequencies.

Figures per epoch, with their targets:

* nodes holding >= 1% of the epoch's documents (their own documents, not their subtree's),
  model / truth, target within 0.67-1.5x;
* adjusted Rand index against the true node of each document, target >= k-means's;
* ids kept: map every true node to the model node holding most of its documents in each
  epoch; a true node alive (with documents) in epochs t-1 and t keeps its id when both maps
  give the same model id. Target >= 80% of those true nodes. Printed below the table: the
  number of distinct model ids they map to, and how many kept ids are one-to-one (no other
  surviving true node maps to that model id), since a model that lumps everything into one
  node would keep every id trivially;
* the share of the epoch's documents held by nodes below the 1% line (a swarm of small
  nodes lowers ARI without changing the node count), and the mean token count of those
  documents against the others;
* CPU seconds of the epoch's ``partial_fit`` and of k-means.

Printed below the table, per epoch and over the seeds: whether the model's top-level branches
(the subtrees below the root's children) group the true nodes as the true tree does, over the
pairs of true nodes that map to two different model nodes: how many pairs from different true
branches the model joins in one branch (unrelated topics under a common parent), and how many
pairs from one true branch it keeps in one. ``--generator mixture --leaves-per-branch 1`` gives
a flat truth, where every pair is in different branches.

Usage: python bench/bench_planted.py [--sizes 2000x5000[,V x N ...]] [--all-sizes]
       [--generator dirichlet|mixture] [--branch-share 0.3] [--mass-concentration 3] [--median-length 50]
       [--branches 5] [--leaves-per-branch 4]
       [--likelihood vmf[,multinomial]] [--max-depth 3] [--epochs 3] [--sweeps N]
       [--seed 0 | --seeds 0-7] [--chain-offset 0[,1000,2000]] [--length-power 0.5]
       [--split-node fixed|integrated]

With ``--seeds``, each seed's table is followed by the figures over the seeds: targets met in
all, and mean +- sd over the seeds of ARI, node ratio (all epochs and epoch 0) and ids kept.
Two chains of equal quality differ by up to 0.1 in ARI, so a change to the model is judged over
several seeds (8 or more), not one. Over 8 seeds a count of targets still moves by 2-7 of 64 with
the chain alone: ``--chain-offset 0,1000,2000`` runs every seed at three chains (same corpora)
and ends with the spread over the chains, the yardstick for a change.
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score
from sklearn.preprocessing import normalize

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from streamtree.model import DTSSBP
from streamtree.synthetic import planted_dirichlet_tree, planted_topic_mixture
from streamtree.text import DEFAULT_LENGTH_POWER, reference_length, weighted_rows

ISSUE_SIZE = "2000x5000"
OTHER_SIZES = "5000x10000,20000x20000"
RATIO_RANGE = (0.67, 1.5)
KEEP_TARGET = 0.8


def model_input(counts: sp.csr_matrix, likelihood: str, length_power: float = DEFAULT_LENGTH_POWER,
                reference: float | None = None) -> sp.csr_matrix:
    """What each likelihood fits: weighted unit term frequencies for vMF (``reference``: the
    length of weight 1), token counts otherwise."""
    if likelihood == "vmf":
        return weighted_rows(counts, length_power=length_power, reference=reference)
    return counts.astype(np.float64)


def big_nodes(labels: np.ndarray, share: float = 0.01) -> int:
    """Number of distinct labels holding at least ``share`` of the rows."""
    _, n = np.unique(labels, return_counts=True)
    return int(np.sum(n >= share * labels.size))


def in_small_nodes(labels: np.ndarray, share: float = 0.01) -> np.ndarray:
    """Mask of the rows whose label holds fewer than ``share`` of the rows."""
    _, inverse, n = np.unique(labels, return_inverse=True, return_counts=True)
    return n[inverse] < share * labels.size


def majority_map(true: np.ndarray, found: np.ndarray) -> dict[int, int]:
    """Each true label -> the found label holding most of its rows (smallest id on ties)."""
    pairs, n = np.unique(np.stack([true, found]), axis=1, return_counts=True)
    out: dict[int, int] = {}
    best: dict[int, int] = {}
    for (t, f), c in zip(pairs.T.tolist(), n.tolist()):
        if c > best.get(t, 0):
            best[t], out[t] = c, f
    return out


def top_branches(parent: dict[int, int]) -> dict[int, int]:
    """Each node id -> the root's child its branch hangs from (the root -> itself)."""
    out: dict[int, int] = {}
    for node in parent:
        g = node
        while parent[g] >= 0 and parent[parent[g]] >= 0:
            g = parent[g]
        out[node] = g
    return out


def branch_agreement(true_parent: dict[int, int], model_parent: dict[int, int],
                     mapping: dict[int, int]) -> tuple[int, int, int, int]:
    """Whether the model's top-level branches group the true nodes as the truth does, over the
    pairs of true nodes (not the root) that map to two different model nodes: (pairs in
    different true branches that the model puts in one branch, such pairs; pairs in one true
    branch that the model keeps in one branch, such pairs). A model node at the root is in no
    branch. Unrelated topics joined under one empty parent show in the first figure, a lost
    hierarchy in the second."""
    true_top, model_top = top_branches(true_parent), top_branches(model_parent)
    nodes = sorted(t for t in mapping if true_parent.get(t, -1) >= 0)
    joined = apart = kept = together = 0
    for a, b in itertools.combinations(nodes, 2):
        ma, mb = mapping[a], mapping[b]
        if ma == mb:
            continue
        one_branch = (model_parent.get(ma, -1) >= 0 and model_parent.get(mb, -1) >= 0
                      and model_top[ma] == model_top[mb])
        if true_top[a] == true_top[b]:
            together += 1
            kept += one_branch
        else:
            apart += 1
            joined += one_branch
    return joined, apart, kept, together


def ids_kept(prev: dict[int, int], now: dict[int, int]) -> tuple[int, int, int, int]:
    """Between two epochs' majority maps: (kept, surviving, distinct model ids the survivors map
    to now, kept one-to-one), where a kept id counts one-to-one when no other survivor maps to
    the same model id in either epoch."""
    surviving = sorted(set(prev) & set(now))
    kept = [j for j in surviving if prev[j] == now[j]]
    users_prev = np.bincount([prev[j] for j in surviving]) if surviving else np.zeros(0)
    users_now = np.bincount([now[j] for j in surviving]) if surviving else np.zeros(0)
    one_to_one = sum(users_prev[prev[j]] == 1 and users_now[now[j]] == 1 for j in kept)
    return len(kept), len(surviving), len({now[j] for j in surviving}), int(one_to_one)


def _strength(model: DTSSBP) -> str:
    """The link strength the model used (its estimate under ``kappa0="auto"``)."""
    k = getattr(model, "kappa0_", None)
    return "-" if k is None else f"{k:.0f}"


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def make_corpus(args, n_features: int, n_documents: int):
    """The planted corpus of ``--generator``, with the options that set its family."""
    rng = np.random.default_rng(args.seed)
    if args.generator == "dirichlet":
        return planted_dirichlet_tree(rng, n_features=n_features, n_documents=n_documents, n_epochs=args.epochs)
    return planted_topic_mixture(rng, n_features=n_features, n_documents=n_documents, n_epochs=args.epochs,
                                 branch_share=args.branch_share, mass_concentration=args.mass_concentration,
                                 median_length=args.median_length, n_branches=args.branches,
                                 leaves_per_branch=args.leaves_per_branch)


@dataclass
class RunFigures:
    """One likelihood's figures on one corpus: per epoch, and the targets met."""

    ari: list[float] = field(default_factory=list)
    kmeans_ari: list[float] = field(default_factory=list)
    node_ratio: list[float] = field(default_factory=list)
    kept_share: list[float] = field(default_factory=list)  # epochs 1.. only
    joined: list[int] = field(default_factory=list)  # per epoch: branch_agreement's four counts
    apart: list[int] = field(default_factory=list)
    together_kept: list[int] = field(default_factory=list)
    together: list[int] = field(default_factory=list)
    met: int = 0
    targets: int = 0
    cpu: float = 0.0


def run_key(likelihood: str, offset: int, offsets: list[int]) -> str:
    """The name of one chain's figures: the likelihood, and its chain offset when several are run."""
    return likelihood if len(offsets) == 1 else f"{likelihood}, chain offset {offset}"


def run_size(n_features: int, n_documents: int, args, likelihoods: list[str]) -> dict[str, RunFigures]:
    """Fit each likelihood on one planted corpus (seed ``args.seed``) at each chain offset, print
    the per-epoch tables, and return the figures by :func:`run_key` (a likelihood the model
    rejects is left out)."""
    figures: dict[str, RunFigures] = {}
    corpus = make_corpus(args, n_features, n_documents)
    true_k = [np.unique(lab).size for lab in corpus.labels]
    print(f"\n== planted tree: V={n_features}, {n_documents} documents per epoch, {args.epochs} epochs, "
          f"true nodes per epoch {true_k}, births {[b.tolist() for b in corpus.born[1:]]}, "
          f"deaths {[d.tolist() for d in corpus.died[1:]]}")
    km_ari, km_cpu = [], []
    true_parent = dict(enumerate(corpus.parent.tolist()))
    for t, counts in enumerate(corpus.counts):
        X = normalize(counts.astype(np.float64), norm="l2", axis=1)
        c0 = time.process_time()
        km = KMeans(n_clusters=true_k[t], random_state=args.seed).fit(X)
        km_cpu.append(time.process_time() - c0)
        km_ari.append(adjusted_rand_score(corpus.labels[t], km.labels_))
    for likelihood, offset in itertools.product(likelihoods, args.chain_offsets):
        params = {"likelihood": likelihood, "max_depth": args.max_depth, "random_state": args.seed + offset}
        if args.sweeps is not None:
            params["n_sweeps"] = args.sweeps
        if likelihood == "vmf" and not args.length_power:
            params["document_weights"] = False  # unit rows, required as such (the default reads weights)
        if args.document_concentration is not None and likelihood == "multinomial":
            dc = args.document_concentration
            params["document_concentration"] = None if dc == "none" else dc if dc == "auto" else float(dc)
        if args.split_node is not None:
            params["split_node"] = args.split_node
        model = DTSSBP(**params)
        print(f"-- DTSSBP({', '.join(f'{k}={v!r}' for k, v in params.items())}), other parameters at defaults")
        if likelihood == "vmf":
            print(f"   vMF rows: unit term frequencies times (tokens / {reference_length(corpus.counts[0]):g}) "
                  f"** {args.length_power:g}")
        header = (f"{'epoch':>5} {'nodes>=1%':>10} {'truth':>5} {'ratio':>6} {'(0.67-1.5x)':>12} "
                  f"{'ARI':>6} {'k-means':>8} {'(>= k-means)':>13} {'ids kept':>14} {'(>= 80%)':>9} "
                  f"{'live K':>6} {'in <1%':>7} {'tokens <1% / rest':>18} {'kappa0_':>8} {'CPU s':>7} "
                  f"{'k-means CPU s':>14}")
        maps, met, notes = [], [], []
        fig = RunFigures()
        for t, counts in enumerate(corpus.counts):
            X = model_input(counts, likelihood, args.length_power, reference_length(corpus.counts[0]))
            c0 = time.process_time()
            try:
                model.partial_fit(X, epoch=t)
            except ValueError as exc:
                if t == 0 and "likelihood" in str(exc):
                    print(f"   skipped: the model rejects likelihood={likelihood!r} ({exc})")
                    break
                raise
            cpu = time.process_time() - c0
            fig.cpu += cpu
            if t == 0:
                print(header)
            tree = model.trees_[-1]
            labels = corpus.labels[t]
            found = np.asarray(tree.assignments)
            n_big, n_true = big_nodes(found), big_nodes(labels)
            ratio = n_big / max(n_true, 1)
            ok_ratio = RATIO_RANGE[0] <= ratio <= RATIO_RANGE[1]
            ari = adjusted_rand_score(labels, found)
            small = in_small_nodes(found)
            tokens = np.asarray(counts.sum(axis=1)).ravel()
            length_txt = (f"{tokens[small].mean():.0f} / {tokens[~small].mean():.0f}"
                          if small.any() and (~small).any() else "-")
            ok_ari = ari >= km_ari[t]
            fig.ari.append(ari)
            fig.kmeans_ari.append(km_ari[t])
            fig.node_ratio.append(ratio)
            maps.append(majority_map(labels, found))
            model_parent = dict(zip(tree.node_ids.tolist(), tree.parent.tolist()))
            joined, apart, kept_in, together = branch_agreement(true_parent, model_parent, maps[-1])
            fig.joined.append(joined)
            fig.apart.append(apart)
            fig.together_kept.append(kept_in)
            fig.together.append(together)
            notes.append(f"epoch {t}: top-level branches: {joined} of {apart} pairs of true nodes in different "
                         f"branches joined in one; {kept_in} of {together} pairs in one branch kept in one")
            if t:
                kept, surv, distinct, strict = ids_kept(maps[-2], maps[-1])
                share = kept / max(surv, 1)
                ok_keep = share >= KEEP_TARGET
                fig.kept_share.append(share)
                keep_txt = f"{kept}/{surv}={100 * share:.0f}%"
                notes.append(f"epoch {t}: the {surv} surviving true nodes map to {distinct} model ids; "
                             f"{strict} of the {kept} kept ids are one-to-one")
                met += [ok_ratio, ok_ari, ok_keep]
            else:
                keep_txt, ok_keep = "-", None
                met += [ok_ratio, ok_ari]
            print(f"{t:>5} {n_big:>10} {n_true:>5} {ratio:>5.2f}x {_met(ok_ratio):>12} {ari:>6.3f} "
                  f"{km_ari[t]:>8.3f} {_met(ok_ari):>13} {keep_txt:>14} "
                  f"{'-' if ok_keep is None else _met(ok_keep):>9} {tree.n_nodes:>6} {small.mean():>7.1%} {length_txt:>18} "
                  f"{_strength(model):>8} {cpu:>7.1f} "
                  f"{km_cpu[t]:>14.1f}", flush=True)
        else:
            if "document_concentration" in model.state_.hyper:
                print(f"   document concentration s after the last epoch: "
                      f"{model.state_.hyper['document_concentration']:.4g}")
            for note in notes:
                print("   " + note)
            print(f"   {sum(met)} of {len(met)} per-epoch targets met")
            fig.met, fig.targets = int(sum(met)), len(met)
            figures[run_key(likelihood, offset, args.chain_offsets)] = fig
        model.close()
    return figures


def parse_integers(text: str, option: str = "--seeds") -> list[int]:
    """``"0-7"``, ``"0,2,5"`` or a mix (``"0-3,8"``) as a list of integers (seeds, or chain
    offsets for ``option="--chain-offset"``)."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
        except ValueError:
            raise SystemExit(f"{option}: {part!r} is not an integer or a range like 0-7") from None
    if not out:
        raise SystemExit(f"{option}: nothing given")
    return out


def print_over_seeds(size: str, seeds: list[int], runs: list[dict[str, RunFigures]]) -> None:
    """Per likelihood, the figures of every seed together: targets met, and mean +- sd over the
    seeds of each seed's mean over epochs (the spread to judge a change against)."""
    print(f"\n== {size}, seeds {seeds}: over the seeds (mean +- sd of per-seed means over epochs)")
    for likelihood in sorted({k for r in runs for k in r}):
        figs = [r[likelihood] for r in runs if likelihood in r]

        def stat(values: list[float]) -> str:
            v = np.array(values)
            return f"{v.mean():.3f} +- {v.std(ddof=1) if v.size > 1 else 0.0:.3f}"

        kept = [np.mean(f.kept_share) for f in figs if f.kept_share]  # one-epoch runs keep no ids
        print(f"   {likelihood}: {sum(f.met for f in figs)} of {sum(f.targets for f in figs)} targets met; "
              f"ARI {stat([np.mean(f.ari) for f in figs])} (k-means {stat([np.mean(f.kmeans_ari) for f in figs])}); "
              f"nodes >= 1% / truth {stat([np.mean(f.node_ratio) for f in figs])}, epoch 0 "
              f"{stat([f.node_ratio[0] for f in figs])}; ids kept {stat(kept) if kept else '-'}; "
              f"CPU {stat([f.cpu for f in figs])} s a seed")
        joined, apart = sum(sum(f.joined) for f in figs), sum(sum(f.apart) for f in figs)
        kept_in, together = sum(sum(f.together_kept) for f in figs), sum(sum(f.together) for f in figs)
        print(f"   {likelihood}: top-level branches over all epochs: {joined} of {apart} pairs of true nodes in "
              f"different branches joined in one ({joined / max(apart, 1):.1%}); {kept_in} of {together} pairs "
              f"in one branch kept in one ({kept_in / max(together, 1):.1%})")


def print_over_chains(size: str, likelihoods: list[str], offsets: list[int],
                      runs: list[dict[str, RunFigures]]) -> None:
    """Per likelihood, each chain offset's figures over the seeds and their spread over the
    chains: a change to the model is judged against how far its figures move by the random
    stream alone."""
    print(f"\n== {size}: over the chains (offsets {offsets}; each chain's figures over all the seeds)")

    def spread(values: list[float], digits: int) -> str:
        v = np.array(values, dtype=float)
        return f"{v.mean():.{digits}f} +- {v.std(ddof=1) if v.size > 1 else 0.0:.{digits}f}"

    for likelihood in likelihoods:
        chains = [[r[key] for r in runs if key in r] for key in (run_key(likelihood, o, offsets) for o in offsets)]
        if not all(chains):
            continue  # a likelihood the model rejects
        met = [sum(f.met for f in figs) for figs in chains]
        ari = [np.mean([np.mean(f.ari) for f in figs]) for figs in chains]
        epoch0 = [np.mean([f.node_ratio[0] for f in figs]) for figs in chains]
        print(f"   {likelihood}: targets met {' / '.join(map(str, met))} of {sum(f.targets for f in chains[0])} "
              f"(mean {spread(met, 1)}); ARI {' / '.join(f'{a:.3f}' for a in ari)} (mean {spread(ari, 3)}); "
              f"epoch-0 nodes / truth {' / '.join(f'{e:.3f}' for e in epoch0)} (mean {spread(epoch0, 3)})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default=ISSUE_SIZE,
                   help=f"comma-separated VxN corpus sizes (vocabulary x documents per epoch; default {ISSUE_SIZE})")
    p.add_argument("--all-sizes", action="store_true", help=f"also run {OTHER_SIZES} (slow)")
    p.add_argument("--generator", choices=["dirichlet", "mixture"], default="dirichlet",
                   help="planted family: dirichlet (hierarchical-Dirichlet tree, documents at every node; "
                        "the issue's) or mixture (mixed topics, documents at the leaves only, log-normal lengths)")
    p.add_argument("--branch-share", type=float, default=0.3,
                   help="mixture: weight of a leaf's branch topic (larger: siblings harder to tell apart)")
    p.add_argument("--mass-concentration", type=float, default=3.0,
                   help="mixture: Dirichlet concentration of the leaf masses (small: a few dominant leaves)")
    p.add_argument("--median-length", type=float, default=50.0, help="mixture: median document length in tokens")
    p.add_argument("--branches", type=int, default=5, help="mixture: branches below the root")
    p.add_argument("--leaves-per-branch", type=int, default=4,
                   help="mixture: leaves of each branch (1: a flat tree of unrelated topics, each the only "
                        "leaf of its branch, whose topic then only adds words of its own)")
    p.add_argument("--likelihood", default="vmf",
                   help="comma-separated likelihoods to compare, e.g. vmf,multinomial (default vmf)")
    p.add_argument("--max-depth", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--sweeps", type=int, default=None, help="Gibbs sweeps per epoch (default: the model's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", default=None,
                   help="several seeds, e.g. 0-7 or 0,2,5: each seed's table, then the figures over "
                        "the seeds (chains differ by up to 0.1 in ARI: judge a change over 8 or more)")
    p.add_argument("--chain-offset", default="0",
                   help="the model's random_state is the seed plus this: the same corpora with other chains, "
                        "to see how far a change's figures move by its random stream alone; several, e.g. "
                        "0,1000,2000, run every seed at each and end with the spread over the chains (default 0)")
    p.add_argument("--length-power", type=float, default=DEFAULT_LENGTH_POWER,
                   help="vMF: document weight = (tokens / first epoch's median) ** this; 0 for unit rows "
                        f"(default: the product's, {DEFAULT_LENGTH_POWER:g})")
    p.add_argument("--split-node", choices=["fixed", "integrated"], default=None,
                   help="split-merge moves: the split node's parameter held or integrated out (default: the model's)")
    p.add_argument("--document-concentration", default=None,
                   help="multinomial: bursty (DCM) documents, 'auto' or a number s, or 'none' for "
                        "independent tokens (default: the model's, auto)")
    args = p.parse_args()
    args.chain_offsets = parse_integers(args.chain_offset, "--chain-offset")
    sizes = args.sizes.split(",") + (OTHER_SIZES.split(",") if args.all_sizes else [])
    likelihoods = [s.strip() for s in args.likelihood.split(",") if s.strip()]
    for size in sizes:
        try:
            v, n = (int(x) for x in size.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--sizes: {size!r} is not VxN, e.g. 2000x5000") from None
        seeds = [args.seed] if args.seeds is None else parse_integers(args.seeds)
        runs = [run_size(v, n, argparse.Namespace(**{**vars(args), "seed": seed}), likelihoods) for seed in seeds]
        if args.seeds is not None:
            print_over_seeds(size, seeds, runs)
        if len(args.chain_offsets) > 1:
            print_over_chains(size, likelihoods, args.chain_offsets, runs)


if __name__ == "__main__":
    main()
