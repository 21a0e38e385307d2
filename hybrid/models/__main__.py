"""`python -m hybrid.models --output-dir DIR [--preset tiny] [--vocab arithmetic] [--seed 0]`:
write a tiny Qwen2 model directory (deterministic: same arguments, same bytes)."""

from __future__ import annotations

import argparse
from pathlib import Path

from hybrid.models import TinyModelConfig, build_tiny_model, count_parameters


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--preset", default="tiny", choices=["tiny", "bench-100m"])
    parser.add_argument("--vocab", default="text", choices=["text", "arithmetic"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--initializer-range", type=float, default=None)
    args = parser.parse_args(argv)
    overrides = {"vocab": args.vocab}
    if args.initializer_range is not None:
        overrides["initializer_range"] = args.initializer_range
    config = TinyModelConfig.preset(args.preset, **overrides)
    path = build_tiny_model(args.output_dir, config, seed=args.seed)
    print(
        f"wrote {args.preset} Qwen2 ({count_parameters(config):,} parameters, vocab {args.vocab}) to {path}"
    )
    return path


if __name__ == "__main__":
    main()
