"""The MoE routers of the actor: what they chose in one pass, replayed in another, and how
evenly they spread tokens (issue 44, items 4 and 5; docs/moe.md "Router replay").

transformers 5 gives each sparse MoE block a `gate` router returning (logits, scores, experts)
for the (tokens, hidden) states it reads (hybrid.models.routers); the block computes its
experts from the last two. A forward hook on each router sees that output and, while a
`RoutingTrace` is open, records the experts (the old-log-prob pass under R2) or replaces them
with recorded ones and recomputes the scores from the live logits: the update under
`actor.router_replay=record` (R2: the old pass's experts) and both passes under `rollout` (R3:
the engine's). The gate weights stay the live router's, so the router still gets gradients.

Routing travels as `routed_experts`, a (b, S, L, k) tensor of the batch in its padded (row,
position) layout (L: the MoE layers in order), so passes may cut micro-batches differently and
pack or not; an engine's record comes with `routed_experts_known`, the positions it covers
(hybrid.data.sample). A hook does the same arithmetic every time it
runs, so activation checkpointing's recomputation in backward finds the graph it saved; only
the bookkeeping (records, counts) is kept from the first call per layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from hybrid.algorithms.moe_routing import (
    chosen_scores,
    expert_counts,
    load_balancing_loss,
    load_max_over_mean,
    routing_differs,
)
from hybrid.data import Batch
from hybrid.data.sample import ROUTED_EXPERTS, ROUTED_EXPERTS_KNOWN
from hybrid.models.routers import Router, experts_dtype
from hybrid.workers.packing import token_positions


@dataclass
class RoutingTrace:
    """One micro-batch's pass through the routers: `positions` (tokens,) say where each token
    the model reads sits in the flattened (b x S) micro-batch, `valid` which of them are real
    (padding routes too in a padded pass, and counts for nothing)."""

    positions: torch.Tensor
    valid: torch.Tensor
    slots: dict[int, int]
    """Decoder layer index -> its index among the MoE layers."""
    num_experts: int
    replay: torch.Tensor | None = None
    """(tokens, L, k) experts to use instead of the live router's; None: the live ones."""
    compare: torch.Tensor | None = None
    """(tokens, L, k) the old pass's experts, to count how the live routing differs."""
    known: torch.Tensor | None = None
    """(tokens,) where `replay` / `compare` hold a choice (None: everywhere); elsewhere the
    live router's experts are used and nothing is compared."""
    with_aux_loss: bool = False
    aux_grad: bool = False
    """The load-balancing loss joins the loss (its graph is kept); else it is only reported."""
    recorded: dict[int, torch.Tensor] = field(default_factory=dict)
    """Slot -> (tokens, k): the experts each layer used."""
    counts: dict[int, torch.Tensor] = field(default_factory=dict)
    """Slot -> (E,): valid tokens per expert."""
    drift: dict[int, torch.Tensor] = field(default_factory=dict)
    """Slot -> (valid tokens,): the live router chose other experts than the old pass."""
    aux_losses: dict[int, torch.Tensor] = field(default_factory=dict)

    def observe(
        self, layer: int, router: Router, output: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, ...]:
        logits, scores, experts = output
        if logits.shape[0] != self.positions.numel():
            raise RuntimeError(
                f"the router of layer {layer} read {logits.shape[0]} tokens, the micro-batch has "
                f"{self.positions.numel()}: a model whose routers see other tokens than its input"
            )
        slot = self.slots[layer]
        live = experts
        if self.replay is not None:
            experts = self.replay[:, slot].to(live.device, torch.long)
            if self.known is not None:
                experts = torch.where(self.known[:, None], experts, live)
            scores = chosen_scores(logits, experts, router.normalise)
        aux = None
        if self.with_aux_loss:
            with torch.set_grad_enabled(torch.is_grad_enabled() and self.aux_grad):
                aux = load_balancing_loss(logits[self.valid], experts[self.valid])
        if slot not in self.recorded:  # the first call; a recomputation in backward repeats it
            with torch.no_grad():
                self.recorded[slot] = experts.detach()
                self.counts[slot] = expert_counts(experts[self.valid], self.num_experts)
                if self.compare is not None:
                    old = self.compare[:, slot].to(live.device, torch.long)
                    compared = self.compared
                    self.drift[slot] = routing_differs(live[compared], old[compared])
            if aux is not None:
                self.aux_losses[slot] = aux
        return logits, scores, experts

    @property
    def compared(self) -> torch.Tensor:
        """(tokens,) the real tokens with a recorded choice to compare with."""
        return self.valid if self.known is None else self.valid & self.known

    def aux_loss(self) -> torch.Tensor | None:
        """The mean over MoE layers of the load-balancing loss (None when not asked for)."""
        if not self.aux_losses:
            return None
        return torch.stack(list(self.aux_losses.values())).mean()

    def used_experts(self) -> torch.Tensor:
        """(tokens, L, k): the experts every MoE layer used, as indices."""
        return torch.stack([self.recorded[s] for s in range(len(self.slots))], dim=1)


class MoeRouting:
    """The hooks on one model's routers and the trace they feed while one is open."""

    def __init__(self, routers: list[Router]) -> None:
        if not routers:
            raise ValueError("MoeRouting needs a mixture-of-experts model (no router found)")
        self.routers = routers
        shapes = {(r.num_experts, r.top_k) for r in routers}
        if len(shapes) > 1:
            raise ValueError(f"MoE layers with different (experts, top-k): {sorted(shapes)}")
        ((self.num_experts, self.top_k),) = shapes
        self.slots = {r.layer: slot for slot, r in enumerate(routers)}
        self.active: RoutingTrace | None = None
        for router in routers:
            router.module.register_forward_hook(self._hook_for(router))

    def _hook_for(self, router: Router) -> Callable[[nn.Module, tuple, tuple], tuple | None]:
        def hook(module: nn.Module, args: tuple, output: tuple) -> tuple | None:
            if self.active is None:
                return None
            return self.active.observe(router.layer, router, output)

        return hook

    @contextmanager
    def trace(
        self,
        micro: Batch,
        packed: bool,
        replay: bool = False,
        compare: bool = False,
        with_aux_loss: bool = False,
        aux_grad: bool = False,
    ) -> Iterator[RoutingTrace]:
        """Route the passes run inside through a trace of `micro` (forward and its backward:
        recomputation reads the same trace). `replay`: use the batch's routed_experts;
        `compare`: count where the live routing differs from them."""
        mask = micro.tensors["attention_mask"]
        positions = token_positions(mask, packed)
        old = known = None
        if replay or compare:
            if ROUTED_EXPERTS not in micro:
                raise KeyError(
                    f"the update needs the batch key {ROUTED_EXPERTS!r} (the old-log-prob pass "
                    "records it with actor.router_replay=record or measure, the engine with "
                    f"rollout); it has {micro.keys()}"
                )
            old = micro.tensors[ROUTED_EXPERTS].flatten(0, 1)[positions]
            if tuple(old.shape[1:]) != (len(self.routers), self.top_k):
                raise ValueError(
                    f"{ROUTED_EXPERTS} holds {tuple(old.shape[1:])} (layers, top-k) per token, "
                    f"the model's routers ({len(self.routers)}, {self.top_k}): a record of "
                    "another model, or an engine that counts its layers otherwise"
                )
            if ROUTED_EXPERTS_KNOWN in micro:
                known = micro.tensors[ROUTED_EXPERTS_KNOWN].flatten()[positions].bool()
        trace = RoutingTrace(
            positions=positions,
            valid=mask.flatten()[positions].bool(),
            slots=self.slots,
            num_experts=self.num_experts,
            replay=old if replay else None,
            compare=old if (replay or compare) else None,
            known=known,
            with_aux_loss=with_aux_loss,
            aux_grad=aux_grad,
        )
        if self.active is not None:
            raise RuntimeError("a routing trace is already open")
        self.active = trace
        try:
            yield trace
        finally:
            self.active = None

    def stats(self) -> RoutingStats:
        """An empty tally for one optimizer step."""
        return RoutingStats(len(self.routers), self.num_experts, [r.layer for r in self.routers])

    def empty_record(self, batch: Batch) -> torch.Tensor:
        """A (b, S, L, k) routed_experts tensor for `batch`, zeros (padding keeps them)."""
        b, s = batch.tensors["attention_mask"].shape
        return torch.zeros(
            (b, s, len(self.routers), self.top_k), dtype=experts_dtype(self.num_experts)
        )

    @staticmethod
    def write_record(record: torch.Tensor, rows: list[int], trace: RoutingTrace) -> None:
        """The experts of one micro-batch's trace into the batch's record at `rows`."""
        width = record.shape[1]
        part = record.new_zeros((len(rows) * width, *record.shape[2:]))
        part[trace.positions.cpu()] = trace.used_experts().cpu().to(record.dtype)
        record[torch.tensor(rows)] = part.view(len(rows), width, *record.shape[2:])


@dataclass
class RoutingStats:
    """One optimizer step's routing figures, summed over its micro-batches and, in `metrics`,
    over the data-parallel ranks (one all-reduce)."""

    num_layers: int
    num_experts: int
    layer_ids: list[int]
    counts: torch.Tensor | None = None
    """(L, E) valid tokens per expert."""
    decisions: float = 0.0
    """(valid token, MoE layer) pairs compared with the old pass."""
    used_changed: float = 0.0
    """... whose experts in this pass differ from the old pass's (0 under replay)."""
    live_changed: float = 0.0
    """... whose live router chose otherwise than the old pass (what replay overrides)."""
    tokens: float = 0.0
    tokens_changed: float = 0.0
    """Valid tokens with other experts than the old pass's in at least one layer."""

    def add(self, trace: RoutingTrace) -> None:
        counts = torch.stack([trace.counts[s] for s in range(self.num_layers)]).double().cpu()
        self.counts = counts if self.counts is None else self.counts + counts
        if trace.compare is None:
            return
        valid = trace.compared
        old = trace.compare[valid].to(torch.long)
        used = trace.used_experts()[valid].to(old.device)
        changed = torch.stack(
            [routing_differs(used[:, s], old[:, s]) for s in range(self.num_layers)], dim=1
        )  # (valid tokens, L)
        drift = torch.stack([trace.drift[s].cpu() for s in range(self.num_layers)], dim=1)
        self.decisions += changed.numel()
        self.used_changed += float(changed.sum())
        self.live_changed += float(drift.sum())
        self.tokens += changed.shape[0]
        self.tokens_changed += float(changed.any(dim=1).sum())

    def metrics(self, device: torch.device) -> dict[str, float]:
        counts = (
            self.counts
            if self.counts is not None
            else torch.zeros((self.num_layers, self.num_experts), dtype=torch.float64)
        )
        sums = torch.tensor(
            [
                self.decisions,
                self.used_changed,
                self.live_changed,
                self.tokens,
                self.tokens_changed,
            ],
            dtype=torch.float64,
        )
        every = torch.cat([counts.flatten(), sums]).to(device)
        if dist.is_initialized():
            dist.all_reduce(every)
        every = every.cpu()
        counts = every[: counts.numel()].view_as(counts)
        decisions, used_changed, live_changed, tokens, tokens_changed = every[
            counts.numel() :
        ].tolist()
        per_layer = load_max_over_mean(counts)
        out = {
            "actor/moe_load_max_over_mean": float(per_layer.mean()),
            "actor/moe_load_max_over_mean_max": float(per_layer.max()),
            **{
                f"actor/moe_load/layer_{layer}": float(value)
                for layer, value in zip(self.layer_ids, per_layer.tolist(), strict=True)
            },
        }
        if decisions:
            out["actor/moe_routing_diff_frac"] = used_changed / decisions
            out["actor/moe_router_drift_frac"] = live_changed / decisions
            out["actor/moe_routing_diff_token_frac"] = tokens_changed / max(tokens, 1.0)
        return out
