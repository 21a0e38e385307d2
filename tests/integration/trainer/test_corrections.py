"""The rollout-vs-trainer mismatch presets through real runs (full tier): token_tis, icepop and
seq_mask_is on split runs one version off (sync.offset=1, so every sample is trained by weights
one update newer than the ones that sampled it and the corrections act on real ratios), and the
mismatch metrics a run reports whatever the correction. Real Ray and FSDP2 trainers, real
weight transport; generation is the deterministic toy engine's (rollout.engine=toy), which
scores its samples with the same model the trainer holds (bf16 kernels on both sides, so the
fresh tokens' ratios sit within a small gap of 1).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hybrid.trainer.config import BANDED_CORRECTIONS
from tests.integration.trainer.helpers import read_metrics, write_assets
from tests.integration.trainer.test_driver_matrix import STEPS, fit, split_run

pytestmark = [pytest.mark.integration, pytest.mark.full, pytest.mark.timeout(600)]

MISMATCH_KEYS = (
    "rollout/mismatch_k3",
    "rollout/ratio_p01",
    "rollout/ratio_p50",
    "rollout/ratio_p99",
    "rollout/ratio_min",
    "rollout/ratio_max",
    "rollout/ratio_above_cap",
    "rollout/ratio_below_cap",
)
KEPT_KEYS = {"icepop": "actor/icepop_kept_frac", "seq_mask_is": "actor/seq_mask_is_kept_frac"}


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_assets(tmp_path_factory.mktemp("corrections"))


def check_rows(metrics: list[dict]) -> None:
    """Every step ran, updated, and reported finite actor and mismatch figures."""
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for row in metrics:
        missing = [key for key in MISMATCH_KEYS if key not in row]
        assert not missing, (row["step"], missing)
        bad = {
            k: v
            for k, v in row.items()
            if k.startswith(("actor/", "rollout/")) and not math.isfinite(v)
        }
        assert not bad, (row["step"], bad)
        assert row["actor/step_applied"] == 1.0


@pytest.mark.parametrize("correction", ["token_tis", *BANDED_CORRECTIONS])
def test_each_preset_trains_on_lagged_samples(
    ray_cluster: None, assets: Path, tmp_path: Path, correction: str
) -> None:
    out = tmp_path / correction
    split_run(
        assets, out, "memory", "fixed", 1,
        f"algorithm.off_policy_correction={correction}", "algorithm.importance_cap=1.5",
    )  # fmt: skip
    metrics = read_metrics(out)
    check_rows(metrics)
    kept = KEPT_KEYS.get(correction)
    for row in metrics:
        if kept is None:  # token_tis is tis: it keeps every token, so it reports no fraction
            assert not any(k.endswith("_kept_frac") for k in row), row["step"]
        else:
            assert 0.0 <= row[kept] <= 1.0, (row["step"], row[kept])


@pytest.mark.parametrize("mode", ["colocated", "split"])
def test_the_mismatch_is_visible_without_a_correction(
    ray_cluster: None, assets: Path, tmp_path: Path, mode: str
) -> None:
    """colocated: the update's own first pass reports it (on-policy, no old-log-prob pass);
    split: the driver, from the old log-probs. The toy engine scores with the trainer's
    weights, so the fresh tokens' ratios are 1 up to the kernels' bf16 rounding."""
    out = tmp_path / mode
    if mode == "colocated":
        # one mini-batch per step: the update is on-policy and skips the old-log-prob pass
        fit(assets, out, f"trainer.total_steps={STEPS}", "algorithm.ppo_mini_batch_size=4")
    else:
        split_run(assets, out, "memory", "fixed", 0)
    metrics = read_metrics(out)
    check_rows(metrics)
    for row in metrics:
        step, gap = row["step"], row["rollout/logprob_diff_max"]
        assert row["rollout/fresh_tokens"] > 0, step
        # The ratios are those of the |log-prob| gaps the sync check reports: the extremes
        # sit at the largest gap, and k3 = r - 1 - log r <= (log r)^2 for |log r| <= 1.
        low, high = row["rollout/ratio_min"], row["rollout/ratio_max"]
        assert low <= row["rollout/ratio_p01"] <= row["rollout/ratio_p50"], step
        assert row["rollout/ratio_p50"] <= row["rollout/ratio_p99"] <= high, step
        assert max(math.log(high), -math.log(low)) == pytest.approx(gap, rel=1e-4), step
        assert 0.0 <= row["rollout/mismatch_k3"] <= gap**2, step
        assert gap < 0.1, step  # bf16 kernels, the same weights: a small mismatch
        assert row["rollout/ratio_above_cap"] == row["rollout/ratio_below_cap"] == 0.0
