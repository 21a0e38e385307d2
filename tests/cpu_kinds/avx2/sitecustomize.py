"""Run this interpreter as an AVX2-only x86 CPU would (`make test-as-avx2`).

Python imports `sitecustomize` at start-up from PYTHONPATH, so every process of a run takes
this: pytest's workers, the Ray workers (they inherit the environment), the children tests
start. Once `torch.cpu` is imported, its probes for AVX-512, AVX-512 bf16 and AMX answer
False, and asking for AMX tiles does nothing. vLLM asks those probes: it then loads its AVX2
kernels (`vllm._C_AVX2`) and keeps linear weights plain, and `auto` dtypes resolve to fp32, as
on such a CPU. The kernels of torch, oneDNN and MKL are capped at AVX2 by the environment the
Make target sets (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS).

What it cannot change: the cores' speed and caches. Wall times measured this way are this
machine's, not an AVX2 machine's.
"""

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType

EMULATED_CPU_ENV = "HYBRID_EMULATED_CPU"
_ABSENT = (
    "_is_avx512_supported",
    "_is_avx512_vnni_supported",
    "_is_avx512_bf16_supported",
    "_is_amx_tile_supported",
    "_is_amx_fp16_supported",
)


def _as_avx2(module: ModuleType) -> None:
    for probe in _ABSENT:
        if hasattr(module, probe):
            setattr(module, probe, lambda: False)
    module._init_amx = lambda: False  # type: ignore[attr-defined]


class _TorchCpuAsAvx2(importlib.abc.MetaPathFinder):
    """Finds `torch.cpu` as the path finder would, and patches it right after it runs."""

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != "torch.cpu":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _as_avx2(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


os.environ.setdefault(EMULATED_CPU_ENV, "avx2")
sys.meta_path.insert(0, _TorchCpuAsAvx2())
