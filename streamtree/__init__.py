"""streamtree: evolving topic trees over time-stamped text.

The core model is the dependent tree-structured stick-breaking process (dTSSBP) of Dubey, Ho,
Williamson and Xing (NIPS 2014), inferred online one epoch at a time.
"""

from __future__ import annotations

from streamtree import _numba_env  # noqa: F401  (must precede any numba import)
from streamtree import engines as _engines  # noqa: F401  (registers the "local" and "ray" engines)
from streamtree.epoch_tree import EpochTree

__version__ = "0.1.0"
__all__ = ["DTSSBP", "EpochTree", "__version__"]


def __getattr__(name: str):
    # Lazy so that `import streamtree` stays cheap for readers of the snapshot store.
    if name == "DTSSBP":
        from streamtree.model import DTSSBP

        return DTSSBP
    raise AttributeError(f"module 'streamtree' has no attribute {name!r}")
