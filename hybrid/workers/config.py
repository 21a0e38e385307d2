"""Typed configuration of the WorkerDict members: model, actor, reference (+ rollout, sync).

Plain frozen dataclasses, validated in `__post_init__` (errors name the field and the allowed
values). The Hydra schema of the trainer wraps these; workers only ever see these objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from hybrid.dtypes import DTYPE_CHOICES, DTYPES, ComputeDtypes, Dtype, DtypeChoice, Hardware
from hybrid.rollout.config import RolloutConfig
from hybrid.sharding.config import SyncConfig
from hybrid.validation import check_choice, check_positive, check_range
from hybrid.workers.attention import ATTN_CHOICES, AttnChoice

LossAggMode = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
KlKind = Literal["k1", "abs", "k2", "mse", "k3", "low_var_kl"]


ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters on the actor (peft). rank 0 turns LoRA off; the other fields then
    must stay at their defaults, so a forgotten rank is an error rather than full training."""

    rank: int = 0
    """Adapter rank r (0: LoRA off, full fine-tuning)."""
    alpha: int = 16
    """Scaling numerator: the adapter's update is (alpha / rank) * B @ A."""
    dropout: float = 0.0
    """Dropout on the adapter's input during training."""
    target_modules: str | tuple[str, ...] = ALL_LINEAR
    """Module names (suffixes) that get adapters, or "all-linear" (every linear of the decoder
    layers, not the LM head)."""

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"model.lora.rank must be >= 0 (0 = LoRA off), got {self.rank}")
        if self.rank == 0:
            changed = [
                f"{name}={getattr(self, name)!r}"
                for name in ("alpha", "dropout", "target_modules")
                if getattr(self, name) != getattr(LoraConfig, name)
            ]
            if changed:
                raise ValueError(
                    f"model.lora.rank is 0 (LoRA off) but LoRA is configured ({', '.join(changed)}):"
                    " set model.lora.rank > 0 to train adapters, or drop these settings"
                )
            return
        check_positive("model.lora", alpha=self.alpha)
        if not 0 <= self.dropout < 1:
            raise ValueError(f"model.lora.dropout must be in [0, 1), got {self.dropout}")
        if isinstance(self.target_modules, str):
            if self.target_modules != ALL_LINEAR:
                raise ValueError(
                    f"model.lora.target_modules must be a list of module names or "
                    f"{ALL_LINEAR!r}, got {self.target_modules!r}"
                )
        elif not self.target_modules:
            raise ValueError("model.lora.target_modules is empty: name at least one module")


@dataclass(frozen=True)
class ModelConfig:
    path: str
    """Hugging Face model directory (config, safetensors, tokenizer)."""
    attn_implementation: AttnChoice = "auto"
    """Attention kernel of the training and reference models: auto (flash_attention_2 where
    flash-attn is installed and the run is on CUDA, else sdpa), sdpa, eager or
    flash_attention_2 (hybrid.workers.attention)."""
    gradient_checkpointing: bool = False
    """Recompute decoder-layer activations in the backward pass."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters on the actor (off by default)."""
    use_remove_padding: bool = True
    """Actor and reference passes run on packed micro-batches (the valid tokens of several
    sequences concatenated, attention kept within each sequence): no compute on padding."""
    log_prob_chunk_tokens: int = 1024
    """Tokens per chunk when log-probs and entropy are computed from hidden states (the LM
    head applied chunk by chunk, never the full tokens x vocab logits); 0: full logits."""

    def __post_init__(self) -> None:
        if self.log_prob_chunk_tokens < 0:
            raise ValueError(
                f"model.log_prob_chunk_tokens must be >= 0 (0 = full logits), "
                f"got {self.log_prob_chunk_tokens}"
            )
        check_choice("model", "attn_implementation", self.attn_implementation, ATTN_CHOICES)


@dataclass(frozen=True)
class ActorConfig:
    lr: float = 1e-6
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm; a step whose norm is not finite is skipped."""
    clip_ratio_low: float = 0.2
    """PPO clip: the ratio is kept above 1 - clip_ratio_low."""
    clip_ratio_high: float = 0.2
    """PPO clip: the ratio is kept below 1 + clip_ratio_high (DAPO's clip-higher when larger)."""
    clip_ratio_c: float = 3.0
    """Dual clip: for negative advantages the per-token loss is capped at -A * clip_ratio_c."""
    loss_agg_mode: LossAggMode = "token-mean"
    """How per-token losses become one number (token-mean is over the whole mini-batch)."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    use_kl_loss: bool = False
    """Add a KL(actor || ref) term to the loss (needs ref_log_prob in the batch)."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss."""
    kl_loss_type: KlKind = "low_var_kl"
    """KL estimator: k1, abs, k2 (= mse), k3 (= low_var_kl)."""
    tis_cap: float | None = None
    """Truncated importance sampling between rollout and actor log-probs (off when None)."""
    decoupled_cap: float | None = None
    """Decoupled PPO (AReaL): per-token weight pi_proximal / pi_behaviour with the old
    log-probs as the proximal policy and the rollout log-probs as the behaviour policy; tokens
    whose weight exceeds the cap leave the loss. None: off. Excludes tis_cap."""
    ppo_epochs: int = 1
    """Passes over the batch per update_actor call."""
    mini_batch_size: int | None = None
    """Rows per optimizer step on each rank (None: the whole local batch, one step)."""
    param_dtype: DtypeChoice = "auto"
    """Compute dtype of forward/backward (FSDP2 MixedPrecisionPolicy.param_dtype); auto:
    bfloat16 where the device computes it natively, else float32 (hybrid/dtypes.py)."""
    reduce_dtype: Dtype = "float32"
    """Dtype of the gradient reduce-scatter."""
    master_dtype: Dtype = "float32"
    """Dtype of the sharded parameters the optimizer updates."""
    param_offload: bool = False
    """Keep sharded parameters on CPU outside trainer-mode work (CUDA only; no-op on CPU)."""
    optimizer_offload: bool = False
    """Keep optimizer state on CPU outside the optimizer step (CUDA only; no-op on CPU)."""
    micro_batch_size: int = 4
    """Rows per forward/backward pass on each rank (without use_dynamic_bsz)."""
    use_dynamic_bsz: bool = False
    """Micro-batches by token count instead of row count (the two budgets below)."""
    ppo_max_token_len_per_gpu: int = 16384
    """With use_dynamic_bsz: tokens (prompt + response) per update micro-batch."""
    log_prob_max_token_len_per_gpu: int = 16384
    """With use_dynamic_bsz: tokens per micro-batch of the old-log-prob pass."""
    hsdp_replicas: int = 1
    """HSDP: shard parameters within groups of num_workers / hsdp_replicas consecutive ranks
    (a node, when it equals trainer.nnodes) and replicate across the groups, so that only a
    gradient all-reduce crosses the slow link. 1: plain FSDP over every rank. The reference
    shares the mesh."""

    def __post_init__(self) -> None:
        check_positive("actor", hsdp_replicas=self.hsdp_replicas)
        check_positive(
            "actor",
            lr=self.lr,
            eps=self.eps,
            max_grad_norm=self.max_grad_norm,
            micro_batch_size=self.micro_batch_size,
            ppo_max_token_len_per_gpu=self.ppo_max_token_len_per_gpu,
            log_prob_max_token_len_per_gpu=self.log_prob_max_token_len_per_gpu,
        )
        check_range("actor", "clip_ratio_low", self.clip_ratio_low, 0.0, 1.0)
        check_positive("actor", clip_ratio_high=self.clip_ratio_high, ppo_epochs=self.ppo_epochs)
        if self.clip_ratio_c <= 1:
            raise ValueError(f"actor.clip_ratio_c must be > 1, got {self.clip_ratio_c}")
        check_choice("actor", "loss_agg_mode", self.loss_agg_mode, get_args(LossAggMode))
        check_choice("actor", "kl_loss_type", self.kl_loss_type, get_args(KlKind))
        if self.tis_cap is not None:
            check_positive("actor", tis_cap=self.tis_cap)
        if self.decoupled_cap is not None:
            check_positive("actor", decoupled_cap=self.decoupled_cap)
            if self.tis_cap is not None:
                raise ValueError(
                    f"actor.tis_cap ({self.tis_cap}) and actor.decoupled_cap "
                    f"({self.decoupled_cap}) are two corrections of the same rollout/actor gap: "
                    "set at most one"
                )
        if self.mini_batch_size is not None:
            check_positive("actor", mini_batch_size=self.mini_batch_size)
        if self.weight_decay < 0:
            raise ValueError(f"actor.weight_decay must be >= 0, got {self.weight_decay}")
        for i, beta in enumerate(self.betas):
            if not 0 <= beta < 1:
                raise ValueError(f"actor.betas[{i}] must be in [0, 1), got {beta}")
        check_choice("actor", "param_dtype", self.param_dtype, DTYPE_CHOICES)
        for name in ("reduce_dtype", "master_dtype"):
            check_choice("actor", name, getattr(self, name), DTYPES)


@dataclass(frozen=True)
class RefConfig:
    param_offload: bool = False
    """Keep the reference weights on CPU between uses (CUDA only; no-op on CPU)."""
    param_dtype: DtypeChoice = "auto"
    """Dtype the frozen reference is stored and computed in; auto as actor.param_dtype."""
    micro_batch_size: int = 8
    """Rows per forward pass (without use_dynamic_bsz)."""
    use_dynamic_bsz: bool = False
    """Micro-batches by token count instead of row count."""
    log_prob_max_token_len_per_gpu: int = 16384
    """With use_dynamic_bsz: tokens (prompt + response) per micro-batch."""

    def __post_init__(self) -> None:
        check_positive(
            "ref",
            micro_batch_size=self.micro_batch_size,
            log_prob_max_token_len_per_gpu=self.log_prob_max_token_len_per_gpu,
        )
        check_choice("ref", "param_dtype", self.param_dtype, DTYPE_CHOICES)


@dataclass(frozen=True)
class CriticModelConfig:
    path: str | None = None
    """Hugging Face directory the critic starts from: a decoder of the actor's vocabulary (its
    LM head is left out) or a saved critic; null: the actor's model.path."""


@dataclass(frozen=True)
class CriticConfig:
    """The value model of PPO with a critic (algorithm.adv_estimator=gae): the decoder of
    `model.path` with a scalar head, trained with the clipped value loss."""

    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """Where the critic starts from."""
    lr: float = 1e-5
    """AdamW learning rate (after the warm-up)."""
    lr_warmup_steps: int = 0
    """Optimizer steps of linear learning-rate warm-up (0: none)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm; a step whose norm is not finite is skipped."""
    cliprange_value: float = 0.5
    """Clipped value loss: a new value counts at most this far from the old one."""
    loss_agg_mode: LossAggMode = "token-mean"
    """How per-token value losses become one number."""
    ppo_epochs: int = 1
    """Passes over the batch per update_critic call."""
    mini_batch_size: int | None = None
    """Rows per optimizer step on each rank (derived like the actor's)."""
    micro_batch_size: int = 4
    """Rows per forward/backward pass on each rank (without use_dynamic_bsz)."""
    use_dynamic_bsz: bool = False
    """Micro-batches by token count instead of row count (the two budgets below)."""
    ppo_max_token_len_per_gpu: int = 16384
    """With use_dynamic_bsz: tokens (prompt + response) per update micro-batch."""
    forward_max_token_len_per_gpu: int = 16384
    """With use_dynamic_bsz: tokens per micro-batch of the values pass."""
    gradient_checkpointing: bool = False
    """Recompute decoder-layer activations in the backward pass."""
    param_dtype: DtypeChoice = "auto"
    """Compute dtype of forward/backward; auto as actor.param_dtype."""
    reduce_dtype: Dtype = "float32"
    """Dtype of the gradient reduce-scatter."""
    master_dtype: Dtype = "float32"
    """Dtype of the sharded parameters the optimizer updates."""
    param_offload: bool = False
    """Keep sharded parameters on CPU outside the critic's passes (CUDA only; no-op on CPU)."""
    optimizer_offload: bool = False
    """Keep optimizer state on CPU outside the critic's optimizer step (CUDA only)."""

    def __post_init__(self) -> None:
        check_positive(
            "critic",
            lr=self.lr,
            eps=self.eps,
            max_grad_norm=self.max_grad_norm,
            cliprange_value=self.cliprange_value,
            ppo_epochs=self.ppo_epochs,
            micro_batch_size=self.micro_batch_size,
            ppo_max_token_len_per_gpu=self.ppo_max_token_len_per_gpu,
            forward_max_token_len_per_gpu=self.forward_max_token_len_per_gpu,
        )
        if self.lr_warmup_steps < 0:
            raise ValueError(f"critic.lr_warmup_steps must be >= 0, got {self.lr_warmup_steps}")
        if self.weight_decay < 0:
            raise ValueError(f"critic.weight_decay must be >= 0, got {self.weight_decay}")
        for i, beta in enumerate(self.betas):
            if not 0 <= beta < 1:
                raise ValueError(f"critic.betas[{i}] must be in [0, 1), got {beta}")
        if self.mini_batch_size is not None:
            check_positive("critic", mini_batch_size=self.mini_batch_size)
        check_choice("critic", "loss_agg_mode", self.loss_agg_mode, get_args(LossAggMode))
        check_choice("critic", "param_dtype", self.param_dtype, DTYPE_CHOICES)
        for name in ("reduce_dtype", "master_dtype"):
            check_choice("critic", name, getattr(self, name), DTYPES)


@dataclass(frozen=True)
class HybridWorkerConfig:
    """Everything one WorkerDict's members need."""

    model: ModelConfig
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)

    def compute_dtypes(self, hardware: Hardware) -> ComputeDtypes:
        """actor / ref / rollout dtypes with `auto` resolved for `hardware`."""
        return ComputeDtypes.resolve(
            self.actor.param_dtype, self.ref.param_dtype, self.rollout.dtype, hardware
        )
