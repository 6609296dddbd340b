"""Every ```python block of README.md runs, in order, in one namespace (later snippets build on
earlier ones), from a directory where the bundled corpus is at its README path and
``runs/sotu`` is a small replayed store."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks() -> list[str]:
    return BLOCK.findall((ROOT / "README.md").read_text(encoding="utf-8"))


def test_the_readme_has_python_examples():
    blocks = python_blocks()
    assert len(blocks) >= 3
    assert any("predict" in b for b in blocks) and any("load_model" in b for b in blocks)


@pytest.fixture(scope="module")
def readme_dir(tmp_path_factory):
    from streamtree.cli import main
    from test_replay import sou_slice

    here = tmp_path_factory.mktemp("readme")
    (here / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    corpus = sou_slice(here / "slice.parquet", n=150)
    assert main(["replay", str(corpus), "--text-col", "text", "--time-col", "year", "--id-col", "doc_id",
                 "--epoch", "10y", "--quiet", "--store", str(here / "runs" / "sotu"), "--sweeps", "3",
                 "--max-features", "500"]) == 0
    return here


def test_readme_python_examples_run(readme_dir, monkeypatch, capsys):
    monkeypatch.chdir(readme_dir)
    namespace: dict = {"__name__": "readme"}
    for k, block in enumerate(python_blocks()):
        try:
            exec(compile(block, f"README.md python block {k + 1}", "exec"), namespace)
        except Exception as exc:  # say which snippet went stale
            raise AssertionError(f"README python block {k + 1} failed: {exc!r}\n{block}") from exc
    assert "predict" in namespace["DTSSBP"].__dict__
