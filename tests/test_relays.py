"""Relay chains (empty single-child nodes), which `show` and the report draw as one entry."""

from __future__ import annotations

import numpy as np
import pytest

from streamtree.relays import RelayReader, own_lines, relay_chains, relay_changes


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


def test_relay_changes_are_the_events_that_only_redraw_a_relay_chain():
    # before: 0 -> 1 (3 docs), 0 -> 2 (relay) -> 3 (2 docs), 0 -> 4 (1 doc)
    before = ([0, 1, 2, 3, 4], [-1, 0, 0, 2, 0], [1, 3, 0, 2, 1])
    # after: relay 2 gone (merged into the root), a new relay 5 above 1, 4 moved below 1's line
    # (under 5's child 1: a real move), 6 a new node of its own, 7 a relay born above it
    after = ([0, 1, 3, 4, 5, 6, 7], [-1, 5, 0, 1, 0, 7, 0], [1, 3, 2, 1, 0, 4, 0])
    rows = [(5, "born"), (6, "born"), (7, "born"), (2, "died"), (2, "merged_into"),
            (1, "parent_changed"), (3, "parent_changed"), (4, "parent_changed"), (6, "split_from")]
    node_id, event = zip(*rows)
    got = dict(zip(rows, relay_changes(node_id, event, before, after).tolist()))
    assert got[(5, "born")] and got[(7, "born")]  # new relays above 1 and 6
    assert not got[(6, "born")] and not got[(6, "split_from")]  # a node with documents: a topic of its own
    assert got[(2, "died")] and got[(2, "merged_into")]  # a relay of the previous tree: the chain got shorter
    assert got[(1, "parent_changed")]  # 0 -> 1 became 0 -> 5 -> 1: drawn below the root as before
    assert got[(3, "parent_changed")]  # 0 -> 2 -> 3 became 0 -> 3: the same
    assert not got[(4, "parent_changed")]  # from the root to below 1: its line moved


def test_a_relay_that_takes_its_line_elsewhere_is_a_move():
    # 0 -> 1 (2 docs), 0 -> 2 (relay) -> 3 (4 docs); then the relay 2 hangs below 1
    before = ([0, 1, 2, 3], [-1, 0, 0, 2], [0, 2, 0, 4])
    after = ([0, 1, 2, 3], [-1, 0, 1, 2], [0, 2, 0, 4])
    assert relay_changes([2], ["parent_changed"], before, after).tolist() == [False]
    # without the previous tree only the births and splits of relays can be told
    got = relay_changes([2, 2, 3], ["born", "died", "parent_changed"], None, after)
    assert got.tolist() == [True, False, False]


def test_a_topic_that_emptied_into_a_relay_ends_as_a_topic():
    # epoch 1: 0 -> 1 (4 docs) -> 2 (3 docs); epoch 2: 1 holds none, a relay above 2; epoch 3: 1 is gone
    first = ([0, 1, 2], [-1, 0, 1], [1, 4, 3])
    second = ([0, 1, 2], [-1, 0, 1], [1, 0, 3])
    third = ([0, 2], [-1, 0], [1, 3])
    had = own_lines(*first)
    assert had == {0, 1, 2} and own_lines(*second) == {0, 2}
    ends = relay_changes([1, 1, 2], ["died", "merged_into", "parent_changed"], second, third, had)
    assert ends.tolist() == [False, False, True]  # 1's end is a topic's; 2's line stays below the root's
    # a relay that never had a line of its own: its end only shortens a chain
    assert relay_changes([1], ["died"], second, third, own_lines(*second)).tolist() == [True]


def test_the_reader_walks_the_epochs_as_the_views_do():
    # the epochs of the test above, read in order: 1 had a line in the first, so its end is a topic's
    first = ([0, 1, 2], [-1, 0, 1], [1, 4, 3])
    second = ([0, 1, 2], [-1, 0, 1], [1, 0, 3])
    third = ([0, 2], [-1, 0], [1, 3])
    reader = RelayReader()
    assert reader.read([1, 2], ["born", "born"], first).tolist() == [False, False]
    reader.passed(second)  # an epoch whose events are not read still gives its lines and its tree
    assert reader.read([1, 2], ["died", "parent_changed"], third).tolist() == [False, True]
    # read one after the other, each epoch against the one before: 2's line stays below the root's
    walk = RelayReader()
    walk.read([1, 2], ["born", "born"], first)
    walk.read([], [], second)
    assert walk.read([2], ["parent_changed"], third).tolist() == [True]
    assert walk.before == third
    # started after the first epoch, it knows only the second: 1 was a relay and never had a line
    late = RelayReader(second, own_lines(*second))
    assert late.read([1], ["died"], third).tolist() == [True]
    # an epoch without a tree to read against: deaths and parent changes count as the topics' own
    reader.passed(None)
    assert reader.read([1, 2], ["died", "parent_changed"], third).tolist() == [False, False]


def test_relay_changes_in_a_chain_of_relays_and_at_a_relay_root():
    # before: 0 (relay root) -> 1 (relay) -> 2 (relay) -> 3 (5 docs); after: 0 -> 2 -> 3, 1 gone,
    # 4 a new relay between 2 and 3
    before = ([0, 1, 2, 3], [-1, 0, 1, 2], [0, 0, 0, 5])
    after = ([0, 2, 3, 4], [-1, 0, 4, 2], [0, 0, 5, 0])
    got = relay_changes([1, 4, 2, 3], ["died", "born", "parent_changed", "parent_changed"], before, after)
    assert got.tolist() == [True, True, True, True]  # one line, [0] > ... > [3], at the top throughout
    # the chain's end moved below a line of its own: a move
    moved = ([0, 2, 3, 5], [-1, 0, 5, 0], [0, 0, 5, 1])
    assert relay_changes([3], ["parent_changed"], before, moved).tolist() == [False]
