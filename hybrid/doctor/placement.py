"""GPUs and nodes: does this machine (or the Ray cluster the run joins) hold the workers?

The run asks Ray for one placement group per node entry, each packed onto one node
(hybrid.controller.resource_pool: STRICT_PACK): colocated, trainer.nnodes groups of
trainer.workers_per_node workers; split, one group of explorers and one of trainers. Every
worker takes one CPU slot, and one GPU with trainer.use_gpu. Without a cluster to join the run
starts a local one, sized to this node's CPUs and the GPUs torch sees here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybrid.doctor.facts import HostFacts
from hybrid.doctor.verdict import Check

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

SECTION = "gpus"
CLUSTER_FIX = (
    "start a Ray cluster over the nodes (export the NCCL_* variables first, then `ray start "
    "--head` on one node and `ray start --address=HEAD:6379` on the others) and set "
    "trainer.ray_address=auto (or RAY_ADDRESS)"
)


def worker_groups(config: TrainerRunConfig) -> tuple[int, ...]:
    """Workers per placement group; each group lands on one node."""
    t = config.trainer
    if t.split:
        return (t.num_explorer_workers, t.num_trainer_workers)
    return tuple(t.process_on_nodes)


def fits_nodes(groups: tuple[int, ...], nodes: list[tuple[float, float]], use_gpu: bool) -> bool:
    """Whether every group fits on one node of `nodes` ((gpus, cpus) each), first fit
    decreasing; a group takes a CPU per worker, and a GPU per worker with use_gpu."""
    free = [[gpus if use_gpu else float("inf"), cpus] for gpus, cpus in nodes]
    for size in sorted(groups, reverse=True):
        for node in sorted(free, key=lambda n: (-n[0], -n[1])):
            if node[0] >= size and node[1] >= size:
                node[0] -= size
                node[1] -= size
                break
        else:
            return False
    return True


def _need(config: TrainerRunConfig) -> str:
    t = config.trainer
    unit = "CUDA GPUs" if t.use_gpu else "CPU slots"
    if t.split:
        return (
            f"{t.num_explorer_workers} + {t.num_trainer_workers} {unit} (explorers, trainers; "
            "each group on one node)"
        )
    if t.nnodes > 1:
        return f"{t.nnodes} nodes x {t.workers_per_node} {unit}"
    return f"{t.num_workers} {unit}"


def _gpu_line(facts: HostFacts) -> str:
    visible = facts.env.get("CUDA_VISIBLE_DEVICES")
    shown = "unset" if visible is None else repr(visible)
    if not facts.gpus:
        listed = f"; nvidia-smi lists {facts.smi_gpus}" if facts.smi_gpus else ""
        return f"this node: no CUDA GPU visible to torch{listed} (CUDA_VISIBLE_DEVICES {shown})"
    kinds: dict[str, int] = {}
    for gpu in facts.gpus:
        cap = f", sm{gpu.capability[0]}{gpu.capability[1]}" if gpu.capability else ""
        key = f"{gpu.name} ({gpu.memory_gib:.1f} GiB{cap})"
        kinds[key] = kinds.get(key, 0) + 1
    names = ", ".join(f"{n} x {key}" for key, n in kinds.items())
    return f"this node: {names} (CUDA_VISIBLE_DEVICES {shown})"


def placement_checks(config: TrainerRunConfig, facts: HostFacts) -> list[Check]:
    t = config.trainer
    checks = [Check(SECTION, "ok", _gpu_line(facts))]
    if facts.ray is not None:
        per_node = ", ".join(
            f"{n.address}: {n.gpus:g} GPUs, {n.cpus:g} CPUs" for n in facts.ray.nodes
        )
        checks.append(Check(SECTION, "ok", f"Ray: {facts.ray_note} ({per_node})"))
    elif facts.ray_address is None:  # an unreachable address is a FAIL below
        checks.append(Check(SECTION, "ok", f"Ray: {facts.ray_note}"))
    if not t.use_gpu and facts.gpus:
        checks.append(Check(SECTION, "ok", "trainer.use_gpu=false: the GPUs here go unused"))
    checks.append(_placement(config, facts))
    if t.use_gpu:
        tp = config.rollout.tensor_parallel_size
        engines = (t.num_explorer_workers if t.split else t.num_workers) // tp
        checks.append(
            Check(
                SECTION,
                "ok",
                f"rollout.tensor_parallel_size={tp}: {engines} vLLM engine(s) of {tp} GPU(s), "
                "each inside one node",
            )
        )
    return checks


def _placement(config: TrainerRunConfig, facts: HostFacts) -> Check:
    t, groups, need = config.trainer, worker_groups(config), _need(config)
    cluster = facts.ray if facts.ray is not None and facts.ray.used_by_run else None
    if facts.ray_address is not None and cluster is None:
        return Check(
            SECTION,
            "FAIL",
            f"the Ray cluster at {facts.ray_address} (trainer.ray_address / RAY_ADDRESS)",
            facts.ray_note,
            "start the cluster (`ray start --head` on its first node) or make it reachable "
            "from here as the reason says, or unset the address to run on a local cluster of "
            "this node",
        )
    if cluster is not None:
        nodes = [(n.gpus, n.cpus) for n in cluster.nodes]
        have = (
            f"Ray cluster at {cluster.address}: "
            + (", ".join(f"{g:g}" if t.use_gpu else f"{c:g}" for g, c in nodes) or "no nodes")
            + (" GPUs per node" if t.use_gpu else " CPUs per node")
        )
    else:
        nodes = [(float(len(facts.gpus)), float(facts.cpus))]  # the local cluster
        have = f"{len(facts.gpus)} visible" if t.use_gpu else f"{facts.cpus} CPUs"
    if fits_nodes(groups, nodes, t.use_gpu):
        return Check(SECTION, "ok", f"{need} needed: {have}")
    if cluster is None and len(groups) > 1 and not t.split:
        return Check(
            SECTION,
            "FAIL",
            f"{need} (no Ray cluster to join; this node: {have})",
            f"trainer.nnodes={t.nnodes}: the run places one group of {t.workers_per_node} "
            "workers on each node of the Ray cluster it joins",
            CLUSTER_FIX,
        )
    reason = _shortfall_reason(config, facts)
    fix = (
        f"run where {need} are free, or lower the worker counts "
        "(trainer.num_workers and the batch sizes that must divide by it)"
    )
    if t.use_gpu and facts.torch_cuda is None and facts.smi_gpus:
        fix = "install the CUDA build of torch (see versions); " + fix
    return Check(SECTION, "FAIL", f"{need} ({have})", reason, fix)


def _shortfall_reason(config: TrainerRunConfig, facts: HostFacts) -> str:
    t = config.trainer
    if not t.use_gpu:
        return "every worker takes one CPU slot of Ray's"
    parts = ["trainer.use_gpu=true: one GPU per worker"]
    if facts.smi_gpus and facts.smi_gpus != len(facts.gpus):
        parts.append(f"nvidia-smi lists {facts.smi_gpus} GPUs, torch sees {len(facts.gpus)}")
    if "CUDA_VISIBLE_DEVICES" in facts.env:
        parts.append(f"CUDA_VISIBLE_DEVICES={facts.env['CUDA_VISIBLE_DEVICES']!r}")
    return "; ".join(parts)
