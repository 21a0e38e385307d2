"""Finding a free TCP port: the one helper every rendezvous (torch.distributed's store, the
transports' broadcast groups) uses."""

from __future__ import annotations

import socket


def free_port(host: str = "") -> int:
    """A TCP port on `host` (default: every interface) that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
