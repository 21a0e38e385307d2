"""A memory plan for people and for scripts: the phase table, the steady states, the KV
cache, the CUDA reserve, each node's host RAM and the verdict as text (`format_plan`,
`format_suggestions`, `format_longest`), or all of it as JSON."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hybrid.memory.records import COMPONENTS, STEADY_PHASES
from hybrid.planner.longest import LongestFit
from hybrid.planner.plan import PhasePrediction, Plan
from hybrid.planner.reserve import RESERVE_UNCERTAINTY
from hybrid.planner.suggest import CHANGE_ORDER, Suggestion


def _unit(plan: Plan) -> tuple[str, float]:
    """GiB, or MiB for a plan whose peak is below 1 GiB (the tiny CPU models)."""
    return ("GiB", 1.0) if plan.peak_gib >= 1 else ("MiB", 1024.0)


def _top(phase: PhasePrediction, scale: float, count: int = 3) -> str:
    parts = {**phase.components_gib, **{f"{k}*": v for k, v in phase.transient_gib.items()}}
    biggest = sorted(parts.items(), key=lambda item: -item[1])[:count]
    return ", ".join(f"{name} {gib * scale:.2f}" for name, gib in biggest)


def format_plan(plan: Plan) -> str:
    """A readable report: the per-phase table, both steady states, the KV cache, the verdict."""
    unit, scale = _unit(plan)
    reserve = f"a {plan.reserve_gib:.2f} GiB reserve" if plan.reserve_gib else "no reserve on CPU"
    lora = f", LoRA rank {plan.lora_rank}" if plan.lora_rank else ""
    teacher = f", distilling from {plan.teacher}" if plan.teacher else ""
    device = f"cuda ({plan.gpu})" if plan.device == "cuda" else plan.device
    width = max(24, *(len(name) + 1 for name in plan.phases))
    lines = [
        f"Memory plan: {plan.model}{_parameters(plan)} on {device}{lora}{teacher}, "
        f"{plan.gpu_memory_gib:g} GiB per "
        f"worker (budget {plan.budget_gib:.2f} GiB after {reserve})",
        "",
        f"{'phase':<{width}}{'peak ' + unit:>9}  biggest contributors ({unit}; * = transient)",
    ]
    for name, phase in plan.phases.items():
        flag = "  <-- peak" if name == plan.peak_phase else ""
        lines.append(f"{name:<{width}}{phase.peak_gib * scale:>9.2f}  {_top(phase, scale)}{flag}")
    modes = {mode: plan.phases[STEADY_PHASES[mode]].components_gib for mode in plan.steady_gib}
    lines += ["", f"{'component (' + unit + ')':<24}{'trainer':>9}{'rollout':>9}"]
    for name in COMPONENTS:
        if any(name in held for held in modes.values()):
            row = "".join(f"{held.get(name, 0.0) * scale:>9.2f}" for held in modes.values())
            lines.append(f"{name:<24}{row}")
    total = "".join(f"{gib * scale:>9.2f}" for gib in plan.steady_gib.values())
    lines += [
        f"{'total (steady state)':<24}{total}",
        "",
        f"KV cache: {plan.kv_cache_gib:.2f} GiB = {plan.kv_tokens:,} tokens "
        f"({plan.kv_bytes_per_token:,} bytes per token); one rollout needs "
        f"{plan.kv_tokens_needed:,} tokens per engine",
        *_reserve_lines(plan),
        *_host_lines(plan),
        *(f"note: {note}" for note in plan.notes),
        "",
        f"{'FITS' if plan.fits else 'DOES NOT FIT'}: peak {plan.peak_gib:.2f} GiB at "
        f"{plan.peak_phase}, budget {plan.budget_gib:.2f} GiB, margin {plan.margin_gib:+.2f} GiB",
        *(f"  - {problem}" for problem in plan.problems),
        *(f"warning: {warning}" for warning in plan.warnings),
    ]
    return "\n".join(lines)


def _reserve_lines(plan: Plan) -> list[str]:
    """The reserve's parts, one communicator a line, and its uncertainty (CUDA only)."""
    r = plan.reserve
    if not r.total_gib:
        return []
    nvls = "assumed" if r.nvls else "not assumed"
    lines = [
        "",
        f"Reserve: {r.total_gib:.2f} GiB per worker = CUDA context {r.context_gib:.2f} + "
        f"{len(r.communicators)} NCCL communicators {r.communicators_gib:.2f} + fragmentation "
        f"{r.fragmentation_gib:.2f} (NVLS {nvls})",
    ]
    for c in r.communicators:
        kind = "NVLS" if c.nvls else "ring/tree"
        where = f"{c.ranks} ranks, {c.local_ranks} on the node"
        lines.append(f"  {c.name:<16}{c.gib:>6.2f}  ({where}, {kind})")
    share = f"{RESERVE_UNCERTAINTY:.0%} of the reserve"
    why = f"what NVLS adds + {share} without it" if r.nvls else share
    lines.append(
        f"  uncertainty {r.uncertainty_gib:.2f} GiB ({why}; estimates to calibrate on a GPU)"
    )
    return lines


def _host_lines(plan: Plan) -> list[str]:
    """Host RAM per node: the steady parts, rank 0's node's moments, the verdict."""
    lines = ["", f"Host RAM per node (GiB): {plan.host_steady_gib:.2f} in steady state"]
    lines += [f"  {name:<24}{gib:>8.2f}" for name, gib in plan.host_gib.items()]
    lines.append(
        f"  rank 0's node: + {plan.host_startup_gib:.2f} at startup (the full state dict), "
        f"+ {plan.host_export_gib:.2f} at the final export -> peak {plan.host_peak_gib:.2f}"
    )
    if plan.host_memory_gib is not None:
        verdict = "fits" if plan.host_fits else "DOES NOT FIT"
        spare = plan.host_memory_gib - plan.host_peak_gib
        lines.append(
            f"  host memory {plan.host_memory_gib:g} GiB per node: {verdict} "
            f"(margin {spare:+.2f} GiB)"
        )
    return lines


def format_suggestions(plan: Plan, suggestions: list[Suggestion]) -> str:
    """The proposals for `plan`'s config, as Hydra overrides with their predicted peak."""
    if plan.fits:
        return "Suggestions: none needed, the config fits."
    if plan.host_fits is False:
        return (
            "Suggestions: none here for host RAM (every change this searches keeps or raises "
            "it): turn offloads off (actor.offload.param_offload, "
            "actor.offload.optimizer_offload, ref.offload.param_offload, "
            "distill.offload.param_offload), or use nodes with more RAM."
        )
    if not suggestions:
        return (
            f"Suggestions: nothing fits. No combination of {', '.join(CHANGE_ORDER)} brings "
            f"every phase under {plan.budget_gib:.2f} GiB: use more or larger GPUs, a smaller "
            "model, or LoRA."
        )
    lines = ["Suggestions (fewest changes first, then cheapest):"]
    for i, s in enumerate(suggestions, 1):
        lines.append(f"  {i}. {' '.join(s.overrides)}")
        lines.append(
            f"     -> peak {s.plan.peak_gib:.2f} GiB at {s.plan.peak_phase} "
            f"(margin {s.plan.margin_gib:+.2f} GiB)"
        )
    return "\n".join(lines)


def format_longest(fits: list[LongestFit], config_sp: int) -> str:
    """The longest fitting response at each sp, a line each (and the overrides for it)."""
    if not fits:
        return "Longest response: nothing searched."
    first = fits[0]
    lines = [
        f"Longest response that fits (memory only; prompt {first.prompt_length:,} tokens, "
        f"responses in steps of {first.step:,}, token budgets >= prompt + response per sp "
        "group):"
    ]
    for fit in fits:
        mine = "  <-- the config's" if fit.sp == config_sp else ""
        head = f"  actor.sp_size={fit.sp}: "
        if fit.error is not None:
            lines.append(f"{head}not valid for this config ({fit.error}){mine}")
            continue
        if fit.plan is None:
            why = f": {fit.limited_by[0]}" if fit.limited_by else ""
            lines.append(f"{head}none, not even {fit.step:,} tokens{why}{mine}")
            continue
        longer = f"; longer: {fit.limited_by[0]}" if fit.limited_by else ""
        lines.append(
            f"{head}{'at least ' if fit.at_limit else ''}{fit.response_length:,} tokens, "
            f"{fit.clear_response_length:,} with a margin >= the reserve's uncertainty{mine}"
        )
        lines.append(
            f"    (peak {fit.plan.peak_gib:.2f} GiB at {fit.plan.peak_phase}, margin "
            f"{fit.plan.margin_gib:+.2f} GiB{longer})"
        )
        lines.append(f"    {' '.join(fit.overrides)}")
    return "\n".join(lines)


def _parameters(plan: Plan) -> str:
    """ " (30.53B parameters, 3.34B active)" for a mixture of experts; "" for a dense model."""
    if not plan.parameters or plan.active_parameters == plan.parameters:
        return ""
    return f" ({plan.parameters / 1e9:.2f}B parameters, {plan.active_parameters / 1e9:.2f}B active)"


def to_json(
    plan: Plan,
    suggestions: list[Suggestion] | None = None,
    longest: list[LongestFit] | None = None,
) -> str:
    """The plan (and suggestions, the longest responses) as JSON: every Plan field plus
    margin_gib."""
    data: dict[str, Any] = {"plan": {**dataclasses.asdict(plan), "margin_gib": plan.margin_gib}}
    if longest is not None:
        data["longest"] = [
            {
                "sp": fit.sp,
                "prompt_length": fit.prompt_length,
                "response_length": fit.response_length,
                "at_limit": fit.at_limit,
                "clear_response_length": fit.clear_response_length,
                "peak_gib": None if fit.plan is None else fit.plan.peak_gib,
                "peak_phase": None if fit.plan is None else fit.plan.peak_phase,
                "margin_gib": None if fit.plan is None else fit.plan.margin_gib,
                "overrides": list(fit.overrides),
                "limited_by": list(fit.limited_by),
                "error": fit.error,
            }
            for fit in longest
        ]
    if suggestions is not None:
        data["suggestions"] = [
            {
                "overrides": list(s.overrides),
                "peak_gib": s.plan.peak_gib,
                "peak_phase": s.plan.peak_phase,
                "margin_gib": s.plan.margin_gib,
            }
            for s in suggestions
        ]
    return json.dumps(data, indent=2)
