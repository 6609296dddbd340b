"""How much a document gains from a node of its own: raw counts against table counts.

The split-merge moves and the z-kernel's new-node columns compare a document's collapsed
marginal in a new node below ``phi``, ``DM(x | kappa0 phi + eps)``, with its likelihood at
``phi``, ``Mult(x | phi)``. For multinomial documents the k-th repeat of a word earns
``log(1 + k / (kappa0 phi_w))`` from the new node, so bursty paragraphs gain a lot
(BENCHMARKS.md, "Children read through E[log phi] ..."). With DCM documents
(``document_concentration``) the same comparison reads the table counts ``T`` drawn given
``phi`` and the document concentration ``s`` instead of ``x``.

At the default ``kappa0 = 1000``: median and mean gain, and the share of documents gaining
more than 3 nats, for ``x`` (the baseline, the current default) and for ``T``. SOU decades
1880s and 1940s at ``phi`` = the decade's word frequencies (the true nodes are unknown), ``T``
at ``s`` = the Polya maximum-likelihood concentration about ``phi`` (the sampler's starting
value) and at ``--s``; the planted tree's epoch 0 at each document's true node, ``T`` at
``--s`` and ``--s-planted``.

    python bench/bench_burst_gain.py [--s 400] [--s-planted 5000] [--seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np
import scipy.sparse as sp
from scipy.special import gammaln

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from streamtree.likelihoods.document_tables import draw_tables, polya_concentration
from streamtree.likelihoods.multinomial import DIRICHLET_FLOOR
from streamtree.synthetic import planted_dirichlet_tree
from sou_corpus import load_sou

KAPPA0 = 1000.0
THRESHOLD = 3.0


def gains(C: sp.csr_matrix, theta: np.ndarray, node_of_row: np.ndarray) -> np.ndarray:
    """Per row: log DM(c | kappa0 phi + eps) - c . log phi, with phi = theta[node_of_row[row]]."""
    C = sp.csr_matrix(C)
    rows = np.repeat(np.arange(C.shape[0]), np.diff(C.indptr))
    phi_nz = theta[node_of_row[rows], C.indices]
    a_nz = KAPPA0 * phi_nz + DIRICHLET_FLOOR
    total = KAPPA0 + DIRICHLET_FLOOR * theta.shape[1]
    n = np.asarray(C.sum(axis=1)).ravel()
    per_entry = gammaln(a_nz + C.data) - gammaln(a_nz) - C.data * np.log(phi_nz)
    return gammaln(total) - gammaln(total + n) + np.bincount(rows, per_entry, minlength=C.shape[0])


def report(name: str, X: sp.csr_matrix, theta: np.ndarray, node_of_row: np.ndarray, s_values: list[tuple[str, float]],
           rng: np.random.Generator) -> None:
    X = sp.csr_matrix(X, dtype=np.float64)
    rows = [("x (multinomial)", X)]
    for label, s in s_values:
        rows.append((f"T at {label} = {s:.0f}", draw_tables(X, theta, node_of_row, s, rng)))
    repeats = float(np.sum(X.data - 1.0)) / float(X.data.sum())
    print(f"{name}: {X.shape[0]} documents, {100 * repeats:.1f}% of tokens repeat a word of their document")
    for label, C in rows:
        g = gains(C, theta, node_of_row)
        print(f"  {label:>22}: median {np.median(g):6.2f}, mean {g.mean():6.2f}, "
              f"> {THRESHOLD:g} nats {100 * np.mean(g > THRESHOLD):5.1f}%, tokens kept "
              f"{100 * C.data.sum() / X.data.sum():5.1f}%")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--s", type=float, default=400.0, help="a document concentration to compare (default 400)")
    p.add_argument("--s-planted", type=float, default=5000.0,
                   help="a second s for the planted corpus (default 5000, the order sampled there)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    sou = load_sou(decades="1880s,1940s")
    for label, C in zip(sou.labels, sou.counts):
        C = sp.csr_matrix(C, dtype=np.float64)
        phi = np.asarray(C.sum(axis=0)).ravel() + 1e-12
        phi /= phi.sum()
        s_mle = polya_concentration(C, phi)
        report(f"SOU {label}, phi = the decade's frequencies", C, phi[None], np.zeros(C.shape[0], dtype=np.int64),
               [("s_MLE", s_mle), ("s", args.s)], rng)
    planted = planted_dirichlet_tree(np.random.default_rng(args.seed))
    node_of_row = np.searchsorted(planted.node_ids[0], planted.labels[0])
    report("planted tree, epoch 0, phi = each document's true node", planted.counts[0], planted.word_dists[0],
           node_of_row, [("s", args.s), ("s", args.s_planted)], rng)

if __name__ == "__main__":
    main()
