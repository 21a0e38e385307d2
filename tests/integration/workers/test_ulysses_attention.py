"""Ulysses attention on 2 (and, under `make test-full`, 4) gloo ranks equals varlen sdpa on the whole packed row, in the
output and in the gradients of q, k and v.

One spawn per world size (process start-up dominates); each rank runs every case: packed
rows whose sequences straddle the shard edges, a valid length that is not a multiple of sp
(padded at the end as its own sequence), MHA and GQA with kv heads fewer than, equal to and
a multiple of sp, and rows on both sides of varlen_attention's DENSE_MAX_TOKENS (its dense
block-mask branch and its per-sequence branch). Each rank computes the single-process
reference itself and returns the max abs differences of its slice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from hybrid.workers.ulysses import (
    check_head_rule,
    heads_to_seq,
    padded_length,
    seq_to_heads,
    ulysses_attention,
)
from hybrid.workers.varlen_attention import takes_dense_call, varlen_sdpa_attention
from tests.integration.workers.gloo_ranks import spawn_ranks

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ATOL = 1e-5
HEAD_DIM = 32
# Valid lengths: 25 and 1089 are odd, so padded for sp = 2 and 4; the sequence edges fall
# inside shards for both (shards of 13/7 and 545/273 tokens). The short sequences are short
# enough for the dense call on a CPU too (takes_dense_call), the long ones take one call each.
SHORT = (3, 5, 2, 7, 4, 1, 3)
LONG = (300, 411, 250, 128)
assert takes_dense_call(sum(SHORT), len(SHORT), torch.device("cpu"))
assert not takes_dense_call(sum(LONG), len(LONG), torch.device("cpu"))


# --- spawned side -------------------------------------------------------------------------


def _position_ids(lengths: tuple[int, ...], sp: int) -> torch.Tensor:
    """(1, T) positions restarting at each sequence; the padding is one more sequence."""
    total = padded_length(sum(lengths), sp)
    pad = (total - sum(lengths),) if total > sum(lengths) else ()
    return torch.cat([torch.arange(n) for n in (*lengths, *pad)])[None]


def _heads_cases(sp: int) -> list[tuple[int, int]]:
    cases = []
    for q_heads in (4, 2):
        for kv_heads in (1, 2, 4):
            if kv_heads > q_heads or q_heads % kv_heads:
                continue
            try:
                check_head_rule(q_heads, kv_heads, sp)
            except ValueError:
                continue
            cases.append((q_heads, kv_heads))
    return cases


def _grad(x: torch.Tensor) -> torch.Tensor:
    assert x.grad is not None
    return x.grad


def _case(
    rank: int, group: dist.ProcessGroup, lengths: tuple[int, ...], q_heads: int, kv_heads: int
) -> dict[str, float]:
    sp = dist.get_world_size(group)
    position_ids = _position_ids(lengths, sp)
    tokens = position_ids.shape[1]
    generator = torch.Generator().manual_seed(1000 * q_heads + 10 * kv_heads + tokens)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    q = randn(1, q_heads, tokens, HEAD_DIM).requires_grad_()
    k = randn(1, kv_heads, tokens, HEAD_DIM).requires_grad_()
    v = randn(1, kv_heads, tokens, HEAD_DIM).requires_grad_()
    upstream = randn(1, tokens, q_heads, HEAD_DIM)
    module = torch.nn.Module().eval()  # varlen_sdpa_attention reads only .training

    reference, _ = varlen_sdpa_attention(module, q, k, v, None, position_ids=position_ids)
    reference.backward(upstream)

    t = tokens // sp
    mine = slice(rank * t, (rank + 1) * t)
    q_s, k_s, v_s = (x.detach()[:, :, mine].clone().requires_grad_() for x in (q, k, v))
    out, none = ulysses_attention(
        varlen_sdpa_attention, module, q_s, k_s, v_s, None, group, position_ids=position_ids
    )
    out.backward(upstream[:, mine])
    assert none is None and out.shape == (1, t, q_heads, HEAD_DIM)

    def diff(a: torch.Tensor, b: torch.Tensor) -> float:
        return (a - b).abs().max().item()

    return {
        "out": diff(out, reference[:, mine]),
        "dq": diff(_grad(q_s), _grad(q)[:, :, mine]),
        "dk": diff(_grad(k_s), _grad(k)[:, :, mine]),
        "dv": diff(_grad(v_s), _grad(v)[:, :, mine]),
    }


def _layout(rank: int, group: dist.ProcessGroup) -> dict[str, bool]:
    """seq_to_heads hands rank r head block r over the whole row; heads_to_seq undoes it."""
    sp = dist.get_world_size(group)
    heads, t = 2 * sp, 3
    full = torch.arange(heads * sp * t * 2, dtype=torch.float32).reshape(1, heads, sp * t, 2)
    mine = full[:, :, rank * t : (rank + 1) * t]
    spread = seq_to_heads(mine, group)
    per_rank = heads // sp
    back = heads_to_seq(spread.transpose(1, 2).contiguous(), group)
    return {
        "seq_to_heads": torch.equal(spread, full[:, rank * per_rank : (rank + 1) * per_rank]),
        "round_trip": torch.equal(back, mine.transpose(1, 2)),
    }


def _run(rank: int, mesh: DeviceMesh) -> dict[str, Any]:
    group = mesh.get_group()
    sp = dist.get_world_size(group)
    diffs = {
        (name, q_heads, kv_heads): _case(rank, group, lengths, q_heads, kv_heads)
        for name, lengths in (("short", SHORT), ("long", LONG))
        for q_heads, kv_heads in _heads_cases(sp)
    }
    return {"diffs": diffs, "layout": _layout(rank, group)}


# --- tests --------------------------------------------------------------------------------


# sp 4 (four processes on two cores) under `make test-full`; sp 2 covers every case by default.
@pytest.fixture(
    scope="module", params=[2, pytest.param(4, marks=pytest.mark.full)], ids=["sp2", "sp4"]
)
def ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list:
    out = tmp_path_factory.mktemp(f"ulysses_sp{request.param}")
    return spawn_ranks(_run, Path(out), world=request.param)


def test_cases_cover_gqa_and_both_varlen_branches(ranks: list[dict[str, Any]]) -> None:
    cases = set(ranks[0]["diffs"])
    sp = len(ranks)
    assert {("short", 4, 1), ("long", 4, 1), ("short", 4, 2), ("long", 4, 4)} <= cases
    if sp == 2:
        assert {("short", 2, 1), ("long", 2, 2)} <= cases


def test_all_to_all_layout(ranks: list[dict[str, Any]]) -> None:
    for result in ranks:
        assert result["layout"] == {"seq_to_heads": True, "round_trip": True}


@pytest.mark.parametrize("quantity", ["out", "dq", "dk", "dv"])
def test_matches_single_process_varlen(ranks: list[dict[str, Any]], quantity: str) -> None:
    worst = {
        case: max(result["diffs"][case][quantity] for result in ranks) for case in ranks[0]["diffs"]
    }
    print(f"sp={len(ranks)} max |{quantity} - reference|: {max(worst.values()):.2e}")
    assert all(d <= ATOL for d in worst.values()), worst
