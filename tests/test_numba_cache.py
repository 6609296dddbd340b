"""The numba cache folder follows the source of every kernel module (a stale callee is never reused)."""

from __future__ import annotations

import os
from pathlib import Path

from streamtree import _numba_env
from streamtree._numba_env import KEPT_SOURCES, configure_numba_cache, kernel_digest


def test_the_digest_follows_kernel_modules_only(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "kernels.py").write_text("from numba import njit\n\n@njit\ndef f(x):\n    return x + 1\n")
    (pkg / "sub" / "caller.py").write_text("import numba\n")
    (pkg / "cli.py").write_text("print('no kernels here')\n")
    first = kernel_digest(pkg)
    (pkg / "cli.py").write_text("print('still none')\n")
    assert kernel_digest(pkg) == first  # editing a module without kernels keeps the cache
    (pkg / "kernels.py").write_text("from numba import njit\n\n@njit\ndef f(x):\n    return x + 2\n")
    assert kernel_digest(pkg) != first  # a callee's edit renews every kernel's cache


def test_the_cache_lives_under_the_digest_and_old_sources_are_pruned(tmp_path, monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    root = tmp_path / "streamtree" / "numba"
    others = [root / f"src-old{i}" for i in range(KEPT_SOURCES + 2)]
    for i, p in enumerate(others):
        p.mkdir(parents=True)
        os.utime(p, (1000.0 + i, 1000.0 + i))  # older first
    foreign = root / "inference_0123"  # not a source folder of ours: left alone
    foreign.mkdir()
    configure_numba_cache()
    cache = Path(os.environ["NUMBA_CACHE_DIR"])
    assert cache == root / f"src-{kernel_digest(Path(_numba_env.__file__).parent)}" and cache.is_dir()
    kept = sorted(p.name for p in root.iterdir() if p.name.startswith("src-old"))
    assert kept == [p.name for p in others[-KEPT_SOURCES:]]  # the most recently used
    assert foreign.is_dir()
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    configure_numba_cache()  # a folder chosen by the user is used as given
    assert os.environ["NUMBA_CACHE_DIR"] == str(tmp_path / "mine")
