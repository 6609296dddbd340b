"""Crash points of the store, for the fault-injection tests.

Every store write step calls :func:`write_point`. With ``STREAMTREE_KILL_AT_WRITE=N`` in
the environment the process kills itself (SIGKILL, no clean-up) at its N-th write point,
and with ``STREAMTREE_WRITE_TRACE=<file>`` it appends the name of each point to that file.
Without these variables a write point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

_count = 0


def write_point(name: str) -> None:
    global _count
    kill_at = os.environ.get("STREAMTREE_KILL_AT_WRITE")
    trace = os.environ.get("STREAMTREE_WRITE_TRACE")
    if not kill_at and not trace:
        return
    _count += 1
    if trace:
        with open(trace, "a", encoding="utf-8") as f:
            f.write(f"{_count} {name}\n")
    if kill_at and _count == int(kill_at):
        os.kill(os.getpid(), signal.SIGKILL)
