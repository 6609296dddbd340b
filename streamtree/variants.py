"""The dTSSBP paper's models as configurations of one estimator.

| variant | depth | window | theta links | theta after birth |
|---|---|---|---|---|
| dtssbp  | max_depth | window | parent + previous epoch | MAP every epoch |
| o-tssbp | max_depth | infinite | as dtssbp in the birth epoch | frozen |
| t-tssbp | max_depth | 0 (fresh tree per epoch) | none | n/a |
| ddp     | 1 level | window | previous epoch only (strength xi) | MAP every epoch |
| o-dp    | 1 level | infinite | as ddp in the birth epoch | frozen |
| t-dp    | 1 level | 0 | none | n/a |

"1 level" is a Dirichlet process: the root holds no data (nu = 0 at the root), the clusters are
its children (nu = 1 at depth 1) and the branch sticks have concentration 1. New clusters of the
DP models and nodes of the unlinked models have a uniform prior direction.
"""

from __future__ import annotations

from dataclasses import dataclass

VARIANTS = ("dtssbp", "o-tssbp", "t-tssbp", "ddp", "o-dp", "t-dp")


@dataclass(frozen=True)
class VariantConfig:
    window: int | None
    max_depth: int | None
    root_holds_data: bool
    gamma: float
    parent_link: bool  # theta linked to its parent (and new nodes drawn around the parent)
    time_link: bool  # theta linked to the same node at the previous epoch
    time_kappa: float | None  # fixed time-link strength (DP models' xi); None: the depth rule
    freeze_after_birth: bool


def resolve_variant(variant: str, *, window, max_depth, gamma: float, xi: float) -> VariantConfig:
    """The configuration of ``variant`` given the estimator's own settings."""
    v = variant.lower()
    if v not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    tree = v.endswith("tssbp")
    depth = max_depth if tree else 1
    root_data = tree
    g = gamma if tree else 1.0
    if v.startswith("t-"):
        return VariantConfig(0, depth, root_data, g, False, False, None, False)
    frozen = v.startswith("o-")
    win = None if frozen else window
    if tree:
        return VariantConfig(win, depth, root_data, g, True, True, None, frozen)
    return VariantConfig(win, depth, root_data, g, False, True, xi, frozen)
