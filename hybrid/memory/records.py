"""The memory ledger's record: one line of `output_dir/memory.jsonl` per worker, step and
phase boundary. The ledger writes these, the report and the planner read them; the phase and
component names below are the vocabulary all three share.

A boundary is named after the work it closes: the record at `update/backward` carries the
peak of the interval that ended there (that micro-batch's backward pass). Memory figures are
GiB. `current_gib` is what is in use at the boundary: CUDA allocated bytes on a GPU, the
process RSS on CPU. `peak_gib` is the highest value of the same measure since the previous
boundary (CUDA's peak counter, or the kernel's peak-RSS mark, both reset at every boundary).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path

GIB = float(1 << 30)

# Phase boundaries of one training step, in the order they occur (some repeat: one
# `sync/gather_load` per gathered group, one `update/forward` + `update/backward` per
# micro-batch, one `update/optimizer_step` per mini-batch).
STEP_PHASES: tuple[str, ...] = (
    "rollout/enter",  # the driver's work since the last boundary (rewards, advantages)
    "sync/onload_actor",  # actor shards back on the device (param offload)
    "sync/wake_weights",  # the engine's weights resumed
    "sync/gather_load",  # one group all-gathered and loaded into the engine (per chunk)
    "sync/offload_actor",  # actor shards parked on the host again
    "rollout/wake_kv",  # KV cache resumed: the rollout-mode steady state
    "rollout/generate",  # sampling
    "trainer/release_kv",  # engine asleep: KV cache released, weights offloaded
    "trainer/ready",  # caches emptied: the trainer-mode steady state
    "ref/onload",
    "ref/forward",  # reference log-probs
    "ref/offload",
    "old_log_prob/onload",
    "old_log_prob/forward",  # the actor's log-probs before the update
    "old_log_prob/offload",
    "values/onload",  # PPO's critic (algorithm.adv_estimator=gae) only, as are the next 7
    "values/forward",  # the critic's values of the response tokens
    "values/offload",
    "update_critic/onload",
    "update_critic/forward",  # per micro-batch
    "update_critic/backward",  # per micro-batch
    "update_critic/optimizer_step",  # per mini-batch
    "update_critic/offload",
    "update/onload",  # actor params and optimizer state on the device
    "update/forward",  # per micro-batch
    "update/backward",  # per micro-batch
    "update/optimizer_step",  # per mini-batch
    "update/offload",
)

CRITIC_PHASES: tuple[str, ...] = tuple(
    p for p in STEP_PHASES if p.split("/")[0] in ("values", "update_critic")
)


def step_phases(critic: bool) -> tuple[str, ...]:
    """The boundaries a step records: STEP_PHASES, less the critic's without one."""
    return STEP_PHASES if critic else tuple(p for p in STEP_PHASES if p not in CRITIC_PHASES)


# Boundaries whose `current_gib` is a steady state (nothing transient alive).
STEADY_PHASES = {"trainer": "trainer/ready", "rollout": "rollout/wake_kv"}

# What the bytes on the device are, computed from the objects that hold them.
COMPONENTS: tuple[str, ...] = (
    "runtime",  # non-tensor memory: the process before any model, plus what each phase
    # added beyond its objects the first time it ran (code, kernel and allocator caches)
    "actor_params",  # the FSDP2 actor's local shards (master dtype)
    "actor_grads",  # their gradients, while they exist
    "optimizer_state",  # AdamW moments
    "ref_params",  # the reference policy's local shards
    "teacher_params",  # on-policy distillation's frozen teacher: its local shards
    "critic_params",  # PPO's value model: its local shards (master dtype)
    "critic_grads",  # their gradients, while they exist
    "critic_optimizer_state",  # its AdamW moments
    "rollout_weights",  # the vLLM engine's weights (awake)
    "kv_cache",  # the vLLM engine's KV cache (awake)
    "engine_overhead",  # the same for vLLM's phases: its start and first generation,
    # beyond its weights and KV cache
    "gather_buffers",  # full tensors of the sync group in flight
)


@dataclass(frozen=True)
class MemoryRecord:
    step: int
    """Training step (0: initialisation and anything before the first step)."""
    rank: int
    phase: str
    """Boundary name (STEP_PHASES, or `init/...`, `validate/...`, `checkpoint/...`)."""
    t_s: float
    """Seconds since the worker's ledger started."""
    device: str
    """"cuda" or "cpu": which measure current_gib / peak_gib are."""
    current_gib: float
    peak_gib: float
    rss_gib: float
    """Process RSS, also on CUDA (host memory: offloaded state, pinned buffers)."""
    reserved_gib: float | None = None
    """CUDA caching allocator reserve (None on CPU)."""
    chunk: int | None = None
    """Index of the gathered group for `sync/gather_load`, of the micro-batch for update/..."""
    components_gib: dict[str, float] = field(default_factory=dict)
    """On the measured device, by COMPONENTS name."""
    node: str = ""
    """The worker's node (`<address> <Ray node id prefix>`; "" outside a worker group)."""
    host_gib: dict[str, float] = field(default_factory=dict)
    """Offloaded to host memory (empty on CPU, where the device is the host)."""

    @property
    def attributed_gib(self) -> float:
        return sum(self.components_gib.values())

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, row: dict[str, object], where: str = "record") -> MemoryRecord:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(row) - known)
        missing = sorted(
            name
            for name, f in cls.__dataclass_fields__.items()
            if name not in row and f.default is MISSING and f.default_factory is MISSING
        )
        if unknown or missing:
            raise ValueError(f"{where}: unknown fields {unknown}, missing fields {missing}")
        return cls(**row)  # type: ignore[arg-type]


def write_records(path: Path, records: Iterable[MemoryRecord]) -> None:
    """Append records to a memory.jsonl (a resumed run continues the same file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        for record in records:
            out.write(record.to_json() + "\n")


def read_records(path: Path) -> Iterator[MemoryRecord]:
    """Records of a memory.jsonl; a malformed line raises naming the file and line number."""
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not JSON ({error.msg})") from error
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected a JSON object")
            yield MemoryRecord.from_dict(row, where)
