"""The synthetic task the tiny arithmetic-vocab model learns: "a+b=" -> str(a + b).

Prompts use only digits, "+" and "=", the characters of the "arithmetic" vocabulary
(hybrid/models/tokenizer.py), so no character is dropped by its tokenizer. a and b are drawn
uniformly from [0, max_operand); with the default 5 every sum is one digit (0..8).

    python examples/data/arithmetic.py --output-dir data/arithmetic [--num-train 1000]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hybrid.data.dataset import write_rows

DATA_SOURCE = "arithmetic"


def make_rows(
    num_rows: int, max_operand: int, split: str, rng: np.random.Generator
) -> list[dict[str, Any]]:
    """`num_rows` prompts "a+b=" with a, b drawn from [0, max_operand)."""
    operands = rng.integers(0, max_operand, size=(num_rows, 2)).tolist()
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{a}+{b}="}],
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": index, "a": a, "b": b},
        }
        for index, (a, b) in enumerate(operands)
    ]


def main(argv: Sequence[str] | None = None) -> dict[str, Path]:
    """Write train.parquet and test.parquet; returns the written file of each split."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--num-train", type=int, default=1000)
    parser.add_argument("--num-test", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-operand", type=int, default=5, help="a, b in [0, max_operand)")
    args = parser.parse_args(argv)
    for name in ("num_train", "num_test", "max_operand"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    rng = np.random.default_rng(args.seed)
    written = {}
    for split, num_rows in (("train", args.num_train), ("test", args.num_test)):
        rows = make_rows(num_rows, args.max_operand, split, rng)
        written[split] = write_rows(rows, args.output_dir / f"{split}.parquet")
        print(f"wrote {len(rows)} rows to {written[split]}")
    return written


if __name__ == "__main__":
    main()
