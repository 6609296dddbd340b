"""The heat-bath merge of internal and carried nodes (``EpochSampler._merge_internal``).

A merge moves the node's past window documents to its parent and a lift moves its subtree's
past documents one level up, so the choice must be scored under the same stick prior as the
hyperparameter sampler's target, p(z_window | tree), which counts those documents. Scored
under p(z_now | z_past) instead, both changes were free for a carried subtree without current
documents: it was lifted at even odds every sweep, its past documents then stopped above the
depth limit, the sampled alpha0 collapsed and the streamed tree dissolved into new nodes.
An internal node holding past documents is not lifted at all: its past documents would move to
the parent with no likelihood to weigh against the prior's gain. An empty internal node born in
this epoch is no candidate either: the exact lifts of the split-merge moves remove it.
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


def _log_joint(tree, counts: dict[int, int]) -> float:
    arrays = tree.arrays()
    n = np.array([counts.get(int(i), 0) for i in arrays.ids], dtype=np.float64)
    return log_hyper_likelihood(arrays, n, **HYPER, max_depth=3, root_holds_data=False)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + np.exp(-x))


def _expected() -> dict[str, float]:
    """Probabilities of one pass's outcomes, in its order (deepest first): c (a carried leaf)
    merges into b with the logistic of the windowed log-odds; then b, a leaf holding c's past
    documents if c merged, merges into a likewise, or, if c was kept, is lifted (c rising to
    depth 2); a and s are no candidates (their parent is the root, which holds no data)."""
    st, (a, b, c) = _carried_chain()
    past = st.window.total
    s = st.tree.children[0][1]
    base = _log_joint(st.tree, past)
    t_c = copy.deepcopy(st.tree)
    t_c.merge_into_parent(c)
    p_c = _sigmoid(_log_joint(t_c, {b: 2, s: 3}) - base)
    t_cb = copy.deepcopy(t_c)
    t_cb.merge_into_parent(b)
    p_cb = _sigmoid(_log_joint(t_cb, {a: 2, s: 3}) - _log_joint(t_c, {b: 2, s: 3}))
    t_b = copy.deepcopy(st.tree)
    t_b.merge_into_parent(b)
    p_b = _sigmoid(_log_joint(t_b, past) - base)
    return {"c into b": p_c * (1 - p_cb), "c, b into a": p_c * p_cb, "b lifted": (1 - p_c) * p_b,
            "kept": (1 - p_c) * (1 - p_b)}


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
        sampler._merge_internal({}, {}, {})
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
        sd = np.sqrt(n_trials * p * (1 - p))
        assert abs(seen[outcome] - n_trials * p) < 4.5 * sd, (outcome, seen, expected)


def test_internal_node_holding_past_documents_is_not_lifted():
    # root -> a -> b (5 past documents) -> c (2 past): lifting b would move its past documents
    # to a unscored by any likelihood while c rises; the windowed prior alone favours it here
    st = ChainState.empty(max_depth=3, window=2, n_features=1)
    a = st.tree.add_child(0)
    b = st.tree.add_child(a)
    c = st.tree.add_child(b)
    for nid in (0, a, b, c):
        st.nodes.add(nid, np.zeros(1), 1.0)
    st.window.commit({b: 5, c: 2})
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
        sampler.born_sweep[c] = sampler.sweep  # c too young to retire: b stays internal
        sampler._merge_internal({}, {}, {})
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
        sampler._merge_internal({}, {}, {})
        lifted += b not in state.tree and c in state.tree
    assert expected["b lifted"] > 0.05 and lifted == 0
