"""MAP node parameters by alternating depth-parity blocks.

Within an epoch the dependency graph of the node parameters is the tree itself (plus fixed
links to the previous epoch), which is bipartite by depth parity: given the even-depth nodes the
odd-depth ones are conditionally independent, and vice versa. Each block update is an exact
coordinate maximisation of the joint objective, so alternating the blocks climbs monotonically.

vMF (Markov-network reading of the dTSSBP, pairwise factors exp(kappa theta_i . theta_j)):
the mode of a node's full conditional is the normalised sum of its concentration-weighted
neighbour directions plus beta times its documents' sum.

Gaussian: the full conditional is Gaussian and its mean is the precision-weighted average of the
neighbours and the data.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
from numba import njit

import streamtree  # noqa: F401  (numba cache configuration)

from streamtree.inference.threads import in_row_ranges
from streamtree.tree import TreeArrays


def _child_matrix(arrays: TreeArrays, weight: np.ndarray) -> sp.csr_matrix:
    """K x K matrix with ``weight[c]`` at (parent(c), c): row k sums weighted children of k."""
    K = arrays.size
    c = np.arange(1, K)
    return sp.csr_matrix((weight[1:], (arrays.parent_index[1:], c)), shape=(K, K))


def _parity_blocks(arrays: TreeArrays, update: np.ndarray) -> list[np.ndarray]:
    parity = arrays.depth % 2
    return [np.flatnonzero((parity == q) & update) for q in (0, 1)]


def vmf_objective(arrays, theta, data_sums, beta, prev_theta, has_prev, root_parent, kappa_par, kappa_tim):
    """The joint log objective (up to constants) that :func:`map_theta_vmf` maximises."""
    f = float(np.sum(beta * np.einsum("ij,ij->i", theta, data_sums)))
    pidx = arrays.parent_index
    f += float(np.sum(kappa_par[1:] * np.einsum("ij,ij->i", theta[1:], theta[pidx[1:]])))
    f += float(kappa_par[0] * theta[0] @ root_parent)
    f += float(np.sum(kappa_tim * has_prev * np.einsum("ij,ij->i", theta, prev_theta)))
    return f


def map_theta_vmf(
    arrays: TreeArrays,
    theta: np.ndarray,
    data_sums: np.ndarray,
    beta: np.ndarray,
    prev_theta: np.ndarray,
    has_prev: np.ndarray,
    root_parent: np.ndarray,
    kappa_par: np.ndarray,
    kappa_tim: np.ndarray,
    update: np.ndarray | None = None,
    n_iter: int = 10,
    tol: float = 1e-6,
) -> np.ndarray:
    """Block-coordinate ascent of the vMF node directions.

    Parameters
    ----------
    arrays : TreeArrays
    theta : ndarray (K, p)
        Current unit directions (starting point; not modified).
    data_sums : ndarray (K, p)
        Sum of the documents assigned to each node.
    beta : ndarray (K,)
        Per-node data concentration.
    prev_theta, has_prev : ndarray (K, p), bool ndarray (K,)
        Direction of the same node at the previous epoch, where it existed.
    root_parent : ndarray (p,)
        The root's virtual parent (normalised mean document of the epoch).
    kappa_par, kappa_tim : ndarray (K,)
        Link strengths to the parent and to the previous epoch, per node.
    update : bool ndarray (K,), optional
        Nodes to update (others are fixed but still act as neighbours).

    Returns
    -------
    ndarray (K, p): the updated directions.
    """
    theta = np.array(theta, dtype=np.float64, copy=True)
    K = arrays.size
    update = np.ones(K, dtype=bool) if update is None else np.asarray(update, dtype=bool)
    C = _child_matrix(arrays, kappa_par)
    pidx = np.ascontiguousarray(arrays.parent_index, dtype=np.int64)
    kt = np.ascontiguousarray(kappa_tim * has_prev, dtype=np.float64)
    b = np.ascontiguousarray(beta, dtype=np.float64)
    S = np.ascontiguousarray(data_sums, dtype=np.float64)
    prev = np.ascontiguousarray(prev_theta, dtype=np.float64)
    kp = np.ascontiguousarray(kappa_par, dtype=np.float64)
    anchor = np.ascontiguousarray(root_parent, dtype=np.float64)
    blocks = [b.astype(np.int64) for b in _parity_blocks(arrays, update)]
    c_ptr, c_idx = C.indptr.astype(np.int64), C.indices.astype(np.int64)
    for _ in range(n_iter):
        delta = 0.0
        for rows in blocks:
            if rows.size:
                # one fused pass per row (the rows of a block do not neighbour each other), row
                # ranges on the fitting threads
                delta = max(delta, in_row_ranges(rows.size, lambda a, z, rows=rows: _vmf_block(
                    theta, b, S, kt, prev, rows[a:z], c_ptr, c_idx, C.data, pidx, kp, anchor)))
        if delta < tol:
            break
    return theta


@njit(cache=True, nogil=True)
def _vmf_block(theta, beta, S, kappa_tim, prev, rows, c_ptr, c_idx, c_w, pidx, kappa_par, anchor):
    """theta[r] <- normalise(beta[r] S[r] + kappa_tim[r] prev[r] + sum_c w_c theta[c]
    + kappa_par[r] theta[parent(r)]) for the rows of one parity block, in place (no K x p
    temporaries); returns the largest coordinate change."""
    p = theta.shape[1]
    change = np.zeros(rows.shape[0])
    eta = np.empty(p)
    for i in range(rows.shape[0]):
        r = rows[i]
        br, kt = beta[r], kappa_tim[r]
        s_r, prev_r = S[r], prev[r]
        for j in range(p):
            eta[j] = br * s_r[j] + kt * prev_r[j]
        for q in range(c_ptr[r], c_ptr[r + 1]):
            w = c_w[q]
            child = theta[c_idx[q]]
            for j in range(p):
                eta[j] += w * child[j]
        par = theta[pidx[r]] if pidx[r] >= 0 else anchor
        kp = kappa_par[r]
        sq = 0.0
        for j in range(p):
            eta[j] += kp * par[j]
            sq += eta[j] * eta[j]
        if sq > 0.0:
            inv = 1.0 / math.sqrt(sq)
            m = 0.0
            row = theta[r]
            for j in range(p):
                v = eta[j] * inv
                d = abs(v - row[j])
                if d > m:
                    m = d
                row[j] = v
            change[i] = m
    return change.max() if rows.shape[0] else 0.0


def gaussian_objective(arrays, theta, data_sums, data_sumsq, counts, noise_var, prev_theta, has_prev,
                       var_par, time_coef, time_var):
    """Joint log objective (up to constants) that :func:`map_theta_gaussian` maximises."""
    pidx = arrays.parent_index
    # sum_n ||x_n - theta||^2 = sumsq - 2 theta.s + n ||theta||^2
    sq = data_sumsq - 2 * np.einsum("ij,ij->i", theta, data_sums) + counts * np.einsum("ij,ij->i", theta, theta)
    f = -float(np.sum(sq / (2 * noise_var)))
    d = theta[1:] - theta[pidx[1:]]
    f -= float(np.sum(np.einsum("ij,ij->i", d, d) / (2 * var_par[1:])))
    dt = theta - time_coef[:, None] * prev_theta
    f -= float(np.sum(has_prev * np.einsum("ij,ij->i", dt, dt) / (2 * time_var)))
    return f


def map_theta_gaussian(
    arrays: TreeArrays,
    theta: np.ndarray,
    data_sums: np.ndarray,
    counts: np.ndarray,
    noise_var: np.ndarray,
    prev_theta: np.ndarray,
    has_prev: np.ndarray,
    var_par: np.ndarray,
    time_coef: np.ndarray,
    time_var: np.ndarray,
    update: np.ndarray | None = None,
    n_iter: int = 10,
    tol: float = 1e-8,
) -> np.ndarray:
    """Block-coordinate ascent of Gaussian node means (precision-weighted averages).

    Factors: data ``N(x_n; theta_z, noise_var_z I)``; parent link ``N(theta; theta_pa, var_par I)``
    (not at the root); time link ``N(theta; time_coef * theta_prev, time_var I)`` where a
    predecessor exists. A node whose conditional has zero precision keeps its value.
    """
    theta = np.array(theta, dtype=np.float64, copy=True)
    K = arrays.size
    update = np.ones(K, dtype=bool) if update is None else np.asarray(update, dtype=bool)
    pidx = arrays.parent_index
    inv_par = np.where(pidx >= 0, 1.0 / var_par, 0.0)
    C = _child_matrix(arrays, inv_par)
    child_prec = np.asarray(C.sum(axis=1)).ravel()
    tp = has_prev / time_var
    fixed_num = data_sums / noise_var[:, None] + (tp * time_coef)[:, None] * prev_theta
    prec = counts / noise_var + tp + inv_par + child_prec
    for _ in range(n_iter):
        delta = 0.0
        for rows in _parity_blocks(arrays, update):
            if rows.size == 0:
                continue
            num = fixed_num[rows] + C[rows] @ theta
            pr = pidx[rows]
            has_par = pr >= 0
            num[has_par] += inv_par[rows[has_par], None] * theta[pr[has_par]]
            ok = prec[rows] > 0
            new = theta[rows].copy()
            new[ok] = num[ok] / prec[rows][ok, None]
            delta = max(delta, float(np.max(np.abs(new - theta[rows]))))
            theta[rows] = new
        if delta < tol:
            break
    return theta
