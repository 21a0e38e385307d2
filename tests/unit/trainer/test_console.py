"""The console: the start-up summary, the compact metrics line (never wider than 100 columns),
the progress sink, and the quiet logging setup."""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from hybrid.trainer.compose import compose, to_run_config
from hybrid.trainer.config import TrainerConfig, TrainerRunConfig
from hybrid.trainer.console import (
    MAX_COLUMNS,
    ConsoleSink,
    compact_line,
    configure_logging,
    eta_seconds,
    final_summary,
    format_duration,
    format_rate,
    run_log_dir,
    startup_summary,
)

pytestmark = pytest.mark.unit

# A real step's metrics (from a run of the demo), and the validation keys of a test_freq step.
STEP = {
    "reward/mean": 0.015625,
    "reward/max": 1.0,
    "reward/errors": 0.0,
    "actor/entropy": 2.687760889530182,
    "actor/grad_norm": 0.5617489814758301,
    "actor/kl_loss": 0.0,
    "actor/pg_loss": -9.313225746154785e-10,
    "rollout/logprob_diff_max": 0.00675046443939209,
    "memory/peak_gib": 0.8207359313964844,
    "response_length/mean": 3.921875,
    "timing_s/step": 0.9970667899997352,
    "perf/throughput": 701.0563454833208,
}
VALIDATION = {"val/reward_mean": 0.52, "val/num_prompts": 100.0}
# Worst cases: every field present, long numbers, a KL term, six-digit step counts.
WIDE = {
    **STEP,
    **VALIDATION,
    "actor/kl_loss": -0.000123456,
    "actor/pg_loss": -123456.789,
    "response_length/mean": 1234.5678,
    "rollout/logprob_diff_max": 12.3456789,
    "timing_s/step": 12345.6,
}

FACTS = {
    "parameters": 298_112,
    "hardware": "CPU with avx512_bf16",
    "actor_dtype": "bfloat16",
    "ref_dtype": "bfloat16",
    "rollout_dtype": "float32",
    "sync_strategy": "reload",
    "weight_layout": "packed",
}


@pytest.mark.parametrize("metrics", [STEP, {**STEP, **VALIDATION}, VALIDATION, WIDE, {}])
@pytest.mark.parametrize(("step", "total"), [(0, 300), (10, 300), (300, 300), (123456, 999999)])
def test_the_compact_line_fits_in_100_columns(
    metrics: dict[str, float], step: int, total: int
) -> None:
    line = compact_line(step, total, metrics, eta_s=98765.0)
    assert len(line) <= MAX_COLUMNS
    assert line.startswith(f"step {step:>{len(str(total))}}/{total}")
    if "reward/mean" in metrics:
        assert "reward " in line
    if "val/reward_mean" in metrics:
        assert "val 0.520" in line  # validation is never dropped for width


def test_the_compact_line_of_a_demo_step_reads_well() -> None:
    line = compact_line(10, 300, STEP, eta_s=98.0)
    assert line == (
        "step  10/300  reward 0.016  loss -9.31e-10  ent 2.69  len 3.92  lp_diff 0.00675  "
        "1s/step  eta 1m38s"
    )
    # KL shows up only when the KL loss is on; no ETA on the last step.
    assert "kl " not in line
    assert "kl -1.23e-04" in compact_line(10, 300, {**STEP, "actor/kl_loss": -0.000123})
    assert "eta" not in compact_line(300, 300, STEP, eta_s=0.0)
    assert "eta" not in compact_line(0, 300, VALIDATION)  # unknown before the first step
    # Rows the reward function raised on are never dropped for width.
    assert "reward_errors 3" in compact_line(10, 300, {**WIDE, "reward/errors": 3.0})


def test_narrow_lines_drop_the_least_important_fields_first() -> None:
    line = compact_line(10, 300, {**STEP, **VALIDATION}, eta_s=98.0, width=60)
    assert len(line) <= 60
    assert "reward 0.016" in line and "val 0.520" in line and "eta 1m38s" in line
    assert "ent " not in line


def test_durations_rates_and_eta() -> None:
    assert [format_duration(s) for s in (0.4, 42, 185, 7620)] == ["0s", "42s", "3m05s", "2h07m"]
    assert format_duration(math.nan) == "?"
    assert format_rate(2.44) == "2.4 step/s"
    assert format_rate(0.25) == "4.0 s/step"
    assert format_rate(0.0) == "? s/step"
    assert eta_seconds(10, 20.0, 290) == 580.0
    assert math.isnan(eta_seconds(0, 0.0, 300))


def config(*overrides: str) -> TrainerRunConfig:
    """The default run's config (configs/config.yaml) with Hydra overrides."""
    return to_run_config(compose("config", list(overrides)))


def test_the_startup_summary_names_what_the_workers_resolved() -> None:
    lines = startup_summary(config(), FACTS, Path("outputs/demo/run/logs"))
    text = "\n".join(lines)
    assert lines[0] == "hybrid: GRPO with 2 CPU workers"
    assert "outputs/demo/model (298,112 parameters)" in text
    assert "2 on CPU, local Ray" in text
    assert "actor bfloat16, ref bfloat16, rollout float32" in text
    assert "reload (engine weights: packed)" in text
    assert "CPU with avx512_bf16" in text
    assert "outputs   outputs/demo/run" in text
    assert "outputs/demo/run/logs/" in text
    assert all(len(line) <= MAX_COLUMNS for line in lines)
    # Verbose: no logs line; a joined cluster names its address.
    gpu = config("trainer.use_gpu=true")
    joined = "\n".join(startup_summary(gpu, FACTS, None, "10.0.0.1:6379"))
    assert "2 on GPU, Ray at 10.0.0.1:6379" in joined and "logs" not in joined


def test_the_objective_line_names_what_the_run_adds_to_the_plain_loss() -> None:
    assert not any("objective" in line for line in startup_summary(config(), FACTS, None))
    lines = startup_summary(
        config(
            "actor.policy_loss=gspo", "algorithm.filter_groups.enable=true",
            "reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=2",
        ),
        FACTS,
        None,
    )  # fmt: skip
    (objective,) = [line for line in lines if line.startswith("  objective")]
    assert objective == (
        "  objective policy loss gspo; dynamic sampling (<= 10 rounds a step); overlong shaping "
        "over the last 2 tokens"
    )


def test_the_final_summary() -> None:
    lines = final_summary([0.0] * 10 + [1.0] * 10, 125.0, {"val/reward_mean": 0.9}, "out")
    assert lines == [
        "done: 20 steps in 2m05s; mean reward, first 10 steps 0.000, last 10 1.000; "
        "validation 0.900",
        "outputs in out",
    ]
    assert "validation" not in final_summary([0.5], 3.0, {}, "out")[0]


def test_log_freq_and_verbose_are_validated_config_fields() -> None:
    assert TrainerConfig().log_freq >= 1 and TrainerConfig().verbose is False
    with pytest.raises(ValueError, match=r"trainer\.log_freq must be >= 1"):
        TrainerConfig(log_freq=0)
    assert run_log_dir("out", verbose=False) == Path("out/logs")
    assert run_log_dir("out", verbose=True) is None


def test_the_sink_prints_every_log_freq_steps_and_validation() -> None:
    buffer = io.StringIO()
    sink = ConsoleSink(total_steps=25, log_freq=10, console=Console(file=buffer, width=80))
    sink.log(0, VALIDATION)
    for step in range(1, 26):
        sink.log(step, {**STEP, **(VALIDATION if step == 15 else {})})
    sink.close()
    lines = buffer.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["0/25", "10/25", "15/25", "20/25", "25/25"]
    # Not a terminal: no wrapping at the console's 80 columns, and no progress bar drawn.
    assert all(len(line) <= MAX_COLUMNS for line in lines)
    assert any(len(line) > 80 for line in lines)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        handler.close()
    root.handlers, root.level = saved[0], saved[1]


def test_quiet_logging_keeps_libraries_in_the_file_and_warnings_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    configure_logging(verbose=False, log_dir=tmp_path / "logs")
    library = logging.getLogger("some_library")
    library.info("library chatter")
    for _ in range(3):
        library.warning("a fallback was taken")
    logging.getLogger("hybrid.trainer.grpo").info("resumed from %s", "ckpt")
    for _ in range(2):
        logging.getLogger("hybrid.rewards").error("reward function raised")
    shown = capsys.readouterr().out
    assert "library chatter" not in shown
    assert shown.count("a fallback was taken") == 1
    assert "resumed from ckpt" in shown
    assert shown.count("reward function raised") == 2  # errors are never folded
    for handler in logging.getLogger().handlers:
        handler.flush()
    written = (tmp_path / "logs" / "driver.log").read_text()
    assert "library chatter" in written and written.count("a fallback was taken") == 3


def test_the_split_summary_names_both_groups_and_the_schedule() -> None:
    from tests.unit.trainer.test_split_config import split_config

    facts = {
        "parameters": 10,
        "hardware": "CPU",
        "actor_dtype": "float32",
        "ref_dtype": "float32",
        "rollout_dtype": "float32",
        "sync_strategy": "reload",
        "weight_layout": "packed",
    }
    lines = startup_summary(split_config("sync.offset=1", "sync.method=memory"), facts, None)
    text = "\n".join(lines)
    assert "split: 1 explorer + 1 trainer" in text
    assert "sync.method memory, style fixed (interval 1, offset 1), lag <= 1 versions" in text
