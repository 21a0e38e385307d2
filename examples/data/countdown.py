"""TinyZero's Countdown task, generated locally: reach a target from 3 or 4 numbers.

Each row draws 3 or 4 numbers from 1..99 and builds a random equation that uses every number
exactly once with +, -, * and exact / (a division is allowed only when it leaves no
remainder, so every intermediate value is an integer); its value, if in [1, MAX_TARGET], is
the target. So every target is reachable by construction. (number multiset, target) pairs are
unique across train and test. Rows: data_source "countdown", one user message in TinyZero's
wording (answer inside <answer></answer>), ground_truth {"target": t, "numbers": [...]},
extra_info {split, index, solution}.

    python examples/data/countdown.py --output-dir data/countdown [--num-train 1000 --seed 0]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hybrid.data.dataset import write_rows

DATA_SOURCE = "countdown"
MIN_NUMBER, MAX_NUMBER = 1, 99
MAX_TARGET = 999
OPERATORS = ("+", "-", "*", "/")
PROMPT = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work "
    "in <think> </think> tags. And return the final answer in <answer> </answer> tags, for "
    "example <answer> (1 + 2) / 3 </answer>."
)


def _apply(op: str, a: int, b: int) -> int | None:
    """a op b, or None for a division with a remainder (or by zero)."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a // b if b != 0 and a % b == 0 else None


def random_equation(numbers: Sequence[int], rng: np.random.Generator) -> tuple[int, str] | None:
    """Combine random pairs with random operators until one value is left: (value, equation).

    None when a drawn division is inexact; the caller draws again.
    """
    pool = [(n, str(n)) for n in numbers]
    while len(pool) > 1:
        i, j = rng.choice(len(pool), size=2, replace=False).tolist()
        (a, a_text), (b, b_text) = pool[i], pool[j]
        op = OPERATORS[int(rng.integers(len(OPERATORS)))]
        value = _apply(op, a, b)
        if value is None:
            return None
        pool = [item for k, item in enumerate(pool) if k not in (i, j)]
        pool.append((value, f"({a_text} {op} {b_text})"))
    value, text = pool[0]
    return value, text[1:-1] if text.startswith("(") else text


def make_example(rng: np.random.Generator) -> tuple[list[int], int, str]:
    """(numbers, target, one solution) with 1 <= target <= MAX_TARGET."""
    while True:
        count = int(rng.integers(3, 5))
        numbers = rng.integers(MIN_NUMBER, MAX_NUMBER + 1, size=count).tolist()
        for _ in range(20):  # a few equations per number set before drawing new numbers
            result = random_equation(numbers, rng)
            if result is not None and 1 <= result[0] <= MAX_TARGET:
                return numbers, result[0], result[1]


def make_rows(num_train: int, num_test: int, seed: int) -> dict[str, list[dict[str, Any]]]:
    """Train and test rows; (sorted numbers, target) never repeats across both."""
    rng = np.random.default_rng(seed)
    seen: set[tuple[tuple[int, ...], int]] = set()
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
    for split, num_rows in (("train", num_train), ("test", num_test)):
        rows = splits[split]
        while len(rows) < num_rows:
            numbers, target, solution = make_example(rng)
            key = (tuple(sorted(numbers)), target)
            if key in seen:
                continue
            seen.add(key)
            rows.append(
                {
                    "data_source": DATA_SOURCE,
                    "prompt": [
                        {"role": "user", "content": PROMPT.format(numbers=numbers, target=target)}
                    ],
                    "reward_model": {
                        "style": "rule",
                        "ground_truth": {"target": target, "numbers": numbers},
                    },
                    "extra_info": {"split": split, "index": len(rows), "solution": solution},
                }
            )
    return splits


def main(argv: Sequence[str] | None = None) -> dict[str, Path]:
    """Write train.parquet and test.parquet; returns the written file of each split."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--num-train", type=int, default=1000)
    parser.add_argument("--num-test", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("num_train", "num_test"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    written = {}
    for split, rows in make_rows(args.num_train, args.num_test, args.seed).items():
        written[split] = write_rows(rows, args.output_dir / f"{split}.parquet")
        print(f"wrote {len(rows)} rows to {written[split]}")
    return written


if __name__ == "__main__":
    main()
