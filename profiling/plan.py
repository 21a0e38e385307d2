"""Will it fit? The memory planner on a trainer config, before any GPU is involved.

    python -m profiling.plan [--config-name NAME] [--model PRESET_OR_DIR] [--gpu-memory-gib F]
        [--gpu {h100,h200,a100}] [--nvls | --no-nvls] [--host-memory-gib F] [--lora-rank R]
        [--suggest] [--longest] [--json] [OVERRIDE ...]

Composes configs/NAME.yaml with the Hydra overrides exactly like `python -m hybrid.main`
(same typed config, same validation) but does not check that the data files exist, and
prints hybrid.planner's per-phase prediction for one worker: the phase table, the
trainer-mode and rollout-mode components, the KV cache in tokens, the CUDA reserve (context,
NCCL communicators, fragmentation), each node's host RAM and FITS / DOES NOT FIT with the
margin (and a warning when the margin is within the reserve's uncertainty). `--suggest` adds
the cheapest Hydra overrides that make it fit (sequence parallelism, actor.sp_size, among
them). `--longest` adds the longest rollout.response_length the config fits (in steps of
1,024 tokens, the prompt as configured, the token budgets raised to one sequence per sp group)
at sp = 1, at the config's actor.sp_size and at every sp of 2, 4, 8 the config and the
model's heads allow (hybrid.planner.longest). Exit code 0 whether it fits or not; 1 for bad
input (unknown preset, missing model directory, invalid config).

The node: `--gpu` sets the GPU kind (an A100 gets vLLM's small batch defaults, 8192 tokens /
256 sequences, and no NVLS); `--nvls` / `--no-nvls` say whether NCCL uses NVLink SHARP, which
makes every communicator of more than two GPUs on a node larger (default: on with >= 8 CUDA
workers per node on an H100 / H200; `--no-nvls` for NCCL_NVLS_ENABLE=0 or a node without
NVSwitch); `--host-memory-gib` is each node's host RAM, checked against the plan's host peak
(unchecked without it).

LoRA is read from the config (`model.lora`, `sync.lora_mode`, `sync.layered_summon`).
`--lora-rank R` (R > 0) is a shortcut for the override `model.lora.rank=R`, appended after the
others (so it wins) and validated like any override; the default 0 leaves the config's rank.
Turning LoRA off in a LoRA config takes overrides: `model.lora.rank=0` with the other
model.lora fields back at their defaults.

Examples: python -m profiling.plan --config-name qwen2_5_7b_gsm8k_8gpu --model Qwen2.5-7B
          python -m profiling.plan --config-name qwen2_5_7b_lora_gsm8k_8gpu --model Qwen2.5-7B
          python -m profiling.plan --config-name qwen2_5_7b_longctx_8gpu --model Qwen2.5-7B
              --longest   (one command line)
          python -m profiling.plan --config-name qwen2_5_32b_gsm8k_2x8gpu --model Qwen2.5-32B
              --host-memory-gib 1024 actor.hsdp_replicas=2   (one command line)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from omegaconf import DictConfig, OmegaConf

from hybrid.memory.model_shape import known_presets, model_shape
from hybrid.planner.format import format_longest, format_plan, format_suggestions, to_json
from hybrid.planner.longest import longest_responses
from hybrid.planner.plan import plan_memory
from hybrid.planner.reserve import DEFAULT_GPU, GPU_KINDS
from hybrid.planner.suggest import suggest
from hybrid.trainer.compose import CONFIG_DIR, compose, config_names, to_run_config
from hybrid.trainer.config import TrainerRunConfig

UNSET = "???"
_ABSENT = object()


class InputError(ValueError):
    """Bad command-line input; the message names the option."""


def compose_config(config_name: str, overrides: list[str]) -> TrainerRunConfig:
    return to_run_config(compose(config_name, overrides))


def as_hydra_override(cfg: DictConfig, override: str) -> str:
    """`key=value` for a key the composed config has (every schema field: configs/ starts from
    the registered schema), `+key=value` for one it lacks, e.g. a typo, which Hydra takes only
    with the `+` and the strict converter then names."""
    key = override.split("=", 1)[0]
    present = OmegaConf.select(cfg, key, default=_ABSENT) is not _ABSENT
    return override if present else f"+{override}"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m profiling.plan",
        description="Predict per-GPU memory at every phase of a GRPO step from a trainer config.",
    )
    parser.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. actor.micro_batch_size=2"
    )
    parser.add_argument(
        "--config-name", default="config", help="a config in configs/ (default: %(default)s)"
    )
    parser.add_argument(
        "--model",
        help=f"a preset ({', '.join(known_presets())}) or a HF model directory "
        "(default: the config's model.path)",
    )
    parser.add_argument(
        "--gpu-memory-gib", type=float, default=80.0, help="memory per GPU (default: %(default)g)"
    )
    parser.add_argument(
        "--gpu",
        choices=GPU_KINDS,
        default=DEFAULT_GPU,
        help="the GPU kind: vLLM's batch defaults and NVLS depend on it (default: %(default)s)",
    )
    parser.add_argument(
        "--nvls",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether NCCL uses NVLink SHARP (--no-nvls: NCCL_NVLS_ENABLE=0 or no NVSwitch); "
        "default: yes with >= 8 CUDA workers per node on an H100 / H200",
    )
    parser.add_argument(
        "--host-memory-gib",
        type=float,
        default=None,
        help="host RAM per node: checked against the plan's host peak (default: not checked)",
    )
    parser.add_argument(
        "--lora-rank",
        type=int,
        default=0,
        help="shortcut for the override model.lora.rank=R (default 0: the config's rank)",
    )
    parser.add_argument("--suggest", action="store_true", help="propose changes that make it fit")
    parser.add_argument(
        "--longest",
        action="store_true",
        help="the longest rollout.response_length that fits, with and without actor.sp_size",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> str:
    if args.gpu_memory_gib <= 0:
        raise InputError(f"--gpu-memory-gib must be > 0, got {args.gpu_memory_gib}")
    if args.lora_rank < 0:
        raise InputError(f"--lora-rank must be >= 0, got {args.lora_rank}")
    if args.host_memory_gib is not None and args.host_memory_gib <= 0:
        raise InputError(f"--host-memory-gib must be > 0, got {args.host_memory_gib}")
    if not (CONFIG_DIR / f"{args.config_name}.yaml").is_file():
        known = config_names()
        raise InputError(f"--config-name: no {args.config_name}.yaml in {CONFIG_DIR} ({known})")
    overrides = list(args.overrides)
    try:
        cfg = compose(args.config_name, overrides)
        if args.lora_rank:
            overrides.append(as_hydra_override(cfg, f"model.lora.rank={args.lora_rank}"))
            cfg = compose(args.config_name, overrides)
        config = to_run_config(cfg)
    except Exception as error:  # Hydra's composition errors and our ValueErrors alike
        raise InputError(f"config {args.config_name} {overrides}: {error}") from error
    model = args.model or config.model.path
    if model == UNSET:
        raise InputError(
            f"--model: config {args.config_name} leaves model.path unset (???); "
            f"pass --model with a preset ({', '.join(known_presets())}) or a model directory"
        )
    try:
        shape = model_shape(model)
    except ValueError as error:
        raise InputError(f"--model: {error}") from error
    critic_shape = None
    if config.use_critic and config.critic.model.path is not None:
        try:
            critic_shape = model_shape(config.critic.model.path)
        except ValueError as error:
            raise InputError(f"critic.model.path: {error}") from error
    node = {"gpu": args.gpu, "nvls": args.nvls, "host_memory_gib": args.host_memory_gib}
    plan = plan_memory(config, shape, args.gpu_memory_gib, critic_shape=critic_shape, **node)
    suggestions = None
    if args.suggest:
        found = suggest(config, shape, args.gpu_memory_gib, critic_shape=critic_shape, **node)
        suggestions = [
            dataclasses.replace(s, overrides=tuple(as_hydra_override(cfg, o) for o in s.overrides))
            for s in found
        ]
    longest = None
    if args.longest:
        longest = longest_responses(
            config, shape, args.gpu_memory_gib, critic_shape=critic_shape, **node
        )
    if args.json:
        return to_json(plan, suggestions, longest)
    text = format_plan(plan)
    if suggestions is not None:
        text += "\n\n" + format_suggestions(plan, suggestions)
    if longest is not None:
        text += "\n\n" + format_longest(longest, config.actor.sp_size)
    return text


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        print(run(args))
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
