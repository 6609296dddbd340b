"""The scikit-learn estimator contract for the static hierarchical models.

Every check of ``sklearn.utils.estimator_checks`` runs on each static estimator, and none is
expected to fail. One is skipped by scikit-learn itself: ``check_array_api_input`` needs the
environment variable ``SCIPY_ARRAY_API=1`` and an array-API library; the static models compute
with NumPy, Numba and SciPy only and do not claim array-API support.

The sampler of the time-marginalised coalescent runs with 4 sweeps in these checks: the checks
test the interface (validation, cloning, pickling, idempotence, ...), which does not depend on
the number of sweeps, and 100 sweeps per fit over some 40 checks would only add minutes.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.utils._param_validation import InvalidParameterError
from sklearn.utils.estimator_checks import check_param_validation, parametrize_with_checks

import streamtree  # noqa: F401  (numba cache configuration)
from streamtree.static import (
    BayesianHierarchicalClustering,
    KingmanCoalescent,
    TimeMarginalizedCoalescent,
)

ESTIMATORS = [
    BayesianHierarchicalClustering(),
    KingmanCoalescent(),
    TimeMarginalizedCoalescent(n_sweeps=4, burn_in=2),
]


@parametrize_with_checks(ESTIMATORS)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: type(e).__name__)
def test_parameter_constraints_checked_at_fit(estimator):
    # every __init__ parameter has a declared constraint, and fit rejects values outside it
    params = set(inspect.signature(type(estimator).__init__).parameters) - {"self"}
    assert set(type(estimator)._parameter_constraints) == params
    check_param_validation(type(estimator).__name__, estimator)


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: type(e).__name__)
def test_clone_keeps_parameters_and_drops_fitted_state(estimator):
    X = np.random.default_rng(0).normal(size=(12, 3))
    fitted = clone(estimator)
    if "random_state" in fitted.get_params():
        fitted.set_params(random_state=0)
    fitted.fit(X)
    copy = clone(fitted)
    assert copy.get_params() == fitted.get_params()
    assert not hasattr(copy, "linkage_")
    np.testing.assert_array_equal(copy.fit(X).linkage_, fitted.linkage_)


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: type(e).__name__)
def test_use_before_fit_raises_not_fitted(estimator):
    X = np.zeros((3, 2))
    with pytest.raises(NotFittedError, match="not fitted"):
        clone(estimator).predictive_log_density(X)
    if hasattr(estimator, "impute"):
        with pytest.raises(NotFittedError, match="not fitted"):
            clone(estimator).impute()


def test_invalid_parameters_name_the_parameter():
    X = np.random.default_rng(1).normal(size=(6, 2))
    cases = [
        (BayesianHierarchicalClustering(max_hyper_iter=-1), "max_hyper_iter"),
        (BayesianHierarchicalClustering(optimize_hyperparameters="yes"), "optimize_hyperparameters"),
        (KingmanCoalescent(n_hyper_iter=-5), "n_hyper_iter"),
        (KingmanCoalescent(n_particles=0), "n_particles"),
        (KingmanCoalescent(n_states=1), "n_states"),
        (TimeMarginalizedCoalescent(burn_in=-1), "burn_in"),
        (TimeMarginalizedCoalescent(thin=0), "thin"),
        (TimeMarginalizedCoalescent(sigma2=0.0), "sigma2"),
    ]
    for est, name in cases:
        with pytest.raises(InvalidParameterError, match=f"'{name}' parameter"):
            est.fit(X)
