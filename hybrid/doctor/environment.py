"""Environment variables that decide how NCCL, the CUDA allocator and vLLM behave.

PYTORCH_CUDA_ALLOC_CONF (or torch's newer PYTORCH_ALLOC_CONF) with expandable_segments:True
conflicts with vLLM's sleep-mode memory pool (pytorch#147851): vLLM 0.32 turns it off around
the pool, older releases assert at engine start. On several nodes the NCCL_* variables must be
in the environment of every node's `ray start`: Ray's workers inherit the raylet's
environment, not the driver's shell.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybrid.doctor.facts import HostFacts
from hybrid.doctor.verdict import Check

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

SECTION = "environment"
ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def expandable_segments(conf: str) -> bool:
    """Whether an allocator config string turns expandable segments on."""
    for option in conf.replace(" ", "").split(","):
        key, _, value = option.partition(":")
        if key == "expandable_segments" and value.lower() == "true":
            return True
    return False


def environment_checks(config: TrainerRunConfig, facts: HostFacts, multi_node: bool) -> list[Check]:
    env, gpu = facts.env, config.trainer.use_gpu
    nccl = {name: value for name, value in env.items() if name.startswith("NCCL_")}
    shown = ", ".join(f"{k}={v}" for k, v in nccl.items()) or "none set"
    checks = [Check(SECTION, "ok", f"NCCL_*: {shown}")]
    if multi_node and gpu:
        checks.append(
            Check(
                SECTION,
                "warn",
                "several nodes: NCCL_* must be exported before `ray start` on every node",
                "Ray's workers inherit the raylet's environment, not this shell's",
                "export them (e.g. NCCL_SOCKET_IFNAME, NCCL_IB_HCA) on every node, then "
                "`ray start`",
            )
        )
    visible = env.get("CUDA_VISIBLE_DEVICES")
    checks.append(
        Check(
            SECTION,
            "ok",
            "CUDA_VISIBLE_DEVICES unset (Ray assigns one GPU per worker)"
            if visible is None
            else f"CUDA_VISIBLE_DEVICES={visible!r} (Ray picks the workers' GPUs among these)",
        )
    )
    for name in ALLOC_VARS:
        if name not in env:
            continue
        if expandable_segments(env[name]) and gpu:
            checks.append(
                Check(
                    SECTION,
                    "warn",
                    f"{name}={env[name]}",
                    "expandable_segments:True conflicts with vLLM's sleep-mode memory pool "
                    "(pytorch#147851): vLLM 0.32 turns it off around the pool, older vLLM "
                    "refuses to start",
                    f"unset {name} (or drop expandable_segments) for hybrid runs",
                )
            )
        else:
            checks.append(Check(SECTION, "ok", f"{name}={env[name]}"))
    for name, hint in (
        ("HF_HUB_OFFLINE", "1 on nodes without network: nothing is downloaded"),
        ("VLLM_NO_USAGE_STATS", "1 on nodes without network: vLLM sends no usage report"),
    ):
        value = env.get(name)
        text = f"{name}={value}" if value is not None else f"{name} unset"
        checks.append(Check(SECTION, "ok", text, "" if value is not None else f"set it to {hint}"))
    return checks
