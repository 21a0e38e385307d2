"""The generative judge on the driver (reward.judge): render each row into the judge's prompt,
tokenize it with the policy's tokenizer and chat template, have the engines answer greedily
(`judge_generate` on the actor_rollout group colocated, on the explorers split and
fully_async), and read a score from each answer (hybrid/rewards/judge.py).

The rendering and tokenizing run on the caller's thread before the call is queued on the
workers, so the judge's pass goes first there, ahead of the reference and old-log-prob passes
the train step queues next; `submit` returns at once and the returned callable waits. An
unparsable answer follows reward.on_error: fail stops the run naming the row and the answer;
score leaves the row's judge score NaN for the combination to give it reward.error_score.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hybrid.controller import RayWorkerGroup, WorkerGroupView
from hybrid.data import Batch
from hybrid.models import load_tokenizer
from hybrid.rewards.config import JudgeConfig
from hybrid.rewards.judge import (
    UNPARSABLE,
    compile_pattern,
    keep_last,
    load_template,
    parse_score,
    render_prompt,
)
from hybrid.rewards.manager import RewardError
from hybrid.rewards.outcome import OnError
from hybrid.trainer.config import TrainerRunConfig
from hybrid.workers.reward_inputs import prompt_texts

logger = logging.getLogger(__name__)

JudgeEngines = WorkerGroupView | RayWorkerGroup
"""Whoever hosts the engines the judge runs on: a member view or the explorer group."""

ANSWER_SHOWN = 200
"""Characters of a judge's answer an error quotes."""


@dataclass(frozen=True)
class Judged:
    """The judge's verdict on one batch."""

    scores: torch.Tensor
    """(b,) float32: the number read from each answer, NaN where it was unparsable."""
    truncated: torch.Tensor
    """(b,) bool: the judge prompt lost tokens from the left (judge.max_prompt_length)."""
    seconds: float
    """From `submit` to the answers' arrival (timing_s/judge)."""
    answers: list[str]
    """The judge's answers, row by row."""


class Judge:
    def __init__(
        self,
        config: JudgeConfig,
        tokenizer: Any,
        engines: JudgeEngines,
        on_error: OnError = "fail",
        error_score: float = 0.0,
    ) -> None:
        assert config.template_path is not None, "a Judge needs reward.judge.template_path"
        self.config = config
        self.template = load_template(config.template_path)
        self.pattern = compile_pattern(config.pattern)
        self.tokenizer = tokenizer
        self.engines = engines
        self.on_error, self.error_score = on_error, error_score

    def texts(self, batch: Batch) -> list[str]:
        """Each row's judge prompt: the template filled with the row's user prompt (the
        dataset's `raw_prompt`, else the decoded prompt tokens), response and ground truth."""
        columns = batch.non_tensors
        if "raw_prompt" in columns:
            prompts = [str(text) for text in columns["raw_prompt"]]
        else:
            prompts = prompt_texts(batch, self.tokenizer)
        return [
            render_prompt(self.template, prompt, str(response), str(truth))
            for prompt, response, truth in zip(
                prompts, columns["response_text"], columns["ground_truth"], strict=True
            )
        ]

    def encode(self, texts: list[str]) -> tuple[Batch, torch.Tensor]:
        """The judge prompts as a left-padded `input_ids` / `attention_mask` Batch (each text a
        user message under the policy's chat template), and which were cut on the left."""
        rows, cut = [], []
        templated = bool(getattr(self.tokenizer, "chat_template", None))
        for text in texts:
            if templated:
                text = self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
                )
            ids = list(self.tokenizer.encode(text, add_special_tokens=not templated))
            kept, was_cut = keep_last(ids, self.config.max_prompt_length)
            rows.append(kept)
            cut.append(was_cut)
        width = max(map(len, rows))
        pad = int(self.tokenizer.pad_token_id)
        input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
        prompts = Batch.from_dict({"input_ids": input_ids, "attention_mask": mask})
        return prompts, torch.tensor(cut, dtype=torch.bool)

    def submit(self, batch: Batch) -> Callable[[], Judged]:
        """Queue the judge's pass over `batch` on the engines; the callable waits for it and
        reads the scores (raising RewardError where reward.on_error says so)."""
        started = time.perf_counter()
        prompts, truncated = self.encode(self.texts(batch))
        answered = self.engines.judge_generate.submit(prompts, self.config.max_tokens)

        def result() -> Judged:
            answers = [str(a) for a in answered.get().non_tensors["judge_answer"]]
            seconds = time.perf_counter() - started
            scores = [parse_score(answer, self.pattern) for answer in answers]
            self.check_unparsable(batch, answers, scores)
            values = [float("nan") if s is None else s for s in scores]
            return Judged(torch.tensor(values, dtype=torch.float32), truncated, seconds, answers)

        return result

    def check_unparsable(
        self, batch: Batch, answers: list[str], scores: list[float | None]
    ) -> None:
        """Apply reward.on_error to the rows whose answer gave no score: fail raises naming the
        first; score logs it (and raises anyway when no row of the batch parsed)."""
        failed = [row for row, score in enumerate(scores) if score is None]
        if not failed:
            return
        first = failed[0]
        where = row_name(batch, first)
        answer = answers[first]
        quoted = repr(answer[:ANSWER_SHOWN]) + ("..." if len(answer) > ANSWER_SHOWN else "")
        what = (
            f"the judge's answer to {where} is {UNPARSABLE}: reward.judge.pattern "
            f"{self.config.pattern!r} reads no finite number from {quoted} "
            f"({len(failed)} of {len(scores)} rows unparsable)"
        )
        if self.on_error == "fail":
            raise RewardError(
                f"{what}. reward.on_error=fail stops the run; reward.on_error=score gives such "
                f"rows reward.error_score ({self.error_score:g}) and counts them in reward/errors"
            )
        if len(failed) == len(scores):
            raise RewardError(
                f"{what}: every answer of the batch is unparsable. Fix the template or the "
                "pattern: a step of nothing but error scores trains on nothing"
            )
        logger.error("%s; such rows score %g (reward.on_error=score)", what, self.error_score)


def row_name(batch: Batch, row: int) -> str:
    columns = batch.non_tensors
    uid = f", uid {columns['uid'][row]}" if "uid" in columns else ""
    return f"row {row}{uid} (data_source {str(columns['data_source'][row])!r})"


def make_judge(config: TrainerRunConfig, engines: JudgeEngines) -> Judge | None:
    """The run's judge on `engines` (None without reward.judge.template_path). A judge prompt
    plus its answer must fit the engine's context (rollout.max_model_len)."""
    judge, r = config.reward.judge, config.reward
    if not judge.enabled:
        return None
    needed = judge.max_prompt_length + judge.max_tokens
    if needed > config.rollout.max_model_len:
        raise ValueError(
            f"reward.judge.max_prompt_length ({judge.max_prompt_length}) + "
            f"reward.judge.max_tokens ({judge.max_tokens}) = {needed} exceeds "
            f"rollout.max_model_len ({config.rollout.max_model_len}): the engine could not "
            "hold a judge prompt and its answer"
        )
    tokenizer = load_tokenizer(config.model.path)
    return Judge(judge, tokenizer, engines, r.on_error, r.error_score)
