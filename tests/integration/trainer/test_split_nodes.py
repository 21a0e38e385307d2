"""The split placement across two Ray nodes: a `ray.cluster_utils.Cluster` of two nodes with
one CPU each, so the explorer group (one worker) and the trainer group (one worker) must land
on different nodes; each transport brings the weights across. The default run covers the
object store (test_split.py's on-policy memory run); the broadcast group and the shared
directory run here, under `make test-full`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.trainer.helpers import read_metrics, write_assets
from tests.integration.trainer.test_multi_node import start_cluster
from tests.integration.trainer.test_split import LOGPROB_DIFF_MAX, STEPS, check_run, run_split

pytestmark = [pytest.mark.integration, pytest.mark.full, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[str]:
    cluster, _ = start_cluster()
    yield cluster.address
    cluster.shutdown()


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_assets(tmp_path_factory.mktemp("split_nodes"))


def run_across(two_nodes: str, assets: Path, out: Path, method: str) -> None:
    done = run_split(assets, out, f"sync.method={method}", f"trainer.ray_address={two_nodes}")
    check_run(out, method, "fixed", 0)
    metrics = read_metrics(out)
    assert len(metrics) == STEPS
    assert all(m["rollout/logprob_diff_max"] < LOGPROB_DIFF_MAX for m in metrics)
    # One CPU per node: the explorer and the trainer group sit on different nodes.
    placement = json.loads((out / "placement.json").read_text())
    assert len(placement["explorer"]) == len(placement["trainer"]) == 1
    assert placement["explorer"] != placement["trainer"], placement
    assert done.returncode == 0


@pytest.mark.parametrize("method", ["nccl", "checkpoint"])
def test_other_transports_across_two_nodes(
    two_nodes: str, assets: Path, tmp_path: Path, method: str
) -> None:
    run_across(two_nodes, assets, tmp_path / method, method)
