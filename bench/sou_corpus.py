"""The State of the Union corpus by decade with the demo's vocabulary, for the SOU benchmarks.

One place for what the SOU quality and speed benchmarks share: the demo's vocabulary settings
(a 2,000-term vocabulary fitted on the whole corpus, terms in at least 5 paragraphs and at
most half of them), the decade epochs, the model's input (L2-normalised term frequencies)
and the same documents as token counts and token lists for peer libraries. Paragraphs with
no vocabulary term are left out of every side alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.preprocessing import normalize

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from streamtree.records import DEFAULT_DUPLICATE_TEXTS, DUPLICATE_TEXT
from streamtree.replay import ReplayConfig, fit_vocabulary, read_epochs

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "sotu_paragraphs.parquet"


@dataclass
class SouCorpus:
    labels: list[str]  # decade label per epoch, e.g. "1790s"
    counts: list[sp.csr_matrix]  # per decade, token counts of the non-empty paragraphs
    X: list[sp.csr_matrix]  # per decade, the model's input: rows of counts scaled to unit L2 norm
    vocabulary: np.ndarray  # terms in column order

    @property
    def n_documents(self) -> int:
        return sum(c.shape[0] for c in self.counts)

    def all_counts(self) -> sp.csr_matrix:
        return sp.vstack(self.counts, format="csr")

    def token_lists(self, t: int) -> list[list[str]]:
        """Decade ``t``'s documents as lists of vocabulary terms (each repeated by its count;
        order within a document is lost, which bag-of-words models do not see anyway)."""
        C = self.counts[t]
        vocab = self.vocabulary
        return [np.repeat(vocab[C.indices[a:b]], C.data[a:b].astype(np.int64)).tolist()
                for a, b in zip(C.indptr[:-1], C.indptr[1:])]


def vectorise(vec, texts) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """(token counts, model input) of ``texts`` over the fitted vocabulary of ``vec``.

    The model input is what ``TextVectorizer.transform`` returns (a matrix, or a
    ``(matrix, empty_mask)`` tuple in older versions); the counts come from a plain
    ``CountVectorizer`` with the same settings and terms, and are checked to have the same
    nonzero pattern.
    """
    out = vec.transform(texts)
    X = out[0] if isinstance(out, tuple) else out
    counter = CountVectorizer(lowercase=vec.lowercase, token_pattern=vec.token_pattern,
                              stop_words=vec.stop_words,
                              vocabulary={t: i for i, t in enumerate(vec.vocabulary_)}, dtype=np.float64)
    texts = texts.to_pylist() if hasattr(texts, "to_pylist") else list(texts)
    counts = sp.csr_matrix(counter.transform(texts))
    counts.sort_indices()
    X = sp.csr_matrix(X)
    if X.shape != counts.shape or X.nnz != counts.nnz:
        raise RuntimeError("the token counts do not match the vectoriser's output; update vectorise()")
    return counts, X


def load_sou(max_features: int = 2000, decades: str | None = None, path: Path = DATA,
             duplicate_texts: str = DEFAULT_DUPLICATE_TEXTS) -> SouCorpus:
    """SOU paragraphs by decade, vectorised as the demo does.

    ``decades`` selects a subset: comma-separated labels (``"1790s,1800s"``) or a number N
    for the first N decades. The vocabulary is always fitted on the whole corpus. Under
    ``duplicate_texts`` other than ``"keep"`` a paragraph repeating an earlier one's text in its
    decade (salutations, about 2% of them) is left out, as the product fits each text once.
    """
    config = ReplayConfig(source=str(path), text_col="text", time_col="year", time_unit="year", epoch="10y",
                          min_df=5, max_df=0.5, max_features=max_features, duplicate_texts=duplicate_texts)
    epochs, _ = read_epochs(config)
    epochs = [e for e in epochs if e.rows.num_rows]
    vec = fit_vocabulary(config, epochs)
    if decades:
        if decades.strip().isdigit():
            epochs = epochs[: int(decades)]
        else:
            wanted = [d.strip() for d in decades.split(",") if d.strip()]
            known = {e.label: e for e in epochs}
            missing = [d for d in wanted if d not in known]
            if missing:
                raise SystemExit(f"--decades: unknown {missing}; decades are {', '.join(known)}")
            epochs = [known[d] for d in wanted]
    labels, counts, X = [], [], []
    for e in epochs:
        if duplicate_texts != "keep":
            e = e.reject(e.repeated_texts(), DUPLICATE_TEXT)
        C, Xe = vectorise(vec, e.rows.column("text"))
        keep = np.diff(C.indptr) > 0
        labels.append(e.label)
        counts.append(C[keep])
        X.append(normalize(Xe[keep], norm="l2", axis=1))
    return SouCorpus(labels=labels, counts=counts, X=X, vocabulary=np.asarray(vec.vocabulary_))
