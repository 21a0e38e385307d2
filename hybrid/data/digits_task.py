"""The vision-language demo task: read the one digit an image shows ("<image>" -> "7").

Each row's image is a black digit 0-9 on a white 56 x 56 square, drawn from a 5 x 7 pixel
font scaled 6x (no font files needed) at a small random offset from the centre. The prompt is
the bare placeholder `[{"role": "user", "content": "<image>"}]` (the tiny "arithmetic"
vocabulary encodes no letters), the answer the digit. `--blank-images` writes the same rows
with all-white images: the control run, whose reward must stay at chance (1 in 10) if the
model really reads the image. Rows: data_source "digits_vl", ground_truth the digit (str),
images [{"bytes": png, "path": None}], extra_info {split, index, digit, blank}.
Deterministic: the same seed writes the same bytes. The command line is
examples/data/digits_vl.py; `python -m hybrid.main --config-name vlm_demo` builds the demo's
files with the same function.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from hybrid.data.dataset import write_rows
from hybrid.data.images import IMAGES_COLUMN, encode_png

DATA_SOURCE = "digits_vl"
SPLITS = ("train", "test")
IMAGE_SIZE = 56
SCALE = 6
"""Pixels per font cell: a digit is 30 x 42 pixels."""
MAX_OFFSET = 4
"""The digit's top-left corner moves up to this many pixels from centred, each way."""
FONT: dict[int, tuple[str, ...]] = {
    0: ("01110", "10001", "10011", "10101", "11001", "10001", "01110"),
    1: ("00100", "01100", "00100", "00100", "00100", "00100", "01110"),
    2: ("01110", "10001", "00001", "00010", "00100", "01000", "11111"),
    3: ("11111", "00010", "00100", "00010", "00001", "10001", "01110"),
    4: ("00010", "00110", "01010", "10010", "11111", "00010", "00010"),
    5: ("11111", "10000", "11110", "00001", "00001", "10001", "01110"),
    6: ("00110", "01000", "10000", "11110", "10001", "10001", "01110"),
    7: ("11111", "00001", "00010", "00100", "01000", "01000", "01000"),
    8: ("01110", "10001", "10001", "01110", "10001", "10001", "01110"),
    9: ("01110", "10001", "10001", "01111", "00001", "00010", "01100"),
}
"""A 5 x 7 pixel font: "1" is ink."""


def render_digit(digit: int, offset: tuple[int, int], blank: bool = False) -> Image.Image:
    """The 56 x 56 RGB image of `digit`, black on white, moved by `offset` (dx, dy) from
    centred; `blank`: all white."""
    pixels = np.full((IMAGE_SIZE, IMAGE_SIZE), 255, dtype=np.uint8)
    if not blank:
        glyph = np.array([[c == "1" for c in line] for line in FONT[digit]])
        ink = np.kron(glyph, np.ones((SCALE, SCALE), dtype=bool))
        height, width = ink.shape
        top = (IMAGE_SIZE - height) // 2 + offset[1]
        left = (IMAGE_SIZE - width) // 2 + offset[0]
        pixels[top : top + height, left : left + width][ink] = 0
    return Image.fromarray(pixels).convert("RGB")


def make_rows(
    num_rows: int, split: str, rng: np.random.Generator, blank: bool = False
) -> list[dict[str, Any]]:
    """`num_rows` rows, each a digit drawn uniformly from 0-9 at a random offset (drawn the
    same way with `blank`, so a blank file holds the same rows but for the pixels)."""
    digits = rng.integers(0, 10, size=num_rows).tolist()
    offsets = rng.integers(-MAX_OFFSET, MAX_OFFSET + 1, size=(num_rows, 2)).tolist()
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": "<image>"}],
            IMAGES_COLUMN: [{"bytes": encode_png(render_digit(d, (dx, dy), blank)), "path": None}],
            "reward_model": {"style": "rule", "ground_truth": str(d)},
            "extra_info": {"split": split, "index": index, "digit": d, "blank": blank},
        }
        for index, (d, (dx, dy)) in enumerate(zip(digits, offsets, strict=True))
    ]


def write_digits_vl(
    output_dir: str | Path,
    train_size: int = 1000,
    test_size: int = 100,
    seed: int = 0,
    blank: bool = False,
) -> dict[str, Path]:
    """Write output_dir/train.parquet and output_dir/test.parquet (train drawn first from one
    generator seeded with `seed`); returns the written file of each split."""
    for name, value in (("train_size", train_size), ("test_size", test_size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    rng = np.random.default_rng(seed)
    written = {}
    for split, num_rows in zip(SPLITS, (train_size, test_size), strict=True):
        rows = make_rows(num_rows, split, rng, blank)
        written[split] = write_rows(rows, Path(output_dir) / f"{split}.parquet")
    return written
