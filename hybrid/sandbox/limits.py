"""What a sandboxed program may use: wall and CPU time, memory, output, network.

Pure data, no processes (hybrid/sandbox/runner.py enforces it). Limits come from module
defaults and, for the `code` reward, from a row's `extra_info["sandbox"]`, so a bad value must
fail here with its field named rather than as an odd rlimit error in a child process.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from numbers import Real
from typing import Any, Literal

Network = Literal["deny", "allow"]
NETWORKS: tuple[Network, ...] = ("deny", "allow")


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandbox run."""

    time_s: float = 10.0
    """Wall time: past it the program and what it started are killed (SIGKILL; a process that
    left its session only where there is a PID namespace: hybrid/sandbox/runner.py)."""
    memory_mb: int = 1024
    """Address space (RLIMIT_AS) in MiB; past it allocations fail (Python: MemoryError)."""
    output_bytes: int = 1 << 20
    """stdout and stderr kept together, in arrival order; the rest is dropped (`truncated`)."""
    cpu_s: float | None = None
    """CPU time (RLIMIT_CPU, whole seconds, rounded up); None: as `time_s`. Past it the kernel
    sends SIGXCPU, which ends a Python program."""
    network: Network = "deny"
    """deny: the program runs in its own user and network namespaces, with no interface but a
    downed loopback; where the kernel refuses those, runs fail with `SandboxUnavailable`.
    allow: no network isolation at all (the host's network, as the caller has it); user and
    PID namespaces only where the kernel grants them."""

    def __post_init__(self) -> None:
        _check_positive("time_s", self.time_s)
        _check_positive("memory_mb", self.memory_mb, whole=True)
        _check_positive("output_bytes", self.output_bytes, whole=True)
        if self.cpu_s is not None:
            _check_positive("cpu_s", self.cpu_s)
        if self.network not in NETWORKS:
            raise ValueError(
                f"sandbox.network must be one of {list(NETWORKS)}, got {self.network!r}"
            )

    @property
    def cpu_limit_s(self) -> int:
        """RLIMIT_CPU counts whole seconds: the CPU limit rounded up, at least 1."""
        return max(1, math.ceil(self.time_s if self.cpu_s is None else self.cpu_s))


def _check_positive(name: str, value: Any, whole: bool = False) -> None:
    # bool is an int to Python, but `time_s=True` is a mistake, not one second.
    ok = isinstance(value, Real) and not isinstance(value, bool)
    if ok:
        number = float(value)
        ok = math.isfinite(number) and number > 0 and (not whole or number.is_integer())
    if not ok:
        kind = "positive whole number" if whole else "positive number"
        raise ValueError(f"sandbox.{name} must be a {kind}, got {value!r}")


def with_overrides(base: SandboxLimits, overrides: Any, where: str) -> SandboxLimits:
    """`base` with the fields that `overrides` (a mapping of field names; `where` names it in
    errors) sets. A None value leaves the field as it is: a Parquet struct column gives every
    row every key, None where the row set none."""
    if overrides is None:
        return base
    if not isinstance(overrides, Mapping):
        raise ValueError(
            f"{where} must be a mapping of sandbox limits, got a {type(overrides).__name__}"
        )
    known = [field.name for field in dataclasses.fields(SandboxLimits)]
    unknown = sorted(str(key) for key in overrides if key not in known)
    if unknown:
        raise ValueError(f"{where} has unknown field(s) {unknown}; known: {known}")
    changes = {str(key): value for key, value in overrides.items() if value is not None}
    try:
        return dataclasses.replace(base, **changes)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
