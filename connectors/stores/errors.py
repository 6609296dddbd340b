"""Errors of the snapshot store, one class per thing the user must do differently."""

from __future__ import annotations


class StoreError(Exception):
    """The store cannot be used as asked: not published yet, another configuration, bad argument."""


class CorruptStoreError(StoreError):
    """The store's manifest, a commit record or a data file is damaged or not what it claims."""


class CheckpointNotKeptError(StoreError):
    """The model checkpoint of an epoch before the latest was not kept (``keep_checkpoints="latest"``)."""


class StoreAccessError(StoreError):
    """The operating system refused a store operation: a file in the way, no permission, disk full."""


class StoreBusyError(StoreError):
    """Another writer holds the store's lease.

    Attributes
    ----------
    holder : dict
        The lease as read: ``owner``, ``host``, ``pid``, ``command``, ``acquired``, ``heartbeat``.
    """

    def __init__(self, message: str, holder: dict) -> None:
        super().__init__(message)
        self.holder = holder
