"""trainer.mode=split end to end: explorer and trainer workers, the three weight
transports, both sync styles, the seed's state machine read back from sync_timeline.jsonl.

Each run is `python -m hybrid.main` in a subprocess (its own Ray cluster), 1 explorer + 1
trainer worker on the tiny demo model. The engine starts from vLLM's dummy (random) weights,
so a transport that moves nothing fails the log-prob check of step 1. By default: the
on-policy nccl run across two nodes and the explorer kill (memory, one step off); the
fully-async race (test_fully_async.py) carries the checkpoint transport. The style x transport
matrix runs by default on the toy engine (test_driver_matrix.py); `make test-full` runs it here
on vLLM.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybrid.synchronizer.states import Transition, check_timeline
from tests.integration.trainer.helpers import (
    MOVING,
    child_env,
    read_metrics,
    small_run_overrides,
    without_leak_report,
    write_assets,
)
from tests.integration.trainer.test_multi_node import start_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

LOGPROB_DIFF_MAX = 0.05  # bf16 noise; fp32 engines measured 0
STEPS = 3
# (method, style, offset) cells beyond the on-policy run of each transport (real engine: full).
FULL_CELLS = [
    ("checkpoint", "dynamic_by_explorer", 0),
    ("memory", "fixed", 1),  # also run (killed after step 2) by the default explorer-kill test
    ("nccl", "dynamic_by_explorer", 0),
    ("memory", "dynamic_by_explorer", 0),
    ("nccl", "fixed", 1),
    ("checkpoint", "fixed", 1),
]
TRANSPORTS = ("memory", "checkpoint", "nccl")
ACROSS_NODES = "nccl"
"""The on-policy run of the default set: the broadcast between two Ray nodes."""


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_assets(tmp_path_factory.mktemp("split"))


def split_args(assets: Path, out: Path, *extra: str) -> list[str]:
    return small_run_overrides(
        assets,
        out,
        f"trainer.total_steps={STEPS}",
        "trainer.mode=split",
        "sync.timeout_s=60",
        "sync.verify_checksum=true",
        f"sync.checkpoint_dir={out / 'weights'}",
        # Sharded, not replicated as auto would on a CPU: the trainers' gather of sharded
        # DTensors, across two nodes in the on-policy run, is what GPUs run.
        "actor.hsdp_replicas=1",
        *extra,
    )


def run_split(assets: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "hybrid.main", *split_args(assets, out, *extra)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def timeline(out: Path) -> list[Transition]:
    lines = (out / "sync_timeline.jsonl").read_text().splitlines()
    return [Transition.from_json(json.loads(line)) for line in lines]


def check_run(out: Path, method: str, style: str, offset: int, steps: int = STEPS) -> list[dict]:
    metrics = [m for m in read_metrics(out) if m["step"] > 0]  # step 0: validation only
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    # Step 1 trains on samples of version 0, which the transport had to bring.
    assert metrics[0]["rollout/fresh_tokens"] > 0
    for m in metrics:
        if m["rollout/fresh_tokens"]:
            assert m["rollout/logprob_diff_max"] < LOGPROB_DIFF_MAX, m["step"]
        bound = offset if style == "fixed" else 1  # sync.max_staleness defaults to 1
        assert m["sync/version_lag_max"] <= bound, m
    # Every version the explorer left was checked against the trainer's log-probs under it.
    assert sum(m["sync/probes"] for m in metrics) >= 1
    assert all(m["sync/probe_logprob_diff_max"] < LOGPROB_DIFF_MAX for m in metrics)
    events = timeline(out)
    check_timeline(method, events)  # every move is one of the seed's for this transport
    sides = {e.side for e in events}
    assert sides == {"trainer", "explorer"}
    explorer_moves = [(e.old.value, e.new.value) for e in events if e.side == "explorer"]
    if method == "nccl":
        assert ("require_sync", "waiting_sync") in explorer_moves
        assert any(e.side == "trainer" and e.new.value == "waiting_sync" for e in events)
    else:
        assert ("running", "require_sync") in explorer_moves
        assert not any(e.side == "trainer" and e.new.value == "waiting_sync" for e in events)
    return metrics


def run_cell(
    assets: Path, out: Path, method: str, style: str, offset: int, *extra: str
) -> list[dict]:
    run_split(
        assets, out, f"sync.method={method}", f"sync.style={style}", f"sync.offset={offset}", *extra
    )
    metrics = check_run(out, method, style, offset)
    if method == "checkpoint":
        # sync.keep_versions=2: the newest two published versions (one step off, the last
        # may go unpublished when the explorer has already finished).
        kept = sorted(int(p.name[1:]) for p in (out / "weights").iterdir())
        assert len(kept) == 2 and kept[1] == kept[0] + 1 and kept[1] >= 1, kept
    return metrics


class OnPolicyRuns:
    """fixed, interval 1, offset 0 over each transport, same seed, each run when first asked
    for, with MOVING (the digests must tell the versions apart). The nccl run goes across a three-node Ray cluster (one CPU per node: the
    explorer on one, two trainers on the others); the other two on one node (both across nodes:
    test_split_nodes.py, full)."""

    def __init__(self, assets: Path, root: Path) -> None:
        self.assets, self.root = assets, root

    def items(self) -> list[tuple[str, Path]]:
        return [(method, self[method]) for method in TRANSPORTS]

    def __getitem__(self, method: str) -> Path:
        out = self.root / method
        if out.exists():
            return out
        if method != ACROSS_NODES:
            run_cell(self.assets, out, method, "fixed", 0, MOVING)
            return out
        cluster, _ = start_cluster()
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        nodes = ("trainer.nnodes=3", "trainer.n_gpus_per_node=1", "trainer.num_workers=3")
        try:
            run_cell(
                self.assets,
                out,
                method,
                "fixed",
                0,
                f"trainer.ray_address={cluster.address}",
                *nodes,
                "trainer.num_trainer_workers=2",
                MOVING,
            )
        finally:
            cluster.shutdown()
        placement = json.loads((out / "placement.json").read_text())
        # One explorer node; the trainers' FSDP group spans the two other nodes.
        explorer, trainer = set(placement["explorer"]), set(placement["trainer"])
        assert len(explorer) == 1 and len(trainer) == 2 and not explorer & trainer, placement
        return out


@pytest.fixture(scope="module")
def on_policy_runs(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> OnPolicyRuns:
    return OnPolicyRuns(assets, tmp_path_factory.mktemp("on_policy"))


@pytest.mark.parametrize(
    "method",
    [m if m == ACROSS_NODES else pytest.param(m, marks=pytest.mark.full) for m in TRANSPORTS],
)
def test_on_policy_means_every_consumed_token_has_lag_zero(
    on_policy_runs: OnPolicyRuns, method: str
) -> None:
    metrics = read_metrics(on_policy_runs[method])
    assert all(m["sync/version_lag_max"] == 0 for m in metrics)
    # ... so every token is checked: the engine's log-probs are the trainer's.
    assert all(m["rollout/fresh_tokens"] > 0 for m in metrics)


@pytest.mark.full
def test_three_transports_give_identical_engine_weights(on_policy_runs: OnPolicyRuns) -> None:
    """Versions 0..2 are the same bytes in the engine whichever way they travelled (the toy
    engine's test_driver_matrix.py compares all three transports on one layout)."""
    digests = {
        method: json.loads((out / "engine_digests.json").read_text())
        for method, out in on_policy_runs.items()
    }
    assert sorted(digests["memory"]) == ["0", "1", "2"]
    assert digests["memory"] == digests["checkpoint"]
    assert len(set(digests["memory"].values())) == 3  # and the weights did change
    # The nccl run trains on two trainer nodes (another reduction order): its version 0, the
    # starting weights, is the same bytes; the versions after it are its own.
    assert digests["nccl"]["0"] == digests["memory"]["0"]
    assert len(set(digests["nccl"].values())) == 3


# PPO with a critic on the trainer group: GAE, the KL penalty in the reward (beside the KL
# loss of small_run_overrides), one warm-up step that trains only the critic.
PPO = ("algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true", "trainer.critic_warmup=1")


@pytest.mark.full  # by default PPO runs colocated in test_ppo.py
def test_ppo_with_validation_on_the_explorers(assets: Path, tmp_path: Path) -> None:
    """With validation before training: the explorers load version 0 before it runs (a
    validation on the engine's dummy weights would raise). PPO with a critic: the critic
    lives with the trainer group, learns from step 1, the actor from step 2."""
    out = tmp_path / "run"
    val = [f"data.val_files=[{assets / 'test.jsonl'}]", "trainer.val_before_train=true"]
    run_cell(assets, out, *FULL_CELLS[0], *val, *PPO)
    first = read_metrics(out)[0]
    assert first["step"] == 0 and first["val/num_prompts"] == 8, first
    assert 0.0 <= first["val/reward_mean"] <= 1.0
    loads = [e.version for e in timeline(out) if e.side == "explorer" and e.old.value != "running"]
    assert loads[1] == 0, loads  # after the start: the first load is version 0
    steps = read_metrics(out)[1:]
    for m in steps:
        for key in ("critic/vf_loss", "critic/vf_explained_var", "critic/kl", "critic/kl_coeff"):
            assert key in m, (m["step"], key)
        assert m["timing_s/values"] > 0 and m["timing_s/update_critic"] > 0
    assert "actor/pg_loss" not in steps[0] and all("actor/pg_loss" in m for m in steps[1:])
    phases = {json.loads(line)["phase"] for line in (out / "memory.jsonl").open()}
    assert {"init/critic", "values/forward", "update_critic/optimizer_step"} <= phases


@pytest.mark.full
@pytest.mark.parametrize(("method", "style", "offset"), FULL_CELLS[1:])
def test_split_cell_full(
    assets: Path, tmp_path: Path, method: str, style: str, offset: int
) -> None:
    run_cell(assets, tmp_path / "run", method, style, offset)


def worker_pid(log: Path, side: str, deadline_s: float = 240) -> int:
    """The pid a split worker logs when it is ready (logs/<side>/worker_0.log)."""
    pattern = re.compile(rf"{side} rank 0 ready \(pid (\d+)\)")
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if log.is_file() and (found := pattern.search(log.read_text(errors="replace"))):
            return int(found.group(1))
        time.sleep(0.5)
    raise AssertionError(f"no '{side} rank 0 ready' line in {log}")


# Both sides under test-full (the default tier's budget): the default tier keeps a stopped worker
# named and killed (tests/integration/controller/test_stall.py) and a receiver whose sender died
# failing fast (tests/integration/transport/test_memory_and_collective.py).
@pytest.mark.full
@pytest.mark.parametrize("side", ["explorer", "trainer"])
def test_a_killed_worker_ends_the_run_naming_its_side(
    assets: Path, tmp_path: Path, side: str
) -> None:
    out = tmp_path / side
    # One-step-off over the object store: the kill test is also the default run's offset-1 cell.
    args = split_args(assets, out, "trainer.total_steps=500", "sync.method=memory", "sync.offset=1")
    child = subprocess.Popen(
        [sys.executable, "-m", "hybrid.main", *args],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pid = worker_pid(out / "logs" / side / "worker_0.log", side)
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 240
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
            assert child.poll() is None, child.communicate()[1][-5000:]
            assert time.monotonic() < deadline, "the run did not reach step 2"
            time.sleep(0.2)
        first_two = [json.loads(line) for line in metrics.read_text().splitlines()[:2]]
        for m in first_two:  # one step off: lag at most 1, every version probed
            assert m["sync/version_lag_max"] <= 1, m
            assert m["sync/probe_logprob_diff_max"] < LOGPROB_DIFF_MAX, m
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = child.communicate(timeout=90)
        elapsed = time.monotonic() - killed
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode != 0
    assert elapsed < 60, elapsed
    tail = without_leak_report(stderr)[-5000:]
    named = {"explorer": "ExplorerWorker.", "trainer": "trainer."}[side]  # member.method failed
    assert "WorkerDiedError" in tail and named in tail, tail


@pytest.mark.full
def test_a_killed_run_resumes_from_the_trainers_checkpoint(assets: Path, tmp_path: Path) -> None:
    """4 steps with a checkpoint at step 2; then the state a kill during step 3's checkpoint
    publish leaves (checkpoints up to step 2, weight version 3 half written, v2 complete)
    resumes: steps 3 and 4 train as the uninterrupted run did."""
    full = tmp_path / "full"
    extra = ("sync.method=checkpoint", "trainer.total_steps=4", "trainer.save_freq=2")
    run_split(assets, full, *extra)
    uninterrupted = read_metrics(full)
    resumed = tmp_path / "resumed"
    shutil.copytree(full, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_4")
    lines = (resumed / "metrics.jsonl").read_text().splitlines()[:2]
    (resumed / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    weights = resumed / "weights"
    shutil.rmtree(weights / "v3")
    (weights / ".tmp-v3-killed").mkdir()
    (weights / ".tmp-v3-killed" / "shard-00000.safetensors").write_bytes(b"half")
    run_split(assets, resumed, *extra)
    after = read_metrics(resumed)
    assert [m["step"] for m in after] == [1, 2, 3, 4]
    for step in (2, 3):  # steps 3 and 4
        for key in ("reward/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
            assert after[step][key] == pytest.approx(uninterrupted[step][key], abs=2e-3), key
    assert not (weights / ".tmp-v3-killed").exists()
    assert sorted(p.name for p in weights.iterdir()) == ["v2", "v3"]
