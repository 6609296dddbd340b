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

#: The estimator's family unless one is given, and with it the text pipeline's row form (its
#: ``text_norm``). Word distributions over raw counts: on real short text (State of the Union
#: paragraphs) they give trees of tens of nodes with stable ids, where vMF topics (unit or
#: length-weighted rows) make hundreds of small nodes a decade (a document whose cosine to its
#: node falls below about beta / 2p is likelier under a new node of its own, and paragraph
#: cosines spread far wider than one vMF concentration allows); see BENCHMARKS.md.
DEFAULT_LIKELIHOOD = "multinomial"

__all__ = ["DEFAULT_LIKELIHOOD", "LIKELIHOODS", "TEXT_LIKELIHOODS", "DocumentSet", "Likelihood"]
