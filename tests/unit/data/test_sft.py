"""`SftDataset` (both layouts, the loss mask exactly on the targets, errors naming the file and
row, max_length) and `SftLoader` (the rollout batch layout, per-epoch shuffling, resume)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hybrid.data.dataset import write_rows
from hybrid.data.sft import SftDataset
from hybrid.data.sft_loader import SFT_KEYS, SftLoader, sft_batch
from hybrid.models import TinyModelConfig, build_tiny_model, load_tokenizer
from hybrid.models.tokenizer import EOS_TOKEN_ID, PAD_TOKEN_ID

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig.preset("tiny"))
    return load_tokenizer(model_dir)


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def template(tokenizer: Any, messages: list[dict[str, str]], generation: bool) -> str:
    text: str = tokenizer.apply_chat_template(
        messages, add_generation_prompt=generation, tokenize=False
    )
    return text


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def dataset(tmp_path: Path, tokenizer: Any, rows: list[dict[str, Any]], **kw: Any) -> SftDataset:
    return SftDataset(
        write_rows(rows, tmp_path / "sft.jsonl"), tokenizer, kw.pop("max_length", 256), **kw
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_the_prompt_layout_renders_as_the_prompt_dataset_and_trains_the_response(
    tmp_path: Path, tokenizer: Any, suffix: str
) -> None:
    prompt = [{"role": "system", "content": "be brief"}, user("2+3=")]
    path = write_rows([{"prompt": prompt, "response": "5 ok"}], tmp_path / f"sft{suffix}")
    (row,) = SftDataset(path, tokenizer, 256).rows
    # The prompt exactly as PromptDataset renders it: the template with the generation prompt.
    assert row.prompt_ids == encode(tokenizer, template(tokenizer, prompt, True))
    assert row.response_ids == [*encode(tokenizer, "5 ok"), EOS_TOKEN_ID]
    assert row.loss_mask == [1] * len(row.response_ids)
    assert row.source == f"{path}:0" and not row.truncated


def test_a_conversation_trains_exactly_the_assistant_tokens(tmp_path: Path, tokenizer: Any) -> None:
    messages = [user("a"), assistant("bc"), user("d"), assistant("e"), user("never answered")]
    (row,) = dataset(tmp_path, tokenizer, [{"messages": messages}]).rows
    assert row.prompt_ids == encode(tokenizer, template(tokenizer, messages[:1], True))
    # Between the targets: the rest of the first turn and the second prompt, as the template
    # renders them; the last user message, with nothing after it to learn, is dropped.
    first_turn = template(tokenizer, messages[:1], True) + "bc<|im_end|>"
    between = template(tokenizer, messages[:3], True).removeprefix(first_turn)
    assert between == "\n<|im_start|>user\nd<|im_end|>\n<|im_start|>assistant\n"
    first, context, second = (
        encode(tokenizer, "bc"),
        encode(tokenizer, between),
        encode(tokenizer, "e"),
    )
    assert row.response_ids == [*first, EOS_TOKEN_ID, *context, *second, EOS_TOKEN_ID]
    assert row.loss_mask == [1] * 3 + [0] * len(context) + [1] * 2
    # The whole row is the template's rendering of the answered conversation, token for token.
    whole = template(tokenizer, messages[:4], False)
    assert row.prompt_ids + row.response_ids == encode(tokenizer, whole.removesuffix("\n"))


def test_rows_without_a_target_are_named(tmp_path: Path, tokenizer: Any) -> None:
    cases = [
        ({"prompt": [user("q")]}, r"row 1: field 'response' is missing"),
        ({"prompt": [user("q")], "response": ""}, r"row 1: field 'response' is missing"),
        ({"messages": [user("q"), user("r")]}, r"row 1: field 'messages' has no assistant"),
        (
            {"messages": [user("q"), assistant("")]},
            r"row 1: field 'messages' message 1 is an empty",
        ),
        ({"messages": [assistant("x")]}, r"row 1: .*starts with an assistant message"),
        ({"response": "x"}, r"row 1: an SFT row has 'prompt' and 'response', or 'messages'"),
        (
            {"prompt": [user("q")], "response": "x", "messages": [user("q")]},
            r"row 1: .*it has both",
        ),
        ({"prompt": [{"role": "user"}], "response": "x"}, r"row 1: field 'prompt' message 0"),
    ]
    good = {"prompt": [user("q")], "response": "a"}
    for bad, message in cases:
        path = write_rows([good, bad], tmp_path / "bad.jsonl")
        with pytest.raises(ValueError, match=rf"{path}: {message}"):
            SftDataset(path, tokenizer, 256)


def test_a_row_too_long_is_named_with_its_length_or_cut_and_counted(
    tmp_path: Path, tokenizer: Any
) -> None:
    rows = [{"prompt": [user("q")], "response": "a"}, {"prompt": [user("q")], "response": "abcdef"}]
    short = len(encode(tokenizer, template(tokenizer, [user("q")], True))) + 2
    with pytest.raises(ValueError, match=rf"row 1: {short + 5} tokens .* sft\.max_length={short}"):
        dataset(tmp_path, tokenizer, rows, max_length=short)
    cut = dataset(tmp_path, tokenizer, rows, max_length=short, truncation="right")
    assert [row.truncated for row in cut.rows] == [False, True]
    assert cut.truncated_rows == [cut.rows[1].source]
    assert cut.rows[1].response_ids == encode(tokenizer, "ab")  # the EOS went with the tail
    assert len(cut.rows[1].prompt_ids) + len(cut.rows[1].response_ids) == short
    # A cut that leaves no target token is refused, naming the row.
    with pytest.raises(ValueError, match=r"row 0: cut to sft\.max_length=.* no target token"):
        dataset(tmp_path, tokenizer, rows, max_length=short - 2, truncation="right")


def test_a_character_the_vocabulary_lacks_is_refused(tmp_path: Path) -> None:
    small = build_tiny_model(tmp_path / "m", TinyModelConfig.preset("tiny", vocab="arithmetic"))
    rows = [{"prompt": [user("1+2=")], "response": "three"}]
    with pytest.raises(ValueError, match=r"row 0: the response has characters .* cannot encode"):
        dataset(tmp_path, load_tokenizer(small), rows)


def test_the_batch_is_the_rollout_layout(tmp_path: Path, tokenizer: Any) -> None:
    rows = [
        {"prompt": [user("q")], "response": "abc"},
        {"messages": [user("long question"), assistant("x"), user("y"), assistant("z")]},
    ]
    data = dataset(tmp_path, tokenizer, rows)
    batch = sft_batch(data.rows, data.pad_token_id)
    assert set(SFT_KEYS) == set(batch.tensors)
    prompt_width = max(len(row.prompt_ids) for row in data.rows)
    response_width = max(len(row.response_ids) for row in data.rows)
    assert batch["input_ids"].shape == (2, prompt_width + response_width)
    for i, row in enumerate(data.rows):
        p, r = len(row.prompt_ids), len(row.response_ids)
        ids, attention = batch["input_ids"][i].tolist(), batch["attention_mask"][i].tolist()
        # Left-padded prompt, right-padded response, the loss mask over the response.
        assert ids[prompt_width - p : prompt_width] == row.prompt_ids
        assert ids[: prompt_width - p] == [PAD_TOKEN_ID] * (prompt_width - p)
        assert batch["responses"][i].tolist()[:r] == row.response_ids
        assert attention == [0] * (prompt_width - p) + [1] * (p + r) + [0] * (response_width - r)
        assert batch["response_mask"][i].tolist() == row.loss_mask + [0] * (response_width - r)
        assert batch["position_ids"][i, prompt_width - p :][: p + r].tolist() == list(range(p + r))
    assert list(batch["source"]) == [row.source for row in data.rows]


def test_the_loader_shuffles_per_epoch_and_resumes_exactly(tmp_path: Path, tokenizer: Any) -> None:
    rows = [{"prompt": [user(f"q{i}")], "response": f"a{i}"} for i in range(10)]
    data = dataset(tmp_path, tokenizer, rows)
    loader = SftLoader(data, 4, seed=3)
    seen = [list(loader.next_batch()["source"]) for _ in range(2)]
    assert len({s for batch in seen for s in batch}) == 8  # no row twice within an epoch
    state = loader.state_dict()
    later = [list(loader.next_batch()["source"]) for _ in range(3)]
    assert loader.epoch == 2  # 10 rows: two batches an epoch, the remainder skipped
    resumed = SftLoader(data, 4, seed=3)
    resumed.load_state_dict(state)
    assert [list(resumed.next_batch()["source"]) for _ in range(3)] == later
    with pytest.raises(ValueError, match=r"sft\.seed=3, this run has sft\.seed=4"):
        SftLoader(data, 4, seed=4).load_state_dict(state)
    with pytest.raises(ValueError, match=r"sft\.batch_size=11 is larger than the SFT data"):
        SftLoader(data, 11)
