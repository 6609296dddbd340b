"""The MAP parameter step equals a numerical maximiser of the same objective."""

import numpy as np
import pytest
from scipy.optimize import minimize

from streamtree.inference.theta_map import (gaussian_objective, map_theta_gaussian, map_theta_vmf,
                                            vmf_objective)
from streamtree.inference.threads import fitting_threads
from streamtree.likelihoods.vmf import _TABLE_CACHE, new_node_table
from streamtree.tree import TSSBTree


def random_tree(rng, n_nodes, max_depth=3):
    tree = TSSBTree(max_depth)
    ids = [0]
    while len(ids) < n_nodes:
        par = int(rng.choice([i for i in ids if not tree.at_cap(i)]))
        ids.append(tree.add_child(par))
    return tree.arrays()


def unit(v):
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


@pytest.mark.parametrize("seed", range(5))
def test_vmf_map_matches_numerical_maximiser(seed):
    rng = np.random.default_rng(seed)
    K, p = 6, 4
    arrays = random_tree(rng, K)
    theta0 = unit(rng.normal(size=(K, p)))
    sums = np.abs(rng.normal(size=(K, p))) * rng.integers(0, 3, size=(K, 1))
    beta = rng.uniform(1, 5, size=K)
    prev = unit(rng.normal(size=(K, p)))
    has_prev = rng.random(K) < 0.6
    root_parent = unit(rng.normal(size=p))
    kpar = rng.uniform(0.5, 3, size=K)
    ktim = rng.uniform(0.5, 3, size=K)
    args = (arrays, sums, beta, prev, has_prev, root_parent, kpar, ktim)

    ours = map_theta_vmf(arrays, theta0, sums, beta, prev, has_prev, root_parent, kpar, ktim,
                         n_iter=2000, tol=1e-13)
    f_ours = vmf_objective(arrays, ours, *args[1:])
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0)

    def neg(u):
        th = unit(u.reshape(K, p))
        return -vmf_objective(arrays, th, *args[1:])

    best = None
    for start in range(8):
        u0 = (ours if start == 0 else rng.normal(size=(K, p))).ravel()
        res = minimize(neg, u0, method="BFGS", options={"gtol": 1e-10, "maxiter": 5000})
        if best is None or res.fun < best.fun:
            best = res
    f_num = -best.fun
    # coordinate ascent reaches the numerical optimum (and is never beaten by it)
    assert f_ours >= f_num - 1e-7
    assert np.allclose(ours, unit(best.x.reshape(K, p)), atol=1e-4)


def test_vmf_map_is_monotone_and_respects_frozen_nodes():
    rng = np.random.default_rng(11)
    K, p = 8, 5
    arrays = random_tree(rng, K)
    theta = unit(rng.normal(size=(K, p)))
    sums = np.abs(rng.normal(size=(K, p)))
    beta = np.full(K, 2.0)
    prev = unit(rng.normal(size=(K, p)))
    has_prev = np.ones(K, dtype=bool)
    rp = unit(rng.normal(size=p))
    kpar = np.full(K, 1.5)
    ktim = np.full(K, 0.7)
    update = np.ones(K, dtype=bool)
    update[[2, 5]] = False
    last = vmf_objective(arrays, theta, sums, beta, prev, has_prev, rp, kpar, ktim)
    for _ in range(10):
        theta_next = map_theta_vmf(arrays, theta, sums, beta, prev, has_prev, rp, kpar, ktim,
                                   update=update, n_iter=1)
        f = vmf_objective(arrays, theta_next, sums, beta, prev, has_prev, rp, kpar, ktim)
        assert f >= last - 1e-12
        assert np.array_equal(theta_next[[2, 5]], theta[[2, 5]])
        theta, last = theta_next, f


def test_vmf_node_without_data_takes_neighbour_direction():
    tree = TSSBTree(3)
    c = tree.add_child(0)
    arrays = tree.arrays()
    p = 3
    theta = unit(np.array([[1.0, 0, 0], [0, 1.0, 0]]))
    sums = np.array([[0.0, 0, 5.0], [0, 0, 0]])
    out = map_theta_vmf(arrays, theta, sums, np.ones(2), theta, np.zeros(2, bool), np.array([0, 0, 1.0]),
                        np.full(2, 1.0), np.zeros(2), n_iter=50)
    assert np.allclose(out[1], out[0]), "an empty leaf's mode is its parent's direction"
    del c, p


@pytest.mark.usefixtures("threads_always")
def test_vmf_map_and_new_node_table_on_fitting_threads_are_bit_identical():
    """Inside ``fitting_threads(n)`` the block passes and the table fill run on row ranges of
    a thread pool: the same bits as on one thread."""
    rng = np.random.default_rng(21)
    K, p = 40, 300
    arrays = random_tree(rng, K, max_depth=4)
    theta = unit(rng.normal(size=(K, p)))
    sums = np.abs(rng.normal(size=(K, p))) * rng.integers(0, 4, size=(K, 1))
    args = (arrays, theta, sums, rng.uniform(1, 50, size=K), unit(rng.normal(size=(K, p))), rng.random(K) < 0.5,
            unit(rng.normal(size=p)), rng.uniform(1, 30, size=K), rng.uniform(1, 30, size=K))
    b, c = rng.uniform(10, 500, size=9), rng.uniform(100, 1e4, size=9)
    ref = map_theta_vmf(*args, n_iter=5)
    ref_table = new_node_table(p, b, c, 64)
    _TABLE_CACHE.clear()
    for jobs in (2, 3):
        with fitting_threads(jobs):
            assert np.array_equal(map_theta_vmf(*args, n_iter=5), ref)
            assert np.array_equal(new_node_table(p, b, c, 64), ref_table)
        _TABLE_CACHE.clear()


@pytest.mark.parametrize("seed", range(4))
def test_gaussian_map_equals_exact_quadratic_optimum(seed):
    rng = np.random.default_rng(100 + seed)
    K, p = 7, 3
    arrays = random_tree(rng, K)
    counts = rng.integers(0, 4, size=K).astype(float)
    sums = rng.normal(size=(K, p)) * counts[:, None]
    sumsq = np.einsum("ij,ij->i", sums, sums) + counts
    noise = rng.uniform(0.5, 2, size=K)
    prev = rng.normal(size=(K, p))
    has_prev = rng.random(K) < 0.7
    var_par = rng.uniform(0.5, 2, size=K)
    coef = rng.uniform(0, 0.9, size=K)
    tvar = rng.uniform(0.5, 2, size=K)
    ours = map_theta_gaussian(arrays, np.zeros((K, p)), sums, counts, noise, prev, has_prev, var_par, coef,
                              tvar, n_iter=5000, tol=1e-14)

    # the objective is a concave quadratic: solve its normal equations directly
    A = np.zeros((K, K))
    b = np.zeros((K, p))
    A[np.diag_indices(K)] += counts / noise
    b += sums / noise[:, None]
    for k in range(1, K):
        j = arrays.parent_index[k]
        w = 1 / var_par[k]
        A[k, k] += w
        A[j, j] += w
        A[k, j] -= w
        A[j, k] -= w
    A[np.diag_indices(K)] += has_prev / tvar
    b += (has_prev * coef / tvar)[:, None] * prev
    exact = np.linalg.solve(A, b)
    assert np.allclose(ours, exact, atol=1e-8)
    f = gaussian_objective(arrays, ours, sums, sumsq, counts, noise, prev, has_prev, var_par, coef, tvar)
    res = minimize(lambda v: -gaussian_objective(arrays, v.reshape(K, p), sums, sumsq, counts, noise, prev,
                                                 has_prev, var_par, coef, tvar), rng.normal(size=K * p),
                   method="BFGS", options={"gtol": 1e-10})
    assert f >= -res.fun - 1e-8
