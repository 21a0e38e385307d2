"""`ModelShape`: the sizes of a causal LM that memory accounting needs, without its weights.

A shape comes from a Hugging Face config, either read from a model directory or written
here for a named preset (the Qwen2.5 family, Qwen3-8B, Qwen3-30B-A3B, and the locally built
`tiny` / `bench-100m` models of hybrid.models). The model is constructed on the meta device
(no memory, well under a second even for 32B) and its `named_parameters()` give the exact
parameter shapes, in the order FSDP2, the weight sync and vLLM see them, with a tied LM head
listed once.

From the shapes follow everything the planner sizes: the FSDP2 shard of a rank (FSDP2 shards
dim 0 with `torch.chunk` semantics, so rank 0 holds ceil(rows / world) rows of every
parameter: the largest shard), the decoder layers (names `...layers.N...`), the root module's
parameters (embedding, final norm, LM head: gathered by FSDP2 for the whole forward), the
largest tensor and the LoRA adapters. The per-token sizes (KV cache, saved activations,
working sets) are methods too; their derivation is in docs/memory-model.md ("Saved
activations", "KV cache", "Generation").

It lives here, not in the planner (hybrid.planner), because the rollout engine sizes its KV
cache with it at start-up: a worker-side module may import it.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybrid.model_families import num_experts

ParamShape = tuple[str, tuple[int, ...]]

# Qwen2Config kwargs of the released Qwen2.5 models (their config.json files).
QWEN25_PRESETS: dict[str, dict[str, Any]] = {
    "Qwen2.5-0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True),
    "Qwen2.5-1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True),
    "Qwen2.5-3B": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                       num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
                       tie_word_embeddings=True),
    "Qwen2.5-7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       tie_word_embeddings=False),
    "Qwen2.5-14B": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
                        num_attention_heads=40, num_key_value_heads=8, vocab_size=152064,
                        tie_word_embeddings=False),
    "Qwen2.5-32B": dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
                        num_attention_heads=40, num_key_value_heads=8, vocab_size=152064,
                        tie_word_embeddings=False),
}  # fmt: skip
QWEN25_MAX_POSITIONS = 32768
# Qwen3Config kwargs of the released dense Qwen3 models (their config.json files); every
# attention has q_norm and k_norm, RMSNorms of head_dim over each head.
QWEN3_PRESETS: dict[str, dict[str, Any]] = {
    "Qwen3-8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     vocab_size=151936, tie_word_embeddings=False, rms_norm_eps=1e-6,
                     max_position_embeddings=40960),
}  # fmt: skip
# Qwen3MoeConfig kwargs of the released mixtures of experts (their config.json files).
QWEN3_MOE_PRESETS: dict[str, dict[str, Any]] = {
    "Qwen3-30B-A3B": dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                          num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                          head_dim=128, num_experts=128, num_experts_per_tok=8,
                          norm_topk_prob=True, vocab_size=151936, tie_word_embeddings=False,
                          max_position_embeddings=40960),
}  # fmt: skip
# Qwen2_5_VLConfig kwargs of the released vision-language models (their config.json files).
QWEN25_VL_PRESETS: dict[str, dict[str, Any]] = {
    "Qwen2.5-VL-7B": dict(
        text_config=dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                         num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                         max_position_embeddings=128000,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                          "mrope_section": [16, 24, 24]}),
        vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                           out_hidden_size=3584, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, window_size=112,
                           fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2),
        tie_word_embeddings=False),
}  # fmt: skip
TINY_PRESETS = ("tiny", "tiny-moe", "tiny-vl", "bench-100m")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def known_presets() -> tuple[str, ...]:
    return (
        *QWEN25_PRESETS,
        *QWEN3_PRESETS,
        *QWEN3_MOE_PRESETS,
        *QWEN25_VL_PRESETS,
        *TINY_PRESETS,
    )


@dataclass(frozen=True)
class ModelShape:
    name: str
    """The preset name or model directory it came from."""
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    params: tuple[ParamShape, ...]
    """(name, shape) of every distinct parameter, in `named_parameters()` order."""
    num_experts: int = 0
    """Routed experts per MoE layer (0: a dense model)."""
    experts_per_token: int = 0
    """Experts each token is routed to (top-k)."""

    # The planner asks for the same sizes thousands of times (hybrid.planner.suggest); the
    # caches below are keyed on the shape, whose hash is computed once instead of over every
    # parameter.
    @functools.cached_property
    def _hash(self) -> int:
        return hash((self.name, self.params))

    def __hash__(self) -> int:
        return self._hash

    @functools.cached_property
    def num_params(self) -> int:
        return count(self.params)

    @functools.cached_property
    def expert_params(self) -> int:
        """Elements of the routed experts' stacked tensors ([E, ...] under `mlp.experts.`)."""
        if not self.num_experts:
            return 0
        return sum(
            _numel(dims)
            for name, dims in self.params
            if ".mlp.experts." in name and dims and dims[0] == self.num_experts
        )

    @functools.cached_property
    def active_params(self) -> int:
        """Elements one token computes with: all but the routed experts it is not sent to."""
        if not self.num_experts:
            return self.num_params
        idle = self.expert_params * (self.num_experts - self.experts_per_token)
        return self.num_params - idle // self.num_experts

    @functools.cached_property
    def num_moe_layers(self) -> int:
        return len({layer_key(name) for name, _ in self.params if ".mlp.experts." in name})

    @functools.cached_property
    def layer_params(self) -> dict[str, int]:
        """Elements per decoder layer (`model.layers.3`) and per root parameter (alone)."""
        groups: dict[str, int] = {}
        for name, shape in self.params:
            key = layer_key(name)
            groups[key] = groups.get(key, 0) + _numel(shape)
        return groups

    @functools.cached_property
    def largest_layer(self) -> int:
        """Elements of the largest decoder layer (what FSDP2 unshards at once)."""
        return max(n for key, n in self.layer_params.items() if is_layer(key))

    def largest_pass_layer(self, ep_size: int = 1) -> int:
        """Elements of the largest decoder layer a rank holds whole in a pass: all of it under
        FSDP2, but only its own num_experts / ep experts of each stacked expert tensor with
        expert parallelism (hybrid.workers.expert_parallel: the other experts never come)."""
        if ep_size == 1 or not self.num_experts:
            return self.largest_layer
        experts: dict[str, int] = {}
        for name, dims in self.params:
            if ".mlp.experts." in name and dims and dims[0] == self.num_experts:
                experts[layer_key(name)] = experts.get(layer_key(name), 0) + _numel(dims)
        return max(
            n - experts.get(key, 0) + experts.get(key, 0) // ep_size
            for key, n in self.layer_params.items()
            if is_layer(key)
        )

    @functools.cached_property
    def root_params(self) -> int:
        """Elements outside the decoder layers: embedding, final norm, untied LM head."""
        return sum(n for key, n in self.layer_params.items() if not is_layer(key))

    @functools.cached_property
    def largest_tensor(self) -> tuple[str, int]:
        return max(((name, _numel(shape)) for name, shape in self.params), key=lambda t: t[1])

    @functools.cached_property
    def norm_params(self) -> int:
        """Normalisation weights: replicated, not split, by vLLM's tensor parallelism."""
        return sum(_numel(shape) for name, shape in self.params if "norm" in name)

    def lora_params(self, rank: int) -> tuple[ParamShape, ...]:
        """Adapters A (rank, in) and B (out, rank) on every q,k,v,o,gate,up,down weight."""
        return _lora_params(self, rank)

    def adapters(self, rank: int) -> int:
        """Elements of the rank-`rank` adapters (0 for rank 0)."""
        return count(self.lora_params(rank)) if rank else 0

    def shard(self, world: int, lora_rank: int = 0) -> int:
        """Elements of rank 0's FSDP2 shard of the parameters (of the adapters with LoRA)."""
        return _shard(self, world, lora_rank, largest=False)

    def largest_shard(self, world: int, lora_rank: int = 0) -> int:
        """The largest single parameter's shard (what a for-loop optimizer's temporary is)."""
        return _shard(self, world, lora_rank, largest=True)

    def value_model(self) -> ModelShape:
        """The critic built from this decoder: the LM head replaced by a scalar value head
        (`score`, (1, h) and a bias), as transformers' token-classification class has it."""
        h = self.hidden_size
        kept = tuple((name, dims) for name, dims in self.params if name != "lm_head.weight")
        head = (("score.weight", (1, h)), ("score.bias", (1,)))
        return dataclasses.replace(
            self, name=f"{self.name} (value model)", tied_embeddings=False, params=kept + head
        )

    # Per-token sizes (bytes); `cb` is the compute dtype's size. The derivation is in
    # docs/memory-model.md, "Saved activations", "KV cache" and "Generation".

    def kv_bytes_per_token(self, tp: int) -> int:
        """K and V of every layer in bf16, KV heads split by tensor parallelism."""
        return 2 * self.num_layers * max(1, self.num_kv_heads // tp) * self.head_dim * 2

    def layer_activations(self, cb: int) -> int:
        """What one decoder layer saves for backward, per token (A)."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        return 8 * h + cb * (5 * h + 2 * kv + 4 * self.intermediate_size)

    def saved_activations(self, cb: int, checkpointed: bool) -> int:
        """What a forward with grad saves per token: every layer (or, checkpointed, every
        layer's input) and the final norm."""
        h = self.hidden_size
        per_layer = h * cb if checkpointed else self.layer_activations(cb)
        return self.num_layers * per_layer + 4 * h + h * cb

    def layer_backward(self, cb: int, checkpointed: bool) -> int:
        """One decoder layer's backward working set per token: the activation gradients, and
        with checkpointing the layer's recomputed activations."""
        recompute = self.layer_activations(cb) if checkpointed else 0
        return recompute + (2 * self.hidden_size + 3 * self.intermediate_size) * cb

    def nograd_layer(self, cb: int) -> int:
        """A decoder layer's working set per token in a no-grad forward."""
        return 4 * self.hidden_size + cb * (3 * self.hidden_size + 3 * self.intermediate_size)

    def engine_forward(self, tp: int) -> int:
        """vLLM's forward working set per token (bf16, MLP split by tensor parallelism)."""
        return (6 * self.hidden_size + 6 * self.intermediate_size // tp) * 2


LAYER_LISTS = ("layers", "blocks")
"""Module lists whose items FSDP2 shards as units: decoder layers, a vision tower's blocks."""


def layer_key(name: str) -> str:
    """`model.layers.3.mlp.up_proj.weight` -> `model.layers.3` (`model.visual.blocks.0.*` ->
    `model.visual.blocks.0`); other names stand alone (the grouping of
    hybrid.sharding.gather's `layer` mode)."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part in LAYER_LISTS and parts[i + 1].isdigit():
            return ".".join(parts[: i + 2])
    return name


def is_layer(key: str) -> bool:
    return key.rsplit(".", 1)[-1].isdigit()


def count(params: tuple[ParamShape, ...]) -> int:
    return sum(_numel(shape) for _, shape in params)


@functools.cache
def _lora_params(shape: ModelShape, rank: int) -> tuple[ParamShape, ...]:
    adapters: list[ParamShape] = []
    for name, dims in shape.params:
        module = name.removesuffix(".weight")
        if len(dims) == 2 and module.rsplit(".", 1)[-1] in LORA_TARGETS:
            out_features, in_features = dims
            adapters.append((f"{module}.lora_A.weight", (rank, in_features)))
            adapters.append((f"{module}.lora_B.weight", (out_features, rank)))
    return tuple(adapters)


@functools.cache
def _shard(shape: ModelShape, world: int, lora_rank: int, largest: bool) -> int:
    """FSDP2 shards dim 0 like torch.chunk: rank 0 holds ceil(rows / world) rows (the most)."""
    params = shape.lora_params(lora_rank) if lora_rank else shape.params
    sizes = [-(-dims[0] // world) * (_numel(dims) // dims[0]) if dims else 1 for _, dims in params]
    return max(sizes, default=0) if largest else sum(sizes)


def model_shape(path_or_preset: str) -> ModelShape:
    """The shape of a named preset (see `known_presets()`) or of a HF model directory."""
    return _cached_shape(path_or_preset)


@functools.cache
def _cached_shape(path_or_preset: str) -> ModelShape:
    return shape_from_config(path_or_preset, _hf_config(path_or_preset))


def _hf_config(path_or_preset: str) -> Any:
    from transformers import AutoConfig, Qwen2_5_VLConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    if path_or_preset in QWEN25_PRESETS:
        return Qwen2Config(
            **QWEN25_PRESETS[path_or_preset], max_position_embeddings=QWEN25_MAX_POSITIONS
        )
    if path_or_preset in QWEN3_PRESETS:
        return Qwen3Config(**QWEN3_PRESETS[path_or_preset])
    if path_or_preset in QWEN3_MOE_PRESETS:
        return Qwen3MoeConfig(**QWEN3_MOE_PRESETS[path_or_preset])
    if path_or_preset in QWEN25_VL_PRESETS:
        return Qwen2_5_VLConfig(**QWEN25_VL_PRESETS[path_or_preset])
    if path_or_preset in TINY_PRESETS:
        from hybrid.models import TinyModelConfig, hf_config

        return hf_config(TinyModelConfig.preset(path_or_preset))  # type: ignore[arg-type]
    path = Path(path_or_preset)
    if not path.is_dir():
        raise ValueError(
            f"{path_or_preset!r} is neither a known preset ({', '.join(known_presets())}) "
            "nor a model directory"
        )
    if not (path / "config.json").is_file():
        raise ValueError(f"model directory {path} has no config.json")
    return AutoConfig.from_pretrained(path)


def shape_from_config(name: str, config: Any) -> ModelShape:
    """Build the model on the meta device (no memory) and read its parameter shapes. A
    vision-language model's sizes are its language model's; its vision tower's parameters
    are among `params` (sharded and gathered with the rest)."""
    import torch

    from hybrid.models.classes import auto_model_class

    with torch.device("meta"):
        model = auto_model_class(config).from_config(config)
    config = config.get_text_config()
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    experts = num_experts(config)
    top_k = int(getattr(config, "num_experts_per_tok", 0) or 0) if experts else 0
    return ModelShape(
        name=name,
        hidden_size=config.hidden_size,
        intermediate_size=_mlp_width(config, top_k),
        num_layers=config.num_hidden_layers,
        num_attention_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        vocab_size=config.vocab_size,
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        params=tuple((n, tuple(p.shape)) for n, p in model.named_parameters()),
        num_experts=experts,
        experts_per_token=top_k,
    )


def _mlp_width(config: Any, top_k: int) -> int:
    """The intermediate width a token's MLP computes through, for the per-token sizes: a
    dense layer's, or a MoE layer's top-k experts and shared expert side by side, whichever
    is wider."""
    dense = int(config.intermediate_size)
    if not top_k:
        return dense
    routed = top_k * int(config.moe_intermediate_size)
    shared = int(getattr(config, "shared_expert_intermediate_size", 0) or 0)
    return max(dense, routed + shared)


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count
