"""Every `actor.policy_loss` through a real run of every trainer.mode: 3 steps on the tiny
model and the arithmetic prompts, in-process (`Driver(config).fit()` on the session's Ray
cluster), with real Ray and FSDP2 trainers; generation is the deterministic toy engine's
(rollout.engine=toy), since the loss is what varies here and vLLM's start would triple the time
(the CPU demo runs the losses on vLLM: docs/algorithms.md, "Policy losses").

Two mini-batches per update, so the second optimizer step of each is off-policy (ratios away
from 1): the clip, the sequence ratio and the soft gate act on real numbers. By default GSPO
colocated runs (the default tier's time budget), the other 14 cells under -m full.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hybrid.trainer.loop import Driver
from tests.integration.trainer.helpers import (
    MOVING,
    ONE_WORKER,
    read_metrics,
    small_config,
    write_assets,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

STEPS = 3
GSPO_BAND = ("actor.clip_ratio_low=0.0003", "actor.clip_ratio_high=0.0004")
GSPO_METRICS = (
    "actor/pg_clipfrac",
    "actor/gspo_seq_ratio_mean",
    "actor/gspo_seq_ratio_max",
    "actor/gspo_seq_ratio_min",
)
# The loss's own settings (the papers': GSPO's tiny band, CISPO without a lower bound) and the
# metrics only that loss reports.
LOSSES = {
    "vanilla": (("actor.clip_ratio_high=0.28",), ("actor/pg_clipfrac", "actor/pg_clipfrac_lower")),
    "gspo": (GSPO_BAND, GSPO_METRICS),
    "gspo_token": (GSPO_BAND, GSPO_METRICS),
    "cispo": (
        ("actor.clip_ratio_low=1.0", "actor.clip_ratio_high=0.28"),
        ("actor/pg_clipfrac", "actor/cispo_clipfrac_high", "actor/cispo_clipfrac_low"),
    ),
    "sapo": (
        ("actor.sapo_tau_pos=1.0", "actor.sapo_tau_neg=1.05"),
        ("actor/sapo_gate_weight_mean",),
    ),
}


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_assets(tmp_path_factory.mktemp("losses"))


MODES = {
    "colocated": ONE_WORKER,
    "split": ("trainer.mode=split", "sync.method=memory"),
    # Two mini-batches per update there too.
    "fully_async": (
        "trainer.mode=fully_async",
        "fully_async.require_batches=2",
        "sync.method=memory",
        "sync.timeout_s=120",
    ),
}
DEFAULT_CELLS = {("gspo", "colocated")}


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        (name, mode)
        if (name, mode) in DEFAULT_CELLS
        else pytest.param(name, mode, marks=pytest.mark.full)
        for mode in MODES
        for name in LOSSES
    ],
)
def test_three_steps(ray_cluster: None, assets: Path, tmp_path: Path, name: str, mode: str) -> None:
    settings, own_metrics = LOSSES[name]
    out = tmp_path / name
    config = small_config(
        assets, out, "rollout.engine=toy", f"trainer.total_steps={STEPS}",
        "algorithm.ppo_mini_batch_size=2", "actor.micro_batch_size=4",
        MOVING,  # the policy moves between the step's two mini-batches
        f"actor.policy_loss={name}", *settings, *MODES[mode],
    )  # fmt: skip
    assert config.actor.policy_loss == name and config.trainer.mode == mode
    Driver(config).fit()

    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for row in metrics:
        missing = [key for key in (*own_metrics, "actor/ppo_kl", "actor/pg_loss") if key not in row]
        assert not missing, (row["step"], missing)
        bad = {k: v for k, v in row.items() if k.startswith("actor/") and not math.isfinite(v)}
        assert not bad, (row["step"], bad)
        assert row["actor/step_applied"] == 1.0
    # The second mini-batch of a step is trained after the first's optimizer step: off-policy.
    assert any(row["actor/ppo_kl"] != 0.0 for row in metrics)
    if name.startswith("gspo"):
        assert any(
            row["actor/gspo_seq_ratio_max"] > row["actor/gspo_seq_ratio_min"] for row in metrics
        )
    if name == "sapo":
        assert any(row["actor/sapo_gate_weight_mean"] < 1.0 for row in metrics)
    # Other losses' metrics do not leak in (each reports its own).
    others = {key for n, (_, keys) in LOSSES.items() if n != name for key in keys}
    assert not (others - set(own_metrics) - {"actor/pg_clipfrac"}) & set(metrics[-1])
