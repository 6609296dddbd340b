"""The heat-bath merge of internal and carried nodes (``EpochSampler._merge_internal``).

A merge moves the node's past window documents to its parent and a lift moves its subtree's
past documents one level up, so the choice must be scored under the same stick prior as the
hyperparameter sampler's target, p(z_window | tree), which counts those documents. Scored
under p(z_now | z_past) instead, both changes were free for a carried subtree without current
documents: it was lifted at even odds every sweep, its past documents then stopped above the
depth limit, the sampled alpha0 collapsed and the streamed tree dissolved into new nodes.
Past documents never move: an internal node holding them is not lifted, and a carried leaf is
not merged (only its current documents may move to its parent), since its past documents would
move with no likelihood to weigh against the prior's gain (the window retires such a node).
Nodes born in this epoch are no candidates: the exact moves (split-merge with the subset
proposal, lifts) merge and remove them.
"""

import copy

import numpy as np
import pytest

from streamtree.inference.epoch_sampler import ChainState, EpochSampler, SamplerSettings
from streamtree.inference.hyper import log_hyper_likelihood

HYPER = dict(alpha0=16.0, lam=0.5, gamma=0.7)  # alpha(2) = 4


def _settings() -> SamplerSettings:
    return SamplerSettings(**HYPER, max_depth=3, root_holds_data=False, freeze_after_birth=False, n_sweeps=1,
                           n_map_iter=1, merge_moves=True, split_proposals=0, min_node_docs=2)


def _carried_chain() -> tuple[ChainState, tuple[int, int, int]]:
    """root -> a -> b -> c (c at the depth limit) with 2 past documents at c, none now, plus a
    live sibling branch root -> s holding past documents (so the root's children have a psi
    term)."""
    st = ChainState.empty(max_depth=3, window=2, n_features=1)
    a = st.tree.add_child(0)
    b = st.tree.add_child(a)
    c = st.tree.add_child(b)
    s = st.tree.add_child(0)
    for nid in (0, a, b, c, s):
        st.nodes.add(nid, np.zeros(1), 1.0)
    st.window.commit({c: 2, s: 3})
    st.hyper = dict(HYPER)
    return st, (a, b, c)


def _log_joint(tree, counts: dict[int, int], **hyper) -> float:
    arrays = tree.arrays()
    n = np.array([counts.get(int(i), 0) for i in arrays.ids], dtype=np.float64)
    return log_hyper_likelihood(arrays, n, **{**HYPER, **hyper}, max_depth=3, root_holds_data=False)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + np.exp(-x))


def _expected() -> dict[str, float]:
    """Probabilities of one pass's outcomes: c (a carried leaf without current documents) is no
    candidate (nothing to move: its past documents never move); b, internal without past documents, is lifted (c rising to
    depth 2) with the logistic of the windowed log-odds; a and s are no candidates (their parent
    is the root, which holds no data)."""
    st, (a, b, c) = _carried_chain()
    past = st.window.total
    base = _log_joint(st.tree, past)
    t_b = copy.deepcopy(st.tree)
    t_b.merge_into_parent(b)
    p_b = _sigmoid(_log_joint(t_b, past) - base)
    return {"c into b": 0.0, "c, b into a": 0.0, "b lifted": p_b, "kept": 1.0 - p_b}


def test_windowed_odds_of_a_carried_chain_are_not_even():
    # b's stay-stick Beta(1, alpha(2)) and c's psi stick Beta(1, gamma): two past documents
    # stopping at b (or at c lifted to depth 2) by choice against passing b to stop at c (at
    # the depth limit, forced): odds (gamma + 1)(gamma + 2) / (alpha(2) (alpha(2) + 1)), not 1
    st, (a, b, c) = _carried_chain()
    base = _log_joint(st.tree, st.window.total)
    lifted = copy.deepcopy(st.tree)
    lifted.merge_into_parent(b)
    g, al = HYPER["gamma"], 4.0
    odds = (g + 1) * (g + 2) / (al * (al + 1))
    assert _log_joint(lifted, st.window.total) - base == pytest.approx(np.log(odds))
    merged = copy.deepcopy(st.tree)
    merged.merge_into_parent(c)
    assert _log_joint(merged, {b: 2, st.tree.children[0][1]: 3}) - base == pytest.approx(np.log(odds))


def test_heat_bath_merge_follows_the_windowed_prior_odds():
    expected = _expected()
    n_trials = 1500
    seen = dict.fromkeys(expected, 0)
    for seed in range(n_trials):
        st, (a, b, c) = _carried_chain()
        sampler = EpochSampler(st, likelihood=None, settings=_settings(), sweeper=None,
                               rng=np.random.default_rng(seed))
        sampler.prev_slot = dict(st.nodes.slot)  # carried from the previous epoch
        sampler._merge_internal({}, {}, {}, 0)
        s = st.tree.children[0][-1]
        if c not in st.tree and b in st.tree:
            assert st.window.total == {b: 2, s: 3}
            seen["c into b"] += 1
        elif c not in st.tree:
            assert st.window.total == {a: 2, s: 3}
            seen["c, b into a"] += 1
        elif b not in st.tree:
            assert st.tree.parent[c] == a and st.tree.depth[c] == 2
            seen["b lifted"] += 1
        else:
            seen["kept"] += 1
    for outcome, p in expected.items():
        if p == 0.0:
            assert seen[outcome] == 0, (outcome, seen)
            continue
        sd = np.sqrt(n_trials * p * (1 - p))
        assert abs(seen[outcome] - n_trials * p) < 4.5 * sd, (outcome, seen, expected)


def _line(past_b: int, past_c: int) -> tuple[ChainState, tuple[int, int, int]]:
    """root -> a -> b -> c with ``past_b`` and ``past_c`` past documents at b and c."""
    st = ChainState.empty(max_depth=3, window=2, n_features=1)
    a = st.tree.add_child(0)
    b = st.tree.add_child(a)
    c = st.tree.add_child(b)
    for nid in (0, a, b, c):
        st.nodes.add(nid, np.zeros(1), 1.0)
    st.window.commit({k: v for k, v in ((b, past_b), (c, past_c)) if v})
    return st, (a, b, c)


def test_internal_node_holding_past_documents_is_not_lifted():
    # root -> a -> b (5 past documents) -> c (2 past): lifting b would move its past documents
    # to a unscored by any likelihood while c rises; the windowed prior alone favours it here
    st, (a, b, c) = _line(5, 2)
    st.hyper = dict(HYPER, alpha0=0.5)
    lifted = copy.deepcopy(st.tree)
    lifted.merge_into_parent(b)
    arrays = st.tree.arrays()
    kw = dict(HYPER, alpha0=0.5, max_depth=3, root_holds_data=False)
    odds = (log_hyper_likelihood(lifted.arrays(), np.array([0, 5, 2], dtype=float), **kw)
            - log_hyper_likelihood(arrays, np.array([0, 0, 5, 2], dtype=float), **kw))
    assert odds > 1.0
    for seed in range(100):
        state = copy.deepcopy(st)
        sampler = EpochSampler(state, likelihood=None, settings=_settings(), sweeper=None,
                               rng=np.random.default_rng(seed))
        sampler.prev_slot = dict(state.nodes.slot)  # carried from the previous epoch
        sampler._merge_internal({}, {}, {}, 0)
        assert b in state.tree and state.window.total[b] == 5


def test_empty_new_internal_node_is_left_to_the_exact_lifts():
    # the chain of the tests above, born in this epoch: b (internal, empty) is no candidate
    expected = _expected()
    st, (a, b, c) = _carried_chain()
    lifted = 0
    for seed in range(300):
        state = copy.deepcopy(st)
        sampler = EpochSampler(state, likelihood=None, settings=_settings(), sweeper=None,
                               rng=np.random.default_rng(seed))
        sampler.prev_slot = {c: state.nodes.slot[c]}  # only the leaf with past documents is carried
        sampler._merge_internal({}, {}, {}, 0)
        lifted += b not in state.tree and c in state.tree
    assert expected["b lifted"] > 0.05 and lifted == 0


def test_new_internal_node_with_documents_is_left_to_the_exact_moves():
    # root -> a -> b -> c, all born in this epoch, b holding 2 current documents that its
    # parent explains far better (+20 nats): carried, b would be merged nearly always; new, it
    # is no candidate (the subset proposal's merges join such a node exactly)
    st, (a, b, c) = _line(0, 0)
    st.hyper = dict(HYPER)
    merged = {True: 0, False: 0}
    for carried in (True, False):
        for seed in range(50):
            state = copy.deepcopy(st)
            sampler = EpochSampler(state, likelihood=_FixedBayesFactor(20.0, 0.0), settings=_settings(),
                                   sweeper=None, rng=np.random.default_rng(seed))
            if carried:
                sampler.prev_slot = dict(state.nodes.slot)
                sampler.prev_theta = state.nodes.theta.copy()
            sampler.labels_now = np.array([b, b])
            sampler._merge_internal({b: 2}, {b: np.zeros(1)}, {b: 0.0}, 0)
            merged[carried] += b not in state.tree
    assert merged[True] >= 45 and merged[False] == 0


def _carried_leaf_chain():
    """root -> a -> b (1 past document) -> c (6 past), and root -> s (3 past)."""
    st = ChainState.empty(max_depth=3, window=2, n_features=1)
    a = st.tree.add_child(0)
    b = st.tree.add_child(a)
    c = st.tree.add_child(b)
    s = st.tree.add_child(0)
    for nid in (0, a, b, c, s):
        st.nodes.add(nid, np.zeros(1), 1.0)
    st.window.commit({b: 1, c: 6, s: 3})
    return st, (a, b, c, s)


def test_carried_leaf_is_not_merged_into_its_parent():
    # root -> a -> b (1 past document) -> c (6 past, none now) and a live branch root -> s:
    # merging the carried leaf c would gather its past documents at b, which the windowed prior
    # alone favours (small alpha0); with no likelihood for them the merge is not made
    # (under small epochs the old retirement of such leaves, compounding with a falling
    # alpha0, ended SOU years as the root alone)
    st, (a, b, c, s) = _carried_leaf_chain()
    st.hyper = dict(HYPER, alpha0=0.2)
    merged = copy.deepcopy(st.tree)
    merged.merge_into_parent(c)
    odds = (_log_joint(merged, {b: 7, s: 3}, alpha0=0.2) - _log_joint(st.tree, {b: 1, c: 6, s: 3}, alpha0=0.2))
    assert odds > 1.0
    for seed in range(100):
        state = copy.deepcopy(st)
        sampler = EpochSampler(state, likelihood=None, settings=_settings(), sweeper=None,
                               rng=np.random.default_rng(seed))
        sampler.prev_slot = dict(state.nodes.slot)  # carried from the previous epoch
        sampler._merge_internal({}, {}, {}, 0)
        assert c in state.tree and state.window.total[c] == 6 and state.window.total[b] == 1


class _FixedBayesFactor:
    """A likelihood stub whose documents score ``log_at_parent`` at the parent and
    ``log_at_own`` at their own node, so the heat-bath odds are known exactly."""

    def __init__(self, log_at_parent: float, log_at_own: float) -> None:
        self.log_at_parent, self.log_at_own = log_at_parent, log_at_own

    def log_likelihood(self, docs, theta, concentration):
        return self.log_at_parent

    def log_marginal(self, docs, theta, concentration, depth, theta_prev=None):
        return self.log_at_own


def test_carried_leaf_hands_its_current_documents_to_its_parent_at_the_heat_bath_odds():
    # c holds 6 past and 2 current documents: the choice moves the 2 current ones to b (the
    # tree and c's past documents stay), with probability logistic(data + prior ratio)
    st, (a, b, c, s) = _carried_leaf_chain()
    st.hyper = dict(HYPER)
    data = 2.5
    prior = (_log_joint(st.tree, {b: 3, c: 6, s: 3}) - _log_joint(st.tree, {b: 1, c: 8, s: 3}))
    p_move = _sigmoid(data + prior)
    n_trials, moved = 1500, 0
    for seed in range(n_trials):
        state = copy.deepcopy(st)
        sampler = EpochSampler(state, likelihood=_FixedBayesFactor(data, 0.0), settings=_settings(), sweeper=None,
                               rng=np.random.default_rng(seed))
        sampler.prev_slot = dict(state.nodes.slot)  # carried from the previous epoch
        sampler.prev_theta = state.nodes.theta.copy()
        sampler.labels_now = np.array([c, c])
        current, sums, sumsq = {c: 2}, {c: np.zeros(1)}, {c: 0.0}
        sampler._merge_internal(current, sums, sumsq, 0)
        assert c in state.tree and state.tree.parent[c] == b
        assert state.window.total == {b: 1, c: 6, s: 3}
        if current == {b: 2}:
            assert sampler.labels_now.tolist() == [b, b] and b in sums and c not in sums
            assert not sampler.moves  # no node merged: c lives on with its past documents
            moved += 1
        else:
            assert current == {c: 2}
    sd = np.sqrt(n_trials * p_move * (1 - p_move))
    assert 0.05 < p_move < 0.95
    assert abs(moved - n_trials * p_move) < 4.5 * sd, (moved, n_trials * p_move)
