"""`TinyModelConfig`: the typed, validated shape of a decoder model built locally.

Owns the architecture family (Qwen2, Llama, Mistral, Qwen3, the mixtures of experts
Qwen3-MoE and Qwen2-MoE, and the vision-language Qwen2-VL), the sizes, the vocabulary choice,
the checkpoint dtype and the named presets (`tiny` for tests and CPU runs, `tiny-moe` its
mixture-of-experts twin, `tiny-vl` its vision-language twin, `bench-100m` for benchmarks). No torch or transformers import here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, get_args

from hybrid.models.tokenizer import VOCAB_NAMES, VocabName

Architecture = Literal["qwen2", "llama", "mistral", "qwen3", "qwen3_moe", "qwen2_moe", "qwen2_vl"]
ARCHITECTURES: tuple[Architecture, ...] = get_args(Architecture)
MOE_ARCHITECTURES: tuple[Architecture, ...] = ("qwen3_moe", "qwen2_moe")
VISION_ARCHITECTURES: tuple[Architecture, ...] = ("qwen2_vl",)
TEXT_ARCHITECTURES: tuple[Architecture, ...] = tuple(
    a for a in ARCHITECTURES if a not in VISION_ARCHITECTURES
)
"""The causal-LM families (AutoModelForCausalLM builds them)."""
CheckpointDtype = Literal["bfloat16", "float32"]
PresetName = Literal["tiny", "tiny-moe", "tiny-vl", "bench-100m"]
MIN_HEAD_DIM = 32
IMAGE_MIN_PIXELS = 28 * 28
"""One merged patch (2 x 2 patches of 14 x 14): the smallest image a Qwen2-VL tower reads."""
MOE_SIZE_MULTIPLE = 32
"""vLLM's CPU expert kernels take hidden and expert widths that are multiples of 32."""


@dataclass(frozen=True)
class TinyModelConfig:
    """Family and sizes of a decoder built from scratch (defaults: the ~0.3M-parameter Qwen2
    test model)."""

    architecture: Architecture = "qwen2"
    """Hugging Face family, each with its own defaults (hybrid/models/tiny.py `hf_config`):
    "qwen2" (Qwen2ForCausalLM: q/k/v biases), "llama" (LlamaForCausalLM: no biases), "mistral"
    (MistralForCausalLM: no biases, sliding window off), "qwen3" (Qwen3ForCausalLM: no
    biases, RMS norms on q and k per head), and the mixtures of experts "qwen3_moe"
    (Qwen3MoeForCausalLM: Qwen3's attention, routed SwiGLU experts) and "qwen2_moe"
    (Qwen2MoeForCausalLM: Qwen2's attention, routed experts plus a gated shared expert).
    All are SwiGLU + RoPE + RMSNorm with GQA."""
    hidden_size: int = 128
    """Width of the residual stream."""
    num_hidden_layers: int = 2
    """Number of decoder layers."""
    num_attention_heads: int = 2
    """Query heads; head_dim = hidden_size / num_attention_heads must be >= 32."""
    num_key_value_heads: int = 1
    """Key/value heads (GQA); must divide num_attention_heads."""
    intermediate_size: int = 256
    """Width of the SwiGLU MLP."""
    max_position_embeddings: int = 512
    """Longest sequence (prompt + response) the model and tokenizer accept."""
    tie_word_embeddings: bool = True
    """Share the input embedding with the LM head (only `model.embed_tokens.weight` is saved)."""
    vocab: VocabName = "text"
    """Tokenizer vocabulary: "text" (all bytes, 272 ids, any string round-trips) or "arithmetic"
    (digits, + and =; 16 ids, for learnability experiments). See hybrid/models/tokenizer.py."""
    dtype: CheckpointDtype = "bfloat16"
    """dtype of the saved weights and of `dtype` in config.json. bfloat16 is what vLLM and the
    FSDP2 mixed-precision policy compute in, so both load the checkpoint without a cast;
    float32 is for exact-arithmetic CPU tests."""
    initializer_range: float = 0.02
    """Std of the normal init of every matrix (embeddings and linears); biases are 0, norms 1."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    num_experts: int = 4
    """Routed experts per MoE layer (mixture-of-experts families only)."""
    num_experts_per_tok: int = 2
    """Experts each token is routed to (top-k)."""
    moe_intermediate_size: int = 64
    """Width of each expert's SwiGLU MLP (and of Qwen2-MoE's shared expert)."""
    mlp_only_layers: tuple[int, ...] = (0,)
    """Layers that keep a dense MLP (of `intermediate_size`) among the MoE layers."""
    vision_depth: int = 1
    """Vision transformer blocks (vision-language families only)."""
    vision_embed_dim: int = 64
    """Width of the vision transformer (its heads are `vision_embed_dim / vision_num_heads`)."""
    vision_num_heads: int = 2
    """Attention heads of the vision transformer."""
    image_max_pixels: int = 56 * 56
    """The processor's pixel budget per image: larger images are scaled down to it (56 x 56:
    16 patches of 14 x 14, merged 2 x 2 into 4 image tokens)."""

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.head_dim < MIN_HEAD_DIM or self.head_dim % 2:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} gives head_dim "
                f"{self.head_dim} (hidden_size / num_attention_heads); it must be even and >= "
                f"{MIN_HEAD_DIM} because vLLM's CPU attention kernels reject smaller heads "
                "(head_dim 16 fails) and RoPE needs an even head_dim"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads ({self.num_key_value_heads}) must divide "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.architecture not in ARCHITECTURES:
            raise ValueError(
                f"architecture must be one of {ARCHITECTURES}, got {self.architecture!r}"
            )
        if self.vocab not in VOCAB_NAMES:
            raise ValueError(f"vocab must be one of {VOCAB_NAMES}, got {self.vocab!r}")
        if self.dtype not in get_args(CheckpointDtype):
            raise ValueError(
                f"dtype must be one of {get_args(CheckpointDtype)}, got {self.dtype!r}"
            )
        if not self.initializer_range > 0:
            raise ValueError(f"initializer_range must be > 0, got {self.initializer_range!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta!r}")
        if self.is_moe:
            self._check_experts()
        if self.is_vision:
            self._check_vision()

    @property
    def is_moe(self) -> bool:
        """A mixture-of-experts family."""
        return self.architecture in MOE_ARCHITECTURES

    @property
    def is_vision(self) -> bool:
        """A vision-language family (a vision tower before the decoder)."""
        return self.architecture in VISION_ARCHITECTURES

    def _check_vision(self) -> None:
        for name in ("vision_depth", "vision_embed_dim", "vision_num_heads", "image_max_pixels"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.vision_embed_dim % self.vision_num_heads:
            raise ValueError(
                f"vision_embed_dim ({self.vision_embed_dim}) must be divisible by "
                f"vision_num_heads ({self.vision_num_heads})"
            )
        if self.head_dim % 16:
            raise ValueError(
                f"head_dim {self.head_dim} must be a multiple of 16: mRoPE splits half of it "
                "1/4 temporal, 3/8 height, 3/8 width"
            )
        if self.image_max_pixels < IMAGE_MIN_PIXELS:
            raise ValueError(
                f"image_max_pixels={self.image_max_pixels} is below one merged patch "
                f"({IMAGE_MIN_PIXELS} pixels, 28 x 28)"
            )

    def _check_experts(self) -> None:
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.num_experts_per_tok}) must not exceed num_experts "
                f"({self.num_experts})"
            )
        for name in ("hidden_size", "moe_intermediate_size"):
            if getattr(self, name) % MOE_SIZE_MULTIPLE:
                raise ValueError(
                    f"{name}={getattr(self, name)} must be a multiple of {MOE_SIZE_MULTIPLE} in a "
                    "mixture of experts: vLLM's CPU expert kernels take no other width"
                )
        bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_hidden_layers]
        if bad:
            raise ValueError(
                f"mlp_only_layers {list(self.mlp_only_layers)} names layers {bad} outside "
                f"0..{self.num_hidden_layers - 1}"
            )
        if len(set(self.mlp_only_layers)) == self.num_hidden_layers:
            raise ValueError("mlp_only_layers covers every layer: the model would have no experts")

    @property
    def head_dim(self) -> int:
        """Per-head width: hidden_size // num_attention_heads."""
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def preset(cls, name: PresetName, **overrides: Any) -> TinyModelConfig:
        """A named size, optionally with some fields overridden.

        - "tiny": the defaults (hidden 128, 2 layers, 2 heads, 1 KV head), ~0.3M parameters.
        - "tiny-moe": the same shape as Qwen3-MoE, layer 0 dense, layer 1 with 4 experts of
          width 64, top-2 (`architecture="qwen2_moe"` adds the shared expert).
        - "tiny-vl": the "tiny" decoder as Qwen2-VL's language model behind a one-block
          vision tower of width 64 (images up to 56 x 56 pixels: 4 image tokens).
        - "bench-100m": hidden 768, 12 layers, 12 heads (head_dim 64), 4 KV heads,
          MLP 3072, 2048 positions: ~104M parameters, for benchmarks.
        "tiny" and "bench-100m" are Qwen2 unless `architecture` is overridden.
        """
        if name not in _PRESETS:
            raise ValueError(f"preset must be one of {tuple(_PRESETS)}, got {name!r}")
        return dataclasses.replace(_PRESETS[name], **overrides)


_PRESETS: dict[str, TinyModelConfig] = {
    "tiny": TinyModelConfig(),
    "tiny-moe": TinyModelConfig(architecture="qwen3_moe"),
    "tiny-vl": TinyModelConfig(architecture="qwen2_vl"),
    "bench-100m": TinyModelConfig(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        intermediate_size=3072,
        max_position_embeddings=2048,
    ),
}
