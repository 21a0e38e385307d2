"""SftTrainer: supervised fine-tuning on the actor's own model and optimizer, one optimizer
step per call.

The batch is the rollout layout (hybrid.data.sft_loader): `response_mask` is the loss mask, so
the actor's scoring forward (`score_micro_batch`) runs on it unchanged, padded or packed: with
model.use_remove_padding each micro-batch is one varlen sequence of its rows' valid tokens, so
the packing of SFT rows is the actor's packing of rollouts. The loss is the token-mean
cross-entropy of hybrid.algorithms.sft_loss with a global normaliser: the target tokens of the
whole step, summed over micro-batches and data-parallel ranks. FSDP averages gradients over
ranks, so each rank's loss is multiplied by the world size (as hybrid.workers.policy does).

The stage's learning rate is set on the optimizer's param groups for each step
(`set_learning_rate`); at the stage's end `reset_optimizer` puts the RL rate back and forgets
the Adam moments, so RL starts from the SFT weights with a fresh optimizer. With LoRA the
optimizer holds only the adapters: SFT trains them, as RL does.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hybrid.algorithms.sft_loss import sft_loss
from hybrid.data import Batch
from hybrid.memory.ledger import MemoryLedger
from hybrid.workers.forward import PassConfig, micro_batches, score_micro_batch
from hybrid.workers.fsdp import clip_and_step
from hybrid.workers.policy import boundary, global_sums, loss_scales

SFT_UPDATE_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def reset_optimizer(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """`lr` on every param group and no per-parameter state: the next step starts AdamW's
    moments (and its bias correction) from zero."""
    set_learning_rate(optimizer, lr)
    optimizer.state.clear()
    optimizer.zero_grad(set_to_none=True)


class SftTrainer:
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        pass_config: PassConfig,
        max_grad_norm: float,
        ledger: MemoryLedger | None = None,
        dp_group: dist.ProcessGroup | None = None,
        replicas: dist.ProcessGroup | None = None,
    ) -> None:
        self.model = model
        self.dp_group = dp_group
        """The data-parallel ranks the token count sums over (None: every rank)."""
        self.replicas = replicas
        """The ranks a plainly replicated model averages its gradients over (None: FSDP2
        reduces them)."""
        self.optimizer = optimizer
        self.pass_config = pass_config
        self.max_grad_norm = max_grad_norm
        self.ledger = ledger

    def update(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on this rank's rows: sft/loss (the step's token-mean cross-entropy
        once averaged over ranks), sft/grad_norm, sft/tokens (target tokens of the whole step),
        sft/lr, sft/step_applied."""
        missing = [key for key in SFT_UPDATE_KEYS if key not in batch]
        if missing:
            raise KeyError(f"sft_update needs batch keys {missing}; it has {batch.keys()}")
        self.model.train()
        mask = batch.tensors["response_mask"]
        (global_tokens,) = global_sums([float(mask.sum())], mask.device, self.dp_group)
        scale, metric_scale = loss_scales(self.dp_group)
        total = 0.0
        for index, rows in enumerate(micro_batches(batch, self.pass_config)):
            micro = batch[rows]
            scores = score_micro_batch(self.model, micro, self.pass_config, with_entropy=False)
            loss, _ = sft_loss(scores.log_probs, micro.tensors["response_mask"], global_tokens)
            boundary(self.ledger, "sft/forward", index, reuse_components=True)
            (loss * scale).backward()
            boundary(self.ledger, "sft/backward", index)
            total += float(loss.detach()) * metric_scale
        grad_norm, applied = clip_and_step(
            self.model, self.optimizer, self.max_grad_norm, self.replicas
        )
        boundary(self.ledger, "sft/optimizer_step")
        return {
            "sft/loss": total,
            "sft/grad_norm": grad_norm,
            "sft/tokens": global_tokens,
            "sft/lr": float(self.optimizer.param_groups[0]["lr"]),
            "sft/step_applied": float(applied),
        }
