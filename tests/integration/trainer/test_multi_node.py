"""The colocated engine across nodes: a two-node Ray cluster on this machine
(`ray.cluster_utils.Cluster`, one CPU per node) and the real entry point joining it with
`trainer.nnodes=2`. One worker lands on each node; the run computes what a single-node run of
the same seed computes; its checkpoint resumes on one node; LoRA and HSDP work across the
nodes; a node that leaves mid-run ends the run with an error naming it.

Every run on the cluster is `python -m hybrid.main` in a subprocess: the cluster's driver must
not be this pytest process, which is already connected to the session's own cluster (where the
one-node reference runs, in this process)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

from hybrid.memory.records import read_records
from hybrid.trainer.checkpoints import complete_checkpoints
from hybrid.trainer.loop import Driver
from tests.integration.trainer.helpers import (
    UNREPEATABLE,
    child_env,
    config_from_overrides,
    read_metrics,
    small_run_overrides,
    write_assets,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

# bf16 noise between two runs that do the same arithmetic in another process layout; on a CPU
# without bf16 (fp32 compute) the runs measured identical.
LOSS_TOL = 2e-3
LOGPROB_DIFF_MAX = 0.05


def start_cluster() -> tuple[Cluster, list[str]]:
    """A head node and one more, one CPU each; (cluster, node ids head first)."""
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 1})
    second = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    assert cluster.head_node is not None
    return cluster, [cluster.head_node.node_id, second.node_id]


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[tuple[str, list[str]]]:
    cluster, node_ids = start_cluster()
    yield cluster.address, node_ids
    cluster.shutdown()


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_assets(tmp_path_factory.mktemp("multi_node"))


def overrides(assets: Path, output_dir: Path, *extra: str) -> list[str]:
    return small_run_overrides(assets, output_dir, *extra)


def launch(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "hybrid.main", *args],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_main(args: list[str], timeout_s: float = 400) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "hybrid.main", *args],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def on_two_nodes(address: str) -> tuple[str, ...]:
    return (f"trainer.ray_address={address}", "trainer.nnodes=2", "trainer.n_gpus_per_node=1")


def nodes_by_rank(output_dir: Path) -> dict[int, str]:
    """Each rank's node, as its memory ledger recorded it."""
    nodes: dict[int, set[str]] = {}
    for record in read_records(output_dir / "memory.jsonl"):
        nodes.setdefault(record.rank, set()).add(record.node)
    assert all(len(names) == 1 for names in nodes.values()), nodes
    return {rank: names.pop() for rank, names in nodes.items()}


def assert_same_training(a: list[dict], b: list[dict], steps: int) -> None:
    for step in range(steps):
        assert a[step]["reward/mean"] == b[step]["reward/mean"], step
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
            assert abs(a[step][key] - b[step][key]) <= LOSS_TOL, (
                step,
                key,
                a[step][key],
                b[step][key],
            )


@pytest.fixture(scope="module")
def single_node_run(
    ray_cluster: None, assets: Path, tmp_path_factory: pytest.TempPathFactory
) -> list[dict]:
    """The reference: the same 3 steps, seed and worker count on one node (in this process,
    on the session's Ray cluster)."""
    out = tmp_path_factory.mktemp("one_node") / "run"
    # Plain FSDP (auto would replicate the tiny model on a CPU): HSDP against sharding.
    one_node = overrides(assets, out, "trainer.total_steps=3", "actor.hsdp_replicas=1")
    Driver(config_from_overrides(one_node)).fit()
    return read_metrics(out)


@pytest.fixture(scope="module")
def two_node_run(
    two_nodes: tuple[str, list[str]], assets: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str, list[dict]]:
    """3 HSDP steps, 2 replicas x 1 shard (each node holds the whole model and only gradients
    cross), a checkpoint at step 2: (output dir, the entry point's stdout, metrics)."""
    address, _ = two_nodes
    out = tmp_path_factory.mktemp("two_nodes") / "run"
    done = run_main(
        overrides(
            assets,
            out,
            "trainer.total_steps=3",
            "trainer.save_freq=2",
            "actor.hsdp_replicas=2",
            *on_two_nodes(address),
        )
    )
    return out, done.stdout, read_metrics(out)


@pytest.mark.full  # by default the split run of test_split.py trains FSDP across two nodes
def test_three_hsdp_steps_on_two_nodes_match_one_node(
    two_nodes: tuple[str, list[str]],
    two_node_run: tuple[Path, str, list[dict]],
    single_node_run: list[dict],
) -> None:
    """Two HSDP replicas on two nodes train as one node does."""
    _, node_ids = two_nodes
    out, stdout, metrics = two_node_run
    assert "2 nodes x 1" in stdout  # the start-up summary says where the workers are
    assert "HSDP 2 replicas" in stdout

    # One worker on each node, by Ray's node ids.
    placed = nodes_by_rank(out)
    assert sorted(placed) == [0, 1]
    assert sorted(name.split("(id ")[1].rstrip(")") for name in placed.values()) == sorted(
        node_id[:8] for node_id in node_ids
    )

    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:  # the engines on both nodes were synced: max over ranks
        assert m["rollout/logprob_diff_max"] < LOGPROB_DIFF_MAX, m["step"]
    assert_same_training(metrics, single_node_run, steps=3)


@pytest.mark.full  # by default a run resumes in test_sft.py (and test_fsdp.py bit for bit)
def test_a_two_node_hsdp_checkpoint_resumes_on_one_node(
    assets: Path, two_node_run: tuple[Path, str, list[dict]], tmp_path: Path
) -> None:
    """The checkpoint two HSDP nodes wrote resumes as plain FSDP on one node."""
    out, _, metrics = two_node_run
    # The step-2 checkpoint, taken on two nodes, resumes on one: step 3 as the two-node run.
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_3")
    (resumed / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics[:2]))
    assert [step for step, _ in complete_checkpoints(resumed)] == [2]
    run_main(overrides(assets, resumed, "trainer.total_steps=3", "actor.hsdp_replicas=1"))
    after = read_metrics(resumed)
    assert [m["step"] for m in after] == [1, 2, 3]
    for key, value in metrics[2].items():
        if not key.startswith(UNREPEATABLE) and not key.startswith("sync/"):
            assert after[2][key] == pytest.approx(value, abs=LOSS_TOL), key


@pytest.mark.full  # LoRA's adapter syncs run by default in test_lora_grpo.py
def test_lora_on_two_nodes_syncs_adapters_only(
    two_nodes: tuple[str, list[str]], assets: Path, tmp_path: Path
) -> None:
    address, _ = two_nodes
    out = tmp_path / "lora"
    run_main(
        overrides(
            assets,
            out,
            "trainer.total_steps=2",
            "model.lora.rank=8",
            "actor.optim.lr=1e-2",
            *on_two_nodes(address),
        )
    )
    metrics = read_metrics(out)
    assert len(set(nodes_by_rank(out).values())) == 2
    first, second = metrics
    # Step 1 sends the base and the adapters; step 2 only the adapters (A and B of 7
    # projections x 2 layers).
    assert second["sync/tensors"] == 28 < first["sync/tensors"]
    for m in metrics:
        assert m["rollout/logprob_diff_max"] < LOGPROB_DIFF_MAX, m["step"]


@pytest.mark.full  # two nodes run by default in test_split.py (the trainers' FSDP group)
def test_plain_fsdp_across_two_nodes_trains_as_one_node(
    two_nodes: tuple[str, list[str]],
    assets: Path,
    single_node_run: list[dict],
    tmp_path: Path,
) -> None:
    """One shard per node: parameters and gradients cross between the nodes."""
    address, _ = two_nodes
    out = tmp_path / "fsdp"
    run_main(overrides(assets, out, "trainer.total_steps=2", *on_two_nodes(address)))
    metrics = read_metrics(out)
    assert len(set(nodes_by_rank(out).values())) == 2
    for m in metrics:
        assert m["rollout/logprob_diff_max"] < LOGPROB_DIFF_MAX, m["step"]
    assert_same_training(metrics, single_node_run, steps=2)


@pytest.mark.full  # a dead worker ending the run runs by default in test_split.py
def test_a_node_that_leaves_ends_the_run_naming_it(assets: Path, tmp_path: Path) -> None:
    cluster, node_ids = start_cluster()
    try:
        out = tmp_path / "killed"
        child = launch(
            overrides(assets, out, "trainer.total_steps=500", *on_two_nodes(cluster.address))
        )
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
            assert child.poll() is None, child.communicate()[1][-5000:]
            assert time.monotonic() < deadline, "the run did not reach step 2"
            time.sleep(0.5)
        second = cluster.list_all_nodes()[1]
        assert second.node_id == node_ids[1]
        killed = time.monotonic()
        cluster.remove_node(second, allow_graceful=False)  # its raylet and workers die
        try:
            _, stderr = child.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            pytest.fail("the driver did not exit within 60 s of the node leaving")
        assert time.monotonic() - killed < 60
        assert child.returncode != 0
        assert "WorkerDiedError" in stderr, stderr[-5000:]
        assert f"(id {node_ids[1][:8]})" in stderr, stderr[-5000:]
    finally:
        cluster.shutdown()


def test_an_address_nobody_answers_at_is_named(assets: Path, tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    child = launch(overrides(assets, tmp_path / "run", f"trainer.ray_address=127.0.0.1:{port}"))
    _, stderr = child.communicate(timeout=120)
    assert child.returncode != 0
    assert f"trainer.ray_address='127.0.0.1:{port}'" in stderr, stderr[-3000:]
    assert "no Ray cluster answers" in stderr
    assert time.monotonic() - started < 60
