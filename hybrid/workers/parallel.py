"""Process group and device meshes: created once per process, passed to everything else.

  fsdp mesh     (world,)           the FSDP2 actor and reference shard over every rank, or
                (replicas, world / replicas)  with HSDP: shard within a group of consecutive
                                   ranks (a node), replicate across groups
  rollout mesh  (world / tp, tp)   vLLM tensor parallelism inside each data-parallel group
  sp mesh       (world / sp, sp)   Ulysses sequence parallelism (actor.sp_size > 1): the ranks
                                   of an sp group (consecutive) share one data-parallel slot
                                   and split its sequences (hybrid.workers.sequence_parallel)
  expert mesh   (world / ep, ep)   expert parallelism (actor.ep_size > 1): a mixture of
                                   experts' experts owned by ep ranks, their rows split over
                                   the first dim (hybrid.workers.expert_parallel)
One process group (nccl on CUDA, gloo on CPU) under both. Members colocated in one
WorkerDict share the process, so the second caller gets the same state back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from hybrid.controller import RankEnv
from hybrid.memory.model_shape import model_shape
from hybrid.rollout.engine_args import EngineSite
from hybrid.workers.config import HybridWorkerConfig
from hybrid.workers.expert_parallel import expert_mesh_shape
from hybrid.workers.grad_reduce import device_memory_bytes
from hybrid.workers.replication import trainer_replicas
from hybrid.workers.sequence_parallel import SpGroup


@dataclass(frozen=True)
class ParallelState:
    rank_env: RankEnv
    device: torch.device
    """This rank's device: its GPU, or the CPU."""
    fsdp_mesh: DeviceMesh
    rollout_mesh: DeviceMesh
    """2-D, dims ("dp", "tp")."""
    expert_mesh: DeviceMesh | None = None
    """2-D, dims ("efsdp", "ep"), with expert parallelism; None without."""
    sp_mesh: DeviceMesh | None = None
    """2-D, dims ("dp", "sp"), with sequence parallelism; None without."""

    @property
    def sp_size(self) -> int:
        return 1 if self.sp_mesh is None else self.sp_mesh.size(1)

    @property
    def sp_group(self) -> dist.ProcessGroup | None:
        """The ranks that split one data-parallel slot's sequences (None: no SP)."""
        return None if self.sp_mesh is None else self.sp_mesh.get_group("sp")

    @property
    def sp(self) -> SpGroup | None:
        """This rank's sequence-parallel group, for the passes that split sequences."""
        if self.sp_mesh is None:
            return None
        return SpGroup(
            self.sp_mesh.get_group("sp"), self.sp_mesh.get_local_rank("sp"), self.sp_size
        )

    @property
    def data_parallel_group(self) -> dist.ProcessGroup | None:
        """The trainer's data-parallel ranks of this rank (one per sp group): what loss
        normalisers and summed metrics reduce over. None: every rank (no SP)."""
        return None if self.sp_mesh is None else self.sp_mesh.get_group("dp")

    @property
    def data_parallel_size(self) -> int:
        return self.rank_env.world_size // self.sp_size

    @property
    def hsdp_replicas(self) -> int:
        return self.fsdp_mesh.size(0) if self.fsdp_mesh.ndim == 2 else 1

    @property
    def ep_size(self) -> int:
        return 1 if self.expert_mesh is None else self.expert_mesh.size(1)

    @property
    def tp_size(self) -> int:
        return self.rollout_mesh.size(1)

    @property
    def tp_rank(self) -> int:
        return self.rollout_mesh.get_local_rank("tp")

    @property
    def dp_rank(self) -> int:
        return self.rollout_mesh.get_local_rank("dp")

    def engine_site(self) -> EngineSite:
        """Where this rank's rollout engine runs (what vLLM's arguments depend on)."""
        cuda = self.device.type == "cuda"
        return EngineSite(
            "cuda" if cuda else "cpu",
            torch.cuda.device_count() if cuda else 0,
            self.rank_env.local_rank,
            self.dp_rank,
        )


_STATE: ParallelState | None = None


def fsdp_mesh_shape(world: int, hsdp_replicas: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(shape, dim names) of the FSDP mesh: 1-D without HSDP, (replicate, shard) with it."""
    if world % hsdp_replicas:
        raise ValueError(
            f"actor.hsdp_replicas ({hsdp_replicas}) must divide the number of workers ({world})"
        )
    if hsdp_replicas == 1:
        return (world,), ("fsdp",)
    return (hsdp_replicas, world // hsdp_replicas), ("replicate", "shard")


def init_parallel(
    rank_env: RankEnv,
    tensor_parallel_size: int = 1,
    hsdp_replicas: int = 1,
    ep_size: int = 1,
    sp_size: int = 1,
) -> ParallelState:
    """Initialise (once) the process group and meshes of this worker process."""
    global _STATE
    if _STATE is not None:
        asked = (rank_env, tensor_parallel_size, hsdp_replicas, ep_size, sp_size)
        held = (
            _STATE.rank_env,
            _STATE.tp_size,
            _STATE.hsdp_replicas,
            _STATE.ep_size,
            _STATE.sp_size,
        )
        if asked != held:
            raise RuntimeError(
                "this process already set up parallel state (rank env, tp, hsdp replicas, ep, "
                f"sp) = {held}; asked again with {asked}"
            )
        return _STATE
    world = rank_env.world_size
    if world % tensor_parallel_size:
        raise ValueError(
            f"rollout.tensor_parallel_size ({tensor_parallel_size}) must divide the number of workers ({world})"
        )
    mesh_shape, mesh_names = fsdp_mesh_shape(world, hsdp_replicas)
    assert ep_size == 1 or hsdp_replicas == 1, "expert parallelism runs over plain FSDP"
    expert_shape = expert_mesh_shape(world, ep_size)
    assert world % sp_size == 0, "sp divides the trainer's world (checked at start-up)"
    device = _pick_device(rank_env)
    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://{rank_env.master_addr}:{rank_env.master_port}",
            rank=rank_env.rank,
            world_size=world,
            device_id=device if device.type == "cuda" else None,
        )
    _STATE = ParallelState(
        rank_env=rank_env,
        device=device,
        fsdp_mesh=init_device_mesh(device.type, mesh_shape, mesh_dim_names=mesh_names),
        rollout_mesh=init_device_mesh(
            device.type,
            (world // tensor_parallel_size, tensor_parallel_size),
            mesh_dim_names=("dp", "tp"),
        ),
        expert_mesh=(
            init_device_mesh(device.type, expert_shape, mesh_dim_names=("efsdp", "ep"))
            if ep_size > 1
            else None
        ),
        sp_mesh=(
            init_device_mesh(device.type, (world // sp_size, sp_size), mesh_dim_names=("dp", "sp"))
            if sp_size > 1
            else None
        ),
    )
    return _STATE


def init_trainer_parallel(rank_env: RankEnv, config: HybridWorkerConfig) -> ParallelState:
    """`init_parallel` for a trainer-side member (actor, reference, critic, teacher, reward
    model): every size from the run's config, so colocated members agree."""
    return init_parallel(
        rank_env,
        config.rollout.tensor_parallel_size,
        trainer_hsdp_replicas(rank_env, config),
        config.actor.ep_size,
        config.actor.sp_size,
    )


def trainer_hsdp_replicas(rank_env: RankEnv, config: HybridWorkerConfig) -> int:
    """actor.hsdp_replicas, auto (0) resolved for the policy's model on this rank's device."""
    if config.actor.hsdp_replicas > 0:
        return config.actor.hsdp_replicas
    device = _pick_device(rank_env)
    return trainer_replicas(
        config.actor,
        model_shape(config.model.path),
        lora=config.model.lora.enabled,
        world=rank_env.world_size,
        on_cpu=device.type == "cpu",
        device_bytes=device_memory_bytes(device),
    )


def _pick_device(rank_env: RankEnv) -> torch.device:
    if not torch.cuda.is_available():
        return torch.device("cpu")
    # Ray gives each GPU worker exactly one visible device; under torchrun all are visible.
    index = 0 if torch.cuda.device_count() == 1 else rank_env.local_rank
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
