"""A vision-language model's inputs for one micro-batch: pixels, image grids, mRoPE positions.

The batch carries each row's images as encoded bytes (`images` column, hybrid.data.images) and
its token ids with every image span already expanded. For a micro-batch this module builds:
  - `pixel_values` / `image_grid_thw` of the micro-batch's images, row by row in row order
    (the order the model scatters features into image tokens), by the model's own image
    processor: the rows of a micro-batch and their images are split together, by
    construction;
  - the family's 3-row mRoPE positions (temporal, height, width) from the ids and the grids,
    by the model's `get_rope_index`; packed, the text row (positions restarting per sequence)
    goes first, (4, 1, T), which transformers reads as the packing's sequence bounds.
A micro-batch without images still runs the vision tower (`text_only_tower_pass`): a blank
image's features times zero join the embeddings, so every FSDP rank gathers and reduces the
tower's shards in step whether or not its rows hold images.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from hybrid.data import Batch
from hybrid.data.images import IMAGES_COLUMN, ImageSet
from hybrid.workers.log_prob_head import unwrapped_model
from hybrid.workers.packing import ModelInputs

IMAGE_TOKEN_TYPE = 1
"""transformers' `mm_token_type_ids` value of an image token (text 0, video 2)."""


@dataclass(frozen=True)
class VisionFamily:
    """What one vision-language model needs to turn a micro-batch into its inputs."""

    image_processor: Any
    """The model's image processor (transformers, PIL backend)."""
    image_token_id: int
    rope_index: Any
    """The family's `get_rope_index(input_ids, mm_token_type_ids, image_grid_thw,
    attention_mask)` -> ((3, b, S) positions, deltas)."""
    tower: nn.Module
    """The vision tower (`model.visual`), for the text-only pass."""
    embedding: nn.Module
    """The decoder's input embedding, where the text-only pass joins in."""


def vision_family(model: nn.Module, model_path: str) -> VisionFamily | None:
    """The `VisionFamily` of a built model (None: a text-only model)."""
    from transformers import AutoImageProcessor

    from hybrid.workers.fsdp import vision_tower

    base: Any = unwrapped_model(model)
    if getattr(base.config, "vision_config", None) is None:
        return None
    return VisionFamily(
        image_processor=AutoImageProcessor.from_pretrained(model_path),
        image_token_id=int(base.config.image_token_id),
        rope_index=base.model.get_rope_index,
        tower=vision_tower(base),
        embedding=base.get_input_embeddings(),
    )


def pixel_inputs(
    family: VisionFamily, rows: list[ImageSet | None]
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(pixel_values, image_grid_thw) of every image of `rows`, in row order; None if none
    of them holds an image."""
    image_rows = [row for row in rows if row]
    if not image_rows:
        return None
    # A group's n samples share their prompt's images: each distinct set is processed once.
    processed: dict[ImageSet, tuple[torch.Tensor, torch.Tensor]] = {}
    for row in image_rows:
        if row not in processed:
            out = family.image_processor(images=row.decode(), return_tensors="pt")
            processed[row] = (out["pixel_values"], out["image_grid_thw"])
    pixels = torch.cat([processed[row][0] for row in image_rows])
    grids = torch.cat([processed[row][1] for row in image_rows])
    return pixels, grids


def with_images(
    family: VisionFamily, inputs: ModelInputs, micro: Batch, packed: bool
) -> ModelInputs:
    """`inputs` of a micro-batch with its images: pixels, grids and mRoPE positions."""
    column = micro.non_tensors.get(IMAGES_COLUMN)
    rows: list[ImageSet | None] = [None] * len(micro) if column is None else list(column)
    pixels = pixel_inputs(family, rows)
    if pixels is None:
        return inputs
    pixel_values, grid = pixels
    ids = micro.tensors["input_ids"]
    mask = micro.tensors["attention_mask"]
    token_types = (ids == family.image_token_id).int() * IMAGE_TOKEN_TYPE
    rope, _ = family.rope_index(ids, token_types, image_grid_thw=grid, attention_mask=mask)
    if packed:
        valid = mask.bool()
        rope = rope[:, valid].unsqueeze(1)  # (3, 1, T)
        positions = torch.cat([inputs.position_ids.unsqueeze(0), rope], dim=0)  # (4, 1, T)
    else:
        positions = rope  # (3, b, S); the attention mask marks padding
    device = ids.device
    return replace(
        inputs,
        position_ids=positions.to(device),
        pixel_values=pixel_values.to(device),
        image_grid_thw=grid.to(device),
    )


BLANK_GRID = (1, 2, 2)
"""The smallest image grid (one merged token): the text-only pass's blank image."""


@contextmanager
def text_only_tower_pass(family: VisionFamily | None, inputs: ModelInputs) -> Iterator[None]:
    """Within the block, a forward of a micro-batch without images also runs the vision
    tower on a blank image and adds its features times zero to the embeddings: the tower's
    FSDP collectives (and its zero gradients) happen on every rank alike."""
    if family is None or inputs.pixel_values is not None:
        yield
        return
    tower = family.tower

    def join(_module: nn.Module, _args: Any, output: torch.Tensor) -> torch.Tensor:
        grid = torch.tensor([BLANK_GRID], device=output.device)
        patch: Any = tower.patch_embed
        width = patch.in_channels * patch.temporal_patch_size * patch.patch_size**2
        blank = torch.zeros(int(grid.prod()), width, device=output.device, dtype=output.dtype)
        features = tower(blank, grid_thw=grid).pooler_output
        return output + 0.0 * features.sum().to(output.dtype)

    handle = family.embedding.register_forward_hook(join)
    try:
        yield
    finally:
        handle.remove()
