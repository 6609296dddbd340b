"""Snapshot stores: versioned, atomically committed epoch trees on ``pyarrow.fs``, one writer at a time."""

from connectors.stores.errors import CheckpointNotKeptError, CorruptStoreError, StoreAccessError, StoreBusyError, StoreError
from connectors.stores.lease import Lease
from connectors.stores.snapshot import NodeLineage, SnapshotStore, StaticSnapshot, StoredEpoch

__all__ = ["CheckpointNotKeptError", "CorruptStoreError", "Lease", "NodeLineage", "SnapshotStore", "StaticSnapshot", "StoreAccessError",
           "StoreBusyError", "StoreError", "StoredEpoch"]
