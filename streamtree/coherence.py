"""Topic coherence: normalised pointwise mutual information (NPMI) of a topic's top words.

Probabilities come from a reference corpus's own *document* co-occurrence (the "boolean
document" estimate): with ``D`` documents, ``D(w)`` of them containing word ``w`` and
``D(w, v)`` containing both ``w`` and ``v``,

    P(w) = D(w) / D,    P(w, v) = D(w, v) / D,
    NPMI(w, v) = log(P(w, v) / (P(w) P(v))) / -log P(w, v).

NPMI lies in [-1, 1]: -1 for words that never appear together, 0 for independent words and 1
for words that always appear together. A topic's coherence is the mean NPMI over the
``N (N - 1) / 2`` unordered pairs of its ``N`` top words (Bouma 2009; Aletras and Stevenson
2013; Lau et al. 2014 use the same pair average).

Conventions (the limits of the formula, so nothing is undefined):

* a pair that never co-occurs (``D(w, v) = 0``, including pairs with a word absent from the
  corpus) scores -1;
* a pair present in every document (``P(w, v) = 1``) scores 1;
* ``eps > 0`` switches to the smoothed form used by Roeder et al. (2015) and gensim's
  ``c_npmi``: ``log((P(w, v) + eps) / (P(w) P(v))) / -log(P(w, v) + eps)``. Never-co-occurring
  pairs then score a little above -1 and words absent from the corpus are an error (their
  ``P(w) = 0`` would divide by zero). The default ``eps = 0`` uses the exact limits above.

Only whether a document contains a word matters, not how often: the reference matrix is
binarised. Everything is computed with one sparse product over the columns of the words
involved, so scoring hundreds of topics costs about as much as scoring one.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def _binary_csc(X) -> sp.csc_matrix:
    if sp.issparse(X):
        B = sp.csc_matrix(X, copy=True)
        B.sum_duplicates()  # a (document, term) entry stored twice is one document holding the term
        B.eliminate_zeros()
        B.data = np.ones_like(B.data, dtype=np.float64)
        return B
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"the reference corpus must be a 2-D documents x terms matrix, got shape {X.shape}")
    return sp.csc_matrix((X != 0).astype(np.float64))


def _check_words(words: np.ndarray, n_features: int) -> None:
    if words.size and (words.min() < 0 or words.max() >= n_features):
        raise ValueError(f"word indices must lie in [0, {n_features}); got values from {words.min()} "
                         f"to {words.max()}")


def npmi_matrix(X, words, *, eps: float = 0.0) -> np.ndarray:
    """NPMI of every pair of the given words, from the documents of ``X``.

    Parameters
    ----------
    X : sparse matrix or ndarray, shape (n_documents, n_features)
        Reference corpus (counts, frequencies or 0/1); only nonzero pattern matters.
    words : array-like of int, shape (m,)
        Column indices of the words.
    eps : float, default=0
        Smoothing of the joint probability (see the module docstring); 0 uses exact limits.

    Returns
    -------
    ndarray of float64, shape (m, m)
        Symmetric; entry ``(i, j)`` is NPMI(words[i], words[j]). The diagonal holds 1 for
        words present in at least one document (a word always co-occurs with itself) and
        -1 for absent words.
    """
    B = _binary_csc(X)
    words = np.asarray(words, dtype=np.int64).ravel()
    _check_words(words, B.shape[1])
    n_docs = B.shape[0]
    if n_docs == 0:
        raise ValueError("the reference corpus has no documents")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    Bw = B[:, words]
    joint = np.asarray((Bw.T @ Bw).todense(), dtype=np.float64) / n_docs
    marginal = np.diag(joint).copy()
    outer = marginal[:, None] * marginal[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        if eps > 0:
            if np.any(marginal == 0):
                absent = words[marginal == 0]
                raise ValueError(f"words {absent[:10].tolist()} occur in no document of the reference corpus; "
                                 "their smoothed NPMI is undefined (use eps=0 to score such pairs -1)")
            p = joint + eps
            out = np.log(p / outer) / -np.log(p)
            out[p >= 1.0] = 1.0  # the smoothed joint reaches 1: the exact form's limit, not a flipped sign
        else:
            out = np.log(joint / outer) / -np.log(joint)
            out[joint == 0] = -1.0
            out[joint >= 1.0] = 1.0  # present in every document: the limit of the formula
    return out


def topic_npmi(top_words, X, *, eps: float = 0.0) -> np.ndarray:
    """Coherence of each topic: mean NPMI over all pairs of its top words.

    Parameters
    ----------
    top_words : array-like of int, shape (n_topics, n_top)
        Column indices of each topic's top words (``n_top >= 2``, distinct within a topic).
    X : sparse matrix or ndarray, shape (n_documents, n_features)
        Reference corpus whose document co-occurrence defines the probabilities.
    eps : float, default=0
        Smoothing of the joint probability (see the module docstring).

    Returns
    -------
    ndarray of float64, shape (n_topics,)
    """
    top = np.asarray(top_words, dtype=np.int64)
    if top.ndim != 2:
        raise ValueError(f"top_words must be 2-D (topics x top words), got shape {top.shape}")
    n_topics, n_top = top.shape
    if n_topics == 0:
        return np.zeros(0)
    if n_top < 2:
        raise ValueError("NPMI needs at least two top words per topic")
    sorted_top = np.sort(top, axis=1)
    if np.any(sorted_top[:, 1:] == sorted_top[:, :-1]):
        bad = int(np.flatnonzero(np.any(sorted_top[:, 1:] == sorted_top[:, :-1], axis=1))[0])
        raise ValueError(f"topic {bad} repeats a word among its top words: {top[bad].tolist()}")
    # one co-occurrence table over the union of the words, then gather every topic's pairs
    union, pos = np.unique(top, return_inverse=True)
    pos = pos.reshape(top.shape)
    table = npmi_matrix(X, union, eps=eps)
    i, j = np.triu_indices(n_top, k=1)
    return table[pos[:, i], pos[:, j]].mean(axis=1)


def mean_npmi(top_words, X, *, eps: float = 0.0) -> float:
    """Mean of :func:`topic_npmi` over topics (NaN for no topics)."""
    scores = topic_npmi(top_words, X, eps=eps)
    return float(scores.mean()) if scores.size else float("nan")
