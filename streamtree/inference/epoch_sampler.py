"""One epoch of dTSSBP inference: the chain's state across epochs and the sweep loop.

Per epoch ``t`` (ALGORITHM: per-epoch driver):

1. Nodes alive after epoch ``t-1`` start with their previous parameters; the stick prior holds
   the counts of the last ``window`` epochs.
2. ``n_sweeps`` times: let the likelihood redraw its per-document latent variables, if it has
   any (:meth:`~streamtree.likelihoods.base.Likelihood.sweep_counts`: the multinomial's table
   counts under ``document_concentration``; the sweep then reads those rows in place of the
   documents' own); sample all sticks from their windowed Beta conditionals; run the
   enumerated blocked-Gibbs z-update over the documents (in shards, on the z-sweeper given);
   turn placeholders that received documents into new nodes; delete nodes whose windowed
   counts are all zero; run the exact split-merge moves and relocations
   (:mod:`~streamtree.inference.split_merge`), the insertions and lifts of empty internal
   nodes (new ones, and carried ones, which may also come back), and the heat-bath merge of
   carried nodes (a carried leaf's documents, a carried internal node);
   slice-sample alpha0, lam, gamma (:mod:`~streamtree.inference.hyper`); re-estimate each
   node's concentration; update the node parameters by MAP, alternating even and odd depths.
3. Apply the identity rule (:meth:`EpochSampler._identity_rule`), let published ids follow
   the documents of carried nodes (:meth:`EpochSampler._hand_over_ids`), build the
   :class:`~streamtree.epoch_tree.EpochTree` with its events, push the epoch's counts into the
   window and delete nodes that fell out of it.

Everything that depends on the observation family goes through a
:class:`~streamtree.likelihoods.base.Likelihood`; the z-updates go through a
:class:`~streamtree.inference.zsweep.ZSweeper`. Nothing here knows which family or engine it has.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import streamtree  # noqa: F401  (configures the numba cache directory)
import numpy as np
from numba import njit
from scipy.stats import chi2

from streamtree.epoch_tree import EpochTree
from streamtree.events import epoch_events
from streamtree.inference.enumerated import row_sq_norms
from streamtree.inference.merge import CollapsedPrior
from streamtree.inference.hyper import sample_hyperparameters
from streamtree.inference.split_merge import MoveResult, MoveState, Previous, SplitMerge
from streamtree.inference.sticks import log_masses, mean_sticks, sample_sticks, stick_params
from streamtree.inference.zsweep import ZSweeper
from streamtree.likelihoods.base import DocumentSet, Likelihood, document_set
from streamtree.relays import relay_chains
from streamtree.tree import ROOT, TreeArrays, TSSBTree
from streamtree.window import WindowedCounts, subtree_sums

logger = logging.getLogger(__name__)

#: documents per split-merge attempt and sweep under ``split_proposals="auto"``
DOCS_PER_SPLIT_ATTEMPT = 100
#: fewest split-merge attempts per sweep under ``split_proposals="auto"``: fewer mix worse on
#: small epochs (the planted Gaussian tree of the paper's Figure 2, ~500 points: ARI 0.85-0.88
#: in its third epoch at 20 attempts, 0.99-1.0 at 50), and can leave a small epoch's chain on a
#: root-only tree
MIN_SPLIT_ATTEMPTS = 50
#: most split-merge attempts per document and sweep under ``split_proposals="auto"``, which
#: caps ``MIN_SPLIT_ATTEMPTS`` in epochs of fewer than 50 documents (see
#: :meth:`SamplerSettings.split_attempts`)
SPLIT_ATTEMPTS_PER_DOC = 1
#: sweeps of a chain's first epoch (its tree grown from the root) that make at least
#: :attr:`Likelihood.growth_attempts` times ``MIN_SPLIT_ATTEMPTS`` rounds of relocation and
#: split-merge attempts (not of lifts), up to one per document: the vMF's moves are almost
#: never accepted after about ten sweeps of that epoch (BENCHMARKS.md, "Where the planted
#: tree's first-epoch misses come from")
GROWTH_SWEEPS = 10
#: a rehang attempt (:meth:`~streamtree.inference.split_merge.SplitMerge.rehang`) runs in every
#: this many rounds of split-merge attempts, in epochs after the first: each draws up to
#: ``max_depth - 1`` relay parameters over the vocabulary, and run in every round the attempts
#: took a third of a default fit's time on the scripted-event stream. The first epoch's tree
#: grows from the root, the empty nodes above its leaves made as it grows; a topic that finds
#: the tree already at the cap arrives later. Run in the first epoch too, the planted figures
#: fell (multinomial, 3 chains x 4 seeds: ARI 0.739 against 0.769; BENCHMARKS.md, "A new
#: topic's own branch")
REHANG_EVERY = 5
#: the split proposals of each round of split-merge attempts (:meth:`SplitMerge.attempt`) in the
#: first half of an epoch's sweeps, and once its nodes have settled (from the middle sweep). The
#: launch finds splits. The subset proposal's merges pay about ``log C(n, k) + log n`` nats for
#: their reverse split where the launch's pay about ``n log 2``, so a node that duplicates its
#: parent or a sibling merges; from the first sweep they also merge the epoch's young nodes
#: before those gather their documents (BENCHMARKS.md, "Subset split proposals")
SPLIT_PROPOSALS = ("launch",)
SETTLED_SPLIT_PROPOSALS = ("launch", "subset")

#: tail probability of the time link beyond which a carried node counts as a new node
IDENTITY_LEVEL = 0.05
#: per-document log-likelihood separation (in standard deviations) beyond which it counts as new
IDENTITY_SEPARATION = 1.0
#: documents a carried node needs in an epoch before the identity rule may give it a new id:
#: with fewer, its parameter is mostly its links' prior and its top entries are noise
IDENTITY_MIN_DOCS = 10

CHECKPOINT_FORMAT = 1

#: the stick hyperparameters among the chain's ``hyper`` values (which also hold an estimated
#: ``kappa0`` under ``kappa0="auto"``)
STICK_HYPER = ("alpha0", "lam", "gamma")
#: the link strengths among them, estimated under ``kappa0="auto"``
LINK_HYPER = ("kappa0", "time_strength")


@dataclass(frozen=True)
class SamplerSettings:
    """The estimator's settings that the sweep loop reads (variant already resolved)."""

    alpha0: float
    lam: float
    gamma: float
    max_depth: int | None
    root_holds_data: bool
    freeze_after_birth: bool
    n_sweeps: int
    n_map_iter: int
    merge_moves: bool
    split_proposals: int | str
    min_node_docs: int
    sample_hyperparameters: bool = True
    #: ``kappa0="auto"``: the likelihood re-estimates its link strength after every sweep
    auto_link_strength: bool = False
    #: ``split_node="integrated"``: split-merge moves integrate the split node's parameter out
    integrate_split_node: bool = False

    def stick_kwargs(self) -> dict:
        return dict(alpha0=self.alpha0, lam=self.lam, gamma=self.gamma, max_depth=self.max_depth,
                    root_holds_data=self.root_holds_data)

    def settled(self, sweep: int) -> bool:
        """Whether an epoch's nodes have settled by ``sweep`` (from the middle sweep on): the
        moves that clean up rather than build (the subset proposal, the carried lift, the
        heat-bath merge) run from then."""
        return sweep >= self.n_sweeps // 2

    def split_attempts(self, n_docs: int, growth: int = 1) -> int:
        """Split-merge attempts per sweep for an epoch of ``n_docs`` documents: the number given,
        or for ``"auto"`` one per ``DOCS_PER_SPLIT_ATTEMPT`` documents (at least
        ``MIN_SPLIT_ATTEMPTS``), so that in a large epoch every document's node meets proposals
        at the same rate (a fixed number would mix ever slower as epochs grow). While a chain's
        first tree grows, at least ``growth`` times ``MIN_SPLIT_ATTEMPTS``
        (:attr:`Likelihood.growth_attempts`), up to one per document: growing a tree takes
        proposals in proportion to the nodes it grows, not to the documents, so a large epoch's
        usual number already holds them.

        The floor ``MIN_SPLIT_ATTEMPTS`` is at most ``SPLIT_ATTEMPTS_PER_DOC`` per document,
        so an epoch of fewer than 50 documents makes one attempt per document (and a growing
        first tree's epoch of fewer than ``growth`` times 50 makes one per document too). An attempt's split draw is an
        ordered pair of documents of one node, so over the sweeps each of the ``n (n - 1)``
        pairs is drawn about ``n_sweeps / (2 (n - 1))`` times (8 times for 4 documents and 50
        sweeps; a 4-document epoch has 15 partitions), and each document anchors half an
        attempt per sweep: ten times the rate at which 50 attempts serve ~500 documents, where
        that floor was found to mix (more attempts on a tiny epoch only repeat the same few
        proposals). Epochs of 50 or more documents are unaffected."""
        if self.split_proposals == "auto":
            floor = min(MIN_SPLIT_ATTEMPTS, SPLIT_ATTEMPTS_PER_DOC * n_docs)
            usual = max(floor, -(-n_docs // DOCS_PER_SPLIT_ATTEMPT))
            return max(usual, min(growth * MIN_SPLIT_ATTEMPTS, SPLIT_ATTEMPTS_PER_DOC * n_docs))
        return int(self.split_proposals)

    def with_hyper(self, hyper: dict[str, float]) -> "SamplerSettings":
        """These settings with the chain's current stick hyperparameters."""
        stick = {k: v for k, v in hyper.items() if k in STICK_HYPER}
        return replace(self, **stick) if stick else self


class NodeTable:
    """Node parameters by node id in persistent matrices (rows are reused after deletions).

    ``theta[slot[id]]`` is a node's parameter and ``concentration[slot[id]]`` its concentration;
    the matrices grow by doubling, so adding a node does not copy the others every sweep.
    """

    def __init__(self, n_features: int, capacity: int = 16) -> None:
        self.theta = np.zeros((capacity, n_features))
        self.concentration = np.zeros(capacity)
        self.slot: dict[int, int] = {}
        self._free: list[int] = list(range(capacity - 1, -1, -1))

    def __contains__(self, node_id: int) -> bool:
        return node_id in self.slot

    def __len__(self) -> int:
        return len(self.slot)

    def add(self, node_id: int, theta: np.ndarray, concentration: float) -> None:
        if not self._free:
            cap = self.theta.shape[0]
            self.theta = np.vstack([self.theta, np.zeros_like(self.theta)])
            self.concentration = np.concatenate([self.concentration, np.zeros(cap)])
            self._free = list(range(2 * cap - 1, cap - 1, -1))
        s = self._free.pop()
        self.slot[node_id] = s
        self.theta[s] = theta
        self.concentration[s] = concentration

    def remove(self, node_id: int) -> None:
        self._free.append(self.slot.pop(node_id))

    def slots(self, ids) -> np.ndarray:
        return np.fromiter((self.slot[int(i)] for i in ids), dtype=np.int64, count=len(ids))

    def theta_of(self, ids) -> np.ndarray:
        """A fresh ``(len(ids), p)`` matrix of the nodes' parameters."""
        return self.theta[self.slots(ids)]

    def concentration_of(self, ids) -> np.ndarray:
        return self.concentration[self.slots(ids)]

    def theta_columns(self, ids, out: np.ndarray) -> np.ndarray:
        """The nodes' parameters as the columns of a C-contiguous ``(p, len(ids))`` matrix
        written into the flat work buffer ``out`` (at least ``p * len(ids)`` long); the
        transpose of :meth:`theta_of` without its row copy, in the layout the z-kernel's
        product reads."""
        slots = self.slots(ids)
        cols = out[: self.theta.shape[1] * slots.size].reshape(self.theta.shape[1], slots.size)
        _gather_columns(self.theta, slots, cols)
        return cols


@njit(cache=True, nogil=True)
def _gather_columns(theta, slots, out):
    """out[:, k] = theta[slots[k]], in tiles so that reads and writes both stay in cache."""
    p, K = out.shape
    tile = 64
    for v0 in range(0, p, tile):
        v1 = min(v0 + tile, p)
        for k in range(K):
            row = theta[slots[k]]
            for v in range(v0, v1):
                out[v, k] = row[v]


@dataclass
class ChainState:
    """Everything that carries over from one epoch to the next."""

    tree: TSSBTree
    window: WindowedCounts
    nodes: NodeTable
    #: current stick hyperparameters (alpha0, lam, gamma) and, under ``kappa0="auto"``, the
    #: estimated link strength ``kappa0``; empty until the first epoch starts
    hyper: dict[str, float] = field(default_factory=dict)
    #: node id -> what the node is recognised by, from the epoch the id it is published under
    #: was born (:meth:`Likelihood.identity_signature`); empty for families without one
    signatures: dict[int, np.ndarray] = field(default_factory=dict)
    #: node id -> the id its trees publish, where the two differ (ids follow documents:
    #: :meth:`EpochSampler._hand_over_ids`); a permutation of ids ever given out
    published: dict[int, int] = field(default_factory=dict)
    #: published id -> the epoch it was born, for published ids that went over to another node
    published_born: dict[int, int] = field(default_factory=dict)

    @classmethod
    def empty(cls, max_depth: int | None, window: int | None, n_features: int) -> "ChainState":
        return cls(TSSBTree(max_depth), WindowedCounts(window), NodeTable(n_features))

    def own_counts(self, ids: np.ndarray, current: dict[int, int]) -> np.ndarray:
        """Past-window plus live-epoch documents at each node."""
        return self.window.counts(ids) + np.array([current.get(int(i), 0) for i in ids], dtype=np.int64)

    def published_id(self, node_id: int) -> int:
        return self.published.get(node_id, node_id)

    def published_birth(self, node_id: int) -> int:
        """The birth epoch of the id node ``node_id`` is published under."""
        pid = self.published_id(node_id)
        # the tree is read only for an id without a recorded birth (a node it may no longer hold has one)
        return self.published_born[pid] if pid in self.published_born else self.tree.born[node_id]

    def exchange_published(self, a: int, b: int) -> None:
        """Nodes ``a`` and ``b`` exchange the ids they are published under. Each published id
        keeps its birth epoch and its signature, so the identity rule goes on judging an id by
        the words of its own birth: were the signature left with the node, an id handed over
        would be judged from then on by its heir's birth, and could drift a little at every
        hand-over. A node without a signature (born this epoch) leaves the other without one,
        to be signed at the end of the epoch under the new id it is published under."""
        pa, pb = self.published_id(a), self.published_id(b)
        self.published_born[pa], self.published_born[pb] = self.published_birth(a), self.published_birth(b)
        sa, sb = self.signatures.pop(a, None), self.signatures.pop(b, None)
        if sb is not None:
            self.signatures[a] = sb
        if sa is not None:
            self.signatures[b] = sa
        for node, pid in ((a, pb), (b, pa)):
            if pid == node:
                self.published.pop(node, None)
            else:
                self.published[node] = pid

    def remove(self, ids) -> None:
        for nid in ids:
            if nid in self.nodes:
                self.nodes.remove(nid)
        self.window.forget(ids)

    # ------------------------------------------------------------------ checkpoints
    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict]:
        """Numeric arrays and JSON metadata holding the whole state (see :meth:`from_arrays`)."""
        arrays = self.tree.arrays()
        ids = arrays.ids
        parent = np.where(arrays.parent_index >= 0, ids[np.maximum(arrays.parent_index, 0)], -1)
        hist_epoch, hist_ids, hist_counts = [], [], []
        for h, snap in enumerate(self.window.history):
            for k in sorted(snap):
                hist_epoch.append(h)
                hist_ids.append(k)
                hist_counts.append(snap[k])
        out = {
            "node_ids": ids.astype(np.int64),
            "node_parent": parent.astype(np.int64),
            "node_born": np.array([self.tree.born[int(i)] for i in ids], dtype=np.int64),
            "node_theta": self.nodes.theta_of(ids),
            "node_concentration": self.nodes.concentration_of(ids),
            "window_epoch": np.asarray(hist_epoch, dtype=np.int64),
            "window_node": np.asarray(hist_ids, dtype=np.int64),
            "window_count": np.asarray(hist_counts, dtype=np.int64),
        }
        signed = [int(i) for i in ids if int(i) in self.signatures]
        out["signature_node"] = np.asarray(signed, dtype=np.int64)
        out["signature"] = (np.stack([self.signatures[i] for i in signed]) if signed
                            else np.zeros((0, 0), dtype=np.float64))
        meta = {"max_depth": self.tree.max_depth, "next_id": int(self.tree.next_id), "window": self.window.window,
                "window_epochs": len(self.window.history), "hyper": dict(self.hyper),
                "published": [[int(k), int(v)] for k, v in sorted(self.published.items())],
                "published_born": [[int(k), int(v)] for k, v in sorted(self.published_born.items())]}
        return out, meta

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], meta: dict) -> "ChainState":
        ids = np.asarray(arrays["node_ids"], dtype=np.int64)
        theta = np.asarray(arrays["node_theta"], dtype=np.float64)
        tree = TSSBTree(meta["max_depth"])
        tree.born[ROOT] = int(arrays["node_born"][0])
        for nid, par, born in zip(ids[1:], arrays["node_parent"][1:], arrays["node_born"][1:]):
            nid, par = int(nid), int(par)
            tree.parent[nid] = par
            tree.children[nid] = []
            tree.children[par].append(nid)  # pre-order lists siblings in stick order
            tree.depth[nid] = tree.depth[par] + 1
            tree.born[nid] = int(born)
        tree.next_id = int(meta["next_id"])
        nodes = NodeTable(theta.shape[1], capacity=max(16, 2 * ids.size))
        for k, nid in enumerate(ids):
            nodes.add(int(nid), theta[k], float(arrays["node_concentration"][k]))
        history = [{} for _ in range(int(meta["window_epochs"]))]
        for h, nid, c in zip(arrays["window_epoch"], arrays["window_node"], arrays["window_count"]):
            history[int(h)][str(int(nid))] = int(c)
        window = WindowedCounts.from_state({"window": meta["window"], "history": history})
        signatures = {int(i): np.asarray(sig, dtype=np.float64)
                      for i, sig in zip(arrays.get("signature_node", ()), arrays.get("signature", ()))}
        return cls(tree, window, nodes, {k: float(v) for k, v in meta.get("hyper", {}).items()}, signatures,
                   {int(k): int(v) for k, v in meta.get("published", [])},
                   {int(k): int(v) for k, v in meta.get("published_born", [])})


def apply_link_strengths(likelihood: Likelihood, hyper: dict[str, float]) -> None:
    """Put the chain's estimated link strengths (``kappa0="auto"``) into the likelihood."""
    for name in LINK_HYPER:
        if name in hyper:
            setattr(likelihood, name, float(hyper[name]))


def tree_arrays(tree: EpochTree) -> TreeArrays:
    """The :class:`TreeArrays` of a published epoch tree (its nodes are in pre-order)."""
    row = {int(i): k for k, i in enumerate(tree.node_ids)}
    parent_index = np.array([row.get(int(p), -1) for p in tree.parent], dtype=np.int64)
    rank = np.zeros(tree.n_nodes, dtype=np.int64)
    seen: dict[int, int] = {}
    for k in range(1, tree.n_nodes):
        p = int(parent_index[k])
        rank[k] = seen.get(p, 0)
        seen[p] = rank[k] + 1
    return TreeArrays(tree.node_ids.astype(np.int64), parent_index, tree.depth.astype(np.int64), rank)


def predictive_masses(tree: EpochTree, settings: SamplerSettings) -> tuple[np.ndarray, np.ndarray, TreeArrays]:
    """Posterior-mean log masses and new-child log masses of a published tree's nodes."""
    arrays = tree_arrays(tree)
    params = stick_params(arrays, tree.window_counts, **settings.stick_kwargs())
    log_pi, log_res = log_masses(arrays, mean_sticks(params))
    return log_pi, log_res, arrays


class EpochSampler:
    """Runs the sweeps of one epoch on a :class:`ChainState` (which it updates in place).

    Parameters
    ----------
    state : ChainState
    likelihood : Likelihood
    settings : SamplerSettings
    sweeper : ZSweeper
        Where the z-updates run.
    rng : numpy.random.Generator
        The coordinator's stream (sticks, merges, proposals); shards have their own.
    """

    def __init__(self, state: ChainState, likelihood: Likelihood, settings: SamplerSettings, sweeper: ZSweeper,
                 rng: np.random.Generator) -> None:
        self.state = state
        self.likelihood = likelihood
        self.settings = settings
        self.sweeper = sweeper
        self.rng = rng
        self.sweep = 0
        self.root_anchor: np.ndarray | None = None
        self.prev_theta: np.ndarray | None = None  # parameters at the start of the epoch, by slot
        self.prev_slot: dict[int, int] = {}
        self.prev_concentration: np.ndarray | None = None  # concentrations at the start of the epoch, by slot
        self.prev_born: dict[int, int] = {}  # birth epochs of the ids alive at the start of the epoch
        self.labels_now = np.zeros(0, dtype=np.int64)  # each document's node after the last sweep's moves
        #: the next sweep's own column of each row and its adjustment there (None: the family has none)
        self.own_scoring: tuple[np.ndarray, np.ndarray] | None = None
        #: for a family that redraws its rows each sweep: the own columns and the adjustment,
        #: which waits for those rows
        self._pending_scoring: tuple[np.ndarray, Callable[..., np.ndarray | None]] | None = None
        self.lineage = np.zeros(0, dtype=np.int64)  # each document's node in the previous tree (_lineage)
        self.moves: list[tuple[int, str, int]] = []  # (node, event, other node) of accepted moves
        self.renamed: dict[int, int] = {}  # old id -> new id under the identity rule
        self.prev_names: dict[int, int] = {}  # node id -> the id the previous tree published it under
        self.handed: list[tuple[int, int]] = []  # (carried node, heir) of each published id handed over
        self._buffers: dict[str, np.ndarray] = {}  # work matrices reused across sweeps (see _work)

    # ------------------------------------------------------------------ the epoch
    def run(self, X, epoch: int, label: str | None, shard_seeds: list[np.random.SeedSequence],
            previous: EpochTree | None) -> EpochTree:
        st, lik = self.state, self.likelihood
        if not st.hyper:
            st.hyper = dict(alpha0=float(self.settings.alpha0), lam=float(self.settings.lam),
                            gamma=float(self.settings.gamma))
        n = X.shape[0]
        self._start_link_strength(X)
        if len(st.nodes) == 0:
            if n == 0:
                raise ValueError("the first epoch must contain documents")
            theta, conc = lik.initial_root(X)
            st.nodes.add(ROOT, theta, conc)
            st.tree.born[ROOT] = epoch  # a stream may start at any epoch index
        if n:
            self.root_anchor = lik.root_anchor(X)
        if previous is not None:
            self.prev_theta = st.nodes.theta.copy()
            self.prev_concentration = st.nodes.concentration.copy()
            self.prev_slot = dict(st.nodes.slot)
            self.prev_born = dict(st.tree.born)
            self.prev_names = {i: st.published_id(i) for i in st.tree.parent}
        self.lineage = self._lineage(X, previous) if previous is not None and n else np.zeros(0, dtype=np.int64)
        current: dict[int, int] = {ROOT: n} if previous is None else {}
        col_ids = np.zeros(0, dtype=np.int64)
        self.own_scoring = self._pending_scoring = None  # the epoch's rows have no node yet
        if n:
            self.sweeper.load(X, list(shard_seeds))
        rows = X  # the rows the sweep reads: X, or the likelihood's redrawn rows (sweep_counts)
        for sweep in range(self.settings.n_sweeps if n else 0):
            self.sweep = sweep
            rows = self._sweep_rows(X, sweep)
            if self._pending_scoring is not None:  # the redrawn rows the sweep will score
                own, adjustment = self._pending_scoring
                self.own_scoring = (own, adjustment(scored=rows))
                self._pending_scoring = None
            cfg = self.settings.with_hyper(st.hyper)
            arrays = st.tree.arrays()
            params = stick_params(arrays, st.own_counts(arrays.ids, current), **cfg.stick_kwargs())
            log_pi, log_res = log_masses(arrays, sample_sticks(params, self.rng))
            # the nodes' parameters as the columns of a (p, K) matrix in a kept buffer, handed to the
            # likelihood as its transposed view: the kernel's (p, K) coefficients need no copy
            work = self._work("theta_cols", arrays.ids.size, st.nodes.theta.shape[1]).reshape(-1)
            theta_cols = st.nodes.theta_columns(arrays.ids, work)
            cand, ph_rows = lik.kernel(arrays, theta_cols.T, st.nodes.concentration_of(arrays.ids), log_pi, log_res)
            # the tree has not changed since the last node update fixed each row's own column
            stats = self.sweeper.sweep(cand, *(self.own_scoring or ()))
            col_ids, current, sums, sumsq = self._materialise(arrays, cand, ph_rows, stats, epoch)
            del cand  # (p, K) coefficients and placeholder parameters: not held through the moves
            self._cull(current)
            self.labels_now = col_ids[self.sweeper.labels()]
            if cfg.merge_moves and cfg.split_attempts(n) > 0:
                move, moves = self._split_merge(rows, col_ids, current, sums, sumsq, epoch)
                self._lift_moves(move, moves, epoch, carried=cfg.settled(sweep))
                del move, moves  # their per-node memos: not held through the node update
            if cfg.merge_moves and cfg.settled(sweep):
                self._merge_internal(current, sums, sumsq, epoch, rows)
            if cfg.sample_hyperparameters:
                arrays = st.tree.arrays()
                st.hyper = sample_hyperparameters(arrays, st.own_counts(arrays.ids, current), st.hyper,
                                                  max_depth=cfg.max_depth, root_holds_data=cfg.root_holds_data,
                                                  rng=self.rng)
            self._update_concentrations(current, sums, sumsq, epoch)
            if cfg.auto_link_strength:
                self._update_link_strength(current, sums, sumsq)
            self._update_theta(rows, sums, current, epoch)
            # (with own-node adjustments the sum holds them: a score of the sweep, not log p(x))
            logger.debug("epoch %d sweep %d: %d nodes, sweep log score %.4g", epoch, sweep, len(st.tree), stats.loglik)
        self._pending_scoring = None  # no sweep follows to read it
        if n and not self.likelihood.counts_started(st.hyper):  # a one-sweep epoch: start them now
            self._sweep_rows(X, self.settings.n_sweeps)
        if n and previous is not None:
            self._identity_rule(rows, epoch, current)
            if not self.settings.freeze_after_birth:  # a frozen node's id stays with its parameter
                self._hand_over_ids(rows, epoch, current)
        self._sign_new_nodes()
        labels = self.labels_now if n else np.zeros(0, dtype=np.int64)
        prev_ids = set(previous.node_ids.tolist()) if previous is not None else set()
        origins = self._split_origins(rows, epoch, current, previous) if n and previous is not None else []
        tree = self._epoch_tree(epoch, label, current, labels, prev_ids, previous, origins)
        st.window.commit(current)
        self._cull({})
        self._sign_new_nodes()  # forgets the signatures of nodes that fell out of the window
        return tree

    # ------------------------------------------------------------------ steps
    def _sweep_rows(self, X, sweep: int):
        """The rows this sweep reads (:meth:`Likelihood.sweep_counts`): ``X`` for most
        families; for one with per-document latent variables, a fresh draw of them given each
        document's node after the last sweep (in the epoch's first sweep, before any
        assignment, with ``node_of_row=None`` and the epoch's root anchor: the family decides),
        sent to the shards. Drawn with the coordinator's stream, so the values do not depend on
        the engine or the shards."""
        if not self.likelihood.redraws_counts:
            return X
        st = self.state
        if sweep == 0:
            theta, node_of_row = self.root_anchor[None, :], None
        else:
            ids, inverse = np.unique(self.labels_now, return_inverse=True)
            theta, node_of_row = st.nodes.theta, st.nodes.slots(ids)[inverse.ravel()]
        new, hyper = self.likelihood.sweep_counts(X, theta, node_of_row, st.hyper, self.rng)
        if new is None:
            return X
        st.hyper.update(hyper)
        self.sweeper.set_values(new.data)
        return new

    def _own_columns(self, arrays) -> np.ndarray:
        """Each row's node (after the last sweep and the moves) as a row of ``arrays``, the
        next sweep's kernel column, -1 for a node no longer there."""
        col = np.full(int(arrays.ids.max()) + 1, -1, dtype=np.int64)
        col[arrays.ids] = np.arange(arrays.size)
        ids = self.labels_now
        return np.where((ids >= 0) & (ids < col.size), col[np.clip(ids, 0, col.size - 1)], -1)

    def _start_link_strength(self, X) -> None:
        """Under ``kappa0="auto"``: the chain's estimate of ``kappa0`` (the family's starting
        value from the first epoch's rows) goes into the likelihood before anything uses it."""
        st, lik = self.state, self.likelihood
        if not self.settings.auto_link_strength:
            return
        if "kappa0" not in st.hyper and X.shape[0]:
            start = lik.initial_link_strength(X)
            if start is not None:
                st.hyper["kappa0"] = float(start)
        apply_link_strengths(lik, st.hyper)

    def _update_link_strength(self, current: dict[int, int], sums: dict[int, np.ndarray],
                              sumsq: dict[int, float] | None = None) -> None:
        """Re-estimate ``kappa0`` from the tree, the documents and the nodes' parameters (the
        family's rule, :meth:`Likelihood.estimate_link_strength`)."""
        st, lik = self.state, self.likelihood
        arrays = st.tree.arrays()
        ids = arrays.ids
        slots = st.nodes.slots(ids)
        theta = st.nodes.theta[slots]
        counts = np.array([current.get(int(i), 0) for i in ids], dtype=np.float64)
        S = np.zeros_like(theta)
        for k, i in enumerate(ids):
            if int(i) in sums:
                S[k] = sums[int(i)]
        has_prev = np.array([int(i) in self.prev_slot for i in ids], dtype=bool)
        P = theta.copy()
        if has_prev.any():
            P[has_prev] = self.prev_theta[[self.prev_slot[int(i)] for i in ids[has_prev]]]
        Q = np.array([(sumsq or {}).get(int(i), current.get(int(i), 0)) for i in ids], dtype=np.float64)
        k0 = lik.estimate_link_strength(arrays, theta, st.nodes.concentration[slots], counts, S, P, has_prev,
                                        self.root_anchor, sumsq=Q)
        if k0 is not None:
            st.hyper["kappa0"] = float(k0)
        apply_link_strengths(lik, st.hyper)
        k_t = lik.estimate_time_strength(arrays, theta, st.nodes.concentration[slots], counts, S, P, has_prev,
                                         self.root_anchor)
        if k_t is not None:
            st.hyper["time_strength"] = float(k_t)
        apply_link_strengths(lik, st.hyper)

    def _materialise(self, arrays, cand, ph_rows, stats, epoch: int):
        """Turn occupied placeholders into nodes; per-node counts, sums and sums of squares."""
        st, lik = self.state, self.likelihood
        col_ids = np.full(cand.n_columns, -1, dtype=np.int64)
        col_ids[: cand.n_live] = arrays.ids
        row_of = {int(c): r for r, c in enumerate(stats.occupied)}
        for j, prow in enumerate(ph_rows):
            col = cand.n_live + j
            if stats.counts[col] == 0:
                continue
            parent = int(arrays.ids[prow])
            nid = st.tree.add_child(parent, born=epoch)
            col_ids[col] = nid
            docs = DocumentSet(float(stats.counts[col]), stats.sums[row_of[col]], float(stats.sumsq[col]))
            s = st.nodes.slot[parent]
            conc = float(st.nodes.concentration[s])
            theta = lik.new_node_theta(st.nodes.theta[s], conc, st.tree.depth[nid], docs)
            st.nodes.add(nid, theta, lik.new_node_concentration(conc, st.tree.depth[nid]))
        counts, sums, sumsq = {}, {}, {}
        for col in stats.occupied:
            nid = int(col_ids[col])
            counts[nid] = int(stats.counts[col])
            sums[nid] = stats.sums[row_of[int(col)]]
            sumsq[nid] = float(stats.sumsq[col])
        return col_ids, counts, sums, sumsq

    def _cull(self, current: dict[int, int]) -> list[int]:
        """Delete subtrees whose windowed counts (past window plus live epoch) are all zero."""
        st = self.state
        arrays = st.tree.arrays()
        S = subtree_sums(arrays.parent_index, st.own_counts(arrays.ids, current))
        removed: list[int] = []
        for k in range(1, arrays.size):
            nid = int(arrays.ids[k])
            if S[k] == 0 and nid in st.tree:
                removed.extend(st.tree.remove_subtree(nid))
        st.remove(removed)
        return removed

    def _moves(self, X) -> tuple[MoveState, SplitMerge]:
        """The exact moves' view of the epoch's state (node parameters by id, past window
        counts, carried nodes with their previous parameters) and the moves under the chain's
        current hyperparameters."""
        st = self.state
        ids = list(st.tree.parent)
        slots = st.nodes.slots(ids)
        previous = {i: Previous(self.prev_theta[s], float(self.prev_concentration[s]), self.prev_born[i])
                    for i, s in self.prev_slot.items()}
        move = MoveState(st.tree, self.labels_now, X, st.window.total,
                         {i: st.nodes.theta[s] for i, s in zip(ids, slots)},
                         {i: float(st.nodes.concentration[s]) for i, s in zip(ids, slots)}, set(self.prev_slot),
                         previous, self.likelihood.root_parent(self.root_anchor))
        return move, SplitMerge(self.likelihood, self.settings.with_hyper(st.hyper).stick_kwargs(),
                                freeze_carried=self.settings.freeze_after_birth,
                                integrate_split_node=self.settings.integrate_split_node)

    def _split_merge(self, X, col_ids: np.ndarray, current: dict[int, int], sums: dict[int, np.ndarray],
                     sumsq: dict[int, float], epoch: int) -> tuple[MoveState, SplitMerge]:
        """``split_attempts`` rounds of exact moves (:mod:`streamtree.inference.split_merge`) on
        the documents' current nodes: a relocation attempt of a new node (in every
        :data:`REHANG_EVERY`-th round of an epoch after the first also a rehang attempt of a new
        leaf at the depth cap, into a branch of its own), then a split-merge
        attempt with each of :data:`SPLIT_PROPOSALS` (from the middle sweep on,
        :data:`SETTLED_SPLIT_PROPOSALS`). Counts, sums and labels follow the
        accepted moves. Returns the moves' state and moves, their index following the accepted
        moves, for :meth:`_lift_moves`."""
        st, cfg = self.state, self.settings
        move, moves = self._moves(X)
        touched: set[int] = set()
        proposals = SETTLED_SPLIT_PROPOSALS if cfg.settled(self.sweep) else SPLIT_PROPOSALS
        growing = not self.prev_slot and self.sweep < GROWTH_SWEEPS  # the chain's first tree
        for attempt in range(cfg.split_attempts(X.shape[0], self.likelihood.growth_attempts if growing else 1)):
            self._take_placement(moves.relocate(move, self.rng), move)
            if attempt % REHANG_EVERY == 0 and self.prev_slot:  # an epoch after the first
                self._take_placement(moves.rehang(move, self.rng, born=epoch), move)
            for proposal in proposals:
                self._take_move(moves.attempt(move, self.rng, born=epoch, proposal=proposal), move, touched)
        for nid in touched:
            rows = moves.index(move).of(nid)
            current.pop(nid, None), sums.pop(nid, None), sumsq.pop(nid, None)
            if rows.size and nid in st.tree:
                docs = document_set(X, rows)
                current[nid] = int(rows.size)
                sums[nid] = docs.s
                sumsq[nid] = docs.sumsq
        return move, moves

    def _take_placement(self, res: MoveResult | None, move: MoveState) -> None:
        """Bring an accepted relocation or rehang into the chain's state: the moved leaf's
        redrawn parameter, and the relays a rehang made and removed (no documents move)."""
        if res is None:
            return
        st = self.state
        for r in res.removed:
            st.nodes.remove(r)
        for c in res.added:
            st.nodes.add(c, move.theta[c], move.concentration[c])
        st.nodes.theta[st.nodes.slot[res.node]] = move.theta[res.node]

    def _take_move(self, res: MoveResult | None, move: MoveState, touched: set[int]) -> None:
        """Bring an accepted split-merge move's nodes and parameters into the chain's state."""
        if res is None:
            return
        st = self.state
        touched.update((res.node, res.other))
        for g in res.redrawn:  # the split node's parameter, drawn afresh with its documents
            st.nodes.theta[st.nodes.slot[g]] = move.theta[g]
        if res.kind == "split":
            if res.node not in st.nodes:
                st.nodes.add(res.node, move.theta[res.node], move.concentration[res.node])
            self.moves.append((res.node, "split_from", res.other))
        else:
            if res.node not in st.tree:
                st.nodes.remove(res.node)
            self.moves.append((res.node, "merged_into", res.other))

    def _identity_rule(self, X, epoch: int, current: dict[int, int]) -> None:
        """Publish a carried node whose content changed beyond recognition as a new node.

        A node carried from the previous epoch keeps its id unless, at the end of this epoch,

        * it holds at least :data:`IDENTITY_MIN_DOCS` documents of this epoch (evidence: with
          fewer, its parameter is mostly the prior its links give it), and
        * the family no longer recognises it: for word families (vMF, multinomial) fewer than
          3 of the 10 top words it had when its id was born are still among its top 10 and
          those words carry less than 60% of the weight its top 10 carry now
          (:class:`~streamtree.likelihoods.base.WordTopics`). The comparison is with the id's
          birth, not with the previous epoch, so a node cannot drift away a few words per
          epoch under one id. Families without such a signature (Gaussian) use the drift
          test instead: the parameter moved further than its time link typically allows
          (the family's drift statistic beyond the ``1 - IDENTITY_LEVEL`` chi-square
          quantile) and its documents tell the two parameters apart (the per-document
          log-likelihood ratios ``log f(x | theta_now) - log f(x | theta_prev)`` have a mean
          above ``IDENTITY_SEPARATION`` times their standard deviation).

        An unrecognised node gets a fresh id (born now, with a new signature) and the old id
        dies. Its place, counts and parameters carry over to the new id, so the sampler's state
        is unchanged."""
        st = self.state
        for nid in st.tree.preorder()[1:]:
            if nid not in self.prev_slot or current.get(nid, 0) < IDENTITY_MIN_DOCS:
                continue
            if self._recognised(X, nid, nid):
                continue
            new = st.tree.next_id
            st.tree.next_id += 1
            st.tree.rename(nid, new, born=epoch)
            s = st.nodes.slot.pop(nid)
            st.nodes.slot[new] = s
            st.window.merge(nid, new)
            st.signatures.pop(nid, None)
            current[new] = current.pop(nid)
            self.labels_now[self.labels_now == nid] = new
            self.moves = [(new if a == nid else a, e, new if b == nid else b) for a, e, b in self.moves]
            self.renamed[nid] = new
            logger.debug("epoch %d: node %d changed beyond recognition, now node %d", epoch, nid, new)

    def _recognised(self, X, carried: int, node: int) -> bool:
        """Whether ``node``'s parameter and documents still carry the content of the carried
        node ``carried`` (:meth:`_identity_rule`): its family's signature of ``carried`` (at
        the id's birth) recognises ``node``'s parameter, or, for families without one, the
        drift from ``carried``'s previous-epoch parameter is within what the time link allows
        or ``node``'s documents do not tell the two apart."""
        st, lik = self.state, self.likelihood
        s = st.nodes.slot[node]
        theta_now, theta_prev = st.nodes.theta[s], self.prev_theta[self.prev_slot[carried]]
        signature = st.signatures.get(carried)
        if signature is None:
            signature = lik.identity_signature(theta_prev)
        if signature is not None:
            return lik.recognises(signature, theta_now)
        stat = lik.drift_statistic(theta_now, theta_prev, st.tree.depth[node])
        if stat is None or stat[0] <= chi2.isf(IDENTITY_LEVEL, stat[1]):
            return True
        rows = X[np.flatnonzero(self.labels_now == node)]
        conc = float(st.nodes.concentration[s])
        r = lik.row_log_likelihood(rows, theta_now, conc) - lik.row_log_likelihood(rows, theta_prev, conc)
        return float(np.mean(r)) <= IDENTITY_SEPARATION * float(np.std(r))

    def _lineage(self, X, previous: EpochTree, block: int = 4096) -> np.ndarray:
        """Each document's node in the previous epoch's tree: the node that tree's predictive
        density gives it (:meth:`DTSSBP.predict` of the previous tree, posterior-mean masses),
        as the id of the chain's node; -1 for nodes no longer in the chain. The evidence
        :meth:`_hand_over_ids` reads, taken before the epoch's sweeps can create nodes."""
        st, lik = self.state, self.likelihood
        log_pi, log_res, arrays = predictive_masses(previous, self.settings.with_hyper(st.hyper))
        cand, _ = lik.kernel(arrays, previous.theta, previous.concentration, log_pi, log_res, normalized=True)
        internal = {pid: i for i, pid in self.prev_names.items()}
        node = np.array([internal.get(int(p), -1) for p in previous.node_ids], dtype=np.int64)
        out = np.empty(X.shape[0], dtype=np.int64)
        for lo in range(0, X.shape[0], block):
            w = lik.live_log_weights(X[lo:lo + block], cand, previous.theta, st.hyper)
            out[lo:lo + block] = node[np.argmax(w, axis=1)]
        return out

    def _hand_over_ids(self, X, epoch: int, current: dict[int, int]) -> None:
        """A carried node most of whose documents went over to one other node hands it its published id.

        The moves can take the epoch's documents from a carried node ``c`` to another node
        ``b``, ``c`` staying on with fewer or none: most often a child born in this epoch (the
        lift of an empty carried parent raises ``c`` a level, and its documents then go back to
        their old depth through a new child; on planted leaf-only trees with long documents
        every surviving node changed id this way in an epoch), sometimes a new node elsewhere,
        or a carried node that held none of the epoch's documents of its own at first. The
        content then lives on in ``b``, and the id the trees publish should follow it, as it
        follows the larger part of a split. The evidence is the documents themselves: those the
        previous epoch's tree gives to ``c`` (:meth:`_lineage`). At the end of the epoch, a
        carried ``c`` given at least :data:`IDENTITY_MIN_DOCS` documents that way hands its
        published id to the node ``b`` holding most of them when ``b`` is not the root (whose
        id is the stream's and never changes), holds more than half of
        them and at least :data:`IDENTITY_MIN_DOCS` in all, more than half of ``b``'s
        documents come from ``c`` that way (so ``b`` is not another node's continuation or
        new content), and ``b`` is recognised as ``c``'s content
        (:meth:`_recognised`, the identity rule's test). The two exchange the ids they are
        published under (each id keeps its birth epoch and the words the identity rule judges
        it by: ``c`` is then published under ``b``'s, a new one if ``b`` was born now). In
        this epoch only the published names change (:attr:`ChainState.published`): the chain,
        its past counts and its time links are those of the nodes as they are, so the epoch's
        trees do not depend on it; in later epochs the identity rule judges ``b`` by the
        words of ``c``'s birth.
        Not run when parameters are frozen after their birth epoch (o-TSSBP): there an id
        names a parameter that never changes, and handed over it would name a new one."""
        st = self.state
        lineage, now = self.lineage, self.labels_now
        if lineage.shape != now.shape:
            return
        # one table of (node in the previous tree, node now) document counts for every carried node
        (src, dst), moved = np.unique(np.stack([lineage, now]), axis=1, return_counts=True)
        pairs: list[tuple[int, int]] = []
        for c in st.tree.preorder()[1:]:
            if c not in self.prev_slot:
                continue
            mine = src == c
            held = int(moved[mine].sum())
            if held < IDENTITY_MIN_DOCS:
                continue
            k = int(np.argmax(moved[mine]))
            b, n_b = int(dst[mine][k]), int(moved[mine][k])
            # n_b is both how many of c's documents went to b and how many of b's came from c
            # the root is the stream's node, not a topic: it never takes another node's id
            if (b == c or b == ROOT or b not in st.tree or 2 * n_b <= held or current.get(b, 0) < IDENTITY_MIN_DOCS
                    or 2 * n_b <= current.get(b, 0) or not self._recognised(X, c, b)):
                continue
            pairs.append((c, b))
        # b holds mostly c's documents, so no b is another pair's b; a node in two pairs (the
        # heir of one, the giver of another) keeps its name: the exchanges must not chain
        seen = collections.Counter(x for pair in pairs for x in pair)
        for c, b in pairs:
            if seen[c] > 1 or seen[b] > 1:
                continue
            st.exchange_published(c, b)
            self.handed.append((c, b))
            self.moves = [m for m in self.moves if {m[0], m[2]} != {b, c}]  # b's birth from c is c going on
            logger.debug("epoch %d: node %d is published as %d, the id of node %d whose documents it holds",
                         epoch, b, st.published_id(b), c)

    def _split_origins(self, X, epoch: int, current: dict[int, int], previous: EpochTree) -> list[tuple[int, int]]:
        """Where the nodes published as new in this epoch came from, by their documents:
        ``(published id, id in the previous tree)`` pairs for :func:`~streamtree.events.epoch_events`,
        which reads them as the nodes' splits, before any the moves record.

        * A node ``b`` born in this epoch (not renamed by the identity rule) holding at least
          :data:`IDENTITY_MIN_DOCS` documents, more than half of them documents the previous
          tree gives to one carried node ``c`` other than the root (:meth:`_lineage`), and
          recognised as ``c``'s content (:meth:`_recognised`, the identity rule's test), split
          from ``c``. The moves name where the chain made a node, often a node that lived only
          within the epoch and so is no split a reader can follow; a topic that divides shows
          as new children beside its old leaf, or as its id handed to one part
          (:meth:`_hand_over_ids`) and a new node for the other. New content the previous
          tree had to give to some node is not recognised, so it stays born. A document
          given to a relay of the previous tree (an empty node with one child, whose
          parameter is close to its child's, :mod:`streamtree.relays`) counts for the node
          its chain leads to.
        * A carried node that handed its published id to its heir and holds no documents of
          this epoch and no children is left with the past documents the previous tree
          published under that id (a topic whose words moved faster than its time link
          allows goes on in a new node, the heir): it split from the heir's id.
        """
        st = self.state
        name = st.published_id
        out: list[tuple[int, int]] = []
        renamed = set(self.renamed.values())
        lineage, now = self.lineage, self.labels_now
        if lineage.shape == now.shape and lineage.size:
            internal = {pid: i for i, pid in self.prev_names.items()}
            end = {internal[r]: internal[n] for n, chain in
                   relay_chains(previous.node_ids, previous.parent, previous.counts).items()
                   for r in chain if r in internal and n in internal}
            nodes, where = np.unique(lineage, return_inverse=True)
            lineage = np.array([end.get(int(c), int(c)) for c in nodes], dtype=np.int64)[where.ravel()]
            (src, dst), moved = np.unique(np.stack([lineage, now]), axis=1, return_counts=True)
            for b in st.tree.preorder()[1:]:
                n_b = current.get(b, 0)
                if n_b < IDENTITY_MIN_DOCS or b in renamed or st.published_birth(b) != epoch:
                    continue
                mine = dst == b
                k = int(np.argmax(moved[mine]))
                c, n_c = int(src[mine][k]), int(moved[mine][k])
                if (2 * n_c > n_b and c != ROOT and c in self.prev_slot and c in self.prev_names
                        and self._recognised(X, c, b)):
                    out.append((name(b), self.prev_names[c]))
        for c, b in self.handed:
            if c in st.tree and not current.get(c, 0) and not st.tree.children[c]:
                out.append((name(c), name(b)))
        return out

    def _sign_new_nodes(self) -> None:
        """Record the identity signature of every node without one (born this epoch, or given a
        new id by the identity rule) and forget those of nodes that are gone."""
        st, lik = self.state, self.likelihood
        ids = st.tree.preorder()
        for nid in ids:
            if nid not in st.signatures:
                sig = lik.identity_signature(st.nodes.theta[st.nodes.slot[nid]])
                if sig is None:
                    return
                st.signatures[nid] = sig
        live = set(ids)
        for nid in [k for k in st.signatures if k not in live]:
            del st.signatures[nid]

    def _lift_moves(self, move: MoveState, moves: SplitMerge, epoch: int, carried: bool = True) -> None:
        """``split_attempts`` exact insertions and lifts of empty new internal nodes
        (:meth:`~streamtree.inference.split_merge.SplitMerge.lift`), each with an exact lift
        or return of a carried internal node without documents of its own
        (:meth:`~streamtree.inference.split_merge.SplitMerge.lift_carried`): a node whose
        documents have all left and that only joins its children is removed, its children
        taking its place, under the same target and acceptance rule as the split-merge moves
        (windowed collapsed prior, the lifted subtrees' links, reversible jump for its
        parameter); a removed carried node may come back with its id and time link. A new
        node holding documents is merged into its parent, children lifted, by the split-merge
        moves themselves. Documents do not move, so counts, sums and labels are unchanged.

        The carried lifts run only when ``carried`` is true and parameters are not frozen after
        their birth epoch (the o-TSSBP baseline; the move draws its leaves' parameters afresh,
        which that baseline forbids): the sweep loop runs them in the
        second half of the sweeps, once the epoch's new nodes have settled (as the heat-bath
        merge). Run from the first sweep, on the demo's SOU replay they removed carried nodes
        while the epoch's tree was still forming (139 removals, no return), the sampled lam fell
        to 0.1-0.3 and births, deaths and parent changes quadrupled (BENCHMARKS.md, "Exact lift
        of carried internal nodes").

        ``move`` and ``moves`` are those the sweep's split-merge attempts ran on
        (:meth:`_split_merge`): the same state, and their document index stays valid."""
        st, cfg = self.state, self.settings
        for _ in range(cfg.split_attempts(move.X.shape[0])):
            inserted = moves.lift(move, self.rng, born=epoch)
            # the carried lift redraws leaf parameters, which the frozen-parameter baseline keeps
            lifted = moves.lift_carried(move, self.rng) if carried and not cfg.freeze_after_birth else None
            for res in (inserted, lifted):
                if res is None:
                    continue
                if res.kind in ("insert", "restore"):
                    st.nodes.add(res.node, move.theta[res.node], move.concentration[res.node])
                else:
                    st.nodes.remove(res.node)
                    self.moves.append((res.node, "merged_into", res.other))
                for g in res.redrawn:  # leaves the carried lift drew afresh below their new parent
                    st.nodes.theta[st.nodes.slot[g]] = move.theta[g]

    def _merge_internal(self, current: dict[int, int], sums: dict[int, np.ndarray], sumsq: dict[int, float],
                        epoch: int, X=None) -> None:
        """Heat-bath choice, deepest first, for each carried internal node without past counts
        between keeping it and merging it into its parent, its children rising, and for each
        carried leaf with past counts and current documents between keeping those documents
        and moving them to the parent: a search heuristic, NOT an exact move (the children's
        links are not rescored, there is no reverse move). Past documents never move: a carried
        leaf keeps them, and the window retires it once they leave it. It is kept for what the
        exact moves cannot do yet:

        * empty a carried leaf whose documents its parent explains as well. The exact
          counterpart (a split-merge merge of a kept node) is rarely accepted, and without this
          step the node lives on beside its parent and shares its documents (the paper's
          Figure 2 tree: a dying leaf held 34-42 of its parent's documents in the last epoch,
          over three seeds);
        * remove a carried internal node without past counts, lifting its children. The exact
          carried lift (:meth:`~streamtree.inference.split_merge.SplitMerge.lift_carried`, run
          in :meth:`_lift_moves`) removes such a node only when it holds no current documents
          and can bring it back. On its own, small epochs keep their carried skeleton (SOU
          paragraphs of 1930-1989 by year: 46 of 58 years with at most 2 nodes holding 5% of
          the year, against 32 with this step). That is the target's verdict: the windowed
          prior alone scores these removals at a median of -9 nats, and this step removes at
          ``1 / (1 + exp(-delta))`` every sweep with no move back, a one-way drift
          (BENCHMARKS.md, "The carried lift's leaf children drawn afresh").

        Nodes born in this epoch are left to the exact moves. This step used to merge those too
        (a node that duplicated its parent, which the launch's merge cannot join); where the
        evidence between topics is marginal it then flattened the epoch's tree into a swarm of
        small nodes every sweep (flat topics sharing most words, 30 tokens: 2,825 nodes for
        3,000 documents at 100 sweeps). The subset proposal's merges
        (:data:`SETTLED_SPLIT_PROPOSALS`) now join duplicates exactly (BENCHMARKS.md, "Subset
        split proposals").

        See :mod:`streamtree.inference.merge`: the change of the collapsed stick prior of the
        window's documents, past and current, p(z_window | tree) (the hyperparameter sampler's
        target; its local difference, :class:`~streamtree.inference.merge.CollapsedPrior`),
        plus the data's Bayes factor between the node's documents at the parent (parent's
        parameters) and at their own node (parameter integrated out under the parent link,
        with the parent's concentration, exactly as the z-kernel scores a new node; a frozen
        node's documents are scored at its own fixed parameters, :meth:`_frozen`).
        """
        if not self.prev_slot:
            return  # nothing carried (the stream's first epoch)
        st, lik, cfg = self.state, self.likelihood, self.settings
        tree, win, nodes = st.tree, st.window, st.nodes
        kw = cfg.with_hyper(st.hyper).stick_kwargs()
        # The window's past documents count as observed assignments, as in the hyperparameter
        # sampler's target p(z_window | tree): a lift moves a subtree's past documents one level
        # up, which changes their probability under the tree. Conditioning on them
        # (p(z_now | z_past)) would make those changes free: empty carried subtrees were
        # lifted at even odds every sweep, their past documents then stopped above the depth
        # limit, the sampled alpha0 collapsed and the whole tree flattened into new nodes.
        windowed = dict(win.total)
        for i, k in current.items():
            windowed[i] = windowed.get(i, 0) + k
        prior = CollapsedPrior(tree, {}, windowed)
        log_total = np.log(sum(win.total.values()) + sum(current.values()) + 2.0)
        for c in reversed(tree.preorder()):
            if c == ROOT or c not in tree:
                continue
            if c not in self.prev_slot:
                continue  # born in this epoch: the exact moves only (see the docstring)
            past_c = win.total.get(c, 0)
            internal = bool(tree.children[c])
            if internal == (past_c > 0):
                # An internal node holding past documents
                # is not lifted: its past documents would move to the parent unscored by any
                # likelihood (they are gone), and the prior's gain from gathering them there
                # while its children rise compounds (SOU, multinomial: +286 nats for one
                # depth-1 node with 11 children and 139 past documents, accepted each time, the
                # tree then flattened into new nodes). The window retires such a node.
                continue
            n = current.get(c, 0)
            if not internal and not n:
                # A carried leaf without current documents: nothing to move. Merging it used to
                # send its past documents to the parent, scored by the stick prior alone, which
                # favours gathering them (1-4 nats per document: on SOU by year ten carried
                # leaves with 0-1 current documents retired in one sweep at up to +28 nats
                # each; the sampled alpha0 fell after them, and 5 of 58 years ended as the
                # root alone).
                continue
            par = tree.parent[c]
            if par == ROOT and not cfg.root_holds_data:
                continue
            data = 0.0
            if n:
                norms = None
                if X is not None and lik.sets_need_row_norms:
                    norms = row_sq_norms(X[np.flatnonzero(self.labels_now == c)])
                docs = DocumentSet(float(n), sums[c], sumsq[c], norms)
                sp_ = nodes.slot[par]
                at_parent = lik.log_likelihood(docs, nodes.theta[sp_], float(nodes.concentration[sp_]))
                if self._frozen(c, epoch):
                    # a frozen node's parameter is fixed: its documents are scored at it
                    sc = nodes.slot[c]
                    data = at_parent - lik.log_likelihood(docs, nodes.theta[sc], float(nodes.concentration[sc]))
                else:
                    # a carried node's documents are scored under its full prior, both links:
                    # its previous parameter is part of the evidence for keeping it
                    prev = self.prev_theta[self.prev_slot[c]]
                    data = at_parent - lik.log_marginal(docs, nodes.theta[sp_], float(nodes.concentration[sp_]),
                                                        tree.depth[c], theta_prev=prev)
            # The stick prior's gain from a merge grows like (documents moved) x log(total); when
            # the data's Bayes factor is far beyond any such gain, skip the prior's difference.
            if data < -(n + 1) * 3.0 * log_total - 20.0:
                continue
            edit = prior.edit()
            edit.move(c, par, 0.0, float(n))  # current documents only (past ones never move)
            if internal:
                edit.lift(c)
            delta = data + prior.delta(edit, **kw)
            # move with probability 1 / (1 + exp(-delta)), in log space
            if np.log(self.rng.random()) >= -np.logaddexp(0.0, -delta):
                continue  # keep the node
            if internal:
                tree.merge_into_parent(c)
            prior.apply(edit)
            if c in current:
                current[par] = current.get(par, 0) + current.pop(c)
            if n:
                sums[par] = sums[par] + sums.pop(c) if par in sums else sums.pop(c)
                sumsq[par] = sumsq.get(par, 0.0) + sumsq.pop(c)
            self.labels_now[self.labels_now == c] = par
            if internal:
                win.merge(c, par)  # a no-op (no past counts), kept so no count can be lost
                nodes.remove(c)
                self.moves.append((c, "merged_into", par))

    def _work(self, name: str, rows: int, cols: int) -> np.ndarray:
        """A ``(rows, cols)`` work matrix kept across sweeps (rows grow by a quarter): the K x p
        matrices the updates read are refilled in place each sweep instead of being allocated,
        and page-faulted, afresh."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape[0] < rows or buf.shape[1] != cols:
            grown = buf.shape[0] + buf.shape[0] // 4 if buf is not None else 0
            buf = np.empty((max(rows, 16, grown), cols))
            self._buffers[name] = buf
        return buf[:rows]

    def _update_concentrations(self, counts: dict[int, int], sums: dict[int, np.ndarray],
                               sumsq: dict[int, float], epoch: int) -> None:
        """Each node's concentration from its documents (:meth:`Likelihood.update_concentration`),
        for nodes holding at least ``min_node_docs``. A frozen node (:meth:`_frozen`) keeps its
        concentration, which is part of its parameters, but its documents still inform the
        prior a family may pool over all nodes (the vMF's)."""
        st = self.state
        ids = [nid for nid, n in counts.items() if n >= self.settings.min_node_docs and nid in st.tree]
        if not ids:
            return
        slots = st.nodes.slots(ids)
        p = st.nodes.theta.shape[1]
        S = self._work("sums", len(ids), p)
        for k, i in enumerate(ids):
            S[k] = sums[i]
        # mode="clip" (the slots are valid): with the default mode NumPy buffers ``out``, a
        # fresh K x p copy each call (32 ms at K = 276, p = 20,000 against 2.5 ms)
        theta = np.take(st.nodes.theta, slots, axis=0, out=self._work("theta", len(ids), p), mode="clip")
        new = self.likelihood.update_concentration(
            np.array([counts[i] for i in ids], dtype=np.float64), S,
            np.array([sumsq[i] for i in ids]), theta, st.nodes.concentration[slots])
        update = np.array([not self._frozen(i, epoch) for i in ids], dtype=bool)
        st.nodes.concentration[slots[update]] = new[update]

    def _frozen(self, nid: int, epoch: int) -> bool:
        """Whether node ``nid``'s parameters are fixed: parameters frozen after their birth epoch
        (o-TSSBP) and ``nid`` born before ``epoch``."""
        return self.settings.freeze_after_birth and self.state.tree.born[nid] < epoch

    def _update_theta(self, rows, sums: dict[int, np.ndarray], counts: dict[int, int], epoch: int) -> None:
        """MAP node parameters (:meth:`Likelihood.update_theta`), then each row's adjustment at its
        own node for the next sweep (:meth:`Likelihood.own_node_adjustment`): ``rows`` are the
        rows this sweep read, the ones the parameters were fitted to. A family that redraws its
        rows each sweep gets the next sweep's rows as well, once they are drawn."""
        st = self.state
        arrays = st.tree.arrays()
        ids = arrays.ids
        slots = st.nodes.slots(ids)
        K, p = ids.size, st.nodes.theta.shape[1]
        theta = np.take(st.nodes.theta, slots, axis=0, out=self._work("theta", K, p), mode="clip")  # see above
        S = self._work("sums", K, p)
        n = np.zeros(K)
        for k, i in enumerate(ids):
            if int(i) in sums:
                S[k] = sums[int(i)]
                n[k] = counts[int(i)]
            else:
                S[k] = 0.0
        has_prev = np.array([int(i) in self.prev_slot for i in ids], dtype=bool)
        P = self._work("prev", K, p)  # rows without a previous parameter carry no weight: zeros
        P[~has_prev] = 0.0
        for k in np.flatnonzero(has_prev):
            P[k] = self.prev_theta[self.prev_slot[int(ids[k])]]
        update = np.array([not self._frozen(int(i), epoch) for i in ids], dtype=bool)
        conc = st.nodes.concentration[slots]
        theta = self.likelihood.update_theta(arrays, theta, S, n, conc, P, has_prev, self.root_anchor, update,
                                             self.settings.n_map_iter)
        st.nodes.theta[slots] = theta
        own = self._own_columns(arrays)
        own[(own >= 0) & ~update[np.maximum(own, 0)]] = -1  # a frozen node was not fitted to its rows
        self.own_scoring = None
        if self.likelihood.redraws_counts:
            # S and P are work buffers, held without a copy (2 K x p arrays): the next sweep's
            # top reads them as soon as its rows are drawn, before any buffer is refilled
            self._pending_scoring = (own, partial(self.likelihood.own_node_adjustment, rows, own, arrays, theta,
                                                  S, n, conc, P, has_prev, self.root_anchor))
            return
        adjustment = self.likelihood.own_node_adjustment(rows, own, arrays, theta, S, n, conc, P, has_prev,
                                                         self.root_anchor)
        if adjustment is not None:
            self.own_scoring = (own, adjustment)

    def _epoch_tree(self, epoch, label, current, labels, prev_ids, previous, origins) -> EpochTree:
        st = self.state
        arrays = st.tree.arrays()
        ids = arrays.ids
        own_now = np.array([current.get(int(i), 0) for i in ids], dtype=np.int64)
        own_win = st.own_counts(ids, current)
        params = stick_params(arrays, own_win, **self.settings.with_hyper(st.hyper).stick_kwargs())
        log_pi, _ = log_masses(arrays, mean_sticks(params))
        # the trees publish each node under its published id (ids follow documents: _hand_over_ids)
        name = st.published_id
        pub = np.array([name(int(i)) for i in ids], dtype=np.int64)
        parent = np.where(arrays.parent_index >= 0, pub[np.maximum(arrays.parent_index, 0)], -1)
        died = np.array(sorted(prev_ids - set(pub.tolist())), dtype=np.int64)
        prev_tree_ids = np.array(sorted(prev_ids), dtype=np.int64)
        prev_par = (np.zeros(0, dtype=np.int64) if previous is None else
                    np.array([previous.parent[previous.index_of(int(i))] for i in prev_tree_ids], dtype=np.int64))
        moves = [(name(int(a)), e, name(int(b))) for a, e, b in self.moves]
        events = epoch_events(epoch, prev_tree_ids, prev_par, pub, parent, moves, origins)
        if st.published and labels.size:
            used, where = np.unique(labels, return_inverse=True)
            labels = np.array([name(int(i)) for i in used], dtype=np.int64)[where.ravel()]
        return EpochTree(
            epoch=epoch,
            node_ids=pub,
            parent=parent.astype(np.int64),
            depth=arrays.depth.copy(),
            mass=np.exp(log_pi),
            counts=own_now,
            subtree_counts=subtree_sums(arrays.parent_index, own_now).astype(np.int64),
            window_counts=own_win,
            theta=st.nodes.theta_of(ids),
            concentration=st.nodes.concentration_of(ids),
            born=np.array([st.published_birth(int(i)) for i in ids], dtype=np.int64),
            assignments=labels.astype(np.int64),
            died=died,
            label=label,
            events=events,
        )
