"""Finding a free TCP port: the one helper every rendezvous (torch.distributed's store, the
transports' broadcast groups) uses.

A port is free only at the moment it is checked; between the check and the store's bind
another socket can take it. The kernel hands out the ports of its ephemeral range to every
outgoing connection (gloo opens one per pair of ranks, Ray's clients many more), so a port
picked from that range is the one most likely to be taken in that window. Ports are picked at
random below the ephemeral range instead, where only an explicit bind lands, and above the
range Ray gives its workers (10002-19999 by default).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 20000
"""Above Ray's default worker ports (10002-19999)."""

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_TRIES = 64
_PICKER = random.SystemRandom()
"""Not the `random` module's state: a test that seeds it must not make two processes pick
the same ports."""


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' ports (Linux's default where unreadable)."""
    try:
        low, high = _EPHEMERAL_RANGE.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "") -> int:
    """A TCP port on `host` (default: every interface) that was free a moment ago: one below
    the ephemeral range where the kernel leaves room there, else one the kernel picks."""
    low, _ = ephemeral_range()
    candidates = range(_LOWEST, low)
    for _ in range(_TRIES if candidates else 0):
        try:
            return _bind(host, _PICKER.choice(candidates))
        except OSError:  # taken: another pick
            continue
    return _bind(host, 0)


def _bind(host: str, port: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, port))
        bound: int = sock.getsockname()[1]
        return bound
