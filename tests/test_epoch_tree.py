"""Node labels: the terms of the documents in a node's subtree (``EpochTree.label_words``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

from streamtree.likelihoods.multinomial_math import map_phi_with_children_dense
from test_store import make_tree

VOCAB = np.array(["a", "b", "c", "d", "e", "f"])


def small_tree():
    """root 0 -> 1 -> 3, root 0 -> 2, and 4 below 2 holding nothing; documents at 1, 3, 3, 2."""
    tree = make_tree(0, [0, 1, 3, 2, 4], [-1, 0, 1, 0, 2], [0, 0, 0, 0, 0], p=VOCAB.size)
    X = sp.csr_matrix(np.array([
        [2, 0, 0, 0, 0, 0],  # at 1
        [0, 3, 1, 0, 0, 0],  # at 3
        [0, 1, 1, 0, 0, 0],  # at 3
        [0, 0, 0, 0, 5, 0],  # at 2
    ], dtype=np.float64))
    return dataclasses.replace(tree, assignments=np.array([1, 3, 3, 2])), X


def test_subtree_row_sums_add_each_document_at_its_node_and_every_ancestor():
    tree, X = small_tree()
    got = tree.subtree_row_sums(X).toarray()
    want = {0: [2, 4, 2, 0, 5, 0], 1: [2, 4, 2, 0, 0, 0], 3: [0, 4, 2, 0, 0, 0], 2: [0, 0, 0, 0, 5, 0],
            4: [0, 0, 0, 0, 0, 0]}
    for node, row in want.items():
        np.testing.assert_array_equal(got[tree.index_of(node)], row, err_msg=f"node {node}")


def test_labels_rank_the_subtree_terms_and_fall_back_to_theta_where_the_subtree_is_empty():
    tree, X = small_tree()
    theta = np.full_like(tree.theta, 0.1)
    theta[:, 0] = 0.5  # a above c in every theta: the ties below ignore it
    theta[tree.index_of(4), 3] = 0.9  # 4's own largest entry
    tree = dataclasses.replace(tree, theta=theta)
    words = dict(zip(tree.node_ids.tolist(), tree.label_words(VOCAB, X, n=3)))
    assert words[0] == ["e", "b", "c"]  # 5, 4, then c (2 in two documents) before a (2 in one)
    assert words[1] == ["b", "c", "a"]
    assert words[3] == ["b", "c"]  # fewer terms than asked: no filler (b: 4 in two documents, c: 2)
    assert words[2] == ["e"]
    assert words[4] == ["d", "a", "b"]  # nothing below it this epoch: its theta (ties in vocabulary order)


def test_a_node_and_its_only_child_over_the_same_documents_read_alike():
    """Labels are a function of the documents: an internal node whose one child holds all its
    documents reads like the child, whatever the two parameters say (the parent's is flat)."""
    rng = np.random.default_rng(1)
    tree = make_tree(2, [0, 1, 2], [-1, 0, 1], [0, 0, 0], p=VOCAB.size)
    theta = rng.dirichlet(np.ones(VOCAB.size), size=3)
    X = sp.csr_matrix(rng.integers(0, 2, size=(4, VOCAB.size)).astype(np.float64))  # many tied counts
    tree = dataclasses.replace(tree, theta=theta, assignments=np.array([2, 2, 2, 2]))
    words = tree.label_words(VOCAB, X, n=4)
    assert words[0] == words[1] == words[2]


def test_an_internal_node_with_no_documents_below_it_reads_its_leaves():
    """The window keeps a branch whose documents are all in earlier epochs: the internal node
    is labelled by its leaves' parameters (weighted by their window counts), not by its own
    flattened one."""
    tree = make_tree(1, [0, 1, 2, 3, 4], [-1, 0, 1, 1, 0], [0, 0, 0, 0, 0], p=VOCAB.size)
    theta = np.full((5, VOCAB.size), 0.1)
    theta[tree.index_of(1), 5] = 0.9  # the internal node's own largest entry, f
    theta[tree.index_of(2), 0] = 0.9  # its leaves: a (window count 3) and b (window count 1)
    theta[tree.index_of(3), 1] = 0.9
    tree = dataclasses.replace(tree, theta=theta, assignments=np.array([4]),
                               window_counts=np.array([9, 4, 3, 1, 2]))
    words = dict(zip(tree.node_ids.tolist(), tree.label_words(VOCAB, sp.csr_matrix(np.eye(1, 6, 4)), n=2)))
    assert words[1] == ["a", "b"]
    assert words[0] == words[4] == ["e"]


def test_labels_refuse_a_matrix_of_other_documents_or_terms():
    tree, X = small_tree()
    with pytest.raises(ValueError, match="4 documents"):
        tree.label_words(VOCAB, X[:3], n=3)
    with pytest.raises(ValueError, match="vocabulary has 5 entries"):
        tree.label_words(VOCAB[:5], X, n=3)
    with pytest.raises(ValueError, match=r"1 node ids the tree does not hold, e.g. \[9\]"):
        dataclasses.replace(tree, assignments=np.array([1, 3, 9, 2])).label_words(VOCAB, X, n=3)


def test_a_word_distribution_with_a_time_linked_child_is_no_label_of_it():
    """Why labels come from documents: the multinomial node update's mode of a parent whose one
    child (a Zipf distribution fitted to 3,000 tokens) is also linked to its previous-epoch self,
    at a link strength below the vocabulary size, is within 0.01 nats of the uniform entropy
    and shares none of the child's ten largest terms; the child's documents, summed, give them
    all."""
    rng = np.random.default_rng(0)
    V, strength, floor = 1000, 300.0, 0.01
    base = 1.0 / np.arange(1, V + 1)
    counts = rng.multinomial(3000, base / base.sum()).astype(np.float64)
    child = (counts + 0.5) / (counts + 0.5).sum()
    parent = map_phi_with_children_dense(np.zeros(V), np.full(V, strength / V + floor), np.log(child)[None, :].copy(),
                                         np.array([strength]), (strength * child + floor)[None, :].copy())
    assert -(parent * np.log(parent)).sum() > np.log(V) - 0.01
    top_child = set(np.argsort(-child, kind="stable")[:10].tolist())
    assert not top_child & set(np.argsort(-parent, kind="stable")[:10].tolist())

    vocab = np.array([f"w{i}" for i in range(V)])
    tree = make_tree(1, [0, 1], [-1, 0], [0, 0], p=V)
    tree = dataclasses.replace(tree, theta=np.vstack([parent, child]), assignments=np.array([1]))
    words = tree.label_words(vocab, sp.csr_matrix(counts[None, :]), n=10)
    assert words[0] == words[1] == list(vocab[np.argsort(-counts, kind="stable")[:10]])


def test_a_one_document_node_lists_the_epochs_common_terms_first():
    """Every count of a one-document node ties: the terms more of the epoch's documents hold
    come first, then vocabulary order."""
    tree = make_tree(0, [0, 1, 2], [-1, 0, 0], [0, 0, 0], p=VOCAB.size)
    X = sp.csr_matrix(np.array([
        [1, 0, 1, 1, 0, 0],  # the one document at 1: a, c, d once each
        [0, 0, 1, 1, 1, 0],  # at 2
        [0, 0, 0, 1, 0, 1],  # at 2
    ], dtype=np.float64))
    tree = dataclasses.replace(tree, assignments=np.array([1, 2, 2]))
    assert tree.label_words(VOCAB, X, n=3)[tree.index_of(1)] == ["d", "c", "a"]  # held by 3, 2, 1 documents


def test_a_node_that_merged_is_listed_as_merged_not_also_died():
    """The tree's ``died`` keeps every node gone since the previous epoch (the data model); its
    text and counts say a merged node's end once, as the merge, as ``streamtree show`` and the
    report do. Before, ``format`` listed it under 'died' and said nothing of the merge."""
    from streamtree.events import epoch_events

    tree = make_tree(1, [0, 1], [-1, 0], [0, 0], died=[2, 3])
    events = epoch_events(1, [0, 1, 2, 3], [-1, 0, 0, 0], [0, 1], [-1, 0], [(2, "merged_into", 1)])
    tree = dataclasses.replace(tree, events=events)
    assert tree.merged == {2: 1} and tree.died_unmerged.tolist() == [3] and tree.died.tolist() == [2, 3]
    assert tree.format().splitlines()[-2:] == ["merged: 2 -> 1", "died: 3"]
    # without recorded merges (a tree read back without its events), every gone node died
    plain = make_tree(1, [0, 1], [-1, 0], [0, 0], died=[2, 3])
    assert plain.merged == {} and plain.died_unmerged.tolist() == [2, 3] and plain.format().endswith("died: 2, 3")
