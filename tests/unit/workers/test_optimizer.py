"""build_optimizer: the foreach AdamW it builds on every device computes what torch's
per-parameter loop (its CPU default) computes, bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch

from hybrid.workers.fsdp import build_optimizer

pytestmark = pytest.mark.unit


def test_foreach_adamw_equals_the_per_parameter_loop() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    twin, initial = copy.deepcopy(model), copy.deepcopy(model)
    ours = build_optimizer(model, 1e-3, 0.01, (0.9, 0.95), 1e-8)
    loop = torch.optim.AdamW(
        twin.parameters(), lr=1e-3, weight_decay=0.01, betas=(0.9, 0.95), eps=1e-8, foreach=False
    )
    assert ours.defaults["foreach"] is True
    for step in range(5):
        inputs = torch.randn(8, 16, generator=torch.Generator().manual_seed(step))
        for net, optimizer in ((model, ours), (twin, loop)):
            net(inputs).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    for mine, theirs, start in zip(
        model.parameters(), twin.parameters(), initial.parameters(), strict=True
    ):
        assert not torch.equal(mine, start)  # the steps moved every tensor
        assert torch.equal(mine, theirs)
