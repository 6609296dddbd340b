"""CPU cost of the bursty (DCM) predictive density: the new-node term with its negligible
table-count coefficients dropped (the default) against the full product, in the same run.

``score_samples``, ``evaluate`` and ``assign`` score held-out documents under bursty
documents (the multinomial default, ``document_concentration="auto"``) with
:func:`streamtree.likelihoods.document_tables.dcm_log_mixture`. A new node's term sums over the
document's table counts as a product of per-word polynomials, whose full form costs about the
document's length times its repeated tokens per document and new node, so long documents
dominate. The default drops the coefficients that cannot reach ``exp(DCM_LOG_EPS)`` of the
result (``log_eps=-inf`` keeps them all: the baseline).

Data: the repository's SOU paragraphs, as paragraphs by decade (short documents) and as whole
addresses by 40 years (long ones). For each, ``DTSSBP(max_depth=3)`` at its defaults fits every
epoch but the last; the last epoch's documents are then scored once through ``score_samples``,
whose call of ``dcm_log_mixture`` is recorded and timed again with either setting (best of
``--repeats``). Prints CPU seconds, their ratio and the largest difference of the densities.

``--synthetic`` adds 60 documents of 300-1,500 tokens drawn from sparse word distributions over
V = 2,000, scored at four new nodes
whose Dirichlet parameters have totals from 1 to 1e4, at document concentrations from 5 to 2,000.

Usage: python bench/bench_dcm_cost.py [--repeats 3] [--max-features 2000] [--synthetic]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import scipy.sparse as sp

import streamtree  # noqa: F401  (configures numba's cache before any model import)
import streamtree.likelihoods.multinomial as multinomial
from streamtree.likelihoods.document_tables import DCM_LOG_EPS, dcm_log_mixture
from streamtree.model import DTSSBP
from streamtree.text import TextVectorizer

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "sotu_paragraphs.parquet"


def corpora() -> dict[str, tuple[list[str], np.ndarray]]:
    """(texts, epoch of each) for paragraphs by decade and whole addresses by 40 years."""
    rows = pq.read_table(DATA, columns=["fileid", "year", "paragraph", "text"]).to_pylist()
    rows.sort(key=lambda r: (r["year"], r["fileid"], r["paragraph"]))
    paragraphs = ([r["text"] for r in rows], np.array([(r["year"] - 1790) // 10 for r in rows]))
    joined: dict[str, list[str]] = defaultdict(list)
    year: dict[str, int] = {}
    for r in rows:
        joined[r["fileid"]].append(r["text"])
        year[r["fileid"]] = r["year"]
    ids = sorted(joined, key=lambda f: (year[f], f))
    addresses = ([" ".join(joined[f]) for f in ids], np.array([(year[f] - 1790) // 40 for f in ids]))
    return {"paragraphs by decade": paragraphs, "whole addresses by 40 years": addresses}


def recorded_call(model: DTSSBP, X) -> tuple:
    """The arguments ``score_samples(X)`` hands ``dcm_log_mixture``."""
    seen = []

    def spy(*args):
        seen.append(args)
        return dcm_log_mixture(*args)

    multinomial.dcm_log_mixture = spy
    try:
        model.score_samples(X)
    finally:
        multinomial.dcm_log_mixture = dcm_log_mixture
    return seen[0]


def best_cpu(args: tuple, log_eps: float, repeats: int) -> tuple[float, np.ndarray]:
    best, out = np.inf, None
    for _ in range(repeats):
        t = time.process_time()
        out = dcm_log_mixture(*args, log_eps=log_eps)
        best = min(best, time.process_time() - t)
    return best, out


def synthetic(repeats: int) -> None:
    """Long synthetic documents at new nodes of several Dirichlet totals and concentrations."""
    rng = np.random.default_rng(0)
    V = 2000
    X = sp.csr_matrix(np.array([rng.multinomial(n, rng.dirichlet(np.full(V, 0.05)))
                                for n in rng.integers(300, 1500, size=60)], dtype=np.float64))
    for total, s in [(1.0, 50.0), (100.0, 5.0), (1000.0, 50.0), (1000.0, 500.0), (1e4, 2000.0)]:
        alpha = total * rng.dirichlet(np.full(V, 0.3), size=4) + 1e-3
        call = (X, np.zeros((0, V)), np.zeros(0), alpha, np.full(4, np.log(0.25)), s)
        full_cpu, full = best_cpu(call, -np.inf, repeats)
        cut_cpu, cut = best_cpu(call, DCM_LOG_EPS, repeats)
        name = f"synthetic, total {total:g}, s {s:g}"
        print(f"{name:30s} {X.shape[0]:11d} {'300-1500':>22s} {4:9d} {full_cpu:8.3f} {cut_cpu:9.3f} "
              f"{full_cpu / cut_cpu:5.1f}x {np.max(np.abs(cut - full)):10.2e}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-features", type=int, default=2000)
    p.add_argument("--synthetic", action="store_true", help="also long synthetic documents")
    args = p.parse_args()
    print(f"cut: log_eps = {DCM_LOG_EPS:g} (default) against -inf (the full product); best of {args.repeats}")
    print(f"{'corpus':30s} {'scored docs':>11s} {'tokens (median / max)':>22s} {'new nodes':>9s} "
          f"{'full s':>8s} {'default s':>9s} {'ratio':>6s} {'max |diff|':>10s}")
    for name, (texts, epoch) in corpora().items():
        last = epoch.max()
        vec = TextVectorizer(norm=None, max_features=args.max_features, min_df=2, max_df=0.5)
        vec.fit([t for t, e in zip(texts, epoch) if e < last])
        X = vec.transform(texts)
        keep = np.asarray(X.sum(axis=1)).ravel() > 0  # the model refuses empty documents
        X, epoch = X[keep], epoch[keep]
        model = DTSSBP(max_depth=3, random_state=0)
        for e in range(last):
            if np.any(epoch == e):
                model.partial_fit(X[epoch == e], epoch=int(e))
        call = recorded_call(model, X[epoch == last])
        dcm_log_mixture(*call)  # compiled before timing
        full_cpu, full = best_cpu(call, -np.inf, args.repeats)
        cut_cpu, cut = best_cpu(call, DCM_LOG_EPS, args.repeats)
        tokens = np.asarray(call[0].sum(axis=1)).ravel()
        print(f"{name:30s} {call[0].shape[0]:11d} {f'{np.median(tokens):.0f} / {tokens.max():.0f}':>22s} "
              f"{call[3].shape[0]:9d} {full_cpu:8.3f} {cut_cpu:9.3f} {full_cpu / cut_cpu:5.1f}x "
              f"{np.max(np.abs(cut - full)):10.2e}", flush=True)
    if args.synthetic:
        synthetic(args.repeats)


if __name__ == "__main__":
    main()
