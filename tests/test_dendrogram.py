"""The common Dendrogram type: construction, validation and agreement with SciPy."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.cluster.hierarchy import fcluster, is_valid_linkage, leaves_list, linkage, to_tree

from streamtree.static.dendrogram import Dendrogram


def scipy_tree(n=12, seed=0):
    X = np.random.default_rng(seed).normal(size=(n, 2))
    Z = linkage(X, "average")
    return Z, Dendrogram.from_merges(Z[:, 0], Z[:, 1], Z[:, 2], n, stats={"h": Z[:, 2] * 2})


def test_roundtrip_scipy_linkage():
    Z, d = scipy_tree()
    np.testing.assert_array_equal(d.linkage, Z)
    assert is_valid_linkage(d.linkage)
    assert d.n_leaves == 12
    np.testing.assert_array_equal(d.heights, Z[:, 2])
    np.testing.assert_array_equal(d.stats["h"], Z[:, 2] * 2)


def test_leaves_order_matches_scipy():
    for seed in range(5):
        Z, d = scipy_tree(15, seed)
        np.testing.assert_array_equal(d.leaves_order(), leaves_list(Z))


def test_clusters_of_matches_scipy_tree():
    Z, d = scipy_tree(10, 3)
    _, nodes = to_tree(Z, rd=True)
    for k, members in enumerate(d.clusters_of()):
        assert sorted(members.tolist()) == sorted(nodes[10 + k].pre_order())


def test_sizes_and_orientation():
    d = Dendrogram.from_merges([3, 0, 5], [1, 2, 4], [0.5, 1.0, 2.0], 4)
    # rows store (min, max) cluster ids and the size of the new cluster
    np.testing.assert_array_equal(d.linkage[:, :2], [[1, 3], [0, 2], [4, 5]])
    np.testing.assert_array_equal(d.linkage[:, 3], [2, 2, 4])
    assert fcluster(d.linkage, 0.75, "distance").tolist() == [2, 1, 3, 1]


def test_newick():
    d = Dendrogram.from_merges([0, 2], [1, 3], [1.0, 2.5], 3)
    assert d.to_newick() == "(2:2.5,(0:1,1:1):1.5);"  # rows are stored as (min id, max id)
    assert d.to_newick(labels=list("abc"), branch_lengths=False) == "(c,(a,b));"
    with pytest.raises(ValueError):
        d.to_newick(labels=["a"])


def test_single_leaf():
    d = Dendrogram.from_merges([], [], [], 1)
    assert d.n_leaves == 1
    assert d.leaves_order().tolist() == [0]
    assert d.clusters_of() == []
    assert d.to_newick() == "0;"


def test_validation():
    with pytest.raises(ValueError, match="merges"):
        Dendrogram.from_merges([0], [1], [1.0], 4)
    with pytest.raises(ValueError, match="invalid"):
        Dendrogram.from_merges([0, 0], [1, 2], [1.0, 2.0], 3)  # leaf 0 reused
    with pytest.raises(ValueError, match="invalid"):
        Dendrogram.from_merges([0, 5], [1, 2], [1.0, 2.0], 3)  # cluster 5 does not exist yet
    with pytest.raises(ValueError, match="statistic"):
        Dendrogram.from_merges([0, 3], [1, 2], [1.0, 2.0], 3, stats={"x": np.zeros(3)})


def test_newick_quotes_leaf_names_with_special_characters():
    from scipy.cluster.hierarchy import linkage

    Z = linkage(np.array([[0.0], [1.0], [5.0]]), "average")
    d = Dendrogram(linkage=Z, heights=Z[:, 2])
    text = d.to_newick(labels=["sou.parquet:4358", "it's", "plain"], branch_lengths=True)
    assert "'sou.parquet:4358'" in text and "'it''s'" in text and "plain" in text and "'plain'" not in text
