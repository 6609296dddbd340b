"""The natural logarithm and exponential as plain double arithmetic, for compiled loops.

In a numba loop, ``math.log`` and ``math.exp`` are calls into the platform's maths library:
one element per call (the loop cannot run in vector instructions) and, between libraries,
results that may differ in the last bit. The kernels here compute the same functions with
additions, multiplications, one division and integer operations on the bit pattern, so a loop
of them runs several elements per vector instruction and gives the same bits on every
machine. The argument reductions are Cody and Waite's and the minimax coefficients those of
Sun's fdlibm; the error stays below one unit in the last place (the tests check it against
mpmath), where the platform library is usually correctly rounded, so the two differ in the
last bit for up to a tenth of arguments.

``log_core`` and ``exp_core`` take their main range only (positive normal numbers; arguments
in ``[EXP_CORE_MIN, EXP_CORE_MAX]``) and have no branch, so that a loop over them vectorises;
``log_nb`` and ``exp_nb`` take any double, and ``log_many_nb`` and ``exp_many_nb`` run a loop
of the cores and then redo the few elements outside the main range through the library
(their ``out`` must not be their ``x``: the second pass reads ``x`` again).

The kernels of other modules compile these functions into themselves; numba renews a cached
kernel only when its own file changes, so the package keeps its cache in a folder named by the
source of all its kernel modules (:mod:`streamtree._numba_env`): an edit here starts a fresh
cache. With ``NUMBA_CACHE_DIR`` set by hand, clear that folder after editing this module, or
its callers keep the old arithmetic.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# ln 2 split so that k * LN2_HI is exact for the exponents of doubles
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e00
# log(1 + f) = 2 atanh(s), s = f / (2 + f): the minimax coefficients of R(z), z = s^2
_LG1 = 6.666666666666735130e-01
_LG2 = 3.999999999940941908e-01
_LG3 = 2.857142874366239149e-01
_LG4 = 2.222219843214978396e-01
_LG5 = 1.818357216161805012e-01
_LG6 = 1.531383769920937332e-01
_LG7 = 1.479819860511658591e-01
# exp(r) on |r| <= ln2 / 2 through the minimax rational form: coefficients of c(r)
_P1 = 1.66666666666666019037e-01
_P2 = -2.77777777770155933842e-03
_P3 = 6.61375632143793436117e-05
_P4 = -1.65339022054652515390e-06
_P5 = 4.13813679705723846039e-08
# 1.5 * 2^52: adding it rounds a double of magnitude below 2^51 to an integer, kept in the low bits
_ROUND = 6755399441055744.0
_ROUND_BITS = 0x4338000000000000
# the significand bits above which a number's reduced form is taken in [sqrt(2)/2, 1)
_SQRT2_BITS = 0x6A09E667F3BCC
_SIGNIFICAND = 0x000FFFFFFFFFFFFF

#: the exponential's main range: 2^k stays a normal number for every k the reduction gives
EXP_CORE_MIN = -708.0
EXP_CORE_MAX = 709.0


@njit(cache=True, nogil=True, error_model="numpy")
def log_core(x: float) -> float:
    """``log(x)`` for a positive normal double ``x`` (no branch; any other input gives a wrong
    finite value: use :func:`log_nb` for those)."""
    hx = np.float64(x).view(np.int64)
    m = hx & _SIGNIFICAND
    big = np.int64(m > _SQRT2_BITS)  # reduce to [sqrt(2)/2, sqrt(2)): one more power of two
    f = np.int64(m | ((1023 - big) << 52)).view(np.float64) - 1.0
    k = float(((hx >> 52) & 0x7FF) - 1023 + big)
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    r = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7))) + w * (_LG2 + w * (_LG4 + w * _LG6))
    hfsq = 0.5 * f * f
    return k * _LN2_HI - ((hfsq - (s * (hfsq + r) + k * _LN2_LO)) - f)


@njit(cache=True, nogil=True, error_model="numpy")
def exp_core(x: float) -> float:
    """``exp(x)`` for ``EXP_CORE_MIN <= x <= EXP_CORE_MAX`` (no branch; outside that range the
    value is meaningless, even negative or infinite: use :func:`exp_nb` there)."""
    kd = x * _INV_LN2 + _ROUND  # k = x / ln 2 rounded to nearest, in the low bits
    k = np.float64(kd).view(np.int64) - _ROUND_BITS
    kd -= _ROUND
    hi = x - kd * _LN2_HI
    lo = kd * _LN2_LO
    r = hi - lo
    t = r * r
    c = r - t * (_P1 + t * (_P2 + t * (_P3 + t * (_P4 + t * _P5))))
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
    return y * np.int64((k + 1023) << 52).view(np.float64)


@njit(cache=True, nogil=True)
def _log_in_core(x: float) -> bool:
    """x is a positive normal double (not 0, subnormal, negative, inf or NaN)."""
    e = (np.float64(x).view(np.int64) >> 52) & 0xFFF  # with the sign bit: 0 < e < 0x7FF
    return 0 < e < 0x7FF


@njit(cache=True, nogil=True, error_model="numpy")
def log_nb(x: float) -> float:
    """``log(x)`` for any double: :func:`log_core` in its range, the library elsewhere."""
    if _log_in_core(x):
        return log_core(x)
    return math.log(x)


@njit(cache=True, nogil=True, error_model="numpy")
def exp_nb(x: float) -> float:
    """``exp(x)`` for any double: :func:`exp_core` in its range, the library elsewhere."""
    if EXP_CORE_MIN <= x <= EXP_CORE_MAX:
        return exp_core(x)
    return math.exp(x)


@njit(cache=True, nogil=True, error_model="numpy")
def log_many_nb(x: np.ndarray, n: int, out: np.ndarray) -> None:
    """``out[i] = log_nb(x[i])`` for ``i < n``, in vector instructions where in range."""
    odd = 0
    for i in range(n):
        xi = x[i]
        out[i] = log_core(xi)
        odd += not _log_in_core(xi)
    if odd:
        for i in range(n):
            if not _log_in_core(x[i]):
                out[i] = math.log(x[i])


@njit(cache=True, nogil=True, error_model="numpy")
def exp_many_nb(x: np.ndarray, n: int, out: np.ndarray) -> None:
    """``out[i] = exp_nb(x[i])`` for ``i < n``, in vector instructions where in range."""
    odd = 0
    for i in range(n):
        xi = x[i]
        inside = (EXP_CORE_MIN <= xi) & (xi <= EXP_CORE_MAX)
        out[i] = exp_core(min(max(xi, EXP_CORE_MIN), EXP_CORE_MAX))
        odd += not inside
    if odd:
        for i in range(n):
            xi = x[i]
            if not (EXP_CORE_MIN <= xi <= EXP_CORE_MAX):
                out[i] = math.exp(xi)
