"""The multinomial likelihood object: its z-kernel columns, its predictive pmf, planted recovery."""

import itertools
import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.metrics import adjusted_rand_score

from streamtree import DTSSBP
from streamtree.inference.enumerated import DIRICHLET, Candidates, score_rows
from streamtree.likelihoods.multinomial import Multinomial
from streamtree.likelihoods.multinomial_math import new_node_log_marginal
from streamtree.tree import TSSBTree
from streamtree.variants import resolve_variant


def family(V, **kw):
    config = resolve_variant("dtssbp", window=2, max_depth=2, gamma=0.5, xi=0.001)
    return Multinomial(config, V, **{"kappa0": 30.0, "kappa1": 1.0, "a": 0.0, "min_node_docs": 2, **kw})


def test_kernel_columns_are_multinomial_and_dirichlet_multinomial():
    rng = np.random.default_rng(0)
    V = 12
    tree = TSSBTree(2)
    a = tree.add_child(0)
    tree.add_child(a)
    arrays = tree.arrays()
    theta = rng.dirichlet(np.ones(V), size=3)
    log_mass = np.log([0.2, 0.3, 0.1])
    log_res = np.array([np.log(0.15), np.log(0.25), -np.inf])  # the last node is at the depth cap
    lik = family(V)
    cand, ph_rows = lik.kernel(arrays, theta, np.full(3, 30.0), log_mass, log_res)
    assert ph_rows.tolist() == [0, 1]
    X = sp.csr_matrix(rng.poisson(0.8, size=(6, V)).astype(float) + np.eye(6, V))
    alphas = 30.0 * theta[ph_rows] + lik.floor
    want = np.column_stack([log_mass + (X @ np.log(theta).T),
                            log_res[ph_rows] + new_node_log_marginal(X, alphas, include_coef=False)])
    for i in range(X.shape[0]):
        _, lognorm = score_rows(X[i], cand, None)
        assert lognorm[0] == pytest.approx(np.logaddexp.reduce(want[i]), abs=1e-10)


def _wire(obj):
    """``obj`` pickled as Ray stores it (protocol 5, arrays out of band): the head and the array buffers."""
    buffers = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return head, buffers


@pytest.mark.parametrize("layout", ["rows", "sampler"])
def test_kernel_candidates_travel_without_placeholder_parameters(layout):
    """The kernel's candidates travel (to a Ray shard) as theta, one strength per placeholder and
    the floor: neither the placeholders' (P, V) Dirichlet parameters nor log theta, so what a
    shard receives is theta's K x V doubles and per-column vectors. The receiver rebuilds both
    with the kernel's bits (the arithmetic it has always done), so its scores and draws are the
    driver's."""
    rng = np.random.default_rng(7)
    V = 400
    tree = TSSBTree(3)
    a = tree.add_child(0)
    tree.add_child(0)
    tree.add_child(tree.add_child(a))
    arrays = tree.arrays()
    K = arrays.size
    theta = rng.dirichlet(np.full(V, 0.2), size=K)
    if layout == "sampler":  # the epoch sampler hands theta as the transposed view of a (V, K) buffer
        theta = np.ascontiguousarray(theta.T).T
    log_mass = np.log(rng.dirichlet(np.ones(K)))
    log_res = np.log(rng.uniform(0.01, 0.1, size=K))
    log_res[arrays.depth == 3] = -np.inf  # at the depth cap: no placeholder
    lik = family(V, kappa0=40.0, kappa1=0.7)
    cand, ph_rows = lik.kernel(arrays, theta, np.full(K, 30.0), log_mass, log_res)
    P = ph_rows.size
    assert 0 < P < K

    # the kernel's arithmetic from before the candidates travelled as their parts
    strength = np.array([lik.new_node_prior(int(d) + 1) for d in arrays.depth[ph_rows]])
    alpha = strength[:, None] * theta[ph_rows] + lik.floor
    assert np.array_equal(cand.ph_alpha, alpha) and cand.ph_alpha.flags.c_contiguous
    assert np.array_equal(cand.ph_b, alpha.sum(axis=1))
    assert np.array_equal(cand.coef_T, np.ascontiguousarray(np.log(theta).T))

    head, buffers = _wire(cand)
    sizes = sorted(memoryview(b).nbytes for b in buffers)
    assert [n for n in sizes if n >= 8 * V] == [8 * K * V]  # theta alone: no (P, V) array, no log theta
    assert len(head) + sum(sizes) < 8 * K * V + 40 * (K + P) + 2048

    sent = pickle.loads(head, buffers=buffers)  # what a shard holds: the rest rebuilt on arrival
    for name in ("coef_T", "ph_alpha", "ph_b", "live_a", "ph_a", "ph_parent", "theta_T", "ph_strength"):
        assert np.array_equal(getattr(sent, name), getattr(cand, name)), name
    assert sent.coef_T.flags.c_contiguous and sent.ph_alpha.flags.c_contiguous
    X = sp.csr_matrix(rng.poisson(0.05, size=(30, V)).astype(float) + np.eye(30, V))
    u = rng.random(X.shape[0])
    want = score_rows(X, cand, u)
    got = score_rows(X, sent, u)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    # candidates given their parameters whole travel whole
    whole = Candidates(DIRICHLET, cand.coef_T, cand.live_a, cand.live_b, cand.live_c, cand.ph_parent, cand.ph_a,
                       cand.ph_b, cand.ph_c, ph_alpha=alpha)
    assert [n for n in sorted(memoryview(b).nbytes for b in _wire(whole)[1]) if n >= 8 * V] == sorted(
        [8 * K * V, 8 * P * V])


def test_candidates_travel_as_their_parts_only_while_they_hold_what_the_parts_give():
    """Candidates travel as theta, the strengths and the floor only while coef_T and ph_alpha are
    the arrays built from them: candidates given other coefficients or parameters by
    ``dataclasses.replace`` travel whole, as they are (before, the receiver rebuilt them from
    theta, silently other than the sender's). A receiver's candidates, sent on, travel as parts
    again; the view of the caller's theta they hold is read-only, the caller's array is not."""
    import dataclasses

    rng = np.random.default_rng(0)
    K, V = 5, 300
    buffer = np.ascontiguousarray(rng.dirichlet(np.ones(V), size=K).T)  # (V, K), as the epoch sampler keeps it
    cand = Candidates.dirichlet(buffer.T, np.log(np.full(K, 1 / K)), np.array([0, 2, 2]), np.zeros(3),
                                np.array([1.0, 2.0, 3.0]), 0.01)
    assert np.shares_memory(cand.theta_T, buffer) and not cand.theta_T.flags.writeable and buffer.flags.writeable

    def wide(c):  # the arrays of V entries or more a pickle carries
        return sorted(n for n in (memoryview(b).nbytes for b in _wire(c)[1]) if n >= 8 * V)

    assert wide(cand) == [8 * K * V]
    other_coef = np.ascontiguousarray(np.log(rng.dirichlet(np.ones(V), size=K).T))
    other_alpha = np.ascontiguousarray(cand.ph_alpha * 2.0)
    for changed in (dataclasses.replace(cand, coef_T=other_coef), dataclasses.replace(cand, ph_alpha=other_alpha),
                    dataclasses.replace(cand, ph_floor=0.5)):
        back = pickle.loads(pickle.dumps(changed))
        for name in ("coef_T", "ph_alpha", "ph_b", "theta_T", "ph_strength"):
            assert np.array_equal(getattr(back, name), getattr(changed, name)), name
        assert back.ph_floor == changed.ph_floor and wide(changed) == sorted([8 * K * V] * 2 + [8 * 3 * V])
    sent = pickle.loads(pickle.dumps(cand))
    assert wide(sent) == [8 * K * V]  # rebuilt on arrival: sent on as its parts
    twice = pickle.loads(pickle.dumps(sent))
    assert np.array_equal(twice.coef_T, cand.coef_T) and np.array_equal(twice.ph_alpha, cand.ph_alpha)


def compositions(n, V):
    for cut in itertools.combinations(range(n + V - 1), V - 1):
        bars = (-1,) + cut + (n + V - 1,)
        yield [bars[i + 1] - bars[i] - 1 for i in range(V)]


def test_predictive_is_a_pmf_over_documents_of_each_length():
    rng = np.random.default_rng(2)
    V = 3
    topics = np.array([[0.8, 0.1, 0.1], [0.1, 0.1, 0.8]])
    X = sp.csr_matrix(np.array([rng.multinomial(5, topics[i % 2]) for i in range(40)], dtype=float))
    model = DTSSBP(likelihood="multinomial", kappa0=20.0, max_depth=2, n_sweeps=8, random_state=0).fit([X])
    for n in (1, 4):
        docs = sp.csr_matrix(np.array(list(compositions(n, V)), dtype=float))
        total = np.exp(model.score_samples(docs)).sum()
        assert total == pytest.approx(1.0, abs=1e-9), n


def hierarchical_dirichlet_epochs(rng, V=600, docs_per_node=50, drift=300.0):
    """Text from a planted 3-level tree of word distributions (not the model's own sampler).

    The root is a sparse Dirichlet draw; each child's distribution is Dir(c * parent + 0.01) with
    a concentration that grows with depth, so siblings share their parent's vocabulary and differ
    in emphasis. Epoch 1 redraws every node around its epoch-0 self (Dir(drift * phi)), drops one
    leaf and adds a new one. Documents have 40-120 tokens.
    """
    root = rng.dirichlet(np.full(V, 0.05))
    names, phis, parents = ["r"], [root], [None]
    for i in range(3):
        names.append(f"{i}")
        phis.append(rng.dirichlet(40.0 * root + 0.01))
        parents.append("r")
        for j in range(2):
            names.append(f"{i}{j}")
            phis.append(rng.dirichlet(150.0 * phis[-1 - j] + 0.01) if j == 0 else
                        rng.dirichlet(150.0 * phis[names.index(f"{i}")] + 0.01))
            parents.append(f"{i}")
    truth0 = dict(zip(names, phis))
    truth1 = {k: rng.dirichlet(drift * v + 0.01) for k, v in truth0.items() if k != "21"}
    truth1["12"] = rng.dirichlet(150.0 * truth0["1"] + 0.01)
    out = []
    for truth in (truth0, truth1):
        rows, labels = [], []
        for name, phi in truth.items():
            for _ in range(docs_per_node):
                rows.append(rng.multinomial(rng.integers(40, 121), phi))
                labels.append(name)
        perm = rng.permutation(len(rows))
        out.append((sp.csr_matrix(np.array(rows, dtype=float)[perm]), np.array(labels)[perm]))
    return out


def majority(labels, assigned):
    out = {}
    for name in np.unique(labels):
        ids, cnt = np.unique(assigned[labels == name], return_counts=True)
        out[str(name)] = int(ids[np.argmax(cnt)])
    return out


@pytest.mark.slow
def test_planted_hierarchical_dirichlet_tree_is_recovered():
    epochs = hierarchical_dirichlet_epochs(np.random.default_rng(11))
    model = DTSSBP(likelihood="multinomial", kappa0=100.0, max_depth=3, n_sweeps=40, random_state=0)
    majors = []
    for X, labels in epochs:
        tree = model.partial_fit(X).trees_[-1]
        ari = adjusted_rand_score(labels, tree.assignments)
        assert ari >= 0.8, (tree.epoch, ari, tree.n_nodes)
        majors.append(majority(labels, tree.assignments))
        # every true node's documents land together in one node of their own
        assert len(set(majors[-1].values())) == len(majors[-1])
    # the new leaf is a node born in epoch 1; the dead leaf's node receives nothing
    t1 = model.trees_[-1]
    assert t1.born[t1.index_of(majors[1]["12"])] == 1
    assert majors[0]["21"] not in set(t1.assignments.tolist())


def _documents_of(n_docs: int, tokens, seed: int = 0) -> sp.csr_matrix:
    """``n_docs`` documents over 50 terms, of ``tokens`` tokens each (a number, or one per document)."""
    rng = np.random.default_rng(seed)
    lengths = np.broadcast_to(tokens, (n_docs,))
    return sp.csr_matrix(np.stack([rng.multinomial(int(n), np.full(50, 1 / 50)) for n in lengths]).astype(float))


def test_fitting_very_short_documents_warns_with_what_to_do_at_the_callers_line():
    from streamtree.likelihoods.multinomial import SHORT_DOCUMENT_TOKENS, SHORT_WARNING_MIN_ROWS

    short = _documents_of(SHORT_WARNING_MIN_ROWS, SHORT_DOCUMENT_TOKENS - 1)
    with pytest.warns(UserWarning, match=f"median of fewer than {SHORT_DOCUMENT_TOKENS} tokens.*group short texts") \
            as caught:
        DTSSBP(n_sweeps=1, random_state=0).partial_fit(short)
    assert caught[0].filename == __file__  # the user's call, not the library's
    model = DTSSBP(n_sweeps=1, random_state=0).partial_fit(_documents_of(40, SHORT_DOCUMENT_TOKENS))
    with pytest.warns(UserWarning, match="fewer than"):  # a later epoch is checked too
        model.partial_fit(short)
    with pytest.warns(UserWarning, match="fewer than") as caught:  # and every epoch of fit()
        DTSSBP(n_sweeps=1, random_state=0).fit([_documents_of(40, 8), short])
    assert caught[0].filename == __file__
    # the median, not the mean: a few long documents do not hide many short ones
    skewed = _documents_of(41, [2] * 21 + [60] * 20)
    with pytest.warns(UserWarning, match="fewer than"):
        DTSSBP(n_sweeps=1, random_state=0).partial_fit(skewed)


@pytest.mark.parametrize("n_docs, tokens", [(40, 6), (40, 30), (19, 2), (41, [60] * 21 + [2] * 20)])
def test_documents_long_enough_or_too_few_to_judge_do_not_warn(n_docs, tokens, recwarn):
    model = DTSSBP(n_sweeps=1, random_state=0).partial_fit(_documents_of(n_docs, tokens))
    model.predict(_documents_of(40, 2, seed=1))  # scoring short documents is not fitting them
    assert not [w for w in recwarn.list if "tokens" in str(w.message)]


def test_a_rejected_epoch_and_other_families_do_not_warn(recwarn):
    from sklearn.preprocessing import normalize

    short = _documents_of(40, 3)
    model = DTSSBP(n_sweeps=1, random_state=0).partial_fit(_documents_of(40, 8), epoch=5)
    with pytest.raises(ValueError, match="not after"):
        model.partial_fit(short, epoch=5)
    DTSSBP(likelihood="vmf", n_sweeps=1, random_state=0).partial_fit(normalize(short))
    assert not [w for w in recwarn.list if "tokens" in str(w.message)]


def test_a_short_documents_warning_raised_as_an_error_leaves_the_estimator_unfitted():
    import warnings

    model = DTSSBP(n_sweeps=1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="fewer than"):
            model.partial_fit(_documents_of(40, 3))
    assert not hasattr(model, "state_") and not hasattr(model, "trees_")
    wider = sp.hstack([_documents_of(40, 8), _documents_of(40, 8, seed=1)], format="csr")  # 100 terms
    assert model.partial_fit(wider).n_features_in_ == 100
