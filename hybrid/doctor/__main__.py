"""`python -m hybrid.doctor [--config-name NAME] [--model PRESET_OR_DIR] [--gpu-memory-gib F]
[OVERRIDE ...]`: can this config run on this machine? Checked before anything starts.

Prints the checks (versions, GPUs, environment, attention, rollout engine, memory plan,
inputs), each `ok` / `warn` / `FAIL` with the reason and the fix, then one line of JSON.
Exit code 0: the config can run here; 1: it cannot (the JSON's `missing` names why);
2: bad input (unknown config name, bad override, unknown --model).
"""

from __future__ import annotations

import argparse
import json
import sys

from hybrid.doctor.compose import (
    InputError,
    choose_shape,
    compose_config,
    critic_shape,
    load_shape,
)
from hybrid.doctor.diagnose import DEFAULT_GPU_MEMORY_GIB, diagnose
from hybrid.doctor.facts import gather_host_facts, gather_input_facts
from hybrid.doctor.output import format_text, to_json
from hybrid.memory.model_shape import known_presets


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hybrid.doctor",
        description="Check, before anything starts, whether a trainer config can run here.",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. trainer.num_workers=4")
    parser.add_argument(
        "--config-name", default="config", help="a config in configs/ (default: %(default)s)"
    )
    parser.add_argument(
        "--model",
        help=f"the model shape for the memory plan: a preset ({', '.join(known_presets())}) "
        "or a HF model directory (default: model.path, or a preset the config's name names)",
    )
    parser.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=DEFAULT_GPU_MEMORY_GIB,
        help="GPU memory assumed when no GPU is visible here (default: %(default)g)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.gpu_memory_gib <= 0:
            raise InputError(f"--gpu-memory-gib must be > 0, got {args.gpu_memory_gib}")
        config = compose_config(args.config_name, list(args.overrides))
        inputs = gather_input_facts(config)
        shape, source = load_shape(choose_shape(config, args.config_name, args.model, inputs))
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        print(json.dumps({"can_run": False, "config": args.config_name, "error": str(error)}))
        return 2
    facts = gather_host_facts(config.trainer.ray_address)
    report = diagnose(
        config,
        facts,
        shape,
        config_name=args.config_name,
        shape_source=source,
        inputs=inputs,
        gpu_memory_gib=args.gpu_memory_gib,
        critic_shape=critic_shape(config),
    )
    header = " ".join([args.config_name, *args.overrides])
    print(format_text(report, header), flush=True)
    print(to_json(report, facts))
    return 0 if report.can_run else 1


if __name__ == "__main__":
    sys.exit(main())
