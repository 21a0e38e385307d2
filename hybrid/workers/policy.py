"""PolicyTrainer: the FSDP2 actor's update, mini-batch by mini-batch, micro-batch by micro-batch.

Per optimizer step (one mini-batch of this rank's rows), for each micro-batch:
    loss = pg_loss - entropy_coeff * entropy + kl_loss_coef * kl(actor || ref)
with the policy loss `actor.policy_loss` selects (hybrid.algorithms.policy_objectives: PPO-clip
with clip-higher and dual clip, GSPO, GSPO-token, CISPO, SAPO) and, at most one of, the
off-policy corrections between the rollout's and the actor's old log-probs
(hybrid.algorithms.off_policy): truncated importance sampling (the WorkerSpec's tis_cap),
decoupled PPO (decoupled_cap: the old log-probs are the proximal policy, the rollout's the
behaviour policy, and tokens above the cap leave the loss), IcePop (icepop_cap: tokens whose
ratio leaves [1/cap, cap] leave the loss) or sequence-level masked IS (seq_mask_cap: whole rows
whose geometric-mean ratio leaves that band). The mini-batch size and the caps are the trainer's derived values
(`WorkerSpec`), the rest the user's `ActorConfig`.

Normalisers are global: the token (and sequence) counts of the whole mini-batch summed over
micro-batches and over data-parallel ranks. FSDP averages gradients over ranks, so each
rank's loss is multiplied by the world size; the result is the gradient of the loss over
the global mini-batch, whatever the micro-batch size or the split across ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.distributed as dist

from hybrid.algorithms.kl import kl_penalty
from hybrid.algorithms.off_policy import (
    decoupled_weights,
    icepop_weights,
    merge_ratio_summaries,
    ratio_summary,
    seq_mask_is_weights,
)
from hybrid.algorithms.policy_loss import (
    aggregate_loss,
    compose_actor_loss,
    truncated_importance_weights,
)
from hybrid.algorithms.policy_objectives import PolicyLossSettings, select_policy_loss
from hybrid.data import Batch
from hybrid.data.sample import ROUTED_EXPERTS
from hybrid.memory.ledger import MemoryLedger
from hybrid.torch_compat import all_gather_single
from hybrid.workers.compiled_blocks import compiled_graphs, compiled_layers
from hybrid.workers.config import ActorConfig, WorkerSpec
from hybrid.workers.forward import PassConfig, micro_batches, score_micro_batch
from hybrid.workers.fsdp import clip_and_step
from hybrid.workers.grad_reduce import step_gradients
from hybrid.workers.routing import MoeRouting, RoutingTrace

UPDATE_KEYS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "responses",
    "response_mask",
    "advantages",
)


class PolicyTrainer:
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        config: ActorConfig,
        spec: WorkerSpec,
        pass_config: PassConfig,
        ledger: MemoryLedger | None = None,
        routing: MoeRouting | None = None,
        dp_group: dist.ProcessGroup | None = None,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        reduce_once: bool = False,
        replicas: dist.ProcessGroup | None = None,
    ) -> None:
        self.model = model
        self.replicas = replicas
        """The ranks a plainly replicated model averages its gradients over before the
        optimizer step (hybrid.workers.replicated); None: FSDP2 reduces them."""
        self.reduce_once = reduce_once
        self.compiled = bool(compiled_layers(model))
        """Some of the model's layers run compiled (actor.compile): updates report how many
        graphs they compiled."""
        """Gradients reduce-scattered once per optimizer step, not per micro-batch
        (actor.grad_reduce, hybrid.workers.grad_reduce)."""
        self.scheduler = scheduler
        """The learning rate's warm-up (actor.optim.lr_warmup_steps), stepped with the
        optimizer; None: the optimizer's lr throughout."""
        self.routing = routing
        """The MoE routers' hooks (None: a dense model)."""
        self.dp_group = dp_group
        """The data-parallel ranks (one per sp group) the normalisers sum over; None: all."""
        self.optimizer = optimizer
        self.config = config
        self.spec = spec
        self.pass_config = pass_config
        self.ledger = ledger
        self.pg_loss = select_policy_loss(config.policy_loss)
        self.loss_settings = PolicyLossSettings(
            clip_ratio_low=config.clip_ratio_low,
            clip_ratio_high=config.clip_ratio_high,
            clip_ratio_c=config.clip_ratio_c,
            sapo_tau_pos=config.sapo_tau_pos,
            sapo_tau_neg=config.sapo_tau_neg,
            loss_agg_mode=config.loss_agg_mode,
        )

    def update(self, batch: Batch) -> dict[str, float]:
        """`ppo_epochs` passes over this rank's rows, one optimizer step per mini-batch."""
        required = list(UPDATE_KEYS)
        if self.config.use_kl_loss:
            required.append("ref_log_prob")
        if self.spec.corrected or "old_log_probs" not in batch:
            required.append("rollout_log_probs")
        if self._compares_routing(batch):
            required.append(ROUTED_EXPERTS)
        missing = [key for key in required if key not in batch]
        if missing:
            raise KeyError(f"update_actor needs batch keys {missing}; it has {batch.keys()}")
        self.model.train()
        size = self.spec.mini_batch_rows or len(batch)
        if len(batch) % size:
            raise ValueError(f"{len(batch)} rows per rank do not split into mini-batches of {size}")
        if "old_log_probs" not in batch and (self.config.ppo_epochs > 1 or size < len(batch)):
            raise KeyError(
                "update_actor needs old_log_probs unless the update is on-policy (ppo_epochs=1 "
                f"and one mini-batch); here ppo_epochs={self.config.ppo_epochs}, "
                f"{len(batch) // size} mini-batches"
            )
        graphs_before = compiled_graphs()
        metrics = mean_over_mini_batches(batch, size, self.config.ppo_epochs, self._step)
        if self.compiled:
            # 0 once the first update has compiled its graphs: more means recompiles.
            metrics["actor/compiled_graphs"] = float(compiled_graphs() - graphs_before)
        return metrics

    def _step(self, mini: Batch) -> dict[str, float]:
        c, spec = self.config, self.spec
        device = mini.tensors["response_mask"].device
        local_tokens, global_tokens, global_seqs = normalisers(mini, self.dp_group)
        scale, metric_scale = loss_scales(self.dp_group)
        # Without old log-probs the update is on-policy (one epoch, one mini-batch): they are
        # this pass's own, detached; the ratio is exactly 1 and the extra pass is skipped.
        on_policy = "old_log_probs" not in mini
        totals = {"actor/pg_loss": 0.0, "actor/kl_loss": 0.0, "actor/entropy": 0.0}
        fractions: dict[str, float] = {}
        kept_key = kept_fraction_key(spec)
        if kept_key is not None:
            fractions[kept_key] = 0.0
        first_pass = FirstPassStats({"cap": spec.mismatch_cap}, self.dp_group)
        pg_parts: list[tuple[float, dict[str, float]]] = []
        routing_stats = None if self.routing is None else self.routing.stats()
        if routing_stats is not None:
            totals["actor/moe_aux_loss"] = 0.0
        groups = micro_batches(mini, self.pass_config)
        with step_gradients(self.model, self.reduce_once) as before_backward:
            for index, rows in enumerate(groups):
                micro = mini[rows]
                with self._routing_trace(micro) as trace:
                    mask = micro.tensors["response_mask"]
                    scores = score_micro_batch(
                        self.model, micro, self.pass_config, True, entropy_grad=c.entropy_coeff > 0
                    )
                    log_prob = scores.log_probs
                    assert scores.entropy is not None
                    old_log_prob = (
                        log_prob.detach() if on_policy else micro.tensors["old_log_probs"]
                    )
                    if on_policy:
                        first_pass.add(micro, log_prob.detach(), scores.entropy.detach())
                    advantages, kept = self._corrected_advantages(micro, old_log_prob)
                    if kept is not None and kept_key is not None:
                        fractions[kept_key] += kept / local_tokens

                    def aggregate(
                        per_token: torch.Tensor, mask: torch.Tensor = mask
                    ) -> torch.Tensor:
                        return aggregate_loss(
                            per_token, mask, c.loss_agg_mode, global_tokens, global_seqs
                        )

                    # TIS / decoupled weights ride on the advantages: a positive per-token factor on
                    # A_t. For PPO-clip, CISPO and SAPO that is a per-token weight on the token's loss
                    # (the sign of A_t, which picks a branch or a temperature, is kept). GSPO puts its
                    # row's loss l_i on every token, so token t carries w_t l_i: the row counts with its
                    # tokens' weights (mean weight under seq-mean-token-mean); a token decoupled PPO
                    # drops (w_t = 0) gives up its share, though its log-ratio stays in s_i.
                    pg_loss, pg_metrics = self.pg_loss(
                        log_prob, old_log_prob, advantages, mask, self.loss_settings,
                        global_tokens=global_tokens, global_seqs=global_seqs,
                    )  # fmt: skip
                    entropy = aggregate(scores.entropy)
                    kl: torch.Tensor | float = 0.0
                    if c.use_kl_loss:
                        kl = aggregate(
                            kl_penalty(log_prob, micro.tensors["ref_log_prob"], c.kl_loss_type)
                        )
                        totals["actor/kl_loss"] += float(kl.detach()) * metric_scale
                    loss = compose_actor_loss(pg_loss, entropy, kl, c.entropy_coeff, c.kl_loss_coef)
                    aux = None if trace is None else trace.aux_loss()
                    if aux is not None:
                        # This micro-batch's share of the mini-batch's tokens, as for the pg loss.
                        aux = aux * (float(mask.sum()) / global_tokens)
                        if c.moe_aux_loss_coef > 0:
                            loss = loss + c.moe_aux_loss_coef * aux
                        totals["actor/moe_aux_loss"] += float(aux.detach()) * metric_scale
                    # The forward changes nothing a component source counts (grads come in backward).
                    boundary(self.ledger, "update/forward", index, reuse_components=True)
                    before_backward(index == len(groups) - 1)
                    (loss * scale).backward()
                    boundary(self.ledger, "update/backward", index)
                    # Scaled like the gradient: the mean over ranks is the loss of the global batch.
                    totals["actor/pg_loss"] += float(pg_loss.detach()) * metric_scale
                    totals["actor/entropy"] += float(entropy.detach()) * metric_scale
                    pg_parts.append((float(mask.sum()) / local_tokens, pg_metrics))
                if routing_stats is not None and trace is not None:
                    routing_stats.add(trace)
        fractions.update(fold_loss_metrics(pg_parts))
        if routing_stats is not None:
            fractions.update(routing_stats.metrics(device))
        grad_norm, applied = clip_and_step(
            self.model, self.optimizer, c.optim.max_grad_norm, self.replicas
        )
        lr = float(self.optimizer.param_groups[0]["lr"])  # the rate this step took
        if self.scheduler is not None:
            self.scheduler.step()
        boundary(self.ledger, "update/optimizer_step")
        return {
            **totals,
            **fractions,
            **(first_pass.metrics(device) if on_policy else {}),
            "actor/grad_norm": grad_norm,
            "actor/step_applied": float(applied),
            "actor/lr": lr,
        }

    def _compares_routing(self, batch: Batch) -> bool:
        """The update compares (or replays) a recorded routing: the old-log-prob pass's
        (measure, record) or the engine's (rollout, with or without that pass)."""
        if self.routing is None or self.config.router_replay == "off":
            return False
        return self.config.router_replay == "rollout" or "old_log_probs" in batch

    def _routing_trace(self, micro: Batch) -> AbstractContextManager[RoutingTrace | None]:
        """The micro-batch's pass through the MoE routers, forward and backward (recomputed
        layers route again inside it); none for a dense model."""
        if self.routing is None:
            return nullcontext()
        compares = self._compares_routing(micro)
        return self.routing.trace(
            micro,
            self.pass_config.packed,
            replay=compares and self.config.router_replay in ("record", "rollout"),
            compare=compares,
            with_aux_loss=True,
            aux_grad=self.config.moe_aux_loss_coef > 0,
        )

    def _corrected_advantages(
        self, micro: Batch, old_log_prob: torch.Tensor
    ) -> tuple[torch.Tensor, float | None]:
        """The micro-batch's advantages, (B,) or (B, T), times the per-token weights of the
        correction that is on (TIS, decoupled PPO, IcePop, sequence-level masked IS); with a
        correction that drops tokens also the number of response tokens kept (else None)."""
        spec = self.spec
        advantages = micro.tensors["advantages"]
        if not spec.corrected:
            return advantages, None
        rollout_log_prob = micro.tensors["rollout_log_probs"]
        per_token = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # (B, T)
        if spec.tis_cap is not None:
            # A positive per-token weight on the advantage scales both clip branches alike.
            weights = truncated_importance_weights(old_log_prob, rollout_log_prob, spec.tis_cap)
            return per_token * weights, None
        if spec.decoupled_cap is not None:
            weights, keep = decoupled_weights(old_log_prob, rollout_log_prob, spec.decoupled_cap)
        elif spec.icepop_cap is not None:
            weights, keep = icepop_weights(old_log_prob, rollout_log_prob, spec.icepop_cap)
        else:
            assert spec.seq_mask_cap is not None  # corrected, by none of the others
            weights, keep = seq_mask_is_weights(
                old_log_prob, rollout_log_prob, micro.tensors["response_mask"], spec.seq_mask_cap
            )
        # Dropped tokens get weight 0, so they add 0 to the pg loss and to its gradient, while
        # the loss mask, and with it every normaliser (global_tokens, global_seqs, and the
        # per-row length of seq-mean-token-mean), stays unchanged: the loss is the whole
        # mini-batch's with those tokens' terms set to 0, as in AReaL. (Passing mask * keep
        # to policy_loss instead would shrink seq-mean-token-mean's per-row lengths.) The pg
        # metrics (clipfrac, ppo_kl) still average over every response token.
        kept = float((keep & micro.tensors["response_mask"].bool()).sum())
        return per_token * torch.where(keep, weights, 0.0), kept


def kept_fraction_key(spec: WorkerSpec) -> str | None:
    """The metric of the fraction of response tokens a dropping correction keeps; None for
    none or TIS (which keeps every token)."""
    if spec.decoupled_cap is not None:
        return "actor/decoupled_kept_frac"
    if spec.icepop_cap is not None:
        return "actor/icepop_kept_frac"
    if spec.seq_mask_cap is not None:
        return "actor/seq_mask_is_kept_frac"
    return None


def fold_loss_metrics(parts: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """One optimizer step's loss metrics from its micro-batches' (share of the rank's tokens,
    metrics): a mean is weighted by the shares; a `*_max` (`*_min`) is the largest (smallest)
    value of the micro-batches that hold tokens (of all, if none does)."""
    folded: dict[str, float] = {}
    for key in dict.fromkeys(key for _, metrics in parts for key in metrics):
        pairs = [(share, metrics[key]) for share, metrics in parts if key in metrics]
        if key.endswith(("_max", "_min")):
            values = [value for share, value in pairs if share > 0] or [v for _, v in pairs]
            folded[key] = max(values) if key.endswith("_max") else min(values)
        else:
            total = 0.0
            for share, value in pairs:
                total += value * share
            folded[key] = total
    return folded


def mean_over_mini_batches(
    batch: Batch, size: int, epochs: int, step: Callable[[Batch], dict[str, float]]
) -> dict[str, float]:
    """`epochs` passes of `step` (one optimizer step) over consecutive mini-batches of `size`
    rows; the mean of their metrics."""
    steps = [
        step(batch[start : start + size])
        for _ in range(epochs)
        for start in range(0, len(batch), size)
    ]
    return {key: sum(s[key] for s in steps) / len(steps) for key in steps[0]}


def boundary(
    ledger: MemoryLedger | None,
    phase: str,
    chunk: int | None = None,
    reuse_components: bool = False,
) -> None:
    """A ledger boundary of an update (none without a ledger)."""
    if ledger is not None:
        ledger.record(phase, chunk=chunk, reuse_components=reuse_components)


def normalisers(mini: Batch, group: dist.ProcessGroup | None = None) -> tuple[float, float, float]:
    """(this rank's response tokens, at least 1; response tokens and rows with at least one
    response token, summed over the data-parallel ranks `group`) of a mini-batch: the loss
    normalisers of an update."""
    mask = mini.tensors["response_mask"]
    tokens = float(mask.sum())
    # A fully masked row is no sequence of the seq-mean modes (aggregate_loss's contract).
    rows_with_tokens = float((mask.sum(-1) > 0).sum())
    global_tokens, global_seqs = global_sums([tokens, rows_with_tokens], mask.device, group)
    return max(tokens, 1.0), global_tokens, global_seqs


def global_sums(
    values: list[float], device: torch.device, group: dist.ProcessGroup | None = None
) -> list[float]:
    """Each value summed over the data-parallel ranks `group` (None: every rank of the actor's
    FSDP group; an sp group holds its rows once), in one collective."""
    if not dist.is_initialized():
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, group=group)
    return [float(v) for v in tensor.tolist()]


def loss_scales(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(gradient scale, metric scale) of a rank's loss: FSDP2 averages gradients over every
    rank, so the loss is scaled by their count; the driver averages metrics over the
    data-parallel ranks `group` (an sp group reports once), so those are scaled by its size."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    return world, data_parallel_size(group)


def data_parallel_size(group: dist.ProcessGroup | None) -> int:
    """Ranks of the data-parallel `group` (None: every rank)."""
    if not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


class FirstPassStats:
    """What the skipped old-log-prob pass would have reported, from the update's own pass:
    |rollout - actor| log-prob gaps, the rollout-vs-trainer mismatch (hybrid.algorithms.
    off_policy.mismatch_stats' keys, counted against `caps`) and the actor's entropy, over every
    rank's tokens. The gaps cover the batch's `fresh_mask` where it has one (decoupled modes:
    the tokens sampled by the weights the actor holds; older tokens differ by design).

    Every number travels in one all_gather of a fixed-size vector per rank: the sums and
    maxima, and the rank's ratio summary (counts, extremes and a 1001-point quantile sketch,
    off_policy.ratio_summary); the merged quantiles are exact on one rank and, across ranks,
    interpolate each rank's sorted ratios within 1/1000 of a quantile level, for about 8 KB a
    rank."""

    def __init__(self, caps: dict[str, float], group: dist.ProcessGroup | None = None) -> None:
        self.caps = caps
        self.group = group
        """The data-parallel ranks whose numbers are merged (None: every rank)."""
        self.diff_sum = self.diff_max = self.compared = self.entropy_sum = self.tokens = 0.0
        self.log_ratios: list[torch.Tensor] = []

    def add(self, micro: Batch, log_prob: torch.Tensor, entropy: torch.Tensor) -> None:
        mask = micro.tensors["response_mask"].bool()
        compared = micro.tensors.get("fresh_mask", mask).bool() & mask
        log_ratio = (log_prob - micro.tensors["rollout_log_probs"])[compared]
        diff = log_ratio.abs()
        if diff.numel():
            self.diff_sum += float(diff.sum())
            self.diff_max = max(self.diff_max, float(diff.max()))
            self.compared += diff.numel()
            self.log_ratios.append(log_ratio.detach())
        self.entropy_sum += float(entropy[mask].sum())
        self.tokens += float(mask.sum())

    def metrics(self, device: torch.device) -> dict[str, float]:
        sums = torch.tensor(
            [self.diff_sum, self.compared, self.entropy_sum, self.tokens, self.diff_max],
            dtype=torch.float64,
            device=device,
        )
        log_ratio = torch.cat(self.log_ratios) if self.log_ratios else sums.new_zeros(0)
        local = torch.cat([sums, ratio_summary(log_ratio.to(device), self.caps)])
        # One collective for the sums, the maximum and the ratio summaries: every rank's vector.
        world = data_parallel_size(self.group)
        every = local.new_empty(world * local.numel())
        if dist.is_initialized():
            all_gather_single(every, local, group=self.group)
        else:
            every.copy_(local)
        every = every.view(world, local.numel())
        diff_sum, compared, entropy_sum, tokens, _ = every[:, : sums.numel()].sum(0).tolist()
        return {
            "rollout/logprob_diff_mean": diff_sum / max(compared, 1.0),
            "rollout/logprob_diff_max": float(every[:, 4].max()),
            "actor/entropy_old": entropy_sum / max(tokens, 1.0),
            **merge_ratio_summaries(every[:, sums.numel() :], self.caps),
        }
