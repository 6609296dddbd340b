"""The multinomial's split-merge path (rows read in place, unchecked marginal and MAP) gives
the same values, bit for bit, as the checked and sliced forms: the seeded chains must not change."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from streamtree.likelihoods import multinomial_math as mm
from streamtree.likelihoods.base import DocumentSet, RowBlock
from streamtree.likelihoods.multinomial import Multinomial
from streamtree.variants import resolve_variant

VARIANT = resolve_variant("dtssbp", window=2, max_depth=3, gamma=0.5, xi=0.001)


def _problem(seed: int, V: int = 400):
    rng = np.random.default_rng(seed)
    X = sp.random(60, V, density=0.04, format="csr", random_state=seed, data_rvs=lambda n: rng.integers(1, 6, n))
    X = sp.csr_matrix(X + sp.csr_matrix((np.ones(60), (np.arange(60), rng.integers(0, V, 60))), shape=(60, V)))
    lik = Multinomial(VARIANT, V, kappa0=300.0, kappa1=0.7, a=0.0, min_node_docs=2)
    theta = rng.dirichlet(np.full(V, 0.3))
    theta = np.maximum(theta, 1e-300)
    return rng, X, lik, theta / theta.sum()


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
def test_block_log_likelihood_reads_csr_rows_in_place_with_the_same_values(dtype):
    rng, X, lik, theta = _problem(0)
    X = X.astype(dtype)
    rows = np.array([7, 3, 3, 59, 0, 41], dtype=np.int64)
    want = lik.row_log_likelihood(X[rows], theta, 1.0)
    assert np.array_equal(lik.block_log_likelihood(RowBlock(X, rows), theta, 1.0), want)
    dense = X.toarray()
    assert np.array_equal(lik.block_log_likelihood(RowBlock(dense, rows), theta, 1.0),
                          lik.row_log_likelihood(dense[rows], theta, 1.0))


@pytest.mark.parametrize("seed", range(3))
def test_fixed_node_scores_are_the_likelihoods_own_bit_for_bit(seed):
    """The scorer the moves keep per node (log phi taken once, each depth's child parameter and
    link normaliser kept) gives the values of block_log_likelihood, log_likelihood, log_link
    and log_marginal exactly."""
    rng, X, lik, theta = _problem(seed)
    child = rng.dirichlet(np.full(theta.size, 0.5))
    child = np.maximum(child, 1e-300)
    prev = rng.dirichlet(np.full(theta.size, 2.0))
    fixed, below = lik.fixed_node(theta, 1.0), lik.fixed_node(child, 1.0)
    rows = np.array([5, 1, 1, 40, 0], dtype=np.int64)
    assert np.array_equal(fixed.rows(RowBlock(X, rows)), lik.block_log_likelihood(RowBlock(X, rows), theta, 1.0))
    docs = DocumentSet(3.0, np.asarray(X[rows].sum(axis=0), dtype=np.float64).ravel(), 0.0)
    assert fixed.documents(docs) == lik.log_likelihood(docs, theta, 1.0)
    for _ in range(2):  # the second round reads the kept normalisers
        for depth in (1, 2, 3):
            assert fixed.log_link_below(below, depth) == lik.log_link(child, theta, depth)
            assert fixed.log_link_below(below, depth, prev) == lik.log_link(child, theta, depth, prev)
            assert fixed.log_marginal_below(docs, 1.0, depth) == lik.log_marginal(docs, theta, 1.0, depth)
            assert fixed.log_marginal_below(docs, 1.0, depth, prev) == lik.log_marginal(docs, theta, 1.0, depth, prev)
    with pytest.raises(ValueError, match="non-negative"):
        fixed.log_marginal_below(DocumentSet(1.0, -docs.s, 0.0), 1.0, 1)


@pytest.mark.parametrize("seed", range(3))
def test_set_marginal_and_new_node_map_equal_the_checked_forms(seed):
    rng, X, lik, theta = _problem(seed)
    rows = rng.choice(X.shape[0], size=9, replace=False)
    s = np.asarray(X[rows].sum(axis=0), dtype=np.float64).ravel()
    docs = DocumentSet(9.0, s, 0.0)
    for depth in (1, 2, 3):
        prior = lik.new_node_prior(depth) * theta + lik.floor
        assert lik.log_marginal(docs, theta, 1.0, depth) == mm.log_dm_marginal_set(s, s.sum(), prior)
        assert np.array_equal(lik.new_node_theta(theta, 1.0, depth, docs), mm.map_phi(s, prior))
    with pytest.raises(ValueError, match="non-negative"):
        mm.log_dm_marginal_dense(-s, theta + 0.01)


def test_set_marginal_token_total_check():
    alpha = np.full(4, 0.5)
    c = np.array([1.0, 2.0, 0.0, 0.0])
    value = mm.log_dm_marginal_set(c, 3.0, alpha)
    assert mm.log_dm_marginal_set(c, np.array([3.0]), alpha) == value
    assert mm.log_dm_marginal_set(c, 3.0 + 1e-12, alpha) == value  # within the tolerance
    for bad in (3.1, np.inf, np.nan):
        with pytest.raises(ValueError, match="n_tokens"):
            mm.log_dm_marginal_set(c, bad, alpha)
