"""The evaluation's outputs (hybrid/evaluation/report.py) from a hand-made result: the Markdown
table (metrics in order, data sources sorted with `all` last, values with their intervals),
eval.json's keys and counts, samples.jsonl's first prompts, and the progress line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybrid.evaluation.config import EvalConfig
from hybrid.evaluation.estimators import Estimate, summarize
from hybrid.evaluation.model_dir import ResolvedModel
from hybrid.evaluation.progress import progress_line
from hybrid.evaluation.report import (
    format_estimate,
    markdown,
    markdown_table,
    split_key,
    table_layout,
    write_report,
)
from hybrid.evaluation.runner import EvalResult, FileCounts
from hybrid.evaluation.scoring import ScoredPrompt

pytestmark = pytest.mark.unit


def prompt(index: int, source: str, scores: tuple[float, ...]) -> ScoredPrompt:
    answers = tuple("7" if s else "3" for s in scores)
    return ScoredPrompt(
        index=index,
        data_source=source,
        ground_truth="7",
        raw_prompt=f"question {index}",
        responses=tuple(f"answer {a}" for a in answers),
        scores=scores,
        answers=answers,
        response_lengths=(3,) * len(scores),
        truncated=1,
        source=f"data.jsonl:{index}",
    )


def result(tmp_path: Path, samples_to_dump: int = 2) -> EvalResult:
    config = EvalConfig(
        model="m",
        data=("data.jsonl",),
        n=4,
        temperature=1.0,
        output_dir=str(tmp_path / "eval"),
        samples_to_dump=samples_to_dump,
    )
    prompts = [
        prompt(0, "openai/gsm8k", (1.0, 0.0, 0.0, 0.0)),
        prompt(1, "openai/gsm8k", (1.0, 1.0, 1.0, 0.0)),
        prompt(2, "arithmetic", (0.0, 0.0, 0.0, 0.0)),
    ]
    ks = [1, 2, 4]
    return EvalResult(
        config=config,
        ks=ks,
        model=ResolvedModel("m", "hf", "m"),
        files=[FileCounts("data.jsonl", prompts=3, filtered=2)],
        prompts=prompts,
        estimates=summarize([p.samples() for p in prompts], ks),
        rewards={"reward": "built-in by data_source"},
        timing_s={"total": 1.5},
        engine={"hardware": "CPU", "dtype": "bfloat16"},
    )


def test_keys_split_at_the_last_slash() -> None:
    assert split_key("openai/gsm8k/pass@4") == ("openai/gsm8k", "pass@4")
    assert split_key("all/mean@8") == ("all", "mean@8")


def test_the_table_orders_metrics_by_kind_then_k_and_puts_all_last(tmp_path: Path) -> None:
    metrics, sources = table_layout(result(tmp_path).estimates)
    assert metrics == [
        "mean@4",
        *(f"pass@{k}" for k in (1, 2, 4)),
        *(f"best@{k}" for k in (1, 2, 4)),
        *(f"maj@{k}" for k in (1, 2, 4)),
    ]
    assert sources == ["arithmetic", "openai/gsm8k", "all"]


def test_cells_hold_the_value_and_its_interval(tmp_path: Path) -> None:
    assert format_estimate(Estimate(0.8125, 0.75, 0.875, 10)) == "0.812 [0.750, 0.875]"
    estimates = result(tmp_path).estimates
    lines = markdown_table(estimates)
    assert lines[0] == "| metric | arithmetic (1) | openai/gsm8k (2) | all (3) |"
    assert lines[1] == "|---|---|---|---|"
    mean_row = next(line for line in lines if line.startswith("| mean@4 |"))
    assert mean_row == (
        "| mean@4 | "
        + " | ".join(
            format_estimate(estimates[f"{s}/mean@4"]) for s in ("arithmetic", "openai/gsm8k", "all")
        )
        + " |"
    )
    assert estimates["all/mean@4"].value == pytest.approx(4 / 12)
    # A data source of one prompt has no spread over prompts: its interval is its value.
    assert "| mean@4 | 0.000 [0.000, 0.000] |" in mean_row


def test_the_page_says_what_was_evaluated_and_what_was_left_out(tmp_path: Path) -> None:
    page = markdown(result(tmp_path))
    assert "4 samples per prompt, temperature 1, top_p 1" in page
    assert "prompts: 3 from data.jsonl (3); 2 longer than max_prompt_length=1024 left out" in page
    assert "95% confidence intervals over prompts" in page


def test_the_files_hold_the_config_the_estimates_and_the_first_prompts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = write_report(result(tmp_path, samples_to_dump=2))
    assert capsys.readouterr().out.startswith("# Evaluation")
    report = json.loads((out / "eval.json").read_text())
    assert report["config"]["k"] == [1, 2, 4] and report["config"]["n"] == 4
    assert (report["prompts"], report["samples"], report["filtered"]) == (3, 12, 2)
    assert report["sources"] == {"arithmetic": {"prompts": 1}, "openai/gsm8k": {"prompts": 2}}
    pass_1 = report["metrics"]["openai/gsm8k/pass@1"]
    assert sorted(pass_1) == ["ci_high", "ci_low", "prompts", "value"]
    assert pass_1["value"] == pytest.approx(0.5) and pass_1["prompts"] == 2
    assert pass_1["ci_low"] < 0.5 < pass_1["ci_high"]
    assert {"all/mean@4", "all/maj@4", "arithmetic/best@2"} <= set(report["metrics"])
    assert report["response_length"] == {"mean": 3.0, "max": 3.0, "truncated_fraction": 0.25}
    assert report["model"] == {"given": "m", "path": "m", "kind": "hf"}
    assert (out / "eval.md").read_text() == markdown(result(tmp_path))
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [row["index"] for row in rows] == [0, 1]
    assert rows[1]["scores"] == [1.0, 1.0, 1.0, 0.0]
    assert rows[1]["answers"] == ["7", "7", "7", "3"]
    assert rows[0]["source"] == "data.jsonl:0" and rows[0]["ground_truth"] == "7"


def test_no_samples_are_dumped_when_asked_for_none(tmp_path: Path) -> None:
    out = write_report(result(tmp_path, samples_to_dump=0), echo=False)
    assert (out / "samples.jsonl").read_text() == ""


def test_the_progress_line_counts_prompts_samples_and_pace() -> None:
    line = progress_line(done=50, total=100, samples=400, mean_score=0.25, elapsed_s=20.0)
    assert line == "prompts 50/100  samples 400  mean score 0.250  20s  eta 20s  20.0 samples/s"
    assert "eta" not in progress_line(100, 100, 800, 0.5, 40.0)
