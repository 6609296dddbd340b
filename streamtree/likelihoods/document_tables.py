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

import streamtree  # noqa: F401  (configures the numba cache directory)
import numpy as np
import scipy.sparse as sp
from numba import njit
from scipy.special import gammaln

from streamtree.inference.hyper import slice_step
from streamtree.likelihoods.base import argmax_log_scale

#: support of the document concentration's log-uniform prior
CONCENTRATION_RANGE = (1e-2, 1e7)
#: slice steps on ``log s`` per sweep
CONCENTRATION_STEPS = 2


@njit(cache=True, nogil=True)
def _tables_nb(indptr, indices, data, node_of_row, theta, s, u, out):
    """Table counts of the non-zeros of a CSR count matrix, customer by customer: the ``i``-th
    repeat (``i >= 1``) of word ``w`` opens a table with probability ``a / (a + i)``,
    ``a = s theta[node_of_row[r], w]``; ``u`` holds one uniform per repeat, in storage order."""
    pos = 0
    for r in range(indptr.shape[0] - 1):
        row = theta[node_of_row[r]]
        for k in range(indptr[r], indptr[r + 1]):
            x = int(data[k])
            if x == 0:  # a stored zero: no customers, no tables
                out[k] = 0.0
                continue
            a = s * row[indices[k]]
            t = 1  # the first customer always opens a table
            for i in range(1, x):
                if u[pos] * (a + i) < a:
                    t += 1
                pos += 1
            out[k] = t
    return pos


def draw_tables(X: sp.csr_matrix, theta: np.ndarray, node_of_row: np.ndarray, s: float,
                rng: np.random.Generator) -> sp.csr_matrix:
    """Table counts ``T ~ Antoniak(X, s theta[node_of_row])``, entry by entry, as a CSR matrix
    sharing ``X``'s sparsity pattern (its ``indptr`` and ``indices`` arrays, a new ``data``).

    ``X`` holds integer counts; ``theta`` rows are strictly positive word distributions and
    ``node_of_row[r]`` the row of ``theta`` that document ``r``'s node has. Entries equal to 1
    always give one table and use no random number; stored zeros give none."""
    data = np.asarray(X.data, dtype=np.float64)
    n_uniforms = int(np.sum(np.maximum(data - 1.0, 0.0)))
    u = rng.random(n_uniforms)
    out = np.empty_like(data)
    used = _tables_nb(X.indptr.astype(np.int64, copy=False), X.indices.astype(np.int64, copy=False), data,
                      np.ascontiguousarray(node_of_row, dtype=np.int64), np.ascontiguousarray(theta, np.float64),
                      float(s), u, out)
    assert used == n_uniforms
    return sp.csr_matrix((out, X.indices, X.indptr), shape=X.shape)


def log_concentration_density(s: float, tables: float, lengths: np.ndarray, weights: np.ndarray) -> float:
    """``log p(T | s)`` up to a constant, ``sum_d [T_d log s + lgamma(s) - lgamma(s + n_d)]``,
    with the documents grouped by length: ``lengths`` the distinct ``n_d``, ``weights`` how
    many documents have each, ``tables`` the total table count ``sum_d T_d``."""
    return float(tables * np.log(s) + np.sum(weights * (gammaln(s) - gammaln(s + lengths))))


def length_groups(X: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """The distinct document lengths of ``X`` and how many documents have each."""
    lengths, weights = np.unique(np.asarray(X.sum(axis=1)).ravel(), return_counts=True)
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


def polya_concentration(X: sp.csr_matrix, frequencies: np.ndarray) -> float:
    """The Polya maximum-likelihood ``s`` of the documents about ``frequencies``,
    ``argmax_s sum_d log DCM(x_d | s f)``: the chain's starting value (searched on
    :data:`CONCENTRATION_RANGE` on a log scale)."""
    X = sp.csr_matrix(X)
    n_docs = np.asarray(X.sum(axis=1)).ravel()
    f_nz = np.asarray(frequencies, dtype=np.float64)[X.indices]

    def evidence(s: float) -> float:
        a = s * f_nz
        return float(np.sum(gammaln(s) - gammaln(s + n_docs)) + np.sum(gammaln(a + X.data) - gammaln(a)))

    return argmax_log_scale(evidence, *CONCENTRATION_RANGE)
