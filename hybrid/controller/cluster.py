"""Joining or starting the Ray cluster, in one place.

Embedded by default: the first use starts a local cluster sized to the CPUs and GPUs Ray finds.
An explicit address (config) or RAY_ADDRESS joins an existing cluster instead.

A local cluster dies with its driver, even a SIGKILLed one: hybrid/controller/reaper.py stops
the processes Ray itself leaves running. A joined cluster is never touched.

`quiet`: the driver shows Ray's own errors only, not its start-up notices (Ray's session logs
under /tmp/ray keep everything). Worker output still flows to the driver (log_to_driver), so a
worker that points its output at a log file (WorkerDict with a log_dir) decides what is shown.
"""

from __future__ import annotations

import logging
import os
import socket
import sys

import ray

from hybrid.controller.reaper import Reaper

_reaper: Reaper | None = None
"""The reaper of the local cluster this driver started, held for the driver's lifetime: the
reaper acts when its pipe closes, so dropping this handle would stop a live cluster."""

CONNECT_TIMEOUT_S = 5.0
"""How long the driver waits for a Ray cluster's GCS port to accept a connection (Ray itself
retries an unreachable address for minutes)."""


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raise ConnectionError unless something listens at `host:port` (other forms, `auto`
    and `ray://`, are left to Ray, which answers them quickly)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise ConnectionError(
            f"no Ray cluster answers at {address} ({error}); start one with `ray start --head` "
            "on its first node, or leave the address unset to start a local cluster"
        ) from None


def ensure_ray(
    address: str | None = None, num_cpus: int | None = None, quiet: bool = False
) -> None:
    """Initialise Ray once per driver process; later calls are no-ops. An address nobody
    answers at raises ConnectionError within CONNECT_TIMEOUT_S."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    level = logging.ERROR if quiet else logging.INFO
    if address:
        check_reachable(address)
        ray.init(address=address, log_to_driver=True, logging_level=level)
        return
    _start_local_cluster(num_cpus, level)


def _start_local_cluster(num_cpus: int | None, level: int) -> None:
    """Start a cluster of our own, even when this machine already runs one (`ray start`,
    another run's head node): joining one is what an explicit address is for. On Linux a
    reaper stops what Ray leaves of it once this driver is gone, SIGKILLed included."""
    global _reaper
    if _reaper is not None:  # an earlier cluster, since shut down: its reaper may go
        _reaper.release()
        _reaper = None
    if sys.platform != "linux":  # the reaper finds the cluster's processes through /proc
        _init_local(num_cpus, level)
        return
    reaper = Reaper.start()
    try:
        with reaper.marking():
            _init_local(num_cpus, level)
    except BaseException:
        reaper.release()
        raise
    reaper.cluster_started()
    _reaper = reaper


def _init_local(num_cpus: int | None, level: int) -> None:
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=True,
        logging_level=level,
    )
