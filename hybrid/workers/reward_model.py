"""RewardModelWorker: a sequence-classification reward model, its own member of the WorkerDict
(`reward_model`), built and offloaded like the reference.

The model is any Hugging Face `*ForSequenceClassification` checkpoint with one label. It is
sharded by the same FSDP2 builder as the critic (`build_fsdp_model(value_head=True)`: the
decoder with a linear head per token), and its head is then loaded from the checkpoint with a
zero bias: at a row's last token that is exactly the sequence classifier's score, and reading
that position ourselves serves packed and padded inputs alike, whatever the pad id.

Rows are scored on the workers, not the driver: each rank decodes and re-tokenizes only its
own share of the rows (hybrid/workers/reward_inputs.py), so that work scales with the ranks and
the batch travels as it is, with no second set of token tensors. `check_reward_model` runs on
the driver before any worker starts and names `reward.model.*` for a bad checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from hybrid.controller import Dispatch, Worker, register
from hybrid.data import Batch
from hybrid.dtypes import resolve_dtype
from hybrid.memory.components import ByDevice, parameter_bytes
from hybrid.memory.ledger import process_ledger
from hybrid.models import TOKENIZER_FILES, has_tokenizer, load_tokenizer
from hybrid.rewards.config import RewardModelConfig
from hybrid.workers.config import HybridWorkerConfig
from hybrid.workers.frozen import build_frozen_model
from hybrid.workers.reward_inputs import encode_texts, packed, padded, render_texts
from hybrid.workers.value import head_scores

HEAD_KEY = "score.weight"
"""The sequence classifier's head (Qwen2, Llama, Mistral ...: a linear layer without bias)."""


def check_reward_model(config: RewardModelConfig) -> None:
    """Fail before any worker starts, naming the reward.model field, unless `path` holds a
    sequence classifier with one label that our FSDP builder can shard and a tokenizer whose
    ids its embedding covers."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
        MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
    )

    path = config.path
    assert path is not None, "check_reward_model needs reward.model.path"
    where = f"reward.model.path={path!r}"
    if not (Path(path) / "config.json").is_file():
        raise ValueError(f"{where}: no config.json there, so no Hugging Face model directory")
    try:
        model_config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as error:
        raise ValueError(f"{where}: config.json does not load: {error}") from None
    architectures = list(getattr(model_config, "architectures", None) or [])
    if not any(name.endswith("ForSequenceClassification") for name in architectures):
        raise ValueError(
            f"{where} is a {architectures or 'model without architectures'}, not a sequence "
            "classifier: a reward model is saved from AutoModelForSequenceClassification "
            "(e.g. Qwen2ForSequenceClassification) with num_labels=1"
        )
    kind = model_config.model_type
    if (
        kind not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES
        or kind not in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES
    ):
        raise ValueError(
            f"{where}: a {kind!r} model has no sequence- and token-classification classes in "
            "transformers, which the sharded reward model is built from; use a decoder such "
            "as Qwen2, Llama or Mistral"
        )
    if model_config.num_labels != 1:
        raise ValueError(
            f"{where}: num_labels is {model_config.num_labels}; a reward model gives one score "
            "per row (num_labels=1)"
        )
    tokenizer_dir = config.tokenizer_path or path
    field = "reward.model.tokenizer_path" if config.tokenizer_path else "reward.model.path"
    if not has_tokenizer(tokenizer_dir):
        raise ValueError(
            f"{field}={tokenizer_dir!r} has no tokenizer files (one of {list(TOKENIZER_FILES)}):"
            " save the reward model's tokenizer beside it, or set reward.model.tokenizer_path "
            "to the directory of the tokenizer it reads (e.g. the policy's model.path)"
        )
    tokenizer = load_tokenizer(tokenizer_dir)
    if len(tokenizer) > model_config.vocab_size:
        fallback = " (not its own: reward.model.tokenizer_path)" if config.tokenizer_path else ""
        raise ValueError(
            f"{where}: its embedding has {model_config.vocab_size} token ids, the tokenizer at "
            f"{tokenizer_dir}{fallback} has {len(tokenizer)}: ids past the embedding would "
            "be read; the reward model must be trained on that tokenizer's vocabulary"
        )


def checkpoint_tensor(model_dir: str, key: str) -> torch.Tensor:
    """One tensor of a (possibly sharded) safetensors checkpoint."""
    directory = Path(model_dir)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = [directory / json.loads(index.read_text())["weight_map"][key]]
    else:
        files = sorted(directory.glob("*.safetensors"))
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            if key in f.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                return f.get_tensor(key)
    raise ValueError(f"reward.model.path={model_dir!r}: the checkpoint has no {key!r}")


def load_sequence_head(model: torch.nn.Module, model_dir: str) -> None:
    """The checkpoint's score head into the sharded token-classification head, bias zero
    (rank 0 reads it; every rank must call)."""
    import torch.distributed as dist

    head: dict[str, Any] = {}
    if not dist.is_initialized() or dist.get_rank() == 0:
        weight = checkpoint_tensor(model_dir, HEAD_KEY)
        state = model.state_dict()
        head = {
            HEAD_KEY: weight.to(state[HEAD_KEY].dtype),
            "score.bias": torch.zeros(tuple(state["score.bias"].shape), dtype=weight.dtype),
        }
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    set_model_state_dict(model, head, options=options)


class RewardModelWorker(Worker):
    def __init__(self, config: HybridWorkerConfig) -> None:
        self.config = config
        # The process's ledger: shared with actor_rollout, which drains it.
        self.ledger = process_ledger(self.rank, self.rank_env.node)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        c, rm = self.config, self.config.reward_model
        if rm.path is None:
            raise ValueError("reward.model.path is null: the reward model member is off")
        frozen = build_frozen_model(
            c,
            self.rank_env,
            rm.path,
            lambda hardware: resolve_dtype(rm.precision.param_dtype, "trainer", hardware),
            rm.offload.param_offload,
            value_head=True,
        )
        self.model, self.device, self.offloader = frozen.model, frozen.device, frozen.offloader
        self.sp = frozen.sp
        load_sequence_head(self.model, rm.path)
        self.policy_tokenizer = load_tokenizer(c.model.path)
        self.tokenizer = load_tokenizer(rm.tokenizer_path or rm.path)
        self.templated = bool(getattr(self.tokenizer, "chat_template", None))
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else 0)  # masked out either way
        self.ledger.track("reward_model", self._components)
        self.offloader.offload_params()
        self.ledger.record("init/reward_model")

    def _components(self) -> dict[str, ByDevice]:
        return {"reward_model_params": parameter_bytes(self.model)}

    def encode(self, batch: Batch) -> tuple[list[list[int]], list[bool]]:
        """This rank's rows in the reward model's tokens (the last max_length of each)."""
        texts = render_texts(batch, self.policy_tokenizer, self.tokenizer)
        rm = self.config.reward_model
        return encode_texts(texts, self.tokenizer, rm.max_length, self.templated)

    @register(dispatch_mode=Dispatch.TRAIN_DP)
    def compute_rm_score(self, batch: Batch) -> Batch:
        """One score per row (rm_scores, float32) and whether its text was cut to
        reward.model.max_length tokens (rm_truncated, 0/1)."""
        ids, truncated = self.encode(batch)
        size = self.config.reward_model.micro_batch_size
        scores = torch.zeros(len(ids), dtype=torch.float32)
        # Every rank holds as many rows (the dispatch pads), so every rank runs as many
        # forwards: FSDP's all-gathers pair up.
        with self.offloader.phase("reward_model", self.ledger), torch.no_grad():
            for start in range(0, len(ids), size):
                scores[start : start + size] = self.forward(ids[start : start + size]).cpu()
            self.ledger.record("reward_model/forward", reuse_components=True)
        flags = torch.tensor(truncated, dtype=torch.float32)
        return Batch.from_dict({"rm_scores": scores, "rm_truncated": flags})

    def forward(self, ids: list[list[int]]) -> torch.Tensor:
        """(rows,) scores of one micro-batch: the head's output at each row's last token."""
        use_packing = self.config.model.use_remove_padding
        inputs = (
            packed(ids, self.device) if use_packing else padded(ids, self.pad_token_id, self.device)
        )
        return head_scores(self.model, inputs, self.sp)
