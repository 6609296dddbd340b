"""Von Mises-Fisher (vMF) likelihood on the unit sphere S^{p-1} in R^p.

The density is ``f(x | mu, kappa) = C_p(kappa) exp(kappa mu.x)`` with

    log C_p(kappa) = nu log(kappa) - (nu + 1) log(2 pi) - log I_nu(kappa),   nu = p/2 - 1.

Document vectors live in p ~ 10^3 .. 10^5 dimensions, where the textbook routes fail: ``iv`` and
``ive`` underflow to zero as soon as kappa is well below nu, and ``scipy.stats.vonmises_fisher``
returns infinities there and builds p x p matrices when sampling. Everything here is therefore
computed in log space from one quantity,

    D(nu, x) = log I_nu(x) - nu log(x),

which stays finite down to x = 0 (where it equals -nu log 2 - lgamma(nu + 1)), so that
``log C_p(kappa) = -(nu + 1) log(2 pi) - D(nu, kappa)`` with no cancellation of ``log kappa``
terms. D is evaluated by one of three routes:

* the power series of ``I_nu`` when ``x^2/4 <= nu + 1`` (terms fall faster than ``1/k!``), which
  is exact to rounding and gives the kappa -> 0 limit ``log(1/area(S^{p-1}))`` exactly;
* the uniform (Debye) asymptotic expansion of ``I_nu`` with the correction polynomials
  u_1 .. u_5 when ``nu >= 50`` (truncation error below 1e-10 there, uniformly in x);
* otherwise (small order, moderate or large argument): ``log(ive) + x`` in the NumPy functions,
  and in the numba kernels a backward recurrence of the Bessel ratio started from the Debye
  expansion at an order ``>= 50`` (no SciPy inside numba).

The numba kernels (``*_nb``) are scalar ``@njit(cache=True, nogil=True)`` functions meant to be
called from other numba kernels; they agree with the NumPy functions to within rounding (a few
ulp of the magnitude of ``log C_p``, i.e. ~1e-10 absolute at kappa = 1e6).
"""

from __future__ import annotations

import math
import threading
import warnings
from collections import OrderedDict

import numpy as np
import scipy.sparse as sp
from numba import njit
from numpy.typing import ArrayLike
from scipy.special import gammaln, ive

from streamtree.inference.enumerated import (UNIT_NORM_TOL, VMF, WEIGHT_TOL, Candidates, _csr_row_scores,
                                             _weights_and_draw, row_sq_norms, row_weights_are_unit)
from streamtree.inference.theta_map import map_theta_vmf
from streamtree.inference.threads import in_row_ranges
from streamtree.likelihoods.base import (DocumentSet, FixedNode, LaunchScan, Likelihood, RowBlock, WordTopics,
                                        clipped_expit, compact_rows, csr_rows_dot, finite_csr,
                                        sq_norms_of_rows)

__all__ = [
    "VonMisesFisher",
    "estimate_concentration",
    "pair_cosine",
    "group_log_likelihood",
    "group_log_marginal",
    "log_bessel_iv",
    "log_bessel_iv_nb",
    "log_new_node_marginal",
    "log_new_node_marginal_nb",
    "log_normalizer",
    "log_normalizer_nb",
    "mean_resultant_length",
    "mean_resultant_length_nb",
    "new_node_table",
    "sample_vmf",
]

_LOG_2PI = math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)
# Order from which the Debye expansion (with u_1..u_5) is accurate to < 1e-10 for every argument.
_DEBYE_MIN_ORDER = 50.0
_SERIES_TERMS = 20  # enough for the series region: term_k <= term_0 / k!
#: rows read as document weights whose median norm is beyond this factor of 1 are warned about
#: (:meth:`VonMisesFisher.check_input`): more likely unnormalised rows than weights
WEIGHT_MEDIAN_RANGE = 4.0
#: ... when there are at least this many of them (a few short documents scored are not a sign)
WEIGHT_WARNING_MIN_ROWS = 20
#: :func:`log_normalizers` hands arrays at least this long to the fitting threads (~0.1 us an entry)
_THREADED_NORMALIZERS = 4096

# Coefficients of the Debye polynomials u_k(t) (odd/even powers only), from the recurrence
# u_{k+1} = t^2 (1 - t^2) u_k' / 2 + (1/8) int_0^t (1 - 5 s^2) u_k(s) ds.
_U1 = (1.0 / 8.0, -5.0 / 24.0)  # t, t^3
_U2 = (9.0 / 128.0, -77.0 / 192.0, 385.0 / 1152.0)  # t^2, t^4, t^6
_U3 = (75.0 / 1024.0, -4563.0 / 5120.0, 17017.0 / 9216.0, -85085.0 / 82944.0)  # t^3 .. t^9
_U4 = (
    3675.0 / 32768.0,
    -96833.0 / 40960.0,
    144001.0 / 16384.0,
    -7436429.0 / 663552.0,
    37182145.0 / 7962624.0,
)  # t^4 .. t^12
_U5 = (
    59535.0 / 262144.0,
    -67608983.0 / 9175040.0,
    250881631.0 / 5898240.0,
    -108313205.0 / 1179648.0,
    5391411025.0 / 63700992.0,
    -5391411025.0 / 191102976.0,
)  # t^5 .. t^15


# ----------------------------------------------------------------------------------------------
# Shared arithmetic (plain Python: works on NumPy arrays, and is compiled below for scalars)
# ----------------------------------------------------------------------------------------------


def _debye_correction_py(nu, t):
    """sum_{k=1..5} u_k(t) / nu^k, the Debye correction inside ``log(1 + ...)``."""
    t2 = t * t
    u1 = t * (_U1[0] + _U1[1] * t2)
    u2 = t2 * (_U2[0] + t2 * (_U2[1] + t2 * _U2[2]))
    u3 = t * t2 * (_U3[0] + t2 * (_U3[1] + t2 * (_U3[2] + t2 * _U3[3])))
    u4 = t2 * t2 * (_U4[0] + t2 * (_U4[1] + t2 * (_U4[2] + t2 * (_U4[3] + t2 * _U4[4]))))
    u5 = (
        t2
        * t2
        * t
        * (_U5[0] + t2 * (_U5[1] + t2 * (_U5[2] + t2 * (_U5[3] + t2 * (_U5[4] + t2 * _U5[5])))))
    )
    inv = 1.0 / nu
    return inv * (u1 + inv * (u2 + inv * (u3 + inv * (u4 + inv * u5))))


def _make_debye_d(correction):
    """Build D(nu, x) = log I_nu(x) - nu log x by the Debye expansion (nu > 0, x >= 0).

    log I_nu(x) ~ s + nu log(x / (nu + s)) - log(2 pi s)/2 + log(1 + sum_k u_k(nu/s)/nu^k),
    s = sqrt(nu^2 + x^2); the nu log x term is removed analytically. ``correction`` is the
    plain or the compiled Debye polynomial sum (a factory so both share one formula).
    """

    def debye_d(nu, x):
        s = np.sqrt(nu * nu + x * x)
        return (
            s
            - nu * np.log(nu + s)
            - 0.5 * (_LOG_2PI + np.log(s))
            + np.log1p(correction(nu, nu / s))
        )

    return debye_d


def _make_debye_log_ratio(correction):
    """Build log(I_{nu+1}(x) / I_nu(x)) by the Debye expansion (nu >= 50, x > 0).

    Written as a difference of the two expansions with the large terms cancelled analytically,
    so the ratio keeps full relative accuracy even when it is close to one (x >> nu).
    """

    def debye_log_ratio(nu, x):
        s0 = np.sqrt(nu * nu + x * x)
        s1 = np.sqrt((nu + 1.0) * (nu + 1.0) + x * x)
        ds = (2.0 * nu + 1.0) / (s1 + s0)  # s1 - s0 without cancellation
        return (
            ds
            + np.log(x / (nu + 1.0 + s1))
            - nu * np.log1p((1.0 + ds) / (nu + s0))
            - 0.5 * np.log1p(ds / s0)
            + np.log1p(correction(nu + 1.0, (nu + 1.0) / s1))
            - np.log1p(correction(nu, nu / s0))
        )

    return debye_log_ratio


_debye_d_py = _make_debye_d(_debye_correction_py)
_debye_log_ratio_py = _make_debye_log_ratio(_debye_correction_py)

# ----------------------------------------------------------------------------------------------
# Scalar numba kernels
# ----------------------------------------------------------------------------------------------

_debye_correction_nb = njit(cache=True, nogil=True)(_debye_correction_py)
_debye_d_nb = njit(cache=True, nogil=True)(_make_debye_d(_debye_correction_nb))
_debye_log_ratio_nb = njit(cache=True, nogil=True)(_make_debye_log_ratio(_debye_correction_nb))


@njit(cache=True, nogil=True)
def _series_log1p_nb(nu, x):
    """log(Gamma(nu+1) (2/x)^nu I_nu(x)) = log(sum_k (x^2/4)^k / (k! (nu+1)_k)) by summation."""
    q = 0.25 * x * x
    term = 1.0
    acc = 0.0
    for k in range(1, 80):
        term *= q / (k * (nu + k))
        acc += term
        if term < 1e-17 * (1.0 + acc):
            break
    return math.log1p(acc)


@njit(cache=True, nogil=True)
def _ratio_start_order_nb(nu):
    """Smallest order nu + m (m integer) with nu + m >= _DEBYE_MIN_ORDER."""
    m = math.ceil(_DEBYE_MIN_ORDER - nu)
    if m < 0:
        m = 0
    return m


@njit(cache=True, nogil=True)
def _d_nb(nu, x):
    """D(nu, x) = log I_nu(x) - nu log x for nu >= 0, x >= 0 (finite at x = 0)."""
    if 0.25 * x * x <= nu + 1.0:
        return _series_log1p_nb(nu, x) - nu * _LOG_2 - math.lgamma(nu + 1.0)
    if nu >= _DEBYE_MIN_ORDER:
        return _debye_d_nb(nu, x)
    # Small order, x > 2 sqrt(nu + 1): start at order N = nu + m >= 50 and walk the ratio
    # R_mu = I_{mu+1}/I_mu down with R_mu = x / (2(mu+1) + x R_{mu+1}) (stable backward).
    # D(nu) = D(N) + sum_{mu=nu}^{N-1} log(2(mu+1) + x R_{mu+1}).
    m = _ratio_start_order_nb(nu)
    top = nu + m
    ratio = math.exp(_debye_log_ratio_nb(top, x))  # R_N
    acc = 0.0
    prod = 1.0  # product of the den factors, flushed into acc before it can overflow
    for j in range(m - 1, -1, -1):
        mu = nu + j
        den = 2.0 * (mu + 1.0) + x * ratio
        prod *= den
        if prod > 1e250:
            acc += math.log(prod)
            prod = 1.0
        ratio = x / den
    return _debye_d_nb(top, x) + acc + math.log(prod)


@njit(cache=True, nogil=True)
def log_bessel_iv_nb(nu: float, x: float) -> float:
    """log I_nu(x) for nu >= 0 and x >= 0 (scalar numba kernel; -inf at x = 0 < nu)."""
    if x == 0.0:
        return 0.0 if nu == 0.0 else -np.inf
    return _d_nb(nu, x) + nu * math.log(x)


@njit(cache=True, nogil=True)
def log_normalizer_nb(p: float, kappa: float) -> float:
    """log C_p(kappa) of the vMF density on S^{p-1} (scalar numba kernel, p >= 2, kappa >= 0)."""
    nu = 0.5 * p - 1.0
    return -(nu + 1.0) * _LOG_2PI - _d_nb(nu, kappa)


@njit(cache=True, nogil=True)
def mean_resultant_length_nb(p: float, kappa: float) -> float:
    """A_p(kappa) = I_{p/2}(kappa) / I_{p/2-1}(kappa) (scalar numba kernel)."""
    nu = 0.5 * p - 1.0
    if kappa == 0.0:
        return 0.0
    if 0.25 * kappa * kappa <= nu + 1.0:
        return (
            kappa
            / (2.0 * (nu + 1.0))
            * math.exp(_series_log1p_nb(nu + 1.0, kappa) - _series_log1p_nb(nu, kappa))
        )
    if nu >= _DEBYE_MIN_ORDER:
        return math.exp(_debye_log_ratio_nb(nu, kappa))
    m = _ratio_start_order_nb(nu)
    ratio = math.exp(_debye_log_ratio_nb(nu + m, kappa))
    for j in range(m - 1, -1, -1):
        ratio = kappa / (2.0 * (nu + j + 1.0) + kappa * ratio)
    return ratio


@njit(cache=True, nogil=True)
def log_new_node_marginal_nb(t: float, p: float, beta: float, kappa: float) -> float:
    """Scalar numba twin of :func:`log_new_node_marginal`."""
    if t > 1.0:
        t = 1.0
    elif t < -1.0:
        t = -1.0
    rho = math.sqrt((beta - kappa) ** 2 + 2.0 * beta * kappa * (1.0 + t))
    return log_normalizer_nb(p, beta) + log_normalizer_nb(p, kappa) - log_normalizer_nb(p, rho)


# ----------------------------------------------------------------------------------------------
# Vectorised NumPy functions
# ----------------------------------------------------------------------------------------------


def _series_log1p(nu: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Vectorised log(Gamma(nu+1)(2/x)^nu I_nu(x)); accurate where x^2/4 <= nu + 1."""
    q = 0.25 * x * x
    term = np.ones_like(q)
    acc = np.zeros_like(q)
    for k in range(1, _SERIES_TERMS + 1):
        term = term * q / (k * (nu + k))
        acc += term
    return np.log1p(acc)


def _d(nu: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Vectorised D(nu, x) = log I_nu(x) - nu log x; nu, x broadcastable, float arrays."""
    nu, x = np.broadcast_arrays(np.asarray(nu, dtype=float), np.asarray(x, dtype=float))
    out = np.full(x.shape, np.nan)
    series = 0.25 * x * x <= nu + 1.0
    finite = np.isfinite(x)
    debye = ~series & (nu >= _DEBYE_MIN_ORDER) & finite
    small = ~series & ~debye & finite
    if series.any():
        n_, x_ = nu[series], x[series]
        out[series] = _series_log1p(n_, x_) - n_ * _LOG_2 - gammaln(n_ + 1.0)
    if debye.any():
        out[debye] = _debye_d_py(nu[debye], x[debye])
    if small.any():
        # ive does not underflow here: x > 2 sqrt(nu + 1) and nu < 50.
        n_, x_ = nu[small], x[small]
        out[small] = np.log(ive(n_, x_)) + x_ - n_ * np.log(x_)
    out[np.isposinf(x)] = np.inf  # I_nu grows like e^x: log C_p(inf) = -inf
    return out


def reads_document_weights(value: bool | str) -> bool:
    """Whether a ``document_weights`` setting reads row norms as document weights: ``"auto"``
    (the estimator's default) and ``True`` do."""
    return value == "auto" if isinstance(value, str) else bool(value)


def _as_float_array(name: str, value: ArrayLike) -> np.ndarray:
    arr = np.asarray(value, dtype=float)
    if np.any(arr < 0):
        raise ValueError(f"{name} must be non-negative")
    return arr


def _check_dim(p) -> float:
    if not np.isscalar(p) or not np.isfinite(p) or p < 2:
        raise ValueError(f"dimension p must be a finite scalar >= 2, got {p!r}")
    return float(p)


def _scalar_or_array(out: np.ndarray, scalar_input: bool):
    return float(out) if scalar_input else out


def log_bessel_iv(nu: ArrayLike, x: ArrayLike) -> np.ndarray | float:
    """Logarithm of the modified Bessel function of the first kind, ``log I_nu(x)``.

    Parameters
    ----------
    nu : array_like
        Order(s), ``nu >= 0``.
    x : array_like
        Argument(s), ``x >= 0``; broadcast against ``nu``.

    Returns
    -------
    ndarray or float
        ``log I_nu(x)``; ``-inf`` at ``x = 0`` for ``nu > 0`` and ``0`` at ``x = nu = 0``. A float
        when both inputs are scalars.
    """
    nu_a = _as_float_array("nu", nu)
    x_a = _as_float_array("x", x)
    nu_b, x_b = np.broadcast_arrays(nu_a, x_a)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = _d(nu_b, x_b) + np.where(nu_b == 0.0, 0.0, nu_b * np.log(x_b))
    return _scalar_or_array(out, nu_a.ndim == 0 and x_a.ndim == 0)


def log_normalizer(p: int, kappa: ArrayLike) -> np.ndarray | float:
    """Log normaliser ``log C_p(kappa)`` of the vMF density on the unit sphere in ``R^p``.

    ``f(x) = C_p(kappa) exp(kappa mu.x)`` with
    ``C_p(kappa) = kappa^{p/2-1} / ((2 pi)^{p/2} I_{p/2-1}(kappa))``.

    Parameters
    ----------
    p : int
        Ambient dimension, ``p >= 2``.
    kappa : array_like
        Concentration(s), ``kappa >= 0``. ``kappa = 0`` gives the uniform density,
        ``log(1/area(S^{p-1})) = lgamma(p/2) - log 2 - (p/2) log pi``.

    Returns
    -------
    ndarray or float
        Same shape as ``kappa`` (a float for scalar input). Absolute error below 1e-9 for
        ``2 <= p <= 1e5`` and ``0 <= kappa <= 1e6``.
    """
    nu = _check_dim(p) / 2.0 - 1.0
    k = _as_float_array("kappa", kappa)
    out = -(nu + 1.0) * _LOG_2PI - _d(nu, k)
    return _scalar_or_array(out, k.ndim == 0)


def mean_resultant_length(p: int, kappa: ArrayLike) -> np.ndarray | float:
    """Mean resultant length ``A_p(kappa) = I_{p/2}(kappa) / I_{p/2-1}(kappa) = E[mu.x]``.

    Increases from 0 (``A ~ kappa/p`` as ``kappa -> 0``) to 1 as ``kappa -> inf``. Computed
    without forming either Bessel function, so it is accurate in any dimension.

    Parameters
    ----------
    p : int
        Ambient dimension, ``p >= 2``.
    kappa : array_like
        Concentration(s), ``kappa >= 0``.

    Returns
    -------
    ndarray or float
        Same shape as ``kappa`` (a float for scalar input).
    """
    nu = _check_dim(p) / 2.0 - 1.0
    k_in = _as_float_array("kappa", kappa)
    k = np.atleast_1d(k_in)
    out = np.full(k.shape, np.nan)
    series = 0.25 * k * k <= nu + 1.0
    debye = ~series & (nu >= _DEBYE_MIN_ORDER)
    small = ~series & ~debye & np.isfinite(k)
    if series.any():
        x = k[series]
        out[series] = (
            x / (2.0 * (nu + 1.0)) * np.exp(_series_log1p(nu + 1.0, x) - _series_log1p(nu, x))
        )
    if debye.any():
        out[debye] = np.exp(_debye_log_ratio_py(nu, k[debye]))
    if small.any():
        x = k[small]
        out[small] = ive(nu + 1.0, x) / ive(nu, x)
    out[np.isposinf(k)] = 1.0
    return _scalar_or_array(out.reshape(k_in.shape), k_in.ndim == 0)


def estimate_concentration(
    resultant_norm: ArrayLike,
    n: ArrayLike,
    p: int,
    *,
    min_count: int = 2,
    fallback: ArrayLike = np.nan,
    kappa_min: float = 1e-3,
    kappa_max: float = 1e6,
    newton_steps: int = 3,
) -> np.ndarray:
    """Per-cluster vMF concentration estimates from resultant lengths and counts.

    For a cluster with ``n`` unit vectors summing to ``S``:

    1. ``rbar^2 = (||S||^2 - n) / (n (n - 1))`` when ``n >= 2``. This is unbiased for ``A_p^2``
       (the plain ``(||S||/n)^2`` has bias ``(1 - A^2)/n``, which dominates in high dimension
       where ``A`` is small). When ``n == 1`` (only reachable with ``min_count <= 1``) the plain
       ``rbar = ||S|| / n`` is used. ``rbar^2`` is clipped to ``[0, 1 - 1e-12]``.
    2. Banerjee et al. (2005) start ``kappa = rbar (p - rbar^2) / (1 - rbar^2)``.
    3. ``newton_steps`` Newton steps on ``A_p(kappa) = rbar`` (``A_p`` is increasing and concave,
       so the steps approach the root from below after at most one step), each clipped.

    Parameters
    ----------
    resultant_norm : array_like
        ``||sum of the cluster's unit vectors||``, shape ``(K,)`` (or any shape).
    n : array_like
        Cluster sizes, broadcastable to ``resultant_norm``.
    p : int
        Dimension, ``p >= 2``.
    min_count : int, default=2
        Clusters with ``n < max(min_count, 1)`` get ``fallback``.
    fallback : float or array_like, default=nan
        Value(s) for those clusters (e.g. the parent's or a global estimate); broadcastable to
        the output shape. Returned as given, *not* clipped.
    kappa_min, kappa_max : float
        Every estimated (non-fallback) entry is clipped to ``[kappa_min, kappa_max]``; a cluster
        whose bias-corrected ``rbar`` is zero or negative gets ``kappa_min``, a cluster of
        identical vectors gets ``kappa_max``.
    newton_steps : int, default=3
        Number of Newton polishing steps (0 returns the clipped Banerjee approximation).

    Returns
    -------
    ndarray
        Float array of the broadcast shape of ``resultant_norm`` and ``n``.
    """
    p_f = _check_dim(p)
    if not 0.0 < kappa_min <= kappa_max:
        raise ValueError("need 0 < kappa_min <= kappa_max")
    if newton_steps < 0:
        raise ValueError("newton_steps must be >= 0")
    r_norm, counts = np.broadcast_arrays(
        np.asarray(resultant_norm, dtype=float), np.asarray(n, dtype=float)
    )
    out = np.array(np.broadcast_to(np.asarray(fallback, dtype=float), r_norm.shape), dtype=float)
    ok = counts >= max(min_count, 1)
    if not ok.any():
        return out
    r_ok, n_ok = r_norm[ok], counts[ok]
    with np.errstate(divide="ignore", invalid="ignore"):
        rbar2 = np.where(
            n_ok >= 2.0,
            (r_ok * r_ok - n_ok) / (n_ok * np.maximum(n_ok - 1.0, 1.0)),
            (r_ok / n_ok) ** 2,
        )
    rbar2 = np.clip(rbar2, 0.0, 1.0 - 1e-12)
    rbar = np.sqrt(rbar2)
    kappa = np.clip(rbar * (p_f - rbar2) / (1.0 - rbar2), kappa_min, kappa_max)
    for _ in range(newton_steps):
        a = mean_resultant_length(p_f, kappa)
        # A'(kappa) = 1 - A^2 - (p - 1) A / kappa (the variance of mu.x), positive.
        slope = 1.0 - a * a - (p_f - 1.0) * a / kappa
        good = slope > 0.0
        step = np.where(good, (a - rbar) / np.where(good, slope, 1.0), 0.0)
        kappa = np.clip(kappa - step, kappa_min, kappa_max)
    out[ok] = kappa
    return out


def _sample_vmf_cosines(
    kappa: float, p: int, size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Wood (1994) rejection sampler for w = mu.x; returns (w, 1 - w^2) computed stably."""
    m1 = float(p - 1)
    b = m1 / (2.0 * kappa + math.sqrt(4.0 * kappa * kappa + m1 * m1))
    one_m_x0 = 2.0 * b / (1.0 + b)  # 1 - x0, with x0 = (1 - b)/(1 + b)
    x0 = 1.0 - one_m_x0
    log_one_m_x0sq = math.log(4.0 * b) - 2.0 * math.log1p(b)  # log(1 - x0^2)
    w = np.empty(size)
    omw2 = np.empty(size)
    filled = 0
    while filled < size:
        need = size - filled
        z = rng.beta(m1 / 2.0, m1 / 2.0, size=need)
        den = 1.0 - (1.0 - b) * z
        one_m_w = 2.0 * b * z / den
        one_p_w = 2.0 * (1.0 - z) / den
        # Acceptance kappa (w - x0) + m1 (log(1 - x0 w) - log(1 - x0^2)) >= log U, in forms
        # that avoid cancellation when both w and x0 are close to 1 (large kappa).
        log_acc = kappa * (one_m_x0 - one_m_w) + m1 * (
            np.log(one_m_x0 + x0 * one_m_w) - log_one_m_x0sq
        )
        accept = log_acc >= np.log(rng.random(need))
        k = int(accept.sum())
        w[filled : filled + k] = 1.0 - one_m_w[accept]
        omw2[filled : filled + k] = one_m_w[accept] * one_p_w[accept]
        filled += k
    return w, omw2


def sample_vmf(mu: ArrayLike, kappa: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """Draw from vMF(mu, kappa) on S^{p-1} with Wood's (1994) algorithm.

    Memory is O(size * p) (the output plus one work array); no p x p matrix is formed, so this
    works at p = 100,000.

    Parameters
    ----------
    mu : array_like, shape (p,)
        Mean direction (normalised internally; must be non-zero).
    kappa : float
        Concentration, ``0 <= kappa < inf`` (0 is the uniform distribution).
    size : int
        Number of draws.
    rng : numpy.random.Generator

    Returns
    -------
    ndarray, shape (size, p)
        Unit-norm rows.
    """
    mu = np.asarray(mu, dtype=float)
    if mu.ndim != 1 or mu.size < 2:
        raise ValueError("mu must be a 1-D array with at least 2 entries")
    norm = np.linalg.norm(mu)
    if not np.isfinite(norm) or norm == 0.0:
        raise ValueError("mu must be finite and non-zero")
    mu = mu / norm
    kappa = float(kappa)
    if not (np.isfinite(kappa) and kappa >= 0.0):
        raise ValueError("kappa must be finite and non-negative")
    size = int(size)
    if size < 0:
        raise ValueError("size must be non-negative")
    p = mu.size
    w, omw2 = _sample_vmf_cosines(kappa, p, size, rng)
    # Uniform direction in the tangent space of mu: project a Gaussian, normalise.
    out = rng.standard_normal((size, p))
    out -= np.outer(out @ mu, mu)
    tnorm = np.linalg.norm(out, axis=1)
    bad = tnorm == 0.0  # probability zero; redraw rather than divide by zero
    while bad.any():
        g = rng.standard_normal((int(bad.sum()), p))
        g -= np.outer(g @ mu, mu)
        out[bad] = g
        tnorm[bad] = np.linalg.norm(g, axis=1)
        bad = tnorm == 0.0
    out *= (np.sqrt(omw2) / tnorm)[:, None]
    out += w[:, None] * mu[None, :]
    # One cheap renormalisation removes the rounding left by the projection (visible at p = 2).
    out /= np.linalg.norm(out, axis=1)[:, None]
    return out


def log_new_node_marginal(
    t: ArrayLike, p: int, beta: ArrayLike, kappa: ArrayLike
) -> np.ndarray | float:
    """Log marginal density of a document under a brand-new node, with its direction integrated out.

    With theta ~ vMF(mu, kappa) and x | theta ~ vMF(theta, beta),

        log m(x) = log C_p(beta) + log C_p(kappa) - log C_p(||beta x + kappa mu||),
        ||beta x + kappa mu|| = sqrt(beta^2 + kappa^2 + 2 beta kappa t),   t = mu.x.

    ``kappa = 0`` (or ``beta = 0``) gives ``log C_p(0)``, the uniform density.

    Parameters
    ----------
    t : array_like
        Cosines ``mu.x`` (clipped to [-1, 1]).
    p : int
        Dimension.
    beta, kappa : array_like
        Document and prior concentrations, broadcast against ``t``.

    Returns
    -------
    ndarray or float
        Broadcast shape of the inputs (a float if all are scalars).
    """
    t_a = np.clip(np.asarray(t, dtype=float), -1.0, 1.0)
    b_a = _as_float_array("beta", beta)
    k_a = _as_float_array("kappa", kappa)
    # Normalisers of beta and kappa on their own (small) shapes, then broadcast.
    lc_b = log_normalizer(p, b_a)
    lc_k = log_normalizer(p, k_a)
    # (beta - kappa)^2 + 2 beta kappa (1 + t) avoids cancellation at t = -1, beta = kappa.
    rho = np.sqrt((b_a - k_a) ** 2 + 2.0 * b_a * k_a * (1.0 + t_a))
    out = np.asarray(lc_b) + np.asarray(lc_k) - np.asarray(log_normalizer(p, rho))
    if t_a.ndim == 0 and b_a.ndim == 0 and k_a.ndim == 0:
        return float(out)
    return out


# ----------------------------------------------------------------------------------------------
# Collapsed marginals and the z-kernel's new-node table
# ----------------------------------------------------------------------------------------------


def group_log_marginal(n: float, s: np.ndarray, mu: np.ndarray, kappa: float, beta: float, p: int,
                       sq_norms: np.ndarray | None = None) -> float:
    """log of the integral of prod_i C_p(beta w_i) exp(beta theta.x_i) against vMF(theta; mu, kappa).

    ``n`` documents with sum ``s`` share one direction ``theta`` drawn around ``mu``:
    ``sum_i log C_p(beta w_i) + log C_p(kappa) - log C_p(||beta s + kappa mu||)``, with
    ``w_i`` the documents' weights (their norms, :func:`set_log_normalizer`; unit documents
    when ``sq_norms`` is None).
    """
    pf = float(p)  # scalar numba kernels: these run once per node per sweep (merge moves)
    rho = _combination_norm(float(beta), np.ascontiguousarray(s, dtype=np.float64), float(kappa),
                            np.ascontiguousarray(mu, dtype=np.float64))
    return float(set_log_normalizer(p, n, float(beta), sq_norms) + log_normalizer_nb(pf, float(kappa))
                 - log_normalizer_nb(pf, rho))


@njit(cache=True, nogil=True)
def _log_normalizers_nb(p: float, kappa: np.ndarray, out: np.ndarray, start: int, stop: int) -> None:
    """``out[i] = log C_p(kappa[i])`` for ``start <= i < stop`` (:func:`log_normalizer_nb` per
    entry: the weighted documents' normalisers, thousands per set or block, without NumPy's
    per-call temporaries over the regimes of :func:`_d`)."""
    for i in range(start, stop):
        out[i] = log_normalizer_nb(p, kappa[i])


def log_normalizers(p: int, kappa: np.ndarray) -> np.ndarray:
    """``log C_p`` of every entry of ``kappa`` (any shape, entries ``>= 0`` and finite), in
    compiled code on the fitting threads: :func:`log_normalizer` for the weighted documents'
    many normalisers. It agrees with the vectorised function to the last bits (at most 1e-15
    relative) from ``p = 100`` on, and to about 1e-10 where their algorithms differ (orders
    below 50, where the vectorised one takes SciPy's ``ive``)."""
    pf = _check_dim(p)
    k = np.ascontiguousarray(kappa, dtype=np.float64)
    flat = k.reshape(-1)
    if flat.size and not (flat.min() >= 0.0 and np.isfinite(flat.max())):  # NaN fails the first test
        raise ValueError("concentrations must be finite and non-negative")
    out = np.empty(flat.size)

    if flat.size < _THREADED_NORMALIZERS:  # a set's few rows: handing them to threads costs more
        _log_normalizers_nb(pf, flat, out, 0, flat.size)
        return out.reshape(k.shape)

    def run(start: int, stop: int) -> float:
        _log_normalizers_nb(pf, flat, out, start, stop)
        return 0.0

    in_row_ranges(flat.size, run)
    return out.reshape(k.shape)


def log_normalizer_table(p: int, conc, sq_norms: np.ndarray) -> np.ndarray:
    """``log C_p(conc_k w_i)``, shape (rows, concentrations), for rows of squared norm ``w_i^2``:
    one evaluation per distinct weight and concentration."""
    w, inv = np.unique(np.sqrt(np.asarray(sq_norms, dtype=np.float64)), return_inverse=True)
    conc = np.atleast_1d(np.asarray(conc, dtype=np.float64))
    return log_normalizers(p, np.outer(w, conc))[inv.reshape(-1)]


def normalizer_change(p: int, conc, weights: np.ndarray) -> np.ndarray:
    """``log C_p(conc_k w_g) - log C_p(conc_k)`` per weight g and concentration k: what a row of
    weight ``w_g`` changes in a unit row's log density."""
    conc = np.atleast_1d(np.asarray(conc, dtype=np.float64))
    scaled = np.outer(np.asarray(weights, dtype=np.float64), conc)
    return log_normalizers(p, scaled) - log_normalizers(p, conc)[None, :]


def weighted_normalizer_change(p: int, conc, sq_norms: np.ndarray) -> np.ndarray:
    """:func:`normalizer_change` per row i of squared norm ``w_i^2``: one evaluation per distinct
    weight and concentration."""
    w, inv = np.unique(np.sqrt(np.asarray(sq_norms, dtype=np.float64)), return_inverse=True)
    return normalizer_change(p, conc, w)[inv.reshape(-1)]


@njit(cache=True, nogil=True, error_model="numpy")
def sample_weighted_rows(indptr, indices, data, start, stop, coef_T, weight, weight_at, live_a, live_b,
                         live_change, ph_parent, ph_a, ph_b, ph_c, ph_change, p, u, labels, lognorm, sample,
                         own, adj):
    """The z-kernel for CSR rows ``start..stop`` of weights ``weight`` (row norms; rows are a
    unit direction ``x`` times ``w``), the product fused with the draw as for unit rows.

    Live column ``k``: ``live_a[k] + live_change[g, k] + beta_k theta_k . (w x)``, ``g`` the
    row's weight index ``weight_at[i]`` and ``live_change`` the normalisers' change at that
    weight (:func:`normalizer_change` per distinct weight; zeros for unnormalised
    columns). Placeholder ``j`` below live column ``ph_parent[j]`` of direction ``mu``: the
    collapsed marginal of a document of concentration ``b_j w``, ``ph_a[j] + ph_change[g, j] -
    log C_p(||b_j w x + c_j mu||)``, the norm taken without cancellation at cosine -1 (as in
    :func:`log_new_node_marginal`). Each row's result depends on that row and its uniform only."""
    K = coef_T.shape[1]
    P = ph_a.shape[0]
    scores = np.empty(K)
    a_row = np.empty(K)
    no_c = np.zeros(K)
    ph_score = np.empty(P)
    w = np.empty(K + P)
    at = np.empty(K + P, dtype=np.int64)
    no_table = np.zeros((0, 2, 2))
    for i in range(start, stop):
        _csr_row_scores(indptr, indices, data, i, coef_T, scores)
        g = weight_at[i]
        wi = weight[i]
        for k in range(K):
            a_row[k] = live_a[k] + live_change[g, k]
        for j in range(P):
            # the parent's cosine with the row's direction (0 for an all-zero row, which has none)
            t = min(max(scores[ph_parent[j]] / wi, -1.0), 1.0) if wi > 0.0 else 0.0
            bw = wi * ph_b[j]
            rho = math.sqrt((bw - ph_c[j]) ** 2 + 2.0 * bw * ph_c[j] * (1.0 + t))
            ph_score[j] = ph_change[g, j] - log_normalizer_nb(p, rho)
        _weights_and_draw(i, scores, 0.0, a_row, live_b, no_c, ph_parent, ph_a, ph_b, ph_c, no_table, ph_score,
                          2, u, labels, lognorm, sample, w, at, own[i], adj[i])


def set_log_normalizer(p: int, n: float, beta: float, sq_norms: np.ndarray | None) -> float:
    """``sum_i log C_p(beta w_i)`` over ``n`` documents whose squared norms are ``sq_norms``:
    ``n log C_p(beta)`` for unit documents (``None``, or every norm 1)."""
    if n <= 0 or row_weights_are_unit(sq_norms):
        return float(n * log_normalizer_nb(float(p), float(beta)))
    if len(sq_norms) != n:
        raise ValueError(f"a set of {n:g} documents with {len(sq_norms)} squared norms")
    # one evaluation per row (a set's rows are few next to a sort for their distinct weights)
    return float(np.sum(log_normalizers(p, np.sqrt(np.asarray(sq_norms, dtype=np.float64)) * float(beta))))


@njit(cache=True, nogil=True)
def _combination_norm(beta, s, kappa, mu):
    """||beta s + kappa mu|| in one pass (no temporaries; the split-merge moves call it per attempt)."""
    n = s.shape[0]
    a0 = a1 = a2 = a3 = 0.0  # four running sums: the additions do not wait on one another
    m = n - n % 4
    for i in range(0, m, 4):
        v0 = beta * s[i] + kappa * mu[i]
        v1 = beta * s[i + 1] + kappa * mu[i + 1]
        v2 = beta * s[i + 2] + kappa * mu[i + 2]
        v3 = beta * s[i + 3] + kappa * mu[i + 3]
        a0 += v0 * v0
        a1 += v1 * v1
        a2 += v2 * v2
        a3 += v3 * v3
    for i in range(m, n):
        v = beta * s[i] + kappa * mu[i]
        a0 += v * v
    return math.sqrt((a0 + a1) + (a2 + a3))


def group_log_likelihood(n: float, s: np.ndarray, theta: np.ndarray, beta: float, p: int,
                         sq_norms: np.ndarray | None = None) -> float:
    """sum_i log f(x_i | theta, beta w_i) from the group's count, sum and squared norms (None:
    unit documents)."""
    return float(set_log_normalizer(p, n, beta, sq_norms) + beta * theta @ s)


def _set_norms(docs: DocumentSet) -> np.ndarray | None:
    """The set's squared norms, None for unit documents (also a set built without its squared
    norms, ``sumsq`` left at 0: sets of unit rows were built so). A set whose ``sumsq`` shows
    weighted documents but that does not carry each row's squared norm is an error: its log
    normaliser would be wrong."""
    if docs.sq_norms is not None:
        return docs.sq_norms
    if docs.n <= 0 or docs.sumsq == 0.0 or abs(docs.sumsq - docs.n) <= WEIGHT_TOL * docs.n:
        return None
    raise ValueError("a set of weighted vMF documents (row norms other than 1) needs its rows' squared norms")


# Tables by (p, intervals, b, c): a node's concentration and its children's prior strength
# often stay the same across sweeps (nodes with few documents keep theirs, prior strengths
# depend on depth only), and a table costs ~2,000 Bessel-type evaluations to build.
_TABLE_CACHE: OrderedDict[tuple[float, int, float, float], np.ndarray] = OrderedDict()
_TABLE_CACHE_SIZE = 2048  # tables of 16 KiB each: at most 32 MiB
_TABLE_LOCK = threading.Lock()


def new_node_table(p: int, b: np.ndarray, c: np.ndarray, intervals: int = 1024,
                   knots: np.ndarray | None = None) -> np.ndarray:
    """Values and slopes of g(t) = -log C_p(sqrt(b^2 + c^2 + 2 b c t)) on a uniform grid of [-1, 1].

    Uses d log C_p(rho) / d rho = -A_p(rho) and d rho / d t = b c / rho. Shape
    ``(len(b), intervals + 1, 2)``. With ``knots`` (a boolean mask of that shape without its
    last axis) only those knots are guaranteed; the others may hold NaN. A z-sweep needs only
    the knots around its documents' scores, which for text lie in a small part of [-1, 1].
    Knots are computed once per distinct ``(p, b, c)`` and then served from a bounded cache; a
    knot has the same value whichever way it was obtained.
    """
    b = np.ascontiguousarray(b, dtype=np.float64).ravel()
    c = np.ascontiguousarray(c, dtype=np.float64).ravel()
    n_rows = b.shape[0]
    if knots is None:
        knots = np.ones((n_rows, intervals + 1), dtype=np.bool_)
    groups: dict[tuple[float, float], int] = {}
    inverse = np.array([groups.setdefault(key, len(groups)) for key in zip(b.tolist(), c.tolist())],
                       dtype=np.int64)
    n_unique = len(groups)
    if n_unique == n_rows:  # the usual case: no two rows share (b, c)
        need = np.ascontiguousarray(knots, dtype=np.bool_)
    else:
        need = np.zeros((n_unique, intervals + 1), dtype=np.bool_)
        np.logical_or.at(need, inverse, knots)
    any_knot = need.any(axis=1)
    lo = np.where(any_knot, need.argmax(axis=1), 0)
    hi = np.where(any_knot, intervals - need[:, ::-1].argmax(axis=1), -1)
    keys = [(float(p), int(intervals), bj, cj) for bj, cj in groups]
    rows = np.full((n_unique, intervals + 1, 2), np.nan)
    with _TABLE_LOCK:  # copy only the span of the knots asked for
        for u, key in enumerate(keys):
            cached = _TABLE_CACHE.get(key)
            if cached is not None:
                _TABLE_CACHE.move_to_end(key)
                rows[u, lo[u]:hi[u] + 1] = cached[lo[u]:hi[u] + 1]
    pairs = np.array(list(groups), dtype=np.float64).reshape(n_unique, 2)
    b_u, c_u = pairs[:, 0].copy(), pairs[:, 1].copy()
    added = np.zeros(n_unique, dtype=np.int64)
    in_row_ranges(n_unique, lambda a, z: _fill_knots(float(p), b_u, c_u, need, rows, added, a, z))
    with _TABLE_LOCK:  # the cache owns its rows: new knots are written into them
        for u in np.flatnonzero(added).tolist():
            cached = _TABLE_CACHE.get(keys[u])
            if cached is None:
                cached = _TABLE_CACHE[keys[u]] = np.full((intervals + 1, 2), np.nan)
            cached[lo[u]:hi[u] + 1] = rows[u, lo[u]:hi[u] + 1]
            _TABLE_CACHE.move_to_end(keys[u])
        while len(_TABLE_CACHE) > _TABLE_CACHE_SIZE:
            _TABLE_CACHE.popitem(last=False)
    return rows if n_unique == n_rows else rows[inverse]


@njit(cache=True, nogil=True)
def _table_knot(p, b, c, n, i, row):
    """Knot ``i`` of ``n`` intervals over [-1, 1]: ``row[i] = (g(t_i), g'(t_i))``."""
    bc = b * c
    d2 = (b - c) ** 2
    t = -1.0 + 2.0 * i / n
    r2 = d2 + 2.0 * bc * (1.0 + t)
    rho = math.sqrt(r2) if r2 > 0.0 else 0.0
    row[i, 0] = -log_normalizer_nb(p, rho)
    # g'(t) = A_p(rho) b c / rho, whose limit at rho = 0 (b = c, t = -1) is b c / p (A_p(rho) ~ rho / p)
    row[i, 1] = mean_resultant_length_nb(p, rho) * bc / rho if rho > 0.0 else bc / p


@njit(cache=True, nogil=True)
def _fill_knots(p, b, c, need, out, added, start, stop):
    """Knots ``need[j]`` of rows ``j`` in ``start..stop`` that are not there yet (NaN slope);
    ``added[j]`` counts them (rows split between the fitting threads)."""
    n = out.shape[1] - 1
    for j in range(start, stop):
        for i in range(n + 1):
            if need[j, i] and math.isnan(out[j, i, 1]):
                _table_knot(p, b[j], c[j], n, i, out[j])
                added[j] += 1
    return 0.0


# ----------------------------------------------------------------------------------------------
# Concentration under a Gamma prior
# ----------------------------------------------------------------------------------------------

def pair_cosine(counts: np.ndarray, sums: np.ndarray, sumsq: np.ndarray | None = None
                ) -> tuple[np.ndarray, float | None]:
    """Mean cosine between two distinct documents of a node: per node and pooled.

    For ``n`` unit documents with sum ``s``, ``||s||^2 = n + sum_{i != j} x_i.x_j``, so
    ``(||s||^2 - n) / (n (n - 1))`` is the mean cosine over the node's pairs, an unbiased
    estimate of ``A_p(beta)^2`` under ``vMF(theta, beta)`` whatever ``theta`` is. Returns the
    per-node values clipped at 0 (0 for nodes with fewer than two documents) and the pooled
    value ``sum_e (||s_e||^2 - n_e) / (n_e - 1) / sum_e n_e`` over nodes with two documents or
    more (each node's pairs weighted by its documents), or None if there is no such node.

    Weighted documents (norms ``w_i``, squared norms summing to ``sumsq``): ``||s||^2 -
    sumsq = sum_{i != j} w_i w_j x_i.x_j``, averaged over the pairs in units of the node's
    mean squared weight ``sumsq / n``, and read as the mean cosine of documents of weight 1.
    That is a moment estimate, not an exact one: its expectation is
    ``sum_{i != j} w_i w_j A_p(beta w_i) A_p(beta w_j)`` over that denominator, which equals
    ``A_p(beta)^2`` only when ``A_p`` is linear over the weights' range. The concentration it
    gives errs either way with the regime and grows with the weights' spread (worked out for
    ``p = 2000``: weights of token counts 30-100 over 65 read 300 as 322 and 5,000 as 4,113;
    log-normal weights of sigma 0.7 read 300 as 427). Solving the expectation for ``beta``
    needs each node's weights, which its count, sum and ``sumsq`` do not give. Unit documents
    give the formula above, to the bit.
    """
    n = np.asarray(counts, dtype=np.float64)
    big = n >= 2
    per_node = np.zeros(n.shape[0])
    if not big.any():
        return per_node, None
    # squared norms of every row, then the rows wanted: indexing ``sums`` first would copy
    # K x p entries twice
    s2 = np.einsum("ij,ij->i", sums, sums)[big]
    excess = (s2 - n[big]) / (n[big] - 1.0)
    if sumsq is not None:
        q = np.asarray(sumsq, dtype=np.float64)[big]
        weighted = (q != 0.0) & (np.abs(q - n[big]) > WEIGHT_TOL * n[big])  # 0: not given (unit rows)
        if weighted.any():  # unit nodes keep the formula above, to the bit
            mean_sq = np.where(weighted, q / n[big], 1.0)
            excess = np.where(weighted, (s2 - q) / (n[big] - 1.0) / mean_sq, excess)
    per_node[big] = np.maximum(excess / n[big], 0.0)
    return per_node, float(np.sum(excess) / np.sum(n[big]))


#: documents' worth of information in the concentration prior (see :func:`concentration_prior`)
CONCENTRATION_PRIOR_DOCS = 10.0


def concentration_prior(p: int, beta_bar: float, n_docs: float = CONCENTRATION_PRIOR_DOCS) -> tuple[float, float]:
    """Gamma(shape, rate) prior on a node's concentration with mode ``beta_bar`` and the curvature
    of ``n_docs`` documents' log likelihood there.

    ``n`` documents at concentration ``beta`` have Fisher information ``n A_p'(beta)``; a Gamma
    log density has curvature ``(shape - 1) / beta^2`` at its mode, so
    ``shape = 1 + n_docs beta_bar^2 A_p'(beta_bar)`` and ``rate = (shape - 1) / beta_bar``.
    """
    a = float(mean_resultant_length(p, beta_bar))
    slope = max(1.0 - a * a - (p - 1.0) * a / beta_bar, 0.0)
    shape = 1.0 + n_docs * beta_bar * beta_bar * slope
    return shape, (shape - 1.0) / beta_bar


def log_concentration_posterior(beta: ArrayLike, n: float, t: float, p: int, shape: float, rate: float):
    """log p(beta | n documents with theta.s = t) up to a constant, under Gamma(shape, rate)."""
    beta = np.asarray(beta, dtype=np.float64)
    return n * np.asarray(log_normalizer(p, beta)) + beta * t + (shape - 1.0) * np.log(beta) - rate * beta


def concentration_posterior_mode(n: np.ndarray, t: np.ndarray, p: int, shape: float, rate: float,
                                 low: float, high: float, n_iter: int = 100) -> np.ndarray:
    """Posterior modes of concentrations for nodes with ``n`` documents and ``t = theta.s``.

    The log posterior is concave in ``beta`` (``log C_p`` is concave, ``(shape - 1) log beta``
    too when ``shape >= 1``), so the mode is the root of its derivative
    ``t - n A_p(beta) + (shape - 1) / beta - rate``, a decreasing function: bisection on
    ``log beta`` within ``[low, high]``, vectorised over nodes.
    """
    n = np.asarray(n, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)
    out = _concentration_mode_nb(n.ravel(), t.ravel(), float(_check_dim(p)), float(shape), float(rate),
                                 float(np.log(low)), float(np.log(high)), int(n_iter))
    return out.reshape(n.shape)


@njit(cache=True, nogil=True)
def _concentration_mode_nb(n, t, p, shape, rate, log_low, log_high, n_iter):
    """The bisection of :func:`concentration_posterior_mode`, one node at a time."""
    out = np.empty(n.shape[0])
    for i in range(n.shape[0]):
        lo, hi = log_low, log_high
        for _ in range(n_iter):
            mid = 0.5 * (lo + hi)
            b = math.exp(mid)
            if t[i] - n[i] * mean_resultant_length_nb(p, b) + (shape - 1.0) / b - rate > 0:
                lo = mid
            else:
                hi = mid
        out[i] = math.exp(0.5 * (lo + hi))
    return out


# ----------------------------------------------------------------------------------------------
# The family object
# ----------------------------------------------------------------------------------------------


def _draw_natural(eta: np.ndarray, theta_parent: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A draw from the density proportional to ``exp(eta . theta)`` on the sphere: vMF of mean
    ``eta / |eta|`` and concentration ``|eta|`` (uniform when ``eta`` is zero)."""
    nrm = float(np.linalg.norm(eta))
    if nrm == 0:
        return sample_vmf(theta_parent, 0.0, 1, rng)[0]
    return sample_vmf(eta / nrm, nrm, 1, rng)[0]


@njit(cache=True, nogil=True, error_model="numpy")
def _direction_row_odds(ptr, col, val, launch, theta_at, theta_off, x_theta, c, beta, s1, s2, out):
    """A launch scan over :func:`~streamtree.likelihoods.base.compact_rows` of ``[first, second,
    *others]`` into ``out``: each of the others' ``beta x . (mu_1 - mu_2)``, ``mu_k`` the mode
    ``eta_k / |eta_k|``, ``eta_k = c theta + beta s_k``, of a new child of the node at
    ``theta`` with the group's sum ``s_k`` (child 1: ``first`` and the others where ``launch``
    holds; child 2: ``second`` and the rest), or ``theta`` itself where ``eta_k`` is zero.

    Only the held terms are visited: ``x . mu_k = (c x . theta + beta x . s_k) / |eta_k|``, and
    ``|eta_k|^2`` is ``c^2`` times ``theta_off`` (the squared norm of ``theta`` at the terms
    not held, where ``s_k`` is zero) plus the held terms' ``(c theta_w + beta s_kw)^2``, each
    entry formed as the dense mode forms it (so a group pointing away from ``theta`` loses no
    more precision than there); ``theta_at`` is ``theta`` at the held terms and ``x_theta``
    each row's ``x . theta``."""
    s1[:] = 0.0
    s2[:] = 0.0
    for i in range(ptr.shape[0] - 1):
        to_first = i == 0 or (i >= 2 and launch[i - 2])
        for q in range(ptr[i], ptr[i + 1]):
            if to_first:
                s1[col[q]] += val[q]
            else:
                s2[col[q]] += val[q]
    q1 = c * c * theta_off
    q2 = q1
    for w in range(s1.shape[0]):
        e1 = c * theta_at[w] + beta * s1[w]
        e2 = c * theta_at[w] + beta * s2[w]
        q1 += e1 * e1
        q2 += e2 * e2
    n1 = math.sqrt(q1)
    n2 = math.sqrt(q2)
    for i in range(2, ptr.shape[0] - 1):
        d1 = 0.0
        d2 = 0.0
        for q in range(ptr[i], ptr[i + 1]):
            d1 += val[q] * s1[col[q]]
            d2 += val[q] * s2[col[q]]
        m1 = (c * x_theta[i] + beta * d1) / n1 if n1 > 0.0 else x_theta[i]
        m2 = (c * x_theta[i] + beta * d2) / n2 if n2 > 0.0 else x_theta[i]
        out[i - 2] = beta * (m1 - m2)


@njit(cache=True, nogil=True, error_model="numpy")
def direction_launch_scans(ptr, col, val, log_odds, uniforms, eps, theta_at, theta_off, x_theta, c, beta):
    """:meth:`LaunchScan.run` over :func:`~streamtree.likelihoods.base.compact_rows`: for each
    row of ``uniforms``, the launch where a uniform is below the row's clipped expit of the log
    odds, then :func:`_direction_row_odds` of that launch; a scan whose launch repeats the last
    one keeps its odds."""
    rows = log_odds.shape[0]
    m = theta_at.shape[0]
    s1 = np.empty(m)
    s2 = np.empty(m)
    launch = np.zeros(rows, dtype=np.bool_)
    lo = log_odds
    for s in range(uniforms.shape[0]):
        changed = s == 0
        for k in range(rows):
            side = uniforms[s, k] < clipped_expit(lo[k], eps)
            changed = changed or side != launch[k]
            launch[k] = side
        if changed:
            lo = np.empty(rows)
            _direction_row_odds(ptr, col, val, launch, theta_at, theta_off, x_theta, c, beta, s1, s2, lo)
    return lo


@njit(cache=True, nogil=True, error_model="numpy")
def _seed_dots(ptr, col, val, theta_at, theta_off):
    """Each of the others' (rows 2 on) ``x . v / |v|`` for ``v = x_0 / max(|x_0|, 1e-300) +
    theta`` (:meth:`VonMisesFisher.seed_child_theta` toward row 0), over the held terms:
    ``|v|^2`` is ``theta_off`` (``theta``'s squared norm at the terms not held) plus the held
    terms' ``v_w^2``."""
    m = theta_at.shape[0]
    first = np.zeros(m)
    for q in range(ptr[0], ptr[1]):
        first[col[q]] += val[q]
    ff = 0.0
    for w in range(m):
        ff += first[w] * first[w]
    inv = 1.0 / max(math.sqrt(ff), 1e-300)
    vv = theta_off
    for w in range(m):
        first[w] = first[w] * inv  # the unit first row
        v = first[w] + theta_at[w]
        vv += v * v
    nv = math.sqrt(vv)
    out = np.empty(ptr.shape[0] - 3)
    for i in range(2, ptr.shape[0] - 1):
        acc = 0.0
        for q in range(ptr[i], ptr[i + 1]):
            acc += val[q] * (first[col[q]] + theta_at[col[q]])
        out[i - 2] = acc / nv
    return out


@njit(cache=True, nogil=True)
def _off_terms_sq(theta, terms):
    """``theta``'s squared norm at the terms not in ``terms`` (distinct), summed term by term."""
    held = np.zeros(theta.shape[0], dtype=np.bool_)
    for w in terms:
        held[w] = True
    acc = 0.0
    for w in range(theta.shape[0]):
        if not held[w]:
            acc += theta[w] * theta[w]
    return acc


class _FixedDirection(FixedNode):
    """:class:`FixedNode` of a direction whose split proposals scan over the terms their rows hold."""

    __slots__ = ()

    def launch_scan(self, X, others, first, second, concentration, depth):
        if not (sp.issparse(X) and X.format == "csr"):
            return super().launch_scan(X, others, first, second, concentration, depth)
        return _DirectionsLaunchScan(self, X, others, first, second, concentration, depth)


class _DirectionsLaunchScan(LaunchScan):
    """:class:`LaunchScan` of vMF directions over the terms the proposal's rows hold: a mode's
    inner products with the rows and its norm need its group's sum only there (with the
    node's inner products, fixed for the proposal), so after one O(nnz) compaction a scan costs
    O(nnz) of the rows, not O(V) (the generic scan builds two dense sums and two dense modes
    per scan: at V = 20,000 and a few hundred rows, almost all of a proposal's time)."""

    def __init__(self, node, X, others, first, second, concentration, depth) -> None:
        super().__init__(node, X, others, first, second, concentration, depth)
        rows = np.concatenate([[first, second], self.others]).astype(np.int64)
        self._ptr, self._col, self._val, self._terms, _ = compact_rows(X.indptr, X.indices, X.data, rows, X.shape[1])
        theta = np.asarray(node.theta, dtype=np.float64)
        self._theta_at = theta[self._terms]
        self._theta_off = _off_terms_sq(theta, self._terms)
        self._x_theta = csr_rows_dot(self._ptr, self._col, self._val, np.arange(self._ptr.size - 1),
                                     self._theta_at)  # every row's x . theta, first and second too
        self._c = float(node.likelihood.new_node_prior(depth))

    def seed_scores(self, theta):
        theta = np.asarray(theta, dtype=np.float64)
        dots = _seed_dots(self._ptr, self._col, self._val, theta[self._terms], _off_terms_sq(theta, self._terms))
        return self.node.likelihood.block_normalizers(self.block, self.concentration) + self.concentration * dots

    def log_odds(self, launch):
        m = self._terms.size
        out = np.empty(self.others.size)
        _direction_row_odds(self._ptr, self._col, self._val, np.ascontiguousarray(launch, dtype=np.bool_),
                            self._theta_at, self._theta_off, self._x_theta, self._c, float(self.concentration),
                            np.empty(m), np.empty(m), out)
        return out

    def run(self, log_odds, uniforms, eps):
        return direction_launch_scans(self._ptr, self._col, self._val,
                                      np.ascontiguousarray(log_odds, dtype=np.float64), uniforms, float(eps),
                                      self._theta_at, self._theta_off, self._x_theta, self._c,
                                      float(self.concentration))


class VonMisesFisher(WordTopics, Likelihood):
    """vMF topics on row directions: ``x | node ~ vMF(theta, beta w)``, ``w`` the row's norm
    read as its document's weight (``document_weights``; 1 for unit rows).

    Node directions are linked to their parent by ``vMF(theta_parent, kappa0 kappa1^d)`` and to
    their own previous-epoch direction by ``vMF(theta_prev, kappa0 kappa1^(d + a))``; ``beta``
    (the concentration) is estimated per node from its documents' resultant length, clipped to
    ``concentration_bounds``, and nodes with fewer than ``min_node_docs`` documents keep theirs.
    """

    name = "vmf"
    text_norm = "l2"
    param_storage = "direction"
    params = ("kappa0", "kappa1", "a", "min_node_docs", "concentration_bounds", "document_weights")
    integrates_children = True  # a child's parent link is exp(c theta_child . theta): conjugate
    anchors_root = True  # the MAP step links the root to the epoch's mean direction at depth 0
    # a lump's direction, fitted to its documents, refuses nearly every split after about ten
    # sweeps (a new direction in thousands of dimensions costs hundreds of nats against it), so
    # the first tree is grown before then, with at least 250 attempts a sweep: the planted first
    # epochs' node counts rose from 0.66-0.70x the truth to 0.77-0.78x over three chains a
    # seed, ARI level (BENCHMARKS.md, "The vMF's first tree grown with at least five times the fewest attempts")
    growth_attempts = 5
    #: whether a row's norm is its document's weight (concentration ``beta w``); else rows are unit
    #: (the estimator's setting, ``"auto"`` or a bool, resolved to a bool at construction)
    document_weights: bool | str = "auto"

    def __init__(self, variant, n_features: int, **settings) -> None:
        super().__init__(variant, n_features, **settings)
        self.document_weights = reads_document_weights(self.document_weights)

    @property
    def sets_need_row_norms(self) -> bool:
        return self.document_weights

    @classmethod
    def check_input(cls, X, document_weights: bool | str = "auto", **settings):
        """Rows are unit vectors; with ``document_weights`` a row is a unit direction times its
        document's weight, the row's norm (concentration ``beta w`` at a node of concentration
        ``beta``; :class:`~streamtree.text.TextVectorizer` weighs documents by their length
        with ``length_power``). Weights whose median is far from 1 are warned about: they are
        more likely unnormalised rows than weights."""
        X = finite_csr(X)
        weighted = reads_document_weights(document_weights)
        if X.shape[0]:
            norms = np.sqrt(row_sq_norms(X))
            bad = np.flatnonzero((norms == 0) if weighted else (np.abs(norms - 1.0) > UNIT_NORM_TOL))
            if bad.size:
                empty = bad[norms[bad] == 0]
                if weighted:
                    raise ValueError(f"document_weights={document_weights!r} reads each row's norm as its "
                                     f"document's weight, which must be positive; {bad.size} rows are all zeros "
                                     f"(first: row {bad[0]}): drop empty documents first")
                hint = (f"{empty.size} rows are all zeros (e.g. row {empty[0]}): drop empty documents first"
                        if empty.size else "normalise rows, e.g. sklearn.preprocessing.normalize(X), or pass "
                        "document_weights='auto' if the norms are the documents' weights")
                raise ValueError(f"the vMF likelihood needs L2-normalised rows; {bad.size} rows are not "
                                 f"(first: row {bad[0]}, norm {norms[bad[0]]:.6g}); {hint}")
            if weighted and X.shape[0] >= WEIGHT_WARNING_MIN_ROWS \
                    and not 1.0 / WEIGHT_MEDIAN_RANGE <= float(np.median(norms)) <= WEIGHT_MEDIAN_RANGE:
                # one text for every call, so that Python shows it once, not once per epoch
                warnings.warn(f"the vMF likelihood reads each row's norm as its document's weight, and these "
                              f"rows' median norm is beyond {WEIGHT_MEDIAN_RANGE:g} times or below 1/"
                              f"{WEIGHT_MEDIAN_RANGE:g} of 1 (TextVectorizer's weights have median 1 on the "
                              "documents it was fitted on): if the norms are not weights, normalise the rows "
                              "(sklearn.preprocessing.normalize) or pass document_weights=False", UserWarning,
                              stacklevel=2)
        return X

    def root_anchor(self, X) -> np.ndarray:
        m = np.asarray(X.mean(axis=0)).ravel()
        nrm = np.linalg.norm(m)
        return m / nrm if nrm > 0 else np.full(m.shape[0], 1.0 / np.sqrt(m.shape[0]))

    def initial_root(self, X) -> tuple[np.ndarray, float]:
        r = np.linalg.norm(np.asarray(X.sum(axis=0)).ravel())
        lo, hi = self.concentration_bounds
        n = float(X.shape[0])
        r *= n / self._total_weight(X)  # the documents' mean cosine to their mean direction is r / sum_i w_i
        b = estimate_concentration(np.array([r]), np.array([n]), self.n_features, min_count=2,
                                   fallback=np.array([lo]), kappa_min=lo, kappa_max=hi)
        return self.root_anchor(X), float(b[0])

    def kernel(self, arrays, theta, concentration, log_mass, log_residual, *, normalized=True):
        p = self.n_features
        conc = np.asarray(concentration, dtype=np.float64)
        ph_rows = np.flatnonzero(np.isfinite(log_residual))
        prior = np.array([self.new_node_prior(int(d) + 1) for d in arrays.depth[ph_rows]], dtype=np.float64)
        logc = log_normalizer(p, conc) if normalized else np.zeros_like(conc)
        b = conc[ph_rows]
        ph_a = log_residual[ph_rows] + log_normalizer(p, prior)
        if normalized:  # unnormalised: the new-node term stays on the same footing as live nodes
            ph_a = ph_a + log_normalizer(p, b)
        cand = Candidates(VMF, np.ascontiguousarray(theta.T), log_mass + logc, conc, np.zeros_like(conc),
                          ph_rows.astype(np.int64), ph_a, b.astype(np.float64), prior, normalized=normalized)
        return cand, ph_rows

    def new_node_prior(self, depth: int) -> float:
        return self.kappa0 * self.kappa1 ** depth if self.variant.parent_link else 0.0

    def new_node_theta(self, theta_parent, concentration, depth, docs):
        eta = self.new_node_prior(depth) * theta_parent + concentration * docs.s
        nrm = np.linalg.norm(eta)
        return eta / nrm if nrm > 0 else theta_parent.copy()

    def _linked_prior(self, theta_parent, depth, theta_prev) -> np.ndarray:
        """The natural parameter ``eta`` of a depth-``depth`` node's prior ``exp(eta . theta)``:
        the parent link, plus the time link when ``theta_prev`` is given (the product of two
        vMF links is the vMF of mean ``eta / |eta|`` and concentration ``|eta|``)."""
        if theta_prev is None:
            return self.new_node_prior(depth) * np.asarray(theta_parent)
        par, tim = self.link_strengths(np.array([depth]))
        return par[0] * np.asarray(theta_parent) + tim[0] * np.asarray(theta_prev)

    def sample_node_theta(self, theta_parent, concentration, depth, docs, rng, theta_prev=None):
        return _draw_natural(self._linked_prior(theta_parent, depth, theta_prev) + concentration * docs.s,
                             theta_parent, rng)

    def seed_child_theta(self, theta_node, x):
        v = x / max(np.linalg.norm(x), 1e-300) + theta_node
        return v / np.linalg.norm(v)

    def log_link(self, theta_child, theta_parent, depth, theta_prev=None):
        if theta_prev is None:  # |eta| is the link strength itself: the parent is a unit vector
            prior = self.new_node_prior(depth)
            return float(log_normalizer_nb(float(self.n_features), prior) + prior * theta_child @ theta_parent)
        eta = self._linked_prior(theta_parent, depth, theta_prev)
        return float(log_normalizer_nb(float(self.n_features), float(np.linalg.norm(eta))) + theta_child @ eta)

    def log_marginal(self, docs, theta_parent, concentration, depth, theta_prev=None):
        if theta_prev is None:
            return group_log_marginal(docs.n, docs.s, theta_parent, self.new_node_prior(depth), concentration,
                                      self.n_features, self._set_norms(docs))
        # both links: exp(par theta_parent.theta + tim theta_prev.theta) is vMF(eta / |eta|, |eta|)
        par, tim = self.link_strengths(np.array([depth]))
        eta = par[0] * np.asarray(theta_parent) + tim[0] * np.asarray(theta_prev)
        kappa = float(np.linalg.norm(eta))
        mu = eta / kappa if kappa > 0 else np.asarray(theta_parent)
        return group_log_marginal(docs.n, docs.s, mu, kappa, concentration, self.n_features, self._set_norms(docs))

    def _children_links(self, depth: int, children) -> tuple[np.ndarray, float]:
        """What a node's children's parent links add to its prior: each is ``exp(c theta_child .
        theta)`` in the node's parameter (``c`` the children's link strength), so their sum
        ``c sum theta_child`` joins the natural parameter; and their log normalisers."""
        c = self.new_node_prior(depth + 1)
        return c * np.asarray(children).sum(axis=0), len(children) * float(log_normalizer_nb(float(self.n_features), c))

    def linked_log_marginal(self, docs, theta_parent, concentration, depth, theta_prev=None, children=None):
        if children is None or not len(children):
            return self.log_marginal(docs, theta_parent, concentration, depth, theta_prev)
        # the prior link's normaliser C(|eta_link|) and the children's C(c), times the integral of
        # exp((eta + beta s) . theta), which group_log_marginal gives relative to C(|eta|)
        link = self._linked_prior(theta_parent, depth, theta_prev)
        added, log_children = self._children_links(depth, children)
        eta = link + added
        kappa = float(np.linalg.norm(eta))
        mu = eta / kappa if kappa > 0 else np.asarray(theta_parent)
        pf = float(self.n_features)
        return (group_log_marginal(docs.n, docs.s, mu, kappa, concentration, self.n_features, self._set_norms(docs))
                - float(log_normalizer_nb(pf, kappa)) + float(log_normalizer_nb(pf, float(np.linalg.norm(link))))
                + log_children)

    def sample_linked_theta(self, theta_parent, concentration, depth, docs, rng, theta_prev=None, children=None):
        if children is None or not len(children):
            return self.sample_node_theta(theta_parent, concentration, depth, docs, rng, theta_prev)
        eta = self._linked_prior(theta_parent, depth, theta_prev) + self._children_links(depth, children)[0]
        return _draw_natural(eta + concentration * docs.s, theta_parent, rng)

    def log_likelihood(self, docs, theta, concentration):
        return group_log_likelihood(docs.n, docs.s, theta, concentration, self.n_features, self._set_norms(docs))

    def drift_statistic(self, theta_now, theta_prev, depth):
        # vMF(theta_prev, k) for large k: 2 k (1 - cos) is about chi-square with p - 1 df
        _, tim = self.link_strengths(np.array([depth]))
        if tim[0] <= 0:
            return None
        return float(2.0 * tim[0] * max(0.0, 1.0 - float(theta_now @ theta_prev))), float(self.n_features - 1)

    def _total_weight(self, X) -> float:
        """The rows' total weight ``sum_i w_i``: their count for unit rows."""
        n = float(X.shape[0])
        if not self.document_weights:
            return n
        sq = sq_norms_of_rows(X)
        return n if row_weights_are_unit(sq) else float(np.sum(np.sqrt(sq)))

    def _set_norms(self, docs: DocumentSet) -> np.ndarray | None:
        """The set's rows' squared norms under document weights (:func:`_set_norms`); None
        (unit documents) without them."""
        return _set_norms(docs) if self.document_weights else None

    def _row_normalizers(self, sq_norms: np.ndarray, concentration: float):
        if row_weights_are_unit(sq_norms):
            return log_normalizer_nb(float(self.n_features), float(concentration))
        return log_normalizer_table(self.n_features, float(concentration), sq_norms)[:, 0]

    def row_log_likelihood(self, X, theta, concentration):
        norm = (self._row_normalizers(sq_norms_of_rows(X), concentration) if self.document_weights
                else log_normalizer_nb(float(self.n_features), float(concentration)))
        return norm + concentration * np.asarray(X @ theta).ravel()

    def block_normalizers(self, block: RowBlock, concentration):
        """Each row's log normaliser at ``concentration`` (a scalar for unit documents)."""
        return (self._row_normalizers(block.sq_norms(), concentration) if self.document_weights
                else log_normalizer_nb(float(self.n_features), float(concentration)))

    def block_log_likelihood(self, block: RowBlock, theta, concentration):
        return self.block_normalizers(block, concentration) + concentration * block.dot(theta)

    def fixed_node(self, theta, concentration):
        return _FixedDirection(self, theta, concentration)

    def block_log_odds(self, block: RowBlock, theta_1, theta_2, concentration):
        # a row's log normaliser depends on the concentration and its weight only: it cancels
        return concentration * block.dot(np.asarray(theta_1, dtype=np.float64) - np.asarray(theta_2, dtype=np.float64))

    def live_log_weights(self, X, cand, theta, hyper=None):
        """As the base class; with document weights each weighted row's log normaliser is
        ``log C_p(beta w)`` in place of its node's ``log C_p(beta)`` (normalised candidates)."""
        weights = super().live_log_weights(X, cand, theta, hyper)
        if self.document_weights and cand.normalized:
            sq = sq_norms_of_rows(X)
            if not row_weights_are_unit(sq):
                weights += weighted_normalizer_change(self.n_features, cand.live_b, sq)
        return weights

    def _pooled_concentration(self, n: float, t: float) -> float:
        """The maximum-likelihood concentration shared by documents: ``A_p(beta) = t / n``."""
        lo, hi = self.concentration_bounds
        return float(concentration_posterior_mode(np.array([n]), np.array([t]), self.n_features, 1.0, 0.0,
                                                  lo, hi)[0])

    def initial_link_strength(self, X):
        """The documents' pooled concentration about their mean direction (see
        :meth:`estimate_link_strength`); the first epoch's root concentration."""
        # the mean cosine to the mean direction is ||sum_i w_i x_i|| / sum_i w_i
        return self._pooled_concentration(self._total_weight(X), float(np.linalg.norm(np.asarray(X.sum(axis=0)))))

    def estimate_link_strength(self, arrays, theta, concentration, counts, sums, prev_theta, has_prev,
                               root_anchor, sumsq=None):
        """A unit-information link: ``kappa0`` equals the pooled document concentration.

        A new node's direction carries one typical document's worth of information about
        where it lies relative to its parent (the unit-information prior): ``kappa0`` is the
        ``beta`` with ``A_p(beta)^2`` equal to the mean cosine between two different
        documents of the same node, per document,
        ``sum_e (||s_e||^2 - n_e) / (n_e - 1) / sum_e n_e`` over nodes with two documents or
        more. Pairs of distinct documents, not documents against their node's fitted
        direction: that direction is fitted to the same documents, so small nodes would look
        tight (a one-document node has cosine 1), the estimate would grow with the number of
        small nodes and the stronger link would then make more of them. The value scales
        with the dimension and the documents' spread, so it transfers across vocabularies and
        corpus sizes.

        Why not the marginal likelihood of the links (the empirical-Bayes estimate the
        multinomial family uses): the collapsed composite likelihood of the links, given a tree,
        peaks at 3-7 times the pooled beta on planted hierarchical-Dirichlet corpora (also
        given the true tree), and at such strengths the vMF kernel makes a singleton node for
        every document whose cosine to its node is well below typical. With a strong link a
        one-document node's collapsed marginal beats its node's likelihood once the cosine
        falls below about 0.8 A_p(beta) (p = 2,000, beta = 1,000: from kappa ~ 2,000), and
        documents of 30 to 100 words spread far more in cosine than one vMF concentration
        per node allows. At ``kappa0 = beta`` only documents far below typical do.
        """
        _, a2 = pair_cosine(np.asarray(counts, dtype=np.float64), sums, sumsq)
        if a2 is None:
            return None
        lo, hi = self.concentration_bounds
        if a2 <= 0.0:
            return float(lo)
        a = min(np.sqrt(a2), 1.0 - 1e-12)
        return self._pooled_concentration(1.0, a)

    def update_theta(self, arrays, theta, sums, counts, concentration, prev_theta, has_prev, root_anchor,
                     update, n_iter):
        par, tim = self.link_strengths(arrays.depth)
        return map_theta_vmf(arrays, theta, sums, concentration, prev_theta, has_prev, root_anchor, par, tim,
                             update=update, n_iter=n_iter)

    def update_concentration(self, counts, sums, sumsq, theta, current):
        """Posterior modes under a Gamma prior shared by all nodes (empirical Bayes), from the
        cosines between distinct documents of each node.

        A node's data enter as ``n A``, with ``A^2`` estimated by the mean cosine between two
        different documents of the node, ``(||s||^2 - n) / (n (n - 1))`` (see
        :func:`pair_cosine`), not by ``theta.s / n``: the direction is fitted to the same
        documents, and in high dimension that makes a small node look far tighter than it is
        (two documents at concentration 300 in p = 2,000 have cosine 0.02 with each other and
        0.7 with their mean). That inflated concentration made documents below a node's
        typical cosine better explained by a new node of their own, so trees filled with small
        nodes whose inflated concentrations raised the pooled value further.

        The prior's mode is the pooled concentration (the same pair estimate over all nodes,
        the rule :meth:`estimate_link_strength` uses), and it weighs as much as
        :data:`CONCENTRATION_PRIOR_DOCS` documents (:func:`concentration_prior`): a node with a
        handful of near-identical documents stays near the pooled value instead of running to
        the upper bound, while a node with many documents follows its own. ``theta`` is not
        used (the estimate does not depend on the direction)."""
        lo, hi = self.concentration_bounds
        counts = np.asarray(counts, dtype=np.float64)
        if counts.size == 0:
            return np.array(current, dtype=np.float64, copy=True)
        per_node, pooled_a2 = pair_cosine(counts, sums, sumsq)
        if pooled_a2 is None:
            return np.array(current, dtype=np.float64, copy=True)
        pooled = self._pooled_concentration(1.0, min(np.sqrt(max(pooled_a2, 0.0)), 1.0 - 1e-12))
        shape, rate = concentration_prior(self.n_features, pooled)
        out = concentration_posterior_mode(counts, counts * np.sqrt(per_node), self.n_features, shape, rate, lo, hi)
        return np.where(counts >= self.min_node_docs, out, np.asarray(current, dtype=np.float64))
