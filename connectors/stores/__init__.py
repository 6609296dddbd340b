"""Snapshot stores: versioned, atomically published epoch trees on ``pyarrow.fs``."""

from connectors.stores.snapshot import (
    NodeLineage,
    SnapshotStore,
    StaticSnapshot,
    StoredEpoch,
    StoreError,
)

__all__ = ["NodeLineage", "SnapshotStore", "StaticSnapshot", "StoreError", "StoredEpoch"]
