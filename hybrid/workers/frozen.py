"""A frozen member's model: the reference policy and the reward model (and a teacher) are
built alike, sharded by the FSDP2 builder in their own compute dtype, with no optimizer, and
offloadable between their passes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hybrid.controller.rank_env import RankEnv
from hybrid.dtypes import Dtype, Hardware, torch_dtype
from hybrid.sharding.offload import Offloader
from hybrid.workers.config import HybridWorkerConfig, ModelKernels
from hybrid.workers.fsdp import build_fsdp_model
from hybrid.workers.kernels import KernelPlan, plan_for_model
from hybrid.workers.parallel import init_trainer_parallel
from hybrid.workers.sequence_parallel import SpGroup


@dataclass(frozen=True)
class FrozenModel:
    model: torch.nn.Module
    device: torch.device
    offloader: Offloader
    """Moves its parameters off the device between passes (when param_offload is on)."""
    sp: SpGroup | None = None
    """This rank's sequence-parallel group (the passes that split sequences)."""
    kernels: KernelPlan | None = None
    """The fused ops and compiled layers it runs (None: eager)."""


def build_frozen_model(
    config: HybridWorkerConfig,
    rank_env: RankEnv,
    path: str,
    dtype_for: Callable[[Hardware], Dtype],
    param_offload: bool,
    value_head: bool = False,
    kernels: tuple[str, ModelKernels] | None = None,
) -> FrozenModel:
    """The model at `path` on this rank's share of the training mesh, stored and computed in
    `dtype_for(the hardware)`; still on the device (the caller offloads once it is set up).
    `kernels`: (owner, its fused_kernels / compile settings), or None for eager."""
    parallel = init_trainer_parallel(rank_env, config)
    plan = None if kernels is None else plan_for_model(*kernels, path, parallel.device)
    dtype = torch_dtype(dtype_for(Hardware.detect(parallel.device)))
    model = build_fsdp_model(
        path,
        parallel.fsdp_mesh,
        parallel.device,
        param_dtype=dtype,
        master_dtype=dtype,
        attn_implementation=config.model.attn_implementation,
        trainable=False,
        value_head=value_head,
        expert_mesh=parallel.expert_mesh,
        sp_size=parallel.sp_size,
        kernels=plan,
    )
    offloader = Offloader(model, None, parallel.device, param_offload, optimizer_offload=False)
    return FrozenModel(model, parallel.device, offloader, parallel.sp, plan)
