"""The dTSSBP estimator: online inference of one topic tree per epoch.

Per epoch ``t`` (ALGORITHM: per-epoch driver):

1. Nodes alive after epoch ``t-1`` start with their previous parameters; the stick prior holds
   the counts of the last ``window`` epochs.
2. ``n_sweeps`` times: sample all sticks from their windowed Beta conditionals; run the
   enumerated blocked-Gibbs z-update over the documents (in shards, on the chosen engine);
   turn placeholders that received documents into new nodes; delete nodes whose windowed
   counts are all zero; re-estimate each node's concentration; update the node parameters by
   MAP, alternating even and odd depths.
3. Publish the :class:`~streamtree.epoch_tree.EpochTree`, push the epoch's counts into the
   window and delete nodes that fell out of it.
"""

from __future__ import annotations

import logging
import numbers
import time
from typing import Any

import numpy as np
import scipy.sparse as sp

from streamtree.engines.base import Engine
from streamtree.epoch_tree import EpochTree
from streamtree.inference import merge as merge_moves
from streamtree.inference.enumerated import LINEAR, VMF, Candidates, score_rows
from streamtree.inference.sticks import log_masses, mean_sticks, sample_sticks, stick_params
from streamtree.inference.theta_map import map_theta_gaussian, map_theta_vmf
from streamtree.likelihoods import gaussian as gauss
from streamtree.likelihoods import vmf
from streamtree.tree import ROOT, TSSBTree
from streamtree.variants import VARIANTS, resolve_variant
from streamtree.window import WindowedCounts, subtree_sums

logger = logging.getLogger(__name__)

_NORM_TOL = 1e-6
_MERGE_GRACE = 2  # sweeps a new node lives before it may be merged away


def _make_engine(engine, n_shards: int, n_threads: int, options: dict | None) -> Engine:
    if isinstance(engine, Engine):
        return engine
    if engine == "local":
        from streamtree.engines.local import LocalEngine

        return LocalEngine(n_shards=n_shards, n_threads=n_threads, **(options or {}))
    if engine == "ray":
        from streamtree.engines.ray import RayEngine

        return RayEngine(n_shards=n_shards, **(options or {}))
    raise ValueError(f"unknown engine {engine!r}; use 'local', 'ray' or an Engine instance")


def _seed_sequence(random_state) -> np.random.SeedSequence:
    if isinstance(random_state, np.random.SeedSequence):
        return random_state
    if random_state is None or isinstance(random_state, numbers.Integral):
        return np.random.SeedSequence(random_state)
    raise ValueError(f"random_state must be None, an int or a numpy SeedSequence, got {random_state!r}")


class DTSSBP:
    """Dependent tree-structured stick-breaking process, fitted online one epoch at a time.

    Parameters
    ----------
    likelihood : {"vmf", "gaussian"}
        von Mises-Fisher topics on L2-normalised term-frequency rows (CSR), or isotropic
        Gaussian nodes on real-valued rows (dense).
    variant : {"dtssbp", "o-tssbp", "t-tssbp", "ddp", "o-dp", "t-dp"}
        The model or one of the paper's baselines (see :mod:`streamtree.variants`).
    window : int or None
        Number of past epochs whose counts enter the stick priors (``None``: all of them,
        ``0``: independent epochs).
    max_depth : int
        Deepest allowed node depth, the root being at depth 0 (so ``max_depth=3`` gives trees
        with up to four levels). Nodes at the cap have nu = 1.
    alpha0, lam : float
        Stay-here stick concentration alpha(d) = alpha0 * lam**d.
    gamma : float
        Branch stick concentration.
    kappa0, kappa1, a : float
        vMF link strengths: parent link kappa0 * kappa1**d, previous-epoch link
        kappa0 * kappa1**(d + a). A new node's direction has prior vMF(theta_parent, kappa0 * kappa1**d).
    xi : float
        Time-link strength of the DP baselines.
    sigma0, sigma1, eta : float
        Gaussian variant: parent-link variance sigma0 * sigma1**d, previous-epoch link
        N(eta * theta_prev, sigma0 * sigma1**(d + a)) (the root links to its predecessor with
        mean theta_prev and variance sigma0 * sigma1**a).
    noise_var : float or None
        Gaussian variant: the observation variance sigma_x**2 shared by all nodes when known;
        ``None`` estimates it per node (pooled within-node variance).
    n_sweeps : int
        Gibbs sweeps per epoch.
    n_map_iter : int
        Maximum even/odd alternations of the MAP parameter step per sweep. The step starts
        from the previous sweep's parameters, so a few alternations per sweep suffice.
    merge_moves : bool
        After each sweep, offer every node at least two sweeps old a merge into its parent
        (see :mod:`streamtree.inference.merge`); this removes duplicate parent-child chains
        and unsupported proposals. Younger nodes are spared: they start near their parent and
        need a sweep or two to gather their documents.
    split_proposals : int
        Seeded child proposals per sweep (all but the last few sweeps of an epoch): after the
        MAP step, this many nodes holding at least ``2 * min_node_docs`` documents, drawn in
        proportion to their counts, each get a new child seeded by one of their documents
        drawn at random (direction halfway between the node and the document; the document
        itself for the Gaussian). Single-document births through the placeholder are rare in
        high dimension; seeded children let coherent groups split off, and the merge moves
        remove the proposals the data do not support. ``0`` disables proposals.
    min_node_docs : int
        Nodes with fewer documents keep their previous concentration (a newborn node starts
        with its parent's) instead of a noisy estimate.
    beta_bounds : (float, float)
        Clip range of vMF concentrations.
    engine : {"local", "ray"} or Engine
        Where the z-updates run.
    n_shards, n_threads : int
        Row shards per epoch (each has its own random stream; results depend on ``n_shards``
        but not on the engine or ``n_threads``) and local worker threads.
    engine_options : dict, optional
        Extra keyword arguments for the engine.
    random_state : int, numpy SeedSequence or None
        Seed; the same seed and shard count give bit-identical trees.

    Attributes
    ----------
    trees_ : list of EpochTree
        One tree per epoch seen.
    tree_ : TSSBTree
        The current tree structure.
    n_features_in_ : int
    """

    def __init__(
        self,
        likelihood: str = "vmf",
        variant: str = "dtssbp",
        window: int | None = 2,
        max_depth: int = 3,
        alpha0: float = 1.0,
        lam: float = 0.5,
        gamma: float = 0.5,
        kappa0: float = 1e4,
        kappa1: float = 1.0,
        a: float = 0.0,
        xi: float = 0.001,
        sigma0: float = 1.0,
        sigma1: float = 0.5,
        eta: float = 0.5,
        noise_var: float | None = None,
        n_sweeps: int = 50,
        n_map_iter: int = 3,
        merge_moves: bool = True,
        split_proposals: int = 2,
        min_node_docs: int = 2,
        beta_bounds: tuple[float, float] = (1e-3, 1e6),
        engine: Any = "local",
        n_shards: int = 1,
        n_threads: int = 1,
        engine_options: dict | None = None,
        random_state: Any = None,
    ) -> None:
        self.likelihood = likelihood
        self.variant = variant
        self.window = window
        self.max_depth = max_depth
        self.alpha0 = alpha0
        self.lam = lam
        self.gamma = gamma
        self.kappa0 = kappa0
        self.kappa1 = kappa1
        self.a = a
        self.xi = xi
        self.sigma0 = sigma0
        self.sigma1 = sigma1
        self.eta = eta
        self.noise_var = noise_var
        self.n_sweeps = n_sweeps
        self.n_map_iter = n_map_iter
        self.merge_moves = merge_moves
        self.split_proposals = split_proposals
        self.min_node_docs = min_node_docs
        self.beta_bounds = beta_bounds
        self.engine = engine
        self.n_shards = n_shards
        self.n_threads = n_threads
        self.engine_options = engine_options
        self.random_state = random_state

    # ------------------------------------------------------------------ scikit-learn plumbing
    def get_params(self, deep: bool = True) -> dict:
        import inspect

        names = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
        return {n: getattr(self, n) for n in names}

    def set_params(self, **params) -> "DTSSBP":
        valid = self.get_params()
        for k, v in params.items():
            if k not in valid:
                raise ValueError(f"invalid parameter {k!r} for DTSSBP")
            setattr(self, k, v)
        return self

    def __repr__(self) -> str:
        defaults = type(self)().get_params()
        changed = {k: v for k, v in self.get_params().items() if defaults.get(k) != v}
        return "DTSSBP(" + ", ".join(f"{k}={v!r}" for k, v in changed.items()) + ")"

    @classmethod
    def baseline(cls, name: str, **params) -> "DTSSBP":
        """The estimator configured as one of the paper's models (``variant=name``)."""
        return cls(variant=name, **params)

    # ------------------------------------------------------------------ validation
    def _check_params(self) -> None:
        if self.likelihood not in ("vmf", "gaussian"):
            raise ValueError(f"likelihood must be 'vmf' or 'gaussian', got {self.likelihood!r}")
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        if not (isinstance(self.max_depth, numbers.Integral) and self.max_depth >= 0):
            raise ValueError(f"max_depth must be a non-negative int, got {self.max_depth!r}")
        for name in ("alpha0", "gamma", "kappa0", "sigma0", "xi"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.lam <= 1:
            raise ValueError(f"lam must be in (0, 1], got {self.lam!r}")
        if not self.kappa1 > 0:
            raise ValueError(f"kappa1 must be > 0, got {self.kappa1!r}")
        if not 0 < self.sigma1:
            raise ValueError(f"sigma1 must be > 0, got {self.sigma1!r}")
        if self.noise_var is not None and not self.noise_var > 0:
            raise ValueError(f"noise_var must be > 0 or None, got {self.noise_var!r}")
        if not 0 <= self.eta < 1:
            raise ValueError(f"eta must be in [0, 1), got {self.eta!r}")
        if not (isinstance(self.n_sweeps, numbers.Integral) and self.n_sweeps >= 1):
            raise ValueError(f"n_sweeps must be a positive int, got {self.n_sweeps!r}")

    def _validate_X(self, X, first: bool):
        if self.likelihood == "vmf":
            if not sp.issparse(X):
                X = np.asarray(X, dtype=np.float64)
                if X.ndim != 2:
                    raise ValueError(f"X must be 2-D, got shape {X.shape}")
                X = sp.csr_matrix(X)
            X = sp.csr_matrix(X, dtype=np.float64)
            X.sort_indices()
            data = X.data
        else:
            if sp.issparse(X):
                X = X.toarray()
            X = np.ascontiguousarray(X, dtype=np.float64)
            if X.ndim != 2:
                raise ValueError(f"X must be 2-D, got shape {X.shape}")
            data = X
        if not np.all(np.isfinite(data)):
            raise ValueError("X contains NaN or infinite values")
        p = X.shape[1]
        if not first and p != self.n_features_in_:
            raise ValueError(f"X has {p} features, but the model was fitted with {self.n_features_in_}")
        if self.likelihood == "vmf" and X.shape[0]:
            norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
            bad = np.flatnonzero(np.abs(norms - 1.0) > _NORM_TOL)
            if bad.size:
                empty = bad[norms[bad] == 0]
                hint = (f"{empty.size} rows are all zeros (e.g. row {empty[0]}): drop empty documents first"
                        if empty.size else "normalise rows, e.g. sklearn.preprocessing.normalize(X)")
                raise ValueError(f"the vMF likelihood needs L2-normalised rows; {bad.size} rows are not "
                                 f"(first: row {bad[0]}, norm {norms[bad[0]]:.6g}); {hint}")
        return X

    # ------------------------------------------------------------------ state
    def _init_state(self, p: int) -> None:
        self._check_params()
        self.config_ = resolve_variant(self.variant, window=self.window, max_depth=self.max_depth,
                                       gamma=self.gamma, xi=self.xi)
        self.n_features_in_ = p
        self.tree_ = TSSBTree(self.config_.max_depth)
        self.window_counts_ = WindowedCounts(self.config_.window)
        self.theta_: dict[int, np.ndarray] = {}
        self.beta_: dict[int, float] = {}
        self.trees_: list[EpochTree] = []
        self._seeds = _seed_sequence(self.random_state)
        self._engine = _make_engine(self.engine, self.n_shards, self.n_threads, self.engine_options)
        self._root_parent = None

    def _link_strengths(self, depth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-node (parent, time) link strengths for vMF; variances for the Gaussian."""
        c = self.config_
        d = depth.astype(np.float64)
        if self.likelihood == "vmf":
            par = self.kappa0 * self.kappa1 ** d if c.parent_link else np.zeros_like(d)
            if not c.time_link:
                tim = np.zeros_like(d)
            elif c.time_kappa is not None:
                tim = np.full_like(d, c.time_kappa)
            else:
                tim = self.kappa0 * self.kappa1 ** (d + self.a)
            return par, tim
        par = self.sigma0 * self.sigma1 ** d if c.parent_link else np.full_like(d, np.inf)
        if not c.time_link:
            tim = np.full_like(d, np.inf)
        elif c.time_kappa is not None:
            tim = np.full_like(d, 1.0 / c.time_kappa)
        else:
            tim = self.sigma0 * self.sigma1 ** (d + self.a)
        return par, tim

    def _new_node_prior(self, depth: int) -> float:
        """vMF: prior concentration of a new node around its parent; Gaussian: prior variance."""
        if self.likelihood == "vmf":
            return self.kappa0 * self.kappa1 ** depth if self.config_.parent_link else 0.0
        return self.sigma0 * self.sigma1 ** depth if self.config_.parent_link else self.sigma0

    # ------------------------------------------------------------------ public API
    def fit(self, X, y=None, *, epochs=None) -> "DTSSBP":
        """Fit from scratch on a sequence of epochs.

        Parameters
        ----------
        X : sequence of matrices (one per epoch), or one matrix with ``epochs`` giving each
            row's epoch (rows are grouped by sorted epoch value).
        """
        if hasattr(self, "trees_"):
            del self.trees_
        if epochs is None:
            batches = list(X)
        else:
            epochs = np.asarray(epochs)
            if epochs.shape[0] != X.shape[0]:
                raise ValueError(f"epochs has {epochs.shape[0]} entries for {X.shape[0]} rows")
            batches = [X[np.flatnonzero(epochs == e)] for e in np.unique(epochs)]
        for t, Xt in enumerate(batches):
            self.partial_fit(Xt, epoch=t)
        return self

    def partial_fit(self, X, y=None, *, epoch: int | None = None, label: str | None = None) -> EpochTree:
        """Run inference for one epoch and return its tree.

        Parameters
        ----------
        X : CSR matrix (vMF, rows L2-normalised) or ndarray (Gaussian), shape (n, p)
            The epoch's training documents. ``n = 0`` is an empty epoch: the tree is carried
            forward unchanged and the stick window still advances.
        epoch : int, optional
            Epoch index (default: one more than the last). Must increase.
        label : str, optional
            Human label stored in the EpochTree.
        """
        first = not hasattr(self, "trees_")
        if first:
            self._check_params()
        X = self._validate_X(X, first)
        if first:
            self._init_state(X.shape[1])
        if epoch is None:
            epoch = self.trees_[-1].epoch + 1 if self.trees_ else 0
        if self.trees_ and epoch <= self.trees_[-1].epoch:
            raise ValueError(f"epoch {epoch} is not after the last fitted epoch {self.trees_[-1].epoch}")
        start = time.perf_counter()
        ss = self._seeds.spawn(1)[0]
        children = ss.spawn(1 + self._engine.n_shards)
        rng = np.random.Generator(np.random.PCG64(children[0]))
        tree = self._run_epoch(X, int(epoch), label, rng, children[1:])
        self.trees_.append(tree)
        logger.info("epoch %s: %d documents, %d nodes (%d born, %d died) in %.2fs", epoch, X.shape[0],
                    tree.n_nodes, int(np.sum(tree.born == epoch)), tree.died.size, time.perf_counter() - start)
        return tree

    def score_samples(self, X, normalized: bool = True) -> np.ndarray:
        """Log predictive density of each row under the tree of the last fitted epoch.

        The density is the mixture over live nodes (posterior-mean sticks, node parameters and
        concentrations at the end of the epoch) plus, for every node above the depth cap, the
        mass of its unseen children times the new-node marginal.

        Parameters
        ----------
        normalized : bool
            ``False`` drops the vMF normalisers C_p(beta) (the paper's "unnormalised" score):
            log sum_e pi_e exp(beta_e theta_e . x).
        """
        if not hasattr(self, "predictive_"):
            raise RuntimeError("this DTSSBP is not fitted yet; call partial_fit first")
        X = self._validate_X(X, first=False)
        cand = self.predictive_ if normalized else self._predictive_unnormalized
        if self.likelihood == "gaussian" and not normalized:
            raise ValueError("normalized=False is only defined for the vMF likelihood")
        _, lognorm = score_rows(X, cand, None)
        return lognorm

    def close(self) -> None:
        """Release the engine's resources (Ray actors, shard copies). The fitted state stays."""
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.close()

    def __enter__(self) -> "DTSSBP":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ checkpoints
    _CHECKPOINT_FORMAT = 1
    _TREE_FIELDS = ("node_ids", "parent", "depth", "mass", "counts", "subtree_counts", "window_counts",
                    "theta", "concentration", "born", "assignments", "died")
    _CANDIDATE_FIELDS = ("theta_T", "live_a", "live_b", "live_c", "ph_parent", "ph_a", "ph_b", "ph_c")

    def get_checkpoint(self) -> tuple[dict[str, np.ndarray], dict]:
        """Everything needed to continue after the last fitted epoch.

        Returns named numeric arrays and a JSON-serialisable ``meta`` dict (parameters,
        SeedSequence state, last epoch); :meth:`from_checkpoint` rebuilds the model, and
        continuing it gives bit-identical trees to a model that was never stopped.
        """
        if not hasattr(self, "trees_") or not self.trees_:
            raise RuntimeError("this DTSSBP is not fitted yet; call partial_fit first")
        tree = self.tree_
        ids = tree.preorder()  # children appear in stick order, so the order is rebuilt exactly
        arrays: dict[str, np.ndarray] = {
            "tree_ids": np.asarray(ids, dtype=np.int64),
            "tree_parent": np.asarray([tree.parent[i] for i in ids], dtype=np.int64),
            "tree_born": np.asarray([tree.born[i] for i in ids], dtype=np.int64),
            "theta": np.stack([self.theta_[i] for i in ids]),
            "beta": np.asarray([self.beta_[i] for i in ids], dtype=np.float64),
        }
        hist = list(self.window_counts_.history)
        arrays["window_epoch"] = np.asarray([j for j, snap in enumerate(hist) for _ in snap], dtype=np.int64)
        arrays["window_node"] = np.asarray([k for snap in hist for k in snap], dtype=np.int64)
        arrays["window_count"] = np.asarray([v for snap in hist for v in snap.values()], dtype=np.int64)
        if self._root_parent is not None:
            arrays["root_parent"] = np.asarray(self._root_parent, dtype=np.float64)
        last = self.trees_[-1]
        for name in self._TREE_FIELDS:
            arrays[f"last_{name}"] = np.asarray(getattr(last, name))
        preds = {"predictive": getattr(self, "predictive_", None),
                 "unnormalized": getattr(self, "_predictive_unnormalized", None)}
        kinds = {}
        for prefix, cand in preds.items():
            if cand is None:
                continue
            kinds[prefix] = int(cand.kind)
            for name in self._CANDIDATE_FIELDS:
                arrays[f"{prefix}_{name}"] = np.asarray(getattr(cand, name))
        params = self.get_params()
        if not isinstance(params["engine"], str):
            params["engine"] = "local"
        params["beta_bounds"] = list(params["beta_bounds"])
        ss = self._seeds
        meta = {
            "format": "streamtree-dtssbp-checkpoint", "format_version": self._CHECKPOINT_FORMAT,
            "params": params, "n_features_in": int(self.n_features_in_), "next_id": int(tree.next_id),
            "window_epochs": len(hist),
            "seed_sequence": {"entropy": ss.entropy, "spawn_key": list(ss.spawn_key), "pool_size": ss.pool_size,
                              "n_children_spawned": ss.n_children_spawned},
            "last_epoch": int(last.epoch), "last_label": last.label, "candidates": kinds,
        }
        return arrays, meta

    @classmethod
    def from_checkpoint(cls, arrays: dict[str, np.ndarray], meta: dict, **overrides) -> "DTSSBP":
        """Rebuild a model from :meth:`get_checkpoint` output; ``overrides`` set run-location
        parameters (``engine``, ``n_threads``, ``engine_options``). ``trees_`` holds only the
        last epoch's tree."""
        if meta.get("format") != "streamtree-dtssbp-checkpoint" or meta.get("format_version") != cls._CHECKPOINT_FORMAT:
            raise ValueError("not a DTSSBP checkpoint of a version this release reads")
        params = dict(meta["params"])
        params["beta_bounds"] = tuple(params["beta_bounds"])
        params.update(overrides)
        model = cls(**params)
        model._check_params()
        model.config_ = resolve_variant(model.variant, window=model.window, max_depth=model.max_depth,
                                        gamma=model.gamma, xi=model.xi)
        model.n_features_in_ = int(meta["n_features_in"])
        tree = TSSBTree(model.config_.max_depth)
        ids = arrays["tree_ids"].tolist()
        for nid, par, born in zip(ids, arrays["tree_parent"].tolist(), arrays["tree_born"].tolist()):
            if par == -1:
                tree.born[nid] = born
                continue
            tree.parent[nid] = par
            tree.children[nid] = []
            tree.children[par].append(nid)
            tree.depth[nid] = tree.depth[par] + 1
            tree.born[nid] = born
        tree.next_id = int(meta["next_id"])
        model.tree_ = tree
        model.theta_ = {nid: np.array(row) for nid, row in zip(ids, arrays["theta"])}
        model.beta_ = {nid: float(b) for nid, b in zip(ids, arrays["beta"])}
        win = WindowedCounts(model.config_.window)
        snaps = [dict() for _ in range(int(meta["window_epochs"]))]
        for j, k, v in zip(arrays["window_epoch"].tolist(), arrays["window_node"].tolist(),
                           arrays["window_count"].tolist()):
            snaps[j][k] = v
        for snap in snaps:
            win.history.append(snap)
            for k, v in snap.items():
                win.total[k] = win.total.get(k, 0) + v
        model.window_counts_ = win
        model._root_parent = np.array(arrays["root_parent"]) if "root_parent" in arrays else None
        last = {name: np.array(arrays[f"last_{name}"]) for name in cls._TREE_FIELDS}
        model.trees_ = [EpochTree(epoch=int(meta["last_epoch"]), label=meta["last_label"], **last)]
        for prefix, kind in meta["candidates"].items():
            cand = Candidates(kind, *(np.array(arrays[f"{prefix}_{n}"]) for n in cls._CANDIDATE_FIELDS))
            setattr(model, "predictive_" if prefix == "predictive" else "_predictive_unnormalized", cand)
        s = meta["seed_sequence"]
        model._seeds = np.random.SeedSequence(s["entropy"], spawn_key=tuple(s["spawn_key"]),
                                              pool_size=s["pool_size"], n_children_spawned=s["n_children_spawned"])
        model._engine = _make_engine(model.engine, model.n_shards, model.n_threads, model.engine_options)
        return model

    # ------------------------------------------------------------------ inference
    def _own_counts(self, ids: np.ndarray, current: dict[int, int]) -> np.ndarray:
        return self.window_counts_.counts(ids) + np.array([current.get(int(i), 0) for i in ids], dtype=np.int64)

    def _candidates(self, arrays, log_pi, log_res, normalized: bool = True) -> tuple[Candidates, np.ndarray]:
        """Broadcast state of a sweep; also returns the parent row of each placeholder."""
        ids = arrays.ids
        theta = np.stack([self.theta_[int(i)] for i in ids])
        conc = np.array([self.beta_[int(i)] for i in ids])
        p = self.n_features_in_
        ph_rows = np.flatnonzero(np.isfinite(log_res))
        ph_depth = arrays.depth[ph_rows] + 1
        prior = np.array([self._new_node_prior(int(d)) for d in ph_depth])
        if self.likelihood == "vmf":
            logc = vmf.log_normalizer(p, conc) if normalized else np.zeros_like(conc)
            live_a = log_pi + logc
            live_b, live_c = conc, np.zeros_like(conc)
            b = conc[ph_rows]
            ph_a = log_res[ph_rows] + vmf.log_normalizer(p, b) + vmf.log_normalizer(p, prior)
            if not normalized:  # keep the new-node term on the same footing as live nodes
                ph_a = ph_a - vmf.log_normalizer(p, b)
            cand = Candidates(VMF, np.ascontiguousarray(theta.T), live_a, live_b, live_c,
                              ph_rows.astype(np.int64), ph_a, b.astype(np.float64), prior)
        else:
            var = 1.0 / conc
            sq = np.einsum("ij,ij->i", theta, theta)
            live_a = log_pi - sq / (2 * var) - 0.5 * p * np.log(2 * np.pi * var)
            v = prior + var[ph_rows]
            ph_a = log_res[ph_rows] - sq[ph_rows] / (2 * v) - 0.5 * p * np.log(2 * np.pi * v)
            cand = Candidates(LINEAR, np.ascontiguousarray(theta.T), live_a, 1.0 / var, -0.5 / var,
                              ph_rows.astype(np.int64), ph_a, 1.0 / v, -0.5 / v)
        return cand, ph_rows

    def _materialise(self, arrays, cand, ph_rows, stats, epoch: int) -> tuple[np.ndarray, dict, dict, dict]:
        """Turn occupied placeholders into nodes; per-node counts, sums and sums of squares."""
        col_ids = np.full(cand.n_columns, -1, dtype=np.int64)
        col_ids[: cand.n_live] = arrays.ids
        row_of = {int(c): r for r, c in enumerate(stats.occupied)}
        p = self.n_features_in_
        for j, prow in enumerate(ph_rows):
            col = cand.n_live + j
            if stats.counts[col] == 0:
                continue
            parent = int(arrays.ids[prow])
            nid = self.tree_.add_child(parent, born=epoch)
            self._born_sweep[nid] = self._sweep
            col_ids[col] = nid
            s = stats.sums[row_of[col]]
            prior = self._new_node_prior(self.tree_.depth[nid])
            b = self.beta_[parent]
            if self.likelihood == "vmf":
                eta = prior * self.theta_[parent] + b * s
                nrm = np.linalg.norm(eta)
                self.theta_[nid] = eta / nrm if nrm > 0 else self.theta_[parent].copy()
            else:
                var = 1.0 / b
                n = stats.counts[col]
                self.theta_[nid] = (self.theta_[parent] / prior + s / var) / (1.0 / prior + n / var)
            self.beta_[nid] = b
        counts, sums, sumsq = {}, {}, {}
        for col in stats.occupied:
            nid = int(col_ids[col])
            counts[nid] = int(stats.counts[col])
            sums[nid] = stats.sums[row_of[int(col)]]
            sumsq[nid] = float(stats.sumsq[col])
        del p
        return col_ids, counts, sums, sumsq

    def _cull(self, current: dict[int, int]) -> list[int]:
        """Delete subtrees whose windowed counts (past window plus live epoch) are all zero."""
        arrays = self.tree_.arrays()
        S = subtree_sums(arrays.parent_index, self._own_counts(arrays.ids, current))
        removed: list[int] = []
        for k in range(1, arrays.size):
            nid = int(arrays.ids[k])
            if S[k] == 0 and nid in self.tree_:
                removed.extend(self.tree_.remove_subtree(nid))
        for nid in removed:
            self.theta_.pop(nid, None)
            self.beta_.pop(nid, None)
        self.window_counts_.forget(removed)
        return removed

    def _propose_children(self, stats, col_ids: np.ndarray, current: dict[int, int], epoch: int,
                          rng: np.random.Generator) -> None:
        """Seed up to ``split_proposals`` new children from random member documents of nodes
        drawn in proportion to their document counts."""
        if stats.seeds is None:
            return
        tree = self.tree_
        rows, weights = [], []
        for r, col in enumerate(stats.occupied):
            nid = int(col_ids[col])
            n = current.get(nid, 0)
            if nid in tree and n >= 2 * self.min_node_docs:
                rows.append(r)
                weights.append(float(n))
        if not rows:
            return
        k = min(int(self.split_proposals), len(rows))
        w = np.asarray(weights)
        picks = rng.choice(len(rows), size=k, replace=False, p=w / w.sum())
        for i in picks:
            r = rows[i]
            nid = int(col_ids[stats.occupied[r]])
            x = stats.seeds[r]
            x = np.asarray(x.toarray()).ravel() if sp.issparse(x) else np.asarray(x, dtype=np.float64).ravel()
            if self.likelihood == "vmf":
                v = x / max(np.linalg.norm(x), 1e-300) + self.theta_[nid]
                theta = v / np.linalg.norm(v)
            else:
                theta = x.copy()
            parent = self._best_attachment(nid, theta)
            if parent is None:
                continue
            child = tree.add_child(parent, born=epoch)
            self._born_sweep[child] = self._sweep
            self.theta_[child] = theta
            self.beta_[child] = self.beta_[nid]

    def _best_attachment(self, nid: int, theta: np.ndarray) -> int | None:
        """The node on the path from ``nid`` to the root (above the depth cap) under which a new
        child with parameter ``theta`` has the highest parent-link log density."""
        tree = self.tree_
        best, best_score = None, -np.inf
        a = nid
        while a >= 0:
            if not tree.at_cap(a):
                d = tree.depth[a] + 1
                prior = self._new_node_prior(d)
                if self.likelihood == "vmf":
                    score = float(vmf.log_normalizer(self.n_features_in_, prior) + prior * theta @ self.theta_[a])
                else:
                    diff = theta - self.theta_[a]
                    score = float(-diff @ diff / (2 * prior) - 0.5 * theta.shape[0] * np.log(2 * np.pi * prior))
                if score > best_score:
                    best, best_score = a, score
            a = tree.parent[a]
        return best

    def _prior_kwargs(self) -> dict:
        c = self.config_
        return dict(alpha0=self.alpha0, lam=self.lam, gamma=c.gamma, max_depth=c.max_depth,
                    root_holds_data=c.root_holds_data)

    def _merge_step(self, current: dict[int, int], sums: dict[int, np.ndarray], sumsq: dict[int, float],
                    col_ids: np.ndarray, rng: np.random.Generator) -> None:
        """Heat-bath choice, node by node (leaves first), between keeping it and merging it into its parent."""
        tree, win = self.tree_, self.window_counts_
        p = self.n_features_in_
        kw = self._prior_kwargs()

        def prior_of(t: TSSBTree, past: dict[int, int], now: dict[int, int]) -> float:
            arr = t.arrays()
            return merge_moves.collapsed_log_prior(
                arr, np.array([past.get(int(i), 0) for i in arr.ids], dtype=np.float64),
                np.array([now.get(int(i), 0) for i in arr.ids], dtype=np.float64), **kw)

        past = dict(win.total)
        before = prior_of(tree, past, current)
        log_total = np.log(sum(past.values()) + sum(current.values()) + 2.0)
        for c in reversed(tree.preorder()):
            if c == ROOT or c not in tree:
                continue
            if self._sweep - self._born_sweep.get(c, -_MERGE_GRACE) < _MERGE_GRACE:
                continue  # too young: a new node needs a few sweeps to gather its documents
            par = tree.parent[c]
            if par == ROOT and not self.config_.root_holds_data:
                continue
            n = current.get(c, 0)
            data = 0.0
            if n:
                s = sums[c]
                prior = self._new_node_prior(tree.depth[c])
                if self.likelihood == "vmf":
                    data = (merge_moves.vmf_group_log_likelihood(n, s, self.theta_[par], self.beta_[par], p)
                            - merge_moves.vmf_group_log_marginal(n, s, self.theta_[par], prior, self.beta_[par], p))
                else:
                    data = (merge_moves.gaussian_group_log_likelihood(n, s, sumsq[c], self.theta_[par],
                                                                      1.0 / self.beta_[par])
                            - merge_moves.gaussian_group_log_marginal(n, s, sumsq[c], self.theta_[par], prior,
                                                                      1.0 / self.beta_[c]))
            # The stick prior's gain from a merge grows like (documents moved) x log(total); when
            # the data's Bayes factor is far beyond any such gain, skip the O(K) prior evaluation.
            if data < -(n + past.get(c, 0) + 1) * 3.0 * log_total - 20.0:
                continue
            trial = tree.copy()
            trial.merge_into_parent(c)
            past_m = dict(past)
            if c in past_m:
                past_m[par] = past_m.get(par, 0) + past_m.pop(c)
            now_m = dict(current)
            if c in now_m:
                now_m[par] = now_m.get(par, 0) + now_m.pop(c)
            after = prior_of(trial, past_m, now_m)
            delta = data + after - before
            # merge with probability 1 / (1 + exp(-delta)), in log space
            if np.log(rng.random()) >= -np.logaddexp(0.0, -delta):
                continue  # keep the node
            tree.merge_into_parent(c)
            win.merge(c, par)
            past, current_new = past_m, now_m
            current.clear()
            current.update(current_new)
            if n:
                sums[par] = sums[par] + sums.pop(c) if par in sums else sums.pop(c)
                sumsq[par] = sumsq.get(par, 0.0) + sumsq.pop(c)
            self.theta_.pop(c)
            self.beta_.pop(c)
            col_ids[col_ids == c] = par
            before = after

    def _update_concentrations(self, counts: dict[int, int], sums: dict[int, np.ndarray],
                               sumsq: dict[int, float]) -> None:
        ids = [nid for nid, n in counts.items() if n >= self.min_node_docs and nid in self.tree_]
        if not ids:
            return
        n = np.array([counts[i] for i in ids], dtype=np.float64)
        if self.likelihood == "vmf":
            r = np.array([np.linalg.norm(sums[i]) for i in ids])
            lo, hi = self.beta_bounds
            est = vmf.estimate_concentration(r, n, self.n_features_in_, min_count=self.min_node_docs,
                                             fallback=np.array([self.beta_[i] for i in ids]),
                                             kappa_min=lo, kappa_max=hi)
            for i, b in zip(ids, est):
                self.beta_[i] = float(b)
        elif self.noise_var is not None:
            for i in ids:
                self.beta_[i] = 1.0 / self.noise_var
        else:
            S = np.stack([sums[i] for i in ids])
            Q = np.array([sumsq[i] for i in ids])
            var = gauss.estimate_noise_variance(S, Q, n, self.n_features_in_, min_count=self.min_node_docs,
                                                fallback=np.array([1.0 / self.beta_[i] for i in ids]))
            for i, v in zip(ids, var):
                self.beta_[i] = float(1.0 / v)

    def _map_step(self, sums: dict[int, np.ndarray], counts: dict[int, int], prev: dict[int, np.ndarray],
                  epoch: int) -> None:
        arrays = self.tree_.arrays()
        ids = arrays.ids
        K, p = arrays.size, self.n_features_in_
        theta = np.stack([self.theta_[int(i)] for i in ids])
        S = np.zeros((K, p))
        n = np.zeros(K)
        for k, i in enumerate(ids):
            if int(i) in sums:
                S[k] = sums[int(i)]
                n[k] = counts[int(i)]
        has_prev = np.array([int(i) in prev for i in ids])
        P = np.stack([prev.get(int(i), theta[k]) for k, i in enumerate(ids)])
        update = np.ones(K, dtype=bool)
        if self.config_.freeze_after_birth:
            update = np.array([self.tree_.born[int(i)] == epoch for i in ids])
        conc = np.array([self.beta_[int(i)] for i in ids])
        par, tim = self._link_strengths(arrays.depth)
        if self.likelihood == "vmf":
            new = map_theta_vmf(arrays, theta, S, conc, P, has_prev, self._root_parent, par, tim,
                                update=update, n_iter=self.n_map_iter)
        else:
            time_coef = np.where(arrays.parent_index >= 0, self.eta, 1.0)
            time_var = tim.copy()
            if self.config_.time_link and self.config_.time_kappa is None:
                time_var[0] = self.sigma0 * self.sigma1 ** self.a
            new = map_theta_gaussian(arrays, theta, S, n, 1.0 / conc, P, has_prev, par, time_coef, time_var,
                                     update=update, n_iter=self.n_map_iter)
        for k, i in enumerate(ids):
            self.theta_[int(i)] = new[k]

    def _root_direction(self, X) -> np.ndarray:
        if self.likelihood == "vmf":
            m = np.asarray(X.mean(axis=0)).ravel()
            nrm = np.linalg.norm(m)
            return m / nrm if nrm > 0 else np.full(m.shape[0], 1.0 / np.sqrt(m.shape[0]))
        return np.asarray(X.mean(axis=0)).ravel()

    def _init_root(self, X) -> None:
        """First epoch: all documents at the root, whose parameters come from all the data."""
        n, p = X.shape
        self.theta_[ROOT] = self._root_direction(X)
        if self.likelihood == "vmf":
            r = np.linalg.norm(np.asarray(X.sum(axis=0)).ravel())
            lo, hi = self.beta_bounds
            b = vmf.estimate_concentration(np.array([r]), np.array([float(n)]), p, min_count=2,
                                           fallback=np.array([lo]), kappa_min=lo, kappa_max=hi)
            self.beta_[ROOT] = float(b[0])
        elif self.noise_var is not None:
            self.beta_[ROOT] = 1.0 / self.noise_var
        else:
            mean = self.theta_[ROOT]
            sq = float(np.einsum("ij,ij->", X, X))
            var = gauss.estimate_noise_variance(mean[None] * n, np.array([sq]), np.array([float(n)]), p,
                                                min_count=2, fallback=np.array([1.0]))
            self.beta_[ROOT] = float(1.0 / var[0])

    def _run_epoch(self, X, epoch: int, label: str | None, rng: np.random.Generator,
                   shard_seeds: list[np.random.SeedSequence]) -> EpochTree:
        n = X.shape[0]
        prev_ids = set(self.trees_[-1].node_ids.tolist()) if self.trees_ else set()
        if not self.theta_:
            if n == 0:
                raise ValueError("the first epoch must contain documents")
            self._init_root(X)
        if n:
            self._root_parent = self._root_direction(X)
        prev = {i: t.copy() for i, t in self.theta_.items()} if self.trees_ else {}
        current: dict[int, int] = {ROOT: n} if not self.trees_ else {}
        col_ids = np.zeros(0, dtype=np.int64)
        engine = self._engine
        if n:
            engine.load(X, list(shard_seeds))
        self._born_sweep: dict[int, int] = {}
        for sweep in range(self.n_sweeps if n else 0):
            self._sweep = sweep
            arrays = self.tree_.arrays()
            params = stick_params(arrays, self._own_counts(arrays.ids, current), alpha0=self.alpha0, lam=self.lam,
                                  gamma=self.config_.gamma, max_depth=self.config_.max_depth,
                                  root_holds_data=self.config_.root_holds_data)
            log_pi, log_res = log_masses(arrays, sample_sticks(params, rng))
            cand, ph_rows = self._candidates(arrays, log_pi, log_res)
            stats = engine.sweep(cand)
            col_ids, current, sums, sumsq = self._materialise(arrays, cand, ph_rows, stats, epoch)
            self._cull(current)
            if self.merge_moves:
                self._merge_step(current, sums, sumsq, col_ids, rng)
            self._update_concentrations(current, sums, sumsq)
            self._map_step(sums, current, prev, epoch)
            if self.split_proposals > 0 and sweep < self.n_sweeps - 1 - _MERGE_GRACE:
                self._propose_children(stats, col_ids, current, epoch, rng)
            logger.debug("epoch %d sweep %d: %d nodes, log p(x) %.4g", epoch, sweep, len(self.tree_), stats.loglik)
        labels = col_ids[engine.labels()] if n else np.zeros(0, dtype=np.int64)
        tree = self._snapshot(epoch, label, current, labels, prev_ids)
        # the predictive state of this epoch, before the window moves on
        arrays = self.tree_.arrays()
        params = stick_params(arrays, self._own_counts(arrays.ids, current), alpha0=self.alpha0, lam=self.lam,
                              gamma=self.config_.gamma, max_depth=self.config_.max_depth,
                              root_holds_data=self.config_.root_holds_data)
        log_pi, log_res = log_masses(arrays, mean_sticks(params))
        self.predictive_, _ = self._candidates(arrays, log_pi, log_res)
        if self.likelihood == "vmf":
            self._predictive_unnormalized, _ = self._candidates(arrays, log_pi, log_res, normalized=False)
        self.window_counts_.commit(current)
        self._cull({})
        return tree

    def _snapshot(self, epoch, label, current, labels, prev_ids) -> EpochTree:
        arrays = self.tree_.arrays()
        ids = arrays.ids
        own_now = np.array([current.get(int(i), 0) for i in ids], dtype=np.int64)
        own_win = self._own_counts(ids, current)
        params = stick_params(arrays, own_win, alpha0=self.alpha0, lam=self.lam, gamma=self.config_.gamma,
                              max_depth=self.config_.max_depth, root_holds_data=self.config_.root_holds_data)
        log_pi, _ = log_masses(arrays, mean_sticks(params))
        parent = np.where(arrays.parent_index >= 0, ids[np.maximum(arrays.parent_index, 0)], -1)
        died = np.array(sorted(prev_ids - set(ids.tolist())), dtype=np.int64)
        return EpochTree(
            epoch=epoch,
            node_ids=ids.copy(),
            parent=parent.astype(np.int64),
            depth=arrays.depth.copy(),
            mass=np.exp(log_pi),
            counts=own_now,
            subtree_counts=subtree_sums(arrays.parent_index, own_now).astype(np.int64),
            window_counts=own_win,
            theta=np.stack([self.theta_[int(i)] for i in ids]),
            concentration=np.array([self.beta_[int(i)] for i in ids]),
            born=np.array([self.tree_.born[int(i)] for i in ids], dtype=np.int64),
            assignments=labels.astype(np.int64),
            died=died,
            label=label,
        )
