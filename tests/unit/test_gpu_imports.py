"""The GPU machine has torch and transformers but no Ray, vLLM, Hydra or flash-attn
(tests/gpu/README.md): every module under tests/gpu must import there. Checked here in a fresh
interpreter where importing any of those packages raises, as it would on that machine; the
first GPU lease found `hybrid.transport` importing Ray at module level this way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
ABSENT_ON_GPU_MACHINE = ("ray", "vllm", "hydra", "omegaconf", "flash_attn")

# A None in sys.modules makes `import name` raise ModuleNotFoundError and
# `importlib.util.find_spec(name)` answer None, as for a package that is not installed.
PROBE = """
import importlib, sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
sys.path[:0] = [sys.argv[2], sys.argv[2] + "/tests/gpu"]
for module in sys.argv[3:]:
    importlib.import_module(module)
"""


def gpu_modules() -> list[str]:
    return sorted(
        f"tests.gpu.{path.stem}"
        for path in (ROOT / "tests" / "gpu").glob("*.py")
        if path.stem != "__init__"
    )


def test_every_gpu_module_imports_without_the_packages_the_gpu_machine_lacks() -> None:
    modules = gpu_modules()
    assert "tests.gpu.smoke_fsdp" in modules and "tests.gpu.test_nccl_transport" in modules
    result = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(ABSENT_ON_GPU_MACHINE), str(ROOT), *modules],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
