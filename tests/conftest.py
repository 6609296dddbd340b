"""Fixtures shared by the test modules."""

import pytest


@pytest.fixture
def threads_always(monkeypatch):
    """Every parallel region of two or more ranges on the threads, however small: the fitting
    code runs regions too small for the threads in the calling thread, where a test of the
    threads' values on small data would check nothing."""
    monkeypatch.setattr("streamtree.inference.threads.MIN_PARALLEL_SECONDS", 0.0)
