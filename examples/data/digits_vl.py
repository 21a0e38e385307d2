"""A vision-language demo task: read the one digit an image shows ("<image>" -> "7").

A command line around hybrid/data/digits_task.py (the generator lives in the package so that
`python -m hybrid.main --config-name vlm_demo` can build the demo data itself; both write the
same bytes). `--blank-images` writes the same rows with all-white images: the control run.

    python examples/data/digits_vl.py --output-dir data/digits_vl [--train-size 1000 --seed 0]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from hybrid.data.digits_task import DATA_SOURCE, make_rows, render_digit, write_digits_vl

__all__ = ["DATA_SOURCE", "main", "make_rows", "render_digit", "write_digits_vl"]


def main(argv: Sequence[str] | None = None) -> dict[str, Path]:
    """Write train.parquet and test.parquet; returns the written file of each split."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--train-size", type=int, default=1000)
    parser.add_argument("--test-size", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--blank-images", action="store_true", help="all-white images (the control run)"
    )
    args = parser.parse_args(argv)
    for name in ("train_size", "test_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    written = write_digits_vl(
        args.output_dir, args.train_size, args.test_size, args.seed, args.blank_images
    )
    for split, num_rows in (("train", args.train_size), ("test", args.test_size)):
        print(f"wrote {num_rows} rows to {written[split]}")
    return written


if __name__ == "__main__":
    main()
