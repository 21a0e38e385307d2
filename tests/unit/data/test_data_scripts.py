"""The dataset scripts in examples/data: GSM8K conversion, Countdown and arithmetic generation.
Each writes train/test parquet files that `PromptDataset` loads with a tiny model's tokenizer."""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from hybrid.data.arithmetic_task import write_arithmetic_task
from hybrid.data.dataset import PromptDataset, read_rows
from hybrid.models import TinyModelConfig, build_tiny_model, load_tokenizer, unknown_characters

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = REPO_ROOT / "examples" / "data"
GSM8K_DIR = REPO_ROOT / ".." / "shared" / "data" / "gsm8k"


def load_script(name: str) -> ModuleType:
    """Import examples/data/{name}.py (examples is not a package)."""
    spec = importlib.util.spec_from_file_location(f"examples_data_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def text_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    config = TinyModelConfig.preset("tiny", vocab="text")
    return load_tokenizer(build_tiny_model(tmp_path_factory.mktemp("text"), config))


@pytest.fixture(scope="module")
def arithmetic_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    config = TinyModelConfig.preset("tiny", vocab="arithmetic")
    return load_tokenizer(build_tiny_model(tmp_path_factory.mktemp("arith"), config))


def run_main(name: str, output_dir: Path, *args: str) -> dict[str, Path]:
    written: dict[str, Path] = load_script(name).main(["--output-dir", str(output_dir), *args])
    assert set(written) == {"train", "test"}
    assert written == {split: output_dir / f"{split}.parquet" for split in ("train", "test")}
    return written


def contents(rows: list[dict[str, Any]]) -> list[str]:
    return [row["prompt"][0]["content"] for row in rows]


# ---- GSM8K ----------------------------------------------------------------------------------


def test_gsm8k_converts_the_shared_data(
    tmp_path: Path, text_tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    written = run_main("gsm8k", tmp_path)  # the default --input-dir is the shared data
    printed = capsys.readouterr().out
    for split, path in written.items():
        raw_lines = (GSM8K_DIR / f"{split}.jsonl").read_text().splitlines()
        rows = read_rows(path)
        assert len(rows) == sum(1 for line in raw_lines if line.strip())
        assert f"wrote {len(rows)} rows to {path}" in printed
        raw = json.loads(raw_lines[0])
        assert rows[0] == {
            "data_source": "openai/gsm8k",
            "prompt": [
                {
                    "role": "user",
                    "content": raw["question"]
                    + ' Let\'s think step by step and output the final answer after "####".',
                }
            ],
            "ability": "math",
            "reward_model": {
                "style": "rule",
                "ground_truth": raw["answer"].split("####")[-1].strip().replace(",", ""),
            },
            "extra_info": {"split": split, "index": 0, "answer": raw["answer"]},
        }
        assert all(re.fullmatch(r"-?[0-9.]+", r["reward_model"]["ground_truth"]) for r in rows)
        dataset = PromptDataset(path, text_tokenizer, max_prompt_length=2048)
        assert len(dataset) == len(rows) and dataset.num_filtered == 0


@pytest.mark.parametrize(
    ("bad_line", "match"),
    [
        ({"answer": "#### 3"}, r"line 2: field 'question'"),
        ({"question": "q?"}, r"line 2: field 'answer'"),
        ({"question": "q?", "answer": "it is 3"}, r"line 2: field 'answer' has no '####"),
    ],
)
def test_gsm8k_bad_raw_rows_name_file_and_line(
    tmp_path: Path, bad_line: dict[str, str], match: str
) -> None:
    raw_dir = tmp_path / "raw"
    raw_dir.mkdir()
    good = {"question": "1+1?", "answer": "1+1=2\n#### 2"}
    for split in ("train", "test"):
        lines = [good, bad_line] if split == "train" else [good]
        (raw_dir / f"{split}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(ValueError, match=re.escape(str(raw_dir / "train.jsonl")) + ": " + match):
        run_main("gsm8k", tmp_path / "out", "--input-dir", str(raw_dir))


def test_gsm8k_strips_commas_and_keeps_negative_answers(tmp_path: Path) -> None:
    gsm8k = load_script("gsm8k")
    row = gsm8k.convert_row({"question": "q", "answer": "x\n#### -1,250"}, "train", 0, "here")
    assert row["reward_model"]["ground_truth"] == "-1250"
    with pytest.raises(FileNotFoundError, match=r"train\.jsonl"):
        run_main("gsm8k", tmp_path / "out", "--input-dir", str(tmp_path))


# ---- arithmetic -----------------------------------------------------------------------------


def test_arithmetic_prompts_fit_the_arithmetic_vocab(
    tmp_path: Path, arithmetic_tokenizer: Any
) -> None:
    written = run_main("arithmetic", tmp_path, "--num-train", "200", "--num-test", "30")
    for split, path in written.items():
        rows = read_rows(path)
        assert len(rows) == {"train": 200, "test": 30}[split]
        for row in rows:
            content = row["prompt"][0]["content"]
            a, b = map(int, re.fullmatch(r"(\d)\+(\d)=", content).groups())  # type: ignore[union-attr]
            assert 0 <= a < 5 and 0 <= b < 5
            assert row["reward_model"]["ground_truth"] == str(a + b)
            assert row["data_source"] == "arithmetic"
            assert unknown_characters(content, "arithmetic") == []
        dataset = PromptDataset(path, arithmetic_tokenizer, max_prompt_length=16)
        assert len(dataset) == len(rows) and dataset.num_filtered == 0
        for row, loaded in zip(rows, dataset.rows, strict=True):
            # Nothing was dropped: the ids decode back to the full templated text.
            expected = f"<|im_start|>{row['prompt'][0]['content']}<|im_end|><|im_start|>"
            assert arithmetic_tokenizer.decode(loaded.token_ids) == expected
    assert len(set(contents(read_rows(written["train"])))) == 25  # all 5 x 5 pairs appear


def test_arithmetic_is_deterministic_per_seed(tmp_path: Path) -> None:
    def generate(seed: int, out: str, *extra: str) -> list[dict[str, Any]]:
        written = run_main("arithmetic", tmp_path / out, "--seed", str(seed), *extra)
        return read_rows(written["train"]) + read_rows(written["test"])

    first = generate(0, "a")
    assert generate(0, "b") == first
    assert contents(generate(1, "c")) != contents(first)
    wide = generate(0, "d", "--max-operand", "50")
    assert max(int(r["reward_model"]["ground_truth"]) for r in wide) > 9


def test_arithmetic_script_and_package_write_the_same_bytes(tmp_path: Path) -> None:
    # The entry point builds the demo data from the package (hybrid/trainer/demo_assets.py).
    by_script = run_main("arithmetic", tmp_path / "script", "--seed", "0")
    by_package = write_arithmetic_task(tmp_path / "package", seed=0)
    for split in ("train", "test"):
        assert by_script[split].read_bytes() == by_package[split].read_bytes(), split
    with pytest.raises(ValueError, match="num_test must be >= 1, got 0"):
        write_arithmetic_task(tmp_path / "bad", num_test=0)


# ---- Countdown ------------------------------------------------------------------------------


def _combine(a: int, b: int) -> list[int]:
    values = [a + b, a - b, b - a, a * b]
    values += [a // b] if b and a % b == 0 else []
    values += [b // a] if a and b % a == 0 else []
    return values


@functools.cache
def reachable(numbers: tuple[int, ...]) -> frozenset[int]:
    """Every value of an equation using each number once with +, -, * and exact /.

    `numbers` is sorted so equal multisets share the cache."""
    if len(numbers) == 1:
        return frozenset(numbers)
    values: set[int] = set()
    for i in range(len(numbers)):
        for j in range(i + 1, len(numbers)):
            rest = [n for k, n in enumerate(numbers) if k not in (i, j)]
            for value in _combine(numbers[i], numbers[j]):
                values |= reachable(tuple(sorted([*rest, value])))
    return frozenset(values)


def countdown_rows(tmp_path: Path, seed: int, out: str) -> list[dict[str, Any]]:
    written = run_main("countdown", tmp_path / out, "--num-train", "60", "--num-test", "20",
                       "--seed", str(seed))  # fmt: skip
    return read_rows(written["train"]) + read_rows(written["test"])


def test_countdown_targets_are_reachable(tmp_path: Path, text_tokenizer: Any) -> None:
    rows = countdown_rows(tmp_path, seed=0, out="a")
    assert len(rows) == 80
    keys = set()
    for row in rows:
        truth = row["reward_model"]["ground_truth"]
        numbers, target = truth["numbers"], truth["target"]
        assert 3 <= len(numbers) <= 4 and all(1 <= n <= 99 for n in numbers)
        assert 1 <= target <= 999
        assert target in reachable(tuple(sorted(numbers)))
        solution = row["extra_info"]["solution"]
        assert sorted(map(int, re.findall(r"\d+", solution))) == sorted(numbers)
        assert eval(solution) == target  # only digits, operators and parentheses
        content = row["prompt"][0]["content"]
        assert f"Using the numbers {numbers}, create an equation that equals {target}." in content
        assert "<answer>" in content and row["data_source"] == "countdown"
        keys.add((tuple(sorted(numbers)), target))
    assert len(keys) == len(rows)
    dataset = PromptDataset(tmp_path / "a" / "train.parquet", text_tokenizer, 512)
    assert len(dataset) == 60 and dataset.num_filtered == 0
    assert json.loads(dataset[0].ground_truth) == rows[0]["reward_model"]["ground_truth"]


def test_countdown_is_deterministic_per_seed(tmp_path: Path) -> None:
    first = countdown_rows(tmp_path, seed=0, out="a")
    assert countdown_rows(tmp_path, seed=0, out="b") == first
    assert contents(countdown_rows(tmp_path, seed=1, out="c")) != contents(first)


def test_scripts_reject_non_positive_counts(tmp_path: Path) -> None:
    arguments: Sequence[str] = ["--output-dir", str(tmp_path), "--num-train", "0"]
    for name in ("arithmetic", "countdown"):
        with pytest.raises(SystemExit):
            load_script(name).main(arguments)


def test_gsm8k_tools_asks_for_the_tools_and_names_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = read_rows(run_main("gsm8k", tmp_path / "plain")["test"])
    tools = read_rows(run_main("gsm8k_tools", tmp_path / "tools")["test"])
    capsys.readouterr()
    assert len(tools) == len(plain)
    first, base = tools[0], plain[0]
    question = base["prompt"][0]["content"].split(" Let's think step by step")[0]
    content = first["prompt"][0]["content"]
    assert content.startswith(question) and "calculator tool" in content and "####" in content
    assert first["extra_info"]["agent_name"] == "tools"
    assert first["reward_model"] == base["reward_model"]
    assert first["data_source"] == "openai/gsm8k"
