"""Suite-wide fixtures: one Ray cluster per session, the `gpu` marker's skip rule, and the
suite's one environment setting (no torch.compile)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybrid.heap import freeze_heap

REPO_ROOT = Path(__file__).resolve().parents[1]

pytest_plugins = ["tests.longest_first"]

# vLLM compiles two of its sampler ops with inductor at an engine's first generation: about
# three seconds of CPU per engine start (and g++ runs on a cold inductor cache), paid again
# by every worker, explorer and child run of the suite. Nothing in the suite tests
# compilation, and the eager ops compute the same; set before any Ray cluster or child process
# starts, so that every process of the suite inherits it. A test of compilation unsets it.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA: no GPU visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The collected modules and items live as long as the session: out of every later full
    collection (about 0.3 s each in a process that imported torch and transformers)."""
    freeze_heap()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A local Ray cluster for the whole session, shut down at the end.

    Logical CPUs are oversubscribed (8 slots on a 2-core machine) so that a test can start a
    group of its own next to the shared one; the workers mostly wait on each other anyway.
    Test modules hold Worker classes, so the workers need the repo root on their path.
    """
    import ray

    from hybrid.controller import ensure_ray

    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    started_here = not ray.is_initialized()
    ensure_ray(num_cpus=8)
    yield
    if started_here:
        ray.shutdown()
