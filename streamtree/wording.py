"""Counts in words: ``1 document``, ``2 documents``, for everything the command line and the
report say to a person (the report's page script has the same rule, ``count`` in report.js).
"""

from __future__ import annotations


def counted(n, noun: str, plural: str | None = None, *, spec: str = "") -> str:
    """``n`` and ``noun``, singular for exactly one and plural otherwise.

    Parameters
    ----------
    n : int or float
        The count (a number type NumPy gives works too).
    noun : str
        The singular (``"doc"``, ``"live node"``, ``"rejected record"``).
    plural : str, optional
        The plural when it is not ``noun + "s"`` (``"leaves"``, ``"children"``).
    spec : str
        A format spec for the number (``","`` for thousands separators).

    Examples
    --------
    >>> counted(1, "doc"), counted(0, "doc"), counted(3, "leaf", "leaves"), counted(12000, "epoch", spec=",")
    ('1 doc', '0 docs', '3 leaves', '12,000 epochs')
    """
    word = noun if n == 1 else plural if plural is not None else noun + "s"
    return f"{n:{spec}} {word}"
