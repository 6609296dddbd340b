"""Numba configuration that must happen before numba is first imported.

Numba caches compiled kernels next to the source by default, which fails on a read-only
install. We point the cache at a per-user directory unless the user chose one.
"""

from __future__ import annotations

import os
from pathlib import Path


def configure_numba_cache() -> None:
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    cache = Path(base) / "streamtree" / "numba"
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        import tempfile

        cache = Path(tempfile.gettempdir()) / "streamtree-numba-cache"
        cache.mkdir(parents=True, exist_ok=True)
    os.environ["NUMBA_CACHE_DIR"] = str(cache)


configure_numba_cache()
