"""Enumerated blocked Gibbs z-update: the production sampler.

Every live node is a candidate, and every node above the depth cap also gets one placeholder
child that stands for all of its not-yet-created children (it carries their residual stick mass
and the collapsed new-node marginal). Given sticks and parameters, the documents are
conditionally independent, so a sweep is one sparse-dense product ``X @ Theta.T`` and one
categorical draw per row. For CSR rows both happen in one numba pass per row (no score matrix);
dense rows go through BLAS in fixed blocks. Row ranges can run on GIL-free threads, and since a
row's result depends only on the row and its uniform, the output is the same for any thread
count. This module also holds the per-shard statistics the coordinator needs afterwards (sparse
per-node sums for sparse rows). Nothing here knows about shards or processes: engines call
:func:`sweep_rows` on whatever rows they hold.

The vMF's weighted kernel (:func:`streamtree.likelihoods.vmf.sample_weighted_rows`) compiles
this module's row product and draw into itself; numba renews a cached kernel only when its own
file changes, so the package keeps its cache in a folder named by the source of all its kernel
modules (:mod:`streamtree._numba_env`). With ``NUMBA_CACHE_DIR`` set by hand, clear that folder
after editing them, or that kernel keeps the old arithmetic.
"""

from __future__ import annotations

import math
import weakref
from concurrent.futures import Executor
from dataclasses import dataclass, fields

import numpy as np
import scipy.sparse as sp
from numba import njit

import streamtree  # noqa: F401  (numba cache configuration)
from streamtree.elementary import EXP_CORE_MIN, exp_core, log_core, log_many_nb, log_nb
from streamtree.inference.threads import run_ranges

# Numeric forms of the placeholder (new-node) term; live columns are always linear.
VMF = 0  # a tabulated function of the parent's score (the vMF collapsed new-node marginal)
LINEAR = 1  # linear in the parent's score and ||x||^2 (the Gaussian new-node marginal)
DIRICHLET = 2  # Dirichlet-multinomial over the row's counts with a per-placeholder Dirichlet

_BLOCK_ROWS = 4096
#: the weighted vMF kernel's normaliser tables (distinct weights x columns) stay within this many entries
_WEIGHT_TABLE_ENTRIES = 1 << 22
# Cubic Hermite table of the collapsed new-node term over t = x . theta_parent in [-1, 1]:
# exact values and slopes at 1025 knots give an interpolation error below 1e-9 (tested), and the
# kernel pays a few flops per placeholder instead of a Bessel-function evaluation. Not so next to
# t = -1 when b and c are close and well above p: the term then goes as sqrt(1 + t), which a cubic
# cannot follow, and the first interval can be nats off (from t = -0.5 on it stays within 1e-7).
# Rows of term weights are non-negative, so for text t >= 0; a row nearly opposite its node's
# parent is the only case that reads those knots.
TABLE_INTERVALS = 1024
_SCORE_BLOCK_ENTRIES = 1 << 21  # stored scores per block of rows (16 MiB) when the table is built per sweep


@dataclass(frozen=True)
class Candidates:
    """The broadcast state of one z-sweep: what a likelihood object hands the kernel.

    ``coef_T`` is the coefficient matrix of the one sparse-dense product: ``score[n, k] =
    x_n . coef_T[:, k]`` (node directions for vMF and Gaussian, log word probabilities for the
    multinomial). Live column ``k`` has log weight
    ``live_a[k] + live_b[k] * score[n, k] + live_c[k] * ||x_n||^2``. Placeholder ``j`` stands
    for all new children of live column ``ph_parent[j]``; its log weight by ``kind``:

    * ``VMF``: ``ph_a[j] - log C_p(sqrt(b^2 + c^2 + 2 b c t))`` with ``t`` the parent's score,
      ``b = ph_b[j]`` (the new node's concentration) and ``c = ph_c[j]`` (the prior
      concentration around the parent), which is log mass plus the collapsed marginal when
      ``ph_a`` holds ``log mass + log C_p(b) + log C_p(c)``; the second term is read from
      ``ph_table`` (see :func:`streamtree.likelihoods.vmf.new_node_table`), which
      :func:`score_rows` builds when it is None;
    * ``LINEAR``: ``ph_a[j] + ph_b[j] * t + ph_c[j] * ||x||^2``;
    * ``DIRICHLET``: ``ph_a[j] + lgamma(A) - lgamma(A + n_x) + sum_w [lgamma(alpha_w + x_w) -
      lgamma(alpha_w)]`` over the row's non-zero counts, with ``alpha = ph_alpha[j]``,
      ``A = ph_b[j] = sum(alpha)`` and ``n_x`` the row's total count: log mass plus the
      Dirichlet-multinomial marginal when ``ph_a`` holds the log mass (the multinomial
      coefficient, equal for every column, is left out). Made by :meth:`Candidates.dirichlet`,
      they also hold the parts ``coef_T`` and ``ph_alpha`` are built from: the live columns'
      word distributions ``theta_T`` (p, K) (``coef_T`` is their log), a strength per
      placeholder ``ph_strength`` and the floor ``ph_floor``, with ``ph_alpha[j] =
      ph_strength[j] theta_T[:, ph_parent[j]] + ph_floor``. Such candidates travel as their
      parts, and a receiver (a Ray shard) rebuilds the rest (:meth:`__reduce__`).

      The invariant that allows it: ``coef_T`` and ``ph_alpha`` are what the parts give. The
      candidates remember the two arrays :meth:`dirichlet` built (or a receiver rebuilt), and
      travel as their parts only while they still hold those very arrays: candidates made
      otherwise, or with other fields by ``dataclasses.replace``, travel whole, as they are.
      ``theta_T`` may be a view of the caller's array (the epoch sampler's buffer, reused from
      sweep to sweep; the view itself is read-only): the caller must not change that array
      while the candidates are in use, up to their last pickling (for Ray, the sweep's
      broadcast), or a receiver would rebuild the coefficients from the changed values.

    VMF rows of norm ``w`` other than 1 are documents of weight ``w`` (concentration ``beta w``
    at a node of concentration ``beta``): :func:`score_rows` then scores them exactly (compiled,
    :func:`_weighted_vmf_rows`), ``log C_p(beta w)`` in place of ``log C_p(beta)`` where
    ``normalized`` says the columns hold the normalisers.
    """

    kind: int
    coef_T: np.ndarray  # (p, K), C-contiguous
    live_a: np.ndarray
    live_b: np.ndarray
    live_c: np.ndarray
    ph_parent: np.ndarray
    ph_a: np.ndarray
    ph_b: np.ndarray
    ph_c: np.ndarray
    # VMF: (P, TABLE_INTERVALS + 1, 2) values and slopes; None (the usual case) builds, for the
    # rows being scored, only the knots that their parent scores reach
    ph_table: np.ndarray | None = None
    ph_alpha: np.ndarray | None = None  # DIRICHLET: (P, p) Dirichlet parameters
    normalized: bool = True  # VMF: whether live_a and ph_a hold the log normalisers of beta and b
    # DIRICHLET, the parts coef_T and ph_alpha are built from (Candidates.dirichlet): the live
    # columns' word distributions (p, K), C-contiguous (as the vMF's coef_T, possibly a view of
    # the caller's array), a strength per placeholder (P,) and the floor
    theta_T: np.ndarray | None = None
    ph_strength: np.ndarray | None = None
    ph_floor: float = 0.0

    def __post_init__(self) -> None:
        if self.kind == DIRICHLET and self.ph_alpha is None:
            raise ValueError("DIRICHLET candidates need ph_alpha")
        if (self.theta_T is None) != (self.ph_strength is None) or (self.theta_T is not None
                                                                    and self.kind != DIRICHLET):
            raise ValueError("theta_T and ph_strength go together, in DIRICHLET candidates only")

    @classmethod
    def dirichlet(cls, theta: np.ndarray, log_mass: np.ndarray, ph_parent: np.ndarray, ph_log_mass: np.ndarray,
                  ph_strength: np.ndarray, floor: float) -> "Candidates":
        """DIRICHLET candidates of live columns with word distributions ``theta`` (K, p) and log
        masses ``log_mass``, and of placeholders below the live columns ``ph_parent`` with log
        masses ``ph_log_mass`` and Dirichlet parameters ``ph_strength[j] theta[ph_parent[j]] +
        floor``. They hold their parts (``theta_T``, ``ph_strength``, ``ph_floor``) and travel as
        those alone (:meth:`__reduce__`)."""
        theta_T = np.ascontiguousarray(np.asarray(theta, dtype=np.float64).T)  # no copy for a transposed buffer
        theta_T.flags.writeable = False  # our view (or copy): the caller's array keeps its flags
        ph_parent = np.asarray(ph_parent, dtype=np.int64)
        ph_strength = np.asarray(ph_strength, dtype=np.float64)
        alpha = dirichlet_alpha(theta_T, ph_parent, ph_strength, floor)
        K, P = theta_T.shape[1], ph_parent.shape[0]
        return cls(DIRICHLET, dirichlet_coefficients(theta_T), np.asarray(log_mass, np.float64), np.ones(K),
                   np.zeros(K), ph_parent, np.asarray(ph_log_mass, dtype=np.float64), alpha.sum(axis=1),
                   np.zeros(P), ph_alpha=alpha, theta_T=theta_T, ph_strength=ph_strength,
                   ph_floor=float(floor))._built_from_parts()

    def _built_from_parts(self) -> "Candidates":
        """These candidates, marked as holding the coef_T and ph_alpha their parts give (the arrays
        themselves are remembered: another instance, from ``dataclasses.replace`` say, is not marked)."""
        object.__setattr__(self, "_parts_give", (self.coef_T, self.ph_alpha))
        return self

    @property
    def _travels_as_parts(self) -> bool:
        built = self.__dict__.get("_parts_give")
        return (self.theta_T is not None and built is not None and built[0] is self.coef_T
                and built[1] is self.ph_alpha)

    def __reduce__(self):
        # What travels (to a Ray shard each sweep, into a pickle). Candidates holding their parts
        # leave out coef_T and ph_alpha, which _arrived rebuilds with the functions that built
        # them here: theta's K x p doubles and P strengths travel, not (K + P) x p. theta, not
        # its log: exp(log theta) misses theta's last bit for most terms, so the parameters and
        # their sums could not be rebuilt exactly from the log, and the parents' rows beside it
        # would cost the P x p this saves. The receiver's NumPy log gives the sender's bits
        # where both run the same NumPy on the same instruction set (on one machine always).
        # Only while they hold the arrays built from the parts (see the class docstring); other
        # candidates travel as they are.
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        if self._travels_as_parts:
            state["coef_T"] = state["ph_alpha"] = None
        return _arrived, (state,)

    @property
    def n_live(self) -> int:
        return int(self.live_a.shape[0])

    @property
    def n_placeholders(self) -> int:
        return int(self.ph_a.shape[0])

    @property
    def n_columns(self) -> int:
        return self.n_live + self.n_placeholders

    @property
    def dim(self) -> int:
        return int(self.coef_T.shape[0])


def dirichlet_coefficients(theta_T: np.ndarray) -> np.ndarray:
    """The coefficients ``log theta`` (p, K) of DIRICHLET candidates given by ``theta_T`` (p, K)."""
    return np.log(theta_T)


def dirichlet_alpha(theta_T: np.ndarray, ph_parent: np.ndarray, strength: np.ndarray, floor: float) -> np.ndarray:
    """Placeholder ``j``'s Dirichlet parameter ``strength[j] theta[ph_parent[j]] + floor`` for
    every ``j``, from the live columns' distributions ``theta_T`` (p, K): a C-contiguous (P, p)
    array (the parents' rows gathered, then scaled and floored: the values, and the layout
    whose row sums give ``ph_b``, on the driver and on every shard)."""
    return np.asarray(strength, dtype=np.float64)[:, None] * theta_T.T[ph_parent] + floor


def _arrived(state: dict) -> Candidates:
    """Candidates as :meth:`Candidates.__reduce__` sent them, with what was left out rebuilt
    from their parts: the coefficients and the placeholders' parameters."""
    if state["theta_T"] is not None and state["coef_T"] is None:
        theta_T = state["theta_T"]
        state = dict(state, coef_T=dirichlet_coefficients(theta_T),
                     ph_alpha=dirichlet_alpha(theta_T, state["ph_parent"], state["ph_strength"], state["ph_floor"]))
        return Candidates(**state)._built_from_parts()  # sent on, they travel as their parts again
    return Candidates(**state)


#: how far a unit row's norm may be from 1 (the vMF's input check without document weights)
UNIT_NORM_TOL = 1e-6
#: rows whose squared norm is within this of 1 are unit rows (the vMF's documents of weight 1): it
#: covers every row the unit check accepts, so unit rows never take the weighted path
WEIGHT_TOL = 3 * UNIT_NORM_TOL


@njit(cache=True, nogil=True, inline="always")
def _interval(n, t):
    """The interval of ``t`` in ``[-1, 1]`` split into ``n``, and ``t``'s place on the grid."""
    h = 2.0 / n
    x = (t + 1.0) / h
    i = int(x)
    if i < 0:
        i = 0
    elif i > n - 1:
        i = n - 1
    return i, x


@njit(cache=True, nogil=True)
def _hermite(table, j, t):
    n = table.shape[1] - 1
    h = 2.0 / n
    i, x = _interval(n, t)
    s = x - i
    s2 = s * s
    s3 = s2 * s
    return ((2.0 * s3 - 3.0 * s2 + 1.0) * table[j, i, 0] + (s3 - 2.0 * s2 + s) * h * table[j, i, 1]
            + (3.0 * s2 - 2.0 * s3) * table[j, i + 1, 0] + (s3 - s2) * h * table[j, i + 1, 1])


@njit(cache=True, nogil=True, error_model="numpy")
def _weights_and_draw(i, scores, sqnorm_i, live_a, live_b, live_c, ph_parent, ph_a, ph_b, ph_c, table,
                      ph_score, kind, u, labels, lognorm, sample, w, at, own_i, adj_i):
    """Column weights of one row from its live scores, its log normaliser and (optionally) a draw.

    ``adj_i`` is added to live column ``own_i`` (the row's own node; -1: none); ``w`` and ``at``
    (int64) are work space of one entry per column."""
    K = live_a.shape[0]
    P = ph_a.shape[0]
    m = -np.inf
    for k in range(K):
        v = live_a[k] + live_b[k] * scores[k] + live_c[k] * sqnorm_i
        if k == own_i:
            v += adj_i
        w[k] = v
        if v > m:
            m = v
    for j in range(P):
        t = scores[ph_parent[j]]
        if kind == 0:
            v = ph_a[j] + _hermite(table, j, min(max(t, -1.0), 1.0))
        elif kind == 1:
            v = ph_a[j] + ph_b[j] * t + ph_c[j] * sqnorm_i
        else:
            v = ph_a[j] + ph_score[j]
        w[K + j] = v
        if v > m:
            m = v
    # Only the columns within 708 nats of the row's best count. The others weigh 0: below
    # 3e-308 against the best one's 1, their weights would not change the sum's bits, and
    # neither does leaving zeros out of it. A NaN column counts, so the normaliser shows it.
    n = 0
    for k in range(K + P):
        d = w[k] - m
        w[k] = d
        n += not d < EXP_CORE_MIN
    s = 0.0
    if 4 * n >= K + P:  # most columns count: every exponential in one loop of vector instructions
        for k in range(K + P):
            d = w[k]
            w[k] = exp_core(max(d, EXP_CORE_MIN)) if not d < EXP_CORE_MIN else 0.0
        for k in range(K + P):
            s += w[k]
    else:  # a peaked row: the few that count, listed without a branch per column (the others
        # keep their differences, below -708, which the draw skips as it skips weights of 0)
        q = 0
        for k in range(K + P):
            at[q] = k
            q += not w[k] < EXP_CORE_MIN
        for q in range(n):
            w[at[q]] = exp_core(w[at[q]])
        for q in range(n):
            s += w[at[q]]
    lognorm[i] = m + math.log(s)
    if sample:
        target = u[i] * s
        acc = 0.0
        chosen = -1
        for k in range(K + P):
            if w[k] > 0.0:
                chosen = k
                acc += w[k]
                if acc > target:
                    break
        labels[i] = chosen


@njit(cache=True, nogil=True)
def _sample_block(scores, sqnorm, live_a, live_b, live_c, ph_parent, ph_a, ph_b, ph_c, table, ph_scores,
                  kind, u, labels, lognorm, sample, own, adj):
    """Rows with precomputed live scores (dense input: the product ran through BLAS)."""
    n = scores.shape[0]
    w = np.empty(live_a.shape[0] + ph_a.shape[0])
    at = np.empty(w.shape[0], dtype=np.int64)
    no_ph = np.zeros(0)
    for i in range(n):
        _weights_and_draw(i, scores[i], sqnorm[i], live_a, live_b, live_c, ph_parent, ph_a, ph_b, ph_c, table,
                          ph_scores[i] if kind == 2 else no_ph, kind, u, labels, lognorm, sample, w, at, own[i],
                          adj[i])


@njit(cache=True, nogil=True, inline="always")
def _add_four(scores, K, x0, x1, x2, x3, r0, r1, r2, r3):
    """``scores[k] += x0 r0[k]``, then ``x1 r1[k]``, ``x2 r2[k]``, ``x3 r3[k]``, for the first ``K``
    columns: four non-zeros' additions in storage order, one load and store of each score."""
    for k in range(K):
        s = scores[k]
        s += x0 * r0[k]
        s += x1 * r1[k]
        s += x2 * r2[k]
        s += x3 * r3[k]
        scores[k] = s


@njit(cache=True, nogil=True)
def _csr_row_scores(indptr, indices, data, i, coef_T, scores):
    """``scores = x_i . coef_T`` for CSR row ``i``, over its non-zeros in storage order.

    Four non-zeros go through ``scores`` in one pass, each column taking their four terms one
    after the other: the same additions in the same order as one pass per non-zero (so the
    same values), with a quarter of the loads and stores of ``scores`` and four coefficient
    rows read at once (the product waits on memory: 2 GB of rows a sweep at V = 20,000)."""
    K = coef_T.shape[1]
    scores[:] = 0.0
    q, stop = indptr[i], indptr[i + 1]
    while q + 4 <= stop:
        x0, x1, x2, x3 = data[q], data[q + 1], data[q + 2], data[q + 3]
        r0, r1 = coef_T[indices[q]], coef_T[indices[q + 1]]
        r2, r3 = coef_T[indices[q + 2]], coef_T[indices[q + 3]]
        _add_four(scores, K, x0, x1, x2, x3, r0, r1, r2, r3)
        q += 4
    while q < stop:
        x = data[q]
        row = coef_T[indices[q]]
        for k in range(K):
            scores[k] += x * row[k]
        q += 1


@njit(cache=True, nogil=True)
def _sample_csr(indptr, indices, data, order, start, stop, coef_T, sqnorm, live_a, live_b, live_c, ph_parent,
                ph_a, ph_b, ph_c, table, dm, kind, u, labels, lognorm, sample, own, adj):
    """Rows ``order[start..stop]`` of a CSR matrix: the sparse-dense product fused with the draw.

    Each row's scores accumulate ``x_q * coef_T[w_q]`` over its non-zeros in storage order, so
    a row's result does not depend on how rows are split between threads or in which order
    they are taken. Dirichlet placeholders (``kind == 2``) read ``dm`` from
    :func:`dirichlet_tables` with ``coef_T``: its joint table holds each term's live
    coefficients and placeholder logarithms side by side (:func:`_joint_row_T`).
    """
    K = coef_T.shape[1]
    P = ph_a.shape[0]
    scores = np.empty(K)
    w = np.empty(K + P)
    at = np.empty(K + P, dtype=np.int64)
    ph_score = np.zeros(P if kind == 2 else 0)
    ph_work = np.empty_like(ph_score)
    for ii in range(start, stop):
        i = order[ii]
        if kind == 2 and P:  # live and placeholder terms from one table row per non-zero
            _joint_row_T(indptr, indices, data, i, dm[1], K, dm[0], dm[2], dm[3], dm[4], ph_b, scores, ph_score,
                         ph_work)
        else:
            _csr_row_scores(indptr, indices, data, i, coef_T, scores)
        _weights_and_draw(i, scores, sqnorm[i], live_a, live_b, live_c, ph_parent, ph_a, ph_b, ph_c, table,
                          ph_score, kind, u, labels, lognorm, sample, w, at, own[i], adj[i])


@njit(cache=True, nogil=True)
def _csr_scores(indptr, indices, data, order, start, stop, coef_T, ph_parent, out, touched):
    """``out[ii - start] = x_i . coef_T`` for the CSR rows ``i = order[ii]``, ``ii`` in
    ``start..stop``, each summed exactly as :func:`_sample_csr` sums it (the same values);
    ``touched[j, m]`` is set where a row's score against placeholder ``j``'s parent falls in
    the table's interval ``m``."""
    n = touched.shape[1]
    for ii in range(start, stop):
        s = out[ii - start]
        _csr_row_scores(indptr, indices, data, order[ii], coef_T, s)
        for j in range(ph_parent.shape[0]):
            m, _ = _interval(n, min(max(s[ph_parent[j]], -1.0), 1.0))
            touched[j, m] = True


def range_knots(low: np.ndarray, high: np.ndarray, intervals: int = TABLE_INTERVALS) -> np.ndarray:
    """Mask ``(len(low), intervals + 1)`` of the table knots that :func:`_hermite` reads for
    scores in ``[low, high]``, widened by one knot each side (a score computed by another
    product may differ in its last bit); none where ``low > high``."""
    h = 2.0 / intervals
    first = np.floor((np.clip(low, -1.0, 1.0) + 1.0) / h)
    last = np.floor((np.clip(high, -1.0, 1.0) + 1.0) / h)
    lo = np.maximum(np.clip(first, 0, intervals - 1).astype(np.int64) - 1, 0)
    hi = np.minimum(np.clip(last, 0, intervals - 1).astype(np.int64) + 2, intervals)
    grid = np.arange(intervals + 1)
    return (grid >= lo[:, None]) & (grid <= hi[:, None]) & (low <= high)[:, None]


def interval_knots(touched: np.ndarray) -> np.ndarray:
    """Mask of the knots that bound the ``touched`` intervals (shape ``(P, n)`` -> ``(P, n + 1)``)."""
    knots = np.zeros((touched.shape[0], touched.shape[1] + 1), dtype=bool)
    knots[:, :-1] |= touched
    knots[:, 1:] |= touched
    return knots


def _reached_table(cand: Candidates, knots: np.ndarray, have: tuple | None):
    """The VMF new-node table with (at least) the ``knots`` asked for, and the knots it holds;
    ``have`` is the previous ``(table, knots)``, kept when it already holds them."""
    from streamtree.likelihoods.vmf import new_node_table  # that module builds on this one

    if have is not None:
        if not np.any(knots & ~have[1]):
            return have
        knots = knots | have[1]
    return new_node_table(cand.dim, np.asarray(cand.ph_b), np.asarray(cand.ph_c), TABLE_INTERVALS, knots), knots


@njit(cache=True, nogil=True)
def _log_rising(a, x):
    """lgamma(a + x) - lgamma(a) for a count x >= 0 (a product of x factors when x is small)."""
    if x <= 8.0 and x == math.floor(x):
        acc = 0.0
        for j in range(int(x)):
            acc += log_nb(a + j)
        return acc
    return math.lgamma(a + x) - math.lgamma(a)


@njit(cache=True, nogil=True)
def _dirichlet_row(indptr, indices, data, i, alpha, alpha_sum, out):
    """out[j] = sum_w [lgamma(alpha_jw + x_iw) - lgamma(alpha_jw)] + lgamma(A_j) - lgamma(A_j + n_i)
    for row ``i`` of a CSR matrix."""
    total = 0.0
    for q in range(indptr[i], indptr[i + 1]):
        total += data[q]
    for j in range(alpha.shape[0]):
        acc = -_log_rising(alpha_sum[j], total)
        for q in range(indptr[i], indptr[i + 1]):
            acc += _log_rising(alpha[j, indices[q]], data[q])
        out[j] = acc


@njit(cache=True, nogil=True)
def _dirichlet_tables_nb(alpha, alpha_sum, columns, lengths, coef_T):
    """Column-major tables of :func:`_joint_row_T` for Dirichlet rows ``alpha`` (P, p)
    with sums ``alpha_sum``, over the vocabulary ``columns`` and document ``lengths`` that
    occur: ``alpha_T[c, j] = alpha[j, columns[c]]``, ``log_T = log(alpha_T)`` and
    ``rising[r, j] = _log_rising(alpha_sum[j], lengths[r])``, every value computed as
    :func:`_dirichlet_row` computes it. ``log_T`` is returned as the joint table
    ``[coef_T[columns[c]], log_T[c]]`` of :func:`_joint_row_T` (the live coefficients ``coef_T``
    (p, K) first; with K = 0 it is ``log_T`` itself)."""
    P = alpha.shape[0]
    C = columns.shape[0]
    K = coef_T.shape[1]
    alpha_T = np.empty((C, P))
    joint_T = np.empty((C, K + P))
    for c in range(C):
        w = columns[c]
        for j in range(P):
            alpha_T[c, j] = alpha[j, w]
        live = coef_T[w]
        for k in range(K):
            joint_T[c, k] = live[k]
        log_many_nb(alpha_T[c], P, joint_T[c, K:])  # elementwise: the values of one call over all
    rising = np.empty((lengths.shape[0], P))
    for r in range(lengths.shape[0]):
        for j in range(P):
            rising[r, j] = _log_rising(alpha_sum[j], float(lengths[r]))
    return alpha_T, joint_T, rising


@njit(cache=True, nogil=True)
def _dirichlet_term(x, c, row, K, alpha_T, out, work):
    """Add one non-zero's terms ``_log_rising(alpha_jw, x)`` to ``out``, as :func:`_dirichlet_row`
    adds them term by term: ``row[K:]`` is term ``w``'s ``log alpha`` row (its row ``c`` of the
    tables). Counts of two to eight sum their logarithms with the placeholders side by side
    (``a + m >= 1`` is in the logarithm's core for a finite ``a > 0``, as Dirichlet parameters
    are); ``work`` is work space of ``out``'s length."""
    P = out.shape[0]
    if x == 0.0:
        return  # a stored zero: its term is 0, as _log_rising(a, 0) gives
    la = row[K:]
    if x == 1.0:
        for j in range(P):
            out[j] += la[j]
    elif x <= 8.0 and x == math.floor(x):
        a = alpha_T[c]
        for j in range(P):
            work[j] = la[j]
        for m in range(1, int(x)):
            for j in range(P):
                work[j] += log_core(a[j] + m)
        for j in range(P):
            out[j] += work[j]
    else:
        a = alpha_T[c]
        for j in range(P):
            out[j] += _log_rising(a[j], x)


@njit(cache=True, nogil=True)
def _joint_row_T(indptr, indices, data, i, joint_T, K, alpha_T, rising, column_of, length_of, alpha_sum, scores,
                 out, work):
    """:func:`_csr_row_scores` into ``scores`` and :func:`_dirichlet_row` into ``out`` for CSR
    row ``i``, from the tables of :func:`dirichlet_tables` (given ``coef_T``): a non-zero's live
    coefficients and placeholder logarithms are one contiguous row of the joint table, so each
    non-zero reads one row. ``column_of[w]`` is term ``w``'s row in ``alpha_T`` and
    ``joint_T``; ``length_of[n]`` the row of length ``n`` in ``rising`` (-1: not tabled); with
    ``K = 0`` it is the placeholders' scores alone. Four non-zeros at a time, as
    :func:`_csr_row_scores` takes them (four counts of one go to the placeholders together);
    every sum keeps its terms and their order, so the values are those of the two kernels."""
    P = out.shape[0]
    total = 0.0
    for q in range(indptr[i], indptr[i + 1]):
        total += data[q]
    n = int(total) if total < length_of.shape[0] else -1
    r = length_of[n] if n >= 0 and n == total else -1
    if r >= 0:
        row = rising[r]
        for j in range(P):
            out[j] = -row[j]
    else:
        for j in range(P):
            out[j] = -_log_rising(alpha_sum[j], total)
    scores[:] = 0.0
    q, stop = indptr[i], indptr[i + 1]
    while q + 4 <= stop:
        x0, x1, x2, x3 = data[q], data[q + 1], data[q + 2], data[q + 3]
        c0, c1 = column_of[indices[q]], column_of[indices[q + 1]]
        c2, c3 = column_of[indices[q + 2]], column_of[indices[q + 3]]
        r0, r1, r2, r3 = joint_T[c0], joint_T[c1], joint_T[c2], joint_T[c3]
        _add_four(scores, K, x0, x1, x2, x3, r0, r1, r2, r3)
        if x0 == 1.0 and x1 == 1.0 and x2 == 1.0 and x3 == 1.0:  # the common case in sparse text
            l0, l1, l2, l3 = r0[K:], r1[K:], r2[K:], r3[K:]  # indexed from 0: the loop vectorises
            for j in range(P):
                s = out[j]
                s += l0[j]
                s += l1[j]
                s += l2[j]
                s += l3[j]
                out[j] = s
        else:
            _dirichlet_term(x0, c0, r0, K, alpha_T, out, work)
            _dirichlet_term(x1, c1, r1, K, alpha_T, out, work)
            _dirichlet_term(x2, c2, r2, K, alpha_T, out, work)
            _dirichlet_term(x3, c3, r3, K, alpha_T, out, work)
        q += 4
    while q < stop:
        x = data[q]
        c = column_of[indices[q]]
        row = joint_T[c]
        for k in range(K):
            scores[k] += x * row[k]
        _dirichlet_term(x, c, row, K, alpha_T, out, work)
        q += 1


#: longest document (in tokens) whose Dirichlet-multinomial normaliser is read from a table
_RISING_TABLE_MAX = 1 << 14


def dirichlet_tables(alpha: np.ndarray, alpha_sum: np.ndarray, X: sp.csr_matrix,
                     coef_T: np.ndarray | None = None) -> tuple:
    """The tables :func:`_joint_row_T` reads for the Dirichlet rows ``alpha`` (P, p) with
    sums ``alpha_sum`` and the count rows ``X``, over the terms and the document lengths that
    occur in ``X`` only: O(P x (terms + lengths)) to build, once per sweep and shard, where the
    per-row work they save is O(P x non-zeros) scattered reads and logs. Their memory is two
    (terms x P) arrays and one (lengths x P) array of doubles.

    With the live coefficients ``coef_T`` (p, K) the second table is the joint table of
    :func:`_joint_row_T`, (terms x (K + P)): each term's row of ``coef_T`` and then its
    ``log alpha`` row (K more columns of memory)."""
    columns, column_of, lengths, length_of = _count_structure(X, alpha.shape[1])
    coef_T = np.zeros((alpha.shape[1], 0)) if coef_T is None else np.ascontiguousarray(coef_T, dtype=np.float64)
    alpha_T, log_T, rising = _dirichlet_tables_nb(np.ascontiguousarray(alpha, dtype=np.float64),
                                                  np.ascontiguousarray(alpha_sum, dtype=np.float64), columns, lengths,
                                                  coef_T)
    return alpha_T, log_T, rising, column_of, length_of


#: parts of :func:`_count_structure` by the identity of the arrays they depend on (held by
#: weak references, so an entry never outlives its arrays or answers for others): the terms
#: depend on the pattern alone, which stays while redrawn counts replace the values every sweep
_TERMS: dict[int, tuple] = {}
_LENGTHS: dict[int, tuple] = {}


def _remembered(cache: dict[int, tuple], arrays: tuple, extra, compute) -> tuple:
    """``compute()`` for ``arrays`` (and ``extra``), kept in ``cache`` by the identity of
    ``arrays[-1]`` while all of ``arrays`` are alive and unchanged in identity."""
    hit = cache.get(id(arrays[-1]))
    if hit is not None and hit[0] == extra and all(ref() is a for ref, a in zip(hit[1], arrays)):
        return hit[2]
    out = compute()
    for key in [k for k, v in cache.items() if any(ref() is None for ref in v[1])]:
        del cache[key]  # arrays that are gone
    cache[id(arrays[-1])] = (extra, tuple(weakref.ref(a) for a in arrays), out)
    return out


def _count_structure(X: sp.csr_matrix, p: int) -> tuple:
    """The terms that occur in ``X`` (ascending) with each term's place among them (-1 if
    absent), and the whole document lengths up to ``_RISING_TABLE_MAX`` that occur with each
    length's place. They depend on ``X`` alone, and a sweep's shard is the same matrix every
    sweep of an epoch (its arrays are never changed in place while it is loaded; redrawn
    counts come as a new values array, which changes the lengths only), so each part is
    computed once per array it reads."""

    def terms() -> tuple:
        columns = np.unique(X.indices).astype(np.int64)
        column_of = np.full(p, -1, dtype=np.int64)
        column_of[columns] = np.arange(columns.size)
        return columns, column_of

    def lengths() -> tuple:
        totals = row_sums(X)
        whole = totals[(totals == np.floor(totals)) & (totals >= 0) & (totals <= _RISING_TABLE_MAX)]
        found = np.unique(whole).astype(np.int64)
        length_of = np.full(int(found.max()) + 1 if found.size else 0, -1, dtype=np.int64)
        length_of[found] = np.arange(found.size)
        return found, length_of

    return (_remembered(_TERMS, (X.indices,), p, terms)
            + _remembered(_LENGTHS, (X.indptr, X.data), None, lengths))


@njit(cache=True, nogil=True)
def _dirichlet_block(indptr, indices, data, alpha, alpha_sum, out):
    """out[i] = :func:`_dirichlet_row` of row i, for every row."""
    for i in range(indptr.shape[0] - 1):
        _dirichlet_row(indptr, indices, data, i, alpha, alpha_sum, out[i])


def dirichlet_placeholder_scores(X, alpha: np.ndarray, alpha_sum: np.ndarray) -> np.ndarray:
    """Dirichlet-multinomial log marginal of each CSR count row under each placeholder's
    Dirichlet ``alpha[j]`` (``alpha_sum[j] = sum(alpha[j])``), without the multinomial
    coefficient: shape (n, P)."""
    X = sp.csr_matrix(X)
    out = np.empty((X.shape[0], alpha.shape[0]))
    _dirichlet_block(X.indptr.astype(np.int64), X.indices.astype(np.int64), np.asarray(X.data, np.float64),
                     np.ascontiguousarray(alpha, np.float64), np.ascontiguousarray(alpha_sum, np.float64), out)
    return out


def _csr_row_reduce(X: sp.csr_matrix, values: np.ndarray) -> np.ndarray:
    """Per-row sums of ``values`` (one per stored entry of CSR ``X``, exactly ``nnz`` of them),
    added as SciPy adds a CSR matrix's rows (``np.add.reduceat`` over each row's run: the same
    values; only a row summing to -0.0 keeps its sign, where SciPy's is +0.0), without SciPy's
    per-call overhead (0.1 ms for a squared norm: a few percent of a tiny epoch's sweep)."""
    out = np.zeros(X.shape[0], dtype=values.dtype)
    starts = X.indptr[:-1]
    filled = np.flatnonzero(X.indptr[1:] > starts)
    if filled.size:
        out[filled] = np.add.reduceat(values, starts[filled])
    return out


def _reducible(X) -> bool:
    """Whether :func:`_csr_row_reduce` gives SciPy's row sums of ``X``: float64 CSR whose data
    array holds exactly its ``nnz`` entries (SciPy folds a longer array's tail into the last row)."""
    return X.format == "csr" and X.dtype == np.float64 and X.data.shape[0] == X.indptr[-1]


def row_sums(X) -> np.ndarray:
    """The sum of each row of a sparse matrix (``X.sum(axis=1)`` flattened, the same values;
    float64 CSR input takes :func:`_csr_row_reduce`)."""
    if not _reducible(X):
        return np.asarray(X.sum(axis=1)).ravel()
    return _csr_row_reduce(X, X.data)


def rows_by_node(node_of_row: np.ndarray) -> np.ndarray:
    """The rows in the order of their node (stable; rows without one, ``-1``, first), for kernels
    that read each row's node's parameter row at the row's terms: in this order a node's row is
    read from cache by all its documents in turn, where in storage order every row's reads go to
    memory (a K x V matrix of doubles at V = 20,000 and K ~ 200 is 32 MB). The results are the
    same, row by row."""
    return np.argsort(np.asarray(node_of_row), kind="stable").astype(np.int64, copy=False)


def row_sq_norms(X) -> np.ndarray:
    """||x_n||^2 per row for dense or CSR input (for CSR, the values of
    ``X.multiply(X).sum(axis=1)``)."""
    if sp.issparse(X):
        if not (_reducible(X) and X.has_canonical_format):  # duplicates add before squaring
            return np.asarray(X.multiply(X).sum(axis=1)).ravel()
        return _csr_row_reduce(X, X.data * X.data)
    return np.einsum("ij,ij->i", X, X)


def as_csr(X) -> sp.csr_matrix | sp.csr_array:
    """``X`` itself when it is a CSR matrix or array (not a new object around its arrays, which
    costs as much as a tiny epoch's kernel call), else ``X`` converted to a CSR matrix."""
    return X if sp.issparse(X) and X.format == "csr" else sp.csr_matrix(X)


@njit(cache=True, nogil=True)
def _all_near_one(values, tol) -> bool:
    for v in values:
        if not abs(v - 1.0) <= tol:  # NaN is not near one either
            return False
    return True


def row_weights_are_unit(sq_norms) -> bool:
    """Whether rows of these squared norms are unit rows (vMF documents of weight 1); stops at
    the first row that is not (weighted rows are asked this for every row block they score)."""
    return sq_norms is None or bool(_all_near_one(np.ascontiguousarray(sq_norms, dtype=np.float64).ravel(),
                                                  WEIGHT_TOL))


def row_chunks(n_rows: int, n_chunks: int) -> np.ndarray:
    """Boundaries of ``n_chunks`` contiguous, near-equal row ranges (fewer if rows are few)."""
    n_chunks = max(1, min(int(n_chunks), n_rows))
    if n_chunks == 1:  # one thread: the common case, without linspace's overhead
        return np.array([0, n_rows], dtype=np.int64)
    return np.linspace(0, n_rows, n_chunks + 1).round().astype(np.int64)


def score_rows(X, cand: Candidates, u: np.ndarray | None, sqnorm: np.ndarray | None = None,
               block_rows: int = _BLOCK_ROWS, pool: Executor | None = None, n_threads: int = 1,
               order: np.ndarray | None = None, own: np.ndarray | None = None,
               adjust: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Log normaliser of each row's conditional and, if ``u`` is given, a draw per row.

    Parameters
    ----------
    X : csr_matrix or ndarray, shape (n, p)
    cand : Candidates
    u : ndarray of shape (n,) with uniforms in [0, 1), or None to only score.
    sqnorm : ndarray of shape (n,), optional
        ``||x_n||^2`` (computed when the kernel needs it and it is not given).
    block_rows : int
        Rows per dense score block (dense input only; CSR rows are scored one at a time).
    pool : concurrent.futures.Executor, optional
        Runs ``n_threads`` contiguous row ranges at once; the kernels release the GIL. Every
        row's result depends only on that row and its uniform, so the output is the same for
        any number of threads.
    n_threads : int
        Number of row ranges handed to ``pool``.
    order : ndarray of int64, shape (n,), optional
        The order in which CSR rows are scored (a permutation of ``range(n)``; default: as
        stored). It changes the speed, never the result: rows that share terms, such as the
        rows of one node, read the same coefficient rows while those are still in cache, which
        made the product of a 50,000 x 20,000 corpus at K = 276 a third faster when rows were
        taken by their previous node. Ignored for dense input.
    own, adjust : ndarray of shape (n,), optional
        A live column per row (int64, -1: none) and a log weight added to that column alone
        (:meth:`Likelihood.own_node_adjustment`: the row's own node scored without the row).

    Returns
    -------
    labels : ndarray of int64, shape (n,)
        Candidate column per row (live ``0..K-1``, placeholders ``K..K+P-1``); -1 when scoring only.
    lognorm : ndarray, shape (n,)
        ``log sum_c exp(weight_c)``: the log predictive density of the row when the weights are
        log mass plus log likelihood.
    """
    n = X.shape[0]
    if sqnorm is None:
        sqnorm = row_sq_norms(X) if cand.kind in (LINEAR, VMF) else np.zeros(n)
    sqnorm = np.ascontiguousarray(sqnorm, dtype=np.float64)
    own = np.full(n, -1, dtype=np.int64) if own is None else np.ascontiguousarray(own, dtype=np.int64)
    adjust = np.zeros(n) if adjust is None else np.ascontiguousarray(adjust, dtype=np.float64)
    if own.shape != (n,) or adjust.shape != (n,):
        raise ValueError(f"own and adjust need one entry per row ({n}), got {own.shape} and {adjust.shape}")
    if cand.kind == VMF and n and not row_weights_are_unit(sqnorm):  # weighted documents
        return _weighted_vmf_rows(X, cand, u, sqnorm, own, adjust, pool, n_threads)
    labels = np.full(n, -1, dtype=np.int64)
    lognorm = np.empty(n)
    sample = u is not None
    uu = np.ascontiguousarray(u, dtype=np.float64) if sample else np.zeros(0)
    coef_T = np.ascontiguousarray(cand.coef_T, dtype=np.float64)
    reached = cand.kind == VMF and cand.ph_table is None  # the table is built here, for these rows
    table = cand.ph_table if cand.ph_table is not None else np.zeros((0, 2, 2))

    def head(table: np.ndarray) -> tuple:
        return (cand.live_a, cand.live_b, cand.live_c, cand.ph_parent, cand.ph_a, cand.ph_b, cand.ph_c, table)

    no_ph_scores = np.zeros((0, 0))
    if sp.issparse(X):
        if X.format != "csr":  # a CSR shard is read as it is: no copy, and its tables' structure is kept
            X = sp.csr_matrix(X)
        if order is None:
            order = np.arange(n, dtype=np.int64)
        order = np.ascontiguousarray(order, dtype=np.int64)
        indptr = X.indptr.astype(np.int64, copy=False)
        indices = X.indices.astype(np.int64, copy=False)
        data = np.asarray(X.data, dtype=np.float64)
        dirichlet = cand.kind == DIRICHLET and cand.n_placeholders
        dm = (dirichlet_tables(cand.ph_alpha, cand.ph_b, X, coef_T) if dirichlet
              else (np.zeros((0, 0)), np.zeros((0, 0)), np.zeros((0, 0)), np.zeros(0, dtype=np.int64),
                    np.zeros(0, dtype=np.int64)))
        if reached and cand.n_placeholders:
            # The product first (stored by blocks of rows), then only the table knots that
            # bound the intervals these rows' parent scores fall in, then the draws from the stored scores: the same
            # values and draws as the fused kernel with a full table.
            K = coef_T.shape[1]
            ph_parent = np.asarray(cand.ph_parent, dtype=np.int64)
            step = max(1, _SCORE_BLOCK_ENTRIES // max(K, 1))
            have = None
            # the draws run in scoring order on gathered inputs and are put back in row order
            u_o = uu[order] if sample else uu
            sq_o = sqnorm[order]
            own_o, adj_o = own[order], adjust[order]
            labels_o = np.empty(n, dtype=np.int64)
            lognorm_o = np.empty(n)
            for b0 in range(0, n, step):
                b1 = min(n, b0 + step)
                scores = np.empty((b1 - b0, K))
                touched: list[np.ndarray] = []

                def product(a: int, b: int) -> None:
                    mine = np.zeros((ph_parent.shape[0], TABLE_INTERVALS), dtype=np.bool_)
                    _csr_scores(indptr, indices, data, order, b0 + a, b0 + b, coef_T, ph_parent, scores[a:b], mine)
                    touched.append(mine)

                _in_row_ranges(pool, n_threads, b1 - b0, 1, product)
                have = _reached_table(cand, interval_knots(np.logical_or.reduce(touched)), have)
                cols = head(have[0])
                _in_row_ranges(pool, n_threads, b1 - b0, 1, lambda a, b: _sample_block(
                    scores[a:b], sq_o[b0 + a:b0 + b], *cols, no_ph_scores, cand.kind,
                    u_o[b0 + a:b0 + b] if sample else uu, labels_o[b0 + a:b0 + b], lognorm_o[b0 + a:b0 + b],
                    sample, own_o[b0 + a:b0 + b], adj_o[b0 + a:b0 + b]))
            if sample:
                labels[order] = labels_o
            lognorm[order] = lognorm_o
            return labels, lognorm

        def run(start: int, stop: int) -> None:
            _sample_csr(indptr, indices, data, order, start, stop, coef_T, sqnorm, *head(table), dm, cand.kind,
                        uu, labels, lognorm, sample, own, adjust)
    else:
        if reached and cand.n_placeholders and n:
            # knots widened by one each side: the blocks' BLAS products may round differently
            parent_scores = np.asarray(X @ coef_T[:, cand.ph_parent])
            table = _reached_table(cand, range_knots(parent_scores.min(axis=0), parent_scores.max(axis=0)),
                                   None)[0]

        def run(start: int, stop: int) -> None:
            for b0 in range(start, stop, block_rows):
                b1 = min(b0 + block_rows, stop)
                scores = np.ascontiguousarray(X[b0:b1] @ coef_T, dtype=np.float64)
                ph_scores = no_ph_scores
                if cand.kind == DIRICHLET:
                    ph_scores = dirichlet_placeholder_scores(X[b0:b1], cand.ph_alpha, cand.ph_b)
                _sample_block(scores, sqnorm[b0:b1], *head(table), ph_scores, cand.kind,
                              uu[b0:b1] if sample else uu, labels[b0:b1], lognorm[b0:b1], sample, own[b0:b1],
                              adjust[b0:b1])

    # Dense blocks keep fixed boundaries (multiples of block_rows) whatever the thread count:
    # a BLAS product's rounding may depend on the block's shape. CSR rows are independent.
    _in_row_ranges(pool, n_threads, n, 1 if sp.issparse(X) else block_rows, run)
    return labels, lognorm


def _weighted_vmf_rows(X, cand: Candidates, u, sqnorm, own, adjust, pool: Executor | None = None,
                       n_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """:func:`score_rows` for VMF rows of norm ``w`` (a unit direction ``x`` times a weight): at
    a live node ``log C_p(beta w) + beta theta . (w x)``, at a new child of a node of direction
    ``mu`` ``log C_p(b w) + log C_p(c) - log C_p(||b w x + c mu||)`` (the collapsed marginal of
    a document of concentration ``b w``). The normalisers of ``beta w`` and ``b w`` are taken
    once per distinct weight, those of ``||b w x + c mu||`` once per row and column, all in
    compiled code (:func:`~streamtree.likelihoods.vmf.sample_weighted_rows`), on row ranges of
    ``pool`` (a row's result does not depend on the others, so the same values on any engine
    and thread count); unit rows keep the unit kernel. A draw takes the first column whose
    running sum of weights passes ``u`` times their total."""
    from streamtree.likelihoods.vmf import normalizer_change, sample_weighted_rows  # builds on this module

    X = X if sp.issparse(X) and X.format == "csr" else sp.csr_matrix(X)
    n = X.shape[0]
    weight = np.sqrt(sqnorm)
    live_b = np.ascontiguousarray(cand.live_b, dtype=np.float64)
    ph_b = np.ascontiguousarray(cand.ph_b, dtype=np.float64)
    live_a = np.ascontiguousarray(cand.live_a, dtype=np.float64)
    ph_parent = np.ascontiguousarray(cand.ph_parent, dtype=np.int64)
    ph_a = np.ascontiguousarray(cand.ph_a, dtype=np.float64)
    ph_c = np.ascontiguousarray(cand.ph_c, dtype=np.float64)

    def change(distinct: np.ndarray, conc: np.ndarray) -> np.ndarray:
        """The normalisers' change per distinct weight (zeros for unnormalised columns)."""
        if not cand.normalized or conc.size == 0:
            return np.zeros((distinct.size, conc.size))
        return normalizer_change(cand.dim, conc, distinct)

    labels = np.full(n, -1, dtype=np.int64)
    lognorm = np.empty(n)
    sample = u is not None
    uu = np.ascontiguousarray(u, dtype=np.float64) if sample else np.zeros(0)
    indptr = X.indptr.astype(np.int64, copy=False)
    indices = X.indices.astype(np.int64, copy=False)
    data = np.asarray(X.data, dtype=np.float64)
    coef_T = np.ascontiguousarray(cand.coef_T, dtype=np.float64)
    weight_at = np.empty(n, dtype=np.int64)  # each row's distinct weight within its block
    # One block with tables over the shard's distinct weights (text has a few hundred to a few
    # thousand); blocks of rows where there are more, so that the tables stay within bounds.
    columns = max(live_b.size + ph_b.size, 1)
    block = n if np.unique(weight).size * columns <= _WEIGHT_TABLE_ENTRIES else max(1, _WEIGHT_TABLE_ENTRIES // columns)
    for r0 in range(0, n, block):
        r1 = min(n, r0 + block)
        distinct, at = np.unique(weight[r0:r1], return_inverse=True)
        weight_at[r0:r1] = at.reshape(-1)
        live_change, ph_change = change(distinct, live_b), change(distinct, ph_b)

        def run(start: int, stop: int, r0=r0, live_change=live_change, ph_change=ph_change) -> None:
            sample_weighted_rows(indptr, indices, data, r0 + start, r0 + stop, coef_T, weight, weight_at, live_a,
                                 live_b, live_change, ph_parent, ph_a, ph_b, ph_c, ph_change, float(cand.dim), uu,
                                 labels, lognorm, sample, own, adjust)

        _in_row_ranges(pool, n_threads, r1 - r0, 1, run)
    return labels, lognorm


def _in_row_ranges(pool: Executor | None, n_threads: int, n: int, unit: int, run) -> None:
    """``run(start, stop)`` over ``n`` rows: one call, or ``n_threads`` contiguous ranges (at
    multiples of ``unit`` rows) on ``pool``."""
    n_units = -(-n // unit) if n else 0
    bounds = np.minimum(row_chunks(n_units, n_threads if pool is not None else 1) * unit, n)
    if pool is None or bounds.shape[0] <= 2:
        if n:
            run(0, n)
    else:
        run_ranges(pool, bounds, run)  # in one call where the rows are too few for the threads


@njit(cache=True, nogil=True)
def _scatter_rows(out, pos, indptr, indices, data):
    """out[pos[r], indices[q]] += data[q] for the non-zeros q of CSR row r."""
    for r in range(pos.shape[0]):
        o = out[pos[r]]
        for q in range(indptr[r], indptr[r + 1]):
            o[indices[q]] += data[q]


class SweepStats:
    """Sufficient statistics of one sweep over some rows, by candidate column.

    ``row_sums`` holds the summed document vectors only for the columns in ``occupied`` (rows
    follow ``occupied``): a CSR matrix for sparse documents, which is what a shard sends back
    (its non-zeros are at most the shard's), or a dense array; :attr:`sums` is its dense
    form. ``sumsq`` is the summed ``||x||^2`` per column.
    """

    def __init__(self, counts: np.ndarray, occupied: np.ndarray, row_sums, sumsq: np.ndarray, loglik: float) -> None:
        self.counts = counts
        self.occupied = occupied
        self.row_sums = row_sums
        self.sumsq = sumsq
        self.loglik = loglik
        self._dense: np.ndarray | None = None

    @property
    def sums(self) -> np.ndarray:
        """Dense ``(len(occupied), p)`` per-column sums of the rows."""
        if self._dense is None:
            rs = self.row_sums
            self._dense = np.asarray(rs.toarray()) if sp.issparse(rs) else np.asarray(rs)
        return self._dense

    def __getstate__(self) -> dict:
        # only the compact form travels between processes
        return {k: v for k, v in self.__dict__.items() if k != "_dense"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._dense = None

    def nbytes(self) -> int:
        """Bytes of the arrays this object holds (what a shard sends back, before pickling)."""
        total = 0
        for v in (self.counts, self.occupied, self.row_sums, self.sumsq):
            if sp.issparse(v):
                total += v.data.nbytes + v.indices.nbytes + v.indptr.nbytes
            else:
                total += np.asarray(v).nbytes
        return total

    @staticmethod
    def combine(parts: list["SweepStats"]) -> "SweepStats":
        """Sum shard statistics in shard order (fixed order keeps results bit-identical)."""
        counts = parts[0].counts.copy()
        for p in parts[1:]:
            counts += p.counts
        occupied = np.flatnonzero(counts)
        where = np.full(counts.shape[0], -1, dtype=np.int64)
        where[occupied] = np.arange(occupied.shape[0])
        dim = parts[0].row_sums.shape[1]
        single_dense = len(parts) == 1 and not sp.issparse(parts[0].row_sums)
        # one dense part is in column order already: taken as it is (zero plus each value, as
        # the loop below would add it, is the value)
        sums = np.asarray(parts[0].row_sums) if single_dense else np.zeros((occupied.shape[0], dim))
        for part in parts[1 if single_dense else 0:]:
            pos = where[part.occupied]
            rs = part.row_sums
            if sp.issparse(rs):
                rs = sp.csr_matrix(rs)
                _scatter_rows(sums, pos, rs.indptr.astype(np.int64), rs.indices.astype(np.int64),
                              np.asarray(rs.data, dtype=np.float64))
            else:
                sums[pos] += rs
        sumsq = parts[0].sumsq.copy()
        for p in parts[1:]:
            sumsq += p.sumsq
        loglik = parts[0].loglik if len(parts) == 1 else sum(p.loglik for p in parts)
        return SweepStats(counts, occupied, sums, sumsq, float(loglik))


@njit(cache=True, nogil=True)
def _dense_column_sums(indptr, indices, data, rows, bounds, c0, c1, out):
    """``out[c] += x_r`` for the CSR rows ``r`` in ``rows[bounds[c]:bounds[c + 1]]``, columns
    ``c0..c1``, taken in that order: each entry adds its rows' values one by one from zero in
    row order, exactly as SciPy's product of the indicator matrix with the rows does."""
    for c in range(c0, c1):
        o = out[c]
        for b in range(bounds[c], bounds[c + 1]):
            r = rows[b]
            for q in range(indptr[r], indptr[r + 1]):
                o[indices[q]] += data[q]


def dense_column_sums(X, labels: np.ndarray, counts: np.ndarray, occupied: np.ndarray,
                      pool: Executor | None = None, n_threads: int = 1) -> np.ndarray:
    """Dense ``(len(occupied), p)`` sums of the CSR rows of ``X`` by their column ``labels``,
    equal bit for bit to :func:`sweep_statistics`' sparse sums made dense. With ``pool``, the
    columns are split into ``n_threads`` ranges of about equal rows, each column summed by one
    thread in row order (the same result for any thread count)."""
    X = as_csr(X)
    rows = np.argsort(labels, kind="stable").astype(np.int64, copy=False)  # by column, then row
    bounds = np.zeros(occupied.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts[occupied], out=bounds[1:])
    out = np.zeros((occupied.shape[0], X.shape[1]))
    indptr = X.indptr.astype(np.int64, copy=False)
    indices = X.indices.astype(np.int64, copy=False)
    data = np.asarray(X.data, dtype=np.float64)
    cuts = np.searchsorted(bounds, row_chunks(int(bounds[-1]), n_threads if pool is not None else 1))
    cuts[-1] = occupied.shape[0]
    cuts = np.unique(cuts)  # no empty ranges
    if pool is None or cuts.shape[0] <= 2:
        _dense_column_sums(indptr, indices, data, rows, bounds, 0, occupied.shape[0], out)
    else:
        run_ranges(pool, cuts, lambda a, b: _dense_column_sums(indptr, indices, data, rows, bounds, a, b, out))
    return out


def sweep_statistics(X, labels: np.ndarray, n_columns: int, sqnorm: np.ndarray, loglik: float,
                     dense_sums: bool = False, pool: Executor | None = None, n_threads: int = 1) -> SweepStats:
    """Counts and per-column sums of rows and of squared norms for one block of rows.

    Sums stay sparse for sparse ``X`` (what a shard sends) unless ``dense_sums``: then the
    CSR rows are summed straight into the dense matrix the coordinator uses, the same values
    without the sparse product and its densification (on ``pool``'s threads, as
    :func:`dense_column_sums`).
    """
    n = X.shape[0]
    counts = np.bincount(labels, minlength=n_columns).astype(np.int64)
    occupied = np.flatnonzero(counts)
    if n == 0:
        empty = sp.csr_matrix((0, X.shape[1])) if sp.issparse(X) else np.zeros((0, X.shape[1]))
        return SweepStats(counts, occupied, empty, np.zeros(n_columns), loglik)
    if dense_sums and sp.issparse(X):
        sums = dense_column_sums(X, labels, counts, occupied, pool, n_threads)
    else:
        Z = sp.csr_matrix((np.ones(n), (labels, np.arange(n))), shape=(n_columns, n))
        sums = Z[occupied] @ X
        sums = sp.csr_matrix(sums) if sp.issparse(sums) else np.asarray(sums)
    sumsq = np.bincount(labels, weights=sqnorm, minlength=n_columns)
    return SweepStats(counts, occupied, sums, sumsq, loglik)


def node_order(labels: np.ndarray) -> np.ndarray:
    """A scoring order for :func:`score_rows`: the rows grouped by the column each was drawn
    in last sweep (stably), so that rows of one node, which share most of their terms, are
    scored one after another."""
    return np.argsort(labels, kind="stable").astype(np.int64, copy=False)


def sweep_rows(X, cand: Candidates, rng: np.random.Generator, sqnorm: np.ndarray | None = None,
               pool: Executor | None = None, n_threads: int = 1, order: np.ndarray | None = None,
               dense_sums: bool = False, own: np.ndarray | None = None,
               adjust: np.ndarray | None = None) -> tuple[np.ndarray, SweepStats]:
    """One z-update over a block of rows with its own random stream (``pool``/``n_threads``/
    ``order``: see :func:`score_rows`; they change the speed, never the result;
    ``dense_sums``: see :func:`sweep_statistics`; ``own``/``adjust``: see :func:`score_rows`)."""
    if sqnorm is None:
        sqnorm = row_sq_norms(X)
    u = rng.random(X.shape[0])
    # one more uniform per row: it drew each column's seed document for the node proposals that
    # the split-merge moves replaced; still drawn, unused, so that seeded runs keep their streams
    # and so their trees
    rng.random(X.shape[0])
    labels, lognorm = score_rows(X, cand, u, sqnorm, pool=pool, n_threads=n_threads, order=order, own=own,
                                 adjust=adjust)
    return labels, sweep_statistics(X, labels, cand.n_columns, sqnorm, float(lognorm.sum()),
                                    dense_sums=dense_sums, pool=pool, n_threads=n_threads)
