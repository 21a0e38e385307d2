"""Unit tests for `hybrid.workers.sequences`: unpadding prompts, position ids from the attention
mask, and packing prompts + sampled responses into the padded rollout tensors."""

import pytest
import torch

from hybrid.rollout.base import GeneratedSample
from hybrid.workers.sequences import pack_rollout, position_ids_from_mask, unpad_prompts

pytestmark = pytest.mark.unit

PAD = 99
# two left-padded prompts of width 4
PROMPTS = torch.tensor([[PAD, PAD, 5, 6], [7, 8, 9, 10]])
PROMPT_MASK = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
SAMPLES = [
    GeneratedSample(token_ids=[11, 12, 13], log_probs=[-0.1, -0.2, -0.3], text="abc"),
    GeneratedSample(token_ids=[14], log_probs=[-0.5], text="d"),
]


def test_unpad_prompts_keeps_the_real_tokens() -> None:
    assert unpad_prompts(PROMPTS, PROMPT_MASK) == [[5, 6], [7, 8, 9, 10]]
    assert unpad_prompts(PROMPTS, PROMPT_MASK.bool()) == [[5, 6], [7, 8, 9, 10]]


def test_position_ids_count_real_tokens_from_zero() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    expected = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]])
    assert torch.equal(position_ids_from_mask(mask), expected)
    assert torch.equal(position_ids_from_mask(mask.bool()), expected)


@pytest.fixture
def packed() -> dict[str, torch.Tensor]:
    return pack_rollout(PROMPTS, PROMPT_MASK, SAMPLES, response_length=4, pad_token_id=PAD)


def test_pack_rollout_shapes_and_dtypes(packed: dict[str, torch.Tensor]) -> None:
    assert set(packed) == {
        "prompts",
        "responses",
        "response_mask",
        "rollout_log_probs",
        "input_ids",
        "attention_mask",
        "position_ids",
    }
    assert packed["prompts"] is PROMPTS
    for key in ("responses", "response_mask", "rollout_log_probs"):
        assert packed[key].shape == (2, 4), key
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert packed[key].shape == (2, 8), key
    assert packed["responses"].dtype == torch.long
    assert packed["attention_mask"].dtype == torch.long
    assert packed["rollout_log_probs"].dtype == torch.float32


def test_pack_rollout_right_pads_responses(packed: dict[str, torch.Tensor]) -> None:
    assert packed["responses"].tolist() == [[11, 12, 13, PAD], [14, PAD, PAD, PAD]]
    assert packed["response_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    expected_lp = torch.tensor([[-0.1, -0.2, -0.3, 0.0], [-0.5, 0.0, 0.0, 0.0]])
    assert torch.equal(packed["rollout_log_probs"], expected_lp)


def test_pack_rollout_full_sequences(packed: dict[str, torch.Tensor]) -> None:
    assert packed["input_ids"].tolist() == [
        [PAD, PAD, 5, 6, 11, 12, 13, PAD],
        [7, 8, 9, 10, 14, PAD, PAD, PAD],
    ]
    assert packed["attention_mask"].tolist() == [
        [0, 0, 1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 0, 0, 0],
    ]


def test_pack_rollout_positions_continue_after_a_left_padded_prompt(
    packed: dict[str, torch.Tensor],
) -> None:
    positions = packed["position_ids"]
    mask = packed["attention_mask"].bool()
    # real tokens: 0, 1, 2, ... across prompt and response
    assert positions[0][mask[0]].tolist() == [0, 1, 2, 3, 4]
    assert positions[1][mask[1]].tolist() == [0, 1, 2, 3, 4]
    # the left padding sits at 0 and the first response token follows the last prompt token
    assert positions[0, :2].tolist() == [0, 0]
    assert positions[0, 4].item() == positions[0, 3].item() + 1 == 2


def test_pack_rollout_accepts_a_full_length_and_an_empty_response() -> None:
    samples = [
        GeneratedSample([1, 2, 3, 4], [-1.0, -2.0, -3.0, -4.0], "full"),
        GeneratedSample([], [], ""),
    ]
    packed = pack_rollout(PROMPTS, PROMPT_MASK, samples, response_length=4, pad_token_id=PAD)
    assert packed["responses"].tolist() == [[1, 2, 3, 4], [PAD] * 4]
    assert packed["response_mask"].tolist() == [[1, 1, 1, 1], [0, 0, 0, 0]]
    assert packed["position_ids"][0].tolist() == [0, 0, 0, 1, 2, 3, 4, 5]


def test_pack_rollout_rejects_an_overlong_response_naming_the_row() -> None:
    samples = [SAMPLES[0], GeneratedSample([1, 2, 3, 4, 5], [0.0] * 5, "long")]
    with pytest.raises(ValueError, match=r"row 1: .*5 tokens.*response_length=4"):
        pack_rollout(PROMPTS, PROMPT_MASK, samples, response_length=4, pad_token_id=PAD)
