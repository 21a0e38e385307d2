"""Geometry3K (the Hub's hiyouga/geometry3k parquet files) to prompt parquet files in verl's
layout with images (see docs/vision.md).

Each raw row is {"images": [one image], "problem": text with one "<image>" placeholder,
"answer": the final answer}. Output rows: data_source "hiyouga/geometry3k" (scored by the MATH
reward: the last \\boxed{} checked by math-verify), one user message (the problem and an
instruction to put the final answer in \\boxed{}), the `images` column as it was (bytes kept,
never decoded here: the dataset loader checks every image when it reads the file),
reward_model {"style": "rule", "ground_truth": answer} and extra_info {split, index}.

No download happens: point --input-dir at a local copy of the dataset (the folder holding
train-*.parquet and test-*.parquet, or its data/ subfolder).

    python examples/data/geo3k.py --input-dir /path/to/geometry3k --output-dir data/geo3k
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from hybrid.data.dataset import write_rows

DATA_SOURCE = "hiyouga/geometry3k"
INSTRUCTION = "Reason step by step, then write the final answer inside \\boxed{}."
SPLITS = ("train", "test")
PLACEHOLDER = "<image>"


def convert_row(raw: dict[str, Any], split: str, index: int, where: str) -> dict[str, Any]:
    """One raw row to a prompt row; `where` ("file: row n") names it in errors."""
    for key in ("problem", "answer"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise ValueError(f"{where}: field {key!r} is missing or not a non-empty str")
    images = raw.get("images")
    if not isinstance(images, list) or not images:
        raise ValueError(f"{where}: field 'images' is missing or empty")
    placeholders = raw["problem"].count(PLACEHOLDER)
    if placeholders != len(images):
        raise ValueError(
            f"{where}: field 'problem' has {placeholders} {PLACEHOLDER} placeholders for "
            f"{len(images)} images"
        )
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{raw['problem']} {INSTRUCTION}"}],
        "images": images,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": raw["answer"].strip()},
        "extra_info": {"split": split, "index": index},
    }


def split_files(input_dir: Path, split: str) -> list[Path]:
    """The raw parquet files of `split` (the Hub names them `<split>-NNNNN-of-NNNNN.parquet`)."""
    for folder in (input_dir, input_dir / "data"):
        files = sorted(folder.glob(f"{split}-*.parquet")) or sorted(folder.glob(f"{split}.parquet"))
        if files:
            return files
    raise FileNotFoundError(f"no {split}-*.parquet under {input_dir} (or its data/ folder)")


def convert_split(input_dir: Path, split: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in split_files(input_dir, split):
        for number, raw in enumerate(pq.read_table(path).to_pylist()):
            rows.append(convert_row(raw, split, len(rows), f"{path}: row {number}"))
    return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Path]:
    """Write train.parquet and test.parquet; returns the written file of each split."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input-dir", type=Path, required=True)
    parser.add_argument("--output-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    written = {}
    for split in SPLITS:
        rows = convert_split(args.input_dir, split)
        written[split] = write_rows(rows, args.output_dir / f"{split}.parquet")
        print(f"wrote {len(rows)} rows to {written[split]}")
    return written


if __name__ == "__main__":
    main()
