"""The reward model member on the real stack (2 CPU workers, Ray, FSDP2, vLLM) with a tiny
untrained sequence classifier built here: its score of a row is a plain Hugging Face forward of
the same text on the same checkpoint, and a 2-step run with combine=sum reports its metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, Qwen2ForSequenceClassification

from hybrid.data import Batch
from hybrid.models import TinyModelConfig, build_tokenizer, hf_config
from hybrid.models.tokenizer import save_tokenizer
from hybrid.trainer import placement
from hybrid.trainer.loop import Driver
from hybrid.workers.reward_inputs import render_texts
from tests.integration.trainer.helpers import read_metrics, small_config, write_assets

# About 35 s on 2 shared cores (two stack start-ups): in the default tier.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

MAX_LENGTH = 12
"""Short enough that the longest test row is cut (its prompt loses tokens on the left)."""


def write_reward_model(path: Path) -> Path:
    """An untrained Qwen2ForSequenceClassification (num_labels=1) of the tiny arithmetic model's
    size, fp32, with the arithmetic tokenizer and its chat template."""
    tiny = TinyModelConfig.preset("tiny", vocab="arithmetic", dtype="float32")
    config = hf_config(tiny)
    config.architectures = ["Qwen2ForSequenceClassification"]
    config.num_labels = 1
    torch.manual_seed(0)
    model = Qwen2ForSequenceClassification(config)
    with torch.no_grad():  # a head far from 0, so that scores differ between rows
        model.score.weight.normal_(0.0, 1.0)
    model.save_pretrained(path)
    save_tokenizer(build_tokenizer("arithmetic"), path)
    return path


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_assets(tmp_path_factory.mktemp("reward_model"))
    write_reward_model(root / "rm")
    return root


def rollout_rows(tokenizer: object) -> Batch:
    """Six policy rows in the padded rollout layout (prompt left-padded, response right)."""
    prompts = ["1+2=", "4+4=", "0+3=", "12+34+5=", "2+2=", "3+1="]
    responses = ["3", "9", "33", "51", "4", "+="]
    enc = tokenizer.encode  # type: ignore[attr-defined]
    prompt_ids = [[1, *enc(p), 2, 1] for p in prompts]  # <|im_start|>p<|im_end|><|im_start|>
    response_ids = [[*enc(r), 2] for r in responses]
    width, length = max(map(len, prompt_ids)), max(map(len, response_ids))
    ids, mask, resp, resp_mask = [], [], [], []
    for p, r in zip(prompt_ids, response_ids, strict=True):
        ids.append([0] * (width - len(p)) + p + r + [0] * (length - len(r)))
        mask.append([0] * (width - len(p)) + [1] * (len(p) + len(r)) + [0] * (length - len(r)))
        resp.append(r + [0] * (length - len(r)))
        resp_mask.append([1] * len(r) + [0] * (length - len(r)))
    return Batch.from_dict(
        {
            "input_ids": torch.tensor(ids),
            "attention_mask": torch.tensor(mask),
            "responses": torch.tensor(resp),
            "response_mask": torch.tensor(resp_mask),
        },
        {"raw_prompt": prompts},
    )


@pytest.mark.full  # 24 s; by default the combine, the inputs and the checks run as unit tests
def test_scores_match_a_plain_forward_and_a_run_reports_them(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    rm_dir = assets / "rm"
    rm_fields = (
        f"reward.model.path={rm_dir}",
        "reward.model.precision.param_dtype=float32",
        "reward.model.micro_batch_size=2",  # 3 rows per rank: two forwards, one short
    )
    _check_direct_scores(assets, tmp_path / "direct", rm_fields)

    # Two steps, rule + 0.5 x model score on every row, validated after step 2 the same way.
    out = tmp_path / "run"
    run = small_config(
        assets,
        out,
        *rm_fields,
        "reward.model.coef=0.5",
        "trainer.total_steps=2",
        f"data.val_files=[{assets / 'test.jsonl'}]",
        "trainer.test_freq=2",
    )
    Driver(run).fit()
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        for key in ("reward/model_mean", "reward/rule_mean", "timing_s/reward_model"):
            assert key in m, (m["step"], key)
        assert m["reward/model_truncated"] == 0.0
        assert m["timing_s/reward_model"] > 0
        # Every arithmetic row has a rule score: the mean of the sums is the sum of the means.
        combined = m["reward/rule_mean"] + 0.5 * m["reward/model_mean"]
        assert m["reward/mean"] == pytest.approx(combined, abs=1e-6)
        assert m["reward/model_mean"] != 0.0
    assert "val/reward_mean" in metrics[1] and "val/rule_mean" in metrics[1]


def _check_direct_scores(assets: Path, out: Path, rm_fields: tuple[str, ...]) -> None:
    """compute_rm_score on the workers equals a plain transformers forward of each row's
    rendered text, its last MAX_LENGTH tokens."""
    rm_dir = assets / "rm"
    config = small_config(assets, out, *rm_fields, f"reward.model.max_length={MAX_LENGTH}")
    tokenizer = build_tokenizer("arithmetic")
    rows = rollout_rows(tokenizer)
    workers = placement.start(config)
    try:
        assert workers.members.reward_model is not None
        scored = workers.members.reward_model.compute_rm_score(rows)
    finally:
        workers.stop()
    reference = AutoModelForSequenceClassification.from_pretrained(rm_dir, dtype=torch.float32)
    reference.eval()
    texts = render_texts(rows, tokenizer, tokenizer)
    assert texts[0] == "<|im_start|>1+2=<|im_end|><|im_start|>3<|im_end|>"
    expected, cut = [], []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        cut.append(len(ids) > MAX_LENGTH)
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([ids[-MAX_LENGTH:]])).logits
        expected.append(float(logits[0, 0]))
    assert cut == [False, False, False, True, False, False]
    assert scored["rm_truncated"].tolist() == [float(c) for c in cut]
    torch.testing.assert_close(scored["rm_scores"], torch.tensor(expected), atol=1e-5, rtol=0)
    assert len(set(expected)) == len(expected)  # the rows really differ


@pytest.mark.full
def test_scores_split_over_an_sp_group_match_a_plain_forward(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    """actor.sp_size=2: both workers split each packed row of the reward model's pass
    (hybrid.workers.value.head_scores), the scores gathered."""
    rm_fields = (
        f"reward.model.path={assets / 'rm'}",
        "reward.model.precision.param_dtype=float32",
        "reward.model.micro_batch_size=2",
        "actor.sp_size=2",
    )
    _check_direct_scores(assets, tmp_path / "direct", rm_fields)
