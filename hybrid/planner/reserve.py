"""The memory planner's CUDA reserve: what one worker's GPU holds outside the phases the
planner places (the CUDA context, the NCCL communicators' buffers, the caching allocator's
fragmentation), and how sure the planner is of it. No reserve on CPU.

Communicators of one worker process (hybrid.workers.parallel; vLLM's parallel_state under
the external launcher), each counted when its group has more than one rank:
  default          the world group: FSDP2 on a 1-D mesh, the critic (same mesh), barriers
  hsdp shard       actor.hsdp_replicas = H > 1: FSDP2's all-gather / reduce-scatter inside a
                   replica (W / H consecutive ranks)
  hsdp replicate   H > 1: the gradient all-reduce across replicas (H ranks, W / H apart)
  sp               actor.sp_size = N > 1: Ulysses' all-to-alls inside an sp group (N
                   consecutive ranks, on one node: config check)
  sp dp            N > 1: the trainer's data-parallel group (W / N ranks, N apart: the loss
                   normalisers and metrics)
  rollout tp       rollout.tensor_parallel_size > 1: the rollout mesh's tp group
                   (hybrid.rollout.group.RolloutGroup.gather)
  vllm world       vLLM's world GroupCoordinator: a torch NCCL group of all W ranks
  vllm tp          tp > 1: vLLM's tensor-parallel group (a torch NCCL group) ...
  vllm tp pynccl   ... and its PyNccl communicator, a second ncclComm of the same ranks
The rollout mesh's dp group runs no collective and is left out. A counted group is charged
even if it never runs a collective (NCCL >= 2.22 connects buffers at the first one,
NCCL_RUNTIME_CONNECT=1), so the count is an upper bound.

NVLS (NVLink SHARP) is NCCL's algorithm for NVSwitch nodes with multicast (H100 / H200 HGX);
its buffers make a communicator several times larger. NCCL sets it up only where the
communicator has more than two GPUs on the node (`ncclNvlsInit`: gpuCount <= 2 -> no NVLS,
NVIDIA/nccl src/transport/nvls.cc), so TP-2 groups and one-rank-per-node HSDP replicate groups
never have it. Whether the node has it is a planner input (`nvls`); by default a CUDA run
with >= 8 workers per node on a GPU other than an A100 (whose NVSwitch has no SHARP) is
assumed to be an 8-GPU NVSwitch node. NCCL_NVLS_ENABLE=0 turns it off: plan with nvls=False
(`--no-nvls`).

Uncertainty: the difference between the reserve with NVLS and without it (whether NCCL sets
the NVLS buffers up, and their size, vary: nccl#864 measured 1.5 - 2 GB per communicator, NCCL
>= 2.20 allocates 16 channels x 2 x 8 steps x 128 KiB x 8 heads = 256 MiB of them) plus
RESERVE_UNCERTAINTY of the reserve without NVLS. A plan that fits by less than this gets a
warning.

Every constant is an estimate from published measurements, to be calibrated on a GPU
(torch.cuda.mem_get_info before and after each group's first collective).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hybrid.memory.records import GIB

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

__all__ = [
    "CONTEXT_BYTES",
    "DEFAULT_GPU",
    "FRAGMENTATION_BYTES",
    "GPU_KINDS",
    "NVLS_COMMUNICATOR_BYTES",
    "RING_COMMUNICATOR_BYTES",
    "Communicator",
    "Reserve",
    "communicators",
    "cuda_reserve",
    "default_nvls",
]

GPU_KINDS = ("h100", "h200", "a100")
"""GPU kinds the planner knows: an A100 gets vLLM's small batch defaults and no NVLS."""
DEFAULT_GPU = "h100"

CONTEXT_BYTES = 1 << 29
"""The CUDA context and the kernels loaded into it: ~0.5 GiB on H100 with torch's and
vLLM's libraries (nvidia-smi of a process that only initialised CUDA)."""
FRAGMENTATION_BYTES = 1 << 29
"""The caching allocator's fragmentation: blocks reserved but not usable at a peak. The
remainder of the 1.5 GiB flat reserve the planner had before, after the context and ~0.5
GiB of NCCL buffers; a guess."""
RING_COMMUNICATOR_BYTES = 1 << 29
"""A communicator without NVLS: ring / tree buffers, NCCL_BUFFSIZE 4 MiB (Simple) + LL128 +
LL per channel and peer, 16 - 32 channels on NVLink: 0.25 - 0.5 GiB; nccl#964 measured 544 MB
(2 GPUs) and 688 MB (3 - 4 GPUs) per group on A100 NVLink. An estimate."""
NVLS_COMMUNICATOR_BYTES = 3 << 29
"""A communicator with NVLS (its ring / tree buffers included): nccl#864 reports ~1.6 GB for
one communicator on H100 NVSwitch and ~6 GB for three or more (1.5 - 2 GB each);
NeMo-Framework-Launcher#127 and sglang#631 turn NVLS off to save it. 1.5 GiB; an estimate."""
RESERVE_UNCERTAINTY = 0.25
"""The uncertainty of the reserve outside the NVLS buffers, as a fraction of it."""


@dataclass(frozen=True)
class Communicator:
    """One NCCL communicator of a worker process and what the plan charges for it."""

    name: str
    ranks: int
    local_ranks: int
    """Its ranks on this worker's node (NVLS needs more than two)."""
    nvls: bool
    gib: float


@dataclass(frozen=True)
class Reserve:
    """Kept free on the GPU outside the phases: context + fragmentation + communicators."""

    context_gib: float
    fragmentation_gib: float
    communicators: tuple[Communicator, ...]
    nvls: bool
    """Whether the plan assumes NVLink SHARP on the node (see the module docstring)."""
    uncertainty_gib: float
    """How far the reserve may be off: what NVLS adds + RESERVE_UNCERTAINTY of the rest."""
    total_gib: float

    @property
    def communicators_gib(self) -> float:
        return sum(c.gib for c in self.communicators)


def default_nvls(config: TrainerRunConfig, gpu: str = DEFAULT_GPU) -> bool:
    """The planner's guess without an input: an 8-GPU NVSwitch node with NVLS (>= 8 workers
    per node on CUDA, not an A100)."""
    t = config.trainer
    return t.use_gpu and t.workers_per_node >= 8 and "a100" not in gpu


def communicators(config: TrainerRunConfig, nvls: bool) -> tuple[Communicator, ...]:
    """The communicators one worker holds (groups of one rank left out)."""
    world, per_node = config.trainer.num_workers, config.trainer.workers_per_node
    tp, replicas = config.rollout.tensor_parallel_size, config.actor.hsdp_replicas
    replica = world // replicas
    groups = [("default", world, min(world, per_node))]
    if replicas > 1:  # a replica is W / H consecutive ranks; its peers are W / H ranks apart
        groups += [
            ("hsdp shard", replica, min(replica, per_node)),
            ("hsdp replicate", replicas, max(1, per_node // replica)),
        ]
    sp = config.actor.sp_size
    if sp > 1:  # the sp mesh: consecutive groups inside a node, their dp peers N ranks apart
        groups += [("sp", sp, sp), ("sp dp", world // sp, max(1, min(world, per_node) // sp))]
    groups.append(("rollout tp", tp, tp))  # TP groups never cross a node (config check)
    groups += [("vllm world", world, min(world, per_node)), ("vllm tp", tp, tp)]
    groups.append(("vllm tp pynccl", tp, tp))
    held = []
    for name, ranks, local in groups:
        if ranks > 1:
            with_nvls = nvls and local > 2
            nbytes = NVLS_COMMUNICATOR_BYTES if with_nvls else RING_COMMUNICATOR_BYTES
            held.append(Communicator(name, ranks, local, with_nvls, nbytes / GIB))
    return tuple(held)


def cuda_reserve(
    config: TrainerRunConfig, nvls: bool | None = None, gpu: str = DEFAULT_GPU
) -> Reserve:
    """The reserve of one worker (all zeros on CPU); `nvls` None: `default_nvls`."""
    if not config.trainer.use_gpu:
        return Reserve(0.0, 0.0, (), False, 0.0, 0.0)
    assumed = default_nvls(config, gpu) if nvls is None else nvls
    held = communicators(config, assumed)
    context, fragmentation = CONTEXT_BYTES / GIB, FRAGMENTATION_BYTES / GIB
    total = context + fragmentation + sum(c.gib for c in held)
    # what NVLS adds over ring / tree buffers, + a fraction of the reserve without it
    extra = NVLS_COMMUNICATOR_BYTES - RING_COMMUNICATOR_BYTES
    nvls_gib = sum(c.nvls for c in held) * extra / GIB
    uncertainty = nvls_gib + RESERVE_UNCERTAINTY * (total - nvls_gib)
    return Reserve(context, fragmentation, held, assumed, uncertainty, total)
