"""The four states' tables, edge by edge, and the replay of whole timelines (Trinity-RFT's
four diagrams: fixed/dynamic x nccl/state-dict)."""

from __future__ import annotations

import itertools
from typing import get_args

import pytest

from hybrid.synchronizer.states import (
    Method,
    Side,
    SyncState,
    Transition,
    TransitionError,
    allowed_transitions,
    check_timeline,
    check_transition,
)

pytestmark = pytest.mark.unit

S = SyncState
START_STOP = {(S.STOPPED, S.RUNNING)} | {
    (old, S.STOPPED) for old in (S.RUNNING, S.REQUIRE_SYNC, S.WAITING_SYNC)
}
SYNC_MOVES: dict[tuple[str, str], set[tuple[SyncState, SyncState]]] = {
    ("nccl", "trainer"): {(S.RUNNING, S.WAITING_SYNC), (S.WAITING_SYNC, S.RUNNING)},
    ("nccl", "explorer"): {
        (S.RUNNING, S.REQUIRE_SYNC),
        (S.REQUIRE_SYNC, S.WAITING_SYNC),
        (S.WAITING_SYNC, S.RUNNING),
        (S.REQUIRE_SYNC, S.RUNNING),
    },
    ("memory", "trainer"): set(),
    ("memory", "explorer"): {(S.RUNNING, S.REQUIRE_SYNC), (S.REQUIRE_SYNC, S.RUNNING)},
    ("checkpoint", "trainer"): set(),
    ("checkpoint", "explorer"): {(S.RUNNING, S.REQUIRE_SYNC), (S.REQUIRE_SYNC, S.RUNNING)},
}
CASES = sorted(SYNC_MOVES)


def test_states_are_lower_case_strings() -> None:
    assert [state.value for state in S] == ["stopped", "running", "require_sync", "waiting_sync"]
    assert S("waiting_sync") is S.WAITING_SYNC


@pytest.mark.parametrize(("method", "side"), CASES)
def test_every_edge_of_every_table(method: Method, side: Side) -> None:
    expected = START_STOP | SYNC_MOVES[method, side]
    assert allowed_transitions(method, side) == expected
    for old, new in itertools.product(S, S):
        if (old, new) in expected:
            check_transition(method, side, old, new)
        else:
            with pytest.raises(TransitionError, match=f"{old.value} -> {new.value}"):
                check_transition(method, side, old, new)


def test_the_cases_cover_every_method_and_side() -> None:
    assert set(CASES) == set(itertools.product(get_args(Method), get_args(Side)))


@pytest.mark.parametrize(
    ("method", "side", "old", "new"),
    [
        ("memory", "trainer", S.RUNNING, S.WAITING_SYNC),
        ("checkpoint", "explorer", S.REQUIRE_SYNC, S.WAITING_SYNC),
        ("nccl", "trainer", S.RUNNING, S.REQUIRE_SYNC),
        ("nccl", "explorer", S.STOPPED, S.WAITING_SYNC),
        ("nccl", "explorer", S.STOPPED, S.STOPPED),
    ],
)
def test_an_illegal_move_names_method_side_move_and_the_allowed_ones(
    method: Method, side: Side, old: SyncState, new: SyncState
) -> None:
    with pytest.raises(TransitionError) as raised:
        check_transition(method, side, old, new)
    message = str(raised.value)
    assert f"{method} {side}" in message
    assert f"{old.value} -> {new.value}" in message
    for allowed_old, allowed_new in allowed_transitions(method, side):
        if allowed_old is old:
            assert f"{old.value} -> {allowed_new.value}" in message


def test_unknown_method_or_side_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="sync method"):
        allowed_transitions("gloo", "trainer")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="side"):
        allowed_transitions("nccl", "rollouter")  # type: ignore[arg-type]


def moves(*steps: tuple[Side, SyncState, SyncState]) -> list[Transition]:
    return [Transition(side=side, old=old, new=new, version=0) for side, old, new in steps]


NCCL_CYCLE = moves(
    ("trainer", S.STOPPED, S.RUNNING),
    ("explorer", S.STOPPED, S.RUNNING),
    ("explorer", S.RUNNING, S.REQUIRE_SYNC),
    ("trainer", S.RUNNING, S.WAITING_SYNC),
    ("explorer", S.REQUIRE_SYNC, S.WAITING_SYNC),
    ("trainer", S.WAITING_SYNC, S.RUNNING),
    ("explorer", S.WAITING_SYNC, S.RUNNING),
    # a dynamic request that timed out, retried at the next step
    ("explorer", S.RUNNING, S.REQUIRE_SYNC),
    ("explorer", S.REQUIRE_SYNC, S.RUNNING),
    ("explorer", S.RUNNING, S.STOPPED),
    ("trainer", S.RUNNING, S.STOPPED),
)
STATE_DICT_CYCLE = moves(
    ("trainer", S.STOPPED, S.RUNNING),
    ("explorer", S.STOPPED, S.RUNNING),
    ("explorer", S.RUNNING, S.REQUIRE_SYNC),
    ("explorer", S.REQUIRE_SYNC, S.RUNNING),
    ("explorer", S.RUNNING, S.REQUIRE_SYNC),
    ("explorer", S.REQUIRE_SYNC, S.STOPPED),
    ("trainer", S.RUNNING, S.STOPPED),
)


@pytest.mark.parametrize(
    ("method", "timeline"),
    [("nccl", NCCL_CYCLE), ("memory", STATE_DICT_CYCLE), ("checkpoint", STATE_DICT_CYCLE)],
)
def test_check_timeline_accepts_the_seed_cycles(method: Method, timeline: list[Transition]) -> None:
    check_timeline(method, timeline)


def test_check_timeline_rejects_a_memory_trainer_waiting() -> None:
    timeline = moves(("trainer", S.STOPPED, S.RUNNING), ("trainer", S.RUNNING, S.WAITING_SYNC))
    with pytest.raises(TransitionError, match=r"entry 1: memory trainer .*running -> waiting_sync"):
        check_timeline("memory", timeline)


def test_check_timeline_rejects_a_move_from_where_the_side_was_not() -> None:
    timeline = moves(("explorer", S.RUNNING, S.REQUIRE_SYNC))  # never started
    with pytest.raises(TransitionError, match=r"entry 0: explorer .* but was stopped"):
        check_timeline("nccl", timeline)


def test_a_transition_round_trips_through_json() -> None:
    move = Transition(side="explorer", old=S.REQUIRE_SYNC, new=S.RUNNING, version=3, note="x")
    data = move.to_json()
    assert data["old"] == "require_sync" and data["new"] == "running"
    assert Transition.from_json(data) == move
