"""Observation families of the dTSSBP, one module each, behind one interface.

:data:`LIKELIHOODS` maps the estimator's ``likelihood=`` value to the family's class (see
:class:`streamtree.likelihoods.base.Likelihood`). A new family is one module with a
``Likelihood`` subclass, added here.
"""

from __future__ import annotations

from streamtree.likelihoods.base import DocumentSet, Likelihood
from streamtree.likelihoods.gaussian import Gaussian
from streamtree.likelihoods.multinomial import Multinomial
from streamtree.likelihoods.vmf import VonMisesFisher

LIKELIHOODS: dict[str, type[Likelihood]] = {cls.name: cls for cls in (VonMisesFisher, Gaussian, Multinomial)}
TEXT_LIKELIHOODS: tuple[str, ...] = tuple(name for name, cls in LIKELIHOODS.items() if cls.for_text)

__all__ = ["LIKELIHOODS", "TEXT_LIKELIHOODS", "DocumentSet", "Likelihood"]
