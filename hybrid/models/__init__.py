"""Locally built decoder models (Qwen2, Llama, Mistral, Qwen3) and character-level tokenizers
for tests and benchmarks.

`build_tiny_model(dir, TinyModelConfig.preset("tiny"), seed=0)` writes a complete Hugging
Face model directory (config, generation config, safetensors weights, byte-level tokenizer
with a ChatML template) that transformers and vLLM load offline; nothing is downloaded.
"""

from hybrid.models.config import ARCHITECTURES, Architecture, TinyModelConfig
from hybrid.models.tiny import (
    build_tiny_model,
    count_parameters,
    hf_config,
    init_state_dict,
    qwen2_config,
)
from hybrid.models.tokenizer import (
    TOKENIZER_FILES,
    build_tokenizer,
    has_tokenizer,
    load_tokenizer,
    unknown_characters,
    vocab_size,
)

__all__ = [
    "ARCHITECTURES",
    "TOKENIZER_FILES",
    "Architecture",
    "TinyModelConfig",
    "build_tiny_model",
    "build_tokenizer",
    "count_parameters",
    "has_tokenizer",
    "hf_config",
    "init_state_dict",
    "load_tokenizer",
    "qwen2_config",
    "unknown_characters",
    "vocab_size",
]
