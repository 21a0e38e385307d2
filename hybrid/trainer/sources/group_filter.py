"""DAPO's dynamic sampling, as every source applies it: score the groups as they finish, keep
those whose rewards differ, and ask for more until one update's worth is kept.

`DynamicSampling.collect` is the one round loop: it asks the source's "next part" callable for
more groups (a colocated or split generation round, a fully-async take from the queue) while
groups are missing and the rounds allow, and returns the kept groups with their rule rewards
already scored (the train step does not score them again). It also keeps the tally of every
update since the step's metrics, which it drains itself. `GroupFilter` is one update's
bookkeeping: informative groups beyond the need are surplus, dropped and counted (a later step
trains newer samples). When the rounds run out first, algorithm.filter_groups.on_exhausted
decides: a named error, or a short batch completed with the uninformative groups, counted.
Every group a round produced is in exactly one of kept, uninformative, surplus (`FilterTally`).

A round is an update's worth of groups: the rounds run out once max_num_gen_batches x the
update's groups were taken (a generation round brings exactly that many; the queue's parts
are counted the same way).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

from hybrid.algorithms.group_filter import group_rows, informative_groups
from hybrid.data import Batch
from hybrid.rewards.manager import RewardManager, ScoredRows
from hybrid.trainer.config import FilterGroupsConfig


@dataclass
class FilterTally:
    """Counts of the groups the filter saw, summed over updates until drained."""

    updates: int = 0
    rounds: int = 0
    groups_scored: int = 0
    groups_kept: int = 0
    """Informative groups trained on."""
    groups_uninformative: int = 0
    """Groups whose rewards were all equal (those backfilled into a short batch included)."""
    groups_surplus: int = 0
    """Informative groups beyond the update's need: not trained on."""
    groups_backfilled: int = 0
    """Uninformative groups that completed a short batch (on_exhausted=short)."""
    short_batches: int = 0

    @property
    def not_trained(self) -> int:
        """Groups generated but left out of training: uninformative ones not backfilled, and
        the surplus."""
        return self.groups_uninformative - self.groups_backfilled + self.groups_surplus

    def add(self, other: FilterTally) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def metrics(self) -> dict[str, float]:
        """filter/ metrics: counts summed, rounds per update, the share of all-equal groups
        among those generated (what the policy's state makes of the task)."""
        out = {f"filter/{f.name}": float(getattr(self, f.name)) for f in fields(self)}
        out.pop("filter/updates")
        out["filter/rounds"] = self.rounds / self.updates if self.updates else 0.0
        scored = self.groups_scored
        out["filter/uninformative_fraction"] = self.groups_uninformative / scored if scored else 0.0
        return out


NextPart = Callable[[int, int], Sequence[Batch]]
"""`next_part(round, room)`: more whole groups, in one part or several: `round` is the number
of rounds taken so far (a generation round's prompt seeds), `room` the most groups still of
use (the groups missing, within the rounds' budget)."""


class DynamicSampling:
    """A source's dynamic sampling: the settings, the rule rewards, the groups per update, and
    the tally of the updates since the last `metrics` (split collects on its explorer thread
    while the trainer drains: one lock)."""

    def __init__(self, config: FilterGroupsConfig, rewards: RewardManager, groups: int) -> None:
        self.config = config
        self.rewards = rewards
        self.groups = groups
        self._tally = FilterTally()
        self._lock = threading.Lock()

    def collect(
        self,
        where: str,
        next_part: NextPart,
        progress: Callable[[FilterTally], None] | None = None,
    ) -> tuple[Batch, ScoredRows]:
        """One update's groups and their scored rule rewards, from parts of `next_part` until
        `groups` informative groups are kept or the rounds run out (`where`: the update, for
        the error). `progress(tally)` after each part's groups are sorted, and once more at
        the end (the queue hands the places of the groups left out back at once)."""
        kept = GroupFilter(self.config, self.rewards, self.groups, where)
        while kept.missing and not kept.exhausted():
            for part in next_part(kept.tally.rounds, kept.room):
                kept.add(part)
            if progress is not None:
                progress(kept.tally)
        try:
            return kept.finish()
        finally:
            with self._lock:
                self._tally.add(kept.tally)
            if progress is not None:
                progress(kept.tally)  # fewer left out if backfilled

    def metrics(self) -> dict[str, float]:
        """filter/ metrics of the updates since the last call."""
        with self._lock:
            tally, self._tally = self._tally, FilterTally()
        return tally.metrics()


class GroupFilter:
    def __init__(
        self,
        config: FilterGroupsConfig,
        rewards: RewardManager,
        wanted: int,
        where: str,
    ) -> None:
        """`wanted`: the groups one update trains; `where`: the update, for the error."""
        self.config, self.rewards = config, rewards
        self.wanted, self.where = wanted, where
        self.tally = FilterTally(updates=1)
        self._budget = config.max_num_gen_batches * wanted
        """Groups the rounds may take in all."""
        self._kept: list[tuple[Batch, ScoredRows]] = []
        self._aside: list[tuple[Batch, ScoredRows]] = []
        """Uninformative groups, one each, in arrival order (a short batch's backfill)."""

    @property
    def missing(self) -> int:
        return self.wanted - self.tally.groups_kept

    @property
    def room(self) -> int:
        """The most groups a next part may usefully bring: those missing, within the budget."""
        return min(self.missing, self._budget - self.tally.groups_scored)

    def add(self, part: Batch) -> None:
        """Score `part` (whole groups) now and sort its groups."""
        scored = self.rewards.score_rows(part)
        uids = [str(uid) for uid in part["uid"]]
        rows_of = group_rows(uids)
        keep: list[int] = []
        t = self.tally
        for uid, informative in informative_groups(uids, scored.scores).items():
            t.groups_scored += 1
            rows = rows_of[uid]
            if not informative:
                t.groups_uninformative += 1
                self._aside.append((part[rows], scored.select(rows)))
            elif t.groups_kept < self.wanted:
                t.groups_kept += 1
                keep.extend(rows)
            else:
                t.groups_surplus += 1
        if keep:
            self._kept.append((part[keep], scored.select(keep)))
        t.rounds = -(-t.groups_scored // self.wanted)  # update's worths taken, rounded up

    def exhausted(self) -> bool:
        """The rounds are spent."""
        return self.tally.groups_scored >= self._budget

    def finish(self) -> tuple[Batch, ScoredRows]:
        """The update's groups (kept first, then any backfill) and their scored rewards."""
        t, missing = self.tally, self.missing
        parts = list(self._kept)
        if missing:
            if self.config.on_exhausted == "error" or len(self._aside) < missing:
                raise RuntimeError(
                    f"{self.where}: dynamic sampling kept {t.groups_kept} of the {self.wanted} "
                    f"groups it needs after {t.rounds} rounds (algorithm.filter_groups."
                    f"max_num_gen_batches={self.config.max_num_gen_batches}): {t.groups_scored} "
                    f"groups scored, {t.groups_uninformative} with all-equal rewards. Raise "
                    "max_num_gen_batches, or set algorithm.filter_groups.on_exhausted=short to "
                    "train on a batch completed with uninformative groups"
                )
            parts.extend(self._aside[:missing])
            t.groups_backfilled += missing
            t.short_batches += 1
        batch = parts[0][0] if len(parts) == 1 else Batch.concat([b for b, _ in parts])
        scored = parts[0][1] if len(parts) == 1 else ScoredRows.concat([s for _, s in parts])
        return batch, scored
