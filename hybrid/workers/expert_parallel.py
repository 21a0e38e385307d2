"""Expert parallelism (EP) for the stacked experts of a mixture-of-experts model (issue 44,
item 8; docs/moe.md "Expert parallelism").

Mesh: (efsdp, ep) = (W / ep, ep) over the trainer's W ranks, ep ranks consecutive. Each
stacked expert tensor [E, rows, cols] is a DTensor placed (Shard(1), Shard(0)): ep rank p
owns experts [p * c, (p + 1) * c) (c = E / ep), and the efsdp ranks of that ep rank split
their rows, as FSDP would. FSDP2 leaves these tensors alone (`ignored_params`); the rest of
the model is FSDP2-sharded over all W ranks as without EP. A gather for a sync, a checkpoint
or the export reads them like any DTensor (`full_tensor`), so nothing downstream changes.

One MoE layer's forward on a rank holding T tokens, each routed to k experts:
  1. the owned experts are all-gathered over efsdp (nothing when efsdp = 1) and cast to the
     compute dtype, as FSDP's mixed precision would;
  2. the T * k (token, expert) rows are sorted by expert; the per-expert counts go to every
     ep rank first (one small all-to-all), so each rank knows how many rows it receives for
     each of its experts from each sender;
  3. the rows travel to the ranks that own their experts (autograd-aware all-to-all with
     uneven splits), are regrouped from sender-major to expert-major, pass the owned experts'
     grouped GEMMs, and travel back by the reverse all-to-all;
  4. each row is weighted by its gate and the k rows of a token summed, as transformers'
     grouped-GEMM experts do (so EP computes what EP = 1 computes, up to summation order).
Backward runs the same collectives in reverse; the owned experts' gradient sums the
contributions of every rank's tokens (all-to-all), is reduce-scattered over efsdp, and is
scaled by 1 / W: FSDP averages the dense gradients over the W ranks, and the loss
normalisers assume that mean.

Every rank of an ep group must run each MoE layer the same number of times (as FSDP's
all-gathers already require): micro-batch counts are equal across ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from hybrid.model_families import check_expert_count

STACKED_EXPERTS = ("gate_up_proj", "down_proj")
"""transformers 5's stacked expert parameters: [E, 2I, H] (gate rows, then up rows) and
[E, H, I]."""
EXPERT_PLACEMENTS = (Shard(1), Shard(0))
"""On the (efsdp, ep) mesh: experts split over ep, their rows over efsdp."""
_GATHERED = (Replicate(), Shard(0))
_GRAD_OF_GATHERED = (Partial(), Shard(0))  # each efsdp rank's tokens add to the same experts


def expert_mesh_shape(world: int, ep_size: int) -> tuple[int, int]:
    """(efsdp, ep) for `world` trainer ranks."""
    if ep_size < 1 or world % ep_size:
        raise ValueError(
            f"actor.ep_size ({ep_size}) must divide the number of trainer workers ({world})"
        )
    return world // ep_size, ep_size


def rank_splits(counts: torch.Tensor, ep_size: int) -> torch.Tensor:
    """(ep,) rows sent to each ep rank, from the (E,) rows per expert (experts in order)."""
    return counts.view(ep_size, -1).sum(dim=1)


def expert_major_order(received: torch.Tensor) -> torch.Tensor:
    """Rows arrive sender-major: sender 0's rows for local expert 0, 1, ..., then sender 1's.
    `received` (senders, local experts) counts them; the result indexes those rows so that
    they read expert-major (expert 0's rows from every sender in sender order, then expert 1's),
    the order grouped GEMMs need."""
    flat = received.reshape(-1)
    starts = (torch.cumsum(flat, 0) - flat).view(received.shape)  # sender-major segment starts
    seg_starts, seg_lens = starts.t().reshape(-1), received.t().reshape(-1)
    segment = torch.repeat_interleave(torch.arange(seg_lens.numel()), seg_lens)
    seg_first_row = torch.repeat_interleave(torch.cumsum(seg_lens, 0) - seg_lens, seg_lens)
    return seg_starts[segment] + torch.arange(segment.numel()) - seg_first_row


def inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return inverse


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times `scale` (the 1 / W mean FSDP applies elsewhere)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class ExpertParallelExperts(nn.Module):
    """A sparse block's stacked experts, owned by ep ranks, fed by all-to-all token dispatch.

    Takes over the parameters (same names: the checkpoint, sync and export see the layout
    they know) and the activation of transformers' experts module it replaces; its forward
    has that module's signature (hidden (T, H), top-k experts (T, k), top-k gates (T, k))."""

    def __init__(
        self, experts: nn.Module, mesh: DeviceMesh, compute_dtype: torch.dtype, world: int
    ) -> None:
        super().__init__()
        self.num_experts = int(experts.num_experts)  # type: ignore[arg-type]
        self.act_fn: Callable[[torch.Tensor], torch.Tensor] = experts.act_fn  # type: ignore[assignment]
        self.mesh = mesh
        self.ep_size = mesh.size(1)
        self.compute_dtype = compute_dtype
        self.grad_scale = 1.0 / world
        check_expert_count(self.num_experts, self.ep_size, "a mixture-of-experts layer")
        for name in STACKED_EXPERTS:
            param = getattr(experts, name)
            placed = distribute_tensor(param.data, mesh, EXPERT_PLACEMENTS)
            self.register_parameter(name, nn.Parameter(placed, requires_grad=param.requires_grad))

    def _owned(self, name: str) -> torch.Tensor:
        """This ep rank's experts, whole, in the compute dtype (grad: reduce-scattered over
        efsdp, scaled by 1 / W)."""
        param = getattr(self, name)
        assert isinstance(param, DTensor), "expert-parallel weights are DTensors"
        # Gathered in the stored dtype and cast after: the gradient is reduced in it too.
        local = param.redistribute(self.mesh, _GATHERED).to_local(grad_placements=_GRAD_OF_GATHERED)
        if local.requires_grad:
            local = _ScaleGrad.apply(local, self.grad_scale)
        return local.to(self.compute_dtype)

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        num_tokens, hidden = hidden_states.shape
        top_k = top_k_index.shape[-1]
        gate_up, down = self._owned("gate_up_proj"), self._owned("down_proj")
        group = self.mesh.get_group(1)

        expert_ids, by_expert = torch.sort(top_k_index.reshape(-1), stable=True)
        rows = hidden_states[by_expert // top_k]  # (T * k, H), expert-major
        counts = torch.bincount(expert_ids, minlength=self.num_experts)  # (E,)
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=group)
        received = received.view(self.ep_size, -1)  # (senders, owned experts)
        sent_splits = rank_splits(counts, self.ep_size).tolist()
        received_splits = received.sum(dim=1).tolist()

        routed = funcol.all_to_all_single_autograd(rows, received_splits, sent_splits, group)
        order = expert_major_order(received.cpu()).to(routed.device)
        offsets = torch.cumsum(received.sum(dim=0), 0, dtype=torch.int32)
        x = routed[order].to(self.compute_dtype)
        gate, up = F.grouped_mm(x, gate_up.transpose(-2, -1), offs=offsets).chunk(2, dim=-1)
        y = F.grouped_mm(self.act_fn(gate) * up, down.transpose(-2, -1), offs=offsets)
        y = y[inverse_permutation(order)]
        returned = funcol.all_to_all_single_autograd(y, sent_splits, received_splits, group)

        out = returned[inverse_permutation(by_expert)] * top_k_weights.reshape(-1, 1)
        return out.view(num_tokens, top_k, hidden).sum(dim=1).to(hidden_states.dtype)


def parallelize_experts(
    model: nn.Module, mesh: DeviceMesh, compute_dtype: torch.dtype, world: int
) -> set[nn.Parameter]:
    """Replace every sparse block's `experts` by its expert-parallel twin; the parameters FSDP2
    must leave alone."""
    owned: set[nn.Parameter] = set()
    for module in list(model.modules()):
        experts = getattr(module, "experts", None)
        if not isinstance(experts, nn.Module) or not all(
            hasattr(experts, name) for name in STACKED_EXPERTS
        ):
            continue
        twin = ExpertParallelExperts(experts, mesh, compute_dtype, world)
        module.experts = twin
        owned.update(twin.parameters())
    if not owned:
        raise ValueError("expert parallelism needs a mixture-of-experts model (no stacked experts)")
    return owned
