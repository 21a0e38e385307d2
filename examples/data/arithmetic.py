"""The synthetic task the tiny arithmetic-vocab model learns: "a+b=" -> str(a + b).

A command line around hybrid/data/arithmetic_task.py (the generator lives in the package so
that `python -m hybrid.main` can build the demo data itself; both write the same bytes).
a and b are drawn uniformly from [0, max_operand); with the default 5 every sum is one digit.

    python examples/data/arithmetic.py --output-dir data/arithmetic [--num-train 1000]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from hybrid.data.arithmetic_task import DATA_SOURCE, make_rows, write_arithmetic_task

__all__ = ["DATA_SOURCE", "main", "make_rows"]


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
    written = write_arithmetic_task(
        args.output_dir, args.num_train, args.num_test, args.seed, args.max_operand
    )
    for split, num_rows in (("train", args.num_train), ("test", args.num_test)):
        print(f"wrote {num_rows} rows to {written[split]}")
    return written


if __name__ == "__main__":
    main()
