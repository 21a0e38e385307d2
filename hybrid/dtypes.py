"""Compute dtypes that fit the hardware: what `auto` means for the actor, the reference and
the rollout engine.

bf16 is fast only where the device computes it natively: CUDA compute capability >= 8.0, x86
CPUs with AVX512-BF16 or AMX, Arm CPUs with the BF16 extension. Elsewhere it is emulated (an
AVX2-only CPU ran the tiny demo's update 3.5x slower in bf16 than in fp32) or missing (V100 and
T4 have no bf16 at all). So `auto` resolves, per role:

    hardware                      trainer (actor, ref)   engine (rollout)
    native bf16 (GPU or CPU)      bfloat16               bfloat16
    CPU with bf16, narrow model   float32                float32
    CUDA without bf16             float32                float16
    CPU without bf16              float32                float32

A narrow model is one of hidden size below CPU_BF16_MIN_HIDDEN: there a CPU's bf16 update
costs more than its fp32 one, the casts around FSDP2's gathers and oneDNN's weight reorders
outweighing matmuls of a few thousand FLOPs per token (measured on an AVX512-BF16 CPU,
2026-12-03: the tiny demo model, hidden 128, stepped 1.26x slower and updated 1.36x slower in
bf16 than in fp32, `profiling/bench_step.py --dtypes`; at hidden 256 and up the bf16 update
took 0.59x (256), 0.52x (384), 0.46x (512) of the fp32 one on GSM8K-length rows, and the
~100M model, hidden 768, stepped at 0.47x). The narrow model's generation is as fast in either
(bf16 1.04x the fp32 time), so its engine computes in fp32 too: the actor and the engine then
score tokens alike, where an fp32 actor beside a bf16 engine differed by up to 0.06 nats.

The trainer never picks fp16 by itself: fp16 training needs loss scaling, which the actor's
mixed-precision policy does not do. `Hardware.detect` reads the device once; the resolution is
a pure function of it.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import torch

Dtype = Literal["bfloat16", "float16", "float32"]
DTYPES: tuple[str, ...] = get_args(Dtype)
DtypeChoice = Literal["auto", "bfloat16", "float16", "float32"]
DTYPE_CHOICES: tuple[str, ...] = get_args(DtypeChoice)
Role = Literal["trainer", "engine"]

_TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a resolved dtype name ("auto" must be resolved first)."""
    if name not in _TORCH:
        raise ValueError(f"dtype must be one of {DTYPES} (resolve 'auto' first), got {name!r}")
    return _TORCH[name]


def dtype_bytes(name: str) -> int:
    return torch_dtype(name).itemsize


@dataclass(frozen=True)
class Hardware:
    """What decides the dtypes: the device kind and whether it computes bf16 natively."""

    device_type: Literal["cpu", "cuda"]
    native_bf16: bool
    description: str
    """For the start-up summary, e.g. "CUDA 9.0 NVIDIA H100" or "CPU with avx512_bf16"."""

    @classmethod
    def detect(cls, device: torch.device) -> Hardware:
        if device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(device)
            name = torch.cuda.get_device_name(device)
            return cls("cuda", major >= 8, f"CUDA {major}.{minor} {name}")
        flags = cpu_bf16_flags()
        described = f"CPU with {', '.join(flags)}" if flags else "CPU without bf16 instructions"
        return cls("cpu", bool(flags), described)


def cpu_bf16_flags() -> list[str]:
    """This CPU's bf16 compute instructions, by /proc/cpuinfo name (empty: none)."""
    if platform.machine().lower() in ("x86_64", "amd64"):
        # torch's own probes (what vLLM's CPU backend asks as well); private but stable.
        found = []
        if torch.cpu._is_avx512_bf16_supported():
            found.append("avx512_bf16")
        if torch.cpu._is_amx_tile_supported():
            found.append("amx")
        return found
    cpuinfo = Path("/proc/cpuinfo")
    words = set(cpuinfo.read_text().split()) if cpuinfo.exists() else set()
    return ["bf16"] if "bf16" in words else []  # Arm: the BF16 extension


CPU_BF16_MIN_HIDDEN = 256
"""On a CPU with bf16 instructions `auto` is bf16 from this hidden size up, fp32 below."""


def auto_dtype(role: Role, hardware: Hardware, hidden_size: int | None = None) -> Dtype:
    """What `auto` means for `role` on `hardware` for a model of `hidden_size` (None: not
    known, taken as wide; the table in the module docstring)."""
    narrow = hidden_size is not None and hidden_size < CPU_BF16_MIN_HIDDEN
    if hardware.native_bf16 and not (narrow and hardware.device_type == "cpu"):
        return "bfloat16"
    if role == "engine" and hardware.device_type == "cuda":
        return "float16"
    return "float32"


def resolve_dtype(
    requested: str, role: Role, hardware: Hardware, hidden_size: int | None = None
) -> Dtype:
    if requested == "auto":
        return auto_dtype(role, hardware, hidden_size)
    if requested not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPE_CHOICES}, got {requested!r}")
    return requested  # type: ignore[return-value]


@dataclass(frozen=True)
class ComputeDtypes:
    """The resolved dtypes of one worker's members."""

    actor: Dtype
    """The actor's compute dtype (FSDP2 param_dtype; the frozen LoRA base is stored in it)."""
    ref: Dtype
    """The reference policy's weights and compute."""
    rollout: Dtype
    """The engine's weights and compute; the sync casts to it."""

    @classmethod
    def resolve(
        cls,
        actor: str,
        ref: str,
        rollout: str,
        hardware: Hardware,
        hidden_size: int | None = None,
    ) -> ComputeDtypes:
        """The three dtypes for a model of `hidden_size` on `hardware`."""
        return cls(
            actor=resolve_dtype(actor, "trainer", hardware, hidden_size),
            ref=resolve_dtype(ref, "trainer", hardware, hidden_size),
            rollout=resolve_dtype(rollout, "engine", hardware, hidden_size),
        )
