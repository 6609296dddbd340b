"""Multinomial word topics over raw term counts, with Dirichlet links (the LDA-like family).

Each node ``e`` has a word distribution ``phi_e`` with a Dirichlet link to its parent and to its
own previous-epoch self,

    phi_e ~ Dir(s_par(d) phi_parent + s_tim(d) phi_prev + eps),

with the strengths following the vMF rule (``s_par(d) = kappa0 kappa1^d``,
``s_tim(d) = kappa0 kappa1^(d + a)``; the root's parent is the epoch's word frequencies) and a
floor ``eps`` per term (:data:`DIRICHLET_FLOOR`, LDA's usual topic-word prior, which is also the
whole prior of a node without links). A document's counts given its node are
``Mult(x | phi_e)``; with ``phi`` integrated out (new nodes, merge and split proposals) they are
Dirichlet-multinomial, exactly. Node updates are MAP steps by depth parity in the softmax basis
(see :mod:`streamtree.likelihoods.multinomial_math`), so every ``phi`` stays strictly positive.

With ``document_concentration=None`` (this object's default; the estimator's is ``"auto"``),
documents are conditionally independent token draws, so the family has no per-node dispersion
to estimate: a node's ``concentration`` is its parent-link strength ``s_par(d)`` at its
creation, which the concentration update leaves as it is.

With ``document_concentration`` set, documents are bursty instead:
``x | phi_e ~ DCM(x | s phi_e)`` with one corpus-level ``s``, fitted through table counts
(:mod:`streamtree.likelihoods.document_tables`). Each sweep then draws the table counts ``T`` of
every document given its counts, its node and ``s`` (:meth:`Multinomial.sweep_counts`), and
everything above reads ``T`` in place of ``X``; ``"auto"`` also slice-samples ``s``. The
predictive density of new documents (:meth:`~Multinomial.log_predictive`, ``score_samples``,
``evaluate``) is then the DCM's too: ``DCM(x | s phi_e)`` at a live node, and at a new node its
expectation under the node's Dirichlet prior, exact through the table counts
(:func:`~streamtree.likelihoods.document_tables.dcm_log_mixture`), with ``s`` the fixed value
or the chain's current draw. Both document models include the multinomial coefficient, so their
densities compare.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import scipy.sparse as sp
from scipy.special import gammaln

from streamtree.inference.enumerated import Candidates, as_csr, row_sums, rows_by_node
from streamtree.inference.threads import dealt_by_cost, in_row_ranges
from streamtree.likelihoods.base import (DocumentSet, FixedNode, LaunchScan, Likelihood, RowBlock, WordTopics,
                                        argmax_log_scale, compact_rows, csr_rows_dot, finite_csr)
from streamtree.likelihoods.document_tables import (dcm_log_likelihoods, dcm_log_mixture, draw_tables, length_groups,
                                                    polya_concentration, sample_concentration)
from streamtree.likelihoods.multinomial_math import (_BLOCK_FREEZE, _BLOCK_MAX_ITER, _BLOCK_TOL, _JOINT_MAX_ITER,
                                                     _dm_set_dense, _solve_nodes_nb, compact_launch_scans,
                                                     compact_split_log_odds, log_dm_marginal_linked,
                                                     log_multinomial_coef, own_node_adjustment_nb,
                                                     map_phi, map_phi_dense, map_phi_with_children_dense)

#: Dirichlet floor per term: every node's prior holds ``eps`` pseudo-counts of every word
DIRICHLET_FLOOR = 0.01
#: an epoch whose documents hold a median of fewer tokens than this is warned about at fitting
#: (:meth:`Multinomial.fit_rows_concern`): on ten flat topics that share few words the default
#: fit found none of them at 3-5 tokens a document, and all of them from 6
#: (``bench/bench_short_documents.py``; topics that share more words need longer documents, so
#: this is a floor: broader topics failed up to about 12 tokens)
SHORT_DOCUMENT_TOKENS = 6
#: ... when it has at least this many documents (a few short ones say nothing about the corpus)
SHORT_WARNING_MIN_ROWS = 20


class Multinomial(WordTopics, Likelihood):
    """Word distributions over raw term counts with Dirichlet parent and time links."""

    name = "multinomial"
    text_norm = None  # raw counts
    param_storage = "distribution"  # every phi row is strictly positive and sums to 1
    sets_need_terms = True  # a new child's collapsed marginal runs over the set's terms
    anchors_root = True  # the node update links the root to the epoch's word frequencies at depth 0
    # a node with children sits near uniform under its children's Dirichlet links, and leans to
    # the terms they lack where they also link their previous selves (BENCHMARKS.md, "Node labels")
    labels_from_documents = True
    # a launch's seed charges every token its document lacks, so a group grows by a few
    # near-copies of that document a scan: ten scans let it reach a sub-topic's size
    # (BENCHMARKS.md, "Ten launch scans for word distributions")
    launch_scans = 10
    params = ("kappa0", "kappa1", "a", "min_node_docs", "document_concentration")
    #: the chain's ``hyper`` entry holding the document concentration ``s`` in use
    DOCUMENT_HYPER = "document_concentration"
    #: ``None``: multinomial documents; a number: DCM documents with that fixed ``s``;
    #: ``"auto"``: DCM documents with ``s`` slice-sampled every sweep
    document_concentration: float | str | None = None
    floor = DIRICHLET_FLOOR
    #: node updates start from the current phi and skip nodes whose inputs did not change (the
    #: optimum is the same; False re-solves every node from the solver's own start, for checks)
    incremental_map = True

    @classmethod
    def check_input(cls, X, **settings):
        X = finite_csr(X)
        d = X.data
        if d.size and (d.min() < 0 or not np.array_equal(d, np.round(d))):
            raise ValueError("the multinomial likelihood (the default) needs raw term counts (non-negative "
                             "integers), as TextVectorizer() gives them; for L2-normalised rows or embeddings "
                             "use likelihood='vmf'")
        if X.shape[0]:
            empty = np.flatnonzero(row_sums(X) == 0)
            if empty.size:
                raise ValueError(f"{empty.size} rows have no terms (e.g. row {empty[0]}): drop empty documents "
                                 "first (TextVectorizer.empty_rows)")
        return X

    @classmethod
    def fit_rows_concern(cls, X) -> str | None:
        if X.shape[0] < SHORT_WARNING_MIN_ROWS or float(np.median(row_sums(X))) >= SHORT_DOCUMENT_TOKENS:
            return None
        # one text for every epoch, so that Python shows it once, not once per epoch
        return (f"these documents hold a median of fewer than {SHORT_DOCUMENT_TOKENS} tokens, and on so little "
                "evidence a document the fit rarely finds more than one topic; group short texts into longer "
                "documents (e.g. by thread, author or hour) before fitting")

    # ------------------------------------------------------------------ helpers
    def _prior(self, strength: float, phi_parent: np.ndarray) -> np.ndarray:
        return strength * phi_parent + self.floor

    # ------------------------------------------------------------------ epoch anchors
    def root_anchor(self, X) -> np.ndarray:
        c = np.asarray(X.sum(axis=0)).ravel()
        return c / c.sum()

    def initial_root(self, X):
        c = np.asarray(X.sum(axis=0)).ravel()
        par, _ = self.link_strengths(np.zeros(1))
        return map_phi(c, self._prior(float(par[0]), c / c.sum())), float(par[0])

    # ------------------------------------------------------------------ z-kernel
    def kernel(self, arrays, theta, concentration, log_mass, log_residual, *, normalized=True):
        ph_rows = np.flatnonzero(np.isfinite(log_residual))
        strength = np.array([self.new_node_prior(int(d) + 1) for d in arrays.depth[ph_rows]], dtype=np.float64)
        # a placeholder's Dirichlet is strength * phi_parent + floor: the candidates travel as
        # theta, the strengths and the floor, and the (P, V) parameters are built on arrival
        cand = Candidates.dirichlet(theta, log_mass, ph_rows, log_residual[ph_rows], strength, self.floor)
        return cand, ph_rows

    def own_node_adjustment(self, X, own, arrays, theta, sums, counts, concentration, prev_theta, has_prev,
                            root_anchor, scored=None):
        """A node without linked children has the pseudo-count average ``phi = (n + alpha) / (N +
        A)`` of its documents' counts ``n`` and its links' ``alpha = s_par phi_parent + s_tim
        phi_prev + eps`` as its parameter (the softmax-basis mode), so without a row's counts
        ``x`` it is ``(n + alpha - x) / (N + A - L)``, exactly. A node whose children are linked
        to it is also pulled by their links, which are not pseudo-counts, and keeps no
        adjustment (under the dTSSBP it holds few documents of its own)."""
        X = as_csr(X)
        fitted = np.asarray(X.data, dtype=np.float64)
        if scored is None:
            values = fitted
        else:
            values = np.asarray(as_csr(scored).data, dtype=np.float64)
            if values.shape != fitted.shape:
                raise ValueError("scored rows must keep the fitted rows' sparsity pattern")
        par, tim = self.link_strengths(arrays.depth)
        totals = sums.sum(axis=1) + par + np.where(has_prev, tim, 0.0) + self.floor * theta.shape[1]
        child = np.arange(1, arrays.size)
        linked_children = np.bincount(arrays.parent_index[child][par[child] > 0], minlength=arrays.size)
        own = np.asarray(own, dtype=np.int64)
        own = np.where((own >= 0) & (linked_children[np.maximum(own, 0)] == 0), own, -1)
        indptr, indices = X.indptr.astype(np.int64), X.indices.astype(np.int64)
        theta = np.ascontiguousarray(theta)
        out = np.empty(own.size)
        order = rows_by_node(own)

        def run(r0: int, r1: int) -> float:  # rows are independent: ranges on the fitting threads
            own_node_adjustment_nb(indptr, indices, fitted, values, own, theta, totals, self.floor, order, r0, r1,
                                   out)
            return 0.0

        in_row_ranges(own.size, run)
        return out

    def document_log_constant(self, X) -> np.ndarray:
        """The multinomial coefficient log(n! / prod_w x_w!) of each row."""
        return log_multinomial_coef(X)

    # ------------------------------------------------------------------ bursty documents
    @property
    def redraws_counts(self) -> bool:
        return self.document_concentration is not None

    def sweep_counts(self, X, theta, node_of_row, hyper, rng):
        """Under ``document_concentration``: the table counts of every document, drawn from
        their exact conditional given its counts, its node's ``phi`` and ``s`` (Antoniak), and
        under ``"auto"`` a new ``s`` given those tables (slice sampling under a log-uniform
        prior). Otherwise ``(None, {})``: multinomial documents.

        Under ``"auto"`` the chain's first sweep reads the counts themselves (the ``s -> inf``
        limit), and ``s`` starts at the Polya maximum-likelihood value of the documents about
        their nodes' ``phi`` after it. Started about the epoch's word frequencies instead, ``s``
        also absorbs the spread between topics, and a small ``s`` makes one node fit them all:
        60 documents from three topics over four words stayed at the root with ``s`` = 2.6,
        where this start finds the three topics. For the same reason a later epoch's first
        sweep, whose tables are drawn about the root (its documents have no node yet), does not
        update ``s``."""
        if not self.redraws_counts:
            return None, {}
        auto = self.document_concentration == "auto"
        if not self.counts_started(hyper):  # the chain's first draw starts here
            if node_of_row is None:
                return None, {}
            s = polya_concentration(X, theta, node_of_row)
        else:
            s = self.document_concentration_in_use(hyper)
        unassigned = node_of_row is None
        T = draw_tables(X, theta, np.zeros(X.shape[0], dtype=np.int64) if unassigned else node_of_row, s, rng)
        if auto and not unassigned:
            lengths, weights = length_groups(X)
            s = sample_concentration(s, float(T.data.sum()), lengths, weights, rng)
        return T, {self.DOCUMENT_HYPER: float(s)}

    def counts_started(self, hyper):
        return self.document_concentration != "auto" or self.DOCUMENT_HYPER in hyper

    def document_concentration_in_use(self, hyper: Mapping[str, float] | None) -> float | None:
        """The document concentration ``s`` of a fitted chain (``None``: multinomial documents):
        the fixed value, or under ``"auto"`` the chain's current draw in ``hyper``."""
        setting = self.document_concentration
        if setting is None:
            return None
        if setting != "auto":
            return float(setting)
        if not hyper or self.DOCUMENT_HYPER not in hyper:
            raise ValueError("document_concentration='auto' has no sampled value yet: fit the model on an epoch "
                             "before scoring documents")
        return float(hyper[self.DOCUMENT_HYPER])

    def live_log_weights(self, X, cand, theta, hyper=None):
        """As the base class; under ``document_concentration`` a node scores a document by
        ``log DCM(x | s phi)`` (its multinomial coefficient left out), the document model the
        chain was fitted with and :meth:`log_predictive` scores."""
        s = self.document_concentration_in_use(hyper)
        if s is None:
            return super().live_log_weights(X, cand, theta, hyper)
        return cand.live_a + dcm_log_likelihoods(X, theta, s)

    def log_predictive(self, X, arrays, theta, concentration, log_mass, log_residual, *, normalized=True,
                       hyper=None):
        """Log predictive density of each row. Under ``document_concentration`` the documents
        are bursty: ``DCM(x | s phi_k)`` at live node ``k`` (closed form) and, for a new node,
        its expectation under the new node's Dirichlet prior, exact through the table counts
        (:func:`~streamtree.likelihoods.document_tables.dcm_log_mixture`); the multinomial
        coefficient is added as in the multinomial case, so the two densities compare."""
        s = self.document_concentration_in_use(hyper)
        if s is None:
            return super().log_predictive(X, arrays, theta, concentration, log_mass, log_residual,
                                          normalized=normalized)
        cand, _ = self.kernel(arrays, theta, concentration, log_mass, log_residual, normalized=normalized)
        out = dcm_log_mixture(X, theta, cand.live_a, cand.ph_alpha, cand.ph_a, s)
        if normalized:
            out = out + self.document_log_constant(X)
        return out

    # ------------------------------------------------------------------ new nodes
    def new_node_prior(self, depth: int) -> float:
        return self.kappa0 * self.kappa1 ** depth if self.variant.parent_link else 0.0

    def new_node_theta(self, theta_parent, concentration, depth, docs):
        # the prior is positive by construction: the unchecked MAP (same value)
        prior = self._prior(self.new_node_prior(depth), theta_parent)
        return map_phi_dense(np.asarray(docs.s, dtype=np.float64), prior)

    def new_node_concentration(self, parent_concentration, depth):
        return self.new_node_prior(depth)

    def _linked_prior(self, theta_parent, depth, theta_prev) -> np.ndarray:
        """The Dirichlet parameter of a depth-``depth`` node: parent link and floor, plus the
        time link's share when ``theta_prev`` is given (as in :meth:`update_theta`)."""
        a = self._prior(self.new_node_prior(depth), theta_parent)
        if theta_prev is not None:
            _, tim = self.link_strengths(np.array([depth]))
            a = a + tim[0] * np.asarray(theta_prev)
        return a

    def sample_node_theta(self, theta_parent, concentration, depth, docs, rng, theta_prev=None):
        g = rng.standard_gamma(self._linked_prior(theta_parent, depth, theta_prev) + docs.s)
        g = np.maximum(g, 1e-300)  # Gamma draws of tiny shape underflow; keep every word possible
        return g / g.sum()

    def seed_child_theta(self, theta_node, x):
        # halfway between the node's distribution and the document's word frequencies
        return 0.5 * (theta_node + x / x.sum())

    def log_link(self, theta_child, theta_parent, depth, theta_prev=None):
        a = self._linked_prior(theta_parent, depth, theta_prev)
        return float(gammaln(a.sum()) - gammaln(a).sum() + ((a - 1.0) * np.log(theta_child)).sum())

    # ------------------------------------------------------------------ document sets
    def log_marginal(self, docs, theta_parent, concentration, depth, theta_prev=None):
        # the Dirichlet parameter is positive by construction: the unchecked form, built in the kernel
        if theta_prev is None:
            return log_dm_marginal_linked(docs.s, self.new_node_prior(depth), theta_parent, self.floor)
        # the time link's share of the Dirichlet parameter, as in update_theta
        _, tim = self.link_strengths(np.array([depth]))
        return log_dm_marginal_linked(docs.s, self.new_node_prior(depth), theta_parent, self.floor, tim[0],
                                      theta_prev)

    def log_likelihood(self, docs, theta, concentration):
        return float(docs.s @ np.log(theta))

    def drift_statistic(self, theta_now, theta_prev, depth):
        # Dir(s phi_prev) for large s: 4 (s + 1) times the squared Hellinger distance, the
        # variance-stabilised form of Pearson's chi-square (V - 1 df) that rare words, with their
        # tiny phi_prev, do not dominate
        _, tim = self.link_strengths(np.array([depth]))
        if tim[0] <= 0:
            return None
        d = np.sqrt(theta_now) - np.sqrt(theta_prev)
        return float(4.0 * (tim[0] + 1.0) * np.sum(d * d)), float(self.n_features - 1)

    def row_log_likelihood(self, X, theta, concentration):
        return np.asarray(X @ np.log(theta)).ravel()

    def block_log_likelihood(self, block: RowBlock, theta, concentration):
        return block.dot(np.log(np.asarray(theta, dtype=np.float64)))

    def block_log_odds(self, block: RowBlock, theta_1, theta_2, concentration):
        return block.dot(np.log(np.asarray(theta_1, dtype=np.float64) / np.asarray(theta_2, dtype=np.float64)))

    def fixed_node(self, theta, concentration):
        return _FixedWords(self, theta, concentration)

    # ------------------------------------------------------------------ link strength from the data
    def initial_link_strength(self, X):
        """Empirical-Bayes strength of one level of spread: every document as its own node
        below the epoch's word frequencies, ``argmax_s sum_d log DM(x_d | s f + eps)`` (the
        Polya maximum-likelihood precision of the documents about the corpus)."""
        X = as_csr(X)
        f = self.root_anchor(X)
        n_docs = row_sums(X)
        f_nz = f[X.indices]
        floor_total = self.floor * self.n_features

        def evidence(strength: float) -> float:
            a = strength * f_nz + self.floor
            total = strength + floor_total
            return float(np.sum(gammaln(total) - gammaln(total + n_docs))
                         + np.sum(gammaln(a + X.data) - gammaln(a)))

        return argmax_log_scale(evidence)

    def estimate_link_strength(self, arrays, theta, concentration, counts, sums, prev_theta, has_prev,
                               root_anchor, sumsq=None):
        """Empirical Bayes: the ``kappa0`` maximising the collapsed likelihood of the parent links.

        Every non-root node with documents contributes the Dirichlet-multinomial marginal of
        its documents with its own word distribution integrated out under its parent link,
        ``Dir(s_par(d) phi_parent + eps)``, given its parent's current distribution: a
        composite marginal likelihood of ``kappa0``. Integrating the node's own ``phi`` out
        matters: its MAP value is pulled towards its parent by ``kappa0`` itself and would
        feed the estimate back. On planted hierarchical-Dirichlet trees with the true
        assignments it recovers the planted child concentration (1,500 at V = 2,000 and 5,000).

        The time link is left out although it shares ``kappa0`` (``a = 0``): a node's
        previous self is usually far closer than its parent, and one strength fitted to both
        links trades one against the other, shrinking ``kappa0`` epoch after epoch (planted,
        V = 2,000: 490 then 340), which loosens the time link and costs node identities.
        """
        counts = np.asarray(counts, dtype=np.float64)
        rows = [k for k in range(1, arrays.size) if counts[k] > 0]
        if not rows or not self.variant.parent_link:
            return None
        pidx = arrays.parent_index
        depth = arrays.depth[rows]
        nz = [np.flatnonzero(sums[k]) for k in rows]
        x = [sums[k][w] for k, w in zip(rows, nz)]
        par_phi = [theta[pidx[k]][w] for k, w in zip(rows, nz)]
        n_tok = np.array([float(v.sum()) for v in x])
        floor_total = self.floor * self.n_features

        def evidence(strength: float) -> float:
            par, _ = self.link_strengths(depth, strength)
            total = par + floor_total
            out = float(np.sum(gammaln(total) - gammaln(total + n_tok)))
            for j in range(len(rows)):
                a = par[j] * par_phi[j] + self.floor
                out += float(np.sum(gammaln(a + x[j]) - gammaln(a)))
            return out

        return argmax_log_scale(evidence)

    def estimate_time_strength(self, arrays, theta, concentration, counts, sums, prev_theta, has_prev,
                               root_anchor):
        """Empirical Bayes for the time link, given the parent links: the strength ``s`` (in
        place of ``kappa0`` in ``s kappa1^(d + a)``) maximising the collapsed marginals of the
        carried nodes' documents under ``Dir(s_par(d) phi_parent + s kappa1^(d + a) phi_prev
        + eps)``. A topic usually changes far less from one epoch to the next than from its
        parent, so one strength for both links fits neither (see :meth:`estimate_link_strength`).
        ``phi_prev`` was fitted to the previous epoch's documents, not to these."""
        v = self.variant
        if not v.time_link or v.time_kappa is not None:
            return None
        counts = np.asarray(counts, dtype=np.float64)
        has_prev = np.asarray(has_prev, dtype=bool)
        rows = [k for k in range(1, arrays.size) if counts[k] > 0 and has_prev[k]]
        if not rows:
            return None
        pidx = arrays.parent_index
        depth = arrays.depth[rows]
        par, _ = self.link_strengths(depth)
        nz = [np.flatnonzero(sums[k]) for k in rows]
        x = [sums[k][w] for k, w in zip(rows, nz)]
        base = [par[j] * theta[pidx[k]][w] + self.floor for j, (k, w) in enumerate(zip(rows, nz))]
        prev_phi = [prev_theta[k][w] for k, w in zip(rows, nz)]
        n_tok = np.array([float(v_.sum()) for v_ in x])
        floor_total = self.floor * self.n_features

        def evidence(strength: float) -> float:
            _, tim = self.link_strengths(depth, time_strength=strength)
            total = par + tim + floor_total
            out = float(np.sum(gammaln(total) - gammaln(total + n_tok)))
            for j in range(len(rows)):
                a = base[j] + tim[j] * prev_phi[j]
                out += float(np.sum(gammaln(a + x[j]) - gammaln(a)))
            return out

        return argmax_log_scale(evidence)

    # ------------------------------------------------------------------ updates
    def update_theta(self, arrays, theta, sums, counts, concentration, prev_theta, has_prev, root_anchor,
                     update, n_iter):
        theta = np.array(theta, dtype=np.float64, copy=True)
        par, tim = self.link_strengths(arrays.depth)
        # each node's Dirichlet parameter apart from its parent link: time link plus floor
        prev_weight = tim * has_prev
        blocks = [np.flatnonzero((arrays.depth % 2 == q) & update) for q in (0, 1)]
        if self.incremental_map:
            return self._update_blocks(arrays, theta, np.ascontiguousarray(sums, dtype=np.float64), prev_theta,
                                       prev_weight, par, np.asarray(root_anchor, dtype=np.float64), blocks, n_iter)
        offset = prev_weight[:, None] * prev_theta + self.floor
        pidx = arrays.parent_index
        children: list[list[int]] = [[] for _ in range(arrays.size)]
        for k in range(1, arrays.size):
            children[pidx[k]].append(k)
        for _ in range(n_iter):
            delta = 0.0
            for rows in blocks:
                for k in rows:
                    kids = [j for j in children[k] if par[j] > 0]
                    parent_phi = theta[pidx[k]] if pidx[k] >= 0 else root_anchor
                    alpha = par[k] * parent_phi + offset[k]
                    if kids:
                        new = map_phi_with_children_dense(sums[k], alpha, np.log(theta[kids]), par[kids],
                                                          offset[kids])
                    else:
                        new = map_phi_dense(sums[k], alpha)
                    delta = max(delta, float(np.max(np.abs(new - theta[k]))))
                    theta[k] = new
            if delta < 1e-10:
                break
        return theta

    def _update_blocks(self, arrays, theta, sums, prev_theta, prev_weight, par, root_anchor, blocks, n_iter):
        """The node update by depth-parity blocks, each block in one compiled pass
        (``_solve_nodes_nb``). A node's inputs within this call are its parent's and children's
        phi (its data and offset are fixed): it is solved again only when one of them changed
        since its last solve, and from its current phi, which is close to the optimum after a
        sweep's changes. Its joint Newton stops at ``_BLOCK_TOL`` / ``_BLOCK_FREEZE``, looser
        than a standalone solve's; below ``_JOINT_MAX_ITER`` steps, ``_BLOCK_MAX_ITER`` is a step
        budget whose last iterate is kept, and only a failed step goes to the safeguarded search,
        compiled in the same pass (so on the fitting threads too).
        A block's rows are independent of each other, so with ``n_jobs > 1`` they are solved in
        ranges on the fitting threads (dealt by cost: rows with children are the dear ones),
        with the same values.

        The offsets (time link plus floor, ``prev_weight[k] prev_theta[k] + floor``) and the
        children's ``log phi`` are kept child-major: the children of each parent in one
        contiguous block (the CSR order of ``kids``), then the other rows. The solver reads a
        row's children in place, where it would otherwise gather copies of them (two
        children-by-terms arrays per thread, about a node matrix at a wide root)."""
        K = arrays.size
        pidx = np.ascontiguousarray(arrays.parent_index, dtype=np.int64)
        # children with a positive link strength, by parent, in index order (CSR)
        kids = np.flatnonzero((pidx >= 0) & (par > 0))
        kids = kids[np.argsort(pidx[kids], kind="stable")].astype(np.int64)
        kid_ptr = np.zeros(K + 1, dtype=np.int64)
        np.cumsum(np.bincount(pidx[kids], minlength=K), out=kid_ptr[1:])
        is_kid = np.zeros(K, dtype=bool)
        is_kid[kids] = True
        order = np.concatenate([kids, np.flatnonzero(~is_kid)]).astype(np.int64)
        at = np.empty(K, dtype=np.int64)  # row k's place in the child-major order
        at[order] = np.arange(K)
        offset = np.take(np.asarray(prev_theta, dtype=np.float64), order, axis=0)
        offset *= prev_weight[order][:, None]  # prev_weight * prev_theta, element by element
        offset += self.floor
        # the children's log phi as the solver reads them: NumPy's log (the compiled log may
        # differ in the last bit), refreshed for the rows a block changed
        log_kids = np.empty((kids.size, theta.shape[1]))
        _log_rows(theta, kids, log_kids, at)
        version = np.zeros(K, dtype=np.int64)
        solved_parent = np.full(K, -1, dtype=np.int64)
        solved_kids = np.full(kids.size, -1, dtype=np.int64)
        failed = np.empty(K, dtype=np.int64)
        for _ in range(n_iter):
            delta = 0.0
            for rows in blocks:
                if not rows.size:
                    continue
                # rows with children run the joint Newton, the others a closed form
                rows = dealt_by_cost(rows, kid_ptr[rows + 1] - kid_ptr[rows])
                before = version[rows]
                n_failed: dict[int, int] = {}

                def solve(a: int, z: int, rows=rows, n_failed=n_failed) -> float:
                    # a block's rows do not neighbour each other: ranges of them are solved on the
                    # fitting threads with the same arithmetic, each listing its failures in its
                    # own stretch of ``failed``
                    change, n_failed[a] = _solve_nodes_nb(rows[a:z], theta, log_kids, sums, offset, at, par, pidx,
                                                          root_anchor, kid_ptr, kids, version, solved_parent,
                                                          solved_kids, _BLOCK_MAX_ITER, _BLOCK_TOL, _BLOCK_FREEZE,
                                                          failed[a:z], _BLOCK_MAX_ITER < _JOINT_MAX_ITER,
                                                          _JOINT_MAX_ITER)
                    return change

                delta = max(delta, in_row_ranges(rows.size, solve))
                stopped = [k for a in sorted(n_failed) for k in failed[a:a + n_failed[a]]]
                for k in stopped:  # rows the compiled pass could not start (none in the softmax basis)
                    k0, k1 = kid_ptr[k], kid_ptr[k + 1]
                    parent_phi = theta[pidx[k]] if pidx[k] >= 0 else root_anchor
                    new = map_phi_with_children_dense(sums[k], par[k] * parent_phi + offset[at[k]], log_kids[k0:k1],
                                                      par[kids[k0:k1]], offset[k0:k1], phi_init=theta[k],
                                                      tol=_BLOCK_TOL, freeze=_BLOCK_FREEZE)
                    moved = float(np.max(np.abs(new - theta[k])))
                    version[k] += moved > 0.0
                    delta = max(delta, moved)
                    theta[k] = new
                _log_rows(theta, rows[(version[rows] != before) & is_kid[rows]], log_kids, at)
            if delta < 1e-10:
                break
        return theta

    def update_concentration(self, counts, sums, sumsq, theta, current):
        return np.array(current, dtype=np.float64, copy=True)


class _FixedWords(FixedNode):
    """A node's word distribution with what the split-merge moves' scores recompute kept:
    ``log phi`` (NumPy's log, so the values are those of :meth:`Multinomial.block_log_likelihood`
    and :meth:`Multinomial.log_likelihood`) and, per child depth, the child's Dirichlet
    parameter with its sum and link normaliser (the values of :meth:`Multinomial.log_link` and
    :meth:`Multinomial.log_marginal`)."""

    __slots__ = ("_log_theta", "_below", "_links")

    def __init__(self, likelihood, theta, concentration) -> None:
        super().__init__(likelihood, theta, concentration)
        self._log_theta: np.ndarray | None = None
        #: by child depth: :meth:`_child_prior`
        self._below: dict[int, tuple] = {}
        #: by child depth: :meth:`_child_link`
        self._links: dict[int, tuple] = {}

    @property
    def log_theta(self) -> np.ndarray:
        """``log phi``, taken on first use (a parent read for its links below never needs it)."""
        if self._log_theta is None:
            self._log_theta = np.log(np.asarray(self.theta, dtype=np.float64))
        return self._log_theta

    def rows(self, block: RowBlock) -> np.ndarray:
        return block.dot(self.log_theta)

    def documents(self, docs: DocumentSet) -> float:
        return float(docs.s @ self.log_theta)

    def _child_prior(self, depth: int) -> tuple:
        """A depth-``depth`` child's Dirichlet parameter below this node (no time link) and its
        sum (NumPy's), kept per depth."""
        hit = self._below.get(depth)
        if hit is None:
            a = self.likelihood._linked_prior(self.theta, depth, None)
            hit = self._below[depth] = (a, a.sum())
        return hit

    def _child_link(self, depth: int) -> tuple:
        """The parameter minus one and the link's log normaliser of :meth:`_child_prior`, kept
        per depth apart from it: a parent read only for its children's marginals never pays
        for the normaliser's ``gammaln`` over every term (about 0.3 ms at V = 20,000)."""
        hit = self._links.get(depth)
        if hit is None:
            a, a_sum = self._child_prior(depth)
            hit = self._links[depth] = (a - 1.0, gammaln(a_sum) - gammaln(a).sum())
        return hit

    def log_link_below(self, child, depth, theta_prev=None):
        if theta_prev is not None or not isinstance(child, _FixedWords):
            return super().log_link_below(child, depth, theta_prev)
        # Multinomial.log_link's arithmetic in its order, with the parent's part kept per depth
        # and the child's log phi from its own scorer
        a_minus_1, normaliser = self._child_link(depth)
        return float(normaliser + (a_minus_1 * child.log_theta).sum())

    def log_marginal_below(self, docs, concentration, depth, theta_prev=None):
        if theta_prev is not None:
            return super().log_marginal_below(docs, concentration, depth, theta_prev)
        # log_dm_marginal_linked with the parameter and its sum kept (the compiled build of
        # the parameter and its pairwise sum give NumPy's values, so these are the same), over
        # the set's terms when it knows them (the same sum of the same non-zeros)
        a, a_sum = self._child_prior(depth)
        return float(_dm_set_dense(np.ascontiguousarray(docs.s, dtype=np.float64), a, a_sum, docs.terms)[0])

    def new_child_theta(self, docs, concentration, depth):
        # Multinomial.new_node_theta with the child's Dirichlet parameter kept (the same value)
        return map_phi_dense(np.asarray(docs.s, dtype=np.float64), self._child_prior(depth)[0])

    def launch_scan(self, X, others, first, second, concentration, depth):
        if not (sp.issparse(X) and X.format == "csr"):
            return super().launch_scan(X, others, first, second, concentration, depth)
        return _WordsLaunchScan(self, X, others, first, second, concentration, depth)


class _WordsLaunchScan(LaunchScan):
    """:class:`LaunchScan` of word distributions over the terms the proposal's rows hold: the
    log ratio of two modes is needed only there, and a mode's normaliser is the child prior's
    sum plus its group's tokens, so after one O(nnz) compaction a scan costs O(nnz) of the rows,
    not O(V) (at V = 20,000 a node's rows hold a few hundred terms)."""

    def __init__(self, node, X, others, first, second, concentration, depth) -> None:
        super().__init__(node, X, others, first, second, concentration, depth)
        rows = np.concatenate([[first, second], self.others]).astype(np.int64)
        self._ptr, self._col, self._val, terms, self._total = compact_rows(X.indptr, X.indices, X.data, rows,
                                                                           X.shape[1])
        a, self._a_sum = node._child_prior(depth)
        self._a = a[terms]
        self._terms = terms

    def seed_scores(self, theta):
        # Multinomial.seed_child_theta term by term, so at the held terms it needs the node's
        # distribution there and the first row's counts, all of which are held terms
        first = slice(self._ptr[0], self._ptr[1])
        x = np.bincount(self._col[first], weights=self._val[first], minlength=self._terms.size)
        seed = self.node.likelihood.seed_child_theta(np.asarray(theta, dtype=np.float64)[self._terms], x)
        return csr_rows_dot(self._ptr, self._col, self._val, np.arange(2, self._total.size), np.log(seed))

    def log_odds(self, launch):
        return compact_split_log_odds(self._ptr, self._col, self._val, self._total,
                                      np.ascontiguousarray(launch, dtype=np.bool_), self._a, self._a_sum)

    def run(self, log_odds, uniforms, eps):
        return compact_launch_scans(self._ptr, self._col, self._val, self._total,
                                    np.ascontiguousarray(log_odds, dtype=np.float64), uniforms, float(eps), self._a,
                                    self._a_sum)


def _log_rows(theta: np.ndarray, rows: np.ndarray, out: np.ndarray, at: np.ndarray) -> None:
    """``out[at[rows]] = np.log(theta[rows])`` row by row in place: NumPy's log of the same
    values, without the gathered copy and the scatter back (at K = 191, V = 20,000 they doubled
    the cost of the log), in ranges of rows on the fitting threads."""

    def run(start: int, stop: int) -> float:
        for r in rows[start:stop]:
            np.log(theta[r], out=out[at[r]])
        return 0.0

    in_row_ranges(rows.size, run)
