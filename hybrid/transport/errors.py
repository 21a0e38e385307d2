"""Errors of the weight transports, each naming what failed and where (tensor, file, peer)."""

from __future__ import annotations


class TransportError(RuntimeError):
    """Weights could not be moved: a peer timed out or died, or a file or manifest is bad."""


class TransportChecksumError(TransportError):
    """A received tensor's bytes differ from the digest the sender computed."""

    def __init__(self, name: str, expected: str, actual: str, source: str | None = None) -> None:
        where = f" ({source})" if source else ""
        super().__init__(
            f"checksum mismatch for tensor {name!r}{where}: expected {expected}, got {actual}"
        )
        self.name = name
        self.expected = expected
        self.actual = actual
        self.source = source

    def __reduce__(self) -> tuple[type, tuple[str, str, str, str | None]]:
        # Ray pickles exceptions across processes: rebuild from the fields, not the message.
        return (type(self), (self.name, self.expected, self.actual, self.source))
