"""PolicyTrainer: the FSDP2 actor's optimisation step (PPO-clip over micro-batches)."""

from __future__ import annotations

import torch

from hybrid.algorithms.logprob import log_probs_from_logits
from hybrid.algorithms.ppo import ppo_clip_loss
from hybrid.data import Batch
from hybrid.workers.config import ActorConfig
from hybrid.workers.forward import response_logits
from hybrid.workers.fsdp import clip_and_step

UPDATE_KEYS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "responses",
    "response_mask",
    "old_log_probs",
    "advantages",
)


class PolicyTrainer:
    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: ActorConfig
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.config = config

    def update(self, batch: Batch) -> dict[str, float]:
        """One optimiser step over `batch` (this rank's rows); returns `actor/*` metrics.

        The loss is a token mean over the whole local batch: each micro-batch's token sum is
        divided by the local token count, so gradients add up to the same value whatever the
        micro-batch size.
        """
        missing = [key for key in UPDATE_KEYS if key not in batch]
        if missing:
            raise KeyError(f"update_actor needs batch keys {missing}; it has {batch.keys()}")
        self.model.train()
        num_tokens = int(batch.tensors["response_mask"].sum().clamp(min=1))
        total_loss = 0.0
        clipfrac, kl = [], []
        micro = self.config.micro_batch_size
        for start in range(0, len(batch), micro):
            mb = batch[start : start + micro]
            log_prob = log_probs_from_logits(
                response_logits(self.model, mb), mb.tensors["responses"]
            )
            loss, metrics = ppo_clip_loss(
                log_prob,
                mb.tensors["old_log_probs"],
                mb.tensors["advantages"],
                mb.tensors["response_mask"],
                self.config.clip_ratio,
                num_tokens=num_tokens,
            )
            loss.backward()
            total_loss += float(loss.detach())
            clipfrac.append(metrics["actor/pg_clipfrac"])
            kl.append(metrics["actor/ppo_kl"])
        grad_norm, applied = clip_and_step(self.model, self.optimizer, self.config.max_grad_norm)
        return {
            "actor/pg_loss": total_loss,
            "actor/grad_norm": grad_norm,
            "actor/step_applied": float(applied),
            "actor/pg_clipfrac": sum(clipfrac) / len(clipfrac),
            "actor/ppo_kl": sum(kl) / len(kl),
        }
