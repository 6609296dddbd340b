"""Counts of the exact moves a fit runs and accepts, by move kind, for the benchmarks.

Wraps the move methods of :class:`~streamtree.inference.split_merge.SplitMerge` while a block
runs, so a benchmark can print what each kind of move costs (thread CPU) against what it
changes (acceptances). The fit itself is untouched: the wrappers only count.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator

#: (method of ``SplitMerge``, move name) of the counted moves
MOVES = (
    ("attempt", "split-merge attempts"),
    ("relocate", "relocations"),
    ("rehang", "rehangs"),
    ("lift", "lifts and insertions of empty nodes"),
    ("lift_carried", "lifts of carried nodes"),
)


@contextlib.contextmanager
def move_counters(counts: dict, group: Callable[[], str] = lambda: "") -> Iterator[dict]:
    """Add ``[runs, acceptances, thread CPU seconds, acceptances by result kind]`` of each move of
    :data:`MOVES` into ``counts`` while the block runs (a run that raises is counted too), keyed
    by ``(group(), move name)``; a split-merge attempt's name carries its proposal kind, and its
    accepted results are splits or merges (a lift's: insertions or lifts)."""
    from streamtree.inference.split_merge import SplitMerge

    undo = []
    for attr, name in MOVES:
        fn = getattr(SplitMerge, attr)

        def counted(*a, _fn=fn, _attr=attr, _name=name, **k):
            key = (group(), f"{_name} ({k.get('proposal', 'launch')})" if _attr == "attempt" else _name)
            entry = counts.setdefault(key, [0, 0, 0.0, {}])
            c = time.thread_time()
            res = None
            try:
                res = _fn(*a, **k)
                return res
            finally:
                entry[0] += 1
                entry[2] += time.thread_time() - c
                if res is not None:
                    entry[1] += 1
                    entry[3][res.kind] = entry[3].get(res.kind, 0) + 1

        setattr(SplitMerge, attr, functools.wraps(fn)(counted))
        undo.append((attr, fn))
    try:
        yield counts
    finally:
        for attr, fn in undo:
            setattr(SplitMerge, attr, fn)


def print_moves(counts: dict, total_cpu: float, title: str) -> None:
    """One line per counted ``(group, move)``: runs, acceptances (their share, and by result
    kind), thread CPU and its share of ``total_cpu``."""
    print(title)
    labels = [f"{group}: {name}" if group else name for group, name in counts]
    width = max(map(len, labels), default=0)
    for label, (run, accepted, seconds, kinds) in zip(labels, counts.values()):
        by_kind = f"  [{', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}]" if kinds else ""
        print(f"  {label:{width}s} {run:7d} {accepted:6d} ({100 * accepted / max(run, 1):5.2f}%) {seconds:7.2f} s "
              f"{100 * seconds / total_cpu:5.1f}%{by_kind}")
