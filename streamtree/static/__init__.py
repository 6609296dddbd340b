"""Static hierarchical snapshots: BHC, Kingman's coalescent, time-marginalised coalescent."""

from streamtree.static.dendrogram import Dendrogram

__all__ = ["Dendrogram"]

from streamtree.static.bhc import BayesianHierarchicalClustering  # noqa: E402

__all__ += ["BayesianHierarchicalClustering"]

from streamtree.static.coalescent import KingmanCoalescent  # noqa: E402

__all__ += ["KingmanCoalescent"]

from streamtree.static.tmc import TimeMarginalizedCoalescent  # noqa: E402

__all__ += ["TimeMarginalizedCoalescent"]
