"""A verl-style config end to end: `algorithm.kl_penalty=kl`, `actor.kl_loss_type=kl`,
`actor.loss_agg_mode=token-sum` and `algorithm.adv_estimator=reinforce_plus_plus_baseline`
together, 3 steps in process (`Driver(config).fit()` on the session's Ray cluster) on the tiny
model with vLLM.

What the run shows beyond finishing: the advantages are whitened over the batch's tokens
(their token mean is 0 every step, which GRPO's per-row advantages are not), and the update's
entropy term is the token SUM of the entropies that its own first pass averages
(actor/entropy = actor/entropy_old x the batch's response tokens: one mini-batch per step).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hybrid.trainer.loop import Driver
from tests.integration.trainer.helpers import read_metrics, small_config, write_assets

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

VERL_NAMES = (
    "algorithm.kl_penalty=kl",
    "algorithm.use_kl_in_reward=true",
    "actor.kl_loss_type=kl",
    "actor.loss_agg_mode=token-sum",
    "algorithm.adv_estimator=reinforce_plus_plus_baseline",
)
ROWS = 16  # small_config: 4 prompts x rollout.n 4, one mini-batch


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_assets(tmp_path_factory.mktemp("verl_names"))


@pytest.mark.full  # the default tier's budget: verl's names are unit tests of the config
def test_a_verl_style_config_trains_three_steps(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    # The toy engine: the names change the objective, not the generation (vLLM's start would
    # double the run).
    config = small_config(assets, out, "rollout.engine=toy", "trainer.total_steps=3", *VERL_NAMES)
    assert config.actor.loss_agg_mode == "token-sum"
    Driver(config).fit()
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        for key in ("actor/pg_loss", "actor/kl_loss", "critic/kl", "actor/grad_norm"):
            assert math.isfinite(m[key]), (m["step"], key, m[key])
        assert abs(m["critic/advantages/mean"]) < 1e-5, m["step"]
        tokens = m["response_length/mean"] * ROWS
        assert m["actor/entropy"] == pytest.approx(m["actor/entropy_old"] * tokens, rel=1e-3)
    # k1 is signed and moves once the actor has: after two updates it is no longer 0.
    assert metrics[-1]["actor/kl_loss"] != 0.0
