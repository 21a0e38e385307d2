"""Joining or starting the Ray cluster, in one place.

Embedded by default: the first use starts a local cluster sized to the CPUs and GPUs Ray finds.
An explicit address (config) or RAY_ADDRESS joins an existing cluster instead.

`quiet`: the driver shows Ray's own errors only, not its start-up notices (Ray's session logs
under /tmp/ray keep everything). Worker output still flows to the driver (log_to_driver), so a
worker that points its output at a log file (WorkerDict with a log_dir) decides what is shown.
"""

from __future__ import annotations

import logging
import os

import ray


def ensure_ray(
    address: str | None = None, num_cpus: int | None = None, quiet: bool = False
) -> None:
    """Initialise Ray once per driver process; later calls are no-ops."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    level = logging.ERROR if quiet else logging.INFO
    if address:
        ray.init(address=address, log_to_driver=True, logging_level=level)
        return
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True, logging_level=level)
