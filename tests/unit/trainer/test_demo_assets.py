"""The entry point builds the default demo model and data when they are missing, with the same
bytes as examples/run_cpu_demo.sh's commands, and leaves every other path to the user."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hybrid.main import build_config
from hybrid.models.__main__ import main as models_cli
from hybrid.trainer.compose import compose
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.demo_assets import (
    DEMO_MODEL_PATH,
    DEMO_TRAIN_FILE,
    DEMO_VAL_FILE,
    missing_demo_assets,
)
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.unit


def default_config(*overrides: str) -> TrainerRunConfig:
    return build_config(compose("config", list(overrides)))


def script_outputs(root: Path) -> Path:
    """What examples/run_cpu_demo.sh writes, by its own two commands, under root."""
    models_cli(["--output-dir", str(root / "model"), "--preset", "tiny", "--vocab",
                "arithmetic", "--seed", "0"])  # fmt: skip
    spec = importlib.util.spec_from_file_location(
        "arith", REPO_ROOT / "examples/data/arithmetic.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--output-dir", str(root / "data"), "--seed", "0"])
    return root


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_a_fresh_directory_gets_the_demo_assets_of_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = files(script_outputs(tmp_path / "script"))
    capsys.readouterr()  # the script's own lines
    (tmp_path / "fresh").mkdir()
    monkeypatch.chdir(tmp_path / "fresh")
    config = default_config()  # builds, then checks the paths
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "built the demo inputs" in out
    for path in (DEMO_MODEL_PATH, DEMO_TRAIN_FILE, DEMO_VAL_FILE):
        assert path in out
    assert files(tmp_path / "fresh" / "outputs" / "demo") == expected  # byte for byte
    assert sorted(p.name for p in (tmp_path / "fresh" / "outputs" / "demo").iterdir()) == [
        "data",
        "model",
    ]  # no temporary directory left behind
    assert missing_demo_assets(config) == []
    default_config()  # a second run builds nothing and says nothing
    assert capsys.readouterr().out == ""


def test_only_the_missing_split_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    own_model = Path(DEMO_MODEL_PATH)  # someone's own model under the default path
    own_model.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json"):
        (own_model / name).write_text("{}")
    Path(DEMO_TRAIN_FILE).parent.mkdir(parents=True)
    Path(DEMO_TRAIN_FILE).write_bytes(b"mine")
    config = default_config("data.val_files=[]", "trainer.val_before_train=false")
    assert missing_demo_assets(config) == []
    with_val = default_config()
    assert Path(DEMO_TRAIN_FILE).read_bytes() == b"mine"
    assert Path(DEMO_VAL_FILE).stat().st_size > 0
    assert sorted(p.name for p in own_model.iterdir()) == ["config.json", "tokenizer.json"]
    assert missing_demo_assets(with_val) == []


def test_other_paths_that_do_not_exist_still_fail_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cases = [  # a run with any path of its own is not the demo: nothing is filled in
        (("data.train_files=[mine/train.parquet]",), r"data\.train_files: mine/train\.parquet"),
        (("data.val_files=[mine/test.parquet]",), r"data\.train_files: outputs/demo/data/train"),
        (("model.path=mine/model",), r"data\.train_files: outputs/demo/data/train\.parquet"),
    ]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message + ".* does not exist"):
            default_config(*overrides)
    assert not (tmp_path / "outputs").exists()


def test_the_agent_demo_builds_its_own_model_and_vault_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    tools = REPO_ROOT / "examples" / "agent" / "vault_tools.py"
    config = build_config(
        compose(
            "agent_demo",
            [f"rollout.agent.tools_file={tools}", f"reward.custom_path={tools}"],
        )
    )
    assert "built the demo inputs" in capsys.readouterr().out
    assert config.rollout.agent.enabled and config.model.path == "outputs/agent_demo/model"
    for path in ("outputs/agent_demo/model/config.json", "outputs/agent_demo/data/train.parquet"):
        assert (tmp_path / path).is_file(), path
    vocab = (tmp_path / "outputs/agent_demo/model/tokenizer.json").read_text()
    assert '"@"' in vocab and '"+"' not in vocab  # the agent vocabulary, not the arithmetic one
