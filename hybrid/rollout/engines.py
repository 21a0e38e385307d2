"""The one place that builds rollout engines: `rollout.engine` picks the class.

  vllm  the in-process vLLM engine (hybrid.rollout.vllm_engine), the one runs use;
  toy   a deterministic engine over the Hugging Face model (hybrid.rollout.toy_engine), so the
        driver logic can be tested without vLLM.
Both take the same constructor arguments; each is imported only when asked for, so a toy run
never loads vLLM.
"""

from __future__ import annotations

from typing import Any

import torch

from hybrid.dtypes import Dtype
from hybrid.rollout.base import RolloutEngine
from hybrid.rollout.config import ENGINES, RolloutConfig
from hybrid.rollout.engine_args import EngineSite


def engine_class(name: str) -> type[RolloutEngine]:
    """The class behind `rollout.engine=name` (imported on demand), for what is asked before
    an engine exists (`supports_lora`)."""
    if name == "vllm":
        from hybrid.rollout.vllm_engine import VllmEngine

        return VllmEngine
    if name == "toy":
        from hybrid.rollout.toy_engine import ToyEngine

        return ToyEngine
    raise ValueError(f"rollout.engine must be one of {list(ENGINES)}, got {name!r}")


def make_engine(
    model_path: str,
    config: RolloutConfig,
    device: torch.device,
    dtype: Dtype,
    lora_rank: int = 0,
    site: EngineSite | None = None,
) -> RolloutEngine:
    """The `config.engine` engine for the model at `model_path`. `dtype` is the resolved
    engine dtype; `lora_rank` > 0 serves one LoRA adapter of that rank; `site` says where the
    engine runs (default: this process's device and LOCAL_RANK)."""
    engine: Any = engine_class(config.engine)
    return engine(model_path, config, device, dtype, lora_rank=lora_rank, site=site)
