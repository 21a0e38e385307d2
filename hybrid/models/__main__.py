"""`python -m hybrid.models --output-dir DIR [--preset tiny] [--architecture llama] [--vocab arithmetic] [--seed 0]`:
write a tiny model directory (deterministic: same arguments, same bytes).

`--architecture` picks the Hugging Face family (the preset's by default: qwen2 for tiny and
bench-100m, qwen3_moe for tiny-moe, qwen2_vl for tiny-vl; or llama, mistral, qwen3, qwen2_moe);
`--untied` gives the LM head its own matrix instead of sharing the input embedding."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, get_args

from hybrid.models import TinyModelConfig, build_tiny_model, count_parameters
from hybrid.models.config import ARCHITECTURES, PresetName


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--preset", default="tiny", choices=list(get_args(PresetName)))
    parser.add_argument("--architecture", default=None, choices=ARCHITECTURES)
    parser.add_argument("--untied", action="store_true", help="separate LM head (not tied)")
    parser.add_argument("--vocab", default="text", choices=["text", "arithmetic"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--initializer-range", type=float, default=None)
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {"vocab": args.vocab}
    if args.architecture is not None:
        overrides["architecture"] = args.architecture
    if args.untied:
        overrides["tie_word_embeddings"] = False
    if args.initializer_range is not None:
        overrides["initializer_range"] = args.initializer_range
    config = TinyModelConfig.preset(args.preset, **overrides)
    path = build_tiny_model(args.output_dir, config, seed=args.seed)
    print(
        f"wrote {args.preset} {config.architecture} ({count_parameters(config):,} parameters, "
        f"vocab {args.vocab}, {'untied' if args.untied else 'tied'}) to {path}"
    )
    return path


if __name__ == "__main__":
    main()
