"""A small synthetic code task for the built-in `code` reward: stdin/stdout programs on two ints.

Each row asks for a Python program that reads two integers from one line of input and prints
something about them (their sum, difference, product, larger, smaller, distance, sum of squares,
or sum and product on two lines), shows one worked example in the prompt, and carries 3 or 4
stdin/stdout `cases` (the example is the first) in the code reward's ground-truth format
(hybrid/rewards/code.py). Rows: data_source "code", one user message, ground_truth
{"cases": [{"input", "output"}]}, extra_info {split, index, task, solution, sandbox}, where
`solution` is a reference program that passes every case. Same seed, same bytes.

    python examples/data/code_task.py --output-dir outputs/code_task/data [--num-train 256]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from hybrid.data.dataset import write_rows

DATA_SOURCE = "code"
SPLITS = ("train", "test")
OPERAND_RANGE = (-99, 100)
"""Operands are drawn from [-99, 100): negatives make sign handling part of the task."""
MIN_CASES, MAX_CASES = 3, 4
ROW_SANDBOX_LIMITS = {"time_s": 2.0}
"""Per-row sandbox limits (extra_info["sandbox"]). The reference runs in well under 0.1 s; a
looping program then holds a reward process 2 s a case instead of the default 5 s, and a row's
worst case (4 cases x 2 s) stays far below reward.timeout_s (60 s)."""
PROMPT = (
    "Write a Python program that reads two integers from one line of input, separated by a "
    "space, and prints {what}. Example: for the input `{example_input}` it prints "
    "`{example_output}`."
)
READ_LINE = "a, b = map(int, input().split())\n"


# A NamedTuple rather than a dataclass: dataclasses look their module up in sys.modules, and
# scripts under examples/ are loaded from their path (the tests, check_reward.py) without it.
class CodeTask(NamedTuple):
    """One kind of row: what the prompt asks for and one Python expression per output line."""

    name: str
    what: str
    """The prompt's description of the output."""
    expressions: tuple[str, ...]
    """Python expressions of `a` and `b`, one printed line each: the reference program."""
    values: Callable[[int, int], tuple[int, ...]]
    """The same lines computed here, for the expected output. Written twice on purpose: the
    unit test runs every reference in the sandbox against these, so a typo in either fails."""

    def reference(self) -> str:
        """A program that passes every case of this task."""
        return READ_LINE + "".join(f"print({expression})\n" for expression in self.expressions)

    def off_by_one(self) -> str:
        """A program that runs cleanly and gets every line wrong by one (a wrong answer)."""
        return READ_LINE + "".join(
            f"print(({expression}) + 1)\n" for expression in self.expressions
        )

    def output(self, a: int, b: int) -> str:
        """The expected stdout for the input "a b"."""
        return "".join(f"{value}\n" for value in self.values(a, b))


TASKS = (
    CodeTask("sum", "their sum", ("a + b",), lambda a, b: (a + b,)),
    CodeTask("difference", "the first minus the second", ("a - b",), lambda a, b: (a - b,)),
    CodeTask("product", "their product", ("a * b",), lambda a, b: (a * b,)),
    CodeTask("max", "the larger of the two", ("max(a, b)",), lambda a, b: (max(a, b),)),
    CodeTask("min", "the smaller of the two", ("min(a, b)",), lambda a, b: (min(a, b),)),
    CodeTask(
        "distance",
        "the absolute value of their difference",
        ("abs(a - b)",),
        lambda a, b: (abs(a - b),),
    ),
    CodeTask(
        "squares", "the sum of their squares", ("a * a + b * b",), lambda a, b: (a * a + b * b,)
    ),
    CodeTask(
        "sum_product",
        "their sum on the first line and their product on the second",
        ("a + b", "a * b"),
        lambda a, b: (a + b, a * b),
    ),
)
TASKS_BY_NAME = {task.name: task for task in TASKS}


def make_row(split: str, index: int, rng: np.random.Generator) -> dict[str, Any]:
    """One row: a task drawn uniformly, 3 or 4 distinct operand pairs as its cases."""
    task = TASKS[int(rng.integers(len(TASKS)))]
    num_cases = int(rng.integers(MIN_CASES, MAX_CASES + 1))
    pairs: list[tuple[int, int]] = []
    while len(pairs) < num_cases:
        a, b = rng.integers(*OPERAND_RANGE, size=2).tolist()
        if (a, b) not in pairs:
            pairs.append((a, b))
    cases = [{"input": f"{a} {b}\n", "output": task.output(a, b)} for a, b in pairs]
    example_input, example_output = cases[0]["input"].strip(), cases[0]["output"].strip()
    prompt = PROMPT.format(
        what=task.what,
        example_input=example_input,
        example_output=example_output.replace("\n", "\\n"),
    )
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": prompt}],
        "reward_model": {"style": "rule", "ground_truth": {"cases": cases}},
        "extra_info": {
            "split": split,
            "index": index,
            "task": task.name,
            "solution": task.reference(),
            "sandbox": dict(ROW_SANDBOX_LIMITS),
        },
    }


def make_rows(num_train: int, num_test: int, seed: int) -> dict[str, list[dict[str, Any]]]:
    """Train then test rows, drawn in that order from one generator seeded with `seed`."""
    for name, value in (("num_train", num_train), ("num_test", num_test)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    rng = np.random.default_rng(seed)
    return {
        split: [make_row(split, index, rng) for index in range(num_rows)]
        for split, num_rows in zip(SPLITS, (num_train, num_test), strict=True)
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Path]:
    """Write train.jsonl and test.jsonl; returns the written file of each split."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--num-train", type=int, default=256)
    parser.add_argument("--num-test", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("num_train", "num_test"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    written = {}
    for split, rows in make_rows(args.num_train, args.num_test, args.seed).items():
        written[split] = write_rows(rows, args.output_dir / f"{split}.jsonl")
        print(f"wrote {len(rows)} rows to {written[split]}")
    return written


if __name__ == "__main__":
    main()
