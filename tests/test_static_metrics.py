"""Dendrogram purity, subtree score and leave-one-out accuracy against hand and brute-force values."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.cluster.hierarchy import linkage

from streamtree.static.dendrogram import Dendrogram
from streamtree.static.metrics import (
    class_counts,
    dendrogram_purity,
    leave_one_out_accuracy,
    subtree_score,
)


def random_tree(n: int, rng: np.random.Generator) -> Dendrogram:
    live = list(range(n))
    left, right = [], []
    for k in range(n - 1):
        i, j = rng.choice(len(live), size=2, replace=False)
        a, b = live[i], live[j]
        live = [c for c in live if c not in (a, b)] + [n + k]
        left.append(a)
        right.append(b)
    return Dendrogram.from_merges(left, right, np.arange(1, n, dtype=float), n)


def leaf_sets(d: Dendrogram) -> list[set]:
    n = d.n_leaves
    return [{i} for i in range(n)] + [set(m.tolist()) for m in d.clusters_of()]


def brute_purity(d: Dendrogram, y) -> float:
    sets = leaf_sets(d)
    vals = []
    for i, j in itertools.combinations(range(d.n_leaves), 2):
        if y[i] != y[j]:
            continue
        lca = min((s for s in sets if i in s and j in s), key=len)
        vals.append(np.mean([y[m] == y[i] for m in lca]))
    return float(np.mean(vals))


def brute_loo(d: Dendrogram, y) -> float:
    """Nearest leaves = those whose least common ancestor with i is smallest; majority vote."""
    sets = leaf_sets(d)
    n = d.n_leaves
    score = 0.0
    for i in range(n):
        lca_size = {j: len(min((s for s in sets if i in s and j in s), key=len))
                    for j in range(n) if j != i}
        best = min(lca_size.values())
        near = [j for j, s in lca_size.items() if s == best]
        votes = {c: sum(y[j] == c for j in near) for c in set(y)}
        top = max(votes.values())
        winners = [c for c, v in votes.items() if v == top]
        score += (y[i] in winners) / len(winners)
    return score / n


# ((0,1),(2,3)) merged with 4: linkage rows: 0+1 -> 5, 2+3 -> 6, 5+6 -> 7, 7+4 -> 8
HAND = Dendrogram.from_merges([0, 2, 5, 7], [1, 3, 6, 4], [1.0, 1.0, 2.0, 3.0], 5)


def test_purity_hand_computed():
    # labels a a b b a: same-class pairs (0,1):{0,1} purity 1; (2,3):{2,3} 1;
    # (0,4),(1,4): root, 3/5 a each -> (1 + 1 + 0.6 + 0.6) / 4 = 0.8
    assert dendrogram_purity(HAND, ["a", "a", "b", "b", "a"]) == pytest.approx(0.8, abs=1e-15)
    # labels a b a b a: pairs (0,2),(0,4),(2,4),(1,3) -> LCAs {0..3}: 1/2, root: 3/5, 3/5, {0..3}: 1/2
    assert dendrogram_purity(HAND, [0, 1, 0, 1, 0]) == pytest.approx((0.5 + 0.6 + 0.6 + 0.5) / 4)


def test_purity_perfect_tree_and_linkage_input():
    y = np.array([0, 0, 1, 1, 2])
    assert dendrogram_purity(HAND, y) == 1.0
    assert dendrogram_purity(HAND.linkage, y) == 1.0


def test_purity_matches_bruteforce_on_random_trees():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(3, 30))
        d = random_tree(n, rng)
        y = rng.integers(0, 3, size=n)
        if np.bincount(y).max() < 2:
            continue
        assert dendrogram_purity(d, y) == pytest.approx(brute_purity(d, y), abs=1e-12)


def test_purity_on_scipy_linkage():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(25, 3))
    Z = linkage(X, "average")
    y = rng.integers(0, 4, size=25)
    d = Dendrogram.from_merges(Z[:, 0], Z[:, 1], Z[:, 2], 25)
    assert dendrogram_purity(Z, y) == pytest.approx(brute_purity(d, y), abs=1e-12)


def test_subtree_score_hand_and_bruteforce():
    # a a b b a: pure internal nodes {0,1}, {2,3}; max = 5 - 2 = 3
    assert subtree_score(HAND, list("aabba")) == pytest.approx(2 / 3)
    assert subtree_score(HAND, [0, 0, 1, 1, 2]) == 1.0
    rng = np.random.default_rng(5)
    for _ in range(10):
        n = int(rng.integers(3, 25))
        d = random_tree(n, rng)
        y = rng.integers(0, 3, size=n)
        k = len(np.unique(y))
        if k == n:
            continue
        pure = sum(len({y[m] for m in s}) == 1 for s in leaf_sets(d)[n:])
        assert subtree_score(d, y) == pytest.approx(pure / (n - k))


def test_loo_accuracy_hand_and_bruteforce():
    # a a b b a: leaf 0 -> sibling {1}: a ok; 1 ok; 2,3 ok; leaf 4 -> sibling {0,1,2,3}: tie a/b -> 1/2
    assert leave_one_out_accuracy(HAND, list("aabba")) == pytest.approx(4.5 / 5)
    rng = np.random.default_rng(7)
    for _ in range(15):
        n = int(rng.integers(2, 25))
        d = random_tree(n, rng)
        y = rng.integers(0, 3, size=n)
        assert leave_one_out_accuracy(d, y) == pytest.approx(brute_loo(d, y), abs=1e-12)


def test_class_counts_root_is_totals():
    y = np.array([2, 0, 2, 1, 2])
    c = class_counts(HAND, y)
    assert c.shape == (9, 3)
    np.testing.assert_array_equal(c[-1], [1, 1, 3])
    np.testing.assert_array_equal(c[5], [1, 0, 1])


def test_metric_validation():
    with pytest.raises(ValueError, match="labels"):
        dendrogram_purity(HAND, [0, 1])
    with pytest.raises(ValueError, match="undefined"):
        dendrogram_purity(HAND, [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="undefined"):
        subtree_score(HAND, [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="linkage"):
        dendrogram_purity(np.zeros((3, 3)), [0, 0, 1, 1])
    bad = HAND.linkage.copy()
    bad[0, 3] = 7  # wrong cluster size
    with pytest.raises(ValueError, match="valid"):
        dendrogram_purity(bad, [0, 0, 1, 1, 0])
