"""Adams et al. (2010) slice sampler for TSSB assignments: the exact reference z-update.

This is a pure, deliberately simple implementation to test the production sampler
(:mod:`streamtree.inference.enumerated`) against on small problems. It works on a
:class:`~streamtree.tree.TSSBTree` plus per-node sticks and parameters in dicts keyed by node id,
a generic log-likelihood ``loglik(x, node_id)`` and a parameter generator
``draw_theta(parent_id, depth, rng)`` for lazily created nodes.

The target, with sticks and parameters fixed, is

    p(z_n = e | .) oc pi_e f(x_n | theta_e)

over the *infinite* tree. Nodes are laid out on [0, 1) in depth-first pre-order (a node's own
interval of length pi_e comes before its children's), so ``u ~ U[0, 1)`` picks node ``e`` with
probability ``pi_e``; :func:`find_node` descends the tree rescaling ``u`` at each level and
creates children lazily when ``u`` falls in the not-yet-represented mass.

Why :func:`slice_z` is a valid Gibbs update (Neal 2003, shrinkage toward the current point):

* Augment the state with ``u`` uniform on the current node's interval and a level
  ``s ~ U(0, f(x | theta_cur))``. The pair ``(u, s)`` is then uniform under the graph of
  ``u -> f(x | theta_{node(u)})``, whose ``u``-marginal is ``pi f``.
* Shrinking the bracket ``[lo, hi)`` toward ``u_cur`` after each rejection leaves that uniform
  law invariant, and the resulting node chain is reversible with respect to ``pi f``.
* A rejected proposal has ``f <= s < f(cur)``, so it is never the current node and its position
  relative to ``u_cur`` is known from pre-order alone (path tuples compare like intervals). The
  auxiliary ``u_cur`` therefore never needs to be stored.
* The slice is on the likelihood only: the stick prior enters through the uniform proposal.

This is a Gibbs step of the full sampler only if (1) the sticks are not resampled during a sweep,
(2) the parameters of existing nodes stay fixed during it, (3) lazily created sticks and
parameters are exact draws from their conditionals -- a new node holds no data and is appended
last, so nu ~ Beta(1, alpha(d)), psi ~ Beta(1, gamma), theta from its prior given the parent --
after which they are part of the state, (4) the depth cap (nu = 1 at ``max_depth``) is applied the
same way everywhere, and (5) pruning only removes parts whose conditional is their prior (trailing
empty leaves, see :func:`prune_trailing_empty`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamtree.inference.sticks import Sticks, log_masses as _array_log_masses
from streamtree.tree import ROOT, TreeArrays, TSSBTree

__all__ = [
    "SliceState",
    "StickPrior",
    "find_node",
    "new_child",
    "prune_trailing_empty",
    "pre_expand",
    "slice_sweep",
    "slice_z",
]

LogLik = Callable[[Any, int], float]
DrawTheta = Callable[[int, int, np.random.Generator], Any]

# Same clipping of sticks away from 0 and 1 as the array stick sampler.
_CLIP_LO = math.log(1e-12)
_CLIP_HI = math.log1p(-1e-12)
# Give up on a slice step once the bracket is below this width: only reachable when the current
# node's interval is itself narrower than floating-point resolution.
_MIN_BRACKET = 4.0 * np.finfo(float).eps
_BELOW_ONE = math.nextafter(1.0, 0.0)  # rescaled u stays in [0, 1) despite rounding


@dataclass(frozen=True)
class StickPrior:
    """Stick hyperparameters for lazily created nodes.

    A new node at depth ``d`` draws ``nu ~ Beta(1, alpha0 * lam**d)`` (``nu = 1`` at the depth
    cap) and ``psi ~ Beta(1, gamma)``.
    """

    alpha0: float
    lam: float
    gamma: float

    def __post_init__(self) -> None:
        if not self.alpha0 > 0:
            raise ValueError(f"alpha0 must be > 0, got {self.alpha0}")
        if not 0 < self.lam <= 1:
            raise ValueError(f"lam must be in (0, 1], got {self.lam}")
        if not self.gamma > 0:
            raise ValueError(f"gamma must be > 0, got {self.gamma}")

    def alpha(self, depth: int) -> float:
        return self.alpha0 * self.lam ** depth


@dataclass
class SliceState:
    """A TSSB tree with its sticks (log space) and node parameters, keyed by node id.

    ``log_psi`` / ``log1m_psi`` of the root are unused. A node at the depth cap has
    ``log_nu = 0`` and ``log1m_nu = -inf``.
    """

    tree: TSSBTree
    log_nu: dict[int, float] = field(default_factory=dict)
    log1m_nu: dict[int, float] = field(default_factory=dict)
    log_psi: dict[int, float] = field(default_factory=dict)
    log1m_psi: dict[int, float] = field(default_factory=dict)
    theta: dict[int, Any] = field(default_factory=dict)

    @classmethod
    def from_sticks(cls, tree: TSSBTree, sticks: Sticks, theta: dict[int, Any],
                    arrays: TreeArrays | None = None) -> "SliceState":
        """Build the dict view from row-aligned :class:`Sticks` of ``tree.arrays()``."""
        arrays = tree.arrays() if arrays is None else arrays
        ids = [int(i) for i in arrays.ids]
        missing = [i for i in ids if i not in theta]
        if missing:
            raise ValueError(f"theta is missing nodes {missing[:5]}")

        def as_dict(values: np.ndarray) -> dict[int, float]:
            return {i: float(v) for i, v in zip(ids, values)}

        return cls(tree, as_dict(sticks.log_nu), as_dict(sticks.log1m_nu), as_dict(sticks.log_psi),
                   as_dict(sticks.log1m_psi), dict(theta))

    def to_arrays(self) -> tuple[TreeArrays, Sticks]:
        """Pre-ordered arrays and row-aligned sticks of the current tree."""
        arrays = self.tree.arrays()
        ids = [int(i) for i in arrays.ids]

        def col(d: dict[int, float]) -> np.ndarray:
            return np.array([d[i] for i in ids], dtype=np.float64)

        log_psi, log1m_psi = col(self.log_psi), col(self.log1m_psi)
        log_psi[0], log1m_psi[0] = 0.0, -np.inf
        return arrays, Sticks(col(self.log_nu), col(self.log1m_nu), log_psi, log1m_psi)

    def log_masses(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ids, log pi, log residual)`` in pre-order (see :func:`sticks.log_masses`)."""
        arrays, sticks = self.to_arrays()
        log_pi, log_res = _array_log_masses(arrays, sticks)
        return arrays.ids, log_pi, log_res


def _log_beta_one(b: float, rng: np.random.Generator) -> tuple[float, float]:
    """log x and log(1 - x) for x ~ Beta(1, b), via Gammas so both stay accurate."""
    g1 = rng.standard_gamma(1.0)
    g2 = rng.standard_gamma(b)
    lt = math.log(g1 + g2)
    lx = math.log(g1) - lt if g1 > 0 else -math.inf
    l1mx = math.log(g2) - lt if g2 > 0 else -math.inf
    return min(max(lx, _CLIP_LO), _CLIP_HI), min(max(l1mx, _CLIP_LO), _CLIP_HI)


def new_child(parent: int, state: SliceState, prior: StickPrior, draw_theta: DrawTheta,
               rng: np.random.Generator) -> int:
    """Append a child with sticks and parameter drawn from their conditionals (prior: no data)."""
    tree = state.tree
    nid = tree.add_child(parent)
    d = tree.depth[nid]
    state.log_psi[nid], state.log1m_psi[nid] = _log_beta_one(prior.gamma, rng)
    if tree.at_cap(nid):
        state.log_nu[nid], state.log1m_nu[nid] = 0.0, -math.inf
    else:
        state.log_nu[nid], state.log1m_nu[nid] = _log_beta_one(prior.alpha(d), rng)
    state.theta[nid] = draw_theta(parent, d, rng)
    return nid


def find_node(u: float, state: SliceState, prior: StickPrior, draw_theta: DrawTheta,
              rng: np.random.Generator) -> int:
    """The node whose pre-order interval contains ``u`` in [0, 1), creating children lazily.

    ``u`` is rescaled to [0, 1) at every level (relative coordinates avoid underflow deep in
    the tree). When it falls beyond a node's existing children, children are appended with
    sticks and parameters drawn from their conditionals until it is covered.
    """
    if not 0.0 <= u < 1.0:
        raise ValueError(f"u must lie in [0, 1), got {u}")
    tree = state.tree
    node = ROOT
    while True:
        if tree.at_cap(node):
            return node
        nu = math.exp(state.log_nu[node])
        if u < nu:
            return node
        u = min((u - nu) / math.exp(state.log1m_nu[node]), _BELOW_ONE)
        kids = tree.children[node]  # the live list: new_child appends to it
        acc = 0.0  # sum of log(1 - psi) over the children passed so far
        i = 0
        while True:
            if i == len(kids):
                new_child(node, state, prior, draw_theta, rng)
            child = kids[i]
            lo = -math.expm1(acc)  # e_{i-1}
            width = math.exp(acc + state.log_psi[child])  # e_i - e_{i-1}
            acc += state.log1m_psi[child]
            if u <= -math.expm1(acc):
                break
            i += 1
        u = min(max((u - lo) / width, 0.0), _BELOW_ONE)
        node = child


def slice_z(x: Any, current: int, state: SliceState, prior: StickPrior, loglik: LogLik,
            draw_theta: DrawTheta, rng: np.random.Generator) -> int:
    """One slice-sampling update of a single assignment; returns the new node id.

    Parameters
    ----------
    x : any
        The document, passed through to ``loglik``.
    current : int
        Its current node (must exist in ``state.tree``).
    state : SliceState
        Sticks and parameters; lazily created nodes are added to it.
    prior : StickPrior
        Stick priors for lazily created nodes.
    loglik : callable
        ``loglik(x, node_id) -> float``, typically reading ``state.theta[node_id]``.
    draw_theta : callable
        ``draw_theta(parent_id, depth, rng)``: a draw of a new node's parameter from its
        conditional given the parent (the node has no data yet).
    rng : numpy.random.Generator
    """
    tree = state.tree
    if current not in tree:
        raise KeyError(f"current node {current} is not in the tree")
    v = rng.random()
    log_s = (math.log(v) if v > 0.0 else -math.inf) + loglik(x, current)  # slice on f only
    cur_path = None
    lo, hi = 0.0, 1.0
    while True:
        u = lo + (hi - lo) * rng.random()
        node = find_node(u, state, prior, draw_theta, rng)
        if loglik(x, node) > log_s:
            return node
        if hi - lo < _MIN_BRACKET:
            return current
        # A rejected node is never the current one (f(node) <= s < f(cur)), so pre-order tells
        # on which side of the unstored u_cur it lies.
        if cur_path is None:
            cur_path = tree.path(current)
        if tree.path(node) < cur_path:
            lo = u
        else:
            hi = u


def slice_sweep(X: Any, z: Iterable[int], state: SliceState, prior: StickPrior, loglik: LogLik,
                draw_theta: DrawTheta, rng: np.random.Generator) -> np.ndarray:
    """Update every assignment once, in row order, with sticks and existing parameters fixed.

    Parameters
    ----------
    X : sequence of documents (anything indexable by row, e.g. an array)
    z : iterable of int
        Current node id of each row.

    Returns
    -------
    ndarray of int64
        The new assignments (``z`` itself is not modified).
    """
    out = np.array(list(z), dtype=np.int64)
    n_rows = X.shape[0] if hasattr(X, "shape") else len(X)
    if out.shape[0] != n_rows:
        raise ValueError("z must have one entry per row of X")
    for n in range(out.shape[0]):
        out[n] = slice_z(X[n], int(out[n]), state, prior, loglik, draw_theta, rng)
    return out


def pre_expand(state: SliceState, prior: StickPrior, draw_theta: DrawTheta, rng: np.random.Generator,
               *, tol: float) -> None:
    """Append children to every node above the cap until its unrepresented child mass
    ``prod_j (1 - psi_j)`` (relative to the node's branching mass) is below ``tol``.

    Needs a depth cap. Useful to make lazy creation rare (e.g. before a parallel slice sweep).
    """
    if state.tree.max_depth is None:
        raise ValueError("pre_expand needs a tree with a depth cap")
    if not 0.0 < tol < 1.0:
        raise ValueError(f"tol must be in (0, 1), got {tol}")
    log_tol = math.log(tol)
    stack = [ROOT]
    while stack:
        node = stack.pop()
        if state.tree.at_cap(node):
            continue
        acc = sum(state.log1m_psi[c] for c in state.tree.children[node])
        while acc >= log_tol:
            c = new_child(node, state, prior, draw_theta, rng)
            acc += state.log1m_psi[c]
        stack.extend(state.tree.children[node])


def prune_trailing_empty(state: SliceState, occupied: Iterable[int], protected: Iterable[int] = ()) -> list[int]:
    """Remove childless, unoccupied nodes that are their parent's last child, repeatedly.

    Such a node's sticks and parameter have their prior as conditional (no data below it, no
    later sibling holds data), so forgetting it and re-creating it lazily later is exact: it
    marginalises unrepresented parts of the infinite tree. Middle children are kept because the
    psi of an earlier sibling is informed by data in later ones. Returns the removed ids.
    """
    occ = {int(i) for i in occupied}
    keep = {int(i) for i in protected} | {ROOT}
    tree = state.tree
    removed: list[int] = []
    changed = True
    while changed:
        changed = False
        for node in list(tree.parent):
            if node in keep or node in occ or node not in tree or tree.children[node]:
                continue
            if tree.children[tree.parent[node]][-1] != node:
                continue
            tree.remove_subtree(node)
            for d in (state.log_nu, state.log1m_nu, state.log_psi, state.log1m_psi, state.theta):
                d.pop(node, None)
            removed.append(node)
            changed = True
    return removed
