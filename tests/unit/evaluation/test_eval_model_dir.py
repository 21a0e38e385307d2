"""What `model=` may name (hybrid/evaluation/model_dir.py): a Hugging Face directory, a run
with its hf_model/ export, or a checkpoint, whose sharded actor state is converted in this
process into the same files the run's own export writes; what it cannot use is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hybrid.evaluation.model_dir import resolve_model
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.trainer.checkpoints import checkpoint_dir, write_manifest
from hybrid.workers.checkpoint import save_checkpoint

pytestmark = pytest.mark.unit


def hf_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json"):
        (path / name).write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    return path


def test_a_directory_is_taken_as_it_is_or_for_its_export(tmp_path: Path) -> None:
    model = hf_dir(tmp_path / "hf")
    assert resolve_model(str(model), tmp_path / "out").kind == "hf"
    (model / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"has no tokenizer"):
        resolve_model(str(model), tmp_path / "out")
    (model / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"has a config\.json but no weights"):
        resolve_model(str(model), tmp_path / "out")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"a run without hf_model/ .*checkpoints/step_N"):
        resolve_model(str(run), tmp_path / "out")
    hf_dir(run / "hf_model")
    resolved = resolve_model(str(run), tmp_path / "out")
    assert (resolved.kind, resolved.path) == ("run_export", str(run / "hf_model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"no Hugging Face model directory .* holds nothing"):
        resolve_model(str(tmp_path / "empty"), tmp_path / "out")
    with pytest.raises(FileNotFoundError, match=r"model: /no/where does not exist"):
        resolve_model("/no/where", tmp_path / "out")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_checkpoint_converts_to_the_weights_it_holds(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    base = build_tiny_model(
        tmp_path / "base", TinyModelConfig.preset("tiny", vocab="arithmetic"), seed=0
    )
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.25)  # trained: the checkpoint's weights are not the base's
    run = tmp_path / "run"
    step = checkpoint_dir(run, 7)
    save_checkpoint(step, model, None, {"step": 7})  # the layout the FSDP actor writes
    (run / "config.json").write_text(json.dumps({"model": {"path": str(base), "lora": {}}}))
    with pytest.raises(ValueError, match=r"no manifest\.json: the save did not finish"):
        resolve_model(str(step), tmp_path / "out")
    write_manifest(step, 7, None)

    resolved = resolve_model(str(step), tmp_path / "out")

    assert (resolved.kind, resolved.path) == ("checkpoint", str(tmp_path / "out" / "hf_model"))
    written = load_file(Path(resolved.path) / "model.safetensors")
    expected = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    expected.pop("lm_head.weight")  # tied: stored once, as the run's export does
    assert sorted(written) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(written[name], tensor), name
    assert (Path(resolved.path) / "tokenizer.json").is_file()


def test_checkpoints_it_cannot_use_are_named(tmp_path: Path) -> None:
    run = tmp_path / "run"
    step = checkpoint_dir(run, 5)
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(b"")
    with pytest.raises(ValueError, match=r"no run config\.json .* base model is unknown"):
        resolve_model(str(step), tmp_path / "out")
    config = {"model": {"path": str(tmp_path / "base"), "lora": {"rank": 8}}}
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"LoRA checkpoint .* pass the run's hf_model/"):
        resolve_model(str(step), tmp_path / "out")
    config["model"]["lora"] = {"rank": 0}
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"model\.path=.*base.* is not a Hugging Face directory"):
        resolve_model(str(step), tmp_path / "out")
    critic = run / "checkpoints" / "critic" / "step_5"
    critic.mkdir(parents=True)
    (critic / ".metadata").write_bytes(b"")
    with pytest.raises(ValueError, match=r"a critic's checkpoint"):
        resolve_model(str(critic), tmp_path / "out")
