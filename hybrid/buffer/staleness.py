"""The fully-async mode's two staleness rules, as pure arithmetic on counts and versions.

Versions: the trainer's step t turns version t-1 into t and publishes it; `trained_at(v)` is
the number of groups the trainer had trained when it published v (dropped groups are not
trained).

1. Production (verl's staleness_threshold), checked by the Rollouter before it starts groups:
   holding version v it may have at most `trained_at(v) + budget` live groups started, where
   live = started - dropped and budget = floor((1 + threshold) x groups_per_version). With no
   drops this is verl's rule (a version may be followed by at most (1 + threshold) versions'
   worth of samples before the Rollouter pauses); a dropped group will never be trained, so it
   hands its place back (otherwise drops could starve the trainer of the groups it needs to
   publish the next version, which is what lifts the pause).
2. Consumption (AReaL's max_version_lag), checked by the queue when the trainer takes a group:
   the group is trained only if its oldest token lags at most the bound.
"""

from __future__ import annotations

import math


def production_budget(staleness_threshold: float, groups_per_version: int) -> int:
    """Live groups the Rollouter may have started beyond those trained at its version."""
    if staleness_threshold < 0:
        raise ValueError(f"staleness_threshold must be >= 0, got {staleness_threshold}")
    if groups_per_version < 1:
        raise ValueError(f"groups_per_version must be >= 1, got {groups_per_version}")
    # The epsilon keeps e.g. (1 + 0.1) x 10 = 11.000000000000002 from flooring to 11 by luck
    # and 1.15 x 20 = 22.999999999999996 from flooring to 22.
    return max(
        groups_per_version, math.floor((1 + staleness_threshold) * groups_per_version + 1e-9)
    )


def groups_to_start(started: int, dropped: int, trained_at_version: int, budget: int) -> int:
    """How many more groups the Rollouter may start now (0: it pauses until a newer version)."""
    if min(started, dropped, trained_at_version) < 0 or dropped > started:
        raise ValueError(
            f"counts must be >= 0 with dropped <= started, got started={started}, "
            f"dropped={dropped}, trained_at_version={trained_at_version}"
        )
    return max(0, trained_at_version + budget - (started - dropped))


def within_lag(oldest_version: int, trainer_version: int, max_version_lag: int) -> bool:
    """Whether a group whose oldest token came from `oldest_version` may be trained by the
    weights of `trainer_version` (a lag equal to the bound is allowed)."""
    if max_version_lag < 0:
        raise ValueError(f"max_version_lag must be >= 0, got {max_version_lag}")
    return trainer_version - oldest_version <= max_version_lag
