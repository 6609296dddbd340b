"""The compiled logarithm and exponential against mpmath, the library at special values, and
their vector loops against their scalar forms bit for bit."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from numba import njit

from streamtree.elementary import (
    EXP_CORE_MAX,
    EXP_CORE_MIN,
    exp_core,
    exp_many_nb,
    exp_nb,
    log_core,
    log_many_nb,
    log_nb,
)

TINY = 5e-324  # smallest subnormal
MIN_NORMAL = 2.2250738585072014e-308
MAX = 1.7976931348623157e308


@njit
def _map(f, x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = f(x[i])
    return out


def ulp_errors(values, results, exact):
    """|result - exact| in units of the last place of the exact value."""
    errs = []
    with mpmath.workprec(113):
        for v, r in zip(values, results):
            e = exact(mpmath.mpf(float(v)))
            ulp = math.ulp(float(e))
            errs.append(float(abs(mpmath.mpf(float(r)) - e) / ulp))
    return np.array(errs)


def log_arguments(rng, n):
    return np.concatenate([
        np.exp(rng.uniform(-708.0, 709.0, n)),  # every binade of the normal numbers
        rng.uniform(0.5, 2.0, n),  # near 1, where log is small and the reduction matters
        1.0 + rng.uniform(-1e-6, 1e-6, n // 4),
        np.sqrt(2.0) * (1.0 + rng.uniform(-1e-12, 1e-12, n // 4)),  # the reduction's boundary
        np.sqrt(0.5) * (1.0 + rng.uniform(-1e-12, 1e-12, n // 4)),
        [MIN_NORMAL, MAX, 1.0, 2.0, 0.5, 10.0, np.nextafter(1.0, 2.0), np.nextafter(1.0, 0.0)],
    ])


def test_log_is_within_one_ulp_of_the_exact_value():
    x = log_arguments(np.random.default_rng(0), 4000)
    got = _map(log_core, x)
    errs = ulp_errors(x, got, mpmath.log)
    assert errs.max() < 1.0, errs.max()
    assert np.mean(errs <= 0.5) > 0.9  # mostly the correctly rounded value itself
    assert log_core(1.0) == 0.0 and log_core(2.0) == math.log(2.0)


def test_exp_is_within_one_ulp_of_the_exact_value():
    rng = np.random.default_rng(1)
    x = np.concatenate([
        rng.uniform(EXP_CORE_MIN, EXP_CORE_MAX, 4000),
        rng.uniform(-1.0, 1.0, 2000),
        rng.uniform(-1e-8, 1e-8, 500),
        (np.arange(-1021, 1023) + 0.5) * math.log(2.0),  # halfway between the reduction's steps
        [EXP_CORE_MIN, EXP_CORE_MAX, 0.0, -0.0, 1.0, -1.0],
    ])
    got = _map(exp_core, x)
    errs = ulp_errors(x, got, mpmath.exp)
    assert errs.max() < 1.0, errs.max()
    assert np.mean(errs <= 0.5) > 0.8
    assert exp_core(0.0) == 1.0  # a row's best column weighs exactly 1


SPECIAL_LOG = [0.0, -0.0, -1.0, -MAX, np.inf, -np.inf, np.nan, TINY, 1e-310, MIN_NORMAL, MAX, 1.0]
SPECIAL_EXP = [-np.inf, np.inf, np.nan, -1e4, -745.2, -745.0, -744.0, -720.0, -708.5, EXP_CORE_MIN,
               EXP_CORE_MAX, 709.5, 709.78, 709.8, 1e4, 0.0]


@pytest.mark.parametrize("x", SPECIAL_LOG)
def test_log_outside_its_core_is_the_library_value(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = np.log(np.float64(x))  # -inf at 0, NaN below, the library's value elsewhere
    assert np.array_equal(log_nb(x), expected, equal_nan=True)


@pytest.mark.parametrize("x", [v for v in SPECIAL_EXP if not EXP_CORE_MIN <= v <= EXP_CORE_MAX])
def test_exp_outside_its_core_is_the_library_value(x):
    with np.errstate(over="ignore", under="ignore"):
        expected = float(np.exp(np.float64(x)))  # subnormals, 0, inf and NaN
    got = exp_nb(x)
    # NumPy's vector exponential may differ from the C library's in the last bit of a subnormal
    assert np.array_equal(got, expected, equal_nan=True) or abs(got - expected) <= math.ulp(expected)


def test_vector_loops_are_the_scalar_functions_bit_for_bit():
    rng = np.random.default_rng(2)
    x = np.concatenate([log_arguments(rng, 500), SPECIAL_LOG])
    rng.shuffle(x)
    out = np.full(x.size + 3, 7.0)
    log_many_nb(x, x.size, out)
    assert np.array_equal(out[:x.size], _map(log_nb, x), equal_nan=True)
    assert np.all(out[x.size:] == 7.0)  # only the first n are written
    y = np.concatenate([rng.uniform(-800.0, 800.0, 3000), SPECIAL_EXP])
    rng.shuffle(y)
    out = np.empty(y.size)
    with np.errstate(over="ignore"):
        exp_many_nb(y, y.size, out)
    assert np.array_equal(out, _map(exp_nb, y), equal_nan=True)
    # a prefix: the elements past n are neither read nor written
    part = np.full(y.size, -1.0)
    exp_many_nb(y, 100, part)
    assert np.array_equal(part[:100], out[:100], equal_nan=True) and np.all(part[100:] == -1.0)
