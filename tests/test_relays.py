"""Relay chains (empty single-child nodes), which `show` and the report draw as one entry."""

from __future__ import annotations

import numpy as np
import pytest

from streamtree.relays import relay_chains


def test_chains_of_empty_single_child_nodes():
    #        0 (0 docs)
    #       /          \
    #   1 (0) -> 2 (0) -> 3 (5)       4 (0) -> 5 (0) with children 6 (2) and 7 (0) -> 8 (1)
    ids = [0, 1, 2, 3, 4, 5, 6, 7, 8]
    parents = [-1, 0, 1, 2, 0, 4, 5, 5, 7]
    counts = [0, 0, 0, 5, 0, 0, 2, 0, 1]
    assert relay_chains(ids, parents, counts) == {3: (1, 2), 5: (4,), 8: (7,)}


def test_a_node_with_documents_or_two_children_is_no_relay():
    # 1 holds a document, 2 has two children (one of them empty): neither is a relay
    assert relay_chains([0, 1, 2, 3, 4, 5], [-1, 0, 0, 1, 2, 2], [3, 1, 0, 4, 2, 0]) == {}


def test_an_empty_root_with_one_child_starts_a_chain():
    assert relay_chains([0, 7, 9], [-1, 0, 7], [0, 0, 4]) == {9: (0, 7)}
    # a chain of nodes that are all empty ends at the empty leaf
    assert relay_chains([0, 1, 2], [-1, 0, 1], [0, 0, 0]) == {2: (0, 1)}


def test_ids_need_not_be_in_order_and_unknown_parents_are_roots():
    assert relay_chains(np.array([12, 5, 30]), np.array([5, 99, 12]), np.array([0, 0, 1])) == {30: (5, 12)}


def test_every_relay_is_in_exactly_one_chain():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 40))
        parents = np.array([-1] + [int(rng.integers(0, k)) for k in range(1, n)])
        counts = rng.integers(0, 2, n) * rng.integers(1, 5, n)
        chains = relay_chains(np.arange(n), parents, counts)
        kids = np.bincount(parents[1:], minlength=n)
        relays = {k for k in range(n) if counts[k] == 0 and kids[k] == 1}
        listed = [r for chain in chains.values() for r in chain]
        assert sorted(listed) == sorted(relays)
        for end, chain in chains.items():  # a path down the tree, ending at a node that is no relay
            assert end not in relays and parents[end] == chain[-1]
            assert all(parents[b] == a for a, b in zip(chain, chain[1:]))


def test_arrays_of_other_lengths_are_refused():
    with pytest.raises(ValueError, match="one entry per node"):
        relay_chains([0, 1], [-1, 0], [0])
