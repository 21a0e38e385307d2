"""Workarounds for the torch versions the project admits, each naming the version it targets.

torch 2.13 renamed `dist.all_gather_into_tensor` to `dist.all_gather_single` (the `_single`
collectives) and deprecated the old name; older torches, which the `torch` floor in
pyproject.toml still admits (GPU images ship e.g. 2.11), have only the old one. Both take
`(output, input, group=None, async_op=False)` and return a Work when `async_op` is set.
Delete this shim once the floor reaches 2.13 (tests/unit/test_torch_compat.py fails then).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch.distributed as dist

ALL_GATHER_RENAMED_IN = (2, 13)
"""The torch release that added `all_gather_single`."""


def pick_all_gather_single(distributed: ModuleType | Any) -> Callable[..., Any]:
    """`all_gather_single` of a torch.distributed namespace, or its pre-2.13 name."""
    new = getattr(distributed, "all_gather_single", None)
    return new if new is not None else distributed.all_gather_into_tensor


all_gather_single = pick_all_gather_single(dist)
"""All-gather equal tensors into one output tensor, on any admitted torch."""
