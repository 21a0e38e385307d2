"""`PromptDataset` (loading, validation, chat template, length filter) and `PromptLoader`
(shapes, left padding, per-epoch shuffling, exact resume, validation batches)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from hybrid.data.batch import Batch
from hybrid.data.dataset import PromptDataset, read_rows, write_rows
from hybrid.data.loader import PromptLoader
from hybrid.models import TinyModelConfig, build_tiny_model, load_tokenizer

pytestmark = pytest.mark.unit

MAX_LEN = 64


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig.preset("tiny"))
    return load_tokenizer(model_dir)


def make_row(i: int, text: str | None = None, ground_truth: Any = None) -> dict[str, Any]:
    return {
        "prompt": [{"role": "user", "content": text if text is not None else f"q{i}"}],
        "data_source": "toy",
        "reward_model": {"style": "rule", "ground_truth": ground_truth or str(i)},
        "extra_info": {"index": i},
    }


def write(tmp_path: Path, rows: list[dict[str, Any]], name: str = "data.jsonl") -> Path:
    return write_rows(rows, tmp_path / name)


def template_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.fixture
def dataset(tmp_path: Path, tokenizer: Any) -> PromptDataset:
    """10 prompts of different lengths ("q0", "q1 x", "q2 x x", ...)."""
    rows = [make_row(i, f"q{i}" + " x" * i) for i in range(10)]
    return PromptDataset(write(tmp_path, rows), tokenizer, MAX_LEN)


# ---- PromptDataset --------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_loads_rows_and_applies_the_chat_template(
    tmp_path: Path, tokenizer: Any, suffix: str
) -> None:
    rows = [make_row(i) for i in range(3)]
    rows[1]["prompt"] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "q1"},
    ]
    dataset = PromptDataset(write(tmp_path, rows, f"data{suffix}"), tokenizer, MAX_LEN)
    assert len(dataset) == 3 and dataset.num_filtered == 0
    for i, row in enumerate(rows):
        assert dataset[i].token_ids == template_ids(tokenizer, row["prompt"])
        assert dataset[i].raw_prompt == f"q{i}"
        assert dataset[i].data_source == "toy"
        assert dataset[i].ground_truth == str(i)
        assert dataset[i].extra_info == {"index": i}
    text = tokenizer.decode(dataset[0].token_ids)
    assert text == "<|im_start|>user\nq0<|im_end|>\n<|im_start|>assistant\n"


def test_reads_several_files_in_order_and_serialises_ground_truth(
    tmp_path: Path, tokenizer: Any
) -> None:
    jsonl_rows = [make_row(0, ground_truth={"target": 3, "numbers": [1, 2]})]
    jsonl_rows.append(make_row(1, ground_truth=[1, 2]))  # jsonl rows may mix types; parquet not
    first = write(tmp_path, jsonl_rows, "a.jsonl")
    parquet_rows = [make_row(2, ground_truth=7), make_row(3, ground_truth=8)]
    parquet_rows[0]["extra_info"] = None
    second = write(tmp_path, parquet_rows, "b.parquet")
    dataset = PromptDataset([first, second], tokenizer, MAX_LEN)
    assert [row.raw_prompt for row in dataset.rows] == ["q0", "q1", "q2", "q3"]
    assert json.loads(dataset[0].ground_truth) == {"target": 3, "numbers": [1, 2]}
    assert [row.ground_truth for row in dataset.rows[1:]] == ["[1, 2]", "7", "8"]
    assert dataset[2].extra_info == {}
    assert dataset[3].source == f"{second}:1"


def test_custom_prompt_key(tmp_path: Path, tokenizer: Any) -> None:
    row = make_row(0)
    row["messages"] = row.pop("prompt")
    dataset = PromptDataset(write(tmp_path, [row]), tokenizer, MAX_LEN, prompt_key="messages")
    assert dataset[0].raw_prompt == "q0"


def test_long_prompts_are_filtered_counted_and_logged(
    tmp_path: Path, tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    long_text = "y" * MAX_LEN
    rows = [make_row(i, long_text if i in (1, 4, 5) else None) for i in range(8)]
    path = write(tmp_path, rows)
    with caplog.at_level(logging.WARNING, logger="hybrid.data.dataset"):
        dataset = PromptDataset(path, tokenizer, MAX_LEN)
    assert len(dataset) == 5
    assert dataset.num_filtered == 3
    assert dataset.filtered_rows == [f"{path}:1", f"{path}:4", f"{path}:5"]
    assert [row.ground_truth for row in dataset.rows] == ["0", "2", "3", "6", "7"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "filtered 3 of 8" in message and f"{path}:1, {path}:4, {path}:5" in message


def test_a_prompt_of_exactly_max_length_is_kept(tmp_path: Path, tokenizer: Any) -> None:
    length = len(template_ids(tokenizer, make_row(0, "abc")["prompt"]))
    dataset = PromptDataset(write(tmp_path, [make_row(0, "abc")]), tokenizer, length)
    assert len(dataset) == 1 and dataset.num_filtered == 0


def test_every_prompt_filtered_raises(tmp_path: Path, tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="no prompts left"):
        PromptDataset(write(tmp_path, [make_row(0, "z" * 100)]), tokenizer, 8)


def test_missing_file_and_bad_suffix(tmp_path: Path, tokenizer: Any) -> None:
    missing = tmp_path / "nope.parquet"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        PromptDataset(missing, tokenizer, MAX_LEN)
    csv = tmp_path / "data.csv"
    csv.write_text("prompt\nq\n")
    with pytest.raises(ValueError, match=r"data\.csv.*'\.csv'.*\.parquet.*\.jsonl"):
        PromptDataset(csv, tokenizer, MAX_LEN)


def test_invalid_json_line_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(make_row(0)) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"broken\.jsonl: line 2"):
        read_rows(path)


def _drop_prompt(row: dict[str, Any]) -> None:
    del row["prompt"]


@pytest.mark.parametrize(
    ("corrupt", "field"),
    [
        (_drop_prompt, "'prompt'"),
        (lambda row: row.update(prompt=[]), "'prompt'"),
        (lambda row: row.update(prompt="just text"), "'prompt'"),
        (lambda row: row.update(prompt=[{"role": "user"}]), "'prompt' message 0"),
        (lambda row: row.update(prompt=[{"role": "user", "content": 3}]), "'prompt' message 0"),
        (lambda row: row.pop("data_source"), "'data_source'"),
        (lambda row: row.update(reward_model={"style": "rule"}), "'reward_model.ground_truth'"),
        (lambda row: row.pop("reward_model"), "'reward_model.ground_truth'"),
        (lambda row: row.update(extra_info=[1]), "'extra_info'"),
    ],
)
def test_invalid_row_names_file_row_and_field(
    tmp_path: Path, tokenizer: Any, corrupt: Any, field: str
) -> None:
    rows = [make_row(i) for i in range(3)]
    corrupt(rows[1])
    path = write(tmp_path, rows)
    with pytest.raises(ValueError) as info:
        PromptDataset(path, tokenizer, MAX_LEN)
    assert f"{path}: row 1: field {field}" in str(info.value)


# ---- PromptLoader ----------------------------------------------------------------------------


def uids(batch: Batch) -> list[str]:
    return [str(u) for u in batch["uid"]]


def rows_of(batch: Batch) -> list[int]:
    return [int(u.split("-")[1]) for u in uids(batch)]


def test_batch_shape_left_padding_and_fields(dataset: PromptDataset, tokenizer: Any) -> None:
    loader = PromptLoader(dataset, batch_size=4, seed=0)
    batch = loader.next_batch()
    assert batch.tensors["input_ids"].shape == (4, MAX_LEN)
    assert batch.tensors["attention_mask"].shape == (4, MAX_LEN)
    assert batch.tensors["input_ids"].dtype == torch.long
    assert set(batch.non_tensors) == {
        "uid",
        "data_source",
        "ground_truth",
        "extra_info",
        "raw_prompt",
    }
    for row, index in enumerate(rows_of(batch)):
        ids, mask = batch.tensors["input_ids"][row], batch.tensors["attention_mask"][row]
        tokens = dataset[index].token_ids
        num_pad = MAX_LEN - len(tokens)
        assert ids[num_pad:].tolist() == tokens
        assert ids[:num_pad].eq(tokenizer.pad_token_id).all()
        assert mask.tolist() == [0] * num_pad + [1] * len(tokens)
        assert batch["ground_truth"][row] == str(index)
        assert batch["raw_prompt"][row] == f"q{index}" + " x" * index
        assert batch["extra_info"][row] == {"index": index}
        assert batch["data_source"][row] == "toy"


def test_each_epoch_sees_every_row_once_in_a_new_order(dataset: PromptDataset) -> None:
    loader = PromptLoader(dataset, batch_size=5, seed=3)
    assert loader.steps_per_epoch == 2
    epochs = []
    for epoch in range(3):
        batches = [loader.next_batch() for _ in range(loader.steps_per_epoch)]
        epoch_uids = [u for b in batches for u in uids(b)]
        assert len(set(epoch_uids)) == 10
        assert all(u.startswith(f"{epoch}-") for u in epoch_uids)
        order = [r for b in batches for r in rows_of(b)]
        assert sorted(order) == list(range(10))
        epochs.append(order)
    assert epochs[0] != epochs[1] != epochs[2]


def test_drop_last_and_partial_batches(dataset: PromptDataset) -> None:
    dropping = PromptLoader(dataset, batch_size=4, seed=0)
    sizes = [len(dropping.next_batch()) for _ in range(5)]
    assert sizes == [4, 4, 4, 4, 4] and dropping.epoch == 2
    keeping = PromptLoader(dataset, batch_size=4, seed=0, drop_last=False)
    assert keeping.steps_per_epoch == 3
    batches = [keeping.next_batch() for _ in range(4)]
    assert [len(b) for b in batches] == [4, 4, 2, 4]
    assert sorted(r for b in batches[:3] for r in rows_of(b)) == list(range(10))
    ordered = PromptLoader(dataset, batch_size=4, shuffle=False)
    assert [rows_of(ordered.next_batch()) for _ in range(3)] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [0, 1, 2, 3],
    ]


def test_seed_decides_the_order(dataset: PromptDataset) -> None:
    def first_epoch(seed: int) -> list[int]:
        loader = PromptLoader(dataset, batch_size=5, seed=seed)
        return rows_of(loader.next_batch()) + rows_of(loader.next_batch())

    assert first_epoch(0) == first_epoch(0)
    assert first_epoch(0) != first_epoch(1)


@pytest.mark.parametrize("steps_before", [1, 2, 3, 5])
def test_resume_reproduces_the_uninterrupted_stream(
    dataset: PromptDataset, steps_before: int
) -> None:
    """batch 3 of 10 rows: 3 steps per epoch (one row dropped), so 1 and 2 stop mid-epoch,
    3 exactly at an epoch boundary and 5 mid-way through the second epoch."""
    reference = PromptLoader(dataset, batch_size=3, seed=7)
    expected = [reference.next_batch() for _ in range(steps_before + 6)]
    first = PromptLoader(dataset, batch_size=3, seed=7)
    for _ in range(steps_before):
        first.next_batch()
    state = json.loads(json.dumps(first.state_dict()))
    resumed = PromptLoader(dataset, batch_size=3, seed=7)
    resumed.load_state_dict(state)
    for want in expected[steps_before:]:
        assert resumed.next_batch().equals(want)


def test_load_state_dict_rejects_another_seed_or_dataset(dataset: PromptDataset) -> None:
    state = PromptLoader(dataset, batch_size=2, seed=0).state_dict()
    with pytest.raises(ValueError, match="seed=0"):
        PromptLoader(dataset, batch_size=2, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="11 prompts"):
        PromptLoader(dataset, batch_size=2).load_state_dict({**state, "num_rows": 11})
    with pytest.raises(ValueError, match="missing"):
        PromptLoader(dataset, batch_size=2).load_state_dict({"epoch": 0})


def test_batch_larger_than_the_dataset_with_drop_last_raises(dataset: PromptDataset) -> None:
    with pytest.raises(ValueError, match="batch_size=11"):
        PromptLoader(dataset, batch_size=11)


def test_validation_batches_cover_all_rows_in_order(dataset: PromptDataset) -> None:
    loader = PromptLoader(dataset, batch_size=4, seed=0)
    loader.next_batch()
    state = loader.state_dict()
    batches = list(loader.validation_batches(4))
    assert [len(b) for b in batches] == [4, 4, 2]
    assert [u for b in batches for u in uids(b)] == [f"val-{i}" for i in range(10)]
    assert [g for b in batches for g in b["ground_truth"]] == [str(i) for i in range(10)]
    assert batches[2].tensors["input_ids"].shape == (2, MAX_LEN)
    assert loader.state_dict() == state


def test_characters_the_vocabulary_cannot_encode_are_refused(tmp_path: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "m", TinyModelConfig.preset("tiny", vocab="arithmetic"))
    row = {
        "prompt": [{"role": "user", "content": "3-1="}],
        "data_source": "arithmetic",
        "reward_model": {"ground_truth": "2"},
    }
    path = tmp_path / "minus.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(
        ValueError, match=r"minus\.jsonl: row 0: field 'prompt' has characters .*\['-'\]"
    ):
        PromptDataset(path, load_tokenizer(model_dir), max_prompt_length=32)


def test_a_csv_named_parquet_is_named_with_its_first_line(tmp_path: Path) -> None:
    fake = tmp_path / "train.parquet"
    fake.write_text("question,answer\n1+1,2\n")
    with pytest.raises(
        ValueError, match=r"train\.parquet is named \.parquet but is not a parquet"
    ) as info:
        read_rows(fake)
    assert "'question,answer'" in str(info.value)
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="it is empty"):
        read_rows(empty)
    # A real parquet file whose end was cut off: named too, not left to pyarrow's traceback.
    whole = write_rows([{"prompt": "a"}], tmp_path / "whole.parquet")
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(whole.read_bytes()[:-10])
    with pytest.raises(ValueError, match=r"cut\.parquet is named \.parquet but is not"):
        read_rows(cut)
