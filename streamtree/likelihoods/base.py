"""The likelihood interface of the dTSSBP: one object per observation family.

The epoch sampler (:mod:`streamtree.inference.epoch_sampler`) only ever talks to a
:class:`Likelihood`; it never asks which family it has. A family module (``vmf.py``,
``gaussian.py``, ``multinomial.py``) holds the maths and one subclass, registered in
:data:`streamtree.likelihoods.LIKELIHOODS`; adding a family means writing one such module.

Every method takes and returns arrays. Node parameters are rows of a ``(K, p)`` matrix
``theta`` aligned with a :class:`~streamtree.tree.TreeArrays` pre-order; ``concentration`` is
the per-node document concentration (vMF beta, Gaussian precision 1 / sigma_x^2, multinomial:
none, see the family). A document set is described by its sufficient statistics: the number of
documents ``n``, the sum of their rows ``s`` and the sum of their squared norms ``sumsq``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import streamtree  # noqa: F401  (configures the numba cache directory)
import numpy as np
import scipy.sparse as sp
from numba import njit
from scipy.optimize import minimize_scalar
from scipy.special import expit

from streamtree.inference.enumerated import Candidates, row_sq_norms
from streamtree.tree import TreeArrays
from streamtree.variants import VariantConfig


def finite_csr(X) -> sp.csr_matrix:
    """``X`` as a float64 CSR matrix with summed duplicates and sorted indices; ValueError if it
    is not 2-D or holds NaN or infinite values (the shared input check of the sparse families)."""
    if not sp.issparse(X):
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D, got shape {X.shape}")
    X = sp.csr_matrix(X, dtype=np.float64)
    if not X.has_canonical_format:
        # summing and sorting work in place, and a float64 CSR input shares its arrays with X:
        # on a copy, so that the caller's matrix keeps the storage it was given
        X = X.copy()
        X.sum_duplicates()
        X.sort_indices()
    if not np.all(np.isfinite(X.data)):
        raise ValueError("X contains NaN or infinite values")
    return X


#: words that describe a topic: a node of a word family is known by its largest parameter entries
TOP_WORDS = 10
#: a word-family node whose id keeps fewer of its birth top words than this has changed
#: beyond recognition (2 of 10 shared is a Jaccard index of 0.11) ...
MIN_SHARED_TOP_WORDS = 3
#: ... unless those words still carry at least this share of the weight its top words carry now
MIN_TOP_WEIGHT_SHARE = 0.6


def top_words(theta: np.ndarray, n: int = TOP_WORDS) -> np.ndarray:
    """Indices of the ``n`` largest entries of ``theta``, largest first (ties by index)."""
    return np.argsort(-np.asarray(theta), kind="stable")[:n]


class WordTopics:
    """Identity by top words, for families whose parameters are weights over a vocabulary.

    A node is recognised while at least :data:`MIN_SHARED_TOP_WORDS` of the :data:`TOP_WORDS`
    words it had when its id was born are still among its top words (what a reader sees of a
    topic is its top words, and a label that keeps fewer than a third of them names something
    else), or while those words still carry :data:`MIN_TOP_WEIGHT_SHARE` of the weight its top
    words carry now. The second test is for topics spread evenly over many words, which
    reorder their top ten by sampling noise alone: the count alone took them for new topics
    every epoch (four topics each uniform over 200 words, the same every year: every leaf a
    new id each year), while their birth words keep their weight.
    """

    def identity_signature(self, theta: np.ndarray) -> np.ndarray:
        return top_words(theta).astype(np.float64)

    def recognises(self, signature: np.ndarray, theta_now: np.ndarray) -> bool:
        birth, n = signature.astype(np.int64), signature.size
        if np.intersect1d(birth, top_words(theta_now, n)).size >= min(MIN_SHARED_TOP_WORDS, n):
            return True
        weight = np.maximum(np.asarray(theta_now, dtype=np.float64), 0.0)  # a direction's negative parts: none
        top_now = float(np.partition(weight, weight.size - n)[weight.size - n:].sum())  # n >= 1 here
        return top_now > 0.0 and float(weight[birth].sum()) >= MIN_TOP_WEIGHT_SHARE * top_now


#: search range of an estimated link strength ``kappa0`` (``kappa0="auto"``)
LINK_STRENGTH_RANGE = (1.0, 1e6)


def argmax_log_scale(log_f: Callable[[float], float], low: float = LINK_STRENGTH_RANGE[0],
                     high: float = LINK_STRENGTH_RANGE[1], n_grid: int = 25) -> float:
    """The maximiser of a one-dimensional ``log_f`` on ``[low, high]``, searched on a log scale:
    the best of ``n_grid`` log-spaced points, then Brent's method between its neighbours
    (deterministic, so seeded fits stay reproducible)."""
    grid = np.linspace(np.log(low), np.log(high), n_grid)
    vals = np.array([log_f(float(np.exp(u))) for u in grid])
    i = int(np.argmax(vals))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, n_grid - 1)]
    res = minimize_scalar(lambda u: -log_f(float(np.exp(u))), bounds=(lo, hi), method="bounded",
                          options={"xatol": 1e-3})
    return float(np.exp(res.x)) if -res.fun >= vals[i] else float(np.exp(grid[i]))


@dataclass(frozen=True)
class DocumentSet:
    """Sufficient statistics of a set of documents: count, row sum, sum of squared norms, and
    each row's squared norm where the set was built from its rows (a family whose rows carry
    weights in their norms, the vMF's, needs them). ``terms``, where the builder was asked for
    it, is exactly the support of ``s`` (``np.flatnonzero(s)``, ascending): a family may then
    score the set in O(its terms) rather than O(p)."""

    n: float
    s: np.ndarray
    sumsq: float = 0.0
    sq_norms: np.ndarray | None = None
    terms: np.ndarray | None = None


@njit(cache=True, nogil=True)
def csr_rows_dot(indptr, indices, data, rows, theta):
    """``X[rows] @ theta`` for CSR ``X`` without slicing it (each row summed in storage order,
    as SciPy's product does: the same values)."""
    out = np.empty(rows.shape[0])
    for i in range(rows.shape[0]):
        r = rows[i]
        acc = 0.0
        for k in range(indptr[r], indptr[r + 1]):
            acc += np.float64(data[k]) * theta[indices[k]]
        out[i] = acc
    return out


@njit(cache=True, nogil=True)
def csr_rows_sq_norms(indptr, data, rows):
    """Squared norm of each CSR row ``rows[i]``."""
    out = np.empty(rows.shape[0])
    for i in range(rows.shape[0]):
        acc = 0.0
        for k in range(indptr[rows[i]], indptr[rows[i] + 1]):
            acc += data[k] * data[k]
        out[i] = acc
    return out


def sq_norms_of_rows(X, rows: np.ndarray | None = None) -> np.ndarray:
    """Squared norm of each row (of ``rows``, or all), summed in float64 in storage order."""
    if sp.issparse(X):
        X = X if X.format == "csr" else sp.csr_matrix(X)
        rows = np.arange(X.shape[0], dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        return csr_rows_sq_norms(X.indptr, np.asarray(X.data, dtype=np.float64), rows)
    A = np.asarray(X, dtype=np.float64)
    if rows is not None:
        A = A[np.asarray(rows, dtype=np.int64)]
    return np.einsum("ij,ij->i", A, A)


@njit(cache=True, nogil=True)
def compact_rows(indptr, indices, data, rows, p):
    """Rows ``rows`` of a CSR matrix with ``p`` columns over the terms they hold, so that a split
    proposal's scans cost O(nnz) of its rows, not O(p) (the compaction itself fills one
    O(p) index once).

    Returns
    -------
    ptr, col, val : ndarray
        The rows as a local CSR: row pointers, local column per entry, values as float64.
    terms : ndarray of int64
        The held terms (the local columns' terms) in order of first appearance.
    total : ndarray
        Each row's sum.
    """
    where = np.full(p, -1, dtype=np.int64)
    n = rows.shape[0]
    ptr = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        ptr[i + 1] = ptr[i] + indptr[rows[i] + 1] - indptr[rows[i]]
    col = np.empty(ptr[n], dtype=np.int64)
    val = np.empty(ptr[n])
    terms = np.empty(ptr[n], dtype=np.int64)
    total = np.empty(n)
    m = 0
    for i in range(n):
        r = rows[i]
        q = ptr[i]
        tokens = 0.0
        for k in range(indptr[r], indptr[r + 1]):
            w = indices[k]
            if where[w] < 0:
                where[w] = m
                terms[m] = w
                m += 1
            v = np.float64(data[k])
            col[q] = where[w]
            val[q] = v
            tokens += v
            q += 1
        total[i] = tokens
    return ptr, col, val, terms[:m], total


@njit(cache=True)
def _csr_row_sums(indptr, indices, data, rows, p, with_terms):
    """Row sum, sum of squared norms and each row's squared norm of CSR rows ``rows``, and with
    ``with_terms`` the row sum's support (``np.flatnonzero(s)``; else an empty array)."""
    s = np.zeros(p)
    held = np.zeros(-(-p // 8) * 8 if with_terms else 8, dtype=np.uint8)  # the terms held, in whole words
    sumsq = 0.0
    sq = np.empty(rows.shape[0])
    for i in range(rows.shape[0]):
        r = rows[i]
        own = 0.0
        for k in range(indptr[r], indptr[r + 1]):
            v = np.float64(data[k])
            w = indices[k]
            s[w] += v
            if with_terms:
                held[w] = 1
            sumsq += v * v
            own += v * v
        sq[i] = own
    if not with_terms:
        return s, sumsq, sq, np.zeros(0, dtype=np.int64)
    return s, sumsq, sq, _support(held, s, indptr, rows)


@njit(cache=True, nogil=True)
def _support(held, s, indptr, rows):
    """The terms ``w`` with ``held[w]`` and ``s[w] != 0``, ascending: ``np.flatnonzero(s)`` when
    ``held`` covers the support (``s``: the sum of CSR rows ``rows``, which hold at most their
    entries' count of terms). ``held`` is padded to whole 8-byte words and read a word at a
    time: O(p / 8) plus O(held terms) (a set of rows holds a few hundred to a few thousand of
    20,000 terms)."""
    p = s.shape[0]
    entries = 0
    for r in rows:
        entries += indptr[r + 1] - indptr[r]
    out = np.empty(min(p, entries), dtype=np.int64)
    n = 0
    words = held.view(np.uint64)
    for b in range(words.shape[0]):
        if words[b] != 0:
            for w in range(8 * b, min(8 * b + 8, p)):
                if held[w] and s[w] != 0.0:
                    out[n] = w
                    n += 1
    return out[:n]


@njit(cache=True)
def _csr_group_sums(indptr, indices, data, rows, launch, first, second, p):
    """:func:`_csr_row_sums` of two groups in one pass, with the same sums: ``first`` and then
    the rows of ``rows`` where ``launch`` holds, ``second`` and then the others (``sq``: the
    two anchors' squared norms, then each row's)."""
    s = np.zeros((2, p))
    sumsq = np.zeros(2)
    sq = np.empty(rows.shape[0] + 2)
    for i in range(rows.shape[0] + 2):
        if i < 2:
            r, g = (first, 0) if i == 0 else (second, 1)
        else:
            r, g = rows[i - 2], 0 if launch[i - 2] else 1
        own = 0.0
        for k in range(indptr[r], indptr[r + 1]):
            v = np.float64(data[k])
            s[g, indices[k]] += v
            sumsq[g] += v * v
            own += v * v
        sq[i] = own
    return s, sumsq, sq


def launch_groups(X, others: np.ndarray, launch: np.ndarray, first: int, second: int,
                  row_norms: bool = True) -> tuple[DocumentSet, DocumentSet]:
    """:func:`document_set` of ``first`` with the rows ``others[launch]`` and of ``second`` with
    the other rows of ``others``, the same values (CSR in one pass); each row's squared norm
    only with ``row_norms`` (:attr:`Likelihood.sets_need_row_norms`), else ``sq_norms`` is None."""
    launch = np.ascontiguousarray(launch, dtype=np.bool_)
    if not (sp.issparse(X) and X.format == "csr"):
        return (document_set(X, np.append(first, others[launch])), document_set(X, np.append(second, others[~launch])))
    s, sumsq, sq = _csr_group_sums(X.indptr, X.indices, X.data, np.asarray(others, dtype=np.int64), launch,
                                   int(first), int(second), X.shape[1])
    n_in = int(launch.sum())
    rest = sq[2:]
    sq_1, sq_2 = (np.append(sq[0], rest[launch]), np.append(sq[1], rest[~launch])) if row_norms else (None, None)
    return (DocumentSet(float(n_in + 1), s[0], float(sumsq[0]), sq_1),
            DocumentSet(float(others.size - n_in + 1), s[1], float(sumsq[1]), sq_2))


def document_set(X, rows: np.ndarray, terms: bool = False) -> DocumentSet:
    """Count, row sum, sum of squared norms and each row's squared norm of rows ``rows`` of ``X``
    (CSR without slicing), and with ``terms`` (:attr:`Likelihood.sets_need_terms`) the row
    sum's support where CSR rows give it cheaply."""
    rows = np.asarray(rows, dtype=np.int64)
    if sp.issparse(X) and X.format == "csr":
        s, sumsq, sq, support = _csr_row_sums(X.indptr, X.indices, X.data, rows, X.shape[1],
                                              terms)  # any dtype: no copy
        return DocumentSet(float(rows.size), s, float(sumsq), sq, support if terms else None)
    sub = X[rows]
    if sp.issparse(sub):
        s = np.asarray(sub.sum(axis=0), dtype=np.float64).ravel()
        squares = sub.multiply(sub)
        sq = np.asarray(squares.sum(axis=1), dtype=np.float64).ravel()
        sumsq = float(squares.sum())
    else:
        sub = np.asarray(sub, dtype=np.float64)
        s = sub.sum(axis=0)
        sq = np.einsum("ij,ij->i", sub, sub)
        sumsq = float(np.einsum("ij,ij->", sub, sub))
    return DocumentSet(float(rows.size), s, sumsq, sq)


@njit(cache=True)
def _csr_dense_row(indptr, indices, data, r, p):
    out = np.zeros(p)
    for k in range(indptr[r], indptr[r + 1]):
        out[indices[k]] += np.float64(data[k])
    return out


def dense_row(X, r: int) -> np.ndarray:
    """Row ``r`` of ``X`` as a dense float vector (CSR read in place)."""
    if sp.issparse(X) and X.format == "csr":
        return _csr_dense_row(X.indptr, X.indices, X.data, r, X.shape[1])
    x = X[r]
    return np.asarray(x.toarray()).ravel() if sp.issparse(x) else np.asarray(x, dtype=np.float64).ravel()


class RowBlock:
    """Rows ``rows`` of a matrix ``X``, sliced into a matrix only when a likelihood asks for one
    (:attr:`matrix`, then kept): a family that reads CSR rows in place never pays the slice."""

    __slots__ = ("X", "rows", "_matrix", "_sq_norms")

    def __init__(self, X, rows: np.ndarray) -> None:
        self.X = X
        self.rows = np.asarray(rows, dtype=np.int64)
        self._matrix = None
        self._sq_norms = None

    def sq_norms(self) -> np.ndarray:
        """Each row's squared norm, summed in float64 in storage order (then kept: a split
        proposal scores one block at several parameters)."""
        if self._sq_norms is None:
            self._sq_norms = sq_norms_of_rows(self.X, self.rows)
        return self._sq_norms

    @property
    def matrix(self):
        if self._matrix is None:
            self._matrix = self.X[self.rows]
        return self._matrix

    def dot(self, v: np.ndarray) -> np.ndarray:
        """``X[rows] @ v``: read in place from a CSR matrix (the same sums as SciPy's product
        of the slice), else through the slice."""
        X = self.X
        if sp.issparse(X) and X.format == "csr":
            return csr_rows_dot(X.indptr, X.indices, X.data, self.rows, np.ascontiguousarray(v, dtype=np.float64))
        return np.asarray(self.matrix @ v).ravel()


class FixedNode:
    """A node's parameters held fixed while the split-merge moves score row blocks and document
    sets at them (:meth:`Likelihood.block_log_likelihood` and :meth:`Likelihood.log_likelihood`),
    its children's links below it (:meth:`Likelihood.log_link`), and the collapsed marginals
    (:meth:`Likelihood.log_marginal`) and posterior modes (:meth:`Likelihood.new_node_theta`)
    of document sets at a new child. A proposed parameter read for what lies below it only may
    come without a concentration (``None``)."""

    __slots__ = ("likelihood", "theta", "concentration")

    def __init__(self, likelihood: "Likelihood", theta: np.ndarray, concentration: float | None) -> None:
        self.likelihood = likelihood
        self.theta = theta
        self.concentration = concentration

    def rows(self, block: RowBlock) -> np.ndarray:
        return self.likelihood.block_log_likelihood(block, self.theta, self.concentration)

    def documents(self, docs: DocumentSet) -> float:
        return self.likelihood.log_likelihood(docs, self.theta, self.concentration)

    def log_link_below(self, child: "FixedNode", depth: int, theta_prev: np.ndarray | None = None) -> float:
        """:meth:`Likelihood.log_link` of ``child``'s parameter as a depth-``depth`` child of
        this node (under its time link to ``theta_prev`` too, when given)."""
        return self.likelihood.log_link(child.theta, self.theta, depth, theta_prev)

    def log_marginal_below(self, docs: DocumentSet, concentration: float, depth: int,
                           theta_prev: np.ndarray | None = None) -> float:
        """:meth:`Likelihood.log_marginal` of ``docs`` at a depth-``depth`` child of this node."""
        return self.likelihood.log_marginal(docs, self.theta, concentration, depth, theta_prev)

    def new_child_theta(self, docs: DocumentSet, concentration: float, depth: int) -> np.ndarray:
        """:meth:`Likelihood.new_node_theta` of ``docs`` at a depth-``depth`` child of this node."""
        return self.likelihood.new_node_theta(self.theta, concentration, depth, docs)

    def split_log_odds(self, block: RowBlock, docs_1: DocumentSet, docs_2: DocumentSet, concentration: float,
                       depth: int) -> np.ndarray:
        """:meth:`Likelihood.block_log_odds` of ``block``'s rows between two depth-``depth``
        children of this node at their posterior modes given ``docs_1`` and ``docs_2``
        (:meth:`new_child_theta`): a split proposal's launch scan."""
        return self.likelihood.block_log_odds(block, self.new_child_theta(docs_1, concentration, depth),
                                              self.new_child_theta(docs_2, concentration, depth), concentration)

    def launch_scan(self, X, others: np.ndarray, first: int, second: int, concentration: float,
                    depth: int) -> "LaunchScan":
        """The restricted scans of a split proposal's launch below this node (:class:`LaunchScan`)."""
        return LaunchScan(self, X, others, first, second, concentration, depth)


class LaunchScan:
    """A split proposal's restricted scans of rows ``others`` of ``X`` between two new
    depth-``depth`` children of a fixed node: one with row ``first`` and the rows a launch sends
    to it, the other with row ``second`` and the rest. :meth:`log_odds` is
    :meth:`FixedNode.split_log_odds` of the two groups (:func:`launch_groups`); a family may
    prepare the rows once for all the scans of a proposal."""

    def __init__(self, node: FixedNode, X, others: np.ndarray, first: int, second: int, concentration: float,
                 depth: int) -> None:
        self.node = node
        self.X = X
        self.others = np.asarray(others, dtype=np.int64)
        self.block = RowBlock(X, self.others)  # one slice for every scan, where a family slices
        self.first = first
        self.second = second
        self.concentration = concentration
        self.depth = depth

    def seed_scores(self, theta: np.ndarray) -> np.ndarray:
        """Each row's log likelihood at the seed parameter of a child of a node at ``theta``
        toward row ``first`` (:meth:`Likelihood.seed_child_theta`), at the children's
        concentration: the first launch compares these with the rows' scores at that node."""
        lik = self.node.likelihood
        return lik.block_log_likelihood(self.block, lik.seed_child_theta(theta, dense_row(self.X, self.first)),
                                        self.concentration)

    def log_odds(self, launch: np.ndarray) -> np.ndarray:
        """Each row's log-likelihood ratio between the two children's posterior modes given the
        groups ``launch`` makes (``launch[k]``: row ``others[k]`` joins ``first``)."""
        groups = launch_groups(self.X, self.others, launch, self.first, self.second,
                               self.node.likelihood.sets_need_row_norms)
        return self.node.split_log_odds(self.block, *groups, self.concentration, self.depth)

    def run(self, log_odds: np.ndarray, uniforms: np.ndarray, eps: float) -> np.ndarray:
        """The scans from a launch's log odds: for each row ``u`` of ``uniforms`` (one per scan,
        a uniform per row of ``others``), launch where ``u < launch_probabilities(log_odds,
        eps)`` and take that launch's :meth:`log_odds`; the last scan's log odds."""
        for u in uniforms:
            log_odds = self.log_odds(u < launch_probabilities(log_odds, eps))
        return log_odds


def launch_probabilities(log_odds: np.ndarray, eps: float) -> np.ndarray:
    """``expit(log_odds)`` kept within ``[eps, 1 - eps]`` (``np.clip``'s values, without its
    per-call overhead on the few rows of a tiny epoch's moves); :func:`clipped_expit` is its
    value at one row in compiled code."""
    return np.minimum(np.maximum(expit(log_odds), eps), 1 - eps)


@njit(cache=True, nogil=True)
def clipped_expit(x: float, eps: float) -> float:
    """:func:`launch_probabilities` of one value, to the bit (SciPy's ``expit`` is
    ``1 / (1 + exp(-x))``)."""
    return min(max(1.0 / (1.0 + math.exp(-x)), eps), 1.0 - eps)


class Likelihood(ABC):
    """One observation family: kernel coefficients, collapsed marginals, node updates.

    Subclasses set :attr:`name`, :attr:`text_norm` and :attr:`params` and implement the
    abstract methods. ``variant`` says which links exist (parent, previous epoch, fixed time
    strength of the DP baselines).
    """

    #: the ``likelihood=`` value that selects the family
    name: ClassVar[str]
    #: whether the family models bag-of-words rows (replay and evaluate accept only these)
    for_text: ClassVar[bool] = True
    #: how a text vectoriser prepares rows for it: ``"l2"`` (unit rows) or ``None`` (raw counts)
    text_norm: ClassVar[str | None] = "l2"
    #: what a node parameter is, which says how a store may keep it compactly: ``"direction"``
    #: (a unit vector: its largest entries to a cosine), ``"distribution"`` (strictly positive,
    #: summing to 1: its log probabilities to a step) or ``"exact"`` (anything else, e.g. means)
    param_storage: ClassVar[str] = "exact"
    #: whether readers are shown a node's words from the documents below it
    #: (``EpochTree.label_words``) rather than from its parameter's largest entries: for
    #: families whose links flatten the parameters of nodes with children
    labels_from_documents: ClassVar[bool] = False
    #: whether the family's set likelihoods read each row's squared norm
    #: (:attr:`DocumentSet.sq_norms`), not only their sum (the vMF's with document weights)
    sets_need_row_norms = False
    #: whether the family's set scores read :attr:`DocumentSet.terms` (building them costs a
    #: little on every set, so only families that read them ask for them)
    sets_need_terms = False
    #: restricted scans of a split proposal's launch (Jain and Neal's intermediate scans): each
    #: refits the two groups' posterior modes and redraws the launch from their log-odds. A launch
    #: from one seed document, fitted once, is too noisy to find topics that differ by a few nats a
    #: document; three scans raised the planted trees' mean ARI from 0.61 (no scan) to 0.74 over
    #: five seeds. A family sets its own where its launches grow more slowly (BENCHMARKS.md)
    launch_scans: ClassVar[int] = 3
    #: the fewest rounds of relocation and split-merge attempts per sweep, as a multiple of
    #: ``MIN_SPLIT_ATTEMPTS`` (up to one per document), while a chain's first tree grows from the
    #: root (its first :data:`~streamtree.inference.epoch_sampler.GROWTH_SWEEPS` sweeps, under
    #: ``split_proposals="auto"``). A family whose moves stop being accepted once its nodes'
    #: parameters are fitted to their documents sets more, so that its first tree is grown
    #: before that (BENCHMARKS.md, "The vMF's first tree grown with at least five times the fewest attempts")
    growth_attempts: ClassVar[int] = 1
    #: estimator parameters the family reads (their values come from ``DTSSBP.get_params()``)
    params: ClassVar[tuple[str, ...]] = ()

    def __init__(self, variant: VariantConfig, n_features: int, **settings: Any) -> None:
        self.variant = variant
        self.n_features = int(n_features)
        for name in self.params:
            if name in settings or not hasattr(type(self), name):  # a class-level value is the default
                setattr(self, name, settings[name])

    @classmethod
    def from_params(cls, params: Mapping[str, Any], variant: VariantConfig, n_features: int) -> "Likelihood":
        """The family configured from the estimator's parameters."""
        return cls(variant, n_features, **{k: params[k] for k in cls.params})

    # ------------------------------------------------------------------ input
    @classmethod
    @abstractmethod
    def check_input(cls, X, **settings: Any) -> Any:
        """The rows in the form the kernel needs (CSR or dense float64); ValueError if unusable.
        ``settings`` are the estimator's values of the family's :attr:`params`."""

    @classmethod
    def fit_rows_concern(cls, X) -> str | None:
        """What to tell the user about an epoch's rows (as :meth:`check_input` returns them) in
        which a fit is unlikely to find any structure, saying what to do (the estimator warns
        with it); ``None`` by default."""
        return None

    # ------------------------------------------------------------------ epoch anchors
    @abstractmethod
    def root_anchor(self, X) -> np.ndarray:
        """The root's virtual parent for an epoch with rows ``X`` (its parent-link target)."""

    @abstractmethod
    def initial_root(self, X) -> tuple[np.ndarray, float]:
        """Parameter and concentration of the root of the first epoch, from all its rows."""

    # ------------------------------------------------------------------ z-kernel
    @abstractmethod
    def kernel(self, arrays: TreeArrays, theta: np.ndarray, concentration: np.ndarray, log_mass: np.ndarray,
               log_residual: np.ndarray, *, normalized: bool = True) -> tuple[Candidates, np.ndarray]:
        """The z-kernel's candidates and the tree row of each placeholder's parent.

        Live node ``k`` scores ``log_mass[k] + log f(x | theta_k, concentration_k)``; every row
        with a finite ``log_residual`` gets a placeholder scoring ``log_residual`` plus the
        collapsed new-node marginal around that row's parameter. ``normalized=False`` drops the
        family's normalising constants (the dTSSBP paper's "unnormalised" score).
        """

    def own_node_adjustment(self, X, own: np.ndarray, arrays: TreeArrays, theta: np.ndarray, sums: np.ndarray,
                            counts: np.ndarray, concentration: np.ndarray, prev_theta: np.ndarray,
                            has_prev: np.ndarray, root_anchor: np.ndarray, scored=None) -> np.ndarray | None:
        """Per row of ``X``: the change of its log likelihood at its own node when that node's
        parameter is estimated without the row, or ``None`` (the default: rows are scored at
        their node's parameter as it stands).

        ``own[r]`` is row ``r``'s node as a row of the other arguments (-1: none), which are
        those of :meth:`update_theta` just after it ran: ``theta`` its result, ``sums`` and
        ``counts`` those of the rows of ``X``. ``scored`` (default ``X``) are the rows the next
        sweep reads, for a family that redraws them (:meth:`sweep_counts`): they keep ``X``'s
        sparsity pattern, and the change is that of their likelihood once ``X``'s rows have
        left the parameters. The z-kernel adds the value to the row's own column alone
        (:func:`~streamtree.inference.enumerated.score_rows`), so that the nodes the family
        adjusts judge the row by a parameter fitted without it, as its other nodes do. A
        parameter fitted to a node's documents, its own among them, fits a document better than
        it would have without it (its rare words most), so scored as it stands each document
        sticks where it is, and a cluster the sweeps have cut in two stays cut: the launch's
        merge rarely joins two such halves, because the split that would undo it must propose
        that very cut (the subset proposal's merges can, for halves of at least
        ``SUBSET_MIN_DOCS`` documents)."""
        return None

    def document_log_constant(self, X) -> np.ndarray:
        """Per-row log terms the kernel leaves out because they are equal for every node."""
        return np.zeros(X.shape[0])

    # ------------------------------------------------------------------ augmented documents
    @property
    def redraws_counts(self) -> bool:
        """Whether :meth:`sweep_counts` draws rows to read in place of the documents' own."""
        return False

    def sweep_counts(self, X, theta: np.ndarray, node_of_row: np.ndarray, hyper: Mapping[str, float],
                     rng: np.random.Generator) -> tuple[Any, dict[str, float]]:
        """The rows the next sweep reads in place of ``X``, for a family whose documents carry
        latent variables the sampler draws once per sweep (the multinomial's table counts
        under ``document_concentration``), and the family's sampled values to keep in the
        chain's ``hyper``.

        ``theta[node_of_row[r]]`` is the parameter of document ``r``'s current node, or with
        ``node_of_row=None`` (an epoch's first sweep, before any assignment) ``theta[0]`` is
        every document's; ``hyper`` the chain's values (the family reads its own entries,
        absent before the first sweep).
        The returned rows keep ``X``'s shape and sparsity pattern. By default the family has no
        such variables: ``(None, {})``, the sweep reads ``X`` and draws nothing."""
        return None, {}

    def counts_started(self, hyper: Mapping[str, float]) -> bool:
        """Whether the chain's ``hyper`` holds every value :meth:`sweep_counts` samples (a
        family may start them only once documents have nodes; the sampler then calls it once
        more after an epoch whose sweeps ended before). True for families without any."""
        return True

    # ------------------------------------------------------------------ new nodes
    @abstractmethod
    def new_node_prior(self, depth: int) -> float:
        """Strength (vMF, multinomial) or variance (Gaussian) of a new node's link to its parent."""

    @abstractmethod
    def new_node_theta(self, theta_parent: np.ndarray, concentration: float, depth: int,
                       docs: DocumentSet) -> np.ndarray:
        """Posterior mode of a new node's parameter given its parent and its first documents."""

    @abstractmethod
    def sample_node_theta(self, theta_parent: np.ndarray, concentration: float, depth: int, docs: DocumentSet,
                          rng: np.random.Generator, theta_prev: np.ndarray | None = None) -> np.ndarray:
        """A draw of a leaf's parameter from its exact conditional given its links and its
        documents (the posterior whose normaliser is :meth:`log_marginal`): the parent link
        alone for a node born in this epoch, both links when ``theta_prev`` (the node's
        previous-epoch parameter) is given."""

    def new_node_concentration(self, parent_concentration: float, depth: int) -> float:
        """A new depth-``depth`` node's starting concentration (by default its parent's)."""
        return parent_concentration

    @abstractmethod
    def seed_child_theta(self, theta_node: np.ndarray, x: np.ndarray) -> np.ndarray:
        """A proposed child's parameter, seeded by document ``x`` of node ``theta_node``."""

    @abstractmethod
    def log_link(self, theta_child: np.ndarray, theta_parent: np.ndarray, depth: int,
                 theta_prev: np.ndarray | None = None) -> float:
        """Log density of a depth-``depth`` node's parameter given its parent's, and also its
        own previous-epoch parameter ``theta_prev`` when that is given (a carried node): then
        the density is the product of both links, normalised, the prior :meth:`log_marginal`
        integrates against and :meth:`sample_node_theta` draws from. It depends on ``depth``
        only through :meth:`link_strengths`."""

    # ------------------------------------------------------------------ document sets
    @abstractmethod
    def log_marginal(self, docs: DocumentSet, theta_parent: np.ndarray, concentration: float,
                     depth: int, theta_prev: np.ndarray | None = None) -> float:
        """Collapsed log marginal of a document set at one depth-``depth`` node below
        ``theta_parent``: the node's parameter integrated out under its parent link, and also
        under its time link to ``theta_prev`` when that is given (a node the window carries
        from the previous epoch; its prior is then the product of both links, normalised)."""

    #: whether the family links the root's parameter to the epoch's :meth:`root_anchor` as a
    #: depth-0 node is linked to its parent (the link :meth:`log_marginal` integrates against
    #: at depth 0), under a variant with parent links (:meth:`root_parent`)
    anchors_root: bool = False

    def root_parent(self, anchor: np.ndarray) -> np.ndarray | None:
        """The root's parent-link target in an epoch whose root anchor is ``anchor``, or ``None``
        where the root has no such link: the split-merge moves integrate the root's parameter
        out against it (:meth:`~streamtree.inference.split_merge.SplitMerge.collapses`)."""
        return anchor if self.anchors_root and self.variant.parent_link else None

    #: whether :meth:`linked_log_marginal` and :meth:`sample_linked_theta` integrate a node's
    #: parameter against its children's parent links as well (links conjugate to the
    #: parameter's posterior, as the vMF's are); without, they take childless nodes only
    integrates_children: bool = False

    def _childless(self, children: np.ndarray | None) -> None:
        """A family without :attr:`integrates_children` takes no children: the moves ask it only
        for childless nodes (:meth:`~streamtree.inference.split_merge.SplitMerge.collapses`)."""
        if children is not None and len(children):
            raise NotImplementedError(f"{type(self).__name__} does not integrate a parameter against its children")

    def linked_log_marginal(self, docs: DocumentSet, theta_parent: np.ndarray, concentration: float, depth: int,
                            theta_prev: np.ndarray | None = None, children: np.ndarray | None = None) -> float:
        """:meth:`log_marginal` of a node that has children: its parameter integrated out
        under its own links and its children's parent links, ``children`` (m, p) the
        parameters of its children (depth ``depth + 1``, born in this epoch: no time link),
        held fixed. Only where :attr:`integrates_children`; with no children it is
        :meth:`log_marginal`."""
        self._childless(children)
        return self.log_marginal(docs, theta_parent, concentration, depth, theta_prev)

    def sample_linked_theta(self, theta_parent: np.ndarray, concentration: float, depth: int, docs: DocumentSet,
                            rng: np.random.Generator, theta_prev: np.ndarray | None = None,
                            children: np.ndarray | None = None) -> np.ndarray:
        """A draw from the conditional whose normaliser is :meth:`linked_log_marginal`."""
        self._childless(children)
        return self.sample_node_theta(theta_parent, concentration, depth, docs, rng, theta_prev)

    @abstractmethod
    def log_likelihood(self, docs: DocumentSet, theta: np.ndarray, concentration: float) -> float:
        """Log likelihood of a document set at one node with fixed parameters."""

    @abstractmethod
    def row_log_likelihood(self, X, theta: np.ndarray, concentration: float) -> np.ndarray:
        """Log likelihood of each row of ``X`` at one node with fixed parameters (the terms of
        :meth:`log_likelihood` for one-document sets, in one vectorised pass)."""

    def block_log_likelihood(self, block: RowBlock, theta: np.ndarray, concentration: float) -> np.ndarray:
        """:meth:`row_log_likelihood` of the rows of a :class:`RowBlock` (a family whose row
        likelihood is a function of ``x . v`` overrides it with :meth:`RowBlock.dot`, which
        reads the rows in place; the values must not change)."""
        return self.row_log_likelihood(block.matrix, theta, concentration)

    def block_log_odds(self, block: RowBlock, theta_1: np.ndarray, theta_2: np.ndarray,
                       concentration: float) -> np.ndarray:
        """Log-likelihood ratio of each row of a :class:`RowBlock` at ``theta_1`` against
        ``theta_2``, one concentration for both (a family whose ratio is ``x . v`` overrides it
        with one :meth:`RowBlock.dot`)."""
        return (self.block_log_likelihood(block, theta_1, concentration)
                - self.block_log_likelihood(block, theta_2, concentration))

    def fixed_node(self, theta: np.ndarray, concentration: float | None) -> "FixedNode":
        """One node's fixed parameters for scoring many row blocks, document sets, child links
        and new-child marginals against them (:class:`FixedNode`); a family overrides it to keep
        what every score would recompute, with the same values as :meth:`block_log_likelihood`,
        :meth:`log_likelihood`, :meth:`log_link` and :meth:`log_marginal`."""
        return FixedNode(self, theta, concentration)

    # ------------------------------------------------------------------ identity across epochs
    @abstractmethod
    def drift_statistic(self, theta_now: np.ndarray, theta_prev: np.ndarray, depth: int) -> tuple[float, float] | None:
        """How far a node moved over one epoch, on the scale of its previous-epoch link.

        Returns ``(D, df)`` where, for a parameter drawn from the time link around
        ``theta_prev``, ``D`` is approximately chi-square with ``df`` degrees of freedom
        (twice the drop of the link's log density from its mode); ``None`` when the variant
        has no time link.
        """

    def identity_signature(self, theta: np.ndarray) -> np.ndarray | None:
        """What a node's parameter is recognised by (kept from the epoch its id is born; see
        :meth:`recognises`); ``None`` when the family judges identity by
        :meth:`drift_statistic` alone."""
        return None

    def recognises(self, signature: np.ndarray, theta_now: np.ndarray) -> bool:
        """Whether a node with parameter ``theta_now`` is still the node whose id was born with
        ``signature`` (:meth:`identity_signature`)."""
        raise NotImplementedError(f"{type(self).__name__} has no identity signature")

    # ------------------------------------------------------------------ new documents
    def live_log_weights(self, X, cand: Candidates, theta: np.ndarray,
                         hyper: Mapping[str, float] | None = None) -> np.ndarray:
        """Per row of ``X`` and live column of ``cand`` (the kernel's candidates of a tree whose
        node parameters are ``theta``): log mass plus log likelihood, as the z-kernel scores
        them, leaving out the family's terms that are equal for every node (they cancel in a
        node's posterior). ``hyper`` holds the chain's sampled values, for a family that reads
        its own (the multinomial's document concentration)."""
        scores = np.asarray(X @ cand.coef_T, dtype=np.float64)
        weights = cand.live_a + cand.live_b * scores
        if np.any(cand.live_c != 0):
            weights += cand.live_c * row_sq_norms(X)[:, None]
        return weights

    # ------------------------------------------------------------------ updates
    @abstractmethod
    def update_theta(self, arrays: TreeArrays, theta: np.ndarray, sums: np.ndarray, counts: np.ndarray,
                     concentration: np.ndarray, prev_theta: np.ndarray, has_prev: np.ndarray,
                     root_anchor: np.ndarray, update: np.ndarray, n_iter: int) -> np.ndarray:
        """MAP node parameters by alternating depth-parity blocks (returns a new matrix)."""

    @abstractmethod
    def update_concentration(self, counts: np.ndarray, sums: np.ndarray, sumsq: np.ndarray,
                             theta: np.ndarray, current: np.ndarray) -> np.ndarray:
        """Re-estimated concentrations of nodes with the given statistics (``current`` where
        a node has too few documents)."""

    # ------------------------------------------------------------------ predictive density
    def log_predictive(self, X, arrays: TreeArrays, theta: np.ndarray, concentration: np.ndarray,
                       log_mass: np.ndarray, log_residual: np.ndarray, *, normalized: bool = True,
                       hyper: Mapping[str, float] | None = None) -> np.ndarray:
        """Log predictive density of each row: the mixture over live nodes plus new-node terms.

        ``hyper`` is the chain's sampled values, for a family whose document density reads one
        of its own entries (the multinomial's document concentration); others ignore it."""
        from streamtree.inference.enumerated import score_rows

        cand, _ = self.kernel(arrays, theta, concentration, log_mass, log_residual, normalized=normalized)
        _, lognorm = score_rows(X, cand, None)
        if normalized:
            lognorm = lognorm + self.document_log_constant(X)
        return lognorm

    # ------------------------------------------------------------------ link strength from the data
    def initial_link_strength(self, X) -> float | None:
        """Starting value of ``kappa0`` for ``kappa0="auto"``, from the first epoch's rows
        (``None``: the family has no link strength set by ``kappa0``)."""
        return None

    def estimate_link_strength(self, arrays: TreeArrays, theta: np.ndarray, concentration: np.ndarray,
                               counts: np.ndarray, sums: np.ndarray, prev_theta: np.ndarray,
                               has_prev: np.ndarray, root_anchor: np.ndarray,
                               sumsq: np.ndarray | None = None) -> float | None:
        """``kappa0`` re-estimated from the current tree (``kappa0="auto"``; after each sweep).

        ``counts``, ``sums`` and ``sumsq`` (sums of squared row norms) are the nodes' documents
        in this epoch, aligned with ``arrays``;
        ``prev_theta`` and ``has_prev`` their previous-epoch parameters. ``None`` keeps the
        current value (no documents to learn from, or no such strength in the family).
        """
        return None

    def estimate_time_strength(self, arrays: TreeArrays, theta: np.ndarray, concentration: np.ndarray,
                               counts: np.ndarray, sums: np.ndarray, prev_theta: np.ndarray,
                               has_prev: np.ndarray, root_anchor: np.ndarray) -> float | None:
        """The time link's strength re-estimated from the carried nodes (``kappa0="auto"``;
        arguments as :meth:`estimate_link_strength`); ``None``: the time link follows ``kappa0``."""
        return None

    # ------------------------------------------------------------------ shared link rules
    #: the time link's own strength, estimated under ``kappa0="auto"`` by families that can
    #: (:meth:`estimate_time_strength`); ``None``: the time link follows ``kappa0``
    time_strength: float | None = None

    def link_strengths(self, depth: np.ndarray, kappa0: float | None = None,
                       time_strength: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per-node (parent, previous-epoch) link strengths ``kappa0 kappa1^d`` and
        ``kappa0 kappa1^(d + a)`` (0 where the variant has no such link; the DP baselines'
        fixed time strength ``xi``), at the family's ``kappa0`` unless one is given. An
        estimated :attr:`time_strength` (or one given) takes the place of ``kappa0`` in the
        time link."""
        v = self.variant
        k0 = self.kappa0 if kappa0 is None else kappa0
        k_t = time_strength if time_strength is not None else self.time_strength
        k_t = k0 if k_t is None else k_t
        d = np.asarray(depth, dtype=np.float64)
        par = k0 * self.kappa1 ** d if v.parent_link else np.zeros_like(d)
        if not v.time_link:
            tim = np.zeros_like(d)
        elif v.time_kappa is not None:
            tim = np.full_like(d, v.time_kappa)
        else:
            tim = k_t * self.kappa1 ** (d + self.a)
        return par, tim

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_features={self.n_features})"
