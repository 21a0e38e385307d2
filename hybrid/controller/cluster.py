"""Joining or starting the Ray cluster, in one place.

Embedded by default: the first use starts a local cluster sized to the CPUs and GPUs Ray finds.
An explicit address (config) or RAY_ADDRESS joins an existing cluster instead.
"""

from __future__ import annotations

import os

import ray


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Initialise Ray once per driver process; later calls are no-ops."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, log_to_driver=True)
        return
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
