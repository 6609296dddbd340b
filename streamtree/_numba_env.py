"""Numba configuration that must happen before numba is first imported.

Numba caches compiled kernels next to the source by default, which fails on a read-only
install. We point the cache at a per-user directory unless the user chose one.

Numba renews a module's cached kernels when that module's file changes, but a kernel compiled
with a call into another module's kernel keeps the old callee after that module alone changes
(an update that touches one file, such as a ``git pull``). So the cache lives in a folder named
by a digest of every kernel module's source: any change to one of them starts a fresh cache,
and the folders of the last few sources are kept (older ones, which only this module writes,
are removed).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

#: cache folders of earlier sources kept beside the current one (switching branches back and
#: forth does not recompile every time)
KEPT_SOURCES = 3
_PREFIX = "src-"


def kernel_digest(package: Path) -> str:
    """A digest of the source of every module of ``package`` that compiles numba kernels."""
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        text = path.read_bytes()
        if b"import numba" in text or b"from numba" in text:
            h.update(str(path.relative_to(package)).encode() + b"\0" + text + b"\0")
    return h.hexdigest()[:16]


def _prune(root: Path, current: Path) -> None:
    """Remove the least recently used source folders beyond :data:`KEPT_SOURCES`."""
    try:
        old = sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX) and p != current),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return
    for p in old[KEPT_SOURCES:]:
        shutil.rmtree(p, ignore_errors=True)


def configure_numba_cache() -> None:
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    root = Path(base) / "streamtree" / "numba"
    try:
        digest = kernel_digest(Path(__file__).resolve().parent)
    except OSError:  # sources not readable as files (a zipped install): numba's own checks
        digest = "unknown"
    cache = root / f"{_PREFIX}{digest}"
    try:
        fresh = not cache.exists()
        cache.mkdir(parents=True, exist_ok=True)
        os.utime(cache)  # most recently used
        if fresh:
            _prune(root, cache)
    except OSError:
        import tempfile

        user = getattr(os, "getuid", lambda: "")()  # a shared temporary folder: one cache per user
        cache = Path(tempfile.gettempdir()) / f"streamtree-numba-cache-{user}" / f"{_PREFIX}{digest}"
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError:  # nowhere to cache: numba compiles at each start, or caches where it can
            return
    os.environ["NUMBA_CACHE_DIR"] = str(cache)


configure_numba_cache()
