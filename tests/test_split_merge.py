"""The split-merge moves leave their target invariant: checked by enumeration on tiny cases.

States: the documents' nodes, where fixed nodes (with past window counts and given parameters)
may hold documents and every fixed node below the depth cap has an ordered list of newborn
leaves at the depth cap. A newborn leaf's parameter is part of the state; its marginal target
integrates it out under the parent link. Draw assignments from that exact marginal and the
newborn parameters from their conditionals, apply split-merge attempts, and compare the
distribution of the resulting assignments with the target by a chi-square test.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import chi2

from streamtree.inference.merge import collapsed_log_prior
from streamtree.inference.split_merge import MoveState, SplitMerge
from streamtree.likelihoods.base import DocumentSet
from streamtree.likelihoods.multinomial import Multinomial
from streamtree.likelihoods.vmf import VonMisesFisher
from streamtree.tree import ROOT, TSSBTree
from streamtree.variants import resolve_variant


def _unit(v):
    v = np.asarray(v, dtype=float)
    return v / np.linalg.norm(v)


class Case:
    """Fixed nodes ``fixed_parent`` (id -> parent id, root first) with parameters and past counts."""

    def __init__(self, lik, X, fixed_parent, theta, conc, past, max_depth, kw):
        self.lik, self.X, self.fixed_parent, self.theta, self.conc = lik, X, fixed_parent, theta, conc
        self.past, self.max_depth, self.kw = past, max_depth, kw
        self.n = X.shape[0]
        base = self._fixed_tree()
        self.hosts = [f for f in fixed_parent if not base.at_cap(f)]
        # a slot is ("f", node) or ("c", host, k): k-th newborn leaf under host
        slots = [("f", f) for f in fixed_parent if f != ROOT or kw["root_holds_data"]]
        slots += [("c", h, k) for h in self.hosts for k in range(self.n)]
        self.fixed_kids = {h: [c for c in base.children[h]] for h in self.hosts}
        self.states = []
        for combo in itertools.product(range(len(slots)), repeat=self.n):
            used = {}
            for s in combo:
                if slots[s][0] == "c":
                    used.setdefault(slots[s][1], set()).add(slots[s][2])
            if not all(u == set(range(len(u))) for u in used.values()):
                continue
            # every interleaving of each host's fixed children with its newborn ones
            per_host = []
            for h in self.hosts:
                m, f = len(used.get(h, ())), len(self.fixed_kids[h])
                per_host.append(list(itertools.combinations(range(m + f), f)))
            for orders in itertools.product(*per_host):
                self.states.append((tuple(slots[s] for s in combo), orders))
        self.index = {s: k for k, s in enumerate(self.states)}
        self.logp = np.array([self.log_target(s) for s in self.states])

    def _fixed_tree(self):
        t = TSSBTree(self.max_depth)
        for f, par in self.fixed_parent.items():
            if f == ROOT:
                continue
            nid = t.add_child(par)
            assert nid == f
        return t

    def build(self, state):
        combo, orders = state
        tree = self._fixed_tree()
        ids = {}
        for h, order in zip(self.hosts, orders):
            m = sum(1 for s in set(combo) if s[0] == "c" and s[1] == h)
            for k in range(m):
                ids[("c", h, k)] = tree.add_child(h, born=1)
            newborn = [ids[("c", h, k)] for k in range(m)]
            fixed = list(self.fixed_kids[h])
            seq = []
            for pos in range(m + len(fixed)):
                seq.append(fixed.pop(0) if pos in order else newborn.pop(0))
            tree.children[h] = seq
        labels = np.array([s[1] if s[0] == "f" else ids[s] for s in combo], dtype=np.int64)
        return tree, labels

    def canonical(self, tree, labels):
        orders = tuple(tuple(k for k, c in enumerate(tree.children[h]) if c in self.fixed_parent)
                       for h in self.hosts)
        return self._combo(tree, labels), orders

    def _combo(self, tree, labels):
        out = []
        for nid in labels.tolist():
            if nid in self.fixed_parent:
                out.append(("f", nid))
            else:
                h = tree.parent[nid]
                out.append(("c", h, [c for c in tree.children[h] if c not in self.fixed_parent].index(nid)))
        return tuple(out)

    def log_target(self, state):
        tree, labels = self.build(state)
        arr = tree.arrays()
        now = np.array([np.sum(labels == i) for i in arr.ids], dtype=float)
        past = np.array([self.past.get(int(i), 0) for i in arr.ids], dtype=float)
        out = collapsed_log_prior(arr, past, now, **self.kw)
        for nid in np.unique(labels):
            rows = np.flatnonzero(labels == nid)
            sub = self.X[rows]
            docs = DocumentSet(float(rows.size), np.asarray(sub.sum(axis=0)).ravel(), float(sub.multiply(sub).sum()))
            if nid in self.fixed_parent:
                out += self.lik.log_likelihood(docs, self.theta[nid], self.conc[nid])
            else:
                par = tree.parent[nid]
                d = tree.depth[nid]
                out += self.lik.log_marginal(docs, self.theta[par], self.lik.new_node_concentration(self.conc[par], d), d)
        return out

    def move_state(self, state, rng):
        tree, labels = self.build(state)
        theta = dict(self.theta)
        conc = dict(self.conc)
        for nid in tree.parent:
            if nid not in theta:  # a newborn leaf: its parameter from its conditional
                par, d = tree.parent[nid], tree.depth[nid]
                rows = np.flatnonzero(labels == nid)
                sub = self.X[rows]
                docs = DocumentSet(float(rows.size), np.asarray(sub.sum(axis=0)).ravel(),
                                   float(sub.multiply(sub).sum()))
                conc[nid] = self.lik.new_node_concentration(self.conc[par], d)
                theta[nid] = self.lik.sample_node_theta(self.theta[par], conc[nid], d, docs, rng)
        return MoveState(tree, labels, self.X, dict(self.past), theta, conc)


def _check_invariance(case: Case, n_draws: int, n_attempts: int, seed: int) -> tuple[float, int]:
    rng = np.random.default_rng(seed)
    p = np.exp(case.logp - case.logp.max())
    p /= p.sum()
    moves = SplitMerge(case.lik, case.kw)
    starts = rng.choice(len(case.states), size=n_draws, p=p)
    hist = np.zeros(len(case.states))
    accepted = 0
    for s in starts:
        st = case.move_state(case.states[s], rng)
        for _ in range(n_attempts):
            accepted += moves.attempt(st, rng, born=1) is not None
        hist[case.index[case.canonical(st.tree, st.labels)]] += 1
    expected = p * n_draws
    keep = expected >= 5
    obs = np.append(hist[keep], hist[~keep].sum())
    exp_ = np.append(expected[keep], expected[~keep].sum())
    stat = float(np.sum((obs - exp_) ** 2 / exp_))
    pval = float(chi2.sf(stat, df=obs.size - 1))
    return pval, accepted


def _vmf_case(max_depth, fixed_parent, past, root_holds_data=True):
    variant = resolve_variant("dtssbp", window=2, max_depth=max_depth, gamma=0.5, xi=0.001)
    lik = VonMisesFisher(variant, 3, kappa0=3.0, kappa1=1.0, a=0.0, min_node_docs=2,
                         concentration_bounds=(1e-3, 1e6))
    X = sp.csr_matrix(np.array([_unit([1, 0.2, 0]), _unit([0.9, 0, 0.3]), _unit([0, 1, 0.1]),
                                _unit([0.1, 0.9, -0.2])])[: 4 if len(fixed_parent) == 1 else 3])
    theta = {f: _unit([1, 0.3 * f, 0.1]) for f in fixed_parent}
    conc = {f: 4.0 for f in fixed_parent}
    kw = dict(alpha0=1.0, lam=0.5, gamma=0.7, max_depth=max_depth, root_holds_data=root_holds_data)
    return Case(lik, X, fixed_parent, theta, conc, past, max_depth, kw)


def test_moves_keep_the_target_root_and_newborn_children():
    """Depth cap 1: splits creating a child of the root or a sibling of a newborn node, merges
    into the root and of siblings."""
    case = _vmf_case(1, {ROOT: -1}, {ROOT: 3})
    pval, accepted = _check_invariance(case, n_draws=3000, n_attempts=3, seed=1)
    assert accepted > 500  # the moves do move
    assert pval > 1e-3


def test_moves_keep_the_target_with_a_kept_child():
    """A kept child (past counts) that moves may empty and refill, beside newborn siblings."""
    case = _vmf_case(1, {ROOT: -1, 1: ROOT}, {ROOT: 2, 1: 2})
    pval, accepted = _check_invariance(case, n_draws=3000, n_attempts=3, seed=2)
    assert accepted > 250
    assert pval > 1e-3


def test_moves_keep_the_target_multinomial_without_root_data():
    variant = resolve_variant("dtssbp", window=2, max_depth=1, gamma=0.5, xi=0.001)
    lik = Multinomial(variant, 4, kappa0=5.0, kappa1=1.0, a=0.0, min_node_docs=2)
    X = sp.csr_matrix(np.array([[3, 1, 0, 0], [2, 0, 1, 0], [0, 0, 2, 3]], dtype=float))
    fixed = {ROOT: -1, 1: ROOT}
    theta = {ROOT: np.array([0.4, 0.3, 0.2, 0.1]), 1: np.array([0.1, 0.2, 0.3, 0.4])}
    conc = {ROOT: 5.0, 1: 5.0}
    kw = dict(alpha0=1.0, lam=0.5, gamma=0.7, max_depth=1, root_holds_data=False)
    case = Case(lik, X, fixed, theta, conc, {ROOT: 0, 1: 3}, 1, kw)
    pval, accepted = _check_invariance(case, n_draws=3000, n_attempts=3, seed=3)
    assert accepted > 250
    assert pval > 1e-3


def test_a_chi_square_check_detects_a_wrong_acceptance(monkeypatch):
    """The check has power: dropping the proposal ratio breaks invariance and is detected."""
    case = _vmf_case(1, {ROOT: -1}, {ROOT: 3})
    monkeypatch.setattr(SplitMerge, "_log_q", staticmethod(lambda lo, to_new: 0.0))
    pval, _ = _check_invariance(case, n_draws=3000, n_attempts=3, seed=1)
    assert pval < 1e-3


def test_relocation_keeps_the_target():
    """A new node moved between parents and positions (reversible jump): enumerate its places."""
    variant = resolve_variant("dtssbp", window=2, max_depth=2, gamma=0.5, xi=0.001)
    lik = VonMisesFisher(variant, 3, kappa0=3.0, kappa1=0.7, a=0.0, min_node_docs=2,
                         concentration_bounds=(1e-3, 1e6))
    X = sp.csr_matrix(np.array([_unit([1, 0.2, 0]), _unit([0.9, 0, 0.3]), _unit([0, 1, 0.1]), _unit([0.1, 0.9, -0.2])]))
    theta = {ROOT: _unit([0, 1, 0]), 1: _unit([1, 0.1, 0])}
    conc = {ROOT: 4.0, 1: 4.0}
    past = {ROOT: 2, 1: 3}
    kw = dict(alpha0=1.0, lam=0.5, gamma=0.7, max_depth=2, root_holds_data=True)
    places = [(ROOT, 0), (ROOT, 1), (1, 0)]

    def build(place):
        t = TSSBTree(2)
        t.add_child(ROOT)
        b = t.add_child(place[0], born=1, position=place[1])
        labels = np.array([b, b, ROOT, 1])
        return t, labels, b

    def log_target(place):
        t, labels, b = build(place)
        arr = t.arrays()
        now = np.array([np.sum(labels == i) for i in arr.ids], dtype=float)
        pst = np.array([past.get(int(i), 0) for i in arr.ids], dtype=float)
        sub = X[:2]
        docs = DocumentSet(2.0, np.asarray(sub.sum(axis=0)).ravel(), 2.0)
        d = t.depth[b]
        return collapsed_log_prior(arr, pst, now, **kw) + lik.log_marginal(docs, theta[place[0]], conc[place[0]], d)

    logp = np.array([log_target(pl) for pl in places])
    p = np.exp(logp - logp.max())
    p /= p.sum()
    rng = np.random.default_rng(5)
    moves = SplitMerge(lik, kw)
    hist = np.zeros(3)
    accepted = 0
    n_draws = 4000
    for s in rng.choice(3, size=n_draws, p=p):
        t, labels, b = build(places[s])
        st = MoveState(t, labels, X, dict(past), dict(theta) | {b: _unit([1, 1, 1])}, dict(conc) | {b: 4.0})
        for _ in range(2):
            accepted += moves.relocate(st, rng) is not None
        par = t.parent[b]
        hist[places.index((par, t.children[par].index(b)))] += 1
    assert accepted > 500
    stat = float(np.sum((hist - p * n_draws) ** 2 / (p * n_draws)))
    assert chi2.sf(stat, df=2) > 1e-3


def test_the_move_index_follows_accepted_moves():
    """The per-node rows and collapsed-prior counts kept across attempts equal a fresh rebuild,
    and each accepted move's prior difference equals the full prior's."""
    from streamtree.inference.merge import CollapsedPrior
    from streamtree.inference.split_merge import DocumentIndex

    variant = resolve_variant("dtssbp", window=2, max_depth=3, gamma=0.5, xi=0.001)
    lik = VonMisesFisher(variant, 3, kappa0=3.0, kappa1=1.0, a=0.0, min_node_docs=2,
                         concentration_bounds=(1e-3, 1e6))
    rng = np.random.default_rng(11)
    X = sp.csr_matrix(np.array([_unit(v) for v in rng.normal(size=(40, 3))]))
    tree = TSSBTree(3)
    kept = tree.add_child(ROOT)
    labels = rng.choice([ROOT, kept], size=40)
    theta = {ROOT: _unit([1, 0, 0]), kept: _unit([0, 1, 0])}
    conc = {ROOT: 4.0, kept: 4.0}
    kw = dict(alpha0=1.0, lam=0.5, gamma=0.7, max_depth=3, root_holds_data=True)
    st = MoveState(tree, labels, X, {ROOT: 5, kept: 3}, theta, conc)
    moves = SplitMerge(lik, kw)

    def full():
        arr = st.tree.arrays()
        now = np.array([np.sum(st.labels == i) for i in arr.ids], dtype=float)
        past = np.array([st.past.get(int(i), 0) for i in arr.ids], dtype=float)
        return collapsed_log_prior(arr, past, now, **kw)

    kinds = set()
    for _ in range(300):
        moved = moves.relocate(st, rng) if rng.random() < 0.5 else moves.attempt(st, rng, born=1)
        if moved is None:
            continue
        kinds.add(moved.kind)
        idx = moves.index(st)
        fresh = DocumentIndex(st)
        assert idx.rows.keys() == fresh.rows.keys()
        assert all(np.array_equal(idx.rows[k], fresh.rows[k]) for k in idx.rows)
        again = CollapsedPrior(st.tree, st.past, fresh.counts())
        assert idx.prior.own == again.own and idx.prior.sub == again.sub
        assert idx.preorder() == st.tree.preorder()
    assert kinds == {"split", "merge", "relocate"}
    # a prior difference read from the kept index matches two full evaluations
    before = full()
    a = int(st.labels[0])
    b = next(c for c in st.tree.parent if c != a)
    edit = moves.index(st).prior.edit()
    edit.move(a, b, 0.0, float(np.sum(st.labels == a)))
    delta = moves.index(st).prior.delta(edit, **kw)
    st.labels[st.labels == a] = b
    assert delta == pytest.approx(full() - before, abs=1e-10)


@pytest.mark.parametrize("fmt", ["csr", "csr32", "csr_int", "csc", "dense"])
def test_document_set_reads_any_input_without_changing_it(fmt):
    from streamtree.inference.split_merge import document_set

    X = sp.random(50, 30, density=0.2, format="csr", random_state=1)
    M = {"csr": X, "csr32": X.astype(np.float32), "csr_int": (X * 10).astype(np.int64).tocsr(),
         "csc": X.tocsc(), "dense": X.toarray()}[fmt]
    rows = np.array([9, 3, 7])
    d = document_set(M, rows)
    sub = np.asarray(M[rows].toarray() if sp.issparse(M) else M[rows], dtype=float)
    assert d.n == 3.0
    np.testing.assert_allclose(d.s, sub.sum(axis=0), rtol=1e-6)
    assert d.sumsq == pytest.approx(float((sub ** 2).sum()), rel=1e-6)
