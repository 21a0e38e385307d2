"""The memory planner's byte model of PPO's critic (algorithm.adv_estimator=gae): the value
model one worker holds beside the actor, and the transients of its two passes. The critic is
the actor's decoder with a scalar head (ModelShape.value_model), sharded and trained the way
the actor is (hybrid.workers.critic), so the terms are the actor's of hybrid.planner.sizes
without the LM head; docs/memory-model.md gives the notation and the derivation of each term.

Resident (COMPONENTS names):
  critic_params           P_v/W x bytes(critic.precision.master_dtype), P_v the value model's
                          parameters (the actor's minus an untied LM head, plus h + 1).
  critic_grads            as much, from the first backward of a mini-batch to its step.
  critic_optimizer_state  AdamW's two moments: 2 x critic_params.
critic.offload.param_offload / critic.offload.optimizer_offload park them on the host outside
the critic's phases (CUDA only), like the actor's flags.

Transient, with critic.micro_batch_size (or critic.*_max_token_len_per_gpu with
critic.use_dynamic_bsz) and critic.gradient_checkpointing, cb = bytes(critic.precision.param_dtype):
  values/forward  a no-grad forward: the larger of a layer's working set and the final hidden
                  states (T x h x cb; the head's output is T floats), beside the unsharded
                  root + 2 layers.
  update_critic   forward: the saved activations, then a no-grad-sized layer on top; backward:
                  the first layer's (saved + its working set + one layer's unsharded gradients,
                  + their reduce-dtype copy) or the root's reduce-scatter at the end. No
                  logits: the value head's gradient is h + 1 elements.
  optimizer step  as the actor's: the trainable shard (foreach, CUDA) or the largest single
                  shard (CPU) in master dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from hybrid.dtypes import dtype_bytes, resolve_dtype
from hybrid.memory.model_shape import ModelShape
from hybrid.planner.passes import (
    Bytes,
    MicroBatch,
    all_to_all_bytes,
    largest_moment,
    micro_batch_of,
    reduce_bytes,
    unsharded_bytes,
)
from hybrid.planner.sizes import planned_hardware

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

__all__ = ["CriticSizes"]


@dataclass(frozen=True)
class CriticSizes:
    """Bytes of one worker's critic, from the run's config and the critic's decoder shape."""

    config: TrainerRunConfig
    decoder: ModelShape
    """The shape of critic.model.path (the actor's when unset), with its LM head."""

    @cached_property
    def shape(self) -> ModelShape:
        return self.decoder.value_model()

    @cached_property
    def compute(self) -> str:
        """critic.precision.param_dtype with `auto` resolved for the planned device."""
        hardware = planned_hardware(self.config.trainer.use_gpu)
        return resolve_dtype(
            self.config.critic.precision.param_dtype, "trainer", hardware, self.shape.hidden_size
        )

    @property
    def cb(self) -> int:
        return dtype_bytes(self.compute)

    @property
    def master(self) -> int:
        return dtype_bytes(self.config.critic.precision.master_dtype)

    @property
    def shard_world(self) -> int:
        c = self.config
        return c.trainer.num_workers // c.actor.hsdp_replicas

    def params(self) -> int:
        """Rank 0's shard in master dtype (also the gradients' size; AdamW holds two)."""
        return self.shape.shard(self.shard_world) * self.master

    def micro_batch(self, update: bool) -> MicroBatch:
        c = self.config.critic
        budget = c.ppo_max_token_len_per_gpu if update else c.forward_max_token_len_per_gpu
        sp = self.config.actor.sp_size  # the critic's passes split rows like the actor's
        return micro_batch_of(
            self.config, update, c.use_dynamic_bsz, budget, c.micro_batch_size, sp
        )

    @property
    def accumulates(self) -> bool:
        """Whether gradients live across micro-batches of a mini-batch."""
        return self.micro_batch(update=True).split

    def values_forward(self) -> Bytes:
        mb, s, cb = self.micro_batch(update=False), self.shape, self.cb
        unsharded = unsharded_bytes(s, cb, ep_size=self.config.actor.ep_size)
        layer = {
            "unsharded_params": unsharded,
            "activations": mb.tokens * s.nograd_layer(cb),
            "all_to_all": all_to_all_bytes(s, mb, cb),
        }
        return largest_moment(
            layer,
            {"unsharded_params": unsharded, "activations": mb.tokens * (s.hidden_size * cb + 4)},
        )

    def _saved(self, tokens: int) -> int:
        return tokens * self.shape.saved_activations(
            self.cb, self.config.critic.gradient_checkpointing
        )

    def update_forward(self) -> Bytes:
        mb, s, cb = self.micro_batch(update=True), self.shape, self.cb
        return {
            "unsharded_params": unsharded_bytes(s, cb, ep_size=self.config.actor.ep_size),
            "activations": self._saved(mb.tokens) + mb.tokens * s.nograd_layer(cb),
            "all_to_all": all_to_all_bytes(s, mb, cb),
        }

    def update_backward(self) -> Bytes:
        """The first decoder layer's backward, or the root's reduce-scatter at the end."""
        mb, s, cb = self.micro_batch(update=True), self.shape, self.cb
        reduce = reduce_bytes(self.compute, self.config.critic.precision.reduce_dtype)
        work = mb.tokens * s.layer_backward(cb, self.config.critic.gradient_checkpointing)
        return largest_moment(
            {
                "unsharded_params": unsharded_bytes(s, cb, ep_size=self.config.actor.ep_size),
                "unsharded_grads": s.largest_pass_layer(self.config.actor.ep_size) * reduce,
                "activations": self._saved(mb.tokens) + work,
                "all_to_all": all_to_all_bytes(s, mb, cb),
            },
            {"unsharded_grads": s.root_params * reduce},
        )

    def optimizer_temporaries(self) -> int:
        if self.config.trainer.use_gpu:  # foreach AdamW: one trainable-shard-sized temporary
            return self.params()
        return self.shape.largest_shard(self.shard_world) * self.master
