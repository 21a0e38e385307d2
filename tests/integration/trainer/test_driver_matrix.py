"""The driver's logic over every mode, style and transport, on the deterministic toy engine
(rollout.engine=toy): real Ray, real FSDP2 trainers, real bytes through the real transports
and the Synchronizer's real state machine; only generation is the toy engine's, which starts
in about a second instead of vLLM's twenty. The real-engine runs of each mode stay in
test_grpo_e2e.py, test_split.py, test_fully_async.py and test_multi_node.py.

In-process (`Driver(config).fit()` on the session's Ray cluster): nothing here tests the
entry point or a process's death.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from hybrid.trainer.loop import Driver
from hybrid.trainer.publisher import PUBLISHER_KEYS
from hybrid.trainer.sources import SOURCE_KEYS
from hybrid.trainer.step import STEP_KEYS
from tests.integration.trainer.helpers import read_metrics, small_config, write_assets
from tests.integration.trainer.test_fully_async import check_bounds
from tests.integration.trainer.test_split import PPO, check_run, timeline

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TOY = ("rollout.engine=toy",)
STEPS = 3
# (sync.method, sync.style, sync.offset): every transport under each style, each cell about
# 10 s of starting workers. By default the checkpoint transport under the explorer's schedule
# runs as the split run of the every-mode metrics test below, the memory transport as its
# fully-async run, and nccl on vLLM (test_split.py's on-policy run across two nodes).
DEFAULT_SPLIT_CELL = ("checkpoint", "dynamic_by_explorer", 0)
SPLIT_CELLS = [
    pytest.param(*cell, marks=pytest.mark.full)
    for cell in [
        DEFAULT_SPLIT_CELL,
        ("memory", "fixed", 1),
        ("checkpoint", "fixed", 0),
        ("nccl", "dynamic_by_explorer", 0),
        ("memory", "fixed", 0),
        ("nccl", "fixed", 0),
        ("checkpoint", "fixed", 1),
        ("nccl", "fixed", 1),
        ("memory", "dynamic_by_explorer", 0),
    ]
]


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_assets(tmp_path_factory.mktemp("toy"))


def fit(assets: Path, out: Path, *extra: str) -> list[dict]:
    Driver(small_config(assets, out, *TOY, *extra)).fit()
    return read_metrics(out)


def split_overrides(out: Path, method: str, style: str, offset: int) -> tuple[str, ...]:
    return (
        "trainer.mode=split",
        "sync.timeout_s=60",
        "sync.verify_checksum=true",
        f"sync.checkpoint_dir={out / 'weights'}",
        f"sync.method={method}",
        f"sync.style={style}",
        f"sync.offset={offset}",
    )


def split_run(assets: Path, out: Path, method: str, style: str, offset: int, *extra: str) -> None:
    fit(
        assets,
        out,
        f"trainer.total_steps={STEPS}",
        *split_overrides(out, method, style, offset),
        *extra,
    )


@pytest.mark.parametrize(("method", "style", "offset"), SPLIT_CELLS)
def test_split_cell(
    ray_cluster: None, assets: Path, tmp_path: Path, method: str, style: str, offset: int
) -> None:
    out = tmp_path / "run"
    split_run(assets, out, method, style, offset)
    metrics = check_run(out, method, style, offset)
    if (style, offset) == ("fixed", 0):
        assert all(m["sync/version_lag_max"] == 0 for m in metrics)
        assert all(m["rollout/fresh_tokens"] > 0 for m in metrics)
        digests = json.loads((out / "engine_digests.json").read_text())
        assert sorted(digests) == ["0", "1", "2"] and len(set(digests.values())) == 3


@pytest.mark.full  # each transport's own cell checks its digests by default
def test_the_transports_deliver_identical_bytes(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    """Versions 0..2 are the same bytes in the engine whichever way they travelled."""
    digests = {}
    for method in ("memory", "checkpoint", "nccl"):
        out = tmp_path / method
        split_run(assets, out, method, "fixed", 0)
        digests[method] = json.loads((out / "engine_digests.json").read_text())
    assert digests["memory"] == digests["checkpoint"] == digests["nccl"]


@pytest.mark.full  # the default tier's budget; PPO runs by default in test_ppo.py
def test_ppo_with_validation_on_the_explorers(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    """Validation before training runs on the explorers' version 0 (the dummy weights would
    raise); PPO's critic lives with the trainer group, learns from step 1, the actor from 2."""
    out = tmp_path / "run"
    val = [f"data.val_files=[{assets / 'test.jsonl'}]", "trainer.val_before_train=true"]
    split_run(assets, out, "checkpoint", "dynamic_by_explorer", 0, *val, *PPO)
    first, *steps = read_metrics(out)
    assert first["step"] == 0 and first["val/num_prompts"] == 8, first
    loads = [e.version for e in timeline(out) if e.side == "explorer" and e.old.value != "running"]
    assert loads[1] == 0, loads  # after the start: the first load is version 0
    for m in steps:
        assert m["timing_s/values"] > 0 and m["timing_s/update_critic"] > 0
        assert "critic/vf_loss" in m and "critic/kl" in m
    assert "actor/pg_loss" not in steps[0] and all("actor/pg_loss" in m for m in steps[1:])


# Keys only one mode has: how its rollouts arrive and how its weights travel, and the memory
# phases of its own workers (colocated ones also hold the engine).
MODE_EXTRAS = {
    "colocated": (
        "timing_s/rollout_call",
        "timing_s/sync_",
        "timing_s/mode_switch",
        "sync/",
        "memory/",
    ),
    "split": ("buffer/", "timing_s/publish", "timing_s/explorer_", "sync/", "memory/"),
    "fully_async": (
        "queue/",
        "rollouter/",
        "trainer/idle_ratio",
        "timing_s/publish",
        "timing_s/explorer_",
        "sync/",
        "memory/",
    ),
}


@pytest.fixture(scope="module")
def moe_assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_assets(tmp_path_factory.mktemp("toy_moe"), preset="tiny-moe")


# test-full for the default tier's budget (64 s): by default the colocated real-engine run
# checks the shared keys (test_grpo_e2e.py), each mode has its real-engine run (test_split.py,
# test_fully_async.py) and the routing replay its unit tests (tests/unit/workers/test_routing.py).
@pytest.mark.full
def test_every_mode_reports_the_same_step_metrics(
    ray_cluster: None, moe_assets: Path, tmp_path: Path
) -> None:
    """One config, three modes: the train step's keys are the same set in each; what differs
    is only each mode's own rollout and sync figures. The split run is the default split cell
    (the checkpoint transport under the explorer's schedule, checked as test_split_cell checks
    every cell); the fully-async run syncs over memory; colocated runs on one worker. The model
    is the tiny Qwen3-MoE under router replay: split R2 (the trainers' old-log-prob pass
    records the experts, the update replays them), colocated and fully_async R3 (the engine's
    experts travel with the generated rows, in fully_async from the explorers through partial
    rollouts), and the update computes with exactly those experts."""
    steps = 2
    base = (f"trainer.total_steps={steps}", "algorithm.skip_old_log_prob=false")
    assets = moe_assets
    split_out = tmp_path / "split"
    r3 = "actor.router_replay=rollout"
    mode_overrides = {
        "colocated": ("trainer.num_workers=1", r3),
        "split": (*split_overrides(split_out, *DEFAULT_SPLIT_CELL), "actor.router_replay=record"),
        # Two updates per published version, whose metrics one step merges.
        "fully_async": ("sync.method=memory", "fully_async.trigger_parameter_sync_step=2", r3),
    }
    shared_step_keys = set()
    for mode, extras in MODE_EXTRAS.items():
        metrics = fit(assets, tmp_path / mode, *base, f"trainer.mode={mode}", *mode_overrides[mode])
        keys = set(metrics[-1])
        assert keys >= STEP_KEYS | SOURCE_KEYS | PUBLISHER_KEYS, mode
        for m in metrics:
            assert m["actor/moe_routing_diff_frac"] == 0.0, mode  # replayed
            assert 0.0 <= m["actor/moe_router_drift_frac"] <= 1.0, mode
            assert m["actor/moe_load_max_over_mean"] >= 1.0, mode
        step_keys = {k for k in keys if not k.startswith(extras)} | (STEP_KEYS & keys)
        if shared_step_keys:
            assert step_keys == shared_step_keys, (mode, step_keys ^ shared_step_keys)
        shared_step_keys = step_keys
    check_run(split_out, *DEFAULT_SPLIT_CELL, steps=steps)


# (max_version_lag, staleness_threshold, sync.method, chunk_tokens, response_length)
FAST_ROLLOUTER = (1, 0.1, "nccl", 2, 8)
"""Plan 2 with 2-step chunks of 8-token responses: generation outpaces the update."""
SLOW_ROLLOUTER = (2, 0.5, "memory", 1, 64)
"""One engine step per Rollouter turn and responses of up to 64 tokens: the Rollouter is the
slower side."""
PACING_STEPS = 50


def pacing_run(
    assets: Path, out: Path, cell: tuple[int, float, str, int, int], steps: int = PACING_STEPS
) -> list[dict]:
    max_lag, threshold, method, chunk, length = cell
    metrics = fit(
        assets,
        out,
        f"trainer.total_steps={steps}",
        "trainer.mode=fully_async",
        "sync.timeout_s=60",
        f"sync.checkpoint_dir={out / 'weights'}",
        f"sync.method={method}",
        f"fully_async.max_version_lag={max_lag}",
        f"fully_async.staleness_threshold={threshold}",
        f"fully_async.chunk_tokens={chunk}",
        f"rollout.response_length={length}",
        f"rollout.max_model_len={length + 32}",
    )
    record = json.loads((out / "fully_async.json").read_text())
    check_bounds(metrics, record, threshold, max_lag)
    return metrics


@pytest.mark.full  # test_fully_async.py's twenty-syncs run checks the same bounds by default
def test_staleness_stays_bounded_with_a_fast_rollouter(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    metrics = pacing_run(assets, tmp_path / "run", FAST_ROLLOUTER)
    # Generation outpaces the update: the Rollouter waits at its budget, the trainer rarely.
    assert statistics.mean(m["rollouter/idle_ratio"] for m in metrics[1:]) > 0.2


@pytest.mark.full  # test_fully_async.py's twenty-syncs run checks the same bounds by default
def test_staleness_stays_bounded_with_a_slow_rollouter(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    """The seed's failure mode: the Rollouter slower than the trainer. The run finishes, the
    trainer waits for a large part of every step, and nothing is trained beyond the bound."""
    metrics = pacing_run(assets, tmp_path / "run", SLOW_ROLLOUTER, steps=12)
    assert statistics.mean(m["trainer/idle_ratio"] for m in metrics[1:]) > 0.2
    # The groups of an update come in several parts, each scored as it came.
    assert statistics.mean(m["queue/parts_per_update"] for m in metrics[1:]) > 1.5


@pytest.mark.full  # the default tier's budget; LoRA runs by default colocated (test_lora_grpo.py)
@pytest.mark.parametrize("mode", ["split", "fully_async"])
def test_lora_trains_in_the_decoupled_modes(
    ray_cluster: None, assets: Path, tmp_path: Path, mode: str
) -> None:
    """The trainer folds the adapters into the base weights for the explorers' plain engines:
    the engine's log-probs of its own samples match the actor's, and the adapter is exported."""
    out = tmp_path / "run"
    metrics = fit(
        assets,
        out,
        f"trainer.total_steps={STEPS}",
        f"trainer.mode={mode}",
        "sync.method=memory",
        "sync.timeout_s=60",
        "model.lora.rank=8",
        "actor.optim.lr=1e-2",
        # fully_async: two updates per published version. The second one's tokens are not fresh
        # (the actor has moved since the publish), so the log-prob check covers the first only.
        "fully_async.trigger_parameter_sync_step=2",
    )
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    fresh = [m for m in metrics if m["rollout/fresh_tokens"]]
    assert fresh, "no token was sampled by the weights the actor held"
    for m in fresh:
        assert m["rollout/logprob_diff_max"] < 0.05, m
    assert m["actor/grad_norm"] > 0
    assert (out / "lora_adapter" / "adapter_config.json").is_file()


@pytest.mark.full  # by default PPO runs colocated in test_ppo.py
def test_ppo_with_a_critic_fully_async(ray_cluster: None, assets: Path, tmp_path: Path) -> None:
    """The critic trains on every update the trainer takes; the actor after its warm-up."""
    out = tmp_path / "run"
    metrics = fit(
        assets,
        out,
        f"trainer.total_steps={STEPS}",
        "trainer.mode=fully_async",
        "sync.method=memory",
        "sync.timeout_s=60",
        *PPO,
    )
    for m in metrics:
        assert m["timing_s/update_critic"] > 0 and "critic/vf_loss" in m
    assert "actor/pg_loss" not in metrics[0] and all("actor/pg_loss" in m for m in metrics[1:])
    record = json.loads((out / "fully_async.json").read_text())
    check_bounds(metrics, record, 0.1, 1)
