"""Unit tests for `hybrid.rewards.manager.RewardManager`: scores, metrics and failing rows."""

import logging
from typing import Any

import pytest
import torch

from hybrid.data import Batch
from hybrid.rewards import RewardManager
from hybrid.rewards.manager import RewardError

pytestmark = pytest.mark.unit


def make_batch(responses: list[str], golds: list[Any], sources: list[str], **extra: Any) -> Batch:
    size = len(responses)
    non_tensors = {"response_text": responses, "ground_truth": golds, "data_source": sources}
    non_tensors.update(extra)
    return Batch.from_dict({"responses": torch.zeros(size, 2, dtype=torch.long)}, non_tensors)


def test_builtin_rewards_by_data_source() -> None:
    batch = make_batch(
        ["#### 18", "#### 17", "7<|im_end|>", "<answer>1 + 2</answer>"],
        ["18", "18", "7", {"target": 4, "numbers": [1, 2]}],
        ["openai/gsm8k", "gsm8k", "arithmetic", "countdown"],
    )
    scores, metrics = RewardManager().score(batch)
    assert scores.dtype == torch.float32 and scores.shape == (4,)
    assert scores.tolist() == pytest.approx([1.0, 0.0, 1.0, 0.1])
    assert metrics["reward/mean"] == pytest.approx(2.1 / 4)
    assert metrics["reward/max"] == 1.0
    assert metrics["reward/min"] == 0.0
    assert metrics["reward/errors"] == 0.0


def test_with_on_error_score_a_raising_row_scores_zero_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def flaky(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any) -> float:
        if solution_str == "boom":
            raise RuntimeError("parser exploded")
        return float(solution_str == ground_truth)

    batch = make_batch(["a", "boom", "c", "x"], ["a", "b", "c", "d"], ["s0", "s1", "s2", "s3"])
    with caplog.at_level(logging.ERROR, logger="hybrid.rewards.manager"):
        scores, metrics = RewardManager(flaky, on_error="score").score(batch)
    assert scores.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert metrics["reward/errors"] == 1.0
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "row 1" in errors[0].getMessage() and "'s1'" in errors[0].getMessage()
    assert "Traceback" in caplog.text and "parser exploded" in caplog.text


def test_only_the_first_failure_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    def mostly_broken(data_source: str, *args: Any) -> float:
        if data_source == "good":
            return 1.0
        raise ValueError("always")

    batch = make_batch(["a", "b", "c", "d"], ["a", "b", "c", "d"], ["s", "s", "s", "good"])
    with caplog.at_level(logging.ERROR, logger="hybrid.rewards.manager"):
        scores, metrics = RewardManager(mostly_broken, on_error="score", error_score=-1).score(
            batch
        )
    assert scores.tolist() == [-1.0, -1.0, -1.0, 1.0]
    assert metrics["reward/errors"] == 3.0 and metrics["reward/errors/exception"] == 3.0
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1
    assert "3 of 4 rows failed" in caplog.text


def test_every_row_failing_stops_the_run_even_when_errors_score() -> None:
    def broken(*args: Any) -> float:
        raise ValueError("always")

    batch = make_batch(["a", "b"], ["a", "b"], ["s", "s"])
    with pytest.raises(RewardError, match=r"every reward of the batch failed \(2 of 2 rows"):
        RewardManager(broken, on_error="score").score(batch)


def test_fail_names_the_row_its_uid_data_source_and_error() -> None:
    def flaky(data_source: str, solution_str: str, *args: Any) -> float:
        if solution_str == "boom":
            raise RuntimeError("parser exploded")
        return 1.0

    batch = make_batch(
        ["a", "boom", "boom"], ["a", "b", "c"], ["s0", "s1", "s2"], uid=["u0", "u1", "u2"]
    )
    with pytest.raises(RewardError) as info:
        RewardManager(flaky).score(batch)
    message = str(info.value)
    assert "row 1, uid u1 (data_source 's1'): exception: RuntimeError: parser exploded" in message
    assert "2 of 3 rows failed" in message and "reward.on_error=score" in message
    assert "\n" not in message  # one line; the traceback is not in it


def test_dict_results_and_extra_info() -> None:
    seen: list[Any] = []

    def with_details(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any):
        seen.append(extra_info)
        return {"score": 0.5, "acc": solution_str == ground_truth, "pred": solution_str}

    batch = make_batch(["a", "b"], ["a", "c"], ["s", "s"], extra_info=[{"i": 0}, None])
    scores, metrics = RewardManager(with_details).score(batch)
    assert scores.tolist() == [0.5, 0.5]
    assert metrics["reward/acc"] == 0.5
    assert "reward/pred" not in metrics and "reward/score" not in metrics
    assert seen == [{"i": 0}, None]


@pytest.mark.parametrize("bad", [{"acc": 1.0}, "1.0", float("nan"), None])
def test_bad_return_values_count_as_errors(bad: Any) -> None:
    batch = make_batch(["a"], ["a"], ["s"])
    with pytest.raises(RewardError, match=r"row 0 \(data_source 's'\)"):
        RewardManager(lambda *args: bad).score(batch)


def test_missing_column_names_it_and_the_present_ones() -> None:
    batch = Batch.from_dict({}, {"response_text": ["a"], "data_source": ["s"]})
    with pytest.raises(KeyError, match="ground_truth") as info:
        RewardManager().score(batch)
    assert "response_text" in str(info.value) and "data_source" in str(info.value)


def test_unknown_data_source_counts_as_an_error_row() -> None:
    batch = make_batch(["#### 1", "#### 1"], ["1", "1"], ["gsm8k", "unknown/set"])
    scores, metrics = RewardManager(on_error="score").score(batch)
    assert scores.tolist() == [1.0, 0.0]
    assert metrics["reward/errors"] == 1.0
    assert metrics["reward/errors/exception"] == 1.0


def test_a_batch_scored_in_parts_gives_what_the_whole_gives() -> None:
    def scored(data_source: str, solution_str: str, ground_truth: Any, extra: Any) -> Any:
        if solution_str == "boom":
            raise RuntimeError("parser exploded")
        return {"score": float(solution_str == ground_truth), "length": len(solution_str)}

    responses = ["1", "2", "boom", "4", "5", "x"]
    whole = make_batch(responses, ["1", "0", "3", "4", "0", "x"], ["s"] * 6, uid=list("aabbcc"))
    manager = RewardManager(scored, on_error="score", error_score=-1.0)
    stream = manager.stream()
    for rows in ([0, 1], [2, 3, 4], [5]):
        stream.add(whole[rows])
    assert stream.num_parts == 3
    parts_scores, parts_metrics = stream.result()
    whole_scores, whole_metrics = manager.score(whole)
    assert torch.equal(parts_scores, whole_scores)
    assert parts_scores.tolist() == [1.0, 0.0, -1.0, 1.0, 0.0, 1.0]
    assert parts_metrics == whole_metrics and parts_metrics["reward/errors"] == 1.0
    manager.close()


def test_in_parts_a_failure_is_named_by_its_row_in_the_whole_batch() -> None:
    def flaky(data_source: str, solution_str: str, *args: Any) -> float:
        if solution_str == "boom":
            raise RuntimeError("parser exploded")
        return 1.0

    whole = make_batch(["a", "b", "c", "boom"], list("abcd"), ["s"] * 4, uid=list("uuvv"))
    stream = RewardManager(flaky).stream()
    stream.add(whole[[0, 1]])
    stream.add(whole[[2, 3]])
    with pytest.raises(RewardError, match=r"row 3, uid v \(data_source 's'\): exception"):
        stream.result()


def test_in_parts_every_row_failing_is_judged_over_the_whole_batch() -> None:
    def picky(data_source: str, solution_str: str, *args: Any) -> float:
        if solution_str != "ok":
            raise ValueError("no")
        return 1.0

    whole = make_batch(["no", "no", "ok"], ["", "", ""], ["s"] * 3)
    manager = RewardManager(picky, on_error="score")
    stream = manager.stream()
    stream.add(whole[[0, 1]])  # this part fails whole, the batch does not
    stream.add(whole[[2]])
    scores, metrics = stream.result()
    assert scores.tolist() == [0.0, 0.0, 1.0] and metrics["reward/errors"] == 2.0
    with pytest.raises(ValueError, match="no rows were added"):
        manager.stream().result()
