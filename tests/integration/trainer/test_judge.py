"""The generative judge on the real stack (2 CPU workers, Ray, FSDP2, vLLM) with the tiny
arithmetic model as its own judge: its answers are the engine's greedy answers to the rendered
prompts, the worker is back in trainer mode after a call, and a 2-step run (colocated on vLLM,
then split on the toy engine) reports the judge's metrics with counts that add up."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hybrid.data import Batch
from hybrid.models.tokenizer import SPECIAL_TOKENS
from hybrid.rewards.judge import compile_pattern, parse_score
from hybrid.rollout.base import GREEDY
from hybrid.trainer import placement
from hybrid.trainer.loop import Driver
from tests.integration.trainer.helpers import read_metrics, small_config, write_assets

# Three stack start-ups, each about half a minute on 2 shared cores: an extra variant.
pytestmark = [pytest.mark.integration, pytest.mark.full, pytest.mark.timeout(900)]

ROWS = 16
"""Rows a step judges: 4 prompts x rollout.n=4."""

JUDGE = (
    "reward.judge.max_tokens=4",
    "reward.judge.max_prompt_length=40",
    "reward.judge.coef=0.5",
    "reward.on_error=score",
    "reward.error_score=-1.0",
)


def silence_special_tokens(model_dir: Path) -> None:
    """Zero the (tied) embedding rows of the special tokens: their logits become 0 while the
    other tokens' spread around it, so greedy answers are characters rather than the untrained
    model's endless <|im_start|> (which decodes to an empty, unparsable answer). Some answers
    are digits and some "+" or "=": both paths of the parse run."""
    weights = load_file(model_dir / "model.safetensors")
    weights["model.embed_tokens.weight"][: len(SPECIAL_TOKENS)] = 0
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_assets(tmp_path_factory.mktemp("judge"))
    silence_special_tokens(root / "model")
    # The arithmetic vocabulary has digits, + and = only: the judge reads "a+b=r" and "=t".
    (root / "judge.txt").write_text("{prompt}{response}={ground_truth}=")
    return root


def judged_rows() -> Batch:
    """Rollout rows as the reward sees them: prompt text, response text, reference."""
    return Batch.from_dict(
        {},
        {
            "raw_prompt": ["1+2=", "4+4=", "0+3=", "2+2=", "3+1=", "1+1="],
            "response_text": ["3", "9", "33", "4", "+=", ""],
            "ground_truth": ["3", "8", "3", "4", "4", "2"],
            "data_source": ["arithmetic"] * 6,
        },
    )


def test_answers_are_the_engines_greedy_answers(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    config = small_config(
        assets,
        tmp_path / "direct",
        f"reward.judge.template_path={assets / 'judge.txt'}",
        *JUDGE,
        "reward.judge.max_tokens=8",  # the rollout's response length: greedy answers compare
        "rollout.response_length=8",
    )
    rows = judged_rows()
    workers = placement.start(config)
    try:
        judge = workers.members.judge
        assert judge is not None
        actor = workers.members.actor
        prompts, cut = judge.encode(judge.texts(rows))
        answered = actor.judge_generate(prompts, 8).non_tensors["judge_answer"]
        assert actor.current_mode() == ["trainer", "trainer"]  # the call left rollout mode
        greedy = actor.generate_sequences(prompts, sampling=GREEDY)
        verdict = judge.submit(rows)()
    finally:
        workers.stop()
    assert cut.tolist() == [False] * 6
    answers = [str(text) for text in answered]
    assert answers == [str(text) for text in greedy.non_tensors["response_text"]]
    assert verdict.answers == answers
    pattern = compile_pattern(config.reward.judge.pattern)
    expected = [parse_score(answer, pattern) for answer in verdict.answers]
    want = torch.tensor([float("nan") if e is None else e for e in expected], dtype=torch.float32)
    torch.testing.assert_close(verdict.scores, want, equal_nan=True, rtol=0, atol=0)
    parsed = sum(want is not None for want in expected)
    assert parsed + int(verdict.scores.isnan().sum()) == len(rows)


@pytest.mark.parametrize("mode", ["colocated", "split"])
def test_a_run_reports_the_judge(
    ray_cluster: None, assets: Path, tmp_path: Path, mode: str
) -> None:
    out = tmp_path / mode
    # Split on the toy engine (the same protocol, no vLLM start per explorer): what it adds is
    # the judge's call on the explorer group.
    placed = (
        ("trainer.mode=split", "rollout.engine=toy", f"sync.checkpoint_dir={out / 'weights'}")
        if mode == "split"
        else ()
    )
    run = small_config(
        assets,
        out,
        f"reward.judge.template_path={assets / 'judge.txt'}",
        *JUDGE,
        "trainer.total_steps=2",
        *placed,
    )
    Driver(run).fit()
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        unparsable = m["reward/judge_unparsable"]
        assert 0 <= unparsable < ROWS  # a batch of nothing but failures stops the run
        assert m["reward/errors/unparsable"] == unparsable
        assert m["reward/errors"] == unparsable  # the arithmetic rule never fails
        assert m["reward/judge_truncated"] == 0.0
        assert m["timing_s/judge"] > 0
        # Parsed rows score rule + 0.5 x judge, the unparsable ones error_score (-1).
        parsed = ROWS - unparsable
        total = m["reward/mean"] * ROWS
        rule_of_parsed = total + unparsable - 0.5 * m["reward/judge_mean"] * parsed
        # float32 sums of judge scores as large as 66666666 (answers of repeated digits)
        slack = 1e-6 * (abs(total) + abs(m["reward/judge_mean"]) * parsed) + 1e-4
        assert -slack <= rule_of_parsed <= parsed + slack  # the rule scores 0 or 1 per row
