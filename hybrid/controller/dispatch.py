"""How a group call's arguments reach the workers and how their results come back.

`@register(dispatch_mode=...)` marks a Worker method as callable from the driver. The mode
picks a pure planning function: it turns the driver's `(args, kwargs)` into one `(args, kwargs)`
per rank and returns the function that folds the per-rank results into the caller's result.

| mode        | sent to rank i                                   | returned to the driver          |
|-------------|--------------------------------------------------|---------------------------------|
| ONE_TO_ALL  | the same arguments                               | list of every rank's result     |
| ALL_TO_ALL  | element i of every (list) argument               | list of every rank's result     |
| RANK_ZERO   | the same arguments (all ranks run: collectives)  | rank 0's result                 |
| DP_COMPUTE  | chunk i of every Batch argument, others as-is    | Batches concatenated in rank order (other results: the list) |
| TRAIN_DP    | as DP_COMPUTE over the trainer's data-parallel groups: chunk i // sp to rank i (the sp ranks of a group, consecutive, get the same rows) | as DP_COMPUTE, from each group's first rank |

DP_COMPUTE pads a Batch whose size is not divisible by the world size (rows repeated from its
start, see `Batch.pad_to_multiple`) and drops the padding from the concatenated result, so
the caller gets exactly its rows back, in order (k per input row when a method returns k
samples per row). TRAIN_DP is for trainer-side members under sequence parallelism (sp ranks
split each sequence, hybrid.workers.sequence_parallel); with sp = 1 it is DP_COMPUTE.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from hybrid.data.batch import Batch

Fn = TypeVar("Fn", bound=Callable[..., Any])
RankArgs = tuple[tuple[Any, ...], dict[str, Any]]

# The attribute `register` sets on a method; read back only by `registered_methods`.
_SPEC_ATTR = "_hybrid_method_spec"


class Dispatch(Enum):
    ONE_TO_ALL = "one_to_all"
    ALL_TO_ALL = "all_to_all"
    RANK_ZERO = "rank_zero"
    DP_COMPUTE = "dp_compute"
    TRAIN_DP = "train_dp"


@dataclass(frozen=True)
class MethodSpec:
    dispatch_mode: Dispatch
    """How arguments are split across ranks and results gathered."""
    blocking: bool
    """True: the group call waits and returns the result; False: it returns a GroupFuture."""


@dataclass(frozen=True)
class CallPlan:
    per_rank: list[RankArgs]
    """The (args, kwargs) each rank receives, in rank order."""
    collect: Callable[[list[Any]], Any]
    """Folds the per-rank results (rank order) into what the driver gets."""


def register(
    dispatch_mode: Dispatch = Dispatch.ONE_TO_ALL, blocking: bool = True
) -> Callable[[Fn], Fn]:
    """Mark a Worker method as callable through worker groups and their views."""
    if not isinstance(dispatch_mode, Dispatch):
        raise TypeError(f"dispatch_mode must be a Dispatch, got {dispatch_mode!r}")

    def mark(fn: Fn) -> Fn:
        setattr(fn, _SPEC_ATTR, MethodSpec(dispatch_mode=dispatch_mode, blocking=blocking))
        return fn

    return mark


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    """Every `@register`-ed method of `cls` (including inherited ones), by name."""
    found: dict[str, MethodSpec] = {}
    for name in dir(cls):
        spec = getattr(getattr(cls, name, None), _SPEC_ATTR, None)
        if isinstance(spec, MethodSpec):
            found[name] = spec
    return found


def plan_call(
    mode: Dispatch,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    world_size: int,
    sp_size: int = 1,
) -> CallPlan:
    """Split one driver call into per-rank calls according to `mode` (`sp_size`: the
    trainer's sequence-parallel groups, consecutive ranks, for TRAIN_DP)."""
    if mode is Dispatch.ONE_TO_ALL:
        return CallPlan([(tuple(args), dict(kwargs))] * world_size, list)
    if mode is Dispatch.RANK_ZERO:
        return CallPlan([(tuple(args), dict(kwargs))] * world_size, _first)
    if mode is Dispatch.ALL_TO_ALL:
        return CallPlan(_split_per_rank(args, kwargs, world_size), list)
    if mode is Dispatch.DP_COMPUTE:
        return _plan_dp_compute(args, kwargs, world_size)
    if mode is Dispatch.TRAIN_DP:
        return _plan_train_dp(args, kwargs, world_size, sp_size)
    raise AssertionError(f"unhandled dispatch mode {mode}")


def _first(results: list[Any]) -> Any:
    return results[0]


def _split_per_rank(args: Sequence[Any], kwargs: dict[str, Any], world_size: int) -> list[RankArgs]:
    named = [(f"positional argument {i}", a) for i, a in enumerate(args)]
    named += [(f"argument {k!r}", v) for k, v in kwargs.items()]
    for label, value in named:
        if not isinstance(value, list | tuple) or len(value) != world_size:
            got = (
                f"{type(value).__name__} of length {len(value)}"
                if isinstance(value, list | tuple)
                else type(value).__name__
            )
            raise ValueError(
                f"ALL_TO_ALL needs every argument to be a list with one entry per worker "
                f"({world_size}); {label} is a {got}"
            )
    return [
        (tuple(a[rank] for a in args), {k: v[rank] for k, v in kwargs.items()})
        for rank in range(world_size)
    ]


def _plan_dp_compute(args: Sequence[Any], kwargs: dict[str, Any], world_size: int) -> CallPlan:
    batch_sizes = {len(v) for v in [*args, *kwargs.values()] if isinstance(v, Batch)}
    if not batch_sizes:
        raise TypeError("DP_COMPUTE needs at least one Batch argument to split")
    if len(batch_sizes) > 1:
        raise ValueError(f"DP_COMPUTE Batch arguments differ in size: {sorted(batch_sizes)}")
    (input_rows,) = batch_sizes
    num_pad = 0

    def split(value: Any) -> list[Any]:
        nonlocal num_pad
        if not isinstance(value, Batch):
            return [value] * world_size
        padded, num_pad = value.pad_to_multiple(world_size)
        return padded.chunk(world_size)

    split_args = [split(a) for a in args]
    split_kwargs = {k: split(v) for k, v in kwargs.items()}
    per_rank = [
        (tuple(a[rank] for a in split_args), {k: v[rank] for k, v in split_kwargs.items()})
        for rank in range(world_size)
    ]

    def collect(results: list[Any]) -> Any:
        if all(isinstance(r, Batch) for r in results):
            merged = Batch.concat(results)
            # A method may return k rows per input row (k samples per prompt): drop k per pad.
            padded_rows = input_rows + num_pad
            rows_per_input, remainder = divmod(len(merged), max(padded_rows, 1))
            if remainder:
                raise ValueError(
                    f"DP_COMPUTE results have {len(merged)} rows for {padded_rows} input rows: "
                    "a method must return a whole number of rows per input row"
                )
            return merged.unpad(num_pad * rows_per_input)
        if not any(isinstance(r, Batch) for r in results):
            return results  # e.g. per-rank metrics dicts
        raise TypeError(
            "a DP_COMPUTE method must return a Batch on every rank or on none, got "
            f"{[type(r).__name__ for r in results]}"
        )

    return CallPlan(per_rank, collect)


def _plan_train_dp(
    args: Sequence[Any], kwargs: dict[str, Any], world_size: int, sp_size: int
) -> CallPlan:
    if sp_size < 1 or world_size % sp_size:
        raise ValueError(f"sp size {sp_size} does not divide the group's {world_size} workers")
    groups = _plan_dp_compute(args, kwargs, world_size // sp_size)
    per_rank = [groups.per_rank[rank // sp_size] for rank in range(world_size)]
    return CallPlan(per_rank, lambda results: groups.collect(results[::sp_size]))
