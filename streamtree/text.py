"""Text vectoriser with a persisted vocabulary: term frequencies in CSR form.

The vocabulary is fitted once (over a whole corpus, or over a warm-up span the caller
chooses) and then fixed, so every epoch's matrix has the same columns and theta vectors of
different epochs are comparable. Rows are L2-normalised term frequencies scaled to the
document's weight (for the vMF likelihood; :data:`DEFAULT_LENGTH_POWER`) or raw term counts
(``norm=None``, for the multinomial likelihood). Documents whose every token is outside the
vocabulary have an all-zero row; :meth:`TextVectorizer.transform` keeps them in place and
:meth:`TextVectorizer.empty_rows` finds them, so the caller can file them as rejects with
reason ``"empty after vocabulary filtering"``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import numbers
import re
from collections import Counter
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import scipy.sparse as sp
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.exceptions import NotFittedError
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS, CountVectorizer
from sklearn.preprocessing import normalize
from sklearn.utils._param_validation import Interval, StrOptions, validate_parameter_constraints

from streamtree.likelihoods import DEFAULT_LIKELIHOOD, LIKELIHOODS

# Words of two or more letters in any script: digits and underscores are separators, so
# numbers ("1790", "$5") never become terms.
TOKEN_PATTERN = r"(?u)\b[^\W\d_]{2,}\b"
#: Runs of the scripts written without spaces between words: Chinese characters (and Japanese
#: kanji) and the Japanese kana. The token pattern takes a whole sentence of them as one token,
#: which no other document repeats, so such documents were all but lost to ``min_df``.
UNSPACED_RUN = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
#: how a run of :data:`UNSPACED_RUN` characters becomes terms: ``"bigrams"``, each pair of
#: neighbouring characters (the usual way to index Chinese and Japanese without a dictionary:
#: most words are one or two characters, and a pair inside a longer word still marks it);
#: ``"runs"``, the whole run as one term (what vocabularies stored before kept)
UNSPACED_TERMS = ("bigrams", "runs")
_META_KEY = b"streamtree.vectorizer"
#: Web addresses (a scheme such as ``https://``, a leading ``www.``, or a bare host name under a
#: common top-level domain, with what follows it: ``github.com:user/repo``), and e-mail addresses.
#: Their pieces ("https", "www", "com", "github", a mailer's user and host names) are not words
#: of the text; in commit messages, changelogs, mail and posts they topped nodes. A bare host's
#: domain is lower-case: "ASP.NET", "VB.NET" and "System.IO" are names, not hosts.
_DOMAINS = ("com", "org", "net", "edu", "gov", "io")
ADDRESS_PATTERN = re.compile(r"(?i:\b(?:[a-z][a-z0-9+.-]*://|www\.)\S+|[\w.+-]+@[\w-]+(?:\.[\w-]+)+)"
                             r"|\b(?:[A-Za-z0-9-]+\.)+(?:" + "|".join(_DOMAINS) + r")\b(?:[:/]\S*)?")
_ADDRESS_HINTS = ("@", "://", "www.", *(f".{d}" for d in _DOMAINS))

# The one place the text defaults are written: the CLI, replay, serve and the demo read them here.
#: drop terms in fewer documents than this
DEFAULT_MIN_DF = 2
#: drop terms in more than this fraction of documents
DEFAULT_MAX_DF = 0.5
#: ``"auto"``: a vocabulary cap chosen from the corpus size (see :func:`vocabulary_cap`)
DEFAULT_MAX_FEATURES = "auto"
#: term weighting before L2 normalisation (vMF rows); see :class:`TextVectorizer`. tf-idf rows
#: gave the vMF's largest nodes more coherent top words than plain frequencies on the State of the
#: Union corpus (NPMI 0.147-0.150 against 0.127-0.132, higher in 18-20 of 24 decades, two seeds;
#: BENCHMARKS.md). The multinomial reads raw counts and ignores it.
DEFAULT_WEIGHTING = "tfidf"
#: how Chinese and Japanese text becomes terms (:data:`UNSPACED_TERMS`)
DEFAULT_UNSPACED_TERMS = "bigrams"
#: ... in vocabularies and stores written before character pairs
UNSPACED_TERMS_BEFORE_BIGRAMS = "runs"
#: the weighting of vocabularies and stores written before tf-idf became the default
WEIGHTING_BEFORE_TFIDF = "tf"
#: vMF rows: a document's weight (its row's norm) is ``(L / L_ref) ** length_power``, L its token
#: count over the vocabulary and L_ref the fitting documents' median; the vMF reads it as the
#: document's share of its node's concentration (``DTSSBP(document_weights="auto")``). A document
#: of L tokens drawn from one topic has cosine about ``sqrt(q L / (q L + 1))`` to it (q the
#: topic's squared norm), which for short documents grows like ``sqrt(L)``, and the vMF
#: concentration that matches a small mean cosine grows in proportion to it: hence power 1/2.
#: With unit rows one concentration per node cannot fit a topic's short and long documents
#: together, and the short ones swarm into nodes of their own. Measured (BENCHMARKS.md): planted
#: hierarchical-Dirichlet trees, four seeds, 29 of 32 per-epoch targets at power 1/2 against 26
#: at power 1 and 24 with unit rows; State of the Union paragraphs (tf-idf) NPMI 0.158 against
#: 0.150, ids living one decade 3% against 7%, at 1.8 times the fit's CPU (larger trees). On short
#: mixed texts (Debian changelog entries) both swarm and the weights grow the swarm by half. The
#: multinomial reads raw counts and ignores it.
DEFAULT_LENGTH_POWER = 0.5
#: the length power of vocabularies and stores written before documents were weighted: unit rows
LENGTH_POWER_BEFORE_WEIGHTS = 0.0
#: words stored per node by replay and serve (``EpochTree.label_words`` for word distributions)
DEFAULT_TOP_WORDS = 10

#: Words of news and speech reporting that carry no topic ("mr", "said", "told") and topped
#: many nodes of news trees; added to scikit-learn's English list for ``stop_words="english"``.
REPORTING_STOP_WORDS = frozenset("""
    mr mrs ms dr said says say saying told tell tells telling asked according reported reportedly
    added just like ve ll don didn doesn isn wasn aren won going got
""".split())
#: Stage directions of transcripts, "(Laughter.)", "[applause]", "(inaudible)": a transcriber's
#: notes, not the speaker's words. In the State of the Union corpus they made "laughter" and
#: "applause" top words of nodes of recent decades; the token pattern strips the brackets.
TRANSCRIPT_STOP_WORDS = frozenset("laughter applause inaudible crosstalk unintelligible".split())
STOP_WORDS = frozenset(ENGLISH_STOP_WORDS | REPORTING_STOP_WORDS | TRANSCRIPT_STOP_WORDS)


def vocabulary_cap(n_documents: int) -> int:
    """The ``max_features="auto"`` cap: ``200 * n**(1/3)`` terms, clipped to [500, 20000].

    Vocabularies grow like a power of the corpus (Heaps' law) and most of the tail are terms
    seen in a handful of documents, which cost memory and time in every node's direction
    but hardly move a tree. A cube-root cap keeps ~2,000 terms for 1,000 documents, ~3,200
    for 4,000, ~5,900 for the 25,000 State of the Union paragraphs and 20,000 for a million.
    """
    return int(np.clip(round(200.0 * max(int(n_documents), 1) ** (1.0 / 3.0)), 500, 20000))


#: rows in the form the estimator's default family reads (raw counts for the multinomial)
DEFAULT_NORM: str | None = LIKELIHOODS[DEFAULT_LIKELIHOOD].text_norm


class TextVectorizer(TransformerMixin, BaseEstimator):
    """Bag-of-words vectoriser with a fixed vocabulary: unit-norm rows or raw counts.

    Parameters
    ----------
    min_df : int or float, default=2
        Ignore terms in fewer documents than this (a float is a fraction of documents).
    max_df : int or float, default=0.5
        Ignore terms in more documents than this (a float is a fraction of documents).
    max_features : int, "auto" or None, default="auto"
        Keep only the most frequent terms: this many, a cap chosen from the number of fitting
        documents (``"auto"``, :func:`vocabulary_cap`; the value used is ``max_features_``),
        or all (``None``).
    stop_words : "english", list of str or None, default="english"
        Terms removed before counting; ``"english"`` is scikit-learn's list plus
        :data:`REPORTING_STOP_WORDS` and :data:`TRANSCRIPT_STOP_WORDS`.
    lowercase : bool, default=True
        Lower-case before tokenising.
    token_pattern : str, default :data:`TOKEN_PATTERN`
        Regular expression for tokens (Unicode-aware).
    unspaced_terms : {"bigrams", "runs"}, default="bigrams"
        Chinese and Japanese text (:data:`UNSPACED_RUN`), written without spaces between
        words: ``"bigrams"`` makes each pair of neighbouring characters of a token's run a
        term (``"東京タワー"``: ``東京``, ``京タ``, ``タワ``, ``ワー``; a lone character is
        dropped, as a one-letter word is), the rest of the token going through
        ``token_pattern`` again; ``"runs"`` keeps a token whole.
    strip_addresses : bool, default=True
        Remove web and e-mail addresses (:data:`ADDRESS_PATTERN`) before tokenising.
    norm : {"l2"} or None, default=None
        ``None``: raw term counts (the multinomial likelihood, the estimator's default);
        ``"l2"``: term frequencies scaled to unit Euclidean norm (the vMF likelihood). The
        default is the default family's row form, so ``TextVectorizer()`` feeds ``DTSSBP()``.
    weighting : {"tf", "tfidf"}, default="tfidf"
        With ``norm="l2"``: ``"tfidf"`` multiplies counts by the smoothed inverse document
        frequency of the fitting corpus, ``log((1 + n) / (1 + df)) + 1``, before normalising;
        ``"tf"`` normalises the counts themselves. Ignored for raw counts (the multinomial needs
        counts).
    length_power : float, default=0.5
        With ``norm="l2"``: each unit row is then scaled to the document's weight
        ``(L / reference_length_) ** length_power``, ``L`` its token count over the vocabulary;
        the vMF reads a row's norm as its document's weight (concentration ``beta w`` at a node
        of concentration ``beta``; ``DTSSBP(document_weights="auto")``), so longer documents
        are held closer to their node's direction (see :data:`DEFAULT_LENGTH_POWER` for why 1/2).
        ``0`` gives unit rows: every document weighs the same (for ``document_weights=False``).
        Ignored for raw counts.

    Attributes
    ----------
    vocabulary_ : ndarray of str, shape (p,)
        Terms in column order.
    document_frequency_ : ndarray of int64, shape (p,)
        Documents of the fitting corpus containing each term.
    n_fit_documents_ : int
        Documents the vocabulary was fitted on.
    max_features_ : int or None
        The cap used (``max_features`` resolved).
    reference_length_ : float
        Median token count (over the vocabulary) of the fitting corpus's non-empty documents:
        the length of weight 1.
    """

    def __init__(
        self,
        min_df: int | float = DEFAULT_MIN_DF,
        max_df: int | float = DEFAULT_MAX_DF,
        max_features: int | str | None = DEFAULT_MAX_FEATURES,
        stop_words: str | list[str] | None = "english",
        lowercase: bool = True,
        token_pattern: str = TOKEN_PATTERN,
        unspaced_terms: str = DEFAULT_UNSPACED_TERMS,
        strip_addresses: bool = True,
        norm: str | None = DEFAULT_NORM,
        weighting: str = DEFAULT_WEIGHTING,
        length_power: float = DEFAULT_LENGTH_POWER,
    ) -> None:
        self.min_df = min_df
        self.max_df = max_df
        self.max_features = max_features
        self.stop_words = stop_words
        self.lowercase = lowercase
        self.token_pattern = token_pattern
        self.unspaced_terms = unspaced_terms
        self.strip_addresses = strip_addresses
        self.norm = norm
        self.weighting = weighting
        self.length_power = length_power

    _parameter_constraints: dict = {
        "min_df": [Interval(numbers.Integral, 1, None, closed="left"), Interval(numbers.Real, 0, 1, closed="both")],
        "max_df": [Interval(numbers.Integral, 1, None, closed="left"), Interval(numbers.Real, 0, 1, closed="both")],
        "max_features": [Interval(numbers.Integral, 1, None, closed="left"), StrOptions({"auto"}), None],
        "stop_words": [StrOptions({"english"}), list, None],
        "lowercase": ["boolean"],
        "token_pattern": [str],
        "unspaced_terms": [StrOptions(set(UNSPACED_TERMS))],
        "strip_addresses": ["boolean"],
        "norm": [StrOptions({"l2"}), None],
        "weighting": [StrOptions({"tf", "tfidf"})],
        "length_power": [Interval(numbers.Real, 0, None, closed="left")],
    }

    def _params(self) -> dict:
        return self.get_params(deep=False)

    def _counter(self, vocabulary=None, max_features=None) -> CountVectorizer:
        stop = sorted(STOP_WORDS) if self.stop_words == "english" else self.stop_words
        if vocabulary is not None and stop is not None:
            # A fixed vocabulary keeps counting its own terms even if the stop list has grown
            # since it was fitted: a restored store must score documents as its model was fitted.
            stop = [w for w in stop if w not in vocabulary]
        # scikit-learn's own preprocessing (lower-casing) unless addresses are removed first
        preprocessor = (functools.partial(_without_addresses, lowercase=self.lowercase)
                        if self.strip_addresses else None)
        tokenising = {"token_pattern": self.token_pattern}
        if self.unspaced_terms == "bigrams":
            tokenising = {"tokenizer": functools.partial(_terms, pattern=re.compile(self.token_pattern)),
                          "token_pattern": None}
        return CountVectorizer(
            lowercase=self.lowercase, preprocessor=preprocessor, **tokenising, stop_words=stop,
            min_df=self.min_df, max_df=self.max_df, max_features=max_features,
            vocabulary=vocabulary, dtype=np.float64,
        )

    def fit(self, texts: Iterable[str], y=None) -> "TextVectorizer":
        """Fit the vocabulary on ``texts`` (strings; a pyarrow string array works too)."""
        self._fit(_as_list(texts))
        return self

    def _fit(self, texts: list[str]) -> sp.csr_matrix:
        validate_parameter_constraints(self._parameter_constraints, self.get_params(deep=False),
                                       caller_name=type(self).__name__)
        if not texts:
            raise ValueError("cannot fit a vocabulary on zero documents")
        n = len(texts)
        # document-count bounds as scikit-learn derives them (a count as given, a share of n); with a
        # count and a share, too few documents leave no room between them, whatever their words
        low, high = ((df if isinstance(df, numbers.Integral) else df * n) for df in (self.min_df, self.max_df))
        if high < low and not (isinstance(self.min_df, float) and isinstance(self.max_df, float)):
            raise ValueError(f"vocabulary fitting failed: {n} document{'s are' if n != 1 else ' is'} too few for "
                             f"min_df={self.min_df} and max_df={self.max_df} together (a term must be in at "
                             f"least min_df documents and at most max_df of them); give more documents, or "
                             f"lower min_df or raise max_df")
        cap = vocabulary_cap(n) if self.max_features == "auto" else self.max_features
        counter = self._counter(max_features=cap)
        try:
            counts = counter.fit_transform(texts)
        except ValueError as exc:  # e.g. every term pruned by min_df / max_df
            raise ValueError(f"vocabulary fitting failed on {n} documents with min_df={self.min_df} and "
                             f"max_df={self.max_df}: {exc}; lower min_df or raise max_df") from None
        self.vocabulary_ = np.asarray(counter.get_feature_names_out(), dtype=str)
        self.document_frequency_ = np.asarray((counts > 0).sum(axis=0), dtype=np.int64).ravel()
        self.n_fit_documents_ = n
        self.max_features_ = cap
        self.reference_length_ = reference_length(counts)
        self._fixed = self._counter({t: i for i, t in enumerate(self.vocabulary_)})
        return counts.tocsr()

    @property
    def idf_(self) -> np.ndarray:
        """Smoothed inverse document frequencies of the fitting corpus, by column."""
        self._check_fitted()
        return np.log((1.0 + self.n_fit_documents_) / (1.0 + self.document_frequency_)) + 1.0

    def transform(self, texts: Iterable[str]) -> sp.csr_matrix:
        """Term frequencies of ``texts`` over the fixed vocabulary (counts, or with ``norm="l2"``
        unit rows scaled to the documents' weights by ``length_power``).

        Returns
        -------
        X : scipy.sparse.csr_matrix of float64, shape (n, p)
            One row per input text, in order. Texts with no vocabulary term have all-zero rows:
            :meth:`empty_rows` finds them (route them to rejects).
        """
        self._check_fitted()
        return self._finish(self._fixed.transform(_as_list(texts)).tocsr())

    def fit_transform(self, texts: Iterable[str], y=None) -> sp.csr_matrix:
        """``fit(texts).transform(texts)``, tokenising only once."""
        # CountVectorizer's fitted columns are the sorted terms, i.e. vocabulary_ order.
        return self._finish(self._fit(_as_list(texts)))

    def unknown_terms(self, texts: Iterable[str], min_share: float, min_documents: int) -> list[tuple[str, int]]:
        """Terms of ``texts`` the fixed vocabulary lacks that are common in them: in at least
        ``min_share`` of the texts and ``min_documents`` of them, and in no more than half of
        what ``max_df`` allows. Tokenised as a fit would (stop words out). A vocabulary fixed on
        earlier texts cannot see words that come later (a new topic's): this says which have
        come. The bound at half ``max_df`` leaves out the words the fit dropped as too common,
        which come back at about that share, while a new topic's words, most of them rarer than
        its commonest, are still found.

        Returns
        -------
        list of (term, documents), most documents first
        """
        self._check_fitted()
        texts = _as_list(texts)
        analyse = self._counter().build_analyzer()
        known = set(self.vocabulary_.tolist())
        seen: Counter = Counter()
        for text in texts:
            seen.update(set(analyse(text)) - known)
        n = len(texts)
        most = (self.max_df * n if isinstance(self.max_df, float) else self.max_df) / 2
        least = max(min_documents, min_share * n)
        return sorted(((t, c) for t, c in seen.items() if least <= c <= most), key=lambda tc: (-tc[1], tc[0]))

    @staticmethod
    def empty_rows(X: sp.csr_matrix) -> np.ndarray:
        """Boolean mask of the rows of a :meth:`transform` result with no vocabulary term."""
        return np.diff(sp.csr_matrix(X).indptr) == 0

    def _finish(self, counts: sp.csr_matrix) -> sp.csr_matrix:
        counts.sort_indices()
        if self.norm != "l2":
            return sp.csr_matrix(counts.astype(np.float64))
        return weighted_rows(counts, idf=self.idf_ if self.weighting == "tfidf" else None,
                             length_power=self.length_power, reference=self.reference_length_)

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
                "max_features": self.max_features_, "reference_length": float(self.reference_length_),
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
        params = dict(meta["params"])
        # vocabularies stored before addresses were removed were fitted with them: keep doing so
        params.setdefault("strip_addresses", False)
        params.setdefault("weighting", WEIGHTING_BEFORE_TFIDF)  # so were those stored before tf-idf existed
        params.setdefault("length_power", LENGTH_POWER_BEFORE_WEIGHTS)  # and before documents had weights
        params.setdefault("unspaced_terms", UNSPACED_TERMS_BEFORE_BIGRAMS)  # and before character pairs
        vec = cls(**params)
        order = np.argsort(np.asarray(table.column("index").to_numpy(), dtype=np.int64), kind="stable")
        vec.vocabulary_ = np.asarray(table.column("term").to_pylist(), dtype=str)[order]
        vec.document_frequency_ = np.asarray(table.column("document_frequency").to_numpy(), dtype=np.int64)[order]
        vec.n_fit_documents_ = int(meta["n_fit_documents"])
        vec.max_features_ = meta.get("max_features", params.get("max_features"))
        vec.reference_length_ = float(meta.get("reference_length", 1.0))  # unused at length power 0
        vec._fixed = vec._counter({t: i for i, t in enumerate(vec.vocabulary_)})
        if vec.vocabulary_hash() != meta["vocabulary_hash"]:
            raise ValueError("vocabulary table does not match its recorded hash (terms reordered or edited)")
        return vec

    def _check_fitted(self) -> None:
        if not hasattr(self, "vocabulary_"):
            raise NotFittedError("TextVectorizer is not fitted; call fit(texts) first")


def reference_length(counts: sp.csr_matrix) -> float:
    """Median token count of the non-empty rows of ``counts`` (1 if there are none): the
    document length of weight 1 (see :func:`weighted_rows`)."""
    lengths = np.asarray(counts.sum(axis=1), dtype=np.float64).ravel()
    lengths = lengths[lengths > 0]
    return float(np.median(lengths)) if lengths.size else 1.0


def weighted_rows(counts, *, idf: np.ndarray | None = None, length_power: float = DEFAULT_LENGTH_POWER,
                  reference: float | None = None) -> sp.csr_matrix:
    """vMF rows from term counts: the counts (times ``idf`` when given) scaled to unit norm,
    then to the document's weight ``(L / reference) ** length_power``, ``L`` its token count
    (``reference``: :func:`reference_length` of ``counts`` when None). All-zero rows stay
    zero. :class:`TextVectorizer` with ``norm="l2"`` makes its rows here."""
    counts = sp.csr_matrix(counts)
    lengths = np.asarray(counts.sum(axis=1), dtype=np.float64).ravel()
    X = counts.astype(np.float64)  # a copy: normalised in place below
    if idf is not None:
        X = X @ sp.diags(idf)
    X = normalize(X, norm="l2", axis=1, copy=False)
    if length_power:
        ref = reference_length(counts) if reference is None else float(reference)
        X = sp.csr_matrix(sp.diags((lengths / ref) ** length_power) @ X)
        X.sort_indices()
    return sp.csr_matrix(X)


def _terms(text: str, pattern: re.Pattern) -> list[str]:
    """The tokens of ``pattern`` in ``text``, each run of :data:`UNSPACED_RUN` characters in
    them cut into its pairs of neighbouring characters (the rest of the token read by
    ``pattern`` again)."""
    tokens = pattern.findall(text)
    if not UNSPACED_RUN.search(text):  # most texts: one scan, and the tokens as they are
        return tokens
    out: list[str] = []
    for token in tokens:
        start = 0
        for run in UNSPACED_RUN.finditer(token):
            out.extend(pattern.findall(token[start:run.start()]))
            chars = run.group()
            out.extend(chars[i:i + 2] for i in range(len(chars) - 1))
            start = run.end()
        out.extend(pattern.findall(token[start:]) if start else [token])
    return out


def _without_addresses(text: str, lowercase: bool) -> str:
    low = text.lower()
    if any(h in low for h in _ADDRESS_HINTS):  # most texts have none: skip the regex
        text = ADDRESS_PATTERN.sub(" ", text)
    return text.lower() if lowercase else text


def _as_list(texts) -> list[str]:
    if isinstance(texts, (pa.Array, pa.ChunkedArray)):
        return texts.to_pylist()
    if isinstance(texts, str):
        raise TypeError("texts must be an iterable of strings, not a single string")
    return list(texts)
