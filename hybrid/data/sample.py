"""`Sample`: one response the engine produced, the atomic unit of every placement (slime's
split between the engine's output and the trainer's batch).

A Sample carries its prompt's identity (`uid`: one per prompt, shared by the prompt's group of
`n` responses; `index` within the group), the tokens, the engine's log-prob of each response
token, and the weight version that produced each response token (a list, so that a partial
rollout resumed under newer weights can say which tokens came from which). `metadata` holds
the prompt row's other per-row values (data_source, ground_truth, seed, ...), which the rewards
read.

`samples_to_batch` is the one conversion from Samples to the padded `Batch` the trainer and
the reward manager consume; every placement uses it.

A multi-turn agent trajectory is one Sample too: its "response" is every token after the
prompt, the model's turns and the tool/environment replies between them, in the order the
engine saw them. `loss_mask` marks which of them the model sampled (trained: log-probs,
advantages, loss) and which it was shown (context: attended to, never trained); context tokens
carry no log-prob (0.0) and no version (NO_VERSION). Single-turn samples leave it None (every
response token is the model's).

Shapes (b = samples, P = prompt width, R = response width):
  prompts (b, P) left-padded   responses / response_mask / rollout_log_probs / versions (b, R)
  input_ids / attention_mask / position_ids (b, P + R)
`response_mask` is the loss mask (1 on the model's tokens); `attention_mask` covers every real
token, context included. Agent batches add `env_rewards` (b, R): rewards an environment gave
for a turn, on that turn's last model token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from hybrid.data.batch import Batch
from hybrid.data.images import IMAGES_COLUMN, ImageSet

NO_VERSION = -1
"""`versions` value on padding positions and on context tokens (no weights sampled them)."""
ROUTED_EXPERTS = "routed_experts"
"""The batch key of a mixture of experts' routing: (b, P + R, MoE layers, top-k) expert
indices per token in the padded layout, from the engine (actor.router_replay=rollout) or from
the old-log-prob pass (measure, record)."""
ROUTED_EXPERTS_KNOWN = "routed_experts_known"
"""(b, P + R) 1 where ROUTED_EXPERTS holds a choice: the engine never runs the last sampled
token through the model, so it has none (nor has padding)."""


class SampleStatus(Enum):
    PENDING = "pending"
    """Generation has not finished (a partial rollout waiting to be resumed)."""
    COMPLETED = "completed"
    """The engine stopped on its own (end of sequence or a stop token)."""
    TRUNCATED = "truncated"
    """Cut at the response length."""
    ABORTED = "aborted"
    """Stopped from outside (a weight sync or a shutdown) and not to be trained on."""


@dataclass
class Sample:
    uid: str
    """The prompt's id: every response to one prompt shares it (the GRPO group)."""
    index: int
    """This response's position within its group, 0 .. n-1."""
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)
    """The engine's log-prob of each response token under the weights that sampled it."""
    versions: list[int] = field(default_factory=list)
    """The weight version that generated each response token."""
    status: SampleStatus = SampleStatus.PENDING
    reward: float | None = None
    text: str = ""
    """The detokenised response."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """The prompt row's other per-row values (data_source, ground_truth, seed, ...)."""
    loss_mask: list[int] | None = None
    """Per response token: 1 sampled by the model, 0 context (a tool or environment reply).
    None: every token is the model's (single turn)."""
    token_rewards: list[float] | None = None
    """Per response token: a reward the environment gave for the turn ending there (agent
    trajectories; None elsewhere)."""
    agent_stats: dict[str, float] | None = None
    """What the agent loop counted for this trajectory (turns, tool calls, errors by kind,
    tool seconds, context tokens, truncation): hybrid.rollout.agent.stats."""
    routed_experts: torch.Tensor | None = None
    """(tokens, MoE layers, top-k): the experts the engine chose for the prompt and response
    tokens it ran through the model, in order (all but the last response token), from the
    request that finished the sample; None unless the engine was asked for them."""
    images: ImageSet | None = None
    """The prompt's images (a vision-language run; their spans are expanded in `prompt_ids`),
    kept apart from `metadata` so that they never travel to reward processes."""

    @property
    def response_length(self) -> int:
        return len(self.response_ids)

    @property
    def model_mask(self) -> list[int]:
        """1 per response token the model sampled (the loss mask)."""
        return [1] * len(self.response_ids) if self.loss_mask is None else self.loss_mask

    @property
    def oldest_version(self) -> int:
        """The oldest weight version among the model's tokens (its staleness)."""
        sampled = [v for v in self.versions if v != NO_VERSION]
        return min(sampled) if sampled else NO_VERSION

    def check(self) -> None:
        """Per-token lists must line up; the error names the sample."""
        lengths = {
            "response_ids": len(self.response_ids),
            "rollout_log_probs": len(self.rollout_log_probs),
            "versions": len(self.versions),
        }
        if self.loss_mask is not None:
            lengths["loss_mask"] = len(self.loss_mask)
        if self.token_rewards is not None:
            lengths["token_rewards"] = len(self.token_rewards)
        if len(set(lengths.values())) != 1:
            raise ValueError(
                f"sample {self.uid}#{self.index}: per-token lists differ in length {lengths}"
            )
        if not self.prompt_ids:
            raise ValueError(f"sample {self.uid}#{self.index}: empty prompt")


def samples_to_batch(
    samples: Sequence[Sample],
    response_length: int,
    pad_token_id: int,
    prompt_width: int | None = None,
) -> Batch:
    """The padded training batch of `samples`, in their order.

    Prompts are left-padded to `prompt_width` (default: the longest prompt), responses
    right-padded to `response_length`. Non-tensor columns: uid, index, status, response_text,
    reward (None where unscored) and every metadata key (all samples must have the same keys);
    agent trajectories add the `env_rewards` tensor and the `agent_stats` column (all samples
    of a batch are trajectories or none is); where any sample has images, the `images` column
    holds each sample's ImageSet (empty for a text-only one).
    """
    if not samples:
        raise ValueError("samples_to_batch: no samples")
    agent = samples[0].agent_stats is not None
    for sample in samples:
        if (sample.agent_stats is not None) != agent:
            raise ValueError(
                f"sample {sample.uid}#{sample.index}: agent trajectories and single-turn "
                "samples cannot share a batch"
            )
    width = max(len(s.prompt_ids) for s in samples) if prompt_width is None else prompt_width
    keys = sorted(samples[0].metadata)
    # Padded rows as Python lists, one tensor per column: a few small tensor ops per sample
    # would cost more than the rest of the conversion.
    prompt_rows, response_rows, log_prob_rows, version_rows = [], [], [], []
    loss_rows, env_reward_rows = [], []
    prompt_lengths, response_lengths = [], []
    for sample in samples:
        sample.check()
        p, n = len(sample.prompt_ids), sample.response_length
        if p > width:
            raise ValueError(
                f"sample {sample.uid}#{sample.index}: prompt of {p} tokens exceeds the width {width}"
            )
        if n > response_length:
            raise ValueError(
                f"sample {sample.uid}#{sample.index}: {n} response tokens, more than "
                f"response_length={response_length}"
            )
        if sorted(sample.metadata) != keys:
            raise ValueError(
                f"sample {sample.uid}#{sample.index}: metadata keys {sorted(sample.metadata)} "
                f"differ from the first sample's {keys}"
            )
        prompt_lengths.append(p)
        response_lengths.append(n)
        pad = response_length - n
        prompt_rows.append([pad_token_id] * (width - p) + list(sample.prompt_ids))
        response_rows.append(list(sample.response_ids) + [pad_token_id] * pad)
        log_prob_rows.append(list(sample.rollout_log_probs) + [0.0] * pad)
        version_rows.append(list(sample.versions) + [NO_VERSION] * pad)
        loss_rows.append(list(sample.model_mask) + [0] * pad)
        env_reward_rows.append(list(sample.token_rewards or [0.0] * n) + [0.0] * pad)
    prompts = torch.tensor(prompt_rows, dtype=torch.long).view(len(samples), width)
    prompt_mask = (torch.arange(width) >= width - torch.tensor(prompt_lengths)[:, None]).long()
    responses = torch.tensor(response_rows, dtype=torch.long).view(len(samples), response_length)
    real = (torch.arange(response_length) < torch.tensor(response_lengths)[:, None]).long()
    response_mask = torch.tensor(loss_rows, dtype=torch.long).view(len(samples), response_length)
    log_probs = torch.tensor(log_prob_rows, dtype=torch.float32).view(len(samples), response_length)
    versions = torch.tensor(version_rows, dtype=torch.long).view(len(samples), response_length)
    attention_mask = torch.cat([prompt_mask, real], dim=1)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "rollout_log_probs": log_probs,
        "versions": versions,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
    }
    non_tensors: dict[str, list[Any]] = {
        "uid": [s.uid for s in samples],
        "index": [s.index for s in samples],
        "status": [s.status.value for s in samples],
        "response_text": [s.text for s in samples],
        "reward": [s.reward for s in samples],
    }
    routing = [s.routed_experts for s in samples]
    if any(r is not None for r in routing):
        tensors.update(_routing_columns(samples, width, response_length))
    if any(s.images for s in samples):
        non_tensors[IMAGES_COLUMN] = [s.images or ImageSet(()) for s in samples]
    if agent:
        rewards = torch.tensor(env_reward_rows, dtype=torch.float32)
        tensors["env_rewards"] = rewards.view(len(samples), response_length)
        non_tensors["agent_stats"] = [s.agent_stats for s in samples]
    for key in keys:
        if key in non_tensors or key in tensors:
            raise ValueError(f"metadata key {key!r} collides with a batch column of that name")
        non_tensors[key] = [s.metadata[key] for s in samples]
    return Batch.from_dict(tensors, non_tensors)


def _routing_columns(
    samples: Sequence[Sample], width: int, response_length: int
) -> dict[str, torch.Tensor]:
    """ROUTED_EXPERTS and ROUTED_EXPERTS_KNOWN of the padded rows: each sample's routing at
    its tokens' columns (the prompt ends at `width`, the response starts there)."""
    first = next(r for r in (s.routed_experts for s in samples) if r is not None)
    shape = (len(samples), width + response_length, *first.shape[1:])
    experts = torch.zeros(shape, dtype=first.dtype)
    known = torch.zeros(shape[:2], dtype=torch.long)
    for row, sample in enumerate(samples):
        routing = sample.routed_experts
        p = len(sample.prompt_ids)
        tokens = p + sample.response_length
        if routing is None or routing.shape[1:] != first.shape[1:] or len(routing) > tokens:
            got = None if routing is None else tuple(routing.shape)
            raise ValueError(
                f"sample {sample.uid}#{sample.index}: routed_experts {got} does not fit its "
                f"{tokens} tokens x {tuple(first.shape[1:])} (layers, top-k) of the batch"
            )
        start = width - p
        experts[row, start : start + len(routing)] = routing
        known[row, start : start + len(routing)] = 1
    return {ROUTED_EXPERTS: experts, ROUTED_EXPERTS_KNOWN: known}


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... over the real tokens; left padding gets 0, right padding repeats the last
    position (both are masked out)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
