"""Unit tests for `hybrid.sharding.mode.RngState`: building the rollout RNG leaves the global
RNG alone, and restoring it reproduces the draws of `torch.manual_seed(seed)`."""

from collections.abc import Iterator

import pytest
import torch

from hybrid.sharding.mode import RngState

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def keep_global_rng() -> Iterator[None]:
    saved = torch.get_rng_state()
    yield
    torch.set_rng_state(saved)


def test_construction_leaves_the_global_state_unchanged() -> None:
    torch.manual_seed(7)
    before = torch.get_rng_state()
    RngState(123)
    assert torch.equal(torch.get_rng_state(), before)


def test_construction_does_not_disturb_the_draw_sequence() -> None:
    torch.manual_seed(7)
    expected = torch.rand(2)
    torch.manual_seed(7)
    first = torch.rand(1)
    RngState(123)
    second = torch.rand(1)
    assert torch.equal(torch.cat([first, second]), expected)


def test_restoring_reproduces_manual_seed_draws() -> None:
    torch.manual_seed(123)
    expected = torch.rand(5)
    torch.manual_seed(7)
    state = RngState(123)
    RngState.restore(state.state)
    assert torch.equal(torch.rand(5), expected)
    RngState.restore(state.state)  # the saved state is not consumed by drawing
    assert torch.equal(torch.rand(5), expected)


def test_different_seeds_give_different_states() -> None:
    assert not torch.equal(RngState(1).state[0], RngState(2).state[0])


def test_capture_and_restore_round_trip() -> None:
    torch.manual_seed(5)
    saved = RngState.capture()
    expected = torch.rand(3)
    torch.rand(10)
    RngState.restore(saved)
    assert torch.equal(torch.rand(3), expected)
