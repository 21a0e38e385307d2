"""The critic's passes on a value model (hybrid.workers.fsdp, `value_head=True`): the value of
every response token, and the clipped value-loss update.

The value of response token t is read from the hidden state that predicts it (the position
before it, where the policy chose it): the same positions the actor's log-probs are scored
at, so the packed and padded layouts, micro-batches and token budgets of hybrid.workers.forward
serve the critic unchanged. Shapes: values, returns (b, R), zero where response_mask is 0.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hybrid.algorithms.value_loss import clipped_value_loss
from hybrid.data import Batch
from hybrid.memory.ledger import MemoryLedger
from hybrid.workers.config import CriticConfig, WorkerSpec
from hybrid.workers.forward import PassConfig, micro_batches
from hybrid.workers.fsdp import clip_and_step
from hybrid.workers.packing import ModelInputs, packed_inputs, padded_inputs
from hybrid.workers.policy import boundary, loss_scales, mean_over_mini_batches, normalisers
from hybrid.workers.sequence_parallel import SpGroup, scores_over_group

UPDATE_KEYS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "responses",
    "response_mask",
    "values",
    "returns",
)


def value_micro_batch(model: torch.nn.Module, micro: Batch, config: PassConfig) -> torch.Tensor:
    """(b, R) values of the micro-batch's response tokens; differentiable if grad is on."""
    inputs = packed_inputs(micro) if config.packed else padded_inputs(micro)
    return inputs.scatter(head_scores(model, inputs, config.sp))


def head_scores(
    model: torch.nn.Module, inputs: ModelInputs, sp: SpGroup | None = None
) -> torch.Tensor:
    """(n,) a scalar head's outputs (a critic's values, a reward model's scores) at
    `inputs.score_index`. Under sequence parallelism this rank's slice of the row, the
    scalars of every slice gathered."""
    if sp is None:
        return _head(model, inputs)
    return scores_over_group(model, inputs, sp, lambda part: _head(model, part)[:, None])[:, 0]


def _head(model: torch.nn.Module, inputs: ModelInputs) -> torch.Tensor:
    out = model(**inputs.model_kwargs()).logits  # (rows, width, 1)
    return out.flatten(0, 1)[inputs.score_index, 0].float()


@torch.no_grad()
def compute_values(model: torch.nn.Module, batch: Batch, config: PassConfig) -> torch.Tensor:
    """(b, R) values of `responses`, in row order."""
    shape = batch.tensors["responses"].shape
    values = torch.zeros(shape, dtype=torch.float32, device=batch.tensors["responses"].device)
    for rows in micro_batches(batch, config):
        values[torch.tensor(rows, device=values.device)] = value_micro_batch(
            model, batch[rows], config
        )
    return values


class ValueTrainer:
    """`ppo_epochs` passes over this rank's rows, one optimizer step per mini-batch of the
    spec's `mini_batch_rows` rows, the clipped value loss against the batch's returns."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        config: CriticConfig,
        spec: WorkerSpec,
        pass_config: PassConfig,
        ledger: MemoryLedger | None = None,
        dp_group: dist.ProcessGroup | None = None,
        replicas: dist.ProcessGroup | None = None,
    ) -> None:
        self.model = model
        self.dp_group = dp_group
        """The data-parallel ranks the normalisers sum over (None: every rank)."""
        self.replicas = replicas
        """The ranks a plainly replicated model averages its gradients over (None: FSDP2
        reduces them)."""
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.config = config
        self.spec = spec
        self.pass_config = pass_config
        self.ledger = ledger

    def update(self, batch: Batch) -> dict[str, float]:
        missing = [key for key in UPDATE_KEYS if key not in batch]
        if missing:
            raise KeyError(f"update_critic needs batch keys {missing}; it has {batch.keys()}")
        self.model.train()
        size = self.spec.mini_batch_rows or len(batch)
        if len(batch) % size:
            raise ValueError(f"{len(batch)} rows per rank do not split into mini-batches of {size}")
        return mean_over_mini_batches(batch, size, self.config.ppo_epochs, self._step)

    def _step(self, mini: Batch) -> dict[str, float]:
        c = self.config
        local_tokens, global_tokens, global_seqs = normalisers(mini, self.dp_group)
        scale, metric_scale = loss_scales(self.dp_group)
        vf_loss = clipfrac = predicted = 0.0
        for index, rows in enumerate(micro_batches(mini, self.pass_config)):
            micro = mini[rows]
            mask = micro.tensors["response_mask"]
            values = value_micro_batch(self.model, micro, self.pass_config)
            loss, micro_clipfrac = clipped_value_loss(
                values,
                micro.tensors["values"],
                micro.tensors["returns"],
                mask,
                c.cliprange_value,
                c.loss_agg_mode,
                global_tokens=global_tokens,
                global_seqs=global_seqs,
            )
            # The forward changes nothing a component source counts (grads come in backward).
            boundary(self.ledger, "update_critic/forward", index, reuse_components=True)
            (loss * scale).backward()
            boundary(self.ledger, "update_critic/backward", index)
            vf_loss += float(loss.detach()) * metric_scale
            share = float(mask.sum()) / local_tokens
            clipfrac += float(micro_clipfrac) * share
            predicted += float((values.detach() * mask).sum()) / local_tokens
        grad_norm, applied = clip_and_step(
            self.model, self.optimizer, c.optim.max_grad_norm, self.replicas
        )
        self.scheduler.step()
        boundary(self.ledger, "update_critic/optimizer_step")
        return {
            "critic/vf_loss": vf_loss,
            "critic/vf_clipfrac": clipfrac,
            "critic/vpred_mean": predicted,
            "critic/grad_norm": grad_norm,
            "critic/step_applied": float(applied),
            "critic/lr": float(self.optimizer.param_groups[0]["lr"]),
        }
