"""The rendezvous port picker: ports stay out of the kernel's ephemeral range (where outgoing
connections take them between the pick and the bind) and can be bound when picked."""

from __future__ import annotations

import random
import socket

import pytest

from hybrid import ports

pytestmark = pytest.mark.unit


def test_ports_are_picked_below_the_ephemeral_range_and_are_bindable() -> None:
    low, high = ports.ephemeral_range()
    assert low <= high
    picked = [ports.free_port("127.0.0.1") for _ in range(50)]
    if low > ports._LOWEST:
        assert all(ports._LOWEST <= p < low for p in picked), picked
    for port in picked[:5]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_seeded_random_module_does_not_repeat_the_picks() -> None:
    """Two processes that seed `random` alike must not pick the same ports."""
    random.seed(0)
    first = [ports.free_port("127.0.0.1") for _ in range(8)]
    random.seed(0)
    second = [ports.free_port("127.0.0.1") for _ in range(8)]
    assert first != second


def test_a_port_taken_by_a_listener_is_not_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        # A range of one taken port: the picker falls back to a port the kernel chooses.
        monkeypatch.setattr(ports, "_LOWEST", taken)
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (taken + 1, taken + 2))
        assert ports.free_port("127.0.0.1") != taken
