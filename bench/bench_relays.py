"""Relays on disjoint topics: does the model's own target want the empty nodes above each leaf?

Data (this script's own generator): ``--topics`` topics with disjoint vocabularies of ``--words``
terms each, ``--documents`` documents of ``--length`` tokens, each from one uniformly drawn
topic, its tokens uniform over the topic's words. One epoch, no hierarchy: the right tree is
the root and one leaf per topic.

Model: ``DTSSBP`` at its defaults apart from ``max_depth=3`` (the multinomial family; or at
``--kappa0``), and again at ``kappa0="auto"``. Printed for each fit: the nodes, the relays (no
documents of their own and one child, counted where their chain leads to documents) and the
depths of the nodes holding documents.

Then, for each leaf of the first fit, the collapsed log marginal of its documents (word
distribution integrated out; read as multinomial documents, without the multinomial
coefficients, which are the same in every place) in three places, all below the root's fitted
word distribution. The fit's documents are bursty by default (``document_concentration="auto"``);
at the default size a fit with multinomial documents gives the same tree.

* directly below the root, at the fit's link strength (``kappa0_``; ``kappa1`` is 1 by
  default, so every depth has the same strength);
* below one relay (the first of a chain), the relay's word distribution integrated out as
  well: the integral over it of its Dirichlet link times the leaf's marginal below it, by
  importance sampling from a Dirichlet re-centred on the integrand (three passes), at three
  proposal concentrations (0.3, 1 and 3 times the link strength), with each one's effective
  sample size: the three values agree when the estimate is sound;
* directly below the root at other link strengths (the best of a grid), the answer a link
  strength of its own per node would give.

The difference between the first two is what one relay is worth to the leaf under the model's
own target, with nothing held at a point estimate: where it is large, the relays are the
target's answer to a link that is too tight for the leaf's distance from the root, not an
artefact of the chain's fitted parameters. The importance sampler is sound at the default size
and strength (V = 15, ``kappa0=1000``); at a few hundred terms it fails (effective size near
1, the three values apart), and its figures are then not estimates.

Usage: python bench/bench_relays.py [--topics 3] [--words 5] [--documents 180] [--length 30]
       [--kappa0 K] [--seed 0] [--samples 200000]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import scipy.sparse as sp
from scipy.special import gammaln

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from streamtree.likelihoods.base import document_set
from streamtree.model import DTSSBP
from streamtree.relays import relay_chains

#: the importance sampler's proposal concentrations, as multiples of the link strength
PROPOSAL_SCALES = (0.3, 1.0, 3.0)
STRENGTH_GRID = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0)


def disjoint_topics(n_topics: int, n_words: int, n_docs: int, length: int,
                    seed: int) -> tuple[sp.csr_matrix, np.ndarray]:
    """Token counts of ``n_docs`` documents, each ``length`` tokens uniform over the ``n_words``
    words of one uniformly drawn topic (topic ``k`` owns words ``k n_words .. (k + 1) n_words - 1``),
    and each document's topic."""
    rng = np.random.default_rng(seed)
    topic = rng.integers(n_topics, size=n_docs)
    counts = np.zeros((n_docs, n_topics * n_words))
    for i, k in enumerate(topic):
        counts[i, k * n_words:(k + 1) * n_words] = rng.multinomial(length, np.full(n_words, 1.0 / n_words))
    return sp.csr_matrix(counts), topic


def log_dm(alpha: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Log Dirichlet-multinomial marginal of summed counts ``n`` under ``Dir(alpha)``, without the
    multinomial coefficients (rows of ``alpha`` in one call)."""
    return (gammaln(alpha.sum(-1)) - gammaln(alpha.sum(-1) + n.sum())
            + (gammaln(alpha + n) - gammaln(alpha)).sum(-1))


def log_dirichlet(x: np.ndarray, a: np.ndarray) -> np.ndarray:
    return gammaln(a.sum(-1)) - gammaln(a).sum(-1) + ((a - 1.0) * np.log(x)).sum(-1)


def through_relay(parent: np.ndarray, n: np.ndarray, strength: float, floor: float, tau: float,
                  samples: int, rng: np.random.Generator) -> tuple[float, float]:
    """log of the integral over a relay's word distribution ``t`` of ``Dir(t; s parent + eps)``
    times the marginal of counts ``n`` below ``t`` (no coefficients), and the effective sample
    size of its last importance-sampling pass; the proposal ``Dir(tau m)`` is re-centred on the
    weighted mean after each pass."""
    prior = strength * parent + floor
    centre = prior + n * strength / (strength + n.sum())
    centre /= centre.sum()
    for _ in range(3):
        q = tau * centre
        g = np.maximum(rng.standard_gamma(np.broadcast_to(q, (samples, q.size))), 1e-300)
        t = g / g.sum(axis=1, keepdims=True)
        log_w = log_dirichlet(t, prior) + log_dm(strength * t + floor, n) - log_dirichlet(t, q)
        w = np.exp(log_w - log_w.max())
        centre = (w[:, None] * t).sum(axis=0) / w.sum()
    return float(log_w.max() + np.log(w.mean())), float(w.sum() ** 2 / (w ** 2).sum())


def occupied_relays(tree) -> int:
    """The relays of an epoch's tree whose chain leads to documents (those among its occupied nodes)."""
    below = dict(zip(tree.node_ids.tolist(), tree.subtree_counts.tolist()))
    chains = relay_chains(tree.node_ids, tree.parent, tree.counts)
    return sum(1 for chain in chains.values() for r in chain if below[r] > 0)


def describe(model: DTSSBP) -> str:
    tree = model.trees_[-1]
    held = np.bincount(tree.depth[tree.counts > 0], minlength=int(tree.depth.max()) + 1)
    return (f"{tree.n_nodes} nodes, {occupied_relays(tree)} relays, nodes holding documents by depth {held.tolist()}, "
            f"kappa0_ {float(model.kappa0_):g}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topics", type=int, default=3)
    p.add_argument("--words", type=int, default=5, help="words of each topic (V = topics x words)")
    p.add_argument("--documents", type=int, default=180)
    p.add_argument("--length", type=int, default=30, help="tokens per document")
    p.add_argument("--kappa0", type=float, default=None, help="the first fit's link strength (default: the model's)")
    p.add_argument("--seed", type=int, default=0, help="corpus, sampler and importance sampling")
    p.add_argument("--samples", type=int, default=200_000, help="importance samples per pass")
    args = p.parse_args()

    X, _ = disjoint_topics(args.topics, args.words, args.documents, args.length, args.seed)
    print(f"== relays: {args.topics} topics of {args.words} disjoint words (V = {X.shape[1]}), "
          f"{args.documents} documents of {args.length} tokens; DTSSBP max_depth=3")
    fits = {}
    first = {} if args.kappa0 is None else {"kappa0": args.kappa0}
    for name, settings in (("defaults" if args.kappa0 is None else f"kappa0={args.kappa0:g}", first),
                           ('kappa0="auto"', {"kappa0": "auto"})):
        c0 = time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = DTSSBP(max_depth=3, random_state=args.seed, **settings).partial_fit(X)
        model.close()
        fits[name] = model
        print(f"-- {name}: {describe(model)} ({time.process_time() - c0:.1f} s CPU)")

    model = next(iter(fits.values()))
    lik, tree = model.likelihood_, model.trees_[-1]
    strength = float(lik.new_node_prior(1))
    root = tree.theta[int(np.flatnonzero(tree.depth == 0)[0])]
    rng = np.random.default_rng(args.seed)
    taus = [scale * strength for scale in PROPOSAL_SCALES]
    print(f"-- each leaf's documents (multinomial, without coefficients), log marginal below the root's fitted "
          f"word distribution; link strength {strength:g} unless said; one relay at proposal concentrations "
          + " / ".join(f"{t:g}" for t in taus) + f" ({args.samples} samples a pass)")
    print(f"{'leaf':>5} {'docs':>5} {'directly':>10} {'one relay':>10} {'relay gain':>10} {'at each proposal':>28} "
          f"{'ESS at each':>22} {'best strength':>13} {'directly there':>14}")
    for k in np.flatnonzero((tree.counts > 0) & (tree.depth > 0)):
        rows = np.flatnonzero(tree.assignments == tree.node_ids[k])
        docs = document_set(X, rows)
        n = np.asarray(docs.s, dtype=np.float64)
        # the family's own value (its strength from the depth, its sums only: no coefficients either)
        direct = lik.log_marginal(docs, root, strength, 1)
        runs = [through_relay(root, n, strength, lik.floor, tau, args.samples, rng) for tau in taus]
        relay = [value for value, _ in runs]
        grid = {s: float(log_dm(s * root + lik.floor, n)) for s in STRENGTH_GRID}
        best = max(grid, key=grid.get)
        print(f"{int(tree.node_ids[k]):>5} {rows.size:>5} {direct:>10.1f} {relay[1]:>10.1f} {relay[1] - direct:>10.1f} "
              f"{' / '.join(f'{v:.1f}' for v in relay):>28} {' / '.join(f'{e:.0f}' for _, e in runs):>22} "
              f"{best:>13g} {grid[best]:>14.1f}")


if __name__ == "__main__":
    main()
