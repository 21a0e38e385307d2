"""The smallest config changes that make an over-budget run fit, by the planner's numbers.

`suggest(config, shape, gpu_memory_gib)` tries the changes of CHANGE_ORDER alone, then in
pairs, triples ...: each valued change at its least drastic value that fits. A change set is
kept only if no subset of it already fits, and sets are ranked by size, then by the cost of
their costliest change. LoRA comes from the config (or the `lora_rank` override, as in
`plan_memory`): the reference's changes drop out (there is none), and `sync.layered_summon`
joins for the merge mode; the distillation teacher's offload and micro-batch join with a
teacher (distill.teacher_path). A pass with use_dynamic_bsz gets its token budget halved (down to
the longest row, S, or S / sp per rank under sequence parallelism) instead of its
micro_batch_size. Sequence parallelism (actor.sp_size, `with_sp`: the sizes of `sp_sizes`) is
the dearest change; with dynamic micro-batches it comes with every token budget the run reads
divided by sp, so that each rank holds 1 / sp of the micro-batch it held. The node (`gpu`,
`nvls`, `host_memory_gib`) is planned as `plan_memory` does; no change here lowers host RAM
(every offload raises it), so a config whose host RAM does not fit gets no suggestion.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hybrid.memory.model_shape import ModelShape
from hybrid.planner.adapters import lora_rank_of
from hybrid.planner.plan import Plan, plan_memory
from hybrid.planner.reserve import DEFAULT_GPU
from hybrid.planner.sizes import gather_peak
from hybrid.planner.teacher_sizes import teacher_of
from hybrid.trainer.config_files import check_sequence_parallel_model

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig


@dataclass(frozen=True)
class Suggestion:
    overrides: tuple[str, ...]
    """Hydra overrides, e.g. `actor.offload.optimizer_offload=true`."""
    plan: Plan
    """The plan of the changed config."""
    config: TrainerRunConfig = field(repr=False)


# The changes `suggest` tries, cheapest first (its cost order): a finer sync gather (or, for
# LoRA's merge mode, a layered one) costs nothing but a few more collectives; the reference's
# offload moves bf16 weights twice a step (the distillation teacher's as well, often more of
# them), the critic's (used in two phases) fp32 ones four times; the optimizer's offload
# moves 2 x fp32 state twice a step (the actor's, then the critic's); a smaller vLLM share
# only lowers the KV cache (less concurrency when it was the limit); the chunked log-prob
# head (when turned off) recomputes the LM head in backward, a few percent of the update's
# compute; gradient checkpointing adds ~1/3 to it; a smaller micro-batch (by rows, or by
# tokens with use_dynamic_bsz) runs smaller, slower kernels (the no-grad passes are a smaller
# share of a step than the update); the actor's offload moves its shards at every phase
# boundary; sequence parallelism adds four all-to-alls per layer and pass (and their backward),
# runs smaller kernels on each rank's slice and shrinks the data-parallel size: worth it only
# where a sequence's activations do not fit one GPU.
CHANGE_ORDER: tuple[str, ...] = (
    "sync.gather",
    "sync.layered_summon",
    "ref.offload.param_offload",
    "distill.offload.param_offload",
    "critic.offload.param_offload",
    "actor.offload.optimizer_offload",
    "critic.offload.optimizer_offload",
    "rollout.gpu_memory_utilization",
    "model.log_prob_chunk_tokens",
    "model.gradient_checkpointing",
    "critic.gradient_checkpointing",
    "ref.micro_batch_size",
    "ref.log_prob_max_token_len_per_gpu",
    "distill.micro_batch_size",
    "distill.log_prob_max_token_len_per_gpu",
    "critic.forward_max_token_len_per_gpu",
    "actor.log_prob_max_token_len_per_gpu",
    "critic.micro_batch_size",
    "critic.ppo_max_token_len_per_gpu",
    "actor.micro_batch_size",
    "actor.ppo_max_token_len_per_gpu",
    "actor.offload.param_offload",
    "actor.sp_size",
)
CHUNK_TOKENS = 1024
"""model.log_prob_chunk_tokens suggested for a config that has it off (its default)."""
SP_SIZES = (2, 4, 8)
"""The sequence-parallel sizes tried (`sp_sizes`): an sp group stays inside a node."""
SP_BUDGETS: dict[str, tuple[str, ...]] = {
    "actor": ("actor.ppo_max_token_len_per_gpu", "actor.log_prob_max_token_len_per_gpu"),
    "ref": ("ref.log_prob_max_token_len_per_gpu",),
    "critic": ("critic.ppo_max_token_len_per_gpu", "critic.forward_max_token_len_per_gpu"),
    "distill": ("distill.log_prob_max_token_len_per_gpu",),
}
"""The token budgets of every member's passes, by member: per rank, so that under
actor.sp_size an sp group's micro-batch holds budget x sp tokens."""


def _get(config: Any, key: str) -> Any:
    for name in key.split("."):
        config = getattr(config, name)
    return config


def _replace(config: Any, key: str, value: Any) -> Any:
    """`config` with the dotted field `key` (e.g. actor.offload.param_offload) set, every
    group on the way rebuilt and so validated again, like any config."""
    name, _, rest = key.partition(".")
    if rest:
        value = _replace(getattr(config, name), rest, value)
    return dataclasses.replace(config, **{name: value})


def sp_sizes(config: TrainerRunConfig, shape: ModelShape) -> list[int]:
    """The sizes of SP_SIZES that `config` can run at on `shape`: Ulysses' head rule and no
    mixture of experts (hybrid.trainer.config_files.check_sequence_parallel_model), and the config
    valid at that size (`with_sp`: sp divides the trainer's workers and the workers per node,
    packed rows, the rows of a mini-batch over the data-parallel slots)."""
    heads = {
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "num_experts": shape.num_experts,
    }
    sizes = []
    for sp in SP_SIZES:
        try:
            check_sequence_parallel_model(heads, sp, shape.name)
            with_sp(config, sp)
        except ValueError:
            continue
        sizes.append(sp)
    return sizes


def read_budgets(config: TrainerRunConfig) -> tuple[str, ...]:
    """The token budgets (SP_BUDGETS) the run reads: those of its members that run, with
    use_dynamic_bsz."""
    runs = {
        "actor": True,
        "ref": config.needs_reference,
        "critic": config.use_critic,
        "distill": config.distill.enabled,
    }
    return tuple(
        key
        for owner, keys in SP_BUDGETS.items()
        if runs[owner] and _get(config, owner).use_dynamic_bsz
        for key in keys
    )


def with_sp(config: TrainerRunConfig, sp: int) -> tuple[TrainerRunConfig, tuple[str, ...]]:
    """`config` at actor.sp_size=sp and its Hydra overrides. Each token budget the run reads
    (`read_budgets`) is scaled by the old sp / sp, so that an sp group's micro-batch holds
    the tokens it held, each rank 1 / sp of them, and kept at or above S / sp (a group must
    hold one whole sequence). Raises ValueError where the config is invalid at that size."""
    old, seq = config.actor.sp_size, config.rollout.prompt_length + config.rollout.response_length
    changed = config
    overrides = [_override("actor.sp_size", sp)]
    for key in read_budgets(config):
        budget = max(-(-_get(config, key) * old // sp), -(-seq // sp))
        changed = _replace(changed, key, budget)
        overrides.append(_override(key, budget))
    return _replace(changed, "actor.sp_size", sp), tuple(overrides)


def _values(config: TrainerRunConfig, shape: ModelShape, key: str, lora_rank: int) -> list[Any]:
    """The values to try for one change, least drastic first; [] where it cannot help."""
    c, gpu, current = config, config.trainer.use_gpu, _get(config, key)
    uses_ref = c.needs_reference and not lora_rank
    if key.startswith("critic.") and not c.use_critic:
        return []
    if key.startswith("distill.") and not c.distill.enabled:
        return []
    if key == "sync.layered_summon":  # LoRA's merge mode gathers by it, not by sync.gather
        return [True] if lora_rank and c.sync.lora_mode == "merge" and not current else []
    if key == "sync.gather":  # LoRA: only adapter mode's first sync (the base) uses it
        if lora_rank and c.sync.lora_mode == "merge":
            return []
        bucket = c.sync.bucket_mb << 20
        layer = gather_peak(shape, "layer", bucket)
        return ["layer"] if gather_peak(shape, current, bucket) > layer else []
    if key.endswith("_offload"):  # no-ops on CPU; the reference may not exist
        needed = uses_ref or key != "ref.offload.param_offload"
        return [True] if gpu and not current and needed else []
    if key.endswith("gradient_checkpointing"):
        return [] if current else [True]
    if key == "model.log_prob_chunk_tokens":
        return [CHUNK_TOKENS] if current == 0 else []
    if key == "actor.sp_size":  # the smallest first
        return [sp for sp in sp_sizes(config, shape) if sp > current]
    if key == "rollout.gpu_memory_utilization":  # the 0.05 grid, largest first
        usable = gpu and c.rollout.kv_cache_memory_bytes is None
        grid = [round(k * 0.05, 2) for k in range(19, 0, -1)]
        return [u for u in grid if abs(u - current) > 1e-9] if usable else []
    if not key.endswith(("micro_batch_size", "_max_token_len_per_gpu")):
        raise AssertionError(f"unknown change {key}")
    # Micro-batches: by rows, or by tokens with the section's use_dynamic_bsz.
    owner = key.split(".")[0]
    dynamic = {
        "ref": c.ref.use_dynamic_bsz,
        "distill": c.distill.use_dynamic_bsz,
        "critic": c.critic.use_dynamic_bsz,
        "actor": c.actor.use_dynamic_bsz,
    }[owner]
    by_tokens = key.endswith("_max_token_len_per_gpu")
    if dynamic != by_tokens or (owner == "ref" and not c.needs_reference):
        return []  # the other kind of micro-batch, or no reference forward
    # Halvings; a token budget below the longest row (S tokens; S / sp per rank of an sp
    # group) is an error.
    sp = c.actor.sp_size
    least = -(-(c.rollout.prompt_length + c.rollout.response_length) // sp) if by_tokens else 1
    return [current >> k for k in range(1, current.bit_length()) if current >> k >= least]


def _override(key: str, value: Any) -> str:
    """A Hydra override: booleans as true / false."""
    return f"{key}={str(value).lower() if isinstance(value, bool) else value}"


def suggest(
    config: TrainerRunConfig,
    shape: ModelShape,
    gpu_memory_gib: float,
    lora_rank: int = 0,
    limit: int = 5,
    critic_shape: ModelShape | None = None,
    *,
    gpu: str = DEFAULT_GPU,
    nvls: bool | None = None,
    host_memory_gib: float | None = None,
    teacher_shape: ModelShape | None = None,
) -> list[Suggestion]:
    """The smallest sets of changes (CHANGE_ORDER) that make `config` fit, ranked by the
    number of changes, then by cost (the costliest change of each set compared first).

    A valued change takes its least drastic value that fits: the largest smaller micro-batch
    (halving), the largest gpu_memory_utilization on a 0.05 grid (usually below the current
    one; above it when vLLM's share cannot hold its weights and a KV cache). A set containing
    a fitting set is left out. Empty when the config already fits, or nothing here does.
    `critic_shape`, `gpu`, `nvls`, `host_memory_gib`, `teacher_shape`: as in plan_memory
    (the teacher's shape read once here, not at every candidate).
    """
    if teacher_shape is None and config.distill.teacher_path is not None:
        teacher = teacher_of(config)[0]  # None: every plan warns that it is left out
        teacher_shape = None if teacher is None else teacher.shape
    plan = functools.partial(
        plan_memory,
        critic_shape=critic_shape,
        gpu=gpu,
        nvls=nvls,
        host_memory_gib=host_memory_gib,
        teacher_shape=teacher_shape,
    )
    base = plan(config, shape, gpu_memory_gib, lora_rank)
    if base.fits or base.host_fits is False:  # no change here lowers host RAM
        return []
    rank = lora_rank_of(config, lora_rank)
    options = {k: v for k in CHANGE_ORDER if (v := _values(config, shape, k, rank))}
    found: list[tuple[tuple[str, ...], Suggestion]] = []
    for size in range(1, len(options) + 1):
        for keys in itertools.combinations(options, size):
            if any(set(done) <= set(keys) for done, _ in found):
                continue  # a subset already fits: this set is not minimal
            hit = _first_fit(plan, config, shape, gpu_memory_gib, lora_rank, keys, options)
            if hit is not None:
                found.append((keys, hit))
    found.sort(key=lambda item: (len(item[0]), sorted(map(CHANGE_ORDER.index, item[0]))[::-1]))
    return [suggestion for _, suggestion in found[:limit]]


def _first_fit(
    plan_memory: Callable[..., Plan],
    config: TrainerRunConfig,
    shape: ModelShape,
    gpu_memory_gib: float,
    lora_rank: int,
    keys: tuple[str, ...],
    options: dict[str, list[Any]],
) -> Suggestion | None:
    """The first fitting assignment of values to `keys`, the costliest varied slowest."""
    for values in itertools.product(*(options[k] for k in reversed(keys))):
        chosen = dict(zip(reversed(keys), values, strict=True))
        overrides: dict[str, str] = {}  # by field: the last value set wins
        try:
            changed = config
            for key in keys:
                changed, applied = _apply(changed, key, chosen[key])
                overrides |= {override.split("=")[0]: override for override in applied}
        except ValueError:  # e.g. a micro-batch that does not divide the mini-batch
            continue
        plan = plan_memory(changed, shape, gpu_memory_gib, lora_rank)
        if plan.fits:
            return Suggestion(tuple(overrides.values()), plan, changed)
    return None


def _apply(
    config: TrainerRunConfig, key: str, value: Any
) -> tuple[TrainerRunConfig, tuple[str, ...]]:
    """One change and its overrides: sequence parallelism brings its token budgets along."""
    if key == "actor.sp_size":
        return with_sp(config, value)
    return _replace(config, key, value), (_override(key, value),)
