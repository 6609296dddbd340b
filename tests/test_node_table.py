"""The node table's column gather: the z-kernel's coefficient layout without copies."""

from __future__ import annotations

import numpy as np

from streamtree.inference.epoch_sampler import NodeTable


def test_theta_columns_is_the_transpose_of_the_gathered_rows_in_a_reused_buffer():
    rng = np.random.default_rng(0)
    p = 131  # not a multiple of the gather's tile
    table = NodeTable(p, capacity=4)
    for nid in range(9):  # grows past its capacity
        table.add(nid, rng.standard_normal(p), 1.0)
    table.remove(3)
    table.add(20, rng.standard_normal(p), 2.0)  # reuses a freed row
    ids = np.array([20, 0, 8, 5, 1], dtype=np.int64)
    work = np.full(p * 7, np.nan)
    cols = table.theta_columns(ids, work)
    assert cols.shape == (p, ids.size) and cols.flags.c_contiguous
    assert np.shares_memory(cols, work)
    assert np.array_equal(cols, table.theta_of(ids).T)
    assert np.array_equal(cols.T, table.theta_of(ids))  # what the likelihood's kernel receives
