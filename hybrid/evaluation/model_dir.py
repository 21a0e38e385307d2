"""Which Hugging Face directory an evaluation loads: the `model` argument resolved.

  a Hugging Face directory   config.json, weights, tokenizer: used as it is;
  a run's output directory   its `hf_model/` (trainer.export_hf writes it at the end of a run;
                             with LoRA the adapters merged into the base);
  a checkpoint               `<run>/checkpoints/step_N` (or the SFT stage's
                             `<run>/sft/checkpoints/step_N`): the actor's sharded state
                             (torch.distributed.checkpoint, hybrid/workers/checkpoint.py) is read
                             on this process, no FSDP workers needed, and written as bf16
                             safetensors (the run's own export: hybrid/workers/export.py) beside
                             the config and tokenizer of the run's base model, which the run's
                             config.json names (model.path).
A LoRA checkpoint (its state is peft's wrapped model) and a critic's are refused, naming what
to pass instead.
"""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from hybrid.models import TOKENIZER_FILES, has_tokenizer

RUN_EXPORT_DIR = "hf_model"
"""Where a run writes its exported actor (output_dir/hf_model)."""
CONVERTED_DIR = "hf_model"
"""Where a converted checkpoint goes, under the evaluation's output_dir."""
_DCP_METADATA = ".metadata"
_MODEL_PREFIX = "model."
"""The actor's tensors in a checkpoint's flattened state dict (hybrid/workers/checkpoint.py)."""

Kind = Literal["hf", "run_export", "checkpoint"]


@dataclass(frozen=True)
class ResolvedModel:
    path: str
    """The Hugging Face directory the engines and the tokenizer load."""
    kind: Kind
    given: str
    """The `model` argument as given."""

    def describe(self) -> str:
        if self.kind == "hf":
            return self.path
        what = "the run's export" if self.kind == "run_export" else "converted from checkpoint"
        return f"{self.path} ({what} {self.given})"


def resolve_model(given: str, output_dir: str | Path) -> ResolvedModel:
    """The directory to load for `given` (converting a checkpoint into output_dir/hf_model);
    a path that is none of the three is refused, naming what it holds."""
    path = Path(given)
    if not path.exists():
        raise FileNotFoundError(f"model: {given} does not exist")
    if not path.is_dir():
        raise ValueError(f"model: {given} is a file; pass a Hugging Face model directory")
    if (path / "config.json").is_file():
        check_hf_dir(path, given)
        return ResolvedModel(str(path), "hf", given)
    if (path / RUN_EXPORT_DIR / "config.json").is_file():
        check_hf_dir(path / RUN_EXPORT_DIR, given)
        return ResolvedModel(str(path / RUN_EXPORT_DIR), "run_export", given)
    if (path / _DCP_METADATA).is_file():
        target = Path(output_dir) / CONVERTED_DIR
        convert_checkpoint(path, target)
        return ResolvedModel(str(target), "checkpoint", given)
    if (path / "checkpoints").is_dir():
        raise ValueError(
            f"model: {given} is a run without {RUN_EXPORT_DIR}/ (trainer.export_hf=true writes "
            f"it); pass one of its checkpoints, {given}/checkpoints/step_N, to convert that"
        )
    held = sorted(p.name for p in path.iterdir())[:8]
    raise ValueError(
        f"model: {given} is no Hugging Face model directory (no config.json), no run (no "
        f"{RUN_EXPORT_DIR}/) and no checkpoint (no {_DCP_METADATA}); it holds {held or 'nothing'}"
    )


def check_hf_dir(path: Path, given: str) -> None:
    """A Hugging Face directory has weights and a tokenizer beside its config.json."""
    weights = [*path.glob("*.safetensors"), *path.glob("pytorch_model*.bin")]
    if not weights:
        raise ValueError(f"model: {path} has a config.json but no weights (*.safetensors)")
    if not has_tokenizer(path):
        raise ValueError(
            f"model: {path} has no tokenizer (one of {list(TOKENIZER_FILES)}): the prompts are "
            f"templated with the model's own tokenizer; save it beside the weights ({given})"
        )


def run_config(step_dir: Path) -> tuple[Path, dict[str, Any]]:
    """The config.json of the run a checkpoint belongs to (a run's, or its SFT stage's, one
    level further up)."""
    for run_dir in (step_dir.parent.parent, step_dir.parent.parent.parent):
        candidate = run_dir / "config.json"
        if candidate.is_file():
            try:
                return candidate, json.loads(candidate.read_text())
            except json.JSONDecodeError as error:
                raise ValueError(f"model: {candidate} is not valid JSON ({error})") from None
    raise ValueError(
        f"model: checkpoint {step_dir} has no run config.json two or three levels up (the "
        "run's output_dir), so its base model is unknown; pass a Hugging Face directory instead"
    )


def base_model_of(step_dir: Path) -> Path:
    """The run's model.path (its config and tokenizer); LoRA and critic checkpoints refused."""
    if step_dir.parent.name == "critic":
        raise ValueError(f"model: {step_dir} is a critic's checkpoint (a value model, no policy)")
    config_file, config = run_config(step_dir)
    model = config.get("model") or {}
    lora_rank = (model.get("lora") or {}).get("rank", 0)
    if lora_rank or (step_dir / "lora_adapter").is_dir():
        raise ValueError(
            f"model: {step_dir} is a LoRA checkpoint (model.lora.rank={lora_rank}); pass the "
            f"run's {RUN_EXPORT_DIR}/ (trainer.export_hf=true: the adapters merged into the base)"
        )
    base = model.get("path")
    if not isinstance(base, str) or not (Path(base) / "config.json").is_file():
        raise ValueError(
            f"model: the base model of {step_dir}, model.path={base!r} in {config_file}, is not "
            "a Hugging Face directory here; its config and tokenizer are needed beside the "
            "checkpoint's weights (run from the run's working directory)"
        )
    return Path(base)


def read_actor_state(step_dir: Path) -> dict[str, torch.Tensor]:
    """The actor's full tensors (Hugging Face names) from a sharded checkpoint, in this process
    (no process group: DCP reads every shard of each tensor); the optimizer is not read."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if not (step_dir / "manifest.json").is_file():
        raise ValueError(
            f"model: {step_dir} has no manifest.json: the save did not finish (a whole "
            "checkpoint has one); pass an earlier step"
        )
    metadata = dcp.FileSystemReader(str(step_dir)).read_metadata()
    tensors: dict[str, torch.Tensor] = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith(_MODEL_PREFIX) and isinstance(meta, TensorStorageMetadata):
            tensors[key[len(_MODEL_PREFIX) :]] = torch.empty(
                tuple(meta.size), dtype=meta.properties.dtype
            )
    if not tensors:
        raise ValueError(f"model: {step_dir} holds no actor tensors (no '{_MODEL_PREFIX}*' keys)")
    try:
        with warnings.catch_warnings():  # "assuming ... a single process": what is meant here
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load({"model": tensors}, checkpoint_id=str(step_dir), no_dist=True)
    except Exception as error:  # DCP wraps a missing or short shard in its own errors
        raise ValueError(f"model: checkpoint {step_dir} could not be read: {error}") from error
    return tensors


def convert_checkpoint(step_dir: Path, target: Path) -> Path:
    """Write the checkpoint's actor as a Hugging Face directory at `target` (replaced whole:
    written under a temporary name first)."""
    from transformers import AutoConfig

    from hybrid.workers.export import write_hf_model

    base = base_model_of(step_dir)
    tensors = read_actor_state(step_dir)
    if getattr(AutoConfig.from_pretrained(base), "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)  # a tied checkpoint stores it once, as the export
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    write_hf_model(tensors, base, tmp)
    (tmp / "converted_from.json").write_text(
        json.dumps({"checkpoint": str(step_dir), "base_model": str(base)}, indent=1)
    )
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target
