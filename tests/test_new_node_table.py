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
