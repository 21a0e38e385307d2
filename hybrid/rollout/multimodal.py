"""What an engine needs to know about a vision-language model's tokens, read from its config.

A prompt's token ids hold each image's span expanded: one `<|image_pad|>` per merged patch, as
the trainer's model reads them. vLLM expands the pads itself from the image it is given, so
its request carries each run of pads collapsed to one (`collapse_image_pads`). A pad the model
samples would have no image behind it and break the pairing of image tokens and features at
the next forward (the peers' most repeated VLM error), so the vision tokens are never sampled
(`VisionTokens.banned`), and a response holding one is refused where samples are built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SAMPLING_BAN = -100.0
"""The logit bias that takes a token out of sampling (vLLM clamps biases to [-100, 100]:
e^-100 of the mass is left, below any float32 draw)."""


@dataclass(frozen=True)
class VisionTokens:
    """The vision token ids of a model (all None / empty for a text-only model)."""

    image_pad: int | None = None
    video_pad: int | None = None
    vision_start: int | None = None
    vision_end: int | None = None

    @property
    def banned(self) -> frozenset[int]:
        """Ids a response may never contain."""
        ids = (self.image_pad, self.video_pad, self.vision_start, self.vision_end)
        return frozenset(i for i in ids if i is not None)

    @property
    def is_vision(self) -> bool:
        return self.image_pad is not None


def vision_tokens(hf_config: Any) -> VisionTokens:
    """The vision token ids a Hugging Face config names (Qwen2-VL's field names)."""
    if getattr(hf_config, "vision_config", None) is None:
        return VisionTokens()
    return VisionTokens(
        image_pad=getattr(hf_config, "image_token_id", None),
        video_pad=getattr(hf_config, "video_token_id", None),
        vision_start=getattr(hf_config, "vision_start_token_id", None),
        vision_end=getattr(hf_config, "vision_end_token_id", None),
    )


def collapse_image_pads(token_ids: Sequence[int], image_pad: int) -> list[int]:
    """`token_ids` with every run of `image_pad` collapsed to one (what vLLM re-expands)."""
    out: list[int] = []
    for token in token_ids:
        if token == image_pad and out and out[-1] == image_pad:
            continue
        out.append(token)
    return out


def check_no_placeholders(response_ids: Sequence[int], banned: frozenset[int], where: str) -> None:
    """Raise naming `where` if a response holds a vision token (one the engine must not
    sample)."""
    found = sorted(set(response_ids) & banned)
    if found:
        raise ValueError(
            f"{where}: the engine sampled vision placeholder token(s) {found}; they are banned "
            "from sampling (an image pad without an image breaks the image-feature pairing)"
        )
