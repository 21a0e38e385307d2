"""Typed configuration of the WorkerDict members: model, actor, reference, critic (+ rollout,
sync), and the values the trainer derives for them (`WorkerSpec`).

Plain frozen dataclasses, validated in `__post_init__` (errors name the field and the allowed
values). The Hydra schema of the trainer wraps these; workers only ever see these objects.

What the actor, the critic and the reference share is written once:
- Groups, nested under their owner: `OptimConfig` (`actor.optim.*`, `critic.optim.*`, as verl
  spells them; the critic's `CriticOptimConfig` adds the learning-rate warm-up),
  `PrecisionConfig` (`actor.precision.*`, `critic.precision.*`; the reference, which never
  computes gradients, takes its `param_dtype` part, `ForwardPrecisionConfig`:
  `ref.precision.param_dtype`) and `OffloadConfig` (`actor.offload.*`, `critic.offload.*`; the
  reference, without optimizer, takes its `param_offload` part, `ParamOffloadConfig`; the
  precision and offload groups live in hybrid/model_groups.py, since the reward model nests
  them too). A group does not know where it sits, so it has no `__post_init__`: its
  `check(owner)` runs from its owner's `__post_init__` with the owner's dotted name, and an
  error names the whole field (`actor.optim.lr must be > 0`).
- Micro-batch fields stay flat (`actor.micro_batch_size`, `actor.use_dynamic_bsz`,
  `actor.ppo_max_token_len_per_gpu`, `critic.forward_max_token_len_per_gpu`, ...): verl's
  users type these names, and a nested group would rename them. They are declared and checked
  once instead, in the base class `MicroBatching`, which ActorConfig, RefConfig and
  CriticConfig extend; each role adds the token budgets of its own passes (their verl names)
  and lists them in `TOKEN_BUDGETS`, so the one check covers them.

The reward model a worker hosts (`reward.model`) is configured with the rest of `reward.*`, in
hybrid/rewards/config.py.

Sizes the trainer derives (rows per optimizer step, the off-policy caps in effect) are no
fields of these classes: `TrainerRunConfig.worker_config()` builds them into a `WorkerSpec`
that the workers receive beside the user's config (`HybridWorkerConfig.derived`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal, get_args

from hybrid.algorithms.policy_objectives import POLICY_LOSSES, PolicyLossName
from hybrid.dtypes import ComputeDtypes, Hardware
from hybrid.model_families import model_hidden_size
from hybrid.model_groups import (
    ForwardPrecisionConfig,
    OffloadConfig,
    ParamOffloadConfig,
    PrecisionConfig,
)
from hybrid.rewards.config import RewardModelConfig
from hybrid.rollout.config import RolloutConfig
from hybrid.sharding.config import SyncConfig
from hybrid.validation import check_choice, check_positive, check_range
from hybrid.workers.attention import ATTN_CHOICES, AttnChoice
from hybrid.workers.grad_reduce import GRAD_REDUCE_CHOICES, GradReduce

LossAggMode = Literal[
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]
KlKind = Literal["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"]


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
    freeze_vision_tower: bool = False
    """A vision-language model: train the language model only (the vision tower's weights
    stay as loaded; verl's freeze_vision_tower)."""

    def __post_init__(self) -> None:
        if self.log_prob_chunk_tokens < 0:
            raise ValueError(
                f"model.log_prob_chunk_tokens must be >= 0 (0 = full logits), "
                f"got {self.log_prob_chunk_tokens}"
            )
        check_choice("model", "attn_implementation", self.attn_implementation, ATTN_CHOICES)


@dataclass(frozen=True)
class OptimConfig:
    """AdamW and gradient clipping of a trained model (`actor.optim`, `critic.optim`)."""

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
    lr_warmup_steps: int = 0
    """Optimizer steps of linear learning-rate warm-up, from lr / lr_warmup_steps up to lr
    (0: none). The actor's counts the RL updates (it starts again after an SFT stage)."""

    def check(self, owner: str) -> None:
        """Raise ValueError naming `owner.<field>` (e.g. actor.optim.lr) for a bad value."""
        check_positive(owner, lr=self.lr, eps=self.eps, max_grad_norm=self.max_grad_norm)
        if self.lr_warmup_steps < 0:
            raise ValueError(f"{owner}.lr_warmup_steps must be >= 0, got {self.lr_warmup_steps}")
        if self.weight_decay < 0:
            raise ValueError(f"{owner}.weight_decay must be >= 0, got {self.weight_decay}")
        if len(self.betas) != 2:
            raise ValueError(f"{owner}.betas must be two numbers, got {list(self.betas)}")
        for i, beta in enumerate(self.betas):
            if not 0 <= beta < 1:
                raise ValueError(f"{owner}.betas[{i}] must be in [0, 1), got {beta}")


@dataclass(frozen=True)
class CriticOptimConfig(OptimConfig):
    """The critic's optimizer (`critic.optim`): a larger learning rate than the actor's."""

    lr: float = 1e-5
    """AdamW learning rate (after the warm-up)."""


@dataclass(frozen=True)
class MicroBatching:
    """Base of ActorConfig, RefConfig and CriticConfig: how a rank splits its rows into
    forward/backward passes. Flat in the owner (verl's names); each owner declares the token
    budgets of its passes and names them in TOKEN_BUDGETS."""

    TOKEN_BUDGETS: ClassVar[tuple[str, ...]] = ()
    """The owner's `*_max_token_len_per_gpu` fields (checked here with the others)."""

    micro_batch_size: int = 4
    """Rows per forward/backward pass on each rank (without use_dynamic_bsz)."""
    use_dynamic_bsz: bool = False
    """Micro-batches by token count instead of row count (the token budgets)."""

    def check_micro_batches(self, owner: str) -> None:
        budgets = {name: getattr(self, name) for name in self.TOKEN_BUDGETS}
        check_positive(owner, micro_batch_size=self.micro_batch_size, **budgets)


KernelChoice = Literal["auto", "on", "off"]
KERNEL_CHOICES: tuple[KernelChoice, ...] = ("auto", "on", "off")


@dataclass(frozen=True)
class ModelKernels:
    """Base of the model members' configs (actor, ref, critic, distill): which faster kernels
    their model runs. Flat in the owner (`actor.fused_kernels`, `actor.compile`)."""

    fused_kernels: KernelChoice = "auto"
    """liger-kernel's fused RMSNorm, rotary embedding and SwiGLU MLP, and its fused linear
    log-prob head (hybrid.workers.fused_kernels): auto = on where the model runs on CUDA,
    liger-kernel is installed and covers the model's family, else off; on = required (an
    error says which of the three is missing)."""
    compile: KernelChoice = "auto"
    """torch.compile each decoder layer once, dynamic shapes (hybrid.workers.compiled_blocks):
    auto = on for a dense text model on CUDA, off elsewhere (a failing compile falls back to
    eager with a warning naming the layer); on = required (a failing compile is an error
    naming the layer); off = eager."""

    def check_kernels(self, owner: str) -> None:
        check_choice(owner, "fused_kernels", self.fused_kernels, KERNEL_CHOICES)
        check_choice(owner, "compile", self.compile, KERNEL_CHOICES)


RouterReplay = Literal["off", "measure", "record", "rollout"]


@dataclass(frozen=True)
class ActorConfig(MicroBatching, ModelKernels):
    """The FSDP2 policy: its optimizer, precision and offload, the PPO loss, micro-batches."""

    TOKEN_BUDGETS: ClassVar[tuple[str, ...]] = (
        "ppo_max_token_len_per_gpu",
        "log_prob_max_token_len_per_gpu",
    )

    optim: OptimConfig = field(default_factory=OptimConfig)
    """AdamW and gradient clipping."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """Compute, gradient-reduce and master dtypes (the frozen LoRA base is stored in the
    compute dtype)."""
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    """Parameters and optimizer state on CPU outside trainer-mode work."""
    policy_loss: PolicyLossName = "vanilla"
    """The policy-gradient loss (hybrid/algorithms/policy_objectives.py, docs/algorithms.md):
    vanilla (PPO-clip with clip-higher and dual clip), gspo (sequence-level ratio, clipped;
    its tiny clip range is set through clip_ratio_low/high, e.g. 3e-4 / 4e-4), gspo_token
    (GSPO's value, per-token gradient), cispo (clipped, detached importance weight on the
    log-prob gradient; clip_ratio_low=1.0 for no lower bound) or sapo (a soft sigmoid gate,
    sapo_tau_pos / sapo_tau_neg)."""
    clip_ratio_low: float = 0.2
    """PPO clip: the ratio is kept above 1 - clip_ratio_low (gspo: the sequence ratio; cispo:
    the importance weight's floor, 1.0 = none)."""
    clip_ratio_high: float = 0.2
    """PPO clip: the ratio is kept below 1 + clip_ratio_high (DAPO's clip-higher when larger;
    gspo: the sequence ratio; cispo: the importance weight's cap)."""
    clip_ratio_c: float = 3.0
    """Dual clip: for negative advantages the per-token loss is capped at -A * clip_ratio_c
    (policy_loss=vanilla only)."""
    sapo_tau_pos: float = 1.0
    """SAPO (policy_loss=sapo): the gate's temperature for tokens with a positive advantage."""
    sapo_tau_neg: float = 1.05
    """SAPO: the temperature for negative advantages; the paper keeps it above sapo_tau_pos,
    so that negative updates are damped sooner off-policy."""
    loss_agg_mode: LossAggMode = "token-mean"
    """How per-token losses become one number (token-mean is over the whole mini-batch)."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    use_kl_loss: bool = False
    """Add a KL(actor || ref) term to the loss (needs ref_log_prob in the batch)."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss."""
    kl_loss_type: KlKind = "low_var_kl"
    """KL estimator: k1 (= kl, verl's name), abs, k2 (= mse), k3 (= low_var_kl)."""
    tis_cap: float | None = None
    """Truncated importance sampling between rollout and actor log-probs (off when None);
    algorithm.off_policy_correction=tis sets it from algorithm.importance_cap instead."""
    ppo_epochs: int = 1
    """Passes over the batch per update_actor call."""
    ppo_max_token_len_per_gpu: int = 16384
    """With use_dynamic_bsz: tokens (prompt + response) per update micro-batch."""
    log_prob_max_token_len_per_gpu: int = 16384
    """With use_dynamic_bsz: tokens per micro-batch of the old-log-prob pass."""
    router_replay: RouterReplay = "off"
    """Mixture-of-experts models (docs/moe.md): off; measure (the old-log-prob pass records
    each token's experts and the update reports how often its routers choose others,
    actor/moe_router_drift_frac); record (R2: as measure, and the update computes with the
    recorded experts, gate weights from its live router); rollout (R3: the old-log-prob
    pass and the update compute with the experts the engine chose, rollout.return_routed_experts
    on; vLLM returns them on CUDA only, the toy engine everywhere). measure and record need an
    old-log-prob pass (an update that is not on-policy)."""
    moe_aux_loss_coef: float = 0.0
    """Weight of the load-balancing loss (Switch: E * sum_e f_e * P_e, mean over MoE layers)
    added to the actor's loss; 0 (as peers run RL) reports it without training on it."""
    hsdp_replicas: int = 0
    """HSDP: shard parameters within groups of num_workers / hsdp_replicas consecutive ranks
    (a node, when it equals trainer.nnodes) and replicate across the groups, so that only a
    gradient all-reduce crosses the slow link. 1: plain FSDP over every rank; num_workers:
    every rank holds the whole model. 0 (auto): every rank holds it on a CPU where the
    training state of all ranks takes at most 1% of the host's memory (a dense model trained
    in full, no sequence parallelism), plain FSDP otherwise and on GPUs
    (hybrid.workers.replication). The reference shares the mesh."""
    ep_size: int = 1
    """Expert parallelism for a mixture of experts (docs/moe.md): each of ep consecutive ranks
    owns num_experts / ep whole experts and tokens reach them by all-to-all; the experts' rows
    are split over the num_workers / ep groups of such ranks. 1: the experts are FSDP-sharded
    like every other weight. Must divide the trainer's workers and the number of experts;
    the reference, critic and teacher share the mesh."""

    grad_reduce: GradReduce = "auto"
    """When gradients are reduce-scattered (hybrid.workers.grad_reduce): step (once per
    optimizer step; every rank holds the whole unsharded fp32 gradient meanwhile),
    micro_batch (after each micro-batch's backward, as verl), or auto (step on one rank or
    where that whole gradient takes at most a tenth of the device's memory: LoRA, small
    models; micro_batch otherwise)."""

    sp_size: int = 1
    """Ulysses sequence parallelism (docs/long-context.md): groups of sp consecutive workers
    split each packed sequence, attention by all-to-all, so one rank holds 1 / sp of a
    sequence's activations. Must divide the trainer's workers and the workers per node, and
    the model's query heads (its kv heads divisible by sp or dividing it). The reference
    shares it."""

    def __post_init__(self) -> None:
        self.optim.check("actor.optim")
        self.precision.check("actor.precision")
        self.check_micro_batches("actor")
        self.check_kernels("actor")
        check_positive("actor", ep_size=self.ep_size, sp_size=self.sp_size)
        if self.hsdp_replicas < 0:
            raise ValueError(
                f"actor.hsdp_replicas must be >= 0 (0: auto), got {self.hsdp_replicas}"
            )
        if self.ep_size > 1 and self.hsdp_replicas > 1:
            raise ValueError(
                f"actor.ep_size ({self.ep_size}) with actor.hsdp_replicas "
                f"({self.hsdp_replicas}): expert parallelism runs over plain FSDP; set one of them to 1"
            )
        check_range("actor", "clip_ratio_low", self.clip_ratio_low, 0.0, 1.0)
        check_positive("actor", clip_ratio_high=self.clip_ratio_high, ppo_epochs=self.ppo_epochs)
        check_choice("actor", "policy_loss", self.policy_loss, POLICY_LOSSES)
        check_positive("actor", sapo_tau_pos=self.sapo_tau_pos, sapo_tau_neg=self.sapo_tau_neg)
        if self.clip_ratio_c <= 1:
            raise ValueError(f"actor.clip_ratio_c must be > 1, got {self.clip_ratio_c}")
        check_choice("actor", "loss_agg_mode", self.loss_agg_mode, get_args(LossAggMode))
        check_choice("actor", "kl_loss_type", self.kl_loss_type, get_args(KlKind))
        if self.tis_cap is not None:
            check_positive("actor", tis_cap=self.tis_cap)
        check_choice("actor", "router_replay", self.router_replay, get_args(RouterReplay))
        check_choice("actor", "grad_reduce", self.grad_reduce, GRAD_REDUCE_CHOICES)
        if self.moe_aux_loss_coef < 0:
            raise ValueError(f"actor.moe_aux_loss_coef must be >= 0, got {self.moe_aux_loss_coef}")


@dataclass(frozen=True)
class RefConfig(MicroBatching, ModelKernels):
    """The frozen reference policy (a KL's other side): its dtype, offload, micro-batches."""

    TOKEN_BUDGETS: ClassVar[tuple[str, ...]] = ("log_prob_max_token_len_per_gpu",)

    precision: ForwardPrecisionConfig = field(default_factory=ForwardPrecisionConfig)
    """The dtype the frozen reference is stored and computed in."""
    offload: ParamOffloadConfig = field(default_factory=ParamOffloadConfig)
    """The reference weights on CPU between uses."""
    micro_batch_size: int = 8
    """Rows per forward pass (without use_dynamic_bsz): no backward, so more than the actor's."""
    log_prob_max_token_len_per_gpu: int = 16384
    """With use_dynamic_bsz: tokens (prompt + response) per micro-batch."""

    def __post_init__(self) -> None:
        self.precision.check("ref.precision")
        self.check_micro_batches("ref")
        self.check_kernels("ref")


@dataclass(frozen=True)
class CriticModelConfig:
    path: str | None = None
    """Hugging Face directory the critic starts from: a decoder of the actor's vocabulary (its
    LM head is left out) or a saved critic; null: the actor's model.path."""


@dataclass(frozen=True)
class CriticConfig(MicroBatching, ModelKernels):
    """The value model of PPO with a critic (algorithm.adv_estimator=gae): the decoder of
    `model.path` with a scalar head, trained with the clipped value loss."""

    TOKEN_BUDGETS: ClassVar[tuple[str, ...]] = (
        "ppo_max_token_len_per_gpu",
        "forward_max_token_len_per_gpu",
    )

    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """Where the critic starts from."""
    optim: CriticOptimConfig = field(default_factory=CriticOptimConfig)
    """AdamW, its warm-up and gradient clipping."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """Compute, gradient-reduce and master dtypes."""
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    """Parameters and optimizer state on CPU outside the critic's passes."""
    cliprange_value: float = 0.5
    """Clipped value loss: a new value counts at most this far from the old one."""
    loss_agg_mode: LossAggMode = "token-mean"
    """How per-token value losses become one number."""
    ppo_epochs: int = 1
    """Passes over the batch per update_critic call."""
    ppo_max_token_len_per_gpu: int = 16384
    """With use_dynamic_bsz: tokens (prompt + response) per update micro-batch."""
    forward_max_token_len_per_gpu: int = 16384
    """With use_dynamic_bsz: tokens per micro-batch of the values pass."""
    gradient_checkpointing: bool = False
    """Recompute decoder-layer activations in the backward pass."""

    def __post_init__(self) -> None:
        self.optim.check("critic.optim")
        self.precision.check("critic.precision")
        self.check_micro_batches("critic")
        self.check_kernels("critic")
        check_positive("critic", cliprange_value=self.cliprange_value, ppo_epochs=self.ppo_epochs)
        check_choice("critic", "loss_agg_mode", self.loss_agg_mode, get_args(LossAggMode))


@dataclass(frozen=True)
class DistillConfig(MicroBatching, ModelKernels):
    """On-policy distillation (`distill`): a frozen teacher, any Hugging Face causal LM that
    reads the student's token ids, scores the tokens the student sampled; the per-token reverse
    KL becomes the advantage, alone or plus the task reward's (hybrid/algorithms/distill.py,
    docs/algorithms.md). A trainer-side member beside the reference (hybrid/workers/teacher.py)."""

    TOKEN_BUDGETS: ClassVar[tuple[str, ...]] = ("log_prob_max_token_len_per_gpu",)

    teacher_path: str | None = None
    """Hugging Face directory of the teacher (a *ForCausalLM whose tokenizer gives every token
    of the student's the same id; checked before any worker starts). null: no distillation."""
    coef: float = 1.0
    """Scale of the distillation advantage: -coef x (log pi_student - log pi_teacher) on each
    sampled token (>= 0; 0 with reward_coef > 0 logs the reverse KL without training on it)."""
    reward_coef: float = 0.0
    """Weight of the task reward's advantage (algorithm.adv_estimator's) added to the
    distillation advantage (>= 0); 0: distillation alone."""
    precision: ForwardPrecisionConfig = field(default_factory=ForwardPrecisionConfig)
    """The dtype the teacher is stored and computed in."""
    offload: ParamOffloadConfig = field(default_factory=ParamOffloadConfig)
    """The teacher's weights on CPU outside its pass (CUDA only; no-op on CPU)."""
    micro_batch_size: int = 8
    """Rows per forward pass of the teacher (without use_dynamic_bsz)."""
    log_prob_max_token_len_per_gpu: int = 16384
    """With use_dynamic_bsz: tokens (prompt + response) per micro-batch of the teacher."""

    @property
    def enabled(self) -> bool:
        return self.teacher_path is not None

    def __post_init__(self) -> None:
        owner = "distill"
        if self.teacher_path is not None and not self.teacher_path.strip():
            raise ValueError(f"{owner}.teacher_path is empty: a model directory, or null for none")
        self.precision.check(f"{owner}.precision")
        self.check_micro_batches(owner)
        self.check_kernels(owner)
        for name in ("coef", "reward_coef"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{owner}.{name} must be a finite number >= 0, got {value}")
        if self.teacher_path is None:
            # Settings that change what the advantage is: without a teacher they do nothing.
            changed = [
                name
                for name in ("coef", "reward_coef")
                if getattr(self, name) != getattr(DistillConfig, name)
            ]
            if changed:
                raise ValueError(
                    f"{owner}.teacher_path is null (no distillation) but {owner}.{changed[0]} is "
                    f"set: set {owner}.teacher_path to a teacher model, or drop the setting"
                )
        elif self.coef == 0 and self.reward_coef == 0:
            raise ValueError(
                f"{owner}.coef and {owner}.reward_coef are both 0: the advantage would be 0 on "
                "every token; set distill.coef > 0 (distillation) and/or distill.reward_coef > 0"
            )


@dataclass(frozen=True)
class WorkerSpec:
    """What the trainer derives from the run's config for the workers
    (`TrainerRunConfig.worker_config()`): computed, never set by a user."""

    mini_batch_rows: int | None = None
    """Rows per optimizer step on each rank, actor and critic alike
    (algorithm.ppo_mini_batch_size x rollout.n / the training workers); None: the whole local
    batch in one step."""
    tis_cap: float | None = None
    """Truncated importance sampling in effect: algorithm.importance_cap with
    algorithm.off_policy_correction=tis, else actor.tis_cap; None: off."""
    decoupled_cap: float | None = None
    """Decoupled PPO (AReaL), algorithm.off_policy_correction=decoupled: per-token weight
    pi_proximal / pi_behaviour with the old log-probs as the proximal policy and the rollout
    log-probs as the behaviour policy; tokens whose weight exceeds the cap
    (algorithm.importance_cap) leave the loss. None: off. Excludes tis_cap."""
    icepop_cap: float | None = None
    """IcePop, algorithm.off_policy_correction=icepop: like decoupled_cap, but tokens whose
    weight is outside [1/cap, cap] leave the loss. None: off. Excludes the other caps."""
    seq_mask_cap: float | None = None
    """Sequence-level masked IS, algorithm.off_policy_correction=seq_mask_is: rows whose
    geometric-mean weight is outside [1/cap, cap] leave the loss, the others are weighted by
    it. None: off. Excludes the other caps."""
    mismatch_cap: float = 2.0
    """The cap the rollout/trainer mismatch metrics count tokens beyond
    (algorithm.importance_cap), whatever the correction, none included."""

    def __post_init__(self) -> None:
        if self.mini_batch_rows is not None:
            check_positive("derived", mini_batch_rows=self.mini_batch_rows)
        caps = {
            "tis_cap": self.tis_cap,
            "decoupled_cap": self.decoupled_cap,
            "icepop_cap": self.icepop_cap,
            "seq_mask_cap": self.seq_mask_cap,
        }
        set_caps = {name: cap for name, cap in caps.items() if cap is not None}
        for name, cap in set_caps.items():
            check_positive("derived", **{name: cap})
        if len(set_caps) > 1:
            named = " and ".join(f"{name} ({cap})" for name, cap in set_caps.items())
            raise ValueError(
                f"{named} are corrections of the same rollout/actor gap: set at most one"
            )
        check_positive("derived", mismatch_cap=self.mismatch_cap)

    @property
    def corrected(self) -> bool:
        """An off-policy correction weighs the update (it reads rollout_log_probs)."""
        caps = (self.tis_cap, self.decoupled_cap, self.icepop_cap, self.seq_mask_cap)
        return any(cap is not None for cap in caps)


@dataclass(frozen=True)
class HybridWorkerConfig:
    """Everything one WorkerDict's members need."""

    model: ModelConfig
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """reward.model: the reward model member reads it (off unless its path is set)."""
    distill: DistillConfig = field(default_factory=DistillConfig)
    """The teacher member reads it (off unless distill.teacher_path is set)."""
    derived: WorkerSpec = field(default_factory=WorkerSpec)
    """What the trainer derived for the workers (the whole local batch, no correction when
    built by hand)."""

    def compute_dtypes(self, hardware: Hardware) -> ComputeDtypes:
        """actor / ref / rollout dtypes with `auto` resolved for `hardware` and the model
        (its hidden size, from model.path's config.json)."""
        return ComputeDtypes.resolve(
            self.actor.precision.param_dtype,
            self.ref.precision.param_dtype,
            self.rollout.dtype,
            hardware,
            model_hidden_size(self.model.path),
        )
