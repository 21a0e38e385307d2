"""`ImageSet`: the images of one prompt, the typed multimodal payload of a vision-language run.

A prompt row's images travel from the data file to the engine request and to the trainer as
encoded bytes (PNG, or the file's own JPEG/PNG bytes), never as PIL objects: bytes pickle
cheaply through Ray and decode the same everywhere. They ride on `Sample.images` and on a
Batch's `images` column, never in a Sample's metadata, so reward processes never receive them.

The prompt's token ids already hold each image's span expanded (`<|vision_start|>`, one
`<|image_pad|>` per merged patch, `<|vision_end|>`), in the order of the images here.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

IMAGES_COLUMN = "images"
"""The Batch column (and prompt-file column, verl's name) that holds each row's images."""


@dataclass(frozen=True)
class ImageSet:
    """The images of one prompt, in the order its placeholders use them."""

    encoded: tuple[bytes, ...]
    """Each image's encoded file bytes."""

    def __len__(self) -> int:
        return len(self.encoded)

    def decode(self) -> list[Image.Image]:
        """The images as RGB PIL images (what processors and vLLM read)."""
        return [decode_image(data) for data in self.encoded]


def decode_image(data: bytes) -> Image.Image:
    """One encoded image as an RGB PIL image; raises ValueError if it is not an image."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return image.convert("RGB")
    except (OSError, SyntaxError, ValueError) as error:
        raise ValueError(f"not a decodable image ({len(data)} bytes): {error}") from error


def encode_png(image: Image.Image) -> bytes:
    """A PIL image as PNG bytes (lossless: the engine and the trainer see the same pixels)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def image_sets(column: Sequence[Any] | np.ndarray | None, rows: int) -> list[ImageSet | None]:
    """A Batch's `images` column as one entry per row (None: the column is absent)."""
    if column is None:
        return [None] * rows
    return list(column)
