"""`GroupFilter` (dynamic sampling's bookkeeping) with the real RewardManager scoring
arithmetic rows inline: which groups are kept, surplus and backfill counted, the named error
when the rounds run out, and the kept rows' rewards summarised as if only they were scored."""

from __future__ import annotations

import pytest
import torch

from hybrid.data import Batch
from hybrid.main import build_config
from hybrid.rewards import RewardManager
from hybrid.trainer.compose import compose
from hybrid.trainer.config import FilterGroupsConfig
from hybrid.trainer.sources.group_filter import DynamicSampling, FilterTally, GroupFilter

pytestmark = pytest.mark.unit


def groups(*answers: tuple[str, list[str]]) -> Batch:
    """One group per (uid, answers): the arithmetic prompt "1+1=" (ground truth 2)."""
    rows = [(uid, text) for uid, texts in answers for text in texts]
    return Batch.from_dict(
        {"responses": torch.arange(len(rows))[:, None]},
        {
            "uid": [uid for uid, _ in rows],
            "response_text": [text for _, text in rows],
            "ground_truth": ["2"] * len(rows),
            "data_source": ["arithmetic"] * len(rows),
        },
    )


def make_filter(wanted: int, rounds: int = 3, on_exhausted: str = "error") -> GroupFilter:
    config = FilterGroupsConfig(enable=True, max_num_gen_batches=rounds, on_exhausted=on_exhausted)  # type: ignore[arg-type]
    return GroupFilter(config, RewardManager(num_workers=0), wanted, "train step 7")


def test_only_groups_whose_rewards_differ_are_kept_and_the_surplus_is_counted() -> None:
    kept = make_filter(wanted=2)
    kept.add(groups(("right", ["2", "2"]), ("mixed1", ["2", "3"])))
    assert kept.missing == 1 and kept.room == 1
    kept.add(groups(("mixed2", ["1", "2"]), ("mixed3", ["2", "0"])))
    assert kept.missing == 0
    batch, scored = kept.finish()
    assert list(batch["uid"]) == ["mixed1", "mixed1", "mixed2", "mixed2"]
    assert batch["responses"][:, 0].tolist() == [2, 3, 0, 1]  # the rows themselves, in order
    scores, metrics = scored.result()
    assert scores.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert metrics["reward/mean"] == 0.5  # the kept rows' alone (all 8 scored: 5/8)
    t = kept.tally
    assert (t.groups_scored, t.groups_kept, t.groups_uninformative, t.groups_surplus) == (
        4,
        2,
        1,
        1,
    )
    assert t.not_trained == 2 and t.rounds == 2 and t.short_batches == 0
    m = t.metrics()
    assert m["filter/rounds"] == 2.0 and m["filter/uninformative_fraction"] == pytest.approx(1 / 4)


def test_the_kept_rows_metrics_are_their_own() -> None:
    kept = make_filter(wanted=1)
    kept.add(groups(("right", ["2", "2", "2"]), ("mixed", ["2", "9", "9"])))
    _, scored = kept.finish()
    scores, metrics = scored.result()
    assert scores.tolist() == [1.0, 0.0, 0.0]
    assert metrics["reward/mean"] == pytest.approx(1 / 3)  # not the 4/6 of every row scored


def test_running_out_of_rounds_is_an_error_naming_the_field() -> None:
    kept = make_filter(wanted=2, rounds=1)
    kept.add(groups(("right", ["2", "2"]), ("mixed", ["2", "1"])))
    assert kept.exhausted() and kept.room == 0
    with pytest.raises(
        RuntimeError, match=r"train step 7: .*kept 1 of the 2 .*max_num_gen_batches=1"
    ):
        kept.finish()


def test_short_completes_the_batch_with_uninformative_groups_and_counts_them() -> None:
    kept = make_filter(wanted=3, rounds=1, on_exhausted="short")
    kept.add(groups(("right", ["2", "2"]), ("mixed", ["2", "1"]), ("wrong", ["0", "0"])))
    batch, scored = kept.finish()
    assert list(batch["uid"]) == ["mixed", "mixed", "right", "right", "wrong", "wrong"]
    assert scored.result()[0].tolist() == [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    t = kept.tally
    assert (t.groups_backfilled, t.short_batches, t.groups_uninformative, t.not_trained) == (
        2,
        1,
        2,
        0,
    )


def test_tallies_add_up_over_updates() -> None:
    total = FilterTally()
    total.add(FilterTally(updates=1, rounds=3, groups_scored=12, groups_kept=4))
    total.add(FilterTally(updates=1, rounds=1, groups_scored=4, groups_kept=4))
    m = total.metrics()
    assert m["filter/rounds"] == 2.0 and m["filter/groups_scored"] == 16.0
    assert "filter/updates" not in m


def sampling(wanted: int, rounds: int = 3, on_exhausted: str = "error") -> DynamicSampling:
    config = FilterGroupsConfig(enable=True, max_num_gen_batches=rounds, on_exhausted=on_exhausted)  # type: ignore[arg-type]
    return DynamicSampling(config, RewardManager(num_workers=0), wanted)


def test_collect_asks_for_rounds_until_the_update_is_kept_and_drains_its_own_tally() -> None:
    rounds = [
        groups(("right", ["2", "2"]), ("mixed1", ["2", "3"])),
        groups(("mixed2", ["1", "2"]), ("wrong", ["0", "0"])),
    ]
    asked: list[tuple[int, int]] = []

    def next_round(round: int, room: int) -> list[Batch]:
        asked.append((round, room))
        return [rounds[round]]

    ds = sampling(wanted=2)
    batch, scored = ds.collect("train step 3", next_round)
    assert asked == [(0, 2), (1, 1)]  # the round's seed, the groups still of use
    assert list(batch["uid"]) == ["mixed1", "mixed1", "mixed2", "mixed2"]
    assert scored.result()[0].tolist() == [1.0, 0.0, 0.0, 1.0]
    m = ds.metrics()
    assert m["filter/rounds"] == 2.0 and m["filter/groups_kept"] == 2.0
    assert ds.metrics()["filter/groups_kept"] == 0.0  # drained once


def test_collect_counts_parts_by_groups_taken_and_reports_progress() -> None:
    """The queue's way: parts of any size, each take asking for the room left; the rounds are
    the update's worths taken; progress after each take and once more at the end."""
    parts = iter(
        [
            [groups(("a", ["2", "2"])), groups(("b", ["2", "1"]))],
            [groups(("c", ["0", "0"]))],
            [groups(("d", ["1", "2"]))],
        ]
    )
    rooms: list[int] = []
    seen: list[int] = []
    ds = sampling(wanted=2, rounds=2)
    batch, _ = ds.collect(
        "train step 4",
        lambda _, room: rooms.append(room) or next(parts),
        progress=lambda tally: seen.append(tally.not_trained),
    )
    assert rooms == [2, 1, 1] and seen == [1, 2, 2, 2]
    assert list(batch["uid"]) == ["b", "b", "d", "d"]
    assert ds.metrics()["filter/rounds"] == 2.0  # 4 groups taken, 2 per update


def test_collect_adds_the_tally_of_an_update_that_ran_out_of_rounds() -> None:
    ds = sampling(wanted=2, rounds=1)
    with pytest.raises(RuntimeError, match=r"train step 5: .*kept 0 of the 2"):
        ds.collect("train step 5", lambda *_: [groups(("a", ["2", "2"]), ("b", ["0", "0"]))])
    assert ds.metrics()["filter/groups_uninformative"] == 2.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.n=1", "algorithm.adv_estimator=reinforce_plus_plus"], "rollout.n >= 2"),
        (["algorithm.filter_groups.max_num_gen_batches=0"], "max_num_gen_batches must be >= 1"),
        (["algorithm.filter_groups.on_exhausted=drop"], "on_exhausted"),
        (["reward.model.path=some/rm"], "reward.model.path"),
    ],
)
def test_bad_settings_are_named(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_config(compose("config", ["algorithm.filter_groups.enable=true", *overrides]))
