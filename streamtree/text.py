"""Text vectoriser with a persisted vocabulary: L2-normalised term frequencies in CSR form.

The vocabulary is fitted once (over a whole corpus, or over a warm-up span the caller
chooses) and then fixed, so every epoch's matrix has the same columns and theta vectors of
different epochs are comparable. Documents whose every token is outside the vocabulary have
an all-zero row that cannot be normalised; :meth:`TextVectorizer.transform` reports them in a
mask instead of dropping them, and the caller files them as rejects with reason
``"empty after vocabulary filtering"``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import scipy.sparse as sp
from sklearn.base import BaseEstimator
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.preprocessing import normalize

# Words of two or more letters in any script: digits and underscores are separators, so
# numbers ("1790", "$5") never become terms.
TOKEN_PATTERN = r"(?u)\b[^\W\d_]{2,}\b"
_META_KEY = b"streamtree.vectorizer"


class TextVectorizer(BaseEstimator):
    """Bag-of-words vectoriser producing rows on the unit sphere (for the vMF likelihood).

    Parameters
    ----------
    min_df : int or float, default=2
        Ignore terms in fewer documents than this (a float is a fraction of documents).
    max_df : int or float, default=0.5
        Ignore terms in more documents than this (a float is a fraction of documents).
    max_features : int or None, default=None
        Keep only the most frequent terms.
    stop_words : "english", list of str or None, default="english"
        Terms removed before counting.
    lowercase : bool, default=True
        Lower-case before tokenising.
    token_pattern : str, default :data:`TOKEN_PATTERN`
        Regular expression for tokens (Unicode-aware).

    Attributes
    ----------
    vocabulary_ : ndarray of str, shape (p,)
        Terms in column order.
    document_frequency_ : ndarray of int64, shape (p,)
        Documents of the fitting corpus containing each term.
    n_fit_documents_ : int
        Documents the vocabulary was fitted on.
    """

    def __init__(
        self,
        min_df: int | float = 2,
        max_df: int | float = 0.5,
        max_features: int | None = None,
        stop_words: str | list[str] | None = "english",
        lowercase: bool = True,
        token_pattern: str = TOKEN_PATTERN,
    ) -> None:
        self.min_df = min_df
        self.max_df = max_df
        self.max_features = max_features
        self.stop_words = stop_words
        self.lowercase = lowercase
        self.token_pattern = token_pattern

    def _params(self) -> dict:
        return {"min_df": self.min_df, "max_df": self.max_df, "max_features": self.max_features,
                "stop_words": self.stop_words, "lowercase": self.lowercase,
                "token_pattern": self.token_pattern}

    def _counter(self, vocabulary=None) -> CountVectorizer:
        return CountVectorizer(
            lowercase=self.lowercase, token_pattern=self.token_pattern, stop_words=self.stop_words,
            min_df=self.min_df, max_df=self.max_df, max_features=self.max_features,
            vocabulary=vocabulary, dtype=np.float64,
        )

    def fit(self, texts: Iterable[str]) -> "TextVectorizer":
        """Fit the vocabulary on ``texts`` (strings; a pyarrow string array works too)."""
        self._fit(_as_list(texts))
        return self

    def _fit(self, texts: list[str]) -> sp.csr_matrix:
        if not texts:
            raise ValueError("cannot fit a vocabulary on zero documents")
        counter = self._counter()
        try:
            counts = counter.fit_transform(texts)
        except ValueError as exc:  # e.g. every term pruned by min_df / max_df
            raise ValueError(f"vocabulary fitting failed on {len(texts)} documents: {exc}") from None
        self.vocabulary_ = np.asarray(counter.get_feature_names_out(), dtype=str)
        self.document_frequency_ = np.asarray((counts > 0).sum(axis=0), dtype=np.int64).ravel()
        self.n_fit_documents_ = len(texts)
        self._fixed = self._counter({t: i for i, t in enumerate(self.vocabulary_)})
        return counts.tocsr()

    def transform(self, texts: Iterable[str]) -> tuple[sp.csr_matrix, np.ndarray]:
        """Term frequencies of ``texts`` over the fixed vocabulary, rows scaled to unit L2 norm.

        Returns
        -------
        X : scipy.sparse.csr_matrix of float64, shape (n, p)
            One row per input text, in order; rows of ``empty_mask`` are all zero.
        empty_mask : ndarray of bool, shape (n,)
            Texts with no vocabulary term (route them to rejects).
        """
        self._check_fitted()
        return _unit_rows(self._fixed.transform(_as_list(texts)).tocsr())

    def fit_transform(self, texts: Iterable[str]) -> tuple[sp.csr_matrix, np.ndarray]:
        """``fit(texts).transform(texts)``, tokenising only once."""
        # CountVectorizer's fitted columns are the sorted terms, i.e. vocabulary_ order.
        return _unit_rows(self._fit(_as_list(texts)))

    def vocabulary_hash(self) -> str:
        """sha256 (hex) of the terms in column order, one per line: identifies the columns."""
        self._check_fitted()
        h = hashlib.sha256()
        h.update("\n".join(self.vocabulary_.tolist()).encode("utf-8"))
        return h.hexdigest()

    # ---- persistence -----------------------------------------------------------------
    def to_arrow(self) -> pa.Table:
        """The vocabulary as a table (``index``, ``term``, ``document_frequency``); the
        settings and hash ride along in the schema metadata."""
        self._check_fitted()
        meta = {"params": self._params(), "n_fit_documents": int(self.n_fit_documents_),
                "vocabulary_hash": self.vocabulary_hash()}
        table = pa.table({
            "index": pa.array(np.arange(self.vocabulary_.shape[0]), pa.int32()),
            "term": pa.array(self.vocabulary_.tolist(), pa.string()),
            "document_frequency": pa.array(self.document_frequency_, pa.int64()),
        })
        return table.replace_schema_metadata({_META_KEY: json.dumps(meta).encode()})

    @classmethod
    def from_arrow(cls, table: pa.Table) -> "TextVectorizer":
        """Rebuild a fitted vectoriser from :meth:`to_arrow` output (e.g. read from Parquet)."""
        meta = (table.schema.metadata or {}).get(_META_KEY)
        if meta is None:
            raise ValueError("table carries no vectorizer metadata (was it written by TextVectorizer.to_arrow?)")
        meta = json.loads(meta)
        params = meta["params"]
        vec = cls(**params)
        order = np.argsort(np.asarray(table.column("index").to_numpy(), dtype=np.int64), kind="stable")
        vec.vocabulary_ = np.asarray(table.column("term").to_pylist(), dtype=str)[order]
        vec.document_frequency_ = np.asarray(table.column("document_frequency").to_numpy(), dtype=np.int64)[order]
        vec.n_fit_documents_ = int(meta["n_fit_documents"])
        vec._fixed = vec._counter({t: i for i, t in enumerate(vec.vocabulary_)})
        if vec.vocabulary_hash() != meta["vocabulary_hash"]:
            raise ValueError("vocabulary table does not match its recorded hash (terms reordered or edited)")
        return vec

    def _check_fitted(self) -> None:
        if not hasattr(self, "vocabulary_"):
            raise RuntimeError("TextVectorizer is not fitted; call fit(texts) first")


def _unit_rows(counts: sp.csr_matrix) -> tuple[sp.csr_matrix, np.ndarray]:
    counts.sort_indices()
    X = normalize(counts.astype(np.float64), norm="l2", axis=1, copy=False)
    return sp.csr_matrix(X), np.diff(X.indptr) == 0


def _as_list(texts) -> list[str]:
    if isinstance(texts, (pa.Array, pa.ChunkedArray)):
        return texts.to_pylist()
    if isinstance(texts, str):
        raise TypeError("texts must be an iterable of strings, not a single string")
    return list(texts)
