"""The multinomial node update's compiled kernels against the term-by-term reference they
replace: the same iterates bit for bit (a seeded fit must give the same trees)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from streamtree.likelihoods import multinomial_math as mm
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


def test_child_grads_are_child_grad_values():
    rng = np.random.default_rng(3)
    V, J = 400, 5
    _, _, L, s, O = node_problem(rng, V, J)
    s[1] = 0.0
    s[3], O[3] = s[2], O[2]  # repeats the previous positive-strength child
    t = rng.dirichlet(np.full(V, 0.5))
    same = mm._repeated_children_nb(s, O)
    assert same.tolist() == [False, False, False, True, False]
    terms = rng.permutation(V)[:123].astype(np.int64)
    g1, g2, dg, tg = (np.empty(V) for _ in range(4))
    mm._child_grads_nb(terms, terms.size, t, s, O, L, same, g1, g2, dg, tg)
    for i, w in enumerate(terms):
        assert (g1[i], g2[i]) == mm._child_grad_nb(t[w], w, s, O, L)
