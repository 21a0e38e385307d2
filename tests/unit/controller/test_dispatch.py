"""Dispatch planning and the rank environment: pure functions, no Ray."""

from __future__ import annotations

import pytest
import torch

from hybrid.controller import Dispatch, RankEnv, Worker, register
from hybrid.controller.dispatch import plan_call, registered_methods
from hybrid.data import Batch

pytestmark = pytest.mark.unit


class _Member(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def compute(self, batch: Batch) -> Batch:
        return batch

    @register(dispatch_mode=Dispatch.RANK_ZERO, blocking=False)
    def save(self) -> None:
        return None

    def helper(self) -> None:
        return None


class _Child(_Member):
    @register()
    def extra(self) -> None:
        return None


def test_registered_methods_include_inherited_and_skip_plain_ones() -> None:
    methods = registered_methods(_Child)
    assert set(methods) == {"compute", "save", "extra"}
    assert methods["save"].dispatch_mode is Dispatch.RANK_ZERO and not methods["save"].blocking
    assert methods["extra"].dispatch_mode is Dispatch.ONE_TO_ALL and methods["extra"].blocking


def test_register_rejects_a_non_dispatch_mode() -> None:
    with pytest.raises(TypeError, match="Dispatch"):
        register(dispatch_mode="dp_compute")  # type: ignore[arg-type]


def test_one_to_all_and_rank_zero_send_the_same_arguments() -> None:
    plan = plan_call(Dispatch.ONE_TO_ALL, (1,), {"k": 2}, world_size=3)
    assert plan.per_rank == [((1,), {"k": 2})] * 3
    assert plan.collect(["a", "b", "c"]) == ["a", "b", "c"]
    assert plan_call(Dispatch.RANK_ZERO, (), {}, world_size=2).collect(["zero", "one"]) == "zero"


def test_all_to_all_hands_out_one_element_per_rank() -> None:
    plan = plan_call(Dispatch.ALL_TO_ALL, ([1, 2],), {"tag": ["a", "b"]}, world_size=2)
    assert plan.per_rank == [((1,), {"tag": "a"}), ((2,), {"tag": "b"})]
    with pytest.raises(ValueError, match="argument 'tag' is a str"):
        plan_call(Dispatch.ALL_TO_ALL, (), {"tag": "ab"}, world_size=2)


def test_dp_compute_pads_splits_and_drops_the_padding() -> None:
    batch = Batch.from_dict({"x": torch.arange(5)})
    plan = plan_call(Dispatch.DP_COMPUTE, (batch,), {"scale": 3}, world_size=2)
    chunks = [args[0] for args, _ in plan.per_rank]
    assert [c["x"].tolist() for c in chunks] == [[0, 1, 2], [3, 4, 0]]  # one row of padding
    assert all(kwargs == {"scale": 3} for _, kwargs in plan.per_rank)
    out = plan.collect([Batch.from_dict({"y": c["x"] * 3}) for c in chunks])
    assert out["y"].tolist() == [0, 3, 6, 9, 12]
    assert plan.collect([{"loss": 1.0}, {"loss": 2.0}]) == [{"loss": 1.0}, {"loss": 2.0}]
    with pytest.raises(TypeError, match="on every rank or on none"):
        plan.collect([chunks[0], None])


def test_dp_compute_accepts_k_rows_per_input_row() -> None:
    batch = Batch.from_dict({"x": torch.arange(5)})
    plan = plan_call(Dispatch.DP_COMPUTE, (batch,), {}, world_size=2)
    chunks = [args[0] for args, _ in plan.per_rank]
    out = plan.collect([c.repeat(3) for c in chunks])  # 3 samples per prompt
    assert out["x"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    with pytest.raises(ValueError, match="whole number of rows per input row"):
        plan.collect([chunks[0], chunks[1][:2]])


def test_dp_compute_needs_a_batch_of_one_size() -> None:
    with pytest.raises(TypeError, match="at least one Batch"):
        plan_call(Dispatch.DP_COMPUTE, (1,), {}, world_size=2)
    a, b = Batch.from_dict({"x": torch.zeros(2)}), Batch.from_dict({"x": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"differ in size: \[2, 3\]"):
        plan_call(Dispatch.DP_COMPUTE, (a, b), {}, world_size=2)


def test_train_dp_sends_a_group_s_rows_to_its_sp_ranks_and_collects_once() -> None:
    """4 ranks in 2 sp groups of 2 (consecutive): ranks 0, 1 get rows [0, 1, 2], ranks 2, 3
    rows [3, 4, 0] (padded); the result is each group's first rank's, padding dropped."""
    batch = Batch.from_dict({"x": torch.arange(5)})
    plan = plan_call(Dispatch.TRAIN_DP, (batch,), {}, world_size=4, sp_size=2)
    chunks = [args[0]["x"].tolist() for args, _ in plan.per_rank]
    assert chunks == [[0, 1, 2], [0, 1, 2], [3, 4, 0], [3, 4, 0]]
    results = [
        Batch.from_dict({"y": args[0]["x"] * (10 + r)}) for r, (args, _) in enumerate(plan.per_rank)
    ]
    assert plan.collect(results)["y"].tolist() == [0, 10, 20, 36, 48]  # ranks 0 and 2
    assert plan.collect([{"m": r} for r in range(4)]) == [{"m": 0}, {"m": 2}]
    same = plan_call(Dispatch.TRAIN_DP, (batch,), {}, world_size=2)
    assert [a[0]["x"].tolist() for a, _ in same.per_rank] == [[0, 1, 2], [3, 4, 0]]
    with pytest.raises(ValueError, match="sp size 3 does not divide the group's 4 workers"):
        plan_call(Dispatch.TRAIN_DP, (batch,), {}, world_size=4, sp_size=3)


def test_rank_env_round_trips_through_the_environment() -> None:
    env = RankEnv(
        rank=1,
        world_size=2,
        local_rank=1,
        local_world_size=2,
        master_addr="10.0.0.1",
        master_port=29500,
    )
    assert RankEnv.from_environ(env.to_environ()) == env
    with pytest.raises(RuntimeError, match="MASTER_PORT"):
        RankEnv.from_environ({k: v for k, v in env.to_environ().items() if k != "MASTER_PORT"})
    with pytest.raises(ValueError, match="outside world_size"):
        RankEnv(
            rank=2, world_size=2, local_rank=0, local_world_size=1, master_addr="a", master_port=1
        )


def test_a_worker_reads_its_rank_before_init_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    env = RankEnv(
        rank=1, world_size=2, local_rank=1, local_world_size=2, master_addr="h", master_port=1
    )
    for name, value in env.to_environ().items():
        monkeypatch.setenv(name, value)

    class SeesRank(Worker):
        def __init__(self) -> None:
            self.rank_at_init = self.rank

    assert SeesRank().rank_at_init == 1
    monkeypatch.delenv("RANK")
    with pytest.raises(RuntimeError, match="RANK"):
        SeesRank()
