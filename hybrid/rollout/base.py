"""The RolloutEngine protocol: everything the rollout host, the mode switch and the explorer
need from an engine; nobody reaches past it into an engine's own objects, so a second engine
(the deterministic `ToyEngine` of the driver tests) plugs in behind the same calls.

The verbs: `generate` and `score` (whole batches); `submit` / `step` / `abort` /
`has_unfinished` (request by request, for partial rollouts); `release` (free the KV cache, and
weights where the engine can) and `resume` (bring back what `release` freed, by tag);
`shutdown`. The engine owns its weight path: `configure_loads` (how it will take synced weights,
and what it stores apart: hybrid.rollout.weights), `load_weights` (a stream of Hugging
Face-named full tensors, checked on request), `verify_weights`, `weights_digest`,
`stored_weights`, `load_adapter` and `reset_prefix_cache`. Class methods answer before an engine
exists: `supports_lora`, `describe_site` (what it is given where it runs), `check_kv_budget`. `dtype` is what the sync casts to; `resident`, `kv_cache_bytes` and
`weights_kept_on_host` tell the memory ledger what the engine holds where.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from hybrid.data import Batch
from hybrid.data.images import ImageSet
from hybrid.dtypes import Dtype
from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.engine_args import EngineSite
from hybrid.rollout.weights import RequestedStrategy, WeightFacts, WeightsDigest

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
    routed_experts: torch.Tensor | None = None
    """With rollout.return_routed_experts, on a request's last output: (tokens, MoE layers,
    top-k) expert indices of every token the engine ran through the model for it, prompt
    first (all but the last sampled token)."""


def response_text(tokenizer: Any, token_ids: Sequence[int]) -> str:
    """A response's text as rewards and judges read it: its tokens decoded once, special
    tokens left out, as vLLM's detokenizer writes it without its pass per token per step.
    Like that detokenizer, the text stops before a trailing U+FFFD: bytes of a character
    the token budget cut short (a byte-level vocabulary splits characters across tokens)."""
    return str(tokenizer.decode(token_ids, skip_special_tokens=True)).rstrip("\ufffd")


@dataclass(frozen=True)
class Sampling:
    """How many samples per prompt and how they are drawn, for a call that does not sample as
    rollout.n / temperature / top_p / top_k say: validation (trainer.val_n, val_temperature,
    val_top_p) and the generative judge's greedy answers. Top-k is off, and the end of
    sequence always ends a sample (rollout.ignore_eos is for training rollouts only)."""

    n: int = 1
    """Samples per prompt."""
    temperature: float = 0.0
    """0: greedy (the argmax), which takes one sample."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""

    def __post_init__(self) -> None:
        if self.n < 1 or self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                f"sampling needs n >= 1, temperature >= 0 and top_p in (0, 1], got {self}"
            )
        if self.greedy and self.n > 1:
            raise ValueError(f"{self.n} greedy samples of a prompt would all be the same")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = Sampling()
"""One greedy sample per prompt."""


@dataclass(frozen=True)
class Continuation:
    """One sample to generate (further): the prompt plus the response so far, how many new
    tokens at most, its sampling seed (None: unseeded), how to sample it when not with the
    rollout's settings (None; an agent's validation turns pass validation's, whose `n` the
    flight applies: one request is one sample), and the prompt's images (a vision-language
    model; their spans are expanded in `token_ids`)."""

    token_ids: list[int]
    max_tokens: int
    seed: int | None = None
    sampling: Sampling | None = None
    images: ImageSet | None = None


class RolloutEngine(Protocol):
    @classmethod
    def supports_lora(cls, architecture: str) -> bool:
        """Whether this engine can serve LoRA adapters for a model of `architecture` (asked
        before any engine is built: an adapter sync on an engine without it is refused)."""
        ...

    @classmethod
    def describe_site(cls, config: RolloutConfig, site: EngineSite, adapter_sync: bool) -> str:
        """One line: what this engine is given where it would run (the doctor's report)."""
        ...

    @classmethod
    def check_kv_budget(
        cls, config: RolloutConfig, site: EngineSite, kv_bytes_per_token: int
    ) -> None:
        """Raise ValueError naming the field if the configured KV cache cannot hold what the
        engine needs at `site` (`kv_bytes_per_token`: one engine's share per cached token)."""
        ...

    @property
    def dtype(self) -> Dtype:
        """The engine's weights and compute (resolved): what the sync casts the actor's
        weights to."""
        ...

    @property
    def resident(self) -> set[ResumeTag]:
        """What the engine holds on its device now: `release` empties it where the engine can
        free memory, `resume` refills it by tag."""
        ...

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of KV cache the engine allocated (while "kv_cache" is resident)."""
        ...

    @property
    def weights_kept_on_host(self) -> bool:
        """After `release` the weights wait in host memory (to come back by `resume`) rather
        than being dropped (the next sync rewrites them)."""
        ...

    @property
    def banned_tokens(self) -> frozenset[int]:
        """Token ids the engine never samples (a vision-language model's placeholders)."""
        ...

    def generate(
        self,
        prompts: Sequence[list[int]],
        *,
        sampling: Sampling | None = None,
        seeds: Sequence[int] | None = None,
        max_tokens: Sequence[int] | None = None,
        images: Sequence[ImageSet | None] | None = None,
    ) -> list[GeneratedSample]:
        """rollout.n samples per prompt (`sampling.n`, drawn its way, when given),
        prompt-major, with per-token log-probs; `max_tokens` per prompt (default: the response
        length for all); `images` per prompt (their spans expanded in the prompt's ids)."""
        ...

    def score(
        self,
        sequences: Sequence[list[int]],
        with_adapter: bool = True,
        images: Sequence[ImageSet | None] | None = None,
    ) -> list[list[float]]:
        """Log-prob of every token of each sequence given its prefix (len - 1 values);
        `with_adapter=False` scores the base model under a LoRA adapter; `images` per
        sequence as in `generate`."""
        ...

    def submit(self, request_id: str, request: Continuation) -> None:
        """Queue one sample's request; `step` advances it."""
        ...

    def step(self) -> list[tuple[str, GeneratedSample, bool]]:
        """One engine step: (request id, the tokens it added, finished) per request that
        produced output."""
        ...

    def has_unfinished(self) -> bool:
        """Some submitted request is neither finished nor aborted."""
        ...

    def abort(self, request_ids: list[str]) -> None:
        """Drop submitted requests (their outputs so far were already returned by `step`)."""
        ...

    def configure_loads(self, requested: RequestedStrategy) -> WeightFacts:
        """Choose how `load_weights` writes from now on (`sync.strategy`: auto picks what is
        exact for this engine; an impossible `direct` raises naming why) and say what the
        engine stores apart from what the sync sends."""
        ...

    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], checksum: bool = False
    ) -> int:
        """Load Hugging Face-named full tensors into the engine, in place, and invalidate what
        the old weights computed (the prefix cache). With `checksum`, record what was sent as
        the engine stores it and compare after the load: returns how many tensors matched,
        raises ChecksumMismatchError (hybrid.rollout.checksum) naming one that does not."""
        ...

    def verify_weights(self) -> int:
        """Compare the stored tensors with the last checksummed load again (a later write, a
        stray in-place op): how many matched; raises naming a mismatch, or if none was
        recorded."""
        ...

    def weights_digest(self) -> WeightsDigest:
        """A digest of every readable weight the engine holds (names and bits)."""
        ...

    def stored_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The engine's readable weight tensors under its own names, by reference (an
        in-process engine; weights repacked out of tensors are not listed)."""
        ...

    def load_adapter(self, path: Path) -> None:
        """Use the peft adapter at `path` for every request from now on."""
        ...

    def reset_prefix_cache(self) -> None:
        """Forget cached prefixes (their KV was computed by older weights)."""
        ...

    def shutdown(self) -> None:
        """Free the engine before the process group goes away."""
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
