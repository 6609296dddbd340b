"""Progress: the model's per-sweep callback and the replay's progress bars."""

from __future__ import annotations

import io

import numpy as np
import scipy.sparse as sp
from sklearn.preprocessing import normalize

from streamtree.model import DTSSBP
from streamtree.progress import ReplayProgress
from streamtree.replay import ReplayConfig, replay
from test_replay import sou_slice


def test_partial_fit_calls_back_after_every_sweep():
    rng = np.random.default_rng(0)
    X = sp.csr_matrix(normalize(rng.random((40, 12)) ** 4))
    seen = []
    model = DTSSBP(likelihood="vmf", n_sweeps=4, random_state=0).partial_fit(X, callback=lambda *a: seen.append(a))
    assert [s[:2] for s in seen] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert all(n >= 1 for _, _, n in seen)
    plain = DTSSBP(likelihood="vmf", n_sweeps=4, random_state=0).partial_fit(X)  # the callback changes nothing
    np.testing.assert_array_equal(plain.trees_[-1].assignments, model.trees_[-1].assignments)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_replay_progress_on_a_terminal_and_quiet_elsewhere(tmp_path):
    path = sou_slice(tmp_path / "c.parquet", n=90)
    config = ReplayConfig(source=str(path), text_col="text", time_col="year", epoch="10y",
                          model={"n_sweeps": 3, "max_depth": 2})
    term = _Terminal()
    replay(config, str(tmp_path / "a"), progress=ReplayProgress(term, mininterval=0))
    text = term.getvalue()
    assert "sweep" in text and "live nodes" in text and "docs/s" in text and "epoch 1810s" in text
    pipe = io.StringIO()
    replay(config, str(tmp_path / "b"), progress=ReplayProgress(pipe))
    assert pipe.getvalue() == ""
