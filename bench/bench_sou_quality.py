"""Topic quality and node identity on the State of the Union corpus (the SOU targets of issue 9).

Data: SOU paragraphs by decade with the demo's vocabulary (2,000 terms fitted on the whole
corpus; see ``bench/sou_corpus.py``). Model: ``DTSSBP`` at its defaults except ``max_depth``
(and ``likelihood``, ``n_sweeps`` when given); vMF input is the L2-normalised term frequencies
(``--weighting tfidf``: each count times the term's smoothed inverse document frequency over all
selected paragraphs, ``log((1 + n) / (1 + df)) + 1`` as in ``TextVectorizer``, then L2-normalised;
``--weighting tf,tfidf`` runs both), each row then scaled to its paragraph's weight as
``TextVectorizer`` does (``--length-power``, default the product's; 0: unit rows); other
likelihoods get the token counts.

Coherence: NPMI (``streamtree.coherence``, exact limits, no smoothing) with probabilities from
the document co-occurrence of the whole corpus on the same tokens (every non-empty paragraph
of the selected decades).

* Model, per decade: the 20 nodes holding the most of the decade's documents (their own
  documents), each described by its 10 largest theta entries.
* Peer, tomotopy ``HLDAModel(depth=4)`` with its default hyperparameters, one worker, on the
  same documents as lists of the same vocabulary terms, fitted two ways (``--hlda-fit``,
  default both): ``all``, one HLDA trained on all selected decades at once (it has no notion
  of time, and this gives it every document, later decades' included); ``per-decade``, one
  HLDA per decade on that decade alone (the documents the model's tree of that decade sees,
  without the model's link to the past). For each decade, its 20 topics holding the most of
  that decade's tokens, each described by its 10 most probable words; for the ``all`` fit the
  same NPMI is also printed with topics ranked by how many of the decade's documents have a
  token assigned to them (a document's path can pass through a topic that holds none of its
  tokens; such documents are not counted).
* Model pooled (``--no-pooled`` skips it): the same ``DTSSBP`` fitted once on all selected
  decades as a single epoch, HLDA's ``all`` protocol; per decade, the 20 nodes holding the most
  of that decade's documents.
* Model fresh per decade (``--no-fresh`` skips it): a new ``DTSSBP`` for each decade, fitted on
  that decade alone (no link to the past), HLDA's ``per-decade`` protocol.

Target: the model's mean over decades >= HLDA's, from the same run. Four comparisons are
printed: the model's per-decade trees against HLDA trained on all decades (the comparison the
target was first measured with; the two sides see different documents, and the NPMI reference,
all paragraphs, rewards topics fitted to all of them); the same trees against one HLDA per
decade (the same decade's documents, but the trees also have their link to the past); and the
two like for like: fresh per-decade trees against one HLDA per decade, and the pooled fit
against HLDA on all decades. Each says in how many decades the model is at or ahead.

Per decade, the model's nodes, those of them holding the decade's documents ("occupied"; the
others are alive only through the window's past documents) and the chain's stick
hyperparameters alpha0, lam and gamma after the decade.

Node identity of the model: per decade, the share of its documents held by nodes carried from
an earlier decade ("in carried"); the share of node ids that appear in a single decade; the mean
Jaccard index between the top-10 words of an id's first and last decade, over ids present in
more than 3 decades; the number of decade-to-decade transitions (an id present in two
consecutive decades) whose parent changes; the same two figures over the lines the views draw
(ids that are relays in every decade they appear left out, and parent changes that only put a
relay in or take one out, :func:`streamtree.relays.relay_changes`, not counted); the
single-decade ids by the documents they held in their decade (births that die at once hold
few); node-decades whose concentration sits at the
cap ``concentration_bounds[1]`` (and how many of those hold at most 2 documents). The progress
lines print the link strength in use (``kappa0_``, estimated under ``kappa0="auto"``).

Usage: python bench/bench_sou_quality.py [--likelihood vmf[,multinomial]] [--weighting tf[,tfidf]] [--max-depth 3]
       [--sweeps N] [--decades 6 | 1790s,1800s] [--hlda-iter 500] [--hlda-fit all,per-decade]
       [--no-hlda] [--no-pooled] [--no-fresh] [--seed 0] [--split-node fixed|integrated]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np
import scipy.sparse as sp
from sou_corpus import SouCorpus, load_sou

from streamtree.coherence import topic_npmi
from streamtree.inference.epoch_sampler import IDENTITY_MIN_DOCS
from streamtree.likelihoods.base import WordTopics, top_words
from streamtree.model import DTSSBP
from streamtree.records import DEFAULT_DUPLICATE_TEXTS, DUPLICATE_TEXTS
from streamtree.relays import own_lines, relay_changes
from streamtree.text import DEFAULT_LENGTH_POWER, reference_length, weighted_rows
from streamtree.tree import ROOT

N_TOP_NODES = 20
N_TOP_WORDS = 10


def largest_npmi(theta: np.ndarray, sizes: np.ndarray, reference) -> tuple[np.ndarray, np.ndarray]:
    """NPMI of the top words of the (at most) 20 nodes with the largest ``sizes``, and their rows."""
    order = np.argsort(-sizes, kind="stable")
    order = order[sizes[order] > 0][:N_TOP_NODES]
    top = np.argsort(-theta[order], axis=1, kind="stable")[:, :N_TOP_WORDS]
    return topic_npmi(top, reference), order


def model_npmi(trees, corpus: SouCorpus, reference) -> tuple[list[float], dict[int, list[float]]]:
    """Mean NPMI of the 20 largest nodes per decade, and every scored node's NPMI by depth."""
    per_decade, by_depth = [], defaultdict(list)
    for tree in trees:
        scores, order = largest_npmi(tree.theta, tree.counts, reference)
        per_decade.append(float(scores.mean()))
        for d, s in zip(tree.depth[order].tolist(), scores.tolist()):
            by_depth[d].append(s)
    return per_decade, by_depth


def fresh_npmi(corpus: SouCorpus, likelihood: str, args, rows: list[sp.csr_matrix] | None,
               reference) -> tuple[list[float], float]:
    """HLDA's ``per-decade`` protocol for the model: a new tree for each decade, fitted on that
    decade alone; per decade, the mean NPMI of its 20 largest nodes. Also the fits' CPU seconds."""
    per_decade, cpu = [], 0.0
    for t in range(len(corpus.labels)):
        model = DTSSBP(**model_params(likelihood, args, rows))
        c0 = time.process_time()
        model.partial_fit(model_rows(corpus, likelihood, rows)[t], epoch=0)
        cpu += time.process_time() - c0
        model.close()
        tree = model.trees_[-1]
        per_decade.append(float(largest_npmi(tree.theta, tree.counts, reference)[0].mean()))
    return per_decade, cpu


def pooled_npmi(corpus: SouCorpus, likelihood: str, args, rows: list[sp.csr_matrix] | None,
                reference) -> tuple[list[float], float, int]:
    """HLDA's ``all`` protocol for the model: one tree fitted on all decades as a single epoch;
    per decade, the mean NPMI of the 20 nodes holding the most of that decade's documents.
    Also the fit's CPU seconds and its occupied nodes."""
    model = DTSSBP(**model_params(likelihood, args, rows))
    X = sp.vstack(model_rows(corpus, likelihood, rows), format="csr")
    c0 = time.process_time()
    model.partial_fit(X, epoch=0, label="all decades")
    cpu = time.process_time() - c0
    model.close()
    tree = model.trees_[-1]
    by_id = np.argsort(tree.node_ids)
    position = by_id[np.searchsorted(tree.node_ids, tree.assignments, sorter=by_id)]
    bounds = np.cumsum([0] + [c.shape[0] for c in corpus.counts])
    per_decade = []
    for t in range(len(corpus.labels)):
        sizes = np.bincount(position[bounds[t]:bounds[t + 1]], minlength=tree.n_nodes)
        per_decade.append(float(largest_npmi(tree.theta, sizes, reference)[0].mean()))
    return per_decade, cpu, tree.n_occupied


def identity_figures(trees, model) -> dict:
    present = defaultdict(list)
    for t, tree in enumerate(trees):
        for k, nid in enumerate(tree.node_ids.tolist()):
            present[nid].append((t, k))
    single = sum(len(v) == 1 for v in present.values())
    # the single-decade ids by their documents in that decade: births that die at once hold few
    single_docs = np.array([int(trees[w[0][0]].counts[w[0][1]]) for w in present.values() if len(w) == 1])
    single_by_docs = {"<= 2": int(np.sum(single_docs <= 2)), "3-19": int(np.sum((single_docs > 2) & (single_docs < 20))),
                      ">= 20": int(np.sum(single_docs >= 20))}
    jacc = []
    for nid, where in present.items():
        if len(where) > 3:
            (t0, k0), (t1, k1) = where[0], where[-1]
            a = set(np.argsort(-trees[t0].theta[k0], kind="stable")[:N_TOP_WORDS].tolist())
            b = set(np.argsort(-trees[t1].theta[k1], kind="stable")[:N_TOP_WORDS].tolist())
            jacc.append(len(a & b) / len(a | b))
    transitions = changes = 0
    for prev, now in zip(trees[:-1], trees[1:]):
        par_prev = dict(zip(prev.node_ids.tolist(), prev.parent.tolist()))
        for nid, par in zip(now.node_ids.tolist(), now.parent.tolist()):
            if nid in par_prev:
                transitions += 1
                changes += par_prev[nid] != par
    # the same over the lines the views draw: a relay (no documents of its own, one child) is
    # drawn with the node it leads to, so ids that are relays in every decade are no topic's,
    # and a parent change that leaves a line below the same line is none of a topic's
    lines = [own_lines(t.node_ids, t.parent, t.counts) for t in trees]
    topic_ids = [nid for nid, where in present.items() if any(nid in lines[t] for t, _ in where)]
    topic_single = sum(len(present[nid]) == 1 for nid in topic_ids)
    line_changes = 0
    for prev, now in zip(trees[:-1], trees[1:]):
        par_prev = dict(zip(prev.node_ids.tolist(), prev.parent.tolist()))
        moved = [nid for nid, par in zip(now.node_ids.tolist(), now.parent.tolist())
                 if nid in par_prev and par_prev[nid] != par]
        relay = relay_changes(moved, ["parent_changed"] * len(moved), (prev.node_ids, prev.parent, prev.counts),
                              (now.node_ids, now.parent, now.counts))
        line_changes += int(np.sum(~relay))
    # the identity rule's promise: an id holding enough of a decade's documents to be judged is
    # recognised by the top words of its birth decade (the root, the stream's node, excepted)
    judged = unrecognised = 0
    words = WordTopics()  # both text families (vMF, multinomial) are word families
    for nid, where in present.items():
        t0, k0 = where[0]
        birth = top_words(trees[t0].theta[k0]).astype(np.float64)
        for t, k in where[1:]:
            if nid != ROOT and trees[t].counts[k] >= IDENTITY_MIN_DOCS:
                judged += 1
                unrecognised += not words.recognises(birth, trees[t].theta[k])
    cap = model.concentration_bounds[1]
    at_cap = sum(int(np.sum(t.concentration >= cap * (1 - 1e-9))) for t in trees)
    at_cap_small = sum(int(np.sum((t.concentration >= cap * (1 - 1e-9)) & (t.counts <= 2))) for t in trees)
    return {"ids": len(present), "single": single, "jaccard": jacc, "transitions": transitions,
            "parent_changes": changes, "node_decades": sum(t.n_nodes for t in trees), "at_cap": at_cap,
            "at_cap_small": at_cap_small, "cap": cap, "single_by_docs": single_by_docs,
            "topic_ids": len(topic_ids), "topic_single": topic_single, "line_changes": line_changes,
            "judged": judged, "unrecognised": unrecognised}


def carried_share(tree) -> float:
    """Share of the decade's documents held by nodes born in an earlier decade (ids that
    continue); 0 for the first decade."""
    n = int(tree.counts.sum())
    return float(tree.counts[tree.born < tree.epoch].sum()) / n if n else 0.0


def hlda_topics_by_decade(corpus: SouCorpus, args, fit_mode: str
                          ) -> tuple[list[np.ndarray], list[np.ndarray], float, int, str]:
    """Top-word indices of HLDA's 20 largest topics per decade, ranked by the decade's tokens
    and by its documents; CPU seconds; topics alive; the protocol's description. ``fit_mode``:
    ``"all"`` (one HLDA on all decades) or ``"per-decade"``."""
    import tomotopy as tp

    column = {w: i for i, w in enumerate(corpus.vocabulary.tolist())}

    def fit(decades: list[int]):
        mdl = tp.HLDAModel(depth=4, seed=args.seed)
        owner = []
        for t in decades:
            for words in corpus.token_lists(t):
                mdl.add_doc(words)
                owner.append(t)
        mdl.train(args.hlda_iter, workers=1)
        return mdl, np.asarray(owner)

    def top_of(mdl, sizes: np.ndarray) -> np.ndarray:
        order = np.argsort(-sizes, kind="stable")
        order = order[sizes[order] > 0][:N_TOP_NODES]
        return np.array([[column[w] for w, _ in mdl.get_topic_words(int(k), top_n=N_TOP_WORDS)] for k in order])

    def rank(mdl, owner, t):
        tokens = np.zeros(mdl.k, dtype=np.int64)
        docs = np.zeros(mdl.k, dtype=np.int64)
        all_docs = list(mdl.docs)  # (the corpus view does not index by position)
        for i in np.flatnonzero(owner == t):
            d = all_docs[int(i)]
            tokens += np.bincount(np.asarray(d.topics, dtype=np.int64), minlength=mdl.k)
            docs[np.unique(np.asarray(d.topics, dtype=np.int64))] += 1
        return top_of(mdl, tokens), top_of(mdl, docs)

    by_tokens, by_docs = [], []
    c0 = time.process_time()
    if fit_mode == "all":
        mdl, owner = fit(list(range(len(corpus.labels))))
        live = mdl.live_k
        for t in range(len(corpus.labels)):
            a, b = rank(mdl, owner, t)
            by_tokens.append(a)
            by_docs.append(b)
        what = "one HLDA on all selected decades"
    else:
        live = 0
        for t in range(len(corpus.labels)):
            mdl, owner = fit([t])
            live += mdl.live_k
            a, b = rank(mdl, owner, t)
            by_tokens.append(a)
            by_docs.append(b)
        what = "one HLDA per decade"
    return by_tokens, by_docs, time.process_time() - c0, live, what


def vmf_rows(corpus: SouCorpus, weighting: str, length_power: float) -> list[sp.csr_matrix]:
    """Per decade, the vMF rows as the product makes them (:func:`streamtree.text.weighted_rows`):
    the counts (times the smoothed idf of all selected paragraphs for ``"tfidf"``), unit length,
    times each paragraph's weight, its token count over the median of all selected paragraphs to
    the power ``length_power``."""
    reference = corpus.all_counts()
    idf = None
    if weighting == "tfidf":
        df = np.asarray((reference > 0).sum(axis=0)).ravel()
        idf = np.log((1.0 + reference.shape[0]) / (1.0 + df)) + 1.0
    ref = reference_length(reference)
    return [weighted_rows(C, idf=idf, length_power=length_power, reference=ref) for C in corpus.counts]


def model_rows(corpus: SouCorpus, likelihood: str, rows: list[sp.csr_matrix] | None) -> list[sp.csr_matrix]:
    """Per decade, what the model reads: the vMF rows (``rows``, or the corpus's unit rows) or the counts."""
    return (rows or corpus.X) if likelihood == "vmf" else corpus.counts


def model_params(likelihood: str, args, rows: list[sp.csr_matrix] | None) -> dict:
    """The ``DTSSBP`` parameters this run sets; the rest stay at the model's defaults."""
    params = {"likelihood": likelihood, "max_depth": args.max_depth, "random_state": args.seed}
    if args.sweeps is not None:
        params["n_sweeps"] = args.sweeps
    if likelihood == "vmf" and not (rows is not None and args.length_power):
        params["document_weights"] = False  # unit rows, required as such (the default reads weights)
    if args.document_concentration is not None and likelihood == "multinomial":
        dc = args.document_concentration
        params["document_concentration"] = None if dc == "none" else dc if dc == "auto" else float(dc)
    if args.split_node is not None:
        params["split_node"] = args.split_node
    return params


def run_model(corpus: SouCorpus, likelihood: str, args, rows: list[sp.csr_matrix] | None = None):
    params = model_params(likelihood, args, rows)
    model = DTSSBP(**params)
    hyper = []  # the chain's stick hyperparameters after each decade
    c0 = time.process_time()
    for t, label in enumerate(corpus.labels):
        X = model_rows(corpus, likelihood, rows)[t]
        try:
            model.partial_fit(X, epoch=t, label=label)
        except ValueError as exc:
            if t == 0 and "likelihood" in str(exc):
                print(f"-- likelihood={likelihood!r} skipped: the model rejects it ({exc})")
                return None, params, 0.0, []
            raise
        hyper.append(dict(model.state_.hyper))
        print(f"   {label}: {X.shape[0]} documents, {model.trees_[-1].n_nodes} nodes, kappa0_ "
              f"{getattr(model, 'kappa0_', model.kappa0) or 0:.0f}, "
              f"{time.process_time() - c0:.0f}s CPU so far"
              + (f", s {model.state_.hyper['document_concentration']:.3g}"
                 if "document_concentration" in model.state_.hyper else ""), flush=True)
    cpu = time.process_time() - c0
    model.close()
    return model, params, cpu, hyper


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--likelihood", default="vmf", help="comma-separated, e.g. vmf,multinomial (default vmf)")
    p.add_argument("--length-power", type=float, default=DEFAULT_LENGTH_POWER,
                   help="vMF rows: paragraph weight = (tokens / median) ** this; 0 for unit rows "
                        f"(default: the product's, {DEFAULT_LENGTH_POWER:g})")
    p.add_argument("--weighting", default="tf",
                   help="vMF rows: tf, tfidf or tf,tfidf (both, one run each; default tf)")
    p.add_argument("--max-depth", type=int, default=3, help="model depth cap (default 3, the demo's)")
    p.add_argument("--sweeps", type=int, default=None, help="Gibbs sweeps per decade (default: the model's)")
    p.add_argument("--decades", default=None, help="subset: first N decades, or labels like 1790s,1800s")
    p.add_argument("--duplicate-texts", default=DEFAULT_DUPLICATE_TEXTS, choices=DUPLICATE_TEXTS,
                   help="paragraphs repeating an earlier one's text in their decade: keep fits them, the others "
                        f"leave them out (default: the product's, {DEFAULT_DUPLICATE_TEXTS})")
    p.add_argument("--hlda-iter", type=int, default=500, help="HLDA training iterations (default 500)")
    p.add_argument("--hlda-fit", default="all,per-decade",
                   help="HLDA protocols, comma-separated: all (one HLDA on all decades), per-decade "
                        "(one per decade); default both")
    p.add_argument("--no-hlda", action="store_true", help="skip the tomotopy side")
    p.add_argument("--no-pooled", action="store_true",
                   help="skip the model's pooled fit (all decades as one epoch, HLDA's 'all' protocol)")
    p.add_argument("--no-fresh", action="store_true",
                   help="skip the model's fresh fit per decade (no link to the past, HLDA's 'per-decade' protocol)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split-node", choices=["fixed", "integrated"], default=None,
                   help="split-merge moves: the split node's parameter held or integrated out (default: the model's)")
    p.add_argument("--document-concentration", default=None,
                   help="multinomial: bursty (DCM) documents, 'auto' or a number s, or 'none' for "
                        "independent tokens (default: the model's, auto)")
    args = p.parse_args()
    weightings = [w.strip() for w in args.weighting.split(",") if w.strip()]
    if not weightings or set(weightings) - {"tf", "tfidf"}:
        p.error(f"--weighting: expected tf, tfidf or tf,tfidf, got {args.weighting!r}")
    fit_modes = list(dict.fromkeys(m.strip() for m in args.hlda_fit.split(",") if m.strip()))
    if not fit_modes or set(fit_modes) - {"all", "per-decade"}:
        p.error(f"--hlda-fit: expected all, per-decade or all,per-decade, got {args.hlda_fit!r}")

    corpus = load_sou(decades=args.decades, duplicate_texts=args.duplicate_texts)
    reference = corpus.all_counts()
    print(f"== SOU quality: {len(corpus.labels)} decades ({corpus.labels[0]}-{corpus.labels[-1]}), "
          f"{corpus.n_documents} paragraphs, {corpus.vocabulary.size} terms; NPMI of the top-{N_TOP_WORDS} words "
          f"of the {N_TOP_NODES} largest nodes/topics per decade, from the co-occurrence of all "
          f"{reference.shape[0]} paragraphs")

    hlda = {}  # fit mode -> (per-decade NPMI by tokens, by documents)
    if not args.no_hlda:
        try:
            import tomotopy  # noqa: F401
        except ImportError:
            print("-- tomotopy not installed: HLDA side skipped (pip install -e '.[bench]')")
        else:
            for mode in fit_modes:
                by_tokens, by_docs, hcpu, live, what = hlda_topics_by_decade(corpus, args, mode)
                hlda[mode] = ([float(topic_npmi(t, reference).mean()) for t in by_tokens],
                              [float(topic_npmi(t, reference).mean()) for t in by_docs])
                print(f"-- tomotopy HLDAModel(depth=4), {what}, {args.hlda_iter} iterations, 1 worker: "
                      f"{hcpu:.0f}s CPU, {live} live topics")

    runs = [(lik, w) for lik in [s.strip() for s in args.likelihood.split(",") if s.strip()]
            for w in (weightings if lik == "vmf" else [None])]
    for likelihood, weighting in runs:
        rows = vmf_rows(corpus, weighting, args.length_power) if weighting else None
        model, params, cpu, hyper = run_model(corpus, likelihood, args, rows)
        if model is None:
            continue
        trees = model.trees_
        npmi, by_depth = model_npmi(trees, corpus, reference)
        print(f"-- DTSSBP({', '.join(f'{k}={v!r}' for k, v in params.items())}), other parameters at defaults"
              + (f", rows weighted {weighting}, length power {args.length_power:g}" if weighting else "")
              + f": {cpu:.0f}s CPU")
        pooled = fresh = None
        if not args.no_pooled:
            pooled, pcpu, p_occupied = pooled_npmi(corpus, likelihood, args, rows, reference)
            print(f"-- the same model pooled: all decades as one epoch, {pcpu:.0f}s CPU, {p_occupied} occupied nodes")
        if not args.no_fresh:
            fresh, fcpu = fresh_npmi(corpus, likelihood, args, rows, reference)
            print(f"-- the same model fresh per decade: one new fit per decade, no past, {fcpu:.0f}s CPU")
        # columns: per-decade trees, then the pooled and fresh fits, then HLDA's fits
        extra = ([("pooled", pooled)] if pooled else []) + ([("fresh", fresh)] if fresh else []) \
            + ([("HLDA all", hlda["all"][0]), ("HLDA all, by docs", hlda["all"][1])] if "all" in hlda else []) \
            + ([("HLDA per decade", hlda["per-decade"][0])] if "per-decade" in hlda else [])
        print(f"{'decade':>7} {'docs':>6} {'nodes':>6} {'occupied':>8} {'in carried':>10} {'model NPMI':>11}"
              f" {'alpha0':>7} {'lam':>5} {'gamma':>6}" + "".join(f" {name:>{max(len(name), 7)}}" for name, values in extra))
        for t, label in enumerate(corpus.labels):
            h = hyper[t]
            line = (f"{label:>7} {corpus.X[t].shape[0]:>6} {trees[t].n_nodes:>6} {trees[t].n_occupied:>8} "
                    f"{carried_share(trees[t]):>10.0%} {npmi[t]:>11.3f} {h.get('alpha0', np.nan):>7.2f} "
                    f"{h.get('lam', np.nan):>5.2f} {h.get('gamma', np.nan):>6.3f}")
            line += "".join(f" {values[t]:>{max(len(name), 7)}.3f}" for name, values in extra)
            print(line)
        mean = float(np.mean(npmi))
        print(f"{'mean':>7} {'':>6} {'':>6} {'':>8} {'':>10} {mean:>11.3f} {'':>7} {'':>5} {'':>6}"
              + "".join(f" {float(np.mean(values)):>{max(len(name), 7)}.3f}" for name, values in extra))
        comparisons = []
        if "all" in hlda:
            comparisons.append(("per-decade trees vs one HLDA on all decades (first measured; unlike: HLDA sees "
                                "every decade)", npmi, hlda["all"][0]))
        if "per-decade" in hlda:
            comparisons.append(("per-decade trees (linked to the past) vs one HLDA per decade",
                                npmi, hlda["per-decade"][0]))
        if "per-decade" in hlda and fresh:
            comparisons.append(("like for like, per decade: fresh trees per decade vs one HLDA per decade",
                                fresh, hlda["per-decade"][0]))
        if "all" in hlda and pooled:
            comparisons.append(("like for like, pooled: one tree on all decades vs one HLDA on all decades",
                                pooled, hlda["all"][0]))
        for what, ours, theirs in comparisons:
            a, b = float(np.mean(ours)), float(np.mean(theirs))
            wins = int(np.sum(np.asarray(ours) >= np.asarray(theirs)))
            print(f"   target (model >= HLDA by tokens), {what}: {a:.3f} vs {b:.3f}, "
                  f"{'met' if a >= b else 'NOT met'}" + (f", ratio {a / b:.2f}" if b > 0 else "")
                  + f"; model at or ahead in {wins} of {len(ours)} decades")
        print("   model NPMI by depth (nodes scored above): "
              + ", ".join(f"depth {d}: {np.mean(v):.3f} ({len(v)} nodes)" for d, v in sorted(by_depth.items())))
        f = identity_figures(trees, model)
        jac = f"{np.mean(f['jaccard']):.2f} over {len(f['jaccard'])} ids" if f["jaccard"] else "no such ids"
        print(f"   identity: {f['single']} of {f['ids']} ids ({100 * f['single'] / max(f['ids'], 1):.0f}%) live a "
              f"single decade; first-vs-last top-{N_TOP_WORDS} Jaccard of ids alive > 3 decades: {jac}; "
              f"{f['parent_changes']} of {f['transitions']} decade-to-decade transitions change the parent")
        share = 100 * f["topic_single"] / max(f["topic_ids"], 1)
        print(f"   identity over the lines drawn (relays with the node they lead to): {f['topic_single']} of "
              f"{f['topic_ids']} ids that are ever more than a relay ({share:.0f}%) live a single decade; "
              f"{f['line_changes']} of {f['transitions']} transitions move a line")
        print(f"   ids against their birth words: {f['unrecognised']} of {f['judged']} node-decades holding >= "
              f"{IDENTITY_MIN_DOCS} documents are not recognised by the top words of their id's birth decade "
              "(the identity rule's promise: 0)")
        print("   single-decade ids by their documents in that decade: "
              + ", ".join(f"{k}: {v}" for k, v in f["single_by_docs"].items()))
        print(f"   concentration at the cap {f['cap']:g}: {f['at_cap']} of {f['node_decades']} node-decades, "
              f"{f['at_cap_small']} of them holding <= 2 documents")


if __name__ == "__main__":
    main()
