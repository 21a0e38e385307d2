"""GRPO end to end on 2 CPU workers and the tiny model: the README's first command on a fresh
checkout (`python -m hybrid.main` from a working directory where nothing exists builds the demo
model and data, trains three steps, keeps the newest checkpoints), its metrics, export and
memory report; exact resume; bad inputs that must fail before any worker starts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM

from hybrid.memory.records import STEADY_PHASES, read_records, step_phases
from hybrid.trainer.checkpoints import complete_checkpoints
from hybrid.trainer.demo_assets import DEMO_MODEL_PATH, DEMO_TRAIN_FILE, DEMO_VAL_FILE
from hybrid.trainer.loop import Driver
from hybrid.trainer.publisher import PUBLISHER_KEYS
from hybrid.trainer.sources import SOURCE_KEYS
from hybrid.trainer.step import STEP_KEYS
from profiling import memory_report
from tests.integration.trainer.helpers import (
    TWO_MINI_BATCHES,
    UNREPEATABLE,
    assert_generates_in_vllm,
    make_config,
    read_metrics,
    run_entry_point,
    write_assets,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
GRPO_PHASES = step_phases(critic=False)


REQUIRED = (
    "step", "reward/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac",
    "actor/grad_norm", "response_length/mean", "rollout/logprob_diff_max", "timing_s/step",
    "timing_s/gen", "timing_s/sync", "timing_s/update_actor", "perf/throughput",
)  # fmt: skip
# The demo's config at small sizes: 2 mini-batches a step and the KL loss on, so that every
# phase of a step is recorded; a checkpoint after each step, the newest two kept.
FIRST_RUN = (
    *TWO_MINI_BATCHES,
    "trainer.total_steps=3",
    "trainer.save_freq=1",
    "trainer.max_checkpoints_to_keep=2",
    "trainer.output_dir=run",
    "trainer.test_freq=3",
)


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_assets(tmp_path_factory.mktemp("grpo"))


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """The entry point in an empty working directory (its own Ray cluster and vLLM), shared by
    the tests that read its output: (the working directory, the finished process)."""
    cwd = tmp_path_factory.mktemp("first_run")
    done = run_entry_point(cwd, *FIRST_RUN, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return cwd, done


def test_the_entry_point_builds_the_demo_and_trains_from_nothing(first_run: tuple) -> None:
    cwd, done = first_run
    built = [line for line in done.stdout.splitlines() if "built the demo inputs" in line]
    assert len(built) == 1, done.stdout
    for path in (DEMO_MODEL_PATH, DEMO_TRAIN_FILE, DEMO_VAL_FILE):
        assert path in built[0]
        assert (cwd / path).exists(), path
    assert (cwd / DEMO_MODEL_PATH / "config.json").is_file()
    assert "3 steps in" in done.stdout  # the entry point's summary line
    # actor.hsdp_replicas auto: the demo's tiny model is replicated on both CPU workers.
    assert "HSDP 2 replicas (the whole model on each)" in done.stdout

    run = cwd / "run"
    assert json.loads((run / "config.json").read_text())["trainer"]["max_checkpoints_to_keep"] == 2
    # Saved at steps 1, 2, 3 with a limit of 2: step_1 went once step_3 was complete.
    assert [step for step, _ in complete_checkpoints(run)] == [2, 3]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2", "step_3"]


def test_three_steps_write_metrics_and_a_loadable_model(first_run: tuple) -> None:
    cwd, _ = first_run
    out = cwd / "run"
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    # Greedy validation over every held-out prompt.
    assert metrics[2]["val/num_prompts"] == pq.read_metadata(cwd / DEMO_VAL_FILE).num_rows
    assert 0.0 <= metrics[2]["val/reward_mean"] <= 1.0
    for row in metrics:
        missing = [key for key in REQUIRED if key not in row]
        assert not missing, missing
        # Every mode's shared keys (test_driver_matrix.py compares the modes, test-full).
        assert not (STEP_KEYS | SOURCE_KEYS | PUBLISHER_KEYS) - row.keys()
        assert any(key.startswith("memory/") for key in row)
        assert 0.0 <= row["reward/mean"] <= 1.0
        assert row["rollout/logprob_diff_max"] < 0.05
        assert row["actor/kl_loss"] >= 0.0
    # The actor leaves the reference after its first optimizer step (2 mini-batches a step).
    assert metrics[2]["actor/kl_loss"] > 0.0
    model = AutoModelForCausalLM.from_pretrained(out / "hf_model", dtype=torch.float32)
    assert model.config.vocab_size == 16
    assert_generates_in_vllm(out / "hf_model")


def test_the_memory_report_accounts_for_the_steady_states(first_run: tuple) -> None:
    """memory.jsonl -> memory_report.md + memory_timeline.png; the components found on the
    objects add up to the measured RSS of both steady states within 10%."""
    out = first_run[0] / "run"
    records = list(read_records(out / "memory.jsonl"))
    assert {r.rank for r in records} == {0, 1}
    assert {r.step for r in records} == {0, 1, 2, 3}
    for step in (1, 2, 3):  # every boundary of a step, in order, on every rank
        for rank in (0, 1):
            seen = [r.phase for r in records if r.step == step and r.rank == rank]
            assert list(dict.fromkeys(p for p in seen if p in GRPO_PHASES)) == list(GRPO_PHASES)
    for record in records:
        if record.step >= 2 and record.phase in STEADY_PHASES.values():
            ratio = record.attributed_gib / record.current_gib
            assert 0.9 <= ratio <= 1.1, (record.phase, record.rank, record.step, ratio)

    assert memory_report.main([str(out)]) == 0
    report = (out / "memory_report.md").read_text()
    table = [line for line in report.splitlines() if line.startswith("| `")]
    for phase in GRPO_PHASES:
        assert any(line.startswith(f"| `{phase}` |") for line in table), phase
    assert "## Global peak" in report and "## Drift of the steady states" in report
    assert (out / "memory_timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.full  # by default a run resumes in test_sft.py (across the SFT boundary) and test_fsdp.py
def test_a_resumed_run_reproduces_the_uninterrupted_one(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    Driver(make_config(assets, straight, "trainer.total_steps=3", "trainer.export_hf=false")).fit()
    Driver(
        make_config(assets, interrupted, "trainer.total_steps=2", "trainer.export_hf=false")
    ).fit()
    Driver(
        make_config(assets, interrupted, "trainer.total_steps=3", "trainer.export_hf=false")
    ).fit()
    expected, resumed = read_metrics(straight), read_metrics(interrupted)
    assert [m["step"] for m in resumed] == [1, 2, 3]
    repeatable = [key for key in expected[2] if not key.startswith(UNREPEATABLE)]
    assert len(repeatable) > 10
    for key in repeatable:
        assert resumed[2][key] == expected[2][key], key


# The trainer-side speed-ups, each against the padded full-logit passes they replace.
PASS_VARIANTS = {
    "padded": ("model.use_remove_padding=false", "model.log_prob_chunk_tokens=0"),
    "packed": (),
    "packed_dynamic": ("actor.use_dynamic_bsz=true", "actor.ppo_max_token_len_per_gpu=48",
                       "actor.log_prob_max_token_len_per_gpu=48", "ref.use_dynamic_bsz=true",
                       "ref.log_prob_max_token_len_per_gpu=48"),
}  # fmt: skip
# What a different packing may change: bf16 rounding in the actor's passes.
BF16_METRICS = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/entropy_old",
                "actor/grad_norm", "rollout/logprob_diff_mean", "rollout/logprob_diff_max")  # fmt: skip


# By default tests/unit/workers/test_policy.py checks the same (padded, packed and token-budget
# passes take the same step) on one process; this end-to-end version takes 70 s of CI.
@pytest.mark.full
def test_packing_and_token_budgets_keep_the_first_step(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    first = {}
    for name, overrides in PASS_VARIANTS.items():
        out = tmp_path / name
        config = make_config(
            assets, out, "trainer.total_steps=1", "trainer.export_hf=false", *overrides
        )
        assert not config.on_policy_update  # 2 mini-batches: the old-log-prob pass runs
        Driver(config).fit()
        first[name] = read_metrics(out)[0]
    padded = first["padded"]
    exact = [k for k in padded if k.startswith(("reward/", "response_length/"))]
    assert len(exact) >= 3
    for name in ("packed", "packed_dynamic"):
        for key in exact:  # the same rollout: generation does not depend on the passes
            assert first[name][key] == padded[key], (name, key)
        gaps = {key: abs(first[name][key] - padded[key]) for key in BF16_METRICS}
        print(f"{name} vs padded, first step: {gaps}")
        for key, gap in gaps.items():
            assert gap <= 0.02 * max(abs(padded[key]), 1.0), (name, key, gap)


# By default the fully-async runs skip the pass (test_fully_async.py) and
# tests/unit/workers/test_policy.py checks the skipped pass's step and metrics.
@pytest.mark.full
def test_an_on_policy_step_skips_the_old_log_prob_pass(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    config = make_config(
        assets, tmp_path, "trainer.total_steps=1", "trainer.export_hf=false",
        "algorithm.ppo_mini_batch_size=4",  # one mini-batch: on-policy
    )  # fmt: skip
    assert config.on_policy_update
    Driver(config).fit()
    metrics = read_metrics(tmp_path)[0]
    assert metrics["timing_s/old_log_prob"] == 0.0  # no worker ran the pass
    assert metrics["actor/pg_clipfrac"] == 0.0  # the ratio is exactly 1
    print(f"on-policy step: rollout/logprob_diff_max {metrics['rollout/logprob_diff_max']:.4f}")
    assert 0.0 < metrics["rollout/logprob_diff_max"] < 0.05
    assert metrics["actor/entropy_old"] > 0.0


def test_bad_inputs_fail_before_workers_start(assets: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"data\.train_files: .*missing\.parquet does not exist"):
        make_config(assets, tmp_path, f"data.train_files=[{tmp_path / 'missing.parquet'}]")
    with pytest.raises(
        ValueError,
        match=r"data\.train_batch_size \(4\) must be a multiple of algorithm\.ppo_mini_batch_size \(3\)",
    ):
        make_config(assets, tmp_path, "algorithm.ppo_mini_batch_size=3")
    with pytest.raises(ValueError, match=r"rollout\.n must be >= 2"):
        make_config(assets, tmp_path, "rollout.n=1")
    with pytest.raises(ValueError, match=r"unknown config keys \['actor\.learning_rate'\]"):
        make_config(assets, tmp_path, "+actor.learning_rate=1")
    no_prompt = tmp_path / "no_prompt.jsonl"
    no_prompt.write_text(
        json.dumps({"data_source": "arithmetic", "reward_model": {"ground_truth": "1"}}) + "\n"
    )
    with pytest.raises(ValueError, match=r"no_prompt\.jsonl: row 0: .*'prompt'"):
        Driver(make_config(assets, tmp_path, f"data.train_files=[{no_prompt}]"))
    unknown = tmp_path / "unknown.jsonl"
    row = {
        "prompt": [{"role": "user", "content": "1+1="}],
        "data_source": "poetry",
        "reward_model": {"ground_truth": "2"},
    }
    unknown.write_text(json.dumps(row) + "\n")
    with pytest.raises(
        ValueError, match=r"unknown\.jsonl:.*data_source 'poetry' has no built-in reward"
    ):
        Driver(
            make_config(
                assets,
                tmp_path,
                f"data.train_files=[{unknown}]",
                "data.train_batch_size=1",
                "algorithm.ppo_mini_batch_size=1",
            )
        )
