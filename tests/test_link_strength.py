"""kappa0="auto": the families' link-strength estimates, and the estimator's use of them."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.preprocessing import normalize

from streamtree.likelihoods.multinomial import Multinomial
from streamtree.likelihoods.vmf import VonMisesFisher, mean_resultant_length, sample_vmf
from streamtree.model import DTSSBP
from streamtree.synthetic import planted_dirichlet_tree
from streamtree.tree import ROOT, TSSBTree
from streamtree.variants import resolve_variant

VARIANT = resolve_variant("dtssbp", window=2, max_depth=3, gamma=0.5, xi=0.001)


def _tree_of(parent_of: dict[int, int]) -> tuple[TSSBTree, dict[int, int]]:
    """A TSSBTree with the given parent map over planted ids; returns it and planted id -> tree id."""
    tree = TSSBTree(max_depth=10)
    ids = {k: ROOT for k, p in parent_of.items() if p < 0}
    todo = [k for k in parent_of if parent_of[k] >= 0]
    while todo:
        for k in list(todo):
            if parent_of[k] in ids:
                ids[k] = tree.add_child(ids[parent_of[k]])
                todo.remove(k)
    return tree, ids


def test_multinomial_recovers_planted_child_concentration():
    # the planted hierarchical-Dirichlet generator (documents of varying length, internal nodes
    # emitting documents): given the true tree and parents' distributions, the empirical-Bayes
    # estimate is the planted child concentration
    corpus = planted_dirichlet_tree(np.random.default_rng(3), n_features=800, n_documents=6000, n_epochs=1,
                                    child_concentration=600.0)
    true_ids = corpus.node_ids[0]
    tree, tid = _tree_of({int(k): int(corpus.parent[k]) for k in true_ids})
    arrays = tree.arrays()
    row = {int(i): r for r, i in enumerate(arrays.ids)}
    V = corpus.n_features
    theta = np.zeros((arrays.size, V))
    sums = np.zeros((arrays.size, V))
    counts = np.zeros(arrays.size)
    X = corpus.counts[0].tocsr().astype(np.float64)
    for j, k in enumerate(true_ids):
        r = row[tid[int(k)]]
        theta[r] = corpus.word_dists[0][j]
        docs = corpus.labels[0] == k
        sums[r] = np.asarray(X[docs].sum(axis=0)).ravel()
        counts[r] = docs.sum()
    lik = Multinomial(VARIANT, V, kappa0=1.0, kappa1=1.0, a=0.0, min_node_docs=2)
    est = lik.estimate_link_strength(arrays, theta, np.ones(arrays.size), counts, sums, theta,
                                     np.zeros(arrays.size, dtype=bool), theta[0])
    assert 600.0 / 1.25 < est < 600.0 * 1.25


def test_multinomial_link_estimate_uses_the_parent_links_and_is_deterministic():
    rng = np.random.default_rng(0)
    V = 300
    root = rng.dirichlet(np.ones(V))
    tree = TSSBTree(3)
    kids = [tree.add_child(ROOT) for _ in range(12)]
    arrays = tree.arrays()
    theta = np.vstack([root] + [rng.dirichlet(400.0 * root) for _ in kids])
    prev = theta.copy()
    prev[1:] = [rng.dirichlet(20000.0 * t) for t in theta[1:]]  # a close previous self
    sums = np.vstack([np.zeros(V)] + [rng.multinomial(3000, t).astype(float) for t in theta[1:]])
    counts = np.r_[0.0, np.full(12, 50.0)]
    lik = Multinomial(VARIANT, V, kappa0=1.0, kappa1=1.0, a=0.0, min_node_docs=2)
    has_prev = np.r_[False, np.ones(12, dtype=bool)]
    a = lik.estimate_link_strength(arrays, theta, np.ones(13), counts, sums, prev, has_prev, root)
    b = lik.estimate_link_strength(arrays, theta, np.ones(13), counts, sums, prev, has_prev, root)
    assert a == b
    # the parent links are Dirichlet(400 x root) draws; the previous selves do not enter
    assert 400.0 / 1.3 < a < 400.0 * 1.3
    c = lik.estimate_link_strength(arrays, theta, np.ones(13), counts, sums, prev, np.zeros(13, bool), root)
    assert c == a
    # a node without documents or only the root: nothing to learn from
    assert lik.estimate_link_strength(arrays, theta, np.ones(13), np.zeros(13), sums, prev, has_prev,
                                      root) is None


def test_vmf_link_strength_is_the_pooled_document_concentration():
    rng = np.random.default_rng(1)
    p, beta = 60, 150.0
    tree = TSSBTree(3)
    kids = [tree.add_child(ROOT) for _ in range(4)]
    arrays = tree.arrays()
    mus = normalize(rng.standard_normal((5, p)))
    docs = [sample_vmf(mus[k], beta, 400, rng) for k in range(5)]
    sums = np.vstack([d.sum(axis=0) for d in docs])
    counts = np.full(5, 400.0)
    lik = VonMisesFisher(VARIANT, p, kappa0=1.0, kappa1=1.0, a=0.0, min_node_docs=2,
                         concentration_bounds=(1e-3, 1e6))
    est = lik.estimate_link_strength(arrays, mus, np.ones(5), counts, sums, mus, np.zeros(5, bool), mus[0])
    assert abs(est - beta) / beta < 0.05
    # exactly the root of A_p(b)^2 = the mean cosine of two documents of one node
    pairs = sum((d.sum(axis=0) @ d.sum(axis=0) - len(d)) / (len(d) * (len(d) - 1)) for d in docs) / 5
    assert mean_resultant_length(p, est) == pytest.approx(np.sqrt(pairs), rel=1e-6)
    # one-document nodes say nothing about the spread (their fitted direction is the document)
    one = np.r_[counts[:4], 1.0]
    sums_one = np.vstack([sums[:4], docs[4][0]])
    est_one = lik.estimate_link_strength(arrays, mus, np.ones(5), one, sums_one, mus, np.zeros(5, bool), mus[0])
    est_four = lik.estimate_link_strength(arrays, mus, np.ones(5), np.r_[counts[:4], 0.0],
                                          np.vstack([sums[:4], np.zeros(p)]), mus, np.zeros(5, bool), mus[0])
    assert est_one == est_four
    assert len(kids) == 4


def _planted(likelihood: str, n_epochs: int = 2):
    corpus = planted_dirichlet_tree(np.random.default_rng(5), n_features=300, n_documents=400, n_epochs=n_epochs,
                                    branching=(2, 2))
    X = [c.astype(np.float64) for c in corpus.counts]
    return [normalize(x) for x in X] if likelihood == "vmf" else [sp.csr_matrix(x) for x in X]


@pytest.mark.parametrize("likelihood", ["vmf", "multinomial"])
def test_auto_kappa0_is_reproducible_and_survives_a_checkpoint(likelihood):
    X = _planted(likelihood, 2)
    kw = dict(likelihood=likelihood, max_depth=2, n_sweeps=6, random_state=7, kappa0="auto")
    a = DTSSBP(**kw).fit(X)
    b = DTSSBP(**kw).fit(X)
    assert a.kappa0 == "auto" and a.kappa0_ == b.kappa0_ and np.isfinite(a.kappa0_) and a.kappa0_ > 0
    assert a.state_.hyper["kappa0"] == a.kappa0_ == a.likelihood_.kappa0
    np.testing.assert_array_equal(a.trees_[-1].assignments, b.trees_[-1].assignments)
    # checkpoint after epoch 0, restore, fit epoch 1: bit-identical to the uninterrupted fit
    c = DTSSBP(**kw)
    c.partial_fit(X[0])
    arrays, meta = c.get_checkpoint()
    restored = DTSSBP.from_checkpoint(arrays, meta)
    assert restored.kappa0_ == c.kappa0_
    np.testing.assert_array_equal(restored.score_samples(X[0]), c.score_samples(X[0]))
    restored.partial_fit(X[1])
    assert restored.kappa0_ == a.kappa0_
    np.testing.assert_array_equal(restored.trees_[-1].theta, a.trees_[-1].theta)
    np.testing.assert_array_equal(restored.trees_[-1].assignments, a.trees_[-1].assignments)


def test_a_given_kappa0_is_used_as_is():
    X = _planted("vmf", 1)
    model = DTSSBP(likelihood="vmf", max_depth=2, n_sweeps=4, kappa0=321.0, random_state=0).fit(X)
    assert model.kappa0_ == 321.0 and "kappa0" not in model.state_.hyper


def test_kappa0_must_be_positive_or_auto():
    X = _planted("vmf", 1)
    for bad in ("automatic", 0.0, -1.0):
        with pytest.raises(ValueError, match="kappa0"):
            DTSSBP(kappa0=bad).fit(X)


def test_gaussian_has_no_kappa0():
    rng = np.random.default_rng(0)
    model = DTSSBP(likelihood="gaussian", max_depth=1, n_sweeps=3, random_state=0).fit([rng.normal(size=(40, 2))])
    assert model.kappa0_ is None


def test_word_topics_recognise_a_node_by_its_birth_top_words():
    """A node is recognised while 3 of its birth top words are still among its top ten, or
    while they still carry 60% of the weight its top words carry now: a topic spread evenly over
    many words keeps its id when noise reorders its top ten, and loses it when its weight moves
    to other words."""
    from streamtree.likelihoods.base import MIN_SHARED_TOP_WORDS, MIN_TOP_WEIGHT_SHARE, TOP_WORDS

    lik = VonMisesFisher(VARIANT, 40, kappa0=1.0, kappa1=1.0, a=0.0, min_node_docs=2,
                         concentration_bounds=(1e-3, 1e6))
    theta = np.linspace(1.0, 0.1, 40)  # top words 0..9
    sig = lik.identity_signature(theta)
    np.testing.assert_array_equal(sig, np.arange(TOP_WORDS))
    for shared in range(TOP_WORDS + 1):
        now = theta.copy()
        now[shared:TOP_WORDS] = 0.0  # words shared..9 leave the top 10, and their weight with them
        # below the weight test too: the count decides
        assert (now[:TOP_WORDS].sum() < MIN_TOP_WEIGHT_SHARE * np.sort(now)[-TOP_WORDS:].sum()
                or shared >= MIN_SHARED_TOP_WORDS)
        assert lik.recognises(sig, now) == (shared >= MIN_SHARED_TOP_WORDS)
    # flat over 30 words: the birth top ten fall out of the top ten by noise but keep their weight
    rng = np.random.default_rng(0)
    flat = np.r_[np.full(30, 1.0), np.zeros(10)]
    sig = lik.identity_signature(flat + rng.normal(0, 1e-3, 40))
    now = flat + rng.normal(0, 1e-3, 40)
    now[sig.astype(int)] -= 2e-3  # every birth top word just below the rest
    assert not set(sig.astype(int)) & set(np.argsort(-now)[:TOP_WORDS].tolist())
    assert lik.recognises(sig, now)
    lighter = now.copy()
    lighter[sig.astype(int)] *= 0.59  # their weight below 60% of the top words' now
    assert not lik.recognises(sig, lighter)
    assert not lik.recognises(lik.identity_signature(flat), np.r_[np.zeros(10), np.full(30, 1.0)])


@pytest.mark.parametrize("likelihood", ["vmf", "multinomial"])
def test_identity_signatures_follow_the_tree_and_the_checkpoint(likelihood):
    X = _planted(likelihood, 2)
    model = DTSSBP(likelihood=likelihood, max_depth=2, n_sweeps=5, random_state=3).fit(X)
    st = model.state_
    assert set(st.signatures) == set(st.tree.preorder())
    restored = DTSSBP.from_checkpoint(*model.get_checkpoint())
    assert set(restored.state_.signatures) == set(st.signatures)
    for nid, sig in st.signatures.items():
        np.testing.assert_array_equal(restored.state_.signatures[nid], sig)


def test_multinomial_time_strength_is_estimated_apart_from_the_parent_link():
    # each child drifts from its previous self by Dirichlet(5000 x previous), while it lies
    # Dirichlet(300 x root) from its parent: the time link is estimated near 5000, not 300
    rng = np.random.default_rng(4)
    V = 400
    root = rng.dirichlet(np.ones(V))
    tree = TSSBTree(3)
    for _ in range(15):
        tree.add_child(ROOT)
    arrays = tree.arrays()
    prev = np.vstack([root] + [rng.dirichlet(300.0 * root) for _ in range(15)])
    theta = np.vstack([root] + [rng.dirichlet(5000.0 * p) for p in prev[1:]])
    sums = np.vstack([np.zeros(V)] + [rng.multinomial(20000, t).astype(float) for t in theta[1:]])
    counts = np.r_[0.0, np.full(15, 200.0)]
    has_prev = np.r_[False, np.ones(15, dtype=bool)]
    lik = Multinomial(VARIANT, V, kappa0=300.0, kappa1=1.0, a=0.0, min_node_docs=2)
    est = lik.estimate_time_strength(arrays, theta, np.ones(16), counts, sums, prev, has_prev, root)
    assert 5000.0 / 1.5 < est < 5000.0 * 1.5
    lik.time_strength = est
    par, tim = lik.link_strengths(np.array([1]))
    assert par[0] == 300.0 and tim[0] == est
    assert lik.estimate_time_strength(arrays, theta, np.ones(16), counts, sums, prev, np.zeros(16, bool),
                                      root) is None
