"""Static hierarchical snapshots: BHC, Kingman's coalescent, time-marginalised coalescent."""

from streamtree.static.dendrogram import Dendrogram

__all__ = ["Dendrogram"]
