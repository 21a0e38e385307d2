"""The doctor's report as text (a block of checks, each `ok` / `warn` / `FAIL` with its
reason and fix) and as the one JSON line that ends the output."""

from __future__ import annotations

import json
from typing import Any

from hybrid.doctor.facts import HostFacts
from hybrid.doctor.verdict import Report

SECTIONS = ("versions", "gpus", "environment", "attention", "rollout", "memory", "inputs")


def format_text(report: Report, header: str = "") -> str:
    lines = [f"hybrid doctor: {header or report.config} (device {report.device})", ""]
    for section in SECTIONS:
        checks = [c for c in report.checks if c.section == section]
        if not checks:
            continue
        lines.append(section)
        for check in checks:
            text = f"{check.what}: {check.reason}" if check.reason else check.what
            lines.append(f"  {check.level:<4}  {text}")
            if check.fix:
                lines.append(f"        fix: {check.fix}")
        lines.append("")
    if report.can_run:
        lines.append(f"verdict: {report.config} can run here ({len(report.warnings)} warnings)")
    else:
        lines.append(f"verdict: {report.config} cannot run here: {len(report.missing)} FAIL above")
    return "\n".join(lines)


def to_json(report: Report, facts: HostFacts) -> str:
    """One line: can_run, config, device, missing, warnings, versions, gpus, ray, plan."""
    plan = report.plan
    data: dict[str, Any] = {
        "can_run": report.can_run,
        "config": report.config,
        "device": report.device,
        "missing": report.missing,
        "warnings": report.warnings,
        "versions": dict(report.versions),
        "gpus": {
            "visible": len(facts.gpus),
            "names": [g.name for g in facts.gpus],
            "memory_gib": [round(g.memory_gib, 2) for g in facts.gpus],
            "nvidia_smi": facts.smi_gpus,
        },
        "ray": None
        if facts.ray is None
        else {
            "address": facts.ray.address,
            "used_by_run": facts.ray.used_by_run,
            "gpus_per_node": [n.gpus for n in facts.ray.nodes],
        },
        "plan": None
        if plan is None
        else {
            "fits": plan.fits,
            "peak_gib": round(plan.peak_gib, 2),
            "margin_gib": round(plan.margin_gib, 2),
            "peak_phase": plan.peak_phase,
            "memory_gib": round(plan.memory_gib, 2),
            "memory_source": plan.memory_source,
            "model": plan.model,
            "parameters": plan.parameters,
            "active_parameters": plan.active_parameters,
        },
    }
    return json.dumps(data)
