"""The synthetic task the tiny arithmetic-vocab model learns: "a+b=" -> str(a + b).

Prompts use only digits, "+" and "=", the characters of the "arithmetic" vocabulary
(hybrid/models/tokenizer.py), so no character is dropped by its tokenizer. a and b are drawn
uniformly from [0, max_operand); with the default 5 every sum is one digit (0..8).

`write_arithmetic_task` is what both examples/data/arithmetic.py (the CLI) and the entry
point's demo set-up (hybrid/trainer/demo_assets.py) call: same arguments, same bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hybrid.data.dataset import write_rows

DATA_SOURCE = "arithmetic"
SPLITS = ("train", "test")


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


def write_arithmetic_task(
    output_dir: str | Path,
    num_train: int = 1000,
    num_test: int = 100,
    seed: int = 0,
    max_operand: int = 5,
) -> dict[str, Path]:
    """Write output_dir/train.parquet and output_dir/test.parquet (train drawn first from one
    generator seeded with `seed`); returns the written file of each split."""
    for name, value in (
        ("num_train", num_train),
        ("num_test", num_test),
        ("max_operand", max_operand),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    rng = np.random.default_rng(seed)
    written = {}
    for split, num_rows in zip(SPLITS, (num_train, num_test), strict=True):
        rows = make_rows(num_rows, max_operand, split, rng)
        written[split] = write_rows(rows, Path(output_dir) / f"{split}.parquet")
    return written


SFT_FILE = "sft.parquet"


def write_arithmetic_sft(
    output_dir: str | Path, num_rows: int = 1000, seed: int = 0, max_operand: int = 5
) -> Path:
    """Write output_dir/sft.parquet: `num_rows` SFT rows in the prompt layout (hybrid/data/sft.py),
    the prompt "a+b=" as in `make_rows` and the sum as the response; a and b from a generator of
    its own ([seed, 1]), so the RL splits of `write_arithmetic_task` keep their bytes."""
    for name, value in (("num_rows", num_rows), ("max_operand", max_operand)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    rng = np.random.default_rng([seed, 1])
    operands = rng.integers(0, max_operand, size=(num_rows, 2)).tolist()
    rows = [
        {"prompt": [{"role": "user", "content": f"{a}+{b}="}], "response": str(a + b)}
        for a, b in operands
    ]
    return write_rows(rows, Path(output_dir) / SFT_FILE)
