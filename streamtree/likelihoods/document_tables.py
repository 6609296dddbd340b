"""Bursty documents: Dirichlet-compound-multinomial counts through table-count augmentation.

A document's counts given its node's word distribution ``phi`` are
``DCM(x | s phi)``: the document draws its own distribution from ``Dir(s phi)`` and its tokens
from that, so a word it has used once is likely to come again (within-paragraph burstiness).
``s`` is one document concentration for the corpus; as ``s`` grows the model tends to the
plain multinomial.

The augmentation (Antoniak's Chinese-restaurant tables) is exact: with ``S(x, t)`` the
unsigned Stirling numbers of the first kind, ``Gamma(a + x) / Gamma(a) = sum_t S(x, t) a^t``,
so with a table count ``t_w`` per word (``1 <= t_w <= x_w``, ``t_w = 0`` where ``x_w = 0``)

    p(x, t | phi, s) = n! / prod_w x_w! * Gamma(s) / Gamma(s + n) * prod_w S(x_w, t_w) (s phi_w)^t_w.

Given ``t`` the node enters only through ``prod_w phi_w^t_w``: the multinomial family's
machinery (z-kernel, collapsed Dirichlet-multinomial marginals, MAP updates, split-merge moves)
reads the table counts ``T`` in place of the counts ``X`` unchanged. Two Gibbs steps complete the
sampler, both here:

* ``t_dw | x_dw, phi, s`` is Antoniak's distribution, ``p(t) oc S(x, t) a^t`` with
  ``a = s phi_w``: the number of tables of a Chinese restaurant with ``x`` customers, drawn
  as ``sum_{i < x} Bernoulli(a / (a + i))`` (:func:`draw_tables`);
* ``s | T`` has the density ``prior(s) prod_d s^{T_d} Gamma(s) / Gamma(s + n_d)`` with ``T_d``
  a document's tables and ``n_d`` its tokens (:func:`log_concentration_density`), sampled by
  slice steps on ``log s`` (:func:`sample_concentration`). Its prior is log-uniform on
  :data:`CONCENTRATION_RANGE`, a weak, scale-free prior over nine decades.
"""

from __future__ import annotations

import math

import streamtree  # noqa: F401  (configures the numba cache directory)
import numpy as np
import scipy.sparse as sp
from numba import njit
from scipy.special import gammaln

from streamtree.elementary import log_many_nb
from streamtree.inference.enumerated import as_csr, row_sums, rows_by_node
from streamtree.inference.hyper import slice_step
from streamtree.inference.threads import in_row_ranges
from streamtree.likelihoods.base import argmax_log_scale

#: support of the document concentration's log-uniform prior
CONCENTRATION_RANGE = (1e-2, 1e7)
#: slice steps on ``log s`` per sweep
CONCENTRATION_STEPS = 2
#: a new node's bursty predictive drops the table-count coefficients that cannot reach this
#: share (log) of the result (:func:`dcm_log_mixture`): relative error far below rounding
DCM_LOG_EPS = -60.0


@njit(cache=True, nogil=True)
def _tables_nb(indptr, indices, data, node_of_row, theta, s, u, first, out, order, r0, r1):
    """Table counts of the non-zeros of the rows ``order[r0:r1]`` of a CSR count matrix, customer
    by customer: the ``i``-th repeat (``i >= 1``) of word ``w`` opens a table with probability
    ``a / (a + i)``, ``a = s theta[node_of_row[r], w]``; ``u`` holds one uniform per repeat, in
    storage order, and row ``r``'s first is ``u[first[r]]``, so a row's tables do not depend on
    the order the rows are drawn in."""
    for i in range(r0, r1):
        r = order[i]
        row = theta[node_of_row[r]]
        pos = first[r]
        for k in range(indptr[r], indptr[r + 1]):
            x = int(data[k])
            if x == 0:  # a stored zero: no customers, no tables
                out[k] = 0.0
                continue
            a = s * row[indices[k]]
            t = 1  # the first customer always opens a table
            for j in range(1, x):
                if u[pos] * (a + j) < a:
                    t += 1
                pos += 1
            out[k] = t


@njit(cache=True, nogil=True)
def _all_integers(values) -> bool:
    for v in values:
        if not math.isfinite(v) or v != math.floor(v):
            return False
    return True


def draw_tables(X: sp.csr_matrix, theta: np.ndarray, node_of_row: np.ndarray, s: float,
                rng: np.random.Generator) -> sp.csr_matrix:
    """Table counts ``T ~ Antoniak(X, s theta[node_of_row])``, entry by entry, as a CSR matrix
    sharing ``X``'s sparsity pattern (its ``indptr`` and ``indices`` arrays, a new ``data``).

    ``X`` holds integer counts; ``theta`` rows are strictly positive word distributions and
    ``node_of_row[r]`` the row of ``theta`` that document ``r``'s node has. Entries equal to 1
    always give one table and use no random number; stored zeros give none. Rows are drawn in
    the order of their nodes (:func:`rows_by_node`), in ranges on the fitting threads, each row
    from its own stretch of one array of uniforms: the same tables in any order and on any
    thread count."""
    data = np.asarray(X.data, dtype=np.float64)
    if not _all_integers(data):
        raise ValueError("table draws need integer counts")
    repeats = np.zeros(data.size + 1, dtype=np.int64)
    np.cumsum(np.maximum(data - 1.0, 0.0).astype(np.int64), out=repeats[1:])
    u = rng.random(int(repeats[-1]))
    out = np.empty_like(data)
    indptr = X.indptr.astype(np.int64, copy=False)
    indices = X.indices.astype(np.int64, copy=False)
    first = repeats[indptr[:-1]]
    node_of_row = np.ascontiguousarray(node_of_row, dtype=np.int64)
    order = rows_by_node(node_of_row)
    theta = np.ascontiguousarray(theta, np.float64)

    def run(r0: int, r1: int) -> float:
        _tables_nb(indptr, indices, data, node_of_row, theta, float(s), u, first, out, order, r0, r1)
        return 0.0

    in_row_ranges(X.shape[0], run)
    return sp.csr_matrix((out, X.indices, X.indptr), shape=X.shape)


def log_concentration_density(s: float, tables: float, lengths: np.ndarray, weights: np.ndarray) -> float:
    """``log p(T | s)`` up to a constant, ``sum_d [T_d log s + lgamma(s) - lgamma(s + n_d)]``,
    with the documents grouped by length: ``lengths`` the distinct ``n_d``, ``weights`` how
    many documents have each, ``tables`` the total table count ``sum_d T_d``."""
    return float(tables * np.log(s) + np.sum(weights * (gammaln(s) - gammaln(s + lengths))))


def length_groups(X: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """The distinct document lengths of ``X`` and how many documents have each."""
    lengths, weights = np.unique(row_sums(X), return_counts=True)
    return lengths, weights.astype(np.float64)


def sample_concentration(s: float, tables: float, lengths: np.ndarray, weights: np.ndarray,
                         rng: np.random.Generator, n_steps: int = CONCENTRATION_STEPS) -> float:
    """``n_steps`` slice-sampling updates of ``s`` given the table counts, on ``log s`` under the
    log-uniform prior on :data:`CONCENTRATION_RANGE` (flat in ``log s``: the slice density is
    the likelihood itself)."""
    low, high = np.log(CONCENTRATION_RANGE[0]), np.log(CONCENTRATION_RANGE[1])

    def logp(v: float) -> float:
        return log_concentration_density(float(np.exp(v)), tables, lengths, weights)

    v = float(np.clip(np.log(s), low, high))
    for _ in range(n_steps):
        v = slice_step(v, logp, low, high, rng)
    return float(np.exp(v))


#: counts up to this many are one product in the Polya start's rising factorials (at most 16
#: factors, each below 1e7 + 16, stay far inside the double range)
_POLYA_PRODUCT_MAX = 16


@njit(cache=True, nogil=True, error_model="numpy")
def _polya_terms_nb(f, x, s, cut, lo, hi, prod, out):
    """``out[k] = log (s f[k])_x[k]`` for ``lo <= k < hi``, the counts ``x`` ascending and
    ``cut`` the first count above :data:`_POLYA_PRODUCT_MAX`: below it the log of one product
    ``prod_{i < x} (s f + i)`` (the logs in vector instructions; sorted counts keep the loop's
    exits predictable), from it on :func:`_log_rising`."""
    mid = max(lo, min(hi, cut))
    for k in range(lo, mid):
        a = s * f[k]
        p = 1.0
        for i in range(int(x[k])):
            p *= a + i
        prod[k] = p
    log_many_nb(prod[lo:mid], mid - lo, out[lo:mid])
    for k in range(mid, hi):
        out[k] = _log_rising(s * f[k], int(x[k]))


def polya_concentration(X: sp.csr_matrix, frequencies: np.ndarray, node_of_row: np.ndarray | None = None) -> float:
    """The Polya maximum-likelihood ``s`` of the documents about their word frequencies,
    ``argmax_s sum_d log DCM(x_d | s f_d)``: the chain's starting value (searched on
    :data:`CONCENTRATION_RANGE` on a log scale). ``frequencies`` is one distribution for
    every document, or with ``node_of_row`` a matrix whose row ``node_of_row[d]`` is
    document ``d``'s.

    ``X`` holds integer counts (the counts or table counts of multinomial documents). Each
    non-zero's ``log Gamma(a + x) - log Gamma(a)`` is summed as the log of the product
    ``a (a + 1) ... (a + x - 1)`` for the small counts text has (one logarithm in vector
    instructions, about a tenth of the cost of two ``lgamma`` calls, and free of their
    cancellation at large ``a``), the non-zeros taken in order of their counts, in ranges on
    the fitting threads element by element: the same answer on any thread count."""
    X = as_csr(X)
    lengths, weights = length_groups(X)
    frequencies = np.asarray(frequencies, dtype=np.float64)
    if node_of_row is None:
        f_nz = frequencies[X.indices]
    else:
        row_of_nz = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
        f_nz = frequencies[np.asarray(node_of_row)[row_of_nz], X.indices]
    data = np.asarray(X.data, dtype=np.float64)
    by_count = np.argsort(data, kind="stable")
    data = data[by_count]
    f_nz = np.ascontiguousarray(f_nz[by_count], dtype=np.float64)
    cut = int(np.searchsorted(data, _POLYA_PRODUCT_MAX, side="right"))
    prod = np.empty(f_nz.size)
    terms = np.empty(f_nz.size)  # each non-zero's log rising factorial, in one array for one sum

    def evidence(s: float) -> float:
        def part(lo: int, hi: int) -> float:
            _polya_terms_nb(f_nz, data, s, cut, lo, hi, prod, terms)
            return 0.0

        in_row_ranges(terms.size, part)
        return float(np.sum(weights * (gammaln(s) - gammaln(s + lengths))) + np.sum(terms))

    return argmax_log_scale(evidence, *CONCENTRATION_RANGE)


# ---------------------------------------------------------------------------- predictive density
#: counts up to this many sum ``log(a + i)`` for ``log (a)_x``; larger ones use ``lgamma``
_RISING_SUM_MAX = 16
#: and at any count once ``a`` exceeds this
_RISING_SUM_FROM = 1e4


@njit(cache=True, nogil=True)
def _log_rising(a, x):
    """``log (a)_x = log Gamma(a + x) - log Gamma(a)``, summed term by term for small ``x`` or
    large ``a`` (exact, and free of the cancellation of two large ``lgamma`` values, which
    loses about ``1e-16 a log a`` when ``a`` is large)."""
    if x <= _RISING_SUM_MAX or a > _RISING_SUM_FROM:
        out = 0.0
        for i in range(x):
            out += np.log(a + i)
        return out
    return math.lgamma(a + x) - math.lgamma(a)


def log_stirling_table(max_count: int) -> np.ndarray:
    """``log S(x, t)`` (unsigned Stirling numbers of the first kind) for ``0 <= t <= x <=
    max_count``, ``-inf`` where ``S`` is 0, from ``S(x + 1, t) = x S(x, t) + S(x, t - 1)``."""
    out = np.full((max_count + 1, max_count + 1), -np.inf)
    out[0, 0] = 0.0
    for x in range(max_count):
        with np.errstate(divide="ignore"):
            grow = np.log(x) + out[x, 1:] if x else np.full(max_count, -np.inf)
        out[x + 1, 1:] = np.logaddexp(grow, out[x, :-1])
    return out


@njit(cache=True, nogil=True)
def _row_counts(indptr, indices, data, r):
    """Row ``r`` of a CSR count matrix: its term indices, its counts and its length."""
    idx = indices[indptr[r]:indptr[r + 1]]
    cnt = data[indptr[r]:indptr[r + 1]]
    n = 0
    for k in range(cnt.shape[0]):
        n += int(cnt[k])
    return idx, cnt, n


@njit(cache=True, nogil=True)
def _log_dcm_row(idx, cnt, s_phi, n, s):
    """``log DCM(x | s phi)`` of one row without the multinomial coefficient."""
    out = -_log_rising(s, n)
    for k in range(idx.shape[0]):
        out += _log_rising(s_phi[idx[k]], int(cnt[k]))
    return out


@njit(cache=True, nogil=True)
def _log_dcm_expected_row(idx, cnt, alpha, log_s, n, log_stirling, poly, word, log_rising_A, log_eps):
    """``log E_{phi ~ Dir(alpha)} DCM(x | s phi)`` of one row without the multinomial
    coefficient and without ``Gamma(s) / Gamma(s + n)``, through the table counts ``t``:
    ``sum_t prod_w S(x_w, t_w) s^t_w (alpha_w)_t_w / (A)_T``. The words couple only through
    ``T = sum_w t_w``, so the sum over ``t`` is the product of one polynomial in ``z`` per word,
    ``sum_t S(x_w, t) s^t (alpha_w)_t z^t``, whose ``z^T`` coefficients are then divided by
    ``(A)_T``; all in log space. ``poly`` and ``word`` are scratch of length ``n + 1``.

    After each word the partial product keeps only the coefficients that can still matter:
    coefficient ``j``'s share of the result is ``P_j g_j`` with ``g_j`` the rest of the sum for
    ``j`` tables so far, and from ``j`` to ``j + 1`` tables ``g`` falls by a weighted mean of
    ``1 / (A + T)`` over the final counts ``T = u + j + d`` it can reach (``u`` words seen once,
    ``d`` between the repeated words still to come and their tokens). So against any kept
    coefficient ``P_m``, one ``k`` tables above it weighs at most
    ``P_(m+k) / P_m (A + u + m + words to come)^-k`` of ``P_m g_m``, one ``k`` below at most
    ``P_(m-k) / P_m (A + u + m + tokens to come)^k``; those under ``exp(log_eps)`` are
    dropped. The anchor ``m`` maximises ``P_m`` tilted by a rate between the two, near the
    coefficients that weigh most in the result. Each drop loses at most that share of the
    result, so with ``log_eps = -60`` the relative error stays below
    ``n`` times the number of words times ``1e-26``; ``-inf`` keeps every coefficient. On a
    long document the product is then a band around the likely table counts, not all of
    them: the cost falls from the document's length times its repeated tokens towards the
    band's width times them."""
    A = 0.0
    for w in range(alpha.shape[0]):
        A += alpha[w]
    log_rising_A[0] = 0.0
    for t in range(1, n + 1):
        log_rising_A[t] = log_rising_A[t - 1] + np.log(A + (t - 1))
    # the table counts still to come: every word seen once gives one table, and the repeated
    # words not yet multiplied in give between one and their count each
    singles = 0
    rest_words = 0
    rest_tokens = 0
    for k in range(idx.shape[0]):
        x = int(cnt[k])
        if x == 1:
            singles += 1
        elif x > 1:
            rest_words += 1
            rest_tokens += x
    # words seen once give one table: a factor s alpha_w z each, kept as a constant and a shift
    # of the table count by ``singles``
    const = 0.0
    poly[0] = 0.0
    plo = 0  # the partial product's kept coefficients: poly[plo .. deg]
    deg = 0
    for k in range(idx.shape[0]):
        x = int(cnt[k])
        if x == 0:
            continue  # a stored zero: a factor of one (no tables), not a word with none
        a = alpha[idx[k]]
        if x == 1:
            const += log_s + np.log(a)
            continue
        lr = 0.0
        for t in range(1, x + 1):
            lr += np.log(a + (t - 1))  # (a + t) - 1 would lose a tiny alpha
            word[t] = log_stirling[x, t] + t * log_s + lr
        # (poly * word)[j] for j = plo + 1 .. deg + x, written from the top down so that poly
        # can be overwritten in place (entry j reads poly[j - t] with t >= 1 only)
        for j in range(deg + x, plo, -1):
            lo = max(1, j - deg)
            hi = min(x, j - plo)
            m = -np.inf
            for t in range(lo, hi + 1):
                v = poly[j - t] + word[t]
                if v > m:
                    m = v
            acc = 0.0
            if m > -np.inf:
                for t in range(lo, hi + 1):
                    acc += np.exp(poly[j - t] + word[t] - m)
                poly[j] = m + np.log(acc)
            else:
                poly[j] = -np.inf
        plo += 1  # every repeated word has at least one table
        deg += x
        rest_words -= 1
        rest_tokens -= x
        # the anchor: the largest coefficient tilted by a middle rate of g's fall per table
        tilt = np.log(A + singles + 0.5 * (plo + deg + rest_words + rest_tokens))
        top = plo
        for j in range(plo + 1, deg + 1):
            if poly[j] - (j - top) * tilt > poly[top]:
                top = j
        if poly[top] == -np.inf:
            continue
        # g falls per table by 1 / (A + T) at the final count T = singles + j + (tables to come),
        # so above the anchor by at least log(A + singles + top + rest_words) nats, and below it
        # rises by at most log(A + singles + top + rest_tokens) nats
        log_down = np.log(A + singles + top + rest_words)
        log_up = np.log(A + singles + top + rest_tokens)
        while deg > top and poly[deg] - poly[top] - (deg - top) * log_down < log_eps:
            deg -= 1
        while plo < top and poly[plo] - poly[top] + (top - plo) * log_up < log_eps:
            plo += 1
    m = -np.inf
    for j in range(plo, deg + 1):
        v = poly[j] - log_rising_A[singles + j]
        if v > m:
            m = v
    acc = 0.0
    for j in range(plo, deg + 1):
        acc += np.exp(poly[j] - log_rising_A[singles + j] - m)
    return const + m + np.log(acc)


@njit(cache=True, nogil=True)
def _dcm_mixture_nb(indptr, indices, data, theta, live_log_mass, alpha, ph_log_mass, s, log_stirling, log_eps, out):
    """Per row ``log [sum_k w_k DCM(x | s theta_k) + sum_p u_p E_{Dir(alpha_p)} DCM(x | s phi)]``
    without the multinomial coefficient (``w``, ``u`` as log weights; ``-inf`` skips a column)."""
    K = theta.shape[0]
    P = alpha.shape[0]
    s_theta = s * theta
    log_s = np.log(s)
    max_n = 0
    for r in range(indptr.shape[0] - 1):
        max_n = max(max_n, _row_counts(indptr, indices, data, r)[2])
    poly = np.empty(max_n + 1)
    word = np.empty(max_n + 1)
    log_rising_A = np.empty(max_n + 1)
    terms = np.empty(K + P)
    for r in range(indptr.shape[0] - 1):
        idx, cnt, n = _row_counts(indptr, indices, data, r)
        base = -_log_rising(s, n)
        for c in range(K):
            if live_log_mass[c] == -np.inf:
                terms[c] = -np.inf
            else:
                terms[c] = live_log_mass[c] + _log_dcm_row(idx, cnt, s_theta[c], n, s)
        for p in range(P):
            if ph_log_mass[p] == -np.inf:
                terms[K + p] = -np.inf
            else:
                terms[K + p] = ph_log_mass[p] + base + _log_dcm_expected_row(
                    idx, cnt, alpha[p], log_s, n, log_stirling, poly, word, log_rising_A, log_eps)
        m = -np.inf
        for c in range(K + P):
            if terms[c] > m:
                m = terms[c]
        if m == -np.inf:
            out[r] = -np.inf
            continue
        acc = 0.0
        for c in range(K + P):
            acc += np.exp(terms[c] - m)
        out[r] = m + np.log(acc)


@njit(cache=True, nogil=True)
def _dcm_matrix_nb(indptr, indices, data, s_theta, s, out):
    """out[r, k] = log DCM(x_r | s theta_k) without the multinomial coefficient."""
    for r in range(indptr.shape[0] - 1):
        idx, cnt, n = _row_counts(indptr, indices, data, r)
        for c in range(s_theta.shape[0]):
            out[r, c] = _log_dcm_row(idx, cnt, s_theta[c], n, s)


def dcm_log_likelihoods(X: sp.csr_matrix, theta: np.ndarray, s: float) -> np.ndarray:
    """``log DCM(x_r | s theta_k)`` of every row of the integer counts ``X`` at every row of
    ``theta``, shape ``(n, K)``, without the multinomial coefficient (equal for every node)."""
    X = sp.csr_matrix(X)
    theta = np.ascontiguousarray(np.atleast_2d(theta), dtype=np.float64)
    out = np.empty((X.shape[0], theta.shape[0]))
    _dcm_matrix_nb(X.indptr.astype(np.int64, copy=False), X.indices.astype(np.int64, copy=False),
                   np.asarray(X.data, dtype=np.float64), s * theta, float(s), out)
    return out


def dcm_log_mixture(X: sp.csr_matrix, theta: np.ndarray, live_log_mass: np.ndarray, alpha: np.ndarray,
                    ph_log_mass: np.ndarray, s: float, log_eps: float = DCM_LOG_EPS) -> np.ndarray:
    """Log density of each row of the integer counts ``X`` under a mixture of bursty documents,
    without the multinomial coefficient ``n! / prod_w x_w!`` (as the multinomial's z-kernel):

        log [ sum_k exp(live_log_mass[k]) DCM(x | s theta[k])
              + sum_p exp(ph_log_mass[p]) E_{phi ~ Dir(alpha[p])} DCM(x | s phi) ].

    ``DCM(x | s phi) = Gamma(s) / Gamma(s + n) prod_w Gamma(s phi_w + x_w) / Gamma(s phi_w)``
    in closed form; the expectation over ``phi`` (a new node) is exact, a sum over the
    documents' table counts computed as a product of per-word polynomials (cost of order
    ``n`` times the row's repeated tokens per row and new node at most, less where the
    product's coefficients that cannot reach ``exp(log_eps)`` of the result are dropped;
    ``-inf`` keeps them all)."""
    X = sp.csr_matrix(X)
    data = np.asarray(X.data, dtype=np.float64)
    max_count = int(data.max()) if data.size else 0
    out = np.empty(X.shape[0])
    alpha = np.ascontiguousarray(np.atleast_2d(alpha), dtype=np.float64).reshape(-1, X.shape[1])
    _dcm_mixture_nb(X.indptr.astype(np.int64, copy=False), X.indices.astype(np.int64, copy=False), data,
                    np.ascontiguousarray(np.atleast_2d(theta), np.float64),
                    np.ascontiguousarray(live_log_mass, np.float64), alpha,
                    np.ascontiguousarray(ph_log_mass, np.float64), float(s), log_stirling_table(max_count),
                    float(log_eps), out)
    return out
