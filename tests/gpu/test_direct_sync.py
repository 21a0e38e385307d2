"""The `direct` sync strategy: gathered tensors copied straight into vLLM's CUDA parameters.

Runs only where it applies: a CUDA device with vLLM's CUDA build installed (the `gpu` marker
skips without CUDA; the import check skips where vLLM is absent). One process, world size 1.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]


def test_direct_strategy_loads_in_place_and_matches_the_actor(tmp_path: Path) -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed on this GPU machine")
    import torch.distributed as dist

    from hybrid.controller import RankEnv
    from hybrid.memory.ledger import MemoryLedger
    from hybrid.models import TinyModelConfig, build_tiny_model
    from hybrid.rollout.config import RolloutConfig
    from hybrid.rollout.vllm_engine import VllmEngine
    from hybrid.sharding.config import SyncConfig
    from hybrid.sharding.mode import ModeSwitch
    from hybrid.sharding.offload import Offloader
    from hybrid.workers.fsdp import build_fsdp_model
    from hybrid.workers.parallel import init_parallel

    model_dir = build_tiny_model(
        tmp_path / "tiny", TinyModelConfig.preset("tiny", initializer_range=0.1)
    )
    env = RankEnv(0, 1, 0, 1, "127.0.0.1", 29561)
    os.environ.update(env.to_environ())
    parallel = init_parallel(env)
    model = build_fsdp_model(str(model_dir), parallel.fsdp_mesh, parallel.device)
    engine = VllmEngine(
        str(model_dir),
        RolloutConfig(max_model_len=128, gpu_memory_utilization=0.2),
        parallel.device,
        "bfloat16",
    )
    try:
        modes = ModeSwitch(
            model,
            engine,
            Offloader(model, None, parallel.device, False, False),
            SyncConfig(strategy="direct", verify_checksum=True),
            MemoryLedger(),
            rollout_seed=0,
        )
        assert modes.weight_facts.layout == "plain"  # vLLM on CUDA keeps ordinary tensors
        ptrs = {n: p.data_ptr() for n, p in engine.stored_weights()}
        with modes.rollout_mode():
            assert modes.strategy == "direct"
            sequence = [1, 5, 6, 7, 8, 9, 10, 11]
            engine_lp = torch.tensor(engine.score([sequence])[0])
        assert {n: p.data_ptr() for n, p in engine.stored_weights()} == ptrs
        with torch.no_grad():
            logits = model(torch.tensor([sequence], device=parallel.device)).logits.float()[0, :-1]
        actor_lp = torch.log_softmax(logits, -1).gather(
            -1, torch.tensor(sequence[1:], device=logits.device)[:, None]
        )
        assert (engine_lp - actor_lp[:, 0].cpu()).abs().max() < 0.05
    finally:
        engine.shutdown()
        dist.destroy_process_group()
