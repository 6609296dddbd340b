"""The dTSSBP estimator: online inference of one topic tree per epoch.

:class:`DTSSBP` validates its parameters, holds the fitted state and delegates: one epoch's
sweeps run in :class:`~streamtree.inference.epoch_sampler.EpochSampler`, the observation family
is a :class:`~streamtree.likelihoods.base.Likelihood` and the z-updates run on a
:class:`~streamtree.inference.zsweep.ZSweeper` (an engine, resolved by name through the core's
registry or passed in).
"""

from __future__ import annotations

import copy
import logging
import numbers
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError
from sklearn.utils._param_validation import HasMethods, Interval, StrOptions, validate_parameter_constraints

from streamtree.epoch_tree import EpochTree
from streamtree.inference.epoch_sampler import (CHECKPOINT_FORMAT, ChainState, EpochSampler, SamplerSettings,
                                                apply_link_strengths, predictive_masses)
from streamtree.inference.threads import fitting_threads
from streamtree.inference.zsweep import engine_names, make_engine
from streamtree.likelihoods import DEFAULT_LIKELIHOOD, LIKELIHOODS, Likelihood
from streamtree.variants import VARIANTS, VariantConfig, resolve_variant

logger = logging.getLogger(__name__)

# parameters that say where the model runs, not what it computes (they may differ on restore)
RUN_LOCATION_PARAMS = ("engine", "n_jobs", "engine_options")
#: parameters a checkpoint may lack (written before they existed), with the value that
#: continues such a chain as it was fitted, whatever the default is now
PARAMS_BEFORE_ADDED = {"document_concentration": None, "document_weights": False, "split_node": "fixed"}


class DTSSBP(BaseEstimator):
    """Dependent tree-structured stick-breaking process, fitted online one epoch at a time.

    Parameters
    ----------
    likelihood : {"multinomial", "vmf", "gaussian"}, default="multinomial"
        Word distributions over raw term counts (CSR) with Dirichlet links, the default for
        text (``TextVectorizer()``'s rows); von Mises-Fisher topics on directions of CSR rows
        whose norms are document weights (``TextVectorizer(norm="l2")``; unit rows, such as
        normalised embeddings, weigh 1: see ``document_weights``); or isotropic Gaussian nodes on
        real-valued rows (dense). See :mod:`streamtree.likelihoods` and
        :data:`~streamtree.likelihoods.DEFAULT_LIKELIHOOD` for why counts are the default.
    variant : {"dtssbp", "o-tssbp", "t-tssbp", "ddp", "o-dp", "t-dp"}
        The model or one of the paper's baselines (see :mod:`streamtree.variants`).
    window : int or None
        Number of past epochs whose counts enter the stick priors (``None``: all of them,
        ``0``: independent epochs).
    max_depth : int
        Deepest allowed node depth, the root being at depth 0 (so ``max_depth=3`` gives trees
        with up to four levels; at least 1: a root alone is one topic). Nodes at the cap have
        nu = 1.
    alpha0, lam : float
        Stay-here stick concentration alpha(d) = alpha0 * lam**d.
    gamma : float
        Branch stick concentration.
    kappa0 : float or "auto"
        Link strength of vMF directions and multinomial word distributions: parent link
        kappa0 * kappa1**d, previous-epoch link kappa0 * kappa1**(d + a). A new node's
        parameter has its parent link as prior, so kappa0 governs the size of the trees.
        The default 1e3 is where held-out selection on the bundled SOU corpus (over 10 to
        1e4) and planted hierarchical-Dirichlet trees (V = 2,000) agree. ``"auto"`` chooses
        it from the data, by the family's rule, after every sweep (the value in use is
        ``kappa0_``): vMF, the unit-information link, kappa0 equal to the pooled document
        concentration
        (:meth:`~streamtree.likelihoods.vmf.VonMisesFisher.estimate_link_strength`);
        multinomial, empirical Bayes, the maximiser of the collapsed marginal likelihood of
        the parent links (:meth:`~streamtree.likelihoods.multinomial.Multinomial.estimate_link_strength`),
        and of the time link on its own (``time_strength`` in the chain's ``hyper``).
        ``"auto"`` is not the default: it helps vMF on planted corpora, but on short real
        documents the pooled concentration of a finer tree is higher, which makes the tree
        finer still (SOU paragraphs: kappa0_ rises to 1.8e3-4.3e3 and the trees become swarms
        of small nodes). The Gaussian family does not use kappa0.
    document_concentration : "auto", float or None
        Multinomial likelihood: how words repeat within a document. ``"auto"`` (the default)
        or a number ``s``: bursty documents, ``x ~ DCM(x | s phi)`` (each document draws its
        own distribution from ``Dir(s phi)`` around its node's word distribution ``phi``, so a
        word used once is likely to come again), fitted through per-word table counts drawn
        every sweep (:mod:`streamtree.likelihoods.document_tables`); ``"auto"`` slice-samples
        ``s`` (the value in use is ``document_concentration`` in the chain's ``state_.hyper``),
        which grows large, towards independent tokens, when the documents repeat their words
        no more than ``phi`` predicts. ``None``: a document's tokens are independent draws
        from ``phi``. Real text is bursty, and under independent draws a document's repeated
        words make a node of its own likelier than the node its topic holds, so trees split
        into many small nodes (planted topics with Poisson counts, 50,000 documents, 20
        sweeps: 882 nodes for 100 topics under ``None``, 191 under ``"auto"``, at a quarter
        of the CPU; see BENCHMARKS.md). :meth:`score_samples`,
        :meth:`transform` and :meth:`predict` score documents under the fitted document model
        (the density exactly, new nodes included). Families without a document model (vMF,
        Gaussian) ignore ``"auto"`` and take no number.
    document_weights : "auto" or bool
        vMF likelihood: a row is a unit direction times its document's weight, the row's norm,
        and a document of weight ``w`` has concentration ``beta w`` at a node of concentration
        ``beta``. ``"auto"`` (the default) and ``True`` read the weights; unit rows are then
        documents of weight 1, exactly the unweighted model. :class:`~streamtree.text.TextVectorizer`
        with ``norm="l2"`` weighs documents by ``(tokens / median tokens) ** length_power``
        (:data:`~streamtree.text.DEFAULT_LENGTH_POWER` by default). A document drawn from one topic lies
        closer to it the longer it is, so with unit rows a topic's short documents are likelier
        in nodes of their own; weights remove most of that swarm on planted trees and raise the
        coherence of State of the Union nodes (BENCHMARKS.md). ``False``: every row must be a
        unit vector (an unnormalised row is an input error, not a weight). Other families take
        no weights and ignore ``"auto"``.
    kappa1, a : float
        Depth and time factors of the link strengths (see ``kappa0``).
    xi : float
        Time-link strength of the DP baselines.
    sigma0, sigma1, eta : float
        Gaussian likelihood: parent-link variance sigma0 * sigma1**d, previous-epoch link
        N(eta * theta_prev, sigma0 * sigma1**(d + a)) (the root links to its predecessor with
        mean theta_prev and variance sigma0 * sigma1**a).
    noise_var : float or None
        Gaussian likelihood: the observation variance sigma_x**2 shared by all nodes when
        known; ``None`` estimates it per node (pooled within-node variance).
    n_sweeps : int
        Gibbs sweeps per epoch.
    n_map_iter : int
        Maximum even/odd alternations of the MAP parameter step per sweep. The step starts
        from the previous sweep's parameters, so a few alternations per sweep suffice.
    merge_moves : bool
        Run the exact split-merge moves after each sweep's z-update (see
        :mod:`streamtree.inference.split_merge`): Metropolis-Hastings splits that create a
        child or a sibling and merges into the parent or a sibling, accepted by the collapsed
        TSSB prior ratio times the likelihood's collapsed marginal ratio.
    split_proposals : int or "auto"
        Split-merge attempts per sweep. Each attempt draws two documents at random: a split
        is proposed when they share a node, a merge when one sits in a node the other's could
        have split off; other draws cost nothing. ``0`` disables the moves. ``"auto"`` makes
        one attempt per 100 documents of the epoch, at least 50 but at most one per document
        (``DOCS_PER_SPLIT_ATTEMPT``, ``MIN_SPLIT_ATTEMPTS`` and ``SPLIT_ATTEMPTS_PER_DOC`` in
        :mod:`streamtree.inference.epoch_sampler`), so the moves keep pace with the documents
        in large epochs and a tiny epoch costs little; in the first ``GROWTH_SWEEPS`` sweeps of
        the first epoch, while the tree grows from the root, at least the family's
        ``growth_attempts`` times ``MIN_SPLIT_ATTEMPTS`` (50), up to one per document (5 for the vMF, whose moves stop
        being accepted once its nodes are fitted; 1 for the others; relocations follow, lifts
        do not).
    split_node : {"fixed", "integrated"}
        How a split-merge move treats the parameter of the node it splits (or merges into).
        ``"fixed"`` (the default) holds it at its current value: the moved documents' collapsed
        marginal at the new node is compared with their likelihood at that parameter.
        ``"integrated"`` integrates it out too and draws it afresh when the move is accepted,
        where the family can (a leaf, or for the vMF a node whose children are born in this
        epoch): both groups of documents are then scored alike. A node update's parameter is
        a mode, which fits its documents better than a typical posterior draw by about half
        the parameter's dimension in nats, so ``"fixed"`` holds back splits of large nodes. On
        planted trees ``"integrated"`` finds the vMF's lumped true nodes (epoch-0 node counts
        0.87x against 0.69x the truth) but on real short texts it doubles the vMF's swarm of
        small nodes, and it does not help the multinomial (BENCHMARKS.md). Under
        ``"integrated"`` the root of a family that links it to the epoch's mean (vMF,
        multinomial) is integrated out against that link as well, where it can be: while
        the root has no children (multinomial) or no carried ones (vMF).
    min_node_docs : int
        Nodes with fewer documents keep their previous concentration (a newborn node starts
        with its parent's) instead of a noisy estimate.
    sample_hyperparameters : bool
        Slice-sample alpha0, lam and gamma after each sweep from their posterior given the
        tree and the windowed counts (see :mod:`streamtree.inference.hyper`); the values
        given are the starting point. ``False`` keeps them fixed.
    concentration_bounds : (float, float)
        Clip range of estimated vMF concentrations.
    engine : str or engine object
        Where the z-updates run: a registered engine name (``"local"``, ``"ray"``; see
        :mod:`streamtree.engines`) or an object implementing
        :class:`~streamtree.inference.zsweep.ZSweeper`.
    n_shards : int
        Row shards per epoch. Each has its own random stream; results depend on ``n_shards``
        but not on the engine or ``n_jobs``.
    n_jobs : int or None
        Threads for fitting (``None``: 1, ``-1``: all CPUs, ``-2``: all but one): the local
        engine's z-kernel and the parallel numba steps of the coordinator, each step where its
        rows are enough work for the threads (small epochs run on one thread). BLAS stays at
        one thread inside fitting. Results do not depend on ``n_jobs``.
    engine_options : dict, optional
        Extra keyword arguments for the engine.
    random_state : int, numpy SeedSequence or None
        Seed; the same seed and shard count give bit-identical trees.

    Attributes
    ----------
    trees_ : list of EpochTree
        One tree per epoch fitted by this object (after :meth:`from_checkpoint`, the trees
        fitted since, after the checkpoint's last tree).
    likelihood_ : Likelihood
        The observation family.
    variant_config_ : VariantConfig
        The resolved variant.
    state_ : ChainState
        Tree, window counts and node parameters carried to the next epoch, with the ids the
        trees publish its nodes under where they differ from the chain's own.
    predictive_ : Candidates
        The predictive mixture of the last epoch in the z-kernel's form.
    n_features_in_ : int
    kappa0_ : float or None
        The link strength in use after the last epoch: the estimate under ``kappa0="auto"``,
        else ``kappa0`` (``None`` for the Gaussian family, which has no such link).
    """

    _parameter_constraints: dict = {
        "likelihood": [StrOptions(set(LIKELIHOODS))],
        "variant": [StrOptions(set(VARIANTS))],
        "window": [Interval(numbers.Integral, 0, None, closed="left"), None],
        "max_depth": [Interval(numbers.Integral, 1, None, closed="left")],
        "alpha0": [Interval(numbers.Real, 0, None, closed="neither")],
        "lam": [Interval(numbers.Real, 0, 1, closed="right")],
        "gamma": [Interval(numbers.Real, 0, None, closed="neither")],
        "kappa0": [Interval(numbers.Real, 0, None, closed="neither"), StrOptions({"auto"})],
        "kappa1": [Interval(numbers.Real, 0, None, closed="neither")],
        "document_concentration": [Interval(numbers.Real, 0, None, closed="neither"), StrOptions({"auto"}), None],
        "document_weights": ["boolean", StrOptions({"auto"})],
        "a": [Interval(numbers.Real, None, None, closed="neither")],
        "xi": [Interval(numbers.Real, 0, None, closed="neither")],
        "sigma0": [Interval(numbers.Real, 0, None, closed="neither")],
        "sigma1": [Interval(numbers.Real, 0, None, closed="neither")],
        "eta": [Interval(numbers.Real, 0, 1, closed="left")],
        "noise_var": [Interval(numbers.Real, 0, None, closed="neither"), None],
        "n_sweeps": [Interval(numbers.Integral, 1, None, closed="left")],
        "n_map_iter": [Interval(numbers.Integral, 1, None, closed="left")],
        "merge_moves": ["boolean"],
        "split_proposals": [Interval(numbers.Integral, 0, None, closed="left"), StrOptions({"auto"})],
        "split_node": [StrOptions({"fixed", "integrated"})],
        "min_node_docs": [Interval(numbers.Integral, 1, None, closed="left")],
        "sample_hyperparameters": ["boolean"],
        "concentration_bounds": [tuple, list],
        "engine": [str, HasMethods(["load", "sweep", "labels", "close"])],
        "n_shards": [Interval(numbers.Integral, 1, None, closed="left")],
        "n_jobs": [Interval(numbers.Integral, 1, None, closed="left"),
                   Interval(numbers.Integral, None, -1, closed="right"), None],
        "engine_options": [dict, None],
        "random_state": [Interval(numbers.Integral, 0, None, closed="left"), np.random.SeedSequence, None],
    }

    def __init__(
        self,
        likelihood: str = DEFAULT_LIKELIHOOD,
        variant: str = "dtssbp",
        window: int | None = 2,
        max_depth: int = 3,
        alpha0: float = 1.0,
        lam: float = 0.5,
        gamma: float = 0.5,
        kappa0: float | str = 1e3,
        kappa1: float = 1.0,
        document_concentration: float | str | None = "auto",
        document_weights: bool | str = "auto",
        a: float = 0.0,
        xi: float = 0.001,
        sigma0: float = 1.0,
        sigma1: float = 0.5,
        eta: float = 0.5,
        noise_var: float | None = None,
        n_sweeps: int = 50,
        n_map_iter: int = 3,
        merge_moves: bool = True,
        split_proposals: int | str = "auto",
        split_node: str = "fixed",
        min_node_docs: int = 2,
        sample_hyperparameters: bool = True,
        concentration_bounds: tuple[float, float] = (1e-3, 1e6),
        engine: Any = "local",
        n_shards: int = 1,
        n_jobs: int | None = None,
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
        self.document_concentration = document_concentration
        self.document_weights = document_weights
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
        self.split_node = split_node
        self.min_node_docs = min_node_docs
        self.sample_hyperparameters = sample_hyperparameters
        self.concentration_bounds = concentration_bounds
        self.engine = engine
        self.n_shards = n_shards
        self.n_jobs = n_jobs
        self.engine_options = engine_options
        self.random_state = random_state

    @classmethod
    def baseline(cls, name: str, **params) -> "DTSSBP":
        """The estimator configured as one of the paper's models (``variant=name``)."""
        return cls(variant=name, **params)

    # ------------------------------------------------------------------ validation
    def _check_params(self) -> None:
        validate_parameter_constraints(self._parameter_constraints, self.get_params(deep=False),
                                       caller_name=type(self).__name__)
        if isinstance(self.engine, str) and self.engine not in engine_names():
            raise ValueError(f"The 'engine' parameter of DTSSBP must be one of {sorted(engine_names())} or an "
                             f"engine object. Got {self.engine!r} instead.")
        family = LIKELIHOODS[self.likelihood]
        if self.document_concentration not in (None, "auto") and "document_concentration" not in family.params:
            users = sorted(name for name, cls in LIKELIHOODS.items() if "document_concentration" in cls.params)
            raise ValueError(f"The 'document_concentration' parameter of DTSSBP applies to the {', '.join(users)} "
                             f"likelihood, not to {self.likelihood!r}: leave it at 'auto' or None, or choose "
                             f"likelihood={users[0]!r}.")
        if self.document_weights != "auto" and self.document_weights and "document_weights" not in family.params:
            users = sorted(name for name, cls in LIKELIHOODS.items() if "document_weights" in cls.params)
            raise ValueError(f"The 'document_weights' parameter of DTSSBP applies to the {', '.join(users)} "
                             f"likelihood, not to {self.likelihood!r}: leave it at 'auto' or False, or choose "
                             f"likelihood={users[0]!r}.")
        bounds = self.concentration_bounds
        if not (len(bounds) == 2 and all(isinstance(b, numbers.Real) for b in bounds) and 0 < bounds[0] <= bounds[1]):
            raise ValueError("The 'concentration_bounds' parameter of DTSSBP must be a pair (low, high) with "
                             f"0 < low <= high. Got {bounds!r} instead.")

    def _settings(self, config: VariantConfig) -> SamplerSettings:
        return SamplerSettings(alpha0=self.alpha0, lam=self.lam, gamma=config.gamma, max_depth=config.max_depth,
                               root_holds_data=config.root_holds_data,
                               freeze_after_birth=config.freeze_after_birth, n_sweeps=self.n_sweeps,
                               n_map_iter=self.n_map_iter, merge_moves=self.merge_moves,
                               split_proposals=self.split_proposals, min_node_docs=self.min_node_docs,
                               integrate_split_node=self.split_node == "integrated",
                               sample_hyperparameters=self.sample_hyperparameters,
                               auto_link_strength=isinstance(self.kappa0, str)
                               ).with_hyper(getattr(getattr(self, "state_", None), "hyper", {}))

    def _check_fitted(self) -> None:
        if not hasattr(self, "state_"):
            raise NotFittedError(f"This {type(self).__name__} instance is not fitted yet; call partial_fit "
                                 "(one epoch) or fit (a sequence of epochs) first.")

    def _validate_X(self, X, family: type[Likelihood]):
        # the column count first, where X has a shape: a family's row checks (empty rows, say)
        # would otherwise answer a wrong vocabulary with advice about its rows
        shape = getattr(X, "shape", None)
        if shape is not None and len(shape) == 2:
            self._check_n_features(shape[1])
        X = family.check_input(X, **{k: getattr(self, k) for k in family.params})
        self._check_n_features(X.shape[1])
        return X

    def _check_n_features(self, n_features: int) -> None:
        if hasattr(self, "n_features_in_") and n_features != self.n_features_in_:
            raise ValueError(f"X has {n_features} features, but the model was fitted with {self.n_features_in_}")

    # ------------------------------------------------------------------ state
    def _start(self, n_features: int) -> None:
        """First epoch: resolve the variant and family, empty state, engine, seeds."""
        config = resolve_variant(self.variant, window=self.window, max_depth=self.max_depth, gamma=self.gamma,
                                 xi=self.xi)
        self.variant_config_ = config
        self.n_features_in_ = n_features
        self.likelihood_ = LIKELIHOODS[self.likelihood].from_params(self.get_params(deep=False), config, n_features)
        self.state_ = ChainState.empty(config.max_depth, config.window, n_features)
        self.trees_: list[EpochTree] = []
        self._seeds = _seed_sequence(self.random_state)
        self._last_tree: EpochTree | None = None

    def _engine_for_run(self):
        engine = getattr(self, "_engine", None)
        if engine is None:
            engine = make_engine(self.engine, n_shards=self.n_shards, n_jobs=self.n_jobs,
                                 options=self.engine_options)
            if getattr(engine, "n_shards", self.n_shards) != self.n_shards:
                raise ValueError(f"the engine has {engine.n_shards} shards but n_shards={self.n_shards}")
            self._engine = engine
        return engine

    # ------------------------------------------------------------------ public API
    def fit(self, X: Sequence, y=None, *, epochs=None) -> "DTSSBP":
        """Fit from scratch on a sequence of epochs.

        Parameters
        ----------
        X : sequence of matrices, one per epoch (in time order); or, with ``epochs``, one
            matrix whose row ``i`` belongs to epoch ``epochs[i]`` (rows are grouped by sorted
            epoch value).
        epochs : array-like of shape (n_rows,), optional
            Each row's epoch when ``X`` is a single matrix.

        Returns
        -------
        self
        """
        if epochs is None:
            if sp.issparse(X) or (isinstance(X, np.ndarray) and X.ndim == 2):
                raise TypeError("fit takes a sequence of epochs (one matrix each), got a single matrix; "
                                "call partial_fit(X) to fit one epoch, fit([X]) for a one-epoch sequence, "
                                "or fit(X, epochs=...) to give each row's epoch")
            batches = list(X)
        else:
            epochs = np.asarray(epochs)
            if epochs.shape[0] != X.shape[0]:
                raise ValueError(f"epochs has {epochs.shape[0]} entries for {X.shape[0]} rows")
            batches = [X[np.flatnonzero(epochs == e)] for e in np.unique(epochs)]
        if not batches:
            raise ValueError("fit needs at least one epoch")
        self._reset()
        for t, Xt in enumerate(batches):
            self._fit_epoch(Xt, t, None, None)
        return self

    def _reset(self) -> None:
        for name in ("state_", "trees_", "likelihood_", "variant_config_", "n_features_in_", "predictive_",
                     "kappa0_", "_last_tree"):
            if hasattr(self, name):
                delattr(self, name)

    def partial_fit(self, X, y=None, *, epoch: int | None = None, label: str | None = None,
                    callback=None) -> "DTSSBP":
        """Run inference for one epoch; its tree is then ``self.trees_[-1]``.

        Parameters
        ----------
        X : matrix, shape (n, p)
            The epoch's training documents: CSR rows whose norms are document weights (vMF,
            unit rows with ``document_weights=False``), CSR raw term
            counts (multinomial) or a dense array (Gaussian). ``n = 0`` is an empty epoch:
            the tree is carried forward unchanged and the stick window still advances.
        epoch : int, optional
            Epoch index (default: one more than the last). Must increase.
        label : str, optional
            Human label stored in the EpochTree.
        callback : callable, optional
            Called as ``callback(sweeps_done, n_sweeps, n_live_nodes)`` after each sweep (for
            progress displays; the model itself does no I/O).

        Returns
        -------
        self
        """
        return self._fit_epoch(X, epoch, label, callback)

    def _fit_epoch(self, X, epoch: int | None, label: str | None, callback) -> "DTSSBP":
        """:meth:`partial_fit`'s work, also :meth:`fit`'s for each epoch (called straight from
        either, so that a warning points at the user's call)."""
        first = not hasattr(self, "state_")
        if first:
            self._check_params()
        family = LIKELIHOODS[self.likelihood] if first else type(self.likelihood_)
        X = self._validate_X(X, family)
        last = None if first else self._last_tree
        if epoch is None:
            epoch = last.epoch + 1 if last is not None else 0
        if last is not None and epoch <= last.epoch:
            raise ValueError(f"epoch {epoch} is not after the last fitted epoch {last.epoch}")
        concern = family.fit_rows_concern(X)
        if concern is not None:  # before any state: a warning turned into an error leaves none behind
            warnings.warn(concern, UserWarning, stacklevel=3)
        if first and X.shape[0] == 0:
            raise ValueError("the first epoch must contain documents: start the stream at its first non-empty "
                             "epoch")
        if first:
            self._start(X.shape[1])
            kept = None
        else:
            # the sampler changes the chain's state in place: an epoch that fails part-way (an
            # engine error, an interrupt) puts back what was, so the model is as it was before the
            # call and a retry gives the uninterrupted chain
            kept = (copy.deepcopy(self.state_), copy.deepcopy(self.likelihood_), copy.deepcopy(self._seeds))
        start = time.perf_counter()
        try:
            tree = self._sample_epoch(X, int(epoch), label, callback, last)
        except BaseException:
            if kept is None:
                self._reset()
            else:
                self.state_, self.likelihood_, self._seeds = kept
            raise
        self.trees_.append(tree)
        self._last_tree = tree
        self.kappa0_ = getattr(self.likelihood_, "kappa0", None)
        self.predictive_ = self._predictive_kernel(normalized=True)
        logger.info("epoch %s: %d documents, %d nodes (%d born, %d died, %d merged) in %.2fs", epoch, X.shape[0],
                    tree.n_nodes, int(np.sum(tree.born == epoch)), tree.died_unmerged.size, len(tree.merged),
                    time.perf_counter() - start)
        return self

    def _sample_epoch(self, X, epoch: int, label: str | None, callback, last: EpochTree | None) -> EpochTree:
        """One epoch's chain on the engine; changes ``state_``, ``likelihood_`` and the seeds."""
        engine = self._engine_for_run()
        children = self._seeds.spawn(1)[0].spawn(1 + engine.n_shards)
        rng = np.random.Generator(np.random.PCG64(children[0]))
        if callback is not None:
            engine = _SweepCallback(engine, callback, self.n_sweeps)
        sampler = EpochSampler(self.state_, self.likelihood_, self._settings(self.variant_config_), engine, rng)
        with fitting_threads(self.n_jobs):
            return sampler.run(X, epoch, label, children[1:], last)

    def _predictive_kernel(self, normalized: bool):
        tree = self._last_tree
        log_pi, log_res, arrays = predictive_masses(tree, self._settings(self.variant_config_))
        cand, _ = self.likelihood_.kernel(arrays, tree.theta, tree.concentration, log_pi, log_res,
                                          normalized=normalized)
        return cand

    def score_samples(self, X, normalized: bool = True) -> np.ndarray:
        """Log predictive density of each row under the tree of the last fitted epoch.

        The density is the mixture over live nodes (posterior-mean sticks, node parameters and
        concentrations at the end of the epoch) plus, for every node above the depth cap, the
        mass of its unseen children times the new-node marginal.

        Parameters
        ----------
        X : matrix, shape (n, p)
        normalized : bool
            ``False`` drops the family's normalising constants: the vMF normalisers C_p(beta)
            (the dTSSBP paper's "unnormalised" score, log sum_e pi_e exp(beta_e theta_e . x)),
            the Gaussian (2 pi sigma^2)^(-p/2), the multinomial coefficient.

        Returns
        -------
        ndarray of shape (n,)
        """
        self._check_fitted()
        X = self._validate_X(X, type(self.likelihood_))
        log_pi, log_res, arrays = predictive_masses(self._last_tree, self._settings(self.variant_config_))
        tree = self._last_tree
        return self.likelihood_.log_predictive(X, arrays, tree.theta, tree.concentration, log_pi, log_res,
                                               normalized=normalized, hyper=self.state_.hyper)

    def close(self) -> None:
        """Release the engine's resources (Ray actors, shard copies). The fitted state stays."""
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.close()
            self._engine = None

    def __enter__(self) -> "DTSSBP":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_engine", None)  # engines hold processes and actors; a copy starts its own
        return state

    # ------------------------------------------------------------------ checkpoints
    def get_checkpoint(self) -> tuple[dict[str, np.ndarray], dict]:
        """Everything needed to continue fitting, as numeric arrays plus JSON metadata.

        Returns
        -------
        arrays : dict of str to ndarray
            Tree structure, node parameters and concentrations, window counts and the last
            epoch's tree (numeric dtypes only).
        meta : dict
            JSON-serialisable: the JSON-able parameters of :meth:`get_params` (engine objects
            excluded), the format version, the seed sequence's state and the last epoch.
        """
        self._check_fitted()
        arrays, chain = self.state_.to_arrays()
        tree = self._last_tree
        for name in ("node_ids", "parent", "depth", "mass", "counts", "subtree_counts", "window_counts", "theta",
                     "concentration", "born", "assignments", "died"):
            arrays[f"last_{name}"] = np.asarray(getattr(tree, name))
        ss = self._seeds
        params = {k: _jsonable(v) for k, v in self.get_params(deep=False).items()}
        params = {k: v for k, v in params.items() if v is not _NOT_JSON}
        meta = {
            "format": CHECKPOINT_FORMAT,
            "model": type(self).__name__,
            "params": params,
            "n_features_in": int(self.n_features_in_),
            "seed_sequence": {"entropy": _int_or_list(ss.entropy), "spawn_key": [int(k) for k in ss.spawn_key],
                              "pool_size": int(ss.pool_size), "n_children_spawned": int(ss.n_children_spawned)},
            "chain": chain,
            "last_epoch": int(tree.epoch),
            "last_label": tree.label,
        }
        return arrays, meta

    @classmethod
    def from_checkpoint(cls, arrays: dict[str, np.ndarray], meta: dict, **overrides) -> "DTSSBP":
        """A model that continues exactly where :meth:`get_checkpoint` left off.

        Parameters
        ----------
        arrays, meta
            The output of :meth:`get_checkpoint` (``meta`` may have been through JSON).
        **overrides
            Run-location parameters: ``engine``, ``n_jobs``, ``engine_options``. Where a model
            ran is not part of its chain, so the restored model runs with the estimator's
            defaults for those not given (a checkpoint written on Ray continues locally, and
            a Ray address stored with it is never reused unasked).

        Returns
        -------
        DTSSBP
            Fitted; ``trees_`` holds the checkpoint's last epoch tree only.
        """
        if meta.get("format") != CHECKPOINT_FORMAT or meta.get("model") != cls.__name__:
            raise ValueError(f"not a {cls.__name__} checkpoint of format {CHECKPOINT_FORMAT} "
                             f"(got model {meta.get('model')!r}, format {meta.get('format')!r})")
        bad = set(overrides) - set(RUN_LOCATION_PARAMS)
        if bad:
            raise ValueError(f"only {', '.join(RUN_LOCATION_PARAMS)} may be overridden on restore, "
                             f"not {', '.join(sorted(bad))}")
        params = {**PARAMS_BEFORE_ADDED, **meta["params"]}
        if isinstance(params.get("concentration_bounds"), list):
            params["concentration_bounds"] = tuple(params["concentration_bounds"])
        defaults = cls().get_params(deep=False)
        params.update({k: defaults[k] for k in RUN_LOCATION_PARAMS}, **overrides)
        ss_meta = meta["seed_sequence"]
        model = cls(**params)
        model._check_params()
        model._start(int(meta["n_features_in"]))
        model._seeds = np.random.SeedSequence(ss_meta["entropy"], spawn_key=tuple(ss_meta["spawn_key"]),
                                              pool_size=ss_meta["pool_size"],
                                              n_children_spawned=ss_meta["n_children_spawned"])
        model.state_ = ChainState.from_arrays(arrays, meta["chain"])
        if isinstance(model.kappa0, str):
            apply_link_strengths(model.likelihood_, model.state_.hyper)
        model.kappa0_ = getattr(model.likelihood_, "kappa0", None)
        last = EpochTree(
            epoch=int(meta["last_epoch"]), label=meta.get("last_label"),
            **{name: np.asarray(arrays[f"last_{name}"]) for name in (
                "node_ids", "parent", "depth", "mass", "counts", "subtree_counts", "window_counts", "theta",
                "concentration", "born", "assignments", "died")})
        model.trees_ = [last]
        model._last_tree = last
        model.predictive_ = model._predictive_kernel(normalized=True)
        return model

    # ------------------------------------------------------------------ new documents
    def _live_log_weights(self, X) -> np.ndarray:
        """Per row and live node: log mass + log likelihood, as the z-kernel scores them.

        Family constants equal for every node are left out; they cancel in the posterior.
        """
        self._check_fitted()
        X = self._validate_X(X, type(self.likelihood_))
        return self.likelihood_.live_log_weights(X, self.predictive_, self._last_tree.theta, self.state_.hyper)

    def transform(self, X) -> np.ndarray:
        """Posterior probability of each live node of the current tree, per row.

        The current tree is ``trees_[-1]``, scored with the same posterior-mean masses, node
        parameters and concentrations as :meth:`score_samples`. The probabilities are
        renormalised over the live nodes: the mass of unseen children (new nodes), which
        :meth:`score_samples` includes in the density, is not a column, so each row sums to 1.

        Parameters
        ----------
        X : matrix, shape (n, p)
            As for :meth:`partial_fit`.

        Returns
        -------
        ndarray of shape (n, n_nodes)
            Column ``j`` is node ``trees_[-1].node_ids[j]``.
        """
        weights = self._live_log_weights(X)
        weights -= weights.max(axis=1, keepdims=True)
        np.exp(weights, out=weights)
        weights /= weights.sum(axis=1, keepdims=True)
        return weights

    def predict(self, X) -> np.ndarray:
        """The MAP node of each row under the current tree.

        The node maximising log mass + log likelihood over the live nodes of ``trees_[-1]``:
        the argmax of :meth:`transform`'s row.

        Parameters
        ----------
        X : matrix, shape (n, p)
            As for :meth:`partial_fit`.

        Returns
        -------
        ndarray of int64, shape (n,)
            Node ids (values of ``trees_[-1].node_ids``).
        """
        weights = self._live_log_weights(X)
        return np.asarray(self._last_tree.node_ids, dtype=np.int64)[np.argmax(weights, axis=1)]


_NOT_JSON = object()


class _SweepCallback:
    """The engine, calling ``callback(done, n_sweeps, n_live)`` after each of its z-sweeps."""

    def __init__(self, engine, callback, n_sweeps: int) -> None:
        self._engine, self._callback, self._n_sweeps, self._done = engine, callback, n_sweeps, 0

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def sweep(self, cand, own=None, adjust=None):
        stats = self._engine.sweep(cand, own, adjust)
        self._done += 1
        self._callback(self._done, self._n_sweeps, int(np.asarray(cand.live_a).shape[0]))
        return stats


def _jsonable(value):
    """A JSON-able form of a parameter value, or ``_NOT_JSON`` (engine objects, seed sequences)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (tuple, list)):
        items = [_jsonable(v) for v in value]
        return _NOT_JSON if any(v is _NOT_JSON for v in items) else items
    if isinstance(value, dict):
        items = {str(k): _jsonable(v) for k, v in value.items()}
        return _NOT_JSON if any(v is _NOT_JSON for v in items.values()) else items
    return _NOT_JSON


def _int_or_list(entropy):
    if isinstance(entropy, (list, tuple, np.ndarray)):
        return [int(e) for e in entropy]
    return int(entropy)


def _seed_sequence(random_state) -> np.random.SeedSequence:
    if isinstance(random_state, np.random.SeedSequence):
        return random_state
    return np.random.SeedSequence(random_state)
