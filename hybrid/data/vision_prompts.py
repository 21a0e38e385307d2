"""Vision-language prompts in verl's layout: `<image>` placeholders and the `images` column.

A prompt file's row holds its images in the `images` column (verl's name), one entry per
image: raw bytes, a parquet struct `{"bytes": ..., "path": ...}`, or a path (relative paths
resolve against the data file's folder). `read_row_images` turns that into an `ImageSet` of
the files' own encoded bytes, each decoded once to check it is an image.

The messages mark where each image goes with a literal `<image>`, in order. `VisionProcessor`
turns the messages and the decoded images into the prompt's token ids as Qwen2-VL's processor
would: each placeholder becomes `<|vision_start|><|image_pad|><|vision_end|>`, the chat
template is applied, and the i-th pad is repeated once per merged patch of the i-th image
(`image_tokens`). The counts come from the model's own image processor (the one the trainer
runs), so the ids and the image features always pair up.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from PIL import Image
from transformers import AutoImageProcessor

from hybrid.data.images import IMAGES_COLUMN, ImageSet, decode_image
from hybrid.models.tokenizer import (
    IMAGE_PAD_TOKEN,
    VISION_END_TOKEN,
    VISION_START_TOKEN,
    load_tokenizer,
)

IMAGE_PLACEHOLDER = "<image>"
"""Where an image goes in a message's content (verl's placeholder)."""
IMAGE_SPAN = f"{VISION_START_TOKEN}{IMAGE_PAD_TOKEN}{VISION_END_TOKEN}"
"""What each placeholder becomes before its pad is expanded."""
PROCESSOR_CONFIG = "preprocessor_config.json"
"""The file that makes a model directory a vision-language one."""
_PAD_RUN = re.compile(f"(?:{re.escape(IMAGE_PAD_TOKEN)})+")


def count_placeholders(messages: Sequence[Mapping[str, Any]]) -> int:
    """How many `<image>` placeholders the messages' contents hold."""
    return sum(str(m["content"]).count(IMAGE_PLACEHOLDER) for m in messages)


class VisionProcessor:
    """Chat messages + images to expanded prompt token ids, for one Qwen2-VL-style model."""

    def __init__(self, tokenizer: Any, image_processor: Any) -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.merge_size: int = int(image_processor.merge_size)
        self.image_pad_id: int = tokenizer.convert_tokens_to_ids(IMAGE_PAD_TOKEN)

    @classmethod
    def from_pretrained(cls, model_path: str | Path) -> VisionProcessor:
        """The tokenizer and image processor of a model directory; raises ValueError if the
        directory has no `preprocessor_config.json` (a text-only model)."""
        path = Path(model_path)
        if not (path / PROCESSOR_CONFIG).is_file():
            raise ValueError(
                f"model {path} has no {PROCESSOR_CONFIG}: it is not a vision-language model "
                "(the model has no image processor)"
            )
        image_processor = AutoImageProcessor.from_pretrained(str(path), local_files_only=True)
        return cls(load_tokenizer(path), image_processor)

    def image_tokens(self, images: Sequence[Image.Image]) -> list[int]:
        """Image tokens (merged patches) each image becomes, in order."""
        if not images:
            return []
        grid = self.image_processor(images=list(images), return_tensors="np")["image_grid_thw"]
        return [int(thw.prod()) // self.merge_size**2 for thw in grid]

    def template_text(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The chat-templated prompt with one `<|image_pad|>` per placeholder (not expanded)."""
        spans = [
            {**m, "content": str(m["content"]).replace(IMAGE_PLACEHOLDER, IMAGE_SPAN)}
            for m in messages
        ]
        text: str = self.tokenizer.apply_chat_template(
            spans, tools=tools, add_generation_prompt=True, tokenize=False
        )
        return text

    def prompt_ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        images: Sequence[Image.Image],
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """The chat-templated prompt's token ids, each image's pad repeated once per image
        token; raises ValueError if the placeholders and the images differ in number."""
        text = self.template_text(messages, tools)
        pieces = text.split(IMAGE_PAD_TOKEN)
        if len(pieces) - 1 != len(images):
            raise ValueError(
                f"the prompt holds {len(pieces) - 1} image pads ({count_placeholders(messages)} "
                f"{IMAGE_PLACEHOLDER} placeholders) but {len(images)} images were given"
            )
        counts = self.image_tokens(images)
        expanded = pieces[0] + "".join(
            IMAGE_PAD_TOKEN * n + piece for n, piece in zip(counts, pieces[1:], strict=True)
        )
        return list(self.tokenizer.encode(expanded, add_special_tokens=False))


def load_vision_processor(model_path: str | Path) -> VisionProcessor | None:
    """The model's `VisionProcessor`, or None for a text-only model (no image processor)."""
    if not (Path(model_path) / PROCESSOR_CONFIG).is_file():
        return None
    return VisionProcessor.from_pretrained(model_path)


def _image_bytes(entry: Any, folder: Path, where: str) -> bytes:
    """One `images` entry's encoded bytes: raw bytes, {"bytes", "path"} or a path."""
    if isinstance(entry, Mapping):
        data = entry.get("bytes")
        if data is not None:
            entry = data
        elif entry.get("path") is not None:
            entry = entry["path"]
        else:
            raise ValueError(f"{where}: a dict image needs 'bytes' or 'path', both are empty")
    if isinstance(entry, bytes | bytearray | memoryview):
        return bytes(entry)
    if isinstance(entry, str | Path):
        path = Path(entry) if Path(entry).is_absolute() else folder / entry
        if not path.is_file():
            raise ValueError(f"{where}: image file {path} does not exist")
        return path.read_bytes()
    raise ValueError(
        f"{where}: an image must be bytes, a path or a {{bytes, path}} dict, "
        f"got {type(entry).__name__}"
    )


def read_row_images(value: Any, data_file: str | Path, row: int) -> ImageSet:
    """One row's `images` column as an `ImageSet` of the files' own bytes (None or an empty
    list: no images). Each image is decoded once; one that cannot be, or a missing path, raises
    ValueError naming the file, the row and the entry (`images[2]`)."""
    data_file = Path(data_file)
    if value is None:
        return ImageSet(())
    if not isinstance(value, list | tuple):
        raise ValueError(
            f"{data_file}: row {row}: field {IMAGES_COLUMN!r} must be a list of images, "
            f"got {type(value).__name__}"
        )
    encoded = []
    for i, entry in enumerate(value):
        where = f"{data_file}: row {row}: field '{IMAGES_COLUMN}[{i}]'"
        data = _image_bytes(entry, data_file.parent, where)
        try:
            decode_image(data)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from error
        encoded.append(data)
    return ImageSet(tuple(encoded))


def collapse_pad_runs(text: str) -> str:
    """`text` with every run of `<|image_pad|>` collapsed to one (the template's form)."""
    return _PAD_RUN.sub(IMAGE_PAD_TOKEN, text)
