"""A subprocess sandbox for programs a model wrote: time, CPU, memory and output limits, no
network, a scratch directory per run (hybrid/sandbox/runner.py)."""

from hybrid.sandbox.limits import SandboxLimits, with_overrides
from hybrid.sandbox.result import SandboxResult, SandboxUnavailable
from hybrid.sandbox.runner import network_isolation_error, run

__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "network_isolation_error",
    "run",
    "with_overrides",
]
