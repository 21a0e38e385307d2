"""Building an FSDP2-sharded Hugging Face causal LM, its optimizer and its clipped step.

Owns `build_fsdp_model` (the policy actor, the frozen reference policy and the critic share
it: the critic is the same decoder with a scalar value head instead of the LM head),
`build_optimizer` and `clip_and_step`. The model is built the torchtitan way, so that no rank
ever materialises the whole model in fp32 more than once:

1. construct it on the meta device (no memory) in the master dtype;
2. `fully_shard` each decoder layer, then the root, on a 1-D "fsdp" mesh (or a 2-D
   (replicate, shard) mesh: HSDP) with a `MixedPrecisionPolicy` (bf16 compute, fp32
   gradient reduction by default); a model replicated on every rank stays a plain module
   instead (hybrid.workers.replicated);
3. `to_empty` allocates only this rank's shards, then tied embeddings are re-tied and the
   non-persistent RoPE buffers (which `to_empty` leaves as uninitialised memory) recomputed;
4. rank 0 alone reads the safetensors files and `set_model_state_dict(...,
   broadcast_from_rank0=True)` streams them tensor by tensor to every rank's shards; the
   family's state-dict adapter (hybrid.models.state_dict) builds the module's tensors from
   the checkpoint's (a Hub mixture of experts: per-expert keys stacked per layer).

Every rank validates the checkpoint's key set from the safetensors headers (metadata only)
before any collective, so a bad checkpoint raises the same error everywhere instead of
leaving the other ranks waiting in a broadcast.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import safe_open
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, AutoModelForTokenClassification
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from hybrid.model_families import is_vision, num_experts
from hybrid.models.classes import auto_model_class
from hybrid.models.state_dict import StateDictAdapter, adapter_for
from hybrid.sharding.lora_files import hf_name, is_lora_name
from hybrid.workers import varlen_attention
from hybrid.workers.attention import AttnChoice, flash_attn_installed, resolve_attn_implementation
from hybrid.workers.compiled_blocks import compile_blocks
from hybrid.workers.config import LoraConfig
from hybrid.workers.expert_parallel import parallelize_experts
from hybrid.workers.fused_kernels import apply_fused_kernels
from hybrid.workers.kernels import KernelPlan
from hybrid.workers.lora import add_adapters, initial_adapter
from hybrid.workers.replicated import average_gradients, replicated_plainly

_SAFETENSORS_INDEX = "model.safetensors.index.json"
_LM_HEAD_KEY = "lm_head.weight"
VISION_ATTENTION = "sdpa"
"""The vision tower's attention: bidirectional within each image, which it splits itself
(the decoder's packed varlen kernel is causal and reads the text's sequence bounds)."""
VALUE_HEAD_KEYS = frozenset({"score.weight", "score.bias"})
"""The value head of a critic (transformers' token-classification head with one label)."""
VALUE_HEAD_SEED = 0
EXPERTS_KERNEL = "grouped_mm"
"""transformers' experts implementation for mixture-of-experts models."""


def build_fsdp_model(
    model_path: str,
    mesh: DeviceMesh,
    device: torch.device,
    *,
    param_dtype: torch.dtype = torch.bfloat16,
    reduce_dtype: torch.dtype = torch.float32,
    master_dtype: torch.dtype = torch.float32,
    attn_implementation: AttnChoice = "auto",
    gradient_checkpointing: bool = False,
    trainable: bool = True,
    lora: LoraConfig | None = None,
    value_head: bool = False,
    expert_mesh: DeviceMesh | None = None,
    sp_size: int = 1,
    freeze_vision_tower: bool = False,
    kernels: KernelPlan | None = None,
    plain_replicas: bool = True,
) -> nn.Module:
    """The causal LM at `model_path`, sharded over `mesh`, weights loaded. A 1-D mesh shards
    over every rank; a 2-D (replicate, shard) mesh is HSDP: sharded along its second dim,
    replicated along its first; a (replicas, 1) mesh leaves the model a plain module on every
    rank where hybrid.workers.replicated says so (its trainer averages the gradients:
    `gradient_replicas`; `plain_replicas=False` keeps FSDP2 there, as profiling/
    bench_replication.py compares). `value_head=True` builds a critic: the decoder of the
    checkpoint with a scalar head per token (`score`; its `logits` are values, (.., 1)); a
    causal LM checkpoint's LM head is left out and the value head starts from a seeded normal
    init, a critic checkpoint's own head is loaded.

    `param_dtype` is the compute dtype (parameters are all-gathered in it), `reduce_dtype` the
    dtype gradients are reduce-scattered in, `master_dtype` the dtype of the sharded parameters
    the optimizer updates. `trainable=False` gives the frozen reference policy: eval mode, no
    parameter requires grad. An `expert_mesh` ((efsdp, ep), hybrid.workers.expert_parallel)
    puts a mixture of experts' stacked experts on it, owned by ep ranks, instead of FSDP2
    sharding them over `mesh` (ignored for a dense model). `sp_size` > 1: the passes split
    sequences (hybrid.workers.sequence_parallel), so the attention is the varlen sdpa Ulysses
    wraps. A vision-language checkpoint builds the image-text-to-text model, its vision
    tower's blocks and the tower itself sharded as units of their own (frozen with
    `freeze_vision_tower`). `kernels` (hybrid.workers.kernels, from `plan_kernels`): liger's
    fused ops patched in before sharding, each decoder layer compiled once loaded; None:
    eager. With `lora` enabled the result is a peft model (hybrid.workers.lora):
    the frozen base stored in `param_dtype`, only the adapters in `master_dtype` and trainable.
    Every rank of `mesh` must call this collectively.
    """
    kernel: str = resolve_attn_implementation(
        attn_implementation,
        flash_installed=flash_attn_installed(),
        on_cuda=device.type == "cuda",
        sp=sp_size,
    )
    if kernel == "sdpa":  # the same kernel, without a dense mask when packed
        kernel = varlen_attention.register()
    if mesh.ndim not in (1, 2):
        raise ValueError(
            f"mesh must be 1-D (FSDP) or 2-D (HSDP: replicate, shard), got {mesh.ndim} dims"
        )
    files = _safetensors_files(Path(model_path))
    config = AutoConfig.from_pretrained(model_path)
    with_lora = lora is not None and lora.enabled
    vision = is_vision(config)
    model_class: Any = auto_model_class(config)
    if value_head:
        if vision:
            raise ValueError(
                f"a critic or reward model of the vision-language model at {model_path}: "
                "value heads are built on text-only decoders here"
            )
        model_class = AutoModelForTokenClassification
        config.num_labels = 1
        config.classifier_dropout = 0.0  # values regress returns: no dropout noise
    implementations: dict[str, Any] = {"attn_implementation": kernel}
    if vision:
        implementations["attn_implementation"] = {
            "": kernel,
            "text_config": kernel,
            "vision_config": VISION_ATTENTION,
        }
    if num_experts(config):
        # One grouped GEMM per projection for all experts (torch has it on CPU too), not a
        # Python loop over the experts.
        implementations["experts_implementation"] = EXPERTS_KERNEL
    with torch.device("meta"):
        model = model_class.from_config(config, dtype=master_dtype, **implementations)
    if freeze_vision_tower and vision:
        vision_tower(model).requires_grad_(False)
    if kernels is not None and kernels.fused_ops:
        apply_fused_kernels(model, str(config.model_type), kernels.fused_ops)
    expert_params: set[nn.Parameter] | None = None
    if expert_mesh is not None and num_experts(config):
        expert_params = parallelize_experts(model, expert_mesh, param_dtype, world=mesh.size())
    tied = not value_head and bool(getattr(model.config, "tie_word_embeddings", False))
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if trainable:
        # The KV cache is for generation; training forwards never read it.
        model.config.use_cache = False
    else:
        model.requires_grad_(False)
    model.train(trainable)
    hf_model = model
    if with_lora:
        assert lora is not None
        model = add_adapters(model, lora, base_dtype=param_dtype, adapter_dtype=master_dtype)

    plain = plain_replicas and replicated_plainly(
        tuple(mesh.shape),
        param_dtype=param_dtype,
        master_dtype=master_dtype,
        lora=with_lora,
        experts=expert_params is not None,
        sp_size=sp_size,
    )
    if not plain:
        _shard(model, hf_model, mesh, param_dtype, reduce_dtype, expert_params)

    model.to_empty(device=device)
    if tied:
        hf_model.tie_weights()
        embed, head = hf_model.get_input_embeddings(), hf_model.get_output_embeddings()
        assert head is not None and embed.weight is head.weight, "tied embeddings came untied"
        assert plain or isinstance(embed.weight, DTensor), "tied embedding is not sharded"
    _init_rope_buffers(model, device)
    _load_weights(
        model,
        files,
        adapter_for(config),
        embed_key=_parameter_name(hf_model, hf_model.get_input_embeddings().weight),
        tied=tied,
        lora_seed=0 if with_lora else None,
        value_head=value_head,
    )
    if kernels is not None and kernels.compile:
        names = {id(module): name for name, module in hf_model.named_modules()}
        compile_blocks(
            [(names[id(layer)], layer) for layer in decoder_layers(hf_model)],
            kernels.owner,
            required=kernels.compile_required,
        )
    return model


def _shard(
    model: nn.Module,
    hf_model: nn.Module,
    mesh: DeviceMesh,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    expert_params: set[nn.Parameter] | None,
) -> None:
    """`fully_shard` each unit of `hf_model`, then the root `model` (the peft model around it
    with LoRA), on `mesh`; `expert_params` stay on their own mesh."""
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for layer in sharded_units(hf_model):
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy, ignored_params=expert_params)
    # By default FSDP2 keeps the root's parameters (embedding, final norm, LM head) unsharded
    # after forward, expecting a backward to follow; after a no_grad forward (log-probs, the
    # reference policy) they would stay gathered and `model.parameters()` would yield plain
    # tensors instead of DTensor shards. Resharding the root too keeps the invariant at the
    # price of one more all-gather of the root's parameters in backward.
    fully_shard(
        model,
        mesh=mesh,
        mp_policy=mp_policy,
        reshard_after_forward=True,
        ignored_params=expert_params,
    )


def vision_tower(model: nn.Module) -> nn.Module:
    """A vision-language model's vision tower (`model.visual` in transformers 5's layout)."""
    base = getattr(model, "model", model)
    tower = getattr(base, "visual", None)
    if tower is None:
        raise ValueError(f"{type(model).__name__} has no vision tower (model.visual)")
    return tower


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers wherever the family keeps them: `model.layers` (causal LMs),
    `model.language_model.layers` (vision-language models)."""
    base: Any = model.model
    layers: nn.ModuleList = getattr(base, "language_model", base).layers
    return layers


def sharded_units(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP2 shards as units of their own before the root: each decoder layer,
    and for a vision-language model each vision block and then the tower (its patch
    embedding and merger)."""
    units: list[nn.Module] = list(decoder_layers(model))
    if getattr(model.model, "visual", None) is not None:
        tower: Any = vision_tower(model)
        units += [*tower.blocks, tower]
    return units


def _parameter_name(model: nn.Module, param: nn.Parameter) -> str:
    return next(name for name, p in model.named_parameters(remove_duplicate=False) if p is param)


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
) -> torch.optim.AdamW:
    """AdamW over the (sharded) parameters of `model` that require grad.

    `foreach=True` on every device: torch picks it by default only on CUDA, and elsewhere
    loops over the parameters in Python, a dozen DTensor dispatches per parameter per step
    (the update's largest fixed cost on a small model). Both give the same numbers."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no trainable parameters (was it built with trainable=False?)")
    return torch.optim.AdamW(
        params, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps, foreach=True
    )


def warmup_scheduler(
    optimizer: torch.optim.Optimizer, warmup_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up of the learning rate over `warmup_steps` optimizer steps, then constant
    (0: constant from the first step)."""

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def clip_and_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    max_grad_norm: float,
    replicas: dist.ProcessGroup | None = None,
) -> tuple[float, bool]:
    """Clip gradients to `max_grad_norm`, step unless the norm is not finite, zero gradients.
    A plainly replicated model (`replicas`: hybrid.workers.replicated.gradient_replicas)
    first averages its gradients over them.

    Returns (total gradient norm before clipping, whether the optimizer step was applied).
    The norm of DTensor gradients is all-reduced, and replicas hold the same averaged
    gradients, so every rank takes the same decision.
    """
    if replicas is not None:
        average_gradients(model, replicas)
    params = [p for p in model.parameters() if p.grad is not None]
    by_mesh = _by_mesh(params)
    if len(by_mesh) > 1:  # expert parallelism: DTensor math stays on one mesh
        grad_norm = _clip_across_meshes(by_mesh, max_grad_norm)
    else:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        grad_norm = float(norm)
    applied = math.isfinite(grad_norm)
    if applied:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, applied


def _by_mesh(params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
    """Parameters grouped by the device mesh of their DTensor (plain tensors: one group)."""
    groups: dict[object, list[nn.Parameter]] = {}
    for param in params:
        key = param.device_mesh if isinstance(param, DTensor) else None
        groups.setdefault(key, []).append(param)
    return list(groups.values())


def _clip_across_meshes(groups: list[list[nn.Parameter]], max_norm: float) -> float:
    """`clip_grad_norm_` for gradients on several meshes (the experts' (efsdp, ep) and FSDP's
    over the same ranks): every element of such a gradient lives on exactly one rank, so the
    total is one all-reduce of the local sums of squares; every gradient is then scaled by
    the same factor, as torch does within one mesh (eps 1e-6)."""
    grads = [p.grad for group in groups for p in group if p.grad is not None]
    squares = torch.zeros((), dtype=torch.float64, device=grads[0].device)
    mesh_sizes = set()
    for grad in grads:
        assert isinstance(grad, DTensor) and all(pl.is_shard() for pl in grad.placements), (
            "gradients on several meshes must be sharded on every mesh dim"
        )
        squares += grad.to_local().double().pow(2).sum()
        mesh_sizes.add(grad.device_mesh.size())
    assert mesh_sizes == {dist.get_world_size()}, "the meshes span the trainer's world"
    dist.all_reduce(squares)
    total = math.sqrt(float(squares))
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        torch._foreach_mul_(grads, coef)
    return total


def _safetensors_files(model_dir: Path) -> list[Path]:
    """The weight files of a HF model directory (sharded via an index, or all *.safetensors)."""
    index = model_dir / _SAFETENSORS_INDEX
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in model directory {model_dir}")
    return files


def _init_rope_buffers(model: nn.Module, device: torch.device) -> None:
    """Recompute the rotary `inv_freq` buffers: non-persistent, so no checkpoint holds them,
    and `to_empty` left them as uninitialised memory."""
    found = False
    for module in model.modules():
        if not hasattr(module, "inv_freq") or not hasattr(module, "rope_type"):
            continue
        # As in the rotary module's __init__ (transformers 5, e.g. Qwen2RotaryEmbedding; a
        # vision tower's axial rotary has its own `compute_axial_rope_parameters`).
        rotary: Any = module
        init_fn: Any = getattr(
            rotary,
            f"compute_{rotary.rope_type}_rope_parameters",
            ROPE_INIT_FUNCTIONS.get(rotary.rope_type),
        )
        inv_freq, rotary.attention_scaling = init_fn(rotary.config)
        rotary.inv_freq = inv_freq.to(device)
        if hasattr(rotary, "original_inv_freq"):
            rotary.original_inv_freq = inv_freq.clone().to(device)
        found = True
    assert found, f"no rotary embedding with an inv_freq buffer in {type(model).__name__}"


def _load_weights(
    model: nn.Module,
    files: list[Path],
    adapter: StateDictAdapter,
    *,
    embed_key: str,
    tied: bool,
    lora_seed: int | None = None,
    value_head: bool = False,
) -> None:
    """Rank 0 reads `files`; `set_model_state_dict` broadcasts them into every rank's shards.
    `embed_key`: the input embedding's name (a tied head is loaded from it).

    `adapter` plans which checkpoint tensors build each of the module's (the identity for
    dense families). For a peft model the Hugging Face names are mapped to the model's, and the
    adapters (not in the checkpoint) get their initial values from `lora_seed`. A critic
    (`value_head`) skips a causal LM's head and initialises its value head unless the
    checkpoint has one."""
    stored: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            stored.update(f.keys())
    plan = adapter.plan(stored)  # module key (Hugging Face name) -> checkpoint keys
    checkpoint_keys = set(plan)
    if value_head:
        checkpoint_keys.discard(_LM_HEAD_KEY)  # the policy's head: the critic has its own
    new_value_head = value_head and not VALUE_HEAD_KEYS.issubset(checkpoint_keys)
    state = model.state_dict()
    adapters = {k: v for k, v in state.items() if is_lora_name(k)}
    # Hugging Face name -> the model's name (the same without LoRA).
    names = {hf_name(k): k for k in state if k not in adapters}
    expected = set(names)
    alias_head = tied and _LM_HEAD_KEY not in checkpoint_keys and _LM_HEAD_KEY in expected
    initialised = ({_LM_HEAD_KEY} if alias_head else set()) | (
        VALUE_HEAD_KEYS if new_value_head else set()
    )
    missing = sorted(expected - checkpoint_keys - initialised)
    unexpected = sorted(checkpoint_keys - expected)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {[str(f) for f in files]} does not match {type(model).__name__}: "
            f"missing keys {missing}, unexpected keys {unexpected}"
        )

    full_sd: dict[str, Any] = {}
    if not dist.is_initialized() or dist.get_rank() == 0:
        wanted = {stored_key for key in checkpoint_keys for stored_key in plan[key]}
        read: dict[str, torch.Tensor] = {}
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                    if key in wanted:
                        read[key] = f.get_tensor(key)
        for key in checkpoint_keys:
            tensor = adapter.combine(key, [read.pop(stored_key) for stored_key in plan[key]])
            full_sd[names[key]] = tensor.to(state[names[key]].dtype)
        if alias_head:
            # The same tensor under the tied name: the head is loaded from the embedding.
            full_sd[names[_LM_HEAD_KEY]] = full_sd[names[hf_name(embed_key)]]
        if new_value_head:
            full_sd.update(initial_value_head(state, _initializer_range(model)))
        if adapters:
            assert lora_seed is not None, "a peft model needs a seed for its adapters"
            shapes = [(k, v.shape) for k, v in adapters.items()]
            dtype = next(iter(adapters.values())).dtype
            full_sd.update(initial_adapter(shapes, dtype, lora_seed))
    set_model_state_dict(
        model,
        full_sd,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )


def initial_value_head(state: dict[str, Any], std: float) -> dict[str, torch.Tensor]:
    """The value head's starting weights (as transformers initialises a new head: normal with
    the model's initializer_range, zero bias), from a fixed seed: every rank and every run
    start the critic alike."""
    generator = torch.Generator().manual_seed(VALUE_HEAD_SEED)
    weight, bias = state["score.weight"], state["score.bias"]
    return {
        "score.weight": torch.normal(0.0, std, tuple(weight.shape), generator=generator).to(
            weight.dtype
        ),
        "score.bias": torch.zeros(tuple(bias.shape), dtype=bias.dtype),
    }


def _initializer_range(model: nn.Module) -> float:
    return float(getattr(model.config, "initializer_range", 0.02))
