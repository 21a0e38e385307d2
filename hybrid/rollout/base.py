"""The RolloutEngine protocol: what the mode switch and the worker need from an engine.

Four verbs keep the driver loop and the mode switch identical on CPU and GPU: `generate`,
`load_weights` (streamed, in place), `release` (free the KV cache, and weights where the
engine can) and `resume` (bring back what `release` freed, by tag).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

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
    ) -> list[GeneratedSample]:
        """`n` samples per prompt (1 when greedy), prompt-major, with per-token log-probs."""
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
