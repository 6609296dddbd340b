"""The multinomial node update's compiled kernels against the term-by-term reference they
replace: the same iterates bit for bit (a seeded fit must give the same trees)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from numba import njit

from streamtree.likelihoods import multinomial_math as mm
from streamtree.likelihoods.multinomial import Multinomial
from streamtree.tree import TreeArrays
from streamtree.variants import resolve_variant
from test_multinomial_fast import node_problem  # tests/ is on the path under pytest


@njit
def reference_joint_newton(b, strength, offset, log_phi, t, max_iter, tol, freeze):
    """The joint Newton as first written: g' and g'' term by term (``_child_grad_nb``)."""
    V = b.shape[0]
    resid = np.empty(V)
    slope = np.empty(V)
    new_t = np.empty(V)
    fresh = np.ones(V, dtype=np.bool_)
    moved = np.zeros(V)
    lam = 0.0
    for it in range(max_iter):
        t_sum = 0.0
        for w in range(V):
            t_sum += t[w]
        if it == 0:
            for w in range(V):
                g1, g2 = mm._child_grad_nb(t[w], w, strength, offset, log_phi)
                resid[w] = g1
                slope[w] = g2
                lam += b[w] + t[w] * g1
            lam /= t_sum
            for w in range(V):
                g1 = resid[w]
                resid[w] = b[w] + t[w] * (g1 - lam)
                slope[w] = g1 - lam + t[w] * slope[w]
            fresh[:] = False
        num = 1.0 - t_sum
        den = 0.0
        for w in range(V):
            if fresh[w]:
                g1, g2 = mm._child_grad_nb(t[w], w, strength, offset, log_phi)
                resid[w] = b[w] + t[w] * (g1 - lam)
                slope[w] = g1 - lam + t[w] * g2
            elif it > 0:
                resid[w] = 0.0
            if not slope[w] < 0.0:
                return False
            num += resid[w] / slope[w]
            den += t[w] / slope[w]
        dlam = num / den
        worst = 0.0
        for w in range(V):
            step = (t[w] * dlam - resid[w]) / slope[w]
            x = t[w] + step
            if not (0.0 < x < 1.0):
                return False
            rel = abs(step) / t[w] if t[w] > 0.0 else np.inf
            worst = max(worst, rel)
            moved[w] = rel if fresh[w] or it == 0 else moved[w] + rel
            new_t[w] = x
            fresh[w] = moved[w] > freeze
        t[:] = new_t
        lam += dlam
        if worst <= tol:
            return True
    return False


@njit
def reference_coordinate_solve(b, lam, strength, offset, log_phi, active, t, dt, dlam, max_iter):
    """The per-term solve as first written: one term at a time, g' and g'' by ``_child_grad_nb``."""
    total = 0.0
    slope = 0.0
    for w in range(b.shape[0]):
        dt_w = 0.0
        if not active[w]:
            t[w] = 0.0
            dt[w] = 0.0
            continue
        bw = b[w]
        checked_one = False
        if bw == 0.0:
            checked_one = True
            g1, g2 = mm._child_grad_nb(1.0, w, strength, offset, log_phi)
            if g1 - lam >= 0.0:  # root beyond the simplex
                t[w] = 1.0
                dt[w] = 0.0
                total += 1.0
                continue
            g1, g2 = mm._child_grad_nb(0.0, w, strength, offset, log_phi)
            if g1 - lam <= 0.0:
                t[w] = 0.0
                dt[w] = 0.0
                continue
        lo, hi = 0.0, 1.0
        x = t[w] + dt[w] * dlam
        if not (lo < x < hi):
            x = 0.5 * t[w] if dlam > 0.0 else 0.5 * (t[w] + 1.0)
            if not (lo < x < hi):
                x = 0.5
        dr = -1.0
        at_one = False
        for _ in range(max_iter):
            g1, g2 = mm._child_grad_nb(x, w, strength, offset, log_phi)
            if bw > 0.0:
                r = bw + x * (g1 - lam)
                dr = g1 - lam + x * g2
            else:
                r = g1 - lam
                dr = g2
            if r > 0.0:
                lo = x
            else:
                hi = x
            if r == 0.0:
                break
            x_new = x - r / dr if dr < 0.0 else -1.0
            if abs(x_new - x) <= 1e-9 * x:
                # Newton converges quadratically: after a step this small the error of x_new
                # is of the order of (step / x)^2 x, below rounding, so x_new is taken unchecked.
                x = min(max(x_new, lo), hi) if x_new > 0.0 else x
                break
            if not (lo < x_new < hi):
                if x_new >= hi and hi == 1.0 and not checked_one:
                    checked_one = True
                    g1, g2 = mm._child_grad_nb(1.0, w, strength, offset, log_phi)
                    if bw + g1 - lam >= 0.0:  # root beyond the simplex
                        at_one = True
                        break
                # Roots span many decades: bisect geometrically unless the bracket is narrow.
                if lo == 0.0:
                    x_new = 0.01 * hi
                elif hi > 10.0 * lo:
                    x_new = np.sqrt(lo * hi)
                else:
                    x_new = 0.5 * (lo + hi)
            step = abs(x_new - x)
            x = x_new
            if step <= 1e-15 * x or hi - lo <= 1e-15 * hi:
                break
        if at_one:
            t[w] = 1.0
            dt[w] = 0.0
            total += 1.0
            continue
        # d t / d lam from the implicit function theorem on r(t, lam) = 0.
        if dr < 0.0:
            dt_w = (x if bw > 0.0 else 1.0) / dr
        t[w] = x
        dt[w] = dt_w
        total += x
        slope += dt_w
    return total, slope


def reference_map_dense(c: np.ndarray, alpha: np.ndarray, L: np.ndarray, s: np.ndarray, O: np.ndarray, *,
                        basis: str = "softmax", max_iter: int = 100, phi_init: np.ndarray | None = None,
                        tol: float = mm._JOINT_TOL, freeze: float = mm._JOINT_FREEZE) -> np.ndarray:
    """``map_phi_with_children_dense`` as written in NumPy before its search was compiled."""
    V = alpha.shape[0]
    b = c + alpha - (0.0 if basis == "softmax" else 1.0)
    # Terms with b_w < 0 (simplex basis only) sit at 0; b_w = 0 terms are fixed by the children.
    active = b >= 0.0
    n_active = int(active.sum())
    if n_active == 0:
        raise ValueError(
            "simplex-basis MAP is not unique: every term has counts + alpha < 1; use basis='softmax'"
        )
    # Start from phi_init, or else from the children-free solution (exact when the children are
    # weak).
    if phi_init is not None:
        phi0 = np.where(active, phi_init, 0.0)
    elif basis == "softmax":
        phi0 = mm.map_phi(c, alpha, basis="softmax")
    else:
        phi0 = np.where(active, b, 0.0)
    t_star = 1.0 / n_active
    phi0 = phi0 / phi0.sum() if phi0.sum() > 0 else np.where(active, t_star, 0.0)
    joint = bool(np.all(b > 0.0))  # the joint steps need every b_w > 0
    restart_pending = joint  # one restart of them, after the first coordinate solve below
    if joint:
        t = phi0.copy()
        if mm._joint_newton_nb(b, s, O, L, t, mm._JOINT_MAX_ITER, tol, freeze):
            return t / t.sum()
        phi0 = t / t.sum()  # where the joint steps stopped (on the simplex)
    # The safeguarded search, from the multiplier sum_w phi_w h_w(phi_w) that the KKT conditions
    # give at the optimum, where h_w(t) = b_w / t + g_w'(t). Its bracket is built when a Newton
    # step fails: with lambda = min_w h_w(1/n) every active phi_w >= 1/n, with
    # lambda = max_w h_w(1/n) every phi_w <= 1/n.
    lam_lo, lam_hi = -np.inf, np.inf
    bracketed = False
    grad = np.empty(V)
    mm._child_slope_nb(phi0, s, O, L, grad)
    lam = float(b[active].sum() + (phi0 * grad).sum())
    t = np.where(active, phi0, 0.0)
    dt = np.zeros(V)
    act = active.astype(np.bool_)
    # Newton on 1 / S(lambda) - 1 (exactly linear without children), kept inside the bracket.
    dlam = 0.0
    for _ in range(200):
        if not (lam_lo <= lam <= lam_hi):
            lam = min(max(lam, lam_lo), lam_hi)
        total, slope = reference_coordinate_solve(b, lam, s, O, L, act, t, dt, dlam, max_iter)
        if abs(total - 1.0) <= mm._LINEAR_FINISH and slope < 0.0:
            # The last step to sum 1 is taken along d phi / d lambda: its error is second order
            # in |1 - S| (below 1e-14 relative in phi), and the final normalisation absorbs it.
            t += dt * ((1.0 - total) / slope)
            break
        if restart_pending and total > 0.0:
            # The joint steps fail mostly at their first step, from a start where some terms sit
            # decades below their optimum (a warm start after a child gained words its parent
            # had lost): there the linearisation of b_w + t (g_w'(t) - lambda) is not
            # decreasing. One coordinate solve puts every term at its optimum for this lambda;
            # from there, normalised, the joint steps converge in a few (to the same stopping
            # rule), where the multiplier search would take several more coordinate solves.
            restart_pending = False
            t_restart = t / total
            if mm._joint_newton_nb(b, s, O, L, t_restart, mm._JOINT_MAX_ITER, tol, freeze):
                return t_restart / t_restart.sum()
        if total > 1.0:
            lam_lo = max(lam_lo, lam)
        else:
            lam_hi = min(lam_hi, lam)
        if total > 0.0 and slope < 0.0:
            lam_new = lam + (1.0 / total - 1.0) * total * total / slope
        else:
            lam_new = np.nan
        if not (lam_lo < lam_new < lam_hi):
            if not bracketed:
                bracketed = True
                mm._child_slope_nb(np.array([t_star]), s, O, L, grad)
                h_star = (b / t_star + grad)[active]
                lam_lo = max(lam_lo, float(h_star.min()))
                lam_hi = min(lam_hi, float(h_star.max()))
            if not (lam_lo < lam_new < lam_hi):
                lam_new = 0.5 * (lam_lo + lam_hi)
        width = lam_hi - lam_lo
        if bracketed and width <= 4.0 * np.finfo(float).eps * max(abs(lam_lo), abs(lam_hi)):
            break
        dlam = lam_new - lam
        lam = lam_new
    else:
        raise RuntimeError("map_phi_with_children: multiplier search did not converge")
    return t / t.sum()


def problems():
    """Node problems like a sweep's: 1-6 children, some with zero strength, runs of new
    children sharing strength and offset, warm starts near and far from the optimum, a start
    the joint steps cannot handle."""
    rng = np.random.default_rng(7)
    for case in range(24):
        V = int(rng.choice([7, 300, 2000]))
        J = 1 + case % 6
        c, alpha, L, s, O = node_problem(rng, V, J)
        if case % 3 == 1 and J > 1:  # new children: one strength, the floor as offset
            s[:] = s[0]
            O[:] = 0.01
        if case % 4 == 2:
            s[rng.integers(0, J)] = 0.0
        if case % 5 == 3 and J > 2:  # two equal children after a different one
            s[2] = s[1]
            O[2] = O[1]
        b = c + alpha
        start = b / b.sum()
        scale = [0.0, 1e-3, 0.1, 0.5][case % 4]
        t0 = start * np.exp(scale * rng.normal(size=V))
        if case == 23:
            t0 = np.full(V, 1e-12)
            t0[0] = 1.0
        yield b, s, O, L, t0 / t0.sum()


@pytest.mark.parametrize("freeze", [mm._JOINT_FREEZE, 0.0, 1e-3])
def test_joint_newton_is_the_term_by_term_reference_bit_for_bit(freeze):
    outcomes = set()
    for b, s, O, L, t0 in problems():
        for max_iter in (1, 3, mm._JOINT_MAX_ITER):
            t_ref, t_new = t0.copy(), t0.copy()
            ok_ref = reference_joint_newton(b, s, O, L, t_ref, max_iter, mm._JOINT_TOL, freeze)
            ok_new = mm._joint_newton_nb(b, s, O, L, t_new, max_iter, mm._JOINT_TOL, freeze)
            assert ok_new == ok_ref
            assert np.array_equal(t_new, t_ref)
            outcomes.add(bool(ok_ref))
    assert outcomes == {True, False}  # both converged and abandoned runs were compared


def coordinate_cases():
    """Per-term solves as the multiplier search calls them, and harder ones: multipliers about
    the KKT value and far from it (roots near 0, beyond the simplex), terms with b_w = 0 and
    inactive terms, cold and warm starts, iteration budgets that stop terms early."""
    rng = np.random.default_rng(5)
    for b, s, O, L, t0 in problems():
        V = b.size
        grad = np.empty(V)
        mm._child_slope_nb(t0, s, O, L, grad)
        lam0 = float(b.sum() + (t0 * grad).sum())
        bz = b.copy()
        pick = rng.permutation(V)[: max(1, V // 5)]
        bz[pick[: pick.size // 2 + 1]] = 0.0  # simplex-basis terms at b_w = 0 ...
        bz[pick[pick.size // 2 + 1:]] = -0.5  # ... and below it (inactive)
        for bb in (b, bz):
            active = bb >= 0.0
            for lam in (lam0, 0.5 * lam0, 2.0 * lam0, 1e-3 * lam0, -abs(lam0)):
                for dlam, dt0 in ((0.0, np.zeros(V)), (0.1 * abs(lam0), -t0 / max(abs(lam0), 1.0))):
                    for max_iter in (1, 4, 100):
                        yield bb, lam, s, O, L, active, t0, dt0, dlam, max_iter


def test_coordinate_solve_is_the_term_by_term_reference_bit_for_bit():
    ends = set()
    for b, lam, s, O, L, active, t0, dt0, dlam, max_iter in coordinate_cases():
        t_ref, dt_ref, t_new, dt_new = t0.copy(), dt0.copy(), t0.copy(), dt0.copy()
        ref = reference_coordinate_solve(b, lam, s, O, L, active, t_ref, dt_ref, dlam, max_iter)
        new = mm._coordinate_solve_nb(b, lam, s, O, L, active, t_new, dt_new, dlam, max_iter)
        assert np.array_equal(np.array(new), np.array(ref))
        assert np.array_equal(t_new, t_ref) and np.array_equal(dt_new, dt_ref)
        ends.update({"one": bool(np.any(t_ref[active] == 1.0)), "zero": bool(np.any(t_ref[active] == 0.0)),
                     "inside": bool(np.any((t_ref > 0.0) & (t_ref < 1.0)))}.items())
    # terms at each end of the simplex and inside it were compared, not only the easy ones
    assert {("one", True), ("zero", True), ("inside", True)} <= ends


@pytest.mark.parametrize("joint_steps", [mm._JOINT_MAX_ITER, 0])
@pytest.mark.parametrize("tol", [mm._JOINT_TOL, mm._BLOCK_TOL])
def test_compiled_search_is_the_numpy_search_bit_for_bit(monkeypatch, tol, joint_steps):
    """``map_phi_with_children_dense`` with its safeguarded search compiled against the NumPy
    search it replaces: softmax problems (joint steps, their restart, and with no joint steps
    the whole multiplier search) and simplex-basis ones (terms at b_w <= 0, no joint steps)."""
    monkeypatch.setattr(mm, "_JOINT_MAX_ITER", joint_steps)
    searched = 0
    for b, s, O, L, t0 in problems():
        alpha = 0.5 * b
        c = b - alpha
        for basis in ("softmax", "simplex"):
            for phi_init in (None, t0):
                args = (c, alpha, L, s, O)
                kw = dict(basis=basis, phi_init=phi_init, tol=tol, freeze=tol)
                assert np.array_equal(mm.map_phi_with_children_dense(*args, **kw), reference_map_dense(*args, **kw))
                start = t0.copy()
                searched += not mm._joint_newton_nb(b, s, O, L, start, mm._JOINT_MAX_ITER, tol, tol)
    if joint_steps:
        assert searched  # some starts stop the joint steps, so their restarts were compared too


def test_digamma_trigamma_many_is_the_scalar_kernel_bit_for_bit():
    rng = np.random.default_rng(11)
    x = np.concatenate([
        np.logspace(-300, 300, 2001),
        np.exp(rng.uniform(np.log(1e-3), np.log(50.0), 20_000)),  # the node update's range
        rng.uniform(0.0, 12.0, 5_000),
        np.arange(1.0, 13.0),  # integers: the recurrence's thresholds are hit exactly
        np.nextafter(np.array([9.0, 10.0, 11.0]), 0.0),
        np.array([-0.5, -0.999, -0.9999999]),  # still six steps (-1 itself divides by zero)
        -1.0 - rng.uniform(0.01, 5.0, 50) - 0.5,  # more steps: the scalar kernel's (non-integers)
    ])
    n = x.size
    dg, tg = np.empty(n + 5), np.empty(n + 5)
    mm._digamma_trigamma_many_nb(x.copy(), n, dg, tg, np.empty((2, n)))
    ref = np.array([mm._digamma_trigamma_nb(v) for v in x])
    assert np.array_equal(dg[:n], ref[:, 0])
    assert np.array_equal(tg[:n], ref[:, 1])


def test_digamma_trigamma_many_matches_mpmath():
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    x = np.concatenate([np.logspace(-6, 4, 120), np.linspace(0.05, 12.0, 120)])
    dg, tg = np.empty(x.size), np.empty(x.size)
    mm._digamma_trigamma_many_nb(x.copy(), x.size, dg, tg, np.empty((2, x.size)))
    for v, d, t in zip(x, dg, tg):
        assert d == pytest.approx(float(mpmath.digamma(v)), rel=1e-13, abs=1e-13)
        assert t == pytest.approx(float(mpmath.polygamma(1, v)), rel=1e-13)


def test_child_grads_are_child_grad_values():
    rng = np.random.default_rng(3)
    V, J = 400, 5
    _, _, L, s, O = node_problem(rng, V, J)
    s[1] = 0.0
    s[3], O[3] = s[2], O[2]  # repeats the previous positive-strength child
    t = rng.dirichlet(np.full(V, 0.5))
    same = mm._repeated_children_nb(s, O)
    assert same.tolist() == [False, False, False, True, False]
    for terms in (np.sort(rng.permutation(V)[:123]), np.arange(V)):  # some terms, every term
        g1, g2, dg, tg = (np.empty(V) for _ in range(4))
        mm._child_grads_nb(terms.astype(np.int64), terms.size, t, s, O, L, same, g1, g2, dg, tg, np.empty((3, V)))
        for i, w in enumerate(terms):
            assert (g1[i], g2[i]) == mm._child_grad_nb(t[w], w, s, O, L)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 127, 128, 129, 136, 1000, 2000, 8191, 8193, 20_011, 54_321])
def test_pairwise_sum_is_numpy_sum(n):
    rng = np.random.default_rng(n)
    for a in (rng.random(n), rng.dirichlet(np.full(max(n, 1), 0.1))[:n],
              rng.standard_normal(n) * 10.0 ** rng.uniform(-8, 8, n)):
        assert mm._pairwise_sum_nb(np.ascontiguousarray(a)) == a.sum()


def reference_update(lik, arrays, theta, sums, prev_theta, has_prev, root_anchor, update, n_iter,
                     keep_last=True):
    """The node update as first written: a Python loop over each block's nodes, re-solving a
    node when its parent or a child changed, from its current phi: ``mm._BLOCK_MAX_ITER`` joint
    Newton steps, their last iterate kept (with ``keep_last``) unless a step failed, and the
    safeguarded solve otherwise."""
    theta = np.array(theta, dtype=np.float64, copy=True)
    K = arrays.size
    par, tim = lik.link_strengths(arrays.depth)
    pidx = arrays.parent_index
    children = [[] for _ in range(K)]
    for k in range(1, K):
        children[pidx[k]].append(k)
    offset = (tim * has_prev)[:, None] * prev_theta + lik.floor
    parity = arrays.depth % 2
    version = np.zeros(K, dtype=np.int64)
    solved_with = [None] * K
    for _ in range(n_iter):
        delta = 0.0
        for q in (0, 1):
            for k in np.flatnonzero((parity == q) & update):
                kids = [j for j in children[k] if par[j] > 0]
                inputs = (version[pidx[k]] if pidx[k] >= 0 else 0, tuple(version[kids]))
                if solved_with[k] == inputs:
                    continue
                solved_with[k] = inputs
                parent_phi = theta[pidx[k]] if pidx[k] >= 0 else root_anchor
                alpha = par[k] * parent_phi + offset[k]
                if kids:
                    L = np.log(theta[kids])
                    t = theta[k] / theta[k].sum()
                    if mm._joint_newton_nb(sums[k] + alpha - 0.0, par[kids], offset[kids], L, t, mm._BLOCK_MAX_ITER,
                                           mm._BLOCK_TOL, mm._BLOCK_FREEZE, keep_last):
                        new = t / t.sum()
                    else:
                        new = mm.map_phi_with_children_dense(sums[k], alpha, L, par[kids], offset[kids],
                                                             phi_init=theta[k], tol=mm._BLOCK_TOL,
                                                             freeze=mm._BLOCK_FREEZE)
                else:
                    new = mm.map_phi_dense(sums[k], alpha)
                change = float(np.max(np.abs(new - theta[k])))
                if change > 0.0:
                    version[k] += 1
                delta = max(delta, change)
                theta[k] = new
        if delta < 1e-10:
            break
    return theta


def random_tree_problem(rng, K, V, max_depth):
    parent = np.full(K, -1, dtype=np.int64)
    depth = np.zeros(K, dtype=np.int64)
    for k in range(1, K):  # pre-order: a node's parent comes before it
        candidates = np.flatnonzero(depth[:k] < max_depth)
        parent[k] = rng.choice(candidates)
        depth[k] = depth[parent[k]] + 1
    arrays = TreeArrays(np.arange(K, dtype=np.int64), parent, depth, np.zeros(K, dtype=np.int64))
    anchor = rng.dirichlet(np.full(V, 0.5))
    theta = np.array([rng.dirichlet(300.0 * anchor + 0.05) for _ in range(K)])
    sums = np.zeros((K, V))
    for k in range(K):
        if rng.random() < 0.8:
            np.add.at(sums[k], rng.choice(V, int(rng.integers(5, 400)), p=theta[k]), 1.0)
    prev = np.array([rng.dirichlet(800.0 * t + 0.05) for t in theta])
    has_prev = rng.random(K) < 0.6
    start = theta * np.exp(0.05 * rng.normal(size=theta.shape))
    start /= start.sum(axis=1, keepdims=True)
    return arrays, start, sums, prev, has_prev, anchor


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("block_steps, keep_last", [(mm._BLOCK_MAX_ITER, mm._BLOCK_MAX_ITER < mm._JOINT_MAX_ITER),
                                                    (2, True), (1, False), (mm._JOINT_MAX_ITER, True),
                                                    (mm._JOINT_MAX_ITER + 4, False)])
def test_block_node_update_is_the_python_loop_bit_for_bit(monkeypatch, seed, block_steps, keep_last):
    """``Multinomial.update_theta`` (compiled blocks) against the Python loop it replaces, on
    random trees with time links, leaves without data and a root anchor: as shipped, with a
    budget of two joint Newton steps, and with one step that is not kept unless it converged,
    where most solves fall back to the safeguarded search (compiled in the block pass; the
    reference calls ``map_phi_with_children_dense``)."""
    from streamtree.likelihoods import multinomial as multinomial_module

    monkeypatch.setattr(mm, "_BLOCK_MAX_ITER", block_steps)
    monkeypatch.setattr(multinomial_module, "_BLOCK_MAX_ITER", block_steps)
    solve = mm._solve_nodes_nb
    monkeypatch.setattr(multinomial_module, "_solve_nodes_nb",
                        lambda *args: solve(*args[:-2], keep_last, args[-1]))
    fallbacks = []
    dense = mm.map_phi_with_children_dense

    def counted(*args, **kwargs):
        fallbacks.append(1)
        return dense(*args, **kwargs)

    monkeypatch.setattr(mm, "map_phi_with_children_dense", counted)
    rng = np.random.default_rng(seed)
    V = int(rng.choice([50, 700]))
    K = int(rng.integers(2, 14))
    config = resolve_variant("dtssbp", window=2, max_depth=3, gamma=0.5, xi=0.001)
    lik = Multinomial(config, V, kappa0=float(rng.choice([50.0, 500.0])), kappa1=1.0, a=0.0, min_node_docs=2)
    arrays, start, sums, prev, has_prev, anchor = random_tree_problem(rng, K, V, 3)
    update = rng.random(K) < 0.85 if seed % 2 else np.ones(K, dtype=bool)
    for n_iter in (1, 2, 10):
        fast = lik.update_theta(arrays, start, sums, np.ones(K), np.ones(K), prev, has_prev, anchor, update,
                                n_iter)
        ref = reference_update(lik, arrays, start, sums, prev, has_prev, anchor, update, n_iter, keep_last)
        assert np.array_equal(fast, ref)
    assert not np.array_equal(fast, start)
    # previous parameters in single precision and Fortran order: the offsets are still doubles
    prev32 = np.asfortranarray(prev.astype(np.float32))
    assert np.array_equal(lik.update_theta(arrays, start, sums, np.ones(K), np.ones(K), prev32, has_prev, anchor,
                                           update, 2),
                          reference_update(lik, arrays, start, sums, prev32, has_prev, anchor, update, 2, keep_last))
    if not keep_last and (arrays.parent_index >= 0).any():
        assert fallbacks  # the compiled safeguarded search was compared too


@pytest.mark.parametrize("seed", range(3))
def test_block_solve_reports_the_largest_change(monkeypatch, seed):
    """``_solve_nodes_nb``'s change (the pass's convergence test) is NumPy's largest absolute
    change of the rows it solved."""
    from streamtree.likelihoods import multinomial as multinomial_module

    solve, seen = mm._solve_nodes_nb, []

    def checked(rows, theta, *args):
        before = theta[rows].copy()
        change, n_failed = solve(rows, theta, *args)
        if rows.size and not n_failed:
            seen.append(change)
            assert change == np.max(np.abs(theta[rows] - before))
        return change, n_failed

    monkeypatch.setattr(multinomial_module, "_solve_nodes_nb", checked)
    rng = np.random.default_rng(seed)
    config = resolve_variant("dtssbp", window=2, max_depth=3, gamma=0.5, xi=0.001)
    lik = Multinomial(config, 300, kappa0=500.0, kappa1=1.0, a=0.0, min_node_docs=2)
    arrays, start, sums, prev, has_prev, anchor = random_tree_problem(rng, 9, 300, 3)
    lik.update_theta(arrays, start, sums, np.ones(9), np.ones(9), prev, has_prev, anchor, np.ones(9, dtype=bool), 3)
    assert seen and max(seen) > 0.0


@pytest.mark.parametrize("seed", range(4))
def test_linked_marginal_is_the_numpy_composition_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    V = int(rng.choice([5, 130, 2000, 9000]))
    c = rng.poisson(0.3, V).astype(float)
    parent = rng.dirichlet(np.full(V, 0.2))
    prev = rng.dirichlet(np.full(V, 0.2))
    strength, floor, tim = float(rng.uniform(0, 2e3)), 0.01, float(rng.uniform(0, 5e3))
    alpha = strength * parent + floor
    assert mm.log_dm_marginal_linked(c, strength, parent, floor) == mm.log_dm_marginal_dense(c, alpha)
    assert (mm.log_dm_marginal_linked(c, strength, parent, floor, tim, prev)
            == mm.log_dm_marginal_dense(c, alpha + tim * prev))
    with pytest.raises(ValueError, match="non-negative"):
        mm.log_dm_marginal_linked(-c - 1.0, strength, parent, floor)


@pytest.mark.parametrize("seed", range(4))
def test_dense_set_marginal_is_the_row_kernel_bit_for_bit(seed):
    # _dm_set_dense_nb on a dense count vector against _dm_rows_nb on its CSR form: counts of
    # 1-8 (short products), larger and fractional ones, parameters from tiny to past the short
    # product's 1e30 limit
    rng = np.random.default_rng(seed)
    V = int(rng.choice([7, 300, 5000]))
    c = rng.choice([0.0, 0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 9.0, 40.0, 2.5], size=V)
    alpha = np.exp(rng.uniform(np.log(1e-12), np.log(1e3), V))
    alpha[rng.integers(V)] = 3e30
    a_sum = float(alpha.sum())
    value, total = mm._dm_set_dense_nb(c, alpha, a_sum)
    X = sp.csr_matrix(c[None, :])
    out = np.empty((1, 1))
    mm._dm_rows_nb(X.indptr.astype(np.int64), X.indices.astype(np.int64), X.data, alpha[None, :],
                   np.array([a_sum]), np.zeros(1), out)
    assert value == out[0, 0] and total == c.sum()
    # and the value itself, against the NumPy rising factorial (Stirling's series for large
    # parameters, where a difference of gammaln values would lose every digit)
    expected = np.sum(mm.log_rising_factorial(alpha, c)) - mm.log_rising_factorial(a_sum, c.sum())
    np.testing.assert_allclose(value, expected, rtol=1e-10)


@pytest.mark.parametrize("integral", [True, False])
def test_launch_scans_equal_one_scan_after_another(integral):
    """The launch scans, which keep a scan's odds when its launch repeats and (on integer
    counts) move only the rows that changed sides between the groups' sums, equal each scan
    taken afresh by :func:`compact_split_log_odds`, to the bit; with odds of every size, so
    that launches repeat, change a few rows or change most of them."""
    from streamtree.likelihoods.base import clipped_expit, compact_rows

    rng = np.random.default_rng(11)
    V = 60
    checked = {"repeat": 0, "few": 0, "many": 0}
    for case in range(60):
        n = int(rng.integers(3, 40))
        X = sp.random(n, V, density=0.2, random_state=rng, format="csr",
                      data_rvs=lambda k: rng.integers(1, 6, size=k).astype(float))
        if not integral:
            X.data *= rng.uniform(0.3, 1.7, size=X.data.size)
        rows = rng.permutation(n).astype(np.int64)
        ptr, col, val, terms, total = compact_rows(X.indptr, X.indices, X.data, rows, V)
        assert mm._integral_rows(val) == integral
        a = rng.gamma(0.3, size=V) + 1e-3
        a_held, a_sum = a[terms], float(a.sum())
        scale = [0.01, 1.0, 30.0][case % 3]  # launches nearly fixed, mixed, nearly random
        lo = rng.normal(scale=scale, size=n - 2) + (40.0 if case % 3 == 0 else 0.0)
        uniforms = rng.random((4, n - 2))
        got = mm.compact_launch_scans(ptr, col, val, total, lo, uniforms, 1e-4, a_held, a_sum)
        want, last = lo, None
        for u in uniforms:
            launch = np.array([x < clipped_expit(y, 1e-4) for x, y in zip(u, want)], dtype=np.bool_)
            if last is not None:
                flips = int((launch != last).sum())
                checked["repeat" if flips == 0 else "few" if flips <= 2 else "many"] += 1
            last = launch
            want = mm.compact_split_log_odds(ptr, col, val, total, launch, a_held, a_sum)
        assert np.array_equal(got.view(np.int64), want.view(np.int64))
    assert min(checked.values()) > 0, checked


def test_integral_rows_refuses_sums_beyond_float64_integers():
    assert mm._integral_rows(np.array([2.0**52, 2.0**52 - 1.0, 0.0]))
    assert not mm._integral_rows(np.array([2.0**52, 2.0**52, 1.0]))  # sums to 2**53 once rounded
    assert not mm._integral_rows(np.array([-(2.0**52), 2.0**52]))  # a partial sum's size counts
    assert not mm._integral_rows(np.array([1.0, 2.5]))
    assert not mm._integral_rows(np.array([1.0, np.nan]))
    assert not mm._integral_rows(np.array([np.inf]))
