"""The longest response a run fits, with and without sequence parallelism, by the planner's
numbers.

`longest_responses(config, shape, gpu_memory_gib)` searches rollout.response_length in steps
of RESPONSE_STEP tokens for the longest at which `plan_memory` fits: a binary search, since a
longer response never needs less memory. It keeps the prompt as configured
(data.max_prompt_length, rollout.prompt_length), sets rollout.max_model_len to prompt +
response (what the engine must hold), and raises each token budget of a pass with
use_dynamic_bsz (every member's: the actor's, the reference's, the critic's, the teacher's) to
hold one whole sequence per sp group: (prompt + response) / sp per rank.
It does so at sp = 1, at the config's actor.sp_size and at every size `suggest.sp_sizes`
allows, each through `suggest.with_sp` (the budgets scaled so that a group's micro-batch keeps
its tokens). Memory only: the model's context window (max_position_embeddings, RoPE scaling)
is not checked, and the search stops at `limit` tokens.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hybrid.memory.model_shape import ModelShape
from hybrid.planner.plan import Plan, plan_memory
from hybrid.planner.suggest import _get, _override, _replace, read_budgets, sp_sizes, with_sp

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

__all__ = ["RESPONSE_LIMIT", "RESPONSE_STEP", "LongestFit", "longest_responses", "with_response"]

RESPONSE_STEP = 1024
"""The search's grain: response lengths are multiples of it."""
RESPONSE_LIMIT = 1 << 20
"""Where the search stops (tokens): a fit there is reported as "at least"."""


@dataclass(frozen=True)
class LongestFit:
    """The longest response that fits at one sequence-parallel size."""

    sp: int
    """actor.sp_size."""
    prompt_length: int
    """rollout.prompt_length, as configured."""
    step: int
    """The search's grain (tokens)."""
    response_length: int
    """The longest fitting rollout.response_length (a multiple of the step); 0 when not even
    one step fits, or the config is invalid at this sp."""
    plan: Plan | None
    """The plan at that length (None with 0)."""
    overrides: tuple[str, ...]
    """Hydra overrides of the config for that length at this sp."""
    at_limit: bool = False
    """It fits at the search's limit: the longest is at least this."""
    limited_by: tuple[str, ...] = ()
    """The problems of the plan one step longer (what stops it), empty at the limit."""
    clear_response_length: int = 0
    """The longest whose plan fits by at least the reserve's uncertainty (no thin-margin
    warning): the figure to rely on before the reserve is measured on the GPU."""
    error: str | None = None
    """Why the config is invalid at this sp (then nothing was searched)."""


def with_response(
    config: TrainerRunConfig, response_length: int
) -> tuple[TrainerRunConfig, tuple[str, ...]]:
    """`config` with `response_length` and its overrides: rollout.max_model_len at prompt +
    response, and each token budget the run reads (suggest.read_budgets) raised, where below,
    to one whole sequence per sp group ((prompt + response) / sp per rank). Raises ValueError
    where the config is invalid at that length."""
    seq = config.rollout.prompt_length + response_length
    rollout = dataclasses.replace(
        config.rollout, response_length=response_length, max_model_len=seq
    )
    changed = _replace(config, "rollout", rollout)
    overrides = [
        _override("rollout.response_length", response_length),
        _override("rollout.max_model_len", seq),
    ]
    least = -(-seq // config.actor.sp_size)
    for key in read_budgets(config):
        if _get(changed, key) < least:
            changed = _replace(changed, key, least)
            overrides.append(_override(key, least))
    return changed, tuple(overrides)


def longest_responses(
    config: TrainerRunConfig,
    shape: ModelShape,
    gpu_memory_gib: float,
    *,
    sizes: tuple[int, ...] | None = None,
    step: int = RESPONSE_STEP,
    limit: int = RESPONSE_LIMIT,
    **node: Any,
) -> list[LongestFit]:
    """The longest fitting response at each sp of `sizes` (default: 1, the config's and those
    suggest.sp_sizes allows), smallest sp first. `node`: plan_memory's keyword arguments
    (lora_rank, critic_shape, gpu, nvls, host_memory_gib, teacher_shape)."""
    if step <= 0 or limit < step:
        raise ValueError(f"need 0 < step <= limit, got step={step}, limit={limit}")
    if sizes is None:
        sizes = tuple(sorted({1, config.actor.sp_size, *sp_sizes(config, shape)}))
    plan = functools.partial(plan_memory, shape=shape, gpu_memory_gib=gpu_memory_gib, **node)
    found = []
    for sp in sizes:
        prompt = config.rollout.prompt_length
        try:
            at_sp, sp_overrides = (
                (config, ()) if sp == config.actor.sp_size else with_sp(config, sp)
            )
        except ValueError as error:
            found.append(LongestFit(sp, prompt, step, 0, None, (), error=str(error)))
            continue
        length, best, overrides = _search(at_sp, plan, step, limit, _fits)
        clear = _search(at_sp, plan, step, length, _fits_clearly)[0] if length else 0
        at_limit = length == limit // step * step
        found.append(
            LongestFit(
                sp,
                prompt,
                step,
                length,
                best,
                _last_wins((*sp_overrides, *overrides)) if length else (),
                at_limit=at_limit,
                limited_by=() if at_limit else _problems(at_sp, plan, length + step),
                clear_response_length=clear,
            )
        )
    return found


def _last_wins(overrides: tuple[str, ...]) -> tuple[str, ...]:
    """One override per field, the last value set (in the place of the first)."""
    by_field: dict[str, str] = {}
    for override in overrides:
        by_field[override.split("=")[0]] = override
    return tuple(by_field.values())


def _problems(config: TrainerRunConfig, plan: Any, response_length: int) -> tuple[str, ...]:
    """Why the plan at `response_length` does not fit (or the config refuses that length)."""
    try:
        changed, _ = with_response(config, response_length)
    except ValueError as error:
        return (str(error),)
    return plan(changed).problems


def _fits(plan: Plan) -> bool:
    return plan.fits


def _fits_clearly(plan: Plan) -> bool:
    """Fits by at least the reserve's uncertainty (plan.py's thin-margin warning)."""
    return plan.fits and plan.margin_gib >= plan.reserve.uncertainty_gib


def _search(
    config: TrainerRunConfig,
    plan: Any,
    step: int,
    limit: int,
    accept: Callable[[Plan], bool],
) -> tuple[int, Plan | None, tuple[str, ...]]:
    """The largest multiple of `step` up to `limit` whose plan `accept`s (0: none), its plan
    and its overrides. A length the config refuses (a reward.overlong_buffer longer than the
    response, say) counts as not fitting."""
    lo, hi = 0, limit // step  # lo fits (0: nothing yet); every step above hi does not
    best: tuple[Plan | None, tuple[str, ...]] = (None, ())
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            changed, overrides = with_response(config, mid * step)
        except ValueError:
            hi = mid - 1
            continue
        result = plan(changed)
        if accept(result):
            lo, best = mid, (result, overrides)
        else:
            hi = mid - 1
    return lo * step, *best
