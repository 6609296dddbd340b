"""Where the z-updates run: ``"local"`` (in-process threads) and ``"ray"`` (one actor per shard).

Importing this package registers both names with the core's engine registry
(:func:`streamtree.inference.zsweep.register_engine`); the engine modules themselves load only
when an engine is built, so that Ray is imported only when it is used.
"""

from __future__ import annotations

from streamtree.inference.zsweep import ZSweeper, register_engine


def _local(*, n_shards: int, n_jobs: int, **options) -> ZSweeper:
    from streamtree.engines.local import LocalEngine

    return LocalEngine(n_shards=n_shards, n_jobs=n_jobs, **options)


def _ray(*, n_shards: int, n_jobs: int, **options) -> ZSweeper:
    from streamtree.engines.ray import RayEngine

    # a Ray engine's parallelism is its shard actors; n_jobs is a local-engine setting
    return RayEngine(n_shards=n_shards, **options)


register_engine("local", _local)
register_engine("ray", _ray)

__all__ = ["register_engine"]
