"""How many split-merge attempts ``split_proposals="auto"`` makes per sweep, and that a tiny
epoch still finds its planted groups with one attempt per document."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import adjusted_rand_score

from streamtree.inference.epoch_sampler import (
    DOCS_PER_SPLIT_ATTEMPT,
    GROWTH_SWEEPS,
    MIN_SPLIT_ATTEMPTS,
    SETTLED_SPLIT_PROPOSALS,
    SPLIT_ATTEMPTS_PER_DOC,
    SPLIT_PROPOSALS,
    SamplerSettings,
)
from streamtree.model import DTSSBP


def _settings(split_proposals) -> SamplerSettings:
    return SamplerSettings(alpha0=1.0, lam=0.5, gamma=1.0, max_depth=3, root_holds_data=False,
                           freeze_after_birth=False, n_sweeps=50, n_map_iter=1, merge_moves=True,
                           split_proposals=split_proposals, min_node_docs=2)


def test_auto_attempts_scale_with_small_epochs_and_keep_the_floor_from_50_documents():
    auto = _settings("auto")
    floor_from = MIN_SPLIT_ATTEMPTS // SPLIT_ATTEMPTS_PER_DOC
    for n in (0, 1, 4, 17, floor_from - 1):
        assert auto.split_attempts(n) == SPLIT_ATTEMPTS_PER_DOC * n
    for n in (floor_from, 500, 4_999, 5_000, 5_001, 50_000):  # the rule before the cap, unchanged
        assert auto.split_attempts(n) == max(MIN_SPLIT_ATTEMPTS, -(-n // DOCS_PER_SPLIT_ATTEMPT))
    assert auto.split_attempts(500) == MIN_SPLIT_ATTEMPTS and auto.split_attempts(5_001) == 51
    assert _settings(7).split_attempts(4) == 7 and _settings(0).split_attempts(10_000) == 0
    # a growing first tree makes at least its factor times the fewest attempts, up to one per
    # document; a large epoch's usual number already holds them; a number the user gave stays
    assert auto.split_attempts(5_000, 5) == 5 * MIN_SPLIT_ATTEMPTS and auto.split_attempts(20_000, 5) == 250
    assert auto.split_attempts(50_000, 5) == auto.split_attempts(50_000) == 500
    assert auto.split_attempts(60, 5) == 60 and auto.split_attempts(17, 5) == 17
    for n in (0, 17, 60, 249, 5_000, 24_901, 50_000):  # a factor of 1: the usual rule
        assert auto.split_attempts(n, 1) == max(min(MIN_SPLIT_ATTEMPTS, n), -(-n // DOCS_PER_SPLIT_ATTEMPT))
    assert _settings(7).split_attempts(4, 5) == 7


def test_a_chain_grows_its_first_tree_with_the_familys_extra_attempts(monkeypatch):
    """The split-merge attempts of each sweep: the grown number (the family's
    ``growth_attempts`` times the fewest) in the first ``GROWTH_SWEEPS`` sweeps of the chain's
    first epoch, the usual number after them and in every sweep of the next epoch (whose tree
    is carried, not grown)."""
    from streamtree.inference.epoch_sampler import EpochSampler
    from streamtree.inference.split_merge import SplitMerge
    from streamtree.likelihoods.vmf import VonMisesFisher

    per_sweep: list[tuple[bool, int]] = []
    attempt = SplitMerge.attempt

    def counted(self, st, rng, **kw):
        sampler = counted.sampler
        key = (bool(sampler.prev_slot), sampler.sweep)
        if not per_sweep or per_sweep[-1][0] != key:
            per_sweep.append([key, 0])
        per_sweep[-1][1] += 1
        return attempt(self, st, rng, **kw)

    split_merge = EpochSampler._split_merge

    def tracked(self, *a, **kw):
        counted.sampler = self
        return split_merge(self, *a, **kw)

    monkeypatch.setattr(SplitMerge, "attempt", counted)
    monkeypatch.setattr(EpochSampler, "_split_merge", tracked)
    rng = np.random.default_rng(0)
    X = np.abs(rng.standard_normal((600, 20)))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    n_sweeps = GROWTH_SWEEPS + 3
    m = DTSSBP(likelihood="vmf", n_sweeps=n_sweeps, random_state=0)
    m.partial_fit(X).partial_fit(X)
    usual = _settings("auto").split_attempts(600)
    grown = _settings("auto").split_attempts(600, VonMisesFisher.growth_attempts)
    growth = VonMisesFisher.growth_attempts
    assert growth > 1
    from streamtree.likelihoods.gaussian import Gaussian
    from streamtree.likelihoods.multinomial import Multinomial
    assert Multinomial.growth_attempts == Gaussian.growth_attempts == 1  # their moves go on being accepted
    by_sweep = {key: n for key, n in per_sweep}
    # an attempt with each split proposal of the sweep (more once the epoch has settled)
    proposals = [len(SPLIT_PROPOSALS if s < n_sweeps // 2 else SETTLED_SPLIT_PROPOSALS) for s in range(n_sweeps)]
    assert grown == growth * usual  # 250 of 600 documents
    assert [by_sweep[(False, s)] for s in range(n_sweeps)] == [
        (grown if s < GROWTH_SWEEPS else usual) * proposals[s] for s in range(n_sweeps)]
    assert [by_sweep[(True, s)] for s in range(n_sweeps)] == [usual * proposals[s] for s in range(n_sweeps)]


def test_a_tiny_epoch_still_finds_its_planted_groups():
    """Three well-separated Gaussian groups of 6 points (18 attempts per sweep instead of 50):
    the trees are neither root-only nor a swarm of nodes holding documents (without the moves
    two of these four seeds end with 8-9 of them), and those nodes are the groups."""
    aris = []
    for seed in range(4):
        rng = np.random.default_rng(seed)
        centres = np.array([[-6.0, 0.0], [6.0, 0.0], [0.0, 8.0]])
        truth = np.repeat(np.arange(3), 6)
        X = centres[truth] + 0.5 * rng.standard_normal((truth.size, 2))
        m = DTSSBP(likelihood="gaussian", window=1, max_depth=3, sigma0=25.0, sigma1=0.5, eta=0.5,
                   noise_var=0.25, n_sweeps=40, random_state=seed).partial_fit(X)
        tree = m.trees_[-1]
        holding = int((tree.counts > 0).sum())
        assert 3 <= holding <= 5, (seed, tree.assignments)  # the 3 groups, at most 2 strays
        # Empty internal nodes are states of the exact lifts' target: allow a holding node a chain
        # of them up to the depth cap, but no empty node without documents below it
        assert tree.n_occupied == tree.n_nodes <= 1 + 3 * holding, (seed, tree.node_ids, tree.parent)
        aris.append(adjusted_rand_score(truth, tree.assignments))
    assert np.mean(aris) >= 0.85, aris
