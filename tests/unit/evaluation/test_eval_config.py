"""`python -m hybrid.eval`'s arguments: parsed in the trainer's key=value style into an
EvalConfig, strictly (an unknown key, a wrong type or a bad value named), and the inputs that
are refused before any worker starts (k > n, a missing model or data file, a row without
reward_model.ground_truth)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.data import write_rows
from hybrid.eval import field_docs, main, parse_args, usage
from hybrid.evaluation.config import EvalConfig

pytestmark = pytest.mark.unit

REQUIRED = ("model=m", "data=[d.parquet]")


def test_key_value_arguments_build_the_config() -> None:
    config = parse_args(
        ["model=out/run/hf_model", "data=[a.parquet,b.jsonl]", "n=8", "temperature=1", "k=[1,4]"]
    )
    assert config.model == "out/run/hf_model"
    assert config.data == ("a.parquet", "b.jsonl")
    assert (config.n, config.temperature, config.k) == (8, 1.0, (1, 4))
    assert isinstance(config.temperature, float)
    assert not config.greedy and config.sampling.n == 8


def test_single_values_of_list_fields_are_lists_of_one() -> None:
    config = parse_args(["model=m", "data=test.parquet", "n=4", "temperature=0.7", "k=2"])
    assert config.data == ("test.parquet",)
    assert config.k == (2,)


def test_the_defaults_are_one_greedy_sample() -> None:
    config = parse_args(list(REQUIRED))
    assert (config.n, config.temperature, config.k) == (1, 0.0, None)
    assert config.greedy


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nn=3"], r"unknown config keys \['nn'\]"),
        (["n=many"], r"n must be a int, got 'many'"),
        (["model"], r"argument 'model' is not key=value"),
        (["k=[1,2"], r"argument 'k=\[1,2'"),
        (["temperature=-1"], r"temperature must be >= 0"),
        (["top_p=1.5"], r"top_p must be in \(0, 1\]"),
        (["batch_size=0"], r"batch_size must be > 0"),
        (["n=4", "temperature=0"], r"n=4 with temperature=0"),
        (["n=4", "temperature=1", "k=[1,8]"], r"k=\[1, 8\] holds 8, outside 1..n \(n=4\)"),
        (["k=[]"], r"k is empty"),
        (["workers=3", "tensor_parallel_size=2"], r"tensor_parallel_size \(2\) must divide"),
        (["max_model_len=100"], r"max_prompt_length \(1024\) \+ response_length \(1024\)"),
        (["dtype=int8"], r"dtype must be one of"),
        (["samples_to_dump=-1"], r"samples_to_dump must be >= 0"),
    ],
)
def test_bad_arguments_are_named(args: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_args([*REQUIRED, *args])


@pytest.mark.parametrize("missing", ["model", "data"])
def test_model_and_data_are_required(missing: str) -> None:
    given = [arg for arg in REQUIRED if not arg.startswith(missing)]
    with pytest.raises(ValueError, match=rf"{missing}= is required"):
        parse_args(given)


def test_the_engine_reads_the_weights_from_disk_with_training_settings() -> None:
    config = parse_args([*REQUIRED, "max_prompt_length=16", "response_length=4", "seed=3"])
    rollout = config.rollout_config()
    assert rollout.load_format == "auto"  # training's default, dummy, would leave random weights
    assert (rollout.prompt_length, rollout.response_length, rollout.max_model_len) == (16, 4, 20)
    assert rollout.seed == 3


def test_every_field_is_documented_and_listed_by_help(capsys: pytest.CaptureFixture[str]) -> None:
    docs = field_docs(EvalConfig)
    names = list(EvalConfig.__dataclass_fields__)
    assert set(docs) == set(names), set(names) - set(docs)
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    shown = capsys.readouterr().out
    assert shown.strip() == usage().strip()
    assert all(f"  {name} (" in shown for name in names)


def _exit_message(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_k_above_n_stops_before_anything_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    err = _exit_message(["model=nowhere", "data=[nowhere.parquet]", "k=[2]"], capsys)
    assert "k=[2] holds 2, outside 1..n (n=1)" in err


def test_missing_files_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = f"output_dir={tmp_path / 'out'}"
    err = _exit_message(["model=/no/model", f"data=[{tmp_path / 'x.parquet'}]", out], capsys)
    assert f"data: {tmp_path / 'x.parquet'} does not exist" in err
    data = write_rows([], tmp_path / "d.jsonl")
    err = _exit_message(["model=/no/model", f"data=[{data}]", out], capsys)
    assert "model: /no/model does not exist" in err
    assert (tmp_path / "out" / "logs" / "error.txt").is_file()


def test_a_row_without_ground_truth_names_file_row_and_column(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = arithmetic_row("1+2=")
    del row["reward_model"]
    data = write_rows([arithmetic_row("1+2="), row], tmp_path / "d.jsonl")
    err = _exit_message(
        [f"model={tiny_model}", f"data=[{data}]", f"output_dir={tmp_path / 'out'}"], capsys
    )
    assert f"{data}: row 1: field 'reward_model.ground_truth' is missing" in err


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    from hybrid.models import TinyModelConfig, build_tiny_model

    return build_tiny_model(
        tmp_path / "model", TinyModelConfig.preset("tiny", vocab="arithmetic"), seed=0
    )


def arithmetic_row(question: str, data_source: str = "arithmetic") -> dict[str, object]:
    return {
        "prompt": [{"role": "user", "content": question}],
        "data_source": data_source,
        "reward_model": {"ground_truth": "3"},
    }


def test_prompts_too_long_are_counted_per_file(tmp_path: Path, tiny_model: Path) -> None:
    from hybrid.evaluation.runner import prepare, start_line

    short = write_rows([arithmetic_row("1+2="), arithmetic_row("2+1=")], tmp_path / "a.jsonl")
    long = write_rows([arithmetic_row("1+2="), arithmetic_row("1+2+3+4+1=")], tmp_path / "b.jsonl")
    config = EvalConfig(model=str(tiny_model), data=(str(short), str(long)))
    limit = min(len(row.token_ids) for row in prepare(config).dataset.rows)
    inputs = prepare(EvalConfig(model=str(tiny_model), data=config.data, max_prompt_length=limit))
    inputs.rewards.close()
    assert [(f.path, f.prompts, f.filtered) for f in inputs.files] == [
        (str(short), 2, 0),
        (str(long), 1, 1),
    ]
    assert "3 prompts (1 longer than max_prompt_length left out) x 1 samples" in start_line(inputs)


def test_a_data_source_without_a_reward_is_named(tmp_path: Path, tiny_model: Path) -> None:
    from hybrid.evaluation.runner import prepare

    data = write_rows(
        [arithmetic_row("1+2="), arithmetic_row("1+1=", "mine")], tmp_path / "d.jsonl"
    )
    with pytest.raises(ValueError, match=rf"{data}:1: data_source 'mine' has no built-in reward"):
        prepare(EvalConfig(model=str(tiny_model), data=(str(data),)))
