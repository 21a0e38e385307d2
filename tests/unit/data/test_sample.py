"""`hybrid.data.sample`: Samples to the padded training batch (the one conversion every
placement uses), the per-token lists' checks, version lag."""

import pytest
import torch

from hybrid.algorithms.off_policy import version_lag
from hybrid.data.sample import (
    NO_VERSION,
    Sample,
    SampleStatus,
    position_ids_from_mask,
    samples_to_batch,
)

pytestmark = pytest.mark.unit

PAD = 99


def sample(prompt: list[int], response: list[int], version: int = 0, **kw: object) -> Sample:
    return Sample(
        uid=str(kw.pop("uid", "p0")),
        index=int(kw.pop("index", 0)),  # type: ignore[call-overload]
        prompt_ids=prompt,
        response_ids=response,
        rollout_log_probs=[-0.1 * (i + 1) for i in range(len(response))],
        versions=[version] * len(response),
        status=SampleStatus.COMPLETED,
        text="".join(chr(97 + t % 26) for t in response),
        **kw,  # type: ignore[arg-type]
    )


SAMPLES = [
    sample([5, 6], [11, 12, 13], version=3, metadata={"data_source": "a"}),
    sample([7, 8, 9, 10], [14], version=2, index=1, metadata={"data_source": "b"}),
]


@pytest.fixture
def batch():  # type: ignore[no-untyped-def]
    return samples_to_batch(SAMPLES, response_length=4, pad_token_id=PAD)


def test_shapes_dtypes_and_columns(batch) -> None:  # type: ignore[no-untyped-def]
    for key in ("responses", "response_mask", "rollout_log_probs", "versions"):
        assert batch[key].shape == (2, 4), key
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert batch[key].shape == (2, 8), key
    assert batch["prompts"].shape == (2, 4)
    assert batch["responses"].dtype == torch.long
    assert batch["rollout_log_probs"].dtype == torch.float32
    assert list(batch["uid"]) == ["p0", "p0"]
    assert list(batch["index"]) == [0, 1]
    assert list(batch["data_source"]) == ["a", "b"]
    assert list(batch["status"]) == ["completed", "completed"]


def test_prompts_left_padded_responses_right_padded(batch) -> None:  # type: ignore[no-untyped-def]
    assert batch["input_ids"].tolist() == [
        [PAD, PAD, 5, 6, 11, 12, 13, PAD],
        [7, 8, 9, 10, 14, PAD, PAD, PAD],
    ]
    assert batch["attention_mask"].tolist() == [
        [0, 0, 1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 0, 0, 0],
    ]
    assert batch["response_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    expected = torch.tensor([[-0.1, -0.2, -0.3, 0.0], [-0.1, 0.0, 0.0, 0.0]])
    assert torch.allclose(batch["rollout_log_probs"], expected)


def test_versions_per_token_and_padding(batch) -> None:  # type: ignore[no-untyped-def]
    assert batch["versions"].tolist() == [[3, 3, 3, NO_VERSION], [2] + [NO_VERSION] * 3]
    lag = version_lag(batch["versions"], batch["response_mask"], trainer_version=3)
    assert lag.tolist() == [[0, 0, 0, 0], [1, 0, 0, 0]]


def test_positions_continue_after_a_left_padded_prompt(batch) -> None:  # type: ignore[no-untyped-def]
    positions, mask = batch["position_ids"], batch["attention_mask"].bool()
    assert positions[0][mask[0]].tolist() == [0, 1, 2, 3, 4]
    assert positions[0, :2].tolist() == [0, 0]


def test_a_given_prompt_width_and_an_empty_response() -> None:
    out = samples_to_batch(
        [sample([1, 2], [1, 2, 3, 4]), sample([3], [], index=1)], 4, PAD, prompt_width=3
    )
    assert out["prompts"].tolist() == [[PAD, 1, 2], [PAD, PAD, 3]]
    assert out["response_mask"].tolist() == [[1, 1, 1, 1], [0, 0, 0, 0]]
    assert out["position_ids"][0].tolist() == [0, 0, 1, 2, 3, 4, 5]


def test_position_ids_count_real_tokens_from_zero() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    expected = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]])
    assert torch.equal(position_ids_from_mask(mask), expected)
    assert torch.equal(position_ids_from_mask(mask.bool()), expected)


def test_bad_samples_are_named() -> None:
    long = sample([1], [1, 2, 3, 4, 5], uid="q7", index=2)
    with pytest.raises(ValueError, match=r"q7#2: 5 response tokens.*response_length=4"):
        samples_to_batch([long], 4, PAD)
    ragged = sample([1], [1, 2], uid="q8")
    ragged.versions = [0]
    with pytest.raises(ValueError, match=r"q8#0: per-token lists differ"):
        samples_to_batch([ragged], 4, PAD)
    with pytest.raises(ValueError, match=r"prompt of 2 tokens exceeds the width 1"):
        samples_to_batch([sample([1, 2], [3])], 4, PAD, prompt_width=1)
    mixed = [sample([1], [2], metadata={"a": 1}), sample([1], [2], index=1, metadata={"b": 1})]
    with pytest.raises(ValueError, match=r"p0#1: metadata keys \['b'\]"):
        samples_to_batch(mixed, 4, PAD)
    with pytest.raises(ValueError, match="collides"):
        samples_to_batch([sample([1], [2], metadata={"uid": "x"})], 4, PAD)
    with pytest.raises(ValueError, match="no samples"):
        samples_to_batch([], 4, PAD)


def test_oldest_version_is_the_staleness_of_a_partial_rollout() -> None:
    resumed = sample([1], [5, 6, 7])
    resumed.versions = [4, 4, 5]
    assert resumed.oldest_version == 4
    assert sample([1], []).oldest_version == NO_VERSION


def trajectory(uid: str = "t") -> Sample:
    """Two model tokens, a two-token tool reply, one model token."""
    return Sample(
        uid=uid,
        index=0,
        prompt_ids=[1, 2],
        response_ids=[10, 11, 50, 51, 12],
        rollout_log_probs=[-0.1, -0.2, 0.0, 0.0, -0.3],
        versions=[4, 4, NO_VERSION, NO_VERSION, 5],
        status=SampleStatus.COMPLETED,
        loss_mask=[1, 1, 0, 0, 1],
        token_rewards=[0.0, 0.5, 0.0, 0.0, 0.0],
        agent_stats={"turns": 2},
    )


def test_a_trajectory_attends_to_its_replies_and_trains_only_its_own_tokens() -> None:
    batch = samples_to_batch([trajectory()], response_length=6, pad_token_id=0)
    assert batch["response_mask"].tolist() == [[1, 1, 0, 0, 1, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1, 1, 0]]
    assert batch["env_rewards"].tolist() == [[0.0, 0.5, 0.0, 0.0, 0.0, 0.0]]
    assert list(batch["agent_stats"]) == [{"turns": 2}]
    assert trajectory().oldest_version == 4  # context tokens have no version


def test_trajectories_and_single_turn_samples_do_not_share_a_batch() -> None:
    single = Sample(
        uid="s",
        index=0,
        prompt_ids=[1],
        response_ids=[3],
        rollout_log_probs=[0.0],
        versions=[0],
        status=SampleStatus.COMPLETED,
    )
    with pytest.raises(ValueError, match="cannot share a batch"):
        samples_to_batch([trajectory(), single], response_length=6, pad_token_id=0)


def test_a_loss_mask_of_the_wrong_length_is_named() -> None:
    bad = trajectory()
    bad.loss_mask = [1, 1]
    with pytest.raises(ValueError, match=r"sample t#0: per-token lists differ"):
        samples_to_batch([bad], response_length=6, pad_token_id=0)
