"""examples/data/code_task.py: every row's reference program passes its own cases through the
built-in `code` reward (the real sandbox), a wrong program scores nothing, and the files load
with the tiny text model's tokenizer within the demo's prompt length."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from hybrid.data.dataset import PromptDataset, read_rows
from hybrid.models import TinyModelConfig, build_tiny_model, load_tokenizer
from hybrid.rewards import code

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[3] / "examples" / "data" / "code_task.py"
DEMO_MAX_PROMPT_LENGTH = 256
"""data.max_prompt_length of examples/code_task/run_code_demo.sh."""


@pytest.fixture(scope="module")
def code_task() -> ModuleType:
    spec = importlib.util.spec_from_file_location("examples_data_code_task", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fenced(program: str) -> str:
    """A response the way a chat model writes it: prose around a ```python block."""
    return f"Here is the program:\n```python\n{program}```\nIt reads the line and prints."


def score(row: dict[str, Any], program: str) -> dict[str, Any]:
    ground_truth = row["reward_model"]["ground_truth"]
    return code.compute_score(fenced(program), ground_truth, row["extra_info"])


def first_row_of_each_task(code_task: ModuleType) -> list[dict[str, Any]]:
    rows = code_task.make_rows(64, 1, seed=0)["train"]
    firsts: dict[str, dict[str, Any]] = {}
    for row in rows:
        firsts.setdefault(row["extra_info"]["task"], row)
    assert sorted(firsts) == sorted(task.name for task in code_task.TASKS)
    return list(firsts.values())


def test_every_task_reference_passes_and_off_by_one_fails(code_task: ModuleType) -> None:
    for row in first_row_of_each_task(code_task):
        cases = row["reward_model"]["ground_truth"]["cases"]
        assert 3 <= len(cases) <= 4
        assert row["data_source"] == "code"
        task = code_task.TASKS_BY_NAME[row["extra_info"]["task"]]
        assert row["extra_info"]["solution"] == task.reference()
        passed = score(row, row["extra_info"]["solution"])
        assert passed == {"score": 1.0, "passed": len(cases), "total": len(cases)}, row
        assert score(row, task.off_by_one())["score"] == 0.0, row


def test_written_rows_pass_and_fit_the_demo_prompt_length(
    code_task: ModuleType, tmp_path: Path
) -> None:
    written = code_task.main(["--output-dir", str(tmp_path)])  # the demo's files
    assert written == {split: tmp_path / f"{split}.jsonl" for split in ("train", "test")}
    tokenizer = load_tokenizer(
        build_tiny_model(tmp_path / "model", TinyModelConfig.preset("tiny", vocab="text"))
    )
    for split, path in written.items():
        rows = read_rows(path)
        assert [row["extra_info"]["split"] for row in rows] == [split] * len(rows)
        for row in rows[:3]:  # a few through the sandbox; every task is checked above
            # The prompt's example is the first case, so a model that copies it is consistent.
            first = row["reward_model"]["ground_truth"]["cases"][0]
            assert f"`{first['input'].strip()}`" in row["prompt"][0]["content"]
            assert score(row, row["extra_info"]["solution"])["score"] == 1.0
        # Every prompt fits: the dataset would drop a longer one (and count it).
        dataset = PromptDataset(path, tokenizer, max_prompt_length=DEMO_MAX_PROMPT_LENGTH)
        assert len(dataset) == len(rows) and dataset.num_filtered == 0
        assert json.loads(dataset[0].ground_truth) == rows[0]["reward_model"]["ground_truth"]


def test_same_seed_same_rows_other_seed_other_rows(code_task: ModuleType) -> None:
    first = code_task.make_rows(8, 2, seed=3)
    assert first == code_task.make_rows(8, 2, seed=3)
    assert first != code_task.make_rows(8, 2, seed=4)
    with pytest.raises(ValueError, match="num_test must be >= 1, got 0"):
        code_task.make_rows(8, 0, seed=3)
