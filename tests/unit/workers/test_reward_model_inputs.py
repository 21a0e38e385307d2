"""The reward model's config and input checks (named before any worker starts), and what it
reads: the policy's rows re-rendered in its own tokenizer, cut from the left, packed or padded."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from hybrid.data import Batch
from hybrid.models import TinyModelConfig, build_tiny_model, build_tokenizer, hf_config
from hybrid.models.tokenizer import save_tokenizer
from hybrid.rewards.config import RewardModelConfig
from hybrid.trainer.compose import compose, to_run_config
from hybrid.workers.reward_inputs import encode_texts, packed, padded, render_texts
from hybrid.workers.reward_model import check_reward_model

pytestmark = pytest.mark.unit

ARITHMETIC = TinyModelConfig.preset("tiny", vocab="arithmetic")


def write_classifier(path: Path, *, num_labels: int = 1, tokenizer: bool = True) -> Path:
    """A sequence classifier's config.json (weights are not read by the checks)."""
    config = hf_config(ARITHMETIC)
    config.architectures = ["Qwen2ForSequenceClassification"]
    config.num_labels = num_labels
    config.save_pretrained(path)
    if tokenizer:
        save_tokenizer(build_tokenizer("arithmetic"), path)
    return path


# --- config -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("reward.model.combine=avg", r"reward\.model\.combine must be one of \['sum', 'replace'\]"),
        ("reward.model.combine_by_source={chat: max}", r"reward\.model\.combine_by_source\.chat"),
        ("reward.model.combine_by_source=3", r"reward\.model\.combine_by_source must map"),
        ("reward.model.coef=0", r"reward\.model\.coef must be a finite number other than 0"),
        ("reward.model.micro_batch_size=0", r"reward\.model\.micro_batch_size must be > 0"),
        ("reward.model.max_length=-1", r"reward\.model\.max_length must be > 0"),
        ("reward.model.precision.param_dtype=int8", r"reward\.model\.precision\.param_dtype"),
    ],
)
def test_each_bad_field_is_named(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        to_run_config(compose("config", ["reward.model.path=/some/rm", override]))


def test_settings_without_a_model_are_refused_and_overrides_compose() -> None:
    with pytest.raises(ValueError, match=r"reward\.model\.path is null .* reward\.model\.combine"):
        to_run_config(compose("config", ["reward.model.combine=replace"]))
    with pytest.raises(ValueError, match=r"reward\.model\.path is empty"):
        RewardModelConfig(path=" ")
    config = to_run_config(
        compose(
            "config",
            ["reward.model.path=/some/rm", "reward.model.combine_by_source={chat: replace}"],
        )
    )
    rm = config.worker_config().reward_model
    assert rm.enabled and rm.combine_for("chat") == "replace" and rm.combine_for("x") == "sum"
    assert not RewardModelConfig().enabled


# --- input checks (driver side) -----------------------------------------------------------


def test_a_sequence_classifier_with_one_label_passes(tmp_path: Path) -> None:
    check_reward_model(RewardModelConfig(path=str(write_classifier(tmp_path / "rm"))))


def test_a_causal_lm_is_not_a_reward_model(tmp_path: Path) -> None:
    policy = build_tiny_model(tmp_path / "policy", ARITHMETIC)
    with pytest.raises(
        ValueError, match=r"reward\.model\.path=.*is a \['Qwen2ForCausalLM'\], not a sequence"
    ):
        check_reward_model(RewardModelConfig(path=str(policy)))


def test_two_labels_and_missing_files_are_named(tmp_path: Path) -> None:
    two = write_classifier(tmp_path / "two", num_labels=2)
    with pytest.raises(ValueError, match=r"reward\.model\.path=.*num_labels is 2"):
        check_reward_model(RewardModelConfig(path=str(two)))
    with pytest.raises(ValueError, match=r"reward\.model\.path=.*no config\.json"):
        check_reward_model(RewardModelConfig(path=str(tmp_path / "nowhere")))
    bare = write_classifier(tmp_path / "bare", tokenizer=False)
    with pytest.raises(ValueError, match=r"reward\.model\.path=.*has no tokenizer files"):
        check_reward_model(RewardModelConfig(path=str(bare)))
    # The fallback to another directory's tokenizer (e.g. the policy's) passes when it fits.
    check_reward_model(RewardModelConfig(path=str(bare), tokenizer_path=str(two)))


def test_a_tokenizer_with_ids_past_the_embedding_is_refused(tmp_path: Path) -> None:
    bare = write_classifier(tmp_path / "bare", tokenizer=False)  # 16 ids
    text_policy = build_tiny_model(tmp_path / "policy", TinyModelConfig.preset("tiny"))  # 272
    with pytest.raises(
        ValueError,
        match=r"embedding has 16 token ids, the tokenizer at .*policy \(not its own: "
        r"reward\.model\.tokenizer_path\) has 272",
    ):
        check_reward_model(RewardModelConfig(path=str(bare), tokenizer_path=str(text_policy)))


# --- what the reward model reads ----------------------------------------------------------


def policy_rows(tokenizer: object, prompts: list[str], responses: list[str]) -> Batch:
    """A rollout batch in the padded layout: left-padded prompts, right-padded responses."""
    prompt_ids = [
        tokenizer.encode(  # type: ignore[attr-defined]
            tokenizer.apply_chat_template(  # type: ignore[attr-defined]
                [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )
        for p in prompts
    ]
    response_ids = [[*tokenizer.encode(r), 2] for r in responses]  # type: ignore[attr-defined]
    width, length = max(map(len, prompt_ids)), max(map(len, response_ids))
    rows, mask, resp, resp_mask = [], [], [], []
    for p, r in zip(prompt_ids, response_ids, strict=True):
        rows.append([0] * (width - len(p)) + p + r + [0] * (length - len(r)))
        mask.append([0] * (width - len(p)) + [1] * (len(p) + len(r)) + [0] * (length - len(r)))
        resp.append(r + [0] * (length - len(r)))
        resp_mask.append([1] * len(r) + [0] * (length - len(r)))
    return Batch.from_dict(
        {
            "input_ids": torch.tensor(rows),
            "attention_mask": torch.tensor(mask),
            "responses": torch.tensor(resp),
            "response_mask": torch.tensor(resp_mask),
        },
        {"raw_prompt": prompts},
    )


def test_rows_render_in_the_reward_models_template_or_as_plain_text() -> None:
    tokenizer = build_tokenizer("arithmetic")
    batch = policy_rows(tokenizer, ["1+2=", "12+3="], ["3", "15"])
    assert render_texts(batch, tokenizer, tokenizer) == [
        "<|im_start|>1+2=<|im_end|><|im_start|>3<|im_end|>",
        "<|im_start|>12+3=<|im_end|><|im_start|>15<|im_end|>",
    ]
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    # No template: the policy's prompt as decoded (its markers are special tokens, dropped)
    # followed by the response.
    assert render_texts(batch, tokenizer, plain) == ["1+2=3", "12+3=15"]


def test_long_rows_lose_tokens_on_the_left_and_are_counted() -> None:
    tokenizer = build_tokenizer("arithmetic")
    ids, truncated = encode_texts(["1+2=3", "12345678"], tokenizer, 6, templated=True)
    assert truncated == [False, True]
    assert tokenizer.decode(ids[0]) == "1+2=3" and tokenizer.decode(ids[1]) == "345678"
    with pytest.raises(ValueError, match="renders to no tokens"):
        encode_texts([""], tokenizer, 6, templated=True)


def test_packed_and_padded_inputs_point_at_each_rows_last_token() -> None:
    ids = [[5, 6, 7], [8], [9, 10]]
    flat = packed(ids, torch.device("cpu"))
    assert flat.input_ids.tolist() == [[5, 6, 7, 8, 9, 10]]
    assert flat.position_ids.tolist() == [[0, 1, 2, 0, 0, 1]]
    assert flat.input_ids.flatten()[flat.score_index].tolist() == [7, 8, 10]
    assert flat.cu_seqlens is not None and flat.cu_seqlens.tolist() == [0, 3, 4, 6]
    grid = padded(ids, 0, torch.device("cpu"))
    assert grid.attention_mask is not None
    assert grid.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
    assert grid.input_ids.flatten()[grid.score_index].tolist() == [7, 8, 10]
    assert grid.position_ids.tolist()[2][:2] == [0, 1]
