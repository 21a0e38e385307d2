"""Unit tests for `hybrid.dtypes`: what `auto` resolves to on every kind of hardware, and the
errors for dtype names that do not exist."""

import os
import platform
from pathlib import Path

import pytest
import torch

from hybrid.dtypes import (
    ComputeDtypes,
    Hardware,
    auto_dtype,
    cpu_bf16_flags,
    dtype_bytes,
    resolve_dtype,
    torch_dtype,
)

pytestmark = pytest.mark.unit

AMPERE = Hardware("cuda", native_bf16=True, description="CUDA 8.0")
VOLTA = Hardware("cuda", native_bf16=False, description="CUDA 7.0")
AVX512_BF16 = Hardware("cpu", native_bf16=True, description="CPU with avx512_bf16")
AVX2 = Hardware("cpu", native_bf16=False, description="CPU without bf16 instructions")


@pytest.mark.parametrize(
    ("hardware", "trainer", "engine"),
    [
        (AMPERE, "bfloat16", "bfloat16"),
        (VOLTA, "float32", "float16"),  # no bf16; fp16 training would need loss scaling
        (AVX512_BF16, "bfloat16", "bfloat16"),
        (AVX2, "float32", "float32"),  # bf16 is emulated there: 3.5x slower updates
    ],
)
def test_auto_picks_what_the_hardware_computes_natively(
    hardware: Hardware, trainer: str, engine: str
) -> None:
    assert auto_dtype("trainer", hardware) == trainer
    assert auto_dtype("engine", hardware) == engine
    assert ComputeDtypes.resolve("auto", "auto", "auto", hardware) == ComputeDtypes(
        trainer,
        trainer,
        engine,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("hardware", [AMPERE, VOLTA, AVX512_BF16, AVX2])
def test_an_explicit_dtype_is_kept_on_any_hardware(hardware: Hardware) -> None:
    assert ComputeDtypes.resolve("float32", "bfloat16", "float16", hardware) == ComputeDtypes(
        "float32", "bfloat16", "float16"
    )


def test_unknown_names_are_refused_listing_the_choices() -> None:
    with pytest.raises(ValueError, match=r"auto.*bfloat16.*float16.*float32.*'float8'"):
        resolve_dtype("float8", "engine", AVX2)
    with pytest.raises(ValueError, match=r"resolve 'auto' first"):
        torch_dtype("auto")


def test_torch_dtypes_and_sizes() -> None:
    assert [torch_dtype(n) for n in ("bfloat16", "float16", "float32")] == [
        torch.bfloat16,
        torch.float16,
        torch.float32,
    ]
    assert [dtype_bytes(n) for n in ("bfloat16", "float16", "float32")] == [2, 2, 4]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="reads x86 flags from /proc/cpuinfo")
def test_this_cpu_is_detected_as_its_cpuinfo_flags_say() -> None:
    detected = Hardware.detect(torch.device("cpu"))
    words = set(Path("/proc/cpuinfo").read_text().split())
    if os.environ.get("HYBRID_EMULATED_CPU") == "avx2":  # `make test-as-avx2`: torch says none
        words -= {"avx512_bf16", "amx_bf16"}
    print(f"this CPU: {detected.description}; auto: {auto_dtype('trainer', detected)}")
    assert detected.native_bf16 == bool(words & {"avx512_bf16", "amx_bf16"})
    assert detected.native_bf16 == bool(cpu_bf16_flags())


def test_a_narrow_model_trains_in_fp32_on_a_bf16_cpu() -> None:
    """The tiny demo model (hidden 128) updates faster in fp32 on a CPU with bf16 instructions;
    from CPU_BF16_MIN_HIDDEN up bf16 wins. The engine follows (its generation is as fast
    either way, and the actor and the engine then score alike); GPUs and CPUs without bf16 are
    unaffected."""
    from hybrid.dtypes import CPU_BF16_MIN_HIDDEN

    narrow, wide = CPU_BF16_MIN_HIDDEN // 2, CPU_BF16_MIN_HIDDEN
    assert ComputeDtypes.resolve("auto", "auto", "auto", AVX512_BF16, narrow) == ComputeDtypes(
        "float32", "float32", "float32"
    )
    assert ComputeDtypes.resolve("auto", "auto", "auto", AVX512_BF16, wide) == ComputeDtypes(
        "bfloat16", "bfloat16", "bfloat16"
    )
    assert auto_dtype("trainer", AVX512_BF16) == "bfloat16"  # size unknown: taken as wide
    assert auto_dtype("trainer", AMPERE, narrow) == "bfloat16"
    assert auto_dtype("trainer", AVX2, wide) == "float32"
    assert resolve_dtype("bfloat16", "trainer", AVX512_BF16, narrow) == "bfloat16"  # asked for
