"""The Offloader on CPU: moves report whether anything moved, and a phase whose moves moved
nothing reuses the previous ledger breakdown (the boundary is then a measurement, not a walk
over every tensor)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from hybrid.memory.components import ByDevice, parameter_bytes
from hybrid.memory.ledger import MemoryLedger
from hybrid.sharding.offload import Offloader, offload_params, onload_params

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_a_move_to_where_the_tensors_are_moves_nothing() -> None:
    model = torch.nn.Linear(4, 4)
    assert offload_params(model, CPU) is False
    assert onload_params(model, CPU) is False
    meta = torch.device("meta")  # the one other device a CPU-only host has
    assert onload_params(model, meta) is True
    assert all(p.device == meta for p in model.parameters())
    assert onload_params(model, meta) is False


def test_a_phase_that_moved_nothing_reuses_the_previous_breakdown() -> None:
    model = torch.nn.Linear(64, 64)
    calls = Counter[str]()

    def source() -> dict[str, ByDevice]:
        calls["walks"] += 1
        return {"actor_params": parameter_bytes(model)}

    ledger = MemoryLedger()
    ledger.track("actor", source)
    ledger.record("before")
    offloader = Offloader(model, None, CPU, param_offload=True, optimizer_offload=False)
    with offloader.phase("update", ledger):
        pass
    assert calls["walks"] == 1  # onload and offload moved nothing: no new walk
    onload, offload = ledger.records[-2:]
    assert [onload.phase, offload.phase] == ["update/onload", "update/offload"]
    # The sources' part is copied (`runtime` may still grow: a phase's first-use growth).
    params = [r.components_gib["actor_params"] for r in (ledger.records[0], onload, offload)]
    assert params[0] > 0 and params == [params[0]] * 3
    ledger.record("after")  # a boundary without reuse asks the sources again
    assert calls["walks"] == 2
