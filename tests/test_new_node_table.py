"""The interpolated new-node term of the z-kernel matches the exact Bessel evaluation."""

import numpy as np
import pytest

from streamtree.inference.enumerated import _hermite
from streamtree.likelihoods.vmf import new_node_table
from streamtree.likelihoods.vmf import log_normalizer


@pytest.mark.parametrize("p", [3, 100, 2636, 20000])
def test_hermite_table_error_below_1e_9(p):
    rng = np.random.default_rng(p)
    b = np.array([1e-3, 1.0, 50.0, 400.0, 3000.0, 1e4, 2e5])
    c = np.array([0.0, 10.0, 1e3, 1e4, 1e4, 1e5, 1e4])
    table = new_node_table(p, b, c)
    t = np.concatenate([rng.uniform(-1, 1, 400), [-1.0, 1.0, 0.0]])
    for j in range(b.size):
        exact = -log_normalizer(p, np.sqrt(b[j] ** 2 + c[j] ** 2 + 2 * b[j] * c[j] * t))
        approx = np.array([_hermite(table, j, ti) for ti in t])
        assert np.max(np.abs(approx - exact)) < 1e-9, (p, b[j], c[j], np.max(np.abs(approx - exact)))


def test_hermite_slope_at_a_zero_resultant_is_its_limit():
    """With b = c the resultant vanishes at t = -1; the knot's slope there is the limit of
    A_p(rho) b c / rho, b c / p, checked against a one-sided difference of the exact term."""
    p, b = 50, 3.0
    table = new_node_table(p, np.array([b]), np.array([b]))
    h = 1e-7
    g = [-log_normalizer(p, np.sqrt(2 * b * b * (1 + t))) for t in (-1.0, -1.0 + h)]
    assert table[0, 0, 1] == pytest.approx(b * b / p, rel=1e-12)
    assert table[0, 0, 1] == pytest.approx((g[1] - g[0]) / h, rel=1e-5)
