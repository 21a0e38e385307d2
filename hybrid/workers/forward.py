"""Forward passes that score response tokens, micro-batch by micro-batch.

Shapes: input_ids / attention_mask / position_ids (b, P + R); responses (b, R); outputs (b, R),
zero where response_mask is 0.

How a pass runs is a `PassConfig`: packed or padded inputs (hybrid.workers.packing), scores
from the chunked scoring head or from full logits (hybrid.workers.log_prob_head), and
micro-batches of a fixed row count or of a token budget (hybrid.workers.micro_batches).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybrid.algorithms.logprob import entropy_from_logits, log_probs_from_logits
from hybrid.data import Batch
from hybrid.data.sample import ROUTED_EXPERTS
from hybrid.workers.config import ModelConfig
from hybrid.workers.log_prob_head import scoring_head
from hybrid.workers.micro_batches import fixed_micro_batches, token_budget_micro_batches
from hybrid.workers.packing import ModelInputs, packed_inputs, padded_inputs
from hybrid.workers.routing import MoeRouting
from hybrid.workers.sequence_parallel import SpGroup, scores_over_group
from hybrid.workers.vision_inputs import VisionFamily, text_only_tower_pass, with_images


@dataclass(frozen=True)
class PassConfig:
    """How one rank runs a forward (and backward) pass over its rows."""

    micro_batch_size: int
    """Rows per micro-batch (when max_tokens is None)."""
    packed: bool = True
    """Run on the valid tokens only (model.use_remove_padding)."""
    chunk_tokens: int = 1024
    """Tokens per LM-head chunk of the scoring head; 0: full logits (model.log_prob_chunk_tokens)."""
    max_tokens: int | None = None
    """Token budget per micro-batch (use_dynamic_bsz), else None."""
    budget_field: str = "max_tokens"
    """The config field of max_tokens, for errors."""
    sp: SpGroup | None = None
    """Ulysses sequence parallelism: this rank scores its slice of each packed row."""
    vision: VisionFamily | None = None
    """A vision-language model: micro-batches carry their images (hybrid.workers.vision_inputs)."""
    fused_head: bool = False
    """Log-probs without entropy from liger's fused linear cross-entropy (the model's kernel
    plan fuses its head, hybrid.workers.kernels) instead of the chunked head."""


def pass_config(
    model: ModelConfig,
    micro_batch_size: int,
    use_dynamic_bsz: bool,
    max_tokens: int,
    budget_field: str,
    sp: SpGroup | None = None,
    vision: VisionFamily | None = None,
    fused_head: bool = False,
) -> PassConfig:
    """A rank's pass; under sequence parallelism a micro-batch's token budget is the sp
    group's (each rank holds 1 / sp of it)."""
    budget = max_tokens * (1 if sp is None else sp.size)
    return PassConfig(
        micro_batch_size=micro_batch_size,
        packed=model.use_remove_padding,
        chunk_tokens=model.log_prob_chunk_tokens,
        max_tokens=budget if use_dynamic_bsz else None,
        budget_field=budget_field,
        sp=sp,
        vision=vision,
        fused_head=fused_head,
    )


@dataclass(frozen=True)
class Scores:
    log_probs: torch.Tensor  # (b, R)
    entropy: torch.Tensor | None  # (b, R)


def micro_batches(batch: Batch, config: PassConfig) -> list[list[int]]:
    """Row indices of each micro-batch."""
    if config.max_tokens is None:
        return fixed_micro_batches(len(batch), config.micro_batch_size)
    lengths = batch.tensors["attention_mask"].sum(-1).tolist()
    device = batch.tensors["attention_mask"].device
    return token_budget_micro_batches(lengths, config.max_tokens, config.budget_field, device)


def score_micro_batch(
    model: torch.nn.Module,
    micro: Batch,
    config: PassConfig,
    with_entropy: bool,
    entropy_grad: bool = True,
) -> Scores:
    """Log-probs (and entropy) of the micro-batch's responses; differentiable if grad is on
    (the entropy only with `entropy_grad`: the full-logits baseline keeps (n, vocab)
    probabilities alive for its backward otherwise)."""
    inputs = model_inputs(micro, config)
    if config.sp is None:
        with text_only_tower_pass(config.vision, inputs):
            log_probs, entropy = _score(model, inputs, config, with_entropy, entropy_grad)
    else:  # this rank's slice of the row; the scalars of every slice gathered

        def columns(part: ModelInputs) -> torch.Tensor:
            local, local_entropy = _score(model, part, config, with_entropy, entropy_grad)
            return torch.stack([local] if local_entropy is None else [local, local_entropy], 1)

        gathered = scores_over_group(model, inputs, config.sp, columns)
        log_probs = gathered[:, 0]
        entropy = gathered[:, 1] if with_entropy else None
    return Scores(
        log_probs=inputs.scatter(log_probs),
        entropy=None if entropy is None else inputs.scatter(entropy),
    )


def model_inputs(micro: Batch, config: PassConfig) -> ModelInputs:
    """What the model reads for `micro`: packed or padded, with its images if any."""
    inputs = packed_inputs(micro) if config.packed else padded_inputs(micro)
    if config.vision is not None:
        inputs = with_images(config.vision, inputs, micro, config.packed)
    return inputs


def _score(
    model: torch.nn.Module,
    inputs: ModelInputs,
    config: PassConfig,
    with_entropy: bool,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(n,) log-probs and entropy at `inputs.score_index`."""
    if config.chunk_tokens:
        with scoring_head(
            model,
            inputs.score_index,
            inputs.labels,
            config.chunk_tokens,
            with_entropy,
            fused=config.fused_head,
        ):
            scored = _run(model, inputs)
        return scored[:, 0], scored[:, 1] if with_entropy else None
    # The full (rows, width, vocab) logits: the baseline the chunked head replaces.
    logits = _run(model, inputs).flatten(0, 1)[inputs.score_index]
    log_probs = log_probs_from_logits(logits, inputs.labels)
    with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
        entropy = entropy_from_logits(logits) if with_entropy else None
    return log_probs, entropy


def _run(model: torch.nn.Module, inputs: ModelInputs) -> torch.Tensor:
    return model(**inputs.model_kwargs()).logits


@torch.no_grad()
def score_responses(
    model: torch.nn.Module,
    batch: Batch,
    config: PassConfig,
    with_entropy: bool,
    routing: MoeRouting | None = None,
    replay_routing: bool = False,
) -> dict[str, torch.Tensor]:
    """Log-probs (and entropy) of `responses` under `model`, in row order; with `routing`
    also the experts every MoE layer chose for every token (ROUTED_EXPERTS, on the host), or,
    with `replay_routing`, computed with the batch's ROUTED_EXPERTS (the engine's, R3)."""
    shape = batch.tensors["responses"].shape
    device = batch.tensors["responses"].device
    log_probs = torch.zeros(shape, dtype=torch.float32, device=device)
    entropy = torch.zeros(shape, dtype=torch.float32, device=device)
    record = None if routing is None or replay_routing else routing.empty_record(batch)
    for rows in micro_batches(batch, config):
        micro = batch[rows]
        if routing is None:
            scores = score_micro_batch(model, micro, config, with_entropy)
        else:
            with routing.trace(micro, config.packed, replay=replay_routing) as trace:
                scores = score_micro_batch(model, micro, config, with_entropy)
            if record is not None:
                routing.write_record(record, rows, trace)
        index = torch.tensor(rows, device=device)
        log_probs[index] = scores.log_probs
        if scores.entropy is not None:
            entropy[index] = scores.entropy
    out = {"log_probs": log_probs}
    if with_entropy:
        out["entropy"] = entropy
    if record is not None:
        out[ROUTED_EXPERTS] = record
    return out
