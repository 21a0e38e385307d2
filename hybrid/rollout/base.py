"""The RolloutEngine protocol: what the mode switch and the worker need from an engine.

Four verbs keep the driver loop and the mode switch identical on CPU and GPU: `generate`,
`load_weights` (streamed, in place), `release` (free the KV cache, and weights where the
engine can) and `resume` (bring back what `release` freed, by tag).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from hybrid.data import Batch

ResumeTag = Literal["weights", "kv_cache"]


@dataclass(frozen=True)
class GeneratedSample:
    token_ids: list[int]
    """Sampled response tokens (no prompt), at most max_tokens long."""
    log_probs: list[float]
    """The engine's log-prob of each sampled token (raw model distribution)."""
    text: str
    """The detokenised response."""
    stopped: bool = False
    """The engine stopped on its own (end of sequence or a stop token), not at max_tokens."""


@dataclass(frozen=True)
class Continuation:
    """One sample to generate (further): the prompt plus the response so far, how many new
    tokens at most, and its sampling seed (None: unseeded)."""

    token_ids: list[int]
    max_tokens: int
    seed: int | None = None


class RolloutEngine(Protocol):
    def generate(
        self,
        prompts: Sequence[list[int]],
        *,
        greedy: bool = False,
        seeds: Sequence[int] | None = None,
        max_tokens: Sequence[int] | None = None,
    ) -> list[GeneratedSample]:
        """`n` samples per prompt (1 when greedy), prompt-major, with per-token log-probs;
        `max_tokens` per prompt (default: the response length for all)."""
        ...

    def score(self, sequences: Sequence[list[int]]) -> list[list[float]]:
        """Log-prob of every token of each sequence given its prefix (len - 1 values)."""
        ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named full tensors into the engine, in place."""
        ...

    def release(self) -> None:
        """Free the KV cache (and offload weights where supported)."""
        ...

    def resume(self, tags: Sequence[ResumeTag]) -> None:
        """Bring back what `release` freed: "weights" before a sync, "kv_cache" after it."""
        ...


MAX_RESPONSE_TOKENS = "max_response_tokens"
"""A prompt row's optional `extra_info` key: at most this many new tokens for its responses
(capped by rollout.response_length), e.g. tasks whose answers differ in length by design."""


def response_budgets(
    extra_infos: Sequence[dict[str, Any]] | None, uids: Sequence[Any], response_length: int
) -> list[int]:
    """Max new tokens per prompt row: its extra_info's `max_response_tokens`, else (and at
    most) `response_length`. A bad value raises naming the row's uid."""
    if extra_infos is None:
        return [response_length] * len(uids)
    budgets = []
    for uid, info in zip(uids, extra_infos, strict=True):
        value = info.get(MAX_RESPONSE_TOKENS) if isinstance(info, dict) else None
        if value is None:
            budgets.append(response_length)
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"prompt {uid}: extra_info.{MAX_RESPONSE_TOKENS} must be an integer >= 1, "
                f"got {value!r}"
            )
        budgets.append(min(value, response_length))
    return budgets


def prompt_budgets(prompts: Batch, response_length: int) -> list[int]:
    """`response_budgets` of a prompt Batch (its `extra_info` and `uid` columns)."""
    infos = prompts.non_tensors.get("extra_info")
    uids = prompts.non_tensors["uid"] if "uid" in prompts else range(len(prompts))
    return response_budgets(None if infos is None else list(infos), list(uids), response_length)
