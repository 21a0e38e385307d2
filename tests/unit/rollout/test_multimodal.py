"""The engine's view of a vision-language model's tokens: the ids read from its config, the
image pads collapsed for vLLM (which expands them again), the banned ids and a response that
holds one refused naming the sample; the engine arguments of a VLM (images only)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.engine_args import EngineSite, engine_kwargs
from hybrid.rollout.multimodal import (
    VisionTokens,
    check_no_placeholders,
    collapse_image_pads,
    vision_tokens,
)

pytestmark = pytest.mark.unit

PAD = 18
QWEN2_VL = SimpleNamespace(
    vision_config=object(),
    image_token_id=PAD,
    video_token_id=19,
    vision_start_token_id=16,
    vision_end_token_id=17,
)


def test_the_vision_tokens_of_a_vlm_and_of_a_text_model() -> None:
    tokens = vision_tokens(QWEN2_VL)
    assert tokens.is_vision and tokens.banned == {16, 17, 18, 19}
    text = vision_tokens(SimpleNamespace(vision_config=None, image_token_id=5))
    assert not text.is_vision and text.banned == frozenset()
    assert VisionTokens().banned == frozenset()


def test_each_run_of_pads_collapses_to_one() -> None:
    ids = [1, 16, PAD, PAD, PAD, PAD, 17, 5, 16, PAD, PAD, 17, PAD, 2]
    assert collapse_image_pads(ids, PAD) == [1, 16, PAD, 17, 5, 16, PAD, 17, PAD, 2]
    assert collapse_image_pads([1, 2, 3], PAD) == [1, 2, 3]


def test_a_sampled_placeholder_is_named() -> None:
    check_no_placeholders([5, 6, 2], frozenset({16, 18}), "sample u#0")
    with pytest.raises(ValueError, match=r"sample u#3: .* placeholder token\(s\) \[18\]"):
        check_no_placeholders([5, 18, 2], frozenset({16, 18}), "sample u#3")


def test_a_vlm_engine_takes_images_only_up_to_max_images() -> None:
    config = RolloutConfig(max_images=2)
    site = EngineSite("cpu", 0, 0)
    kwargs = engine_kwargs(config, site, dtype="bfloat16", lora_rank=0, vision=True)
    assert kwargs["limit_mm_per_prompt"] == {"image": 2, "video": 0}
    assert "limit_mm_per_prompt" not in engine_kwargs(config, site, dtype="bfloat16", lora_rank=0)
    with pytest.raises(ValueError, match=r"rollout\.max_images"):
        RolloutConfig(max_images=0)
