"""hybrid.torch_compat: the all-gather works on every torch the floor admits, and the shim
says when it is no longer needed."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from hybrid.torch_compat import ALL_GATHER_RENAMED_IN, all_gather_single, pick_all_gather_single

pytestmark = pytest.mark.unit

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _old(output: torch.Tensor, input: torch.Tensor, group: object = None) -> str:
    return "all_gather_into_tensor"


def _new(output: torch.Tensor, input: torch.Tensor, group: object = None) -> str:
    return "all_gather_single"


def test_a_torch_before_the_rename_gets_the_old_name() -> None:
    torch_2_11 = SimpleNamespace(all_gather_into_tensor=_old)  # what torch < 2.13 exposes
    assert pick_all_gather_single(torch_2_11) is _old


def test_a_torch_after_the_rename_gets_the_new_name() -> None:
    torch_2_13 = SimpleNamespace(all_gather_into_tensor=_old, all_gather_single=_new)
    assert pick_all_gather_single(torch_2_13) is _new


def test_the_installed_torch_gathers_through_the_shim() -> None:
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        out = torch.empty(4)
        all_gather_single(out, torch.arange(4.0))
        assert out.tolist() == [0.0, 1.0, 2.0, 3.0]
    finally:
        dist.destroy_process_group()


def test_the_shim_is_still_needed_by_the_torch_floor() -> None:
    """Fails once pyproject's torch floor reaches the rename: then delete the shim."""
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    spec = next(d for d in deps if re.match(r"torch\b", d))
    floor = re.search(r">=\s*(\d+)\.(\d+)", spec)
    assert floor is not None, f"no torch floor in {spec!r}"
    assert (int(floor[1]), int(floor[2])) < ALL_GATHER_RENAMED_IN, (
        f"the torch floor ({spec}) has all_gather_single: remove hybrid/torch_compat.py"
    )
