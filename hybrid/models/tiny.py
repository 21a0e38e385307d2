"""Deterministic builder of small decoder checkpoints (weights, configs, tokenizer) on local disk.

Owns `build_tiny_model`: a complete Hugging Face model directory that
`AutoModelForCausalLM`, `AutoTokenizer` and vLLM load without network, for the families of
`TinyModelConfig.architecture` (Qwen2, Llama, Mistral, Qwen3, Qwen3-MoE, Qwen2-MoE), each with
its own defaults for attention biases and norms (`hf_config`); the tokenizer is the same for
all. Mixtures of experts are written in the Hub's layout (one key per expert and projection),
as released checkpoints are (hybrid.models.state_dict). Weights are drawn
tensor by tensor from a private `torch.Generator` seeded with `seed` (the global RNG is never
touched), in parameter-name order, in fp32 and then cast to the checkpoint dtype; no model is
materialised (shapes come from a meta-device model), so the ~100M benchmark model builds in
about a second. Same config + seed gives byte-identical files; the init (normal(0,
initializer_range) matrices, zero biases, unit norms) is ours, not transformers', so it does
not change with the transformers version. Files already in `output_dir` with the same names
are overwritten; other files are left alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import (
    GenerationConfig,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3Config,
    Qwen3MoeConfig,
)
from transformers.models.qwen2_vl import Qwen2VLConfig, Qwen2VLImageProcessorPil

from hybrid.models.classes import auto_model_class
from hybrid.models.config import IMAGE_MIN_PIXELS, TinyModelConfig
from hybrid.models.state_dict import adapter_for
from hybrid.models.tokenizer import (
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
    IMAGE_PAD_TOKEN,
    PAD_TOKEN_ID,
    VIDEO_PAD_TOKEN,
    VISION_END_TOKEN,
    VISION_START_TOKEN,
    build_tokenizer,
    save_tokenizer,
    vocab_size,
)

WEIGHTS_NAME = "model.safetensors"
_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
_DEFAULT_CONFIG = TinyModelConfig()


def _common_kwargs(config: TinyModelConfig) -> dict[str, Any]:
    """The transformers config fields every family shares."""
    return dict(
        vocab_size=vocab_size(config.vocab, config.is_vision),
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        initializer_range=config.initializer_range,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        rms_norm_eps=1e-6,
        dtype=_DTYPES[config.dtype],
        bos_token_id=BOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
    )


def qwen2_config(config: TinyModelConfig) -> Qwen2Config:
    """The Qwen2Config of a qwen2 `config` (q/k/v projections with bias, no sliding window)."""
    if config.architecture != "qwen2":
        raise ValueError(f"qwen2_config needs architecture 'qwen2', got {config.architecture!r}")
    return Qwen2Config(
        architectures=["Qwen2ForCausalLM"],
        **_common_kwargs(config),
        max_window_layers=config.num_hidden_layers,
    )


def hf_config(config: TinyModelConfig) -> PretrainedConfig:
    """The transformers config of the model `config` describes (vocab_size from its tokenizer),
    with each family's own defaults: biases on q/k/v for Qwen2 only, q/k norms for Qwen3, no
    sliding window anywhere (vLLM's CPU attention and our log-prob checks assume full
    attention). head_dim is written out where the family reads it from the config."""
    if config.architecture == "qwen2":
        return qwen2_config(config)
    common = _common_kwargs(config)
    if config.architecture == "llama":
        return LlamaConfig(
            architectures=["LlamaForCausalLM"],
            **common,
            head_dim=config.head_dim,
            attention_bias=False,
            mlp_bias=False,
        )
    if config.architecture == "mistral":
        return MistralConfig(
            architectures=["MistralForCausalLM"],
            **common,
            head_dim=config.head_dim,
            sliding_window=None,
        )
    if config.is_moe:
        return _moe_config(config, common)
    if config.is_vision:
        return _vision_config(config, common)
    assert config.architecture == "qwen3", config.architecture
    return Qwen3Config(
        architectures=["Qwen3ForCausalLM"],
        **common,
        head_dim=config.head_dim,
        attention_bias=False,
        use_sliding_window=False,
        max_window_layers=config.num_hidden_layers,
    )


def _moe_config(config: TinyModelConfig, common: dict[str, Any]) -> PretrainedConfig:
    """Qwen3-MoE or Qwen2-MoE: every layer routed but `mlp_only_layers`, top-k weights
    renormalised, no auxiliary loss in the forward (RL runs set their own)."""
    experts: dict[str, Any] = dict(
        num_experts=config.num_experts,
        num_experts_per_tok=config.num_experts_per_tok,
        moe_intermediate_size=config.moe_intermediate_size,
        mlp_only_layers=list(config.mlp_only_layers),
        decoder_sparse_step=1,
        norm_topk_prob=True,
        output_router_logits=False,
        use_sliding_window=False,
        max_window_layers=config.num_hidden_layers,
    )
    if config.architecture == "qwen3_moe":
        return Qwen3MoeConfig(
            architectures=["Qwen3MoeForCausalLM"],
            **common,
            **experts,
            attention_bias=False,
        )
    assert config.architecture == "qwen2_moe", config.architecture
    return Qwen2MoeConfig(
        architectures=["Qwen2MoeForCausalLM"],
        **common,
        **experts,
        shared_expert_intermediate_size=config.moe_intermediate_size,
        qkv_bias=True,
    )


PATCH_SIZE = 14
MERGE_SIZE = 2
"""Qwen2-VL's patch (pixels per side) and merge (patches per side of one image token)."""


def _vision_config(config: TinyModelConfig, common: dict[str, Any]) -> PretrainedConfig:
    """Qwen2-VL: the decoder of `common` (q/k/v biases as Qwen2's, mRoPE over temporal,
    height and width sections of half the head) behind a vision tower whose merger writes
    the decoder's width; the vision token ids are the tokenizer's."""
    vocabulary = build_tokenizer(config.vocab, config.max_position_embeddings, vision=True)

    def ids(token: str) -> int:
        found = vocabulary.convert_tokens_to_ids(token)
        assert isinstance(found, int), token
        return found

    # Qwen2-VL's split of the rotary half: 1/4 temporal, 3/8 height, 3/8 width.
    half = config.head_dim // 2
    section = [half // 4, 3 * half // 8, half - half // 4 - 3 * half // 8]
    text = dict(common)
    text.pop("dtype")
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": config.rope_theta,
        "mrope_section": section,
    }
    text["max_window_layers"] = config.num_hidden_layers
    text["use_sliding_window"] = False
    vl_config: Any = Qwen2VLConfig  # its typed signature lacks the token ids it takes
    return vl_config(
        architectures=["Qwen2VLForConditionalGeneration"],
        text_config=text,
        vision_config=dict(
            depth=config.vision_depth,
            embed_dim=config.vision_embed_dim,
            hidden_size=config.hidden_size,
            num_heads=config.vision_num_heads,
            mlp_ratio=2,
            patch_size=PATCH_SIZE,
            spatial_merge_size=MERGE_SIZE,
            temporal_patch_size=2,
            in_channels=3,
            initializer_range=config.initializer_range,
        ),
        image_token_id=ids(IMAGE_PAD_TOKEN),
        video_token_id=ids(VIDEO_PAD_TOKEN),
        vision_start_token_id=ids(VISION_START_TOKEN),
        vision_end_token_id=ids(VISION_END_TOKEN),
        tie_word_embeddings=config.tie_word_embeddings,
        dtype=common["dtype"],
        bos_token_id=BOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
    )


def parameter_shapes(config: TinyModelConfig) -> dict[str, torch.Size]:
    """HF parameter names and shapes, in module order, tied weights listed once.

    Built on the meta device: no memory is allocated, whatever the size.
    """
    model_config = hf_config(config)
    with torch.device("meta"):
        model = auto_model_class(model_config).from_config(model_config)
    return {name: param.shape for name, param in model.named_parameters()}


def count_parameters(config: TinyModelConfig) -> int:
    """Number of distinct parameters (a tied LM head counts once)."""
    return sum(shape.numel() for shape in parameter_shapes(config).values())


def init_state_dict(config: TinyModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Freshly initialised weights keyed by the module's names and in its layout (experts
    stacked), in the checkpoint dtype, on CPU."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    dtype = _DTYPES[config.dtype]
    state: dict[str, torch.Tensor] = {}
    shapes = parameter_shapes(config)
    for name in sorted(shapes):  # sorted: the draw order does not follow module order
        shape = shapes[name]
        if name.endswith(("norm.weight", "norm1.weight", "norm2.weight", "ln_q.weight")):
            tensor = torch.ones(shape, dtype=dtype)
        elif name.endswith(".bias"):
            tensor = torch.zeros(shape, dtype=dtype)
        else:
            tensor = torch.empty(shape, dtype=torch.float32)
            tensor.normal_(0.0, config.initializer_range, generator=generator)
            tensor = tensor.to(dtype)
        state[name] = tensor
    return state


def build_tiny_model(
    output_dir: str | Path, config: TinyModelConfig = _DEFAULT_CONFIG, seed: int = 0
) -> Path:
    """Write config.json, generation_config.json, model.safetensors and the tokenizer files
    of a fresh model of `config.architecture` into `output_dir` (created if needed) and
    return it."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    model_config = hf_config(config)
    model_config.save_pretrained(output_dir)
    generation_config = GenerationConfig(
        bos_token_id=BOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID
    )
    generation_config.save_pretrained(output_dir)
    # The module's layout, written in the Hub's (per-expert keys for a mixture of experts).
    state = init_state_dict(config, seed)
    on_disk = {
        name: t.contiguous() for name, t in adapter_for(model_config).to_checkpoint(state.items())
    }
    save_file(on_disk, output_dir / WEIGHTS_NAME, metadata={"format": "pt"})
    tokenizer = build_tokenizer(config.vocab, config.max_position_embeddings, config.is_vision)
    # vLLM refuses a tokenizer larger than the embedding; ours are built to be equal.
    assert len(tokenizer) == getattr(model_config, "text_config", model_config).vocab_size
    save_tokenizer(tokenizer, output_dir)
    if config.is_vision:
        save_processor(tokenizer, config.image_max_pixels, output_dir)
    return output_dir


def save_processor(tokenizer: Any, max_pixels: int, output_dir: Path) -> None:
    """Write the Qwen2-VL image processor's config (the PIL one, with a pixel budget of
    `max_pixels`) beside the tokenizer: what transformers' AutoProcessor and vLLM load.
    (Qwen2VLProcessor itself cannot be built without torchvision, hybrid.models.vision.)"""
    images = Qwen2VLImageProcessorPil(
        min_pixels=IMAGE_MIN_PIXELS,
        max_pixels=max_pixels,
        patch_size=PATCH_SIZE,
        merge_size=MERGE_SIZE,
    )
    images.save_pretrained(output_dir)
