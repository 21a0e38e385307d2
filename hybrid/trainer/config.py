"""The trainer's typed config tree, its schema: what `python -m hybrid.main` and the YAML in
configs/ set.

Top level: model / actor / ref / rollout / sync (the WorkerDict members' configs,
hybrid.workers.config, hybrid.rollout.config, hybrid.sharding.config), data, sft, algorithm,
reward (hybrid.rewards.config), trainer, fully_async, critic, distill. Each group checks its own
fields in `__post_init__`; the run's config is split by job over four modules:

- here, the dataclasses and their single-group checks;
- hybrid.trainer.config_rules: the rules across groups, run by `TrainerRunConfig.__post_init__`
  before any Ray actor starts; one ValueError lists every problem, each naming its fields;
- hybrid.trainer.config_derived: what the config implies (rows per step, rows per optimizer
  step per rank, a critic, a reference), read through `TrainerRunConfig`'s properties, and the
  `WorkerSpec` the workers receive beside the user's config (`worker_config()`), never as fields
  a user could set;
- hybrid.trainer.config_files: the files a run reads (`check_paths()`).

The dataclasses hold every default; hybrid.trainer.compose registers them as Hydra's `schema`
node, which the YAML in configs/ only overrides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from hybrid.rewards.config import RewardConfig
from hybrid.rollout.config import RolloutConfig
from hybrid.sharding.config import SyncConfig
from hybrid.trainer import config_derived as derived
from hybrid.trainer.config_rules import check_rules
from hybrid.validation import check_choice, check_positive, check_timeout
from hybrid.workers.config import (
    ActorConfig,
    CriticConfig,
    DistillConfig,
    HybridWorkerConfig,
    KlKind,
    ModelConfig,
    RefConfig,
    WorkerSpec,
)

Sink = Literal["console", "jsonl", "tensorboard", "wandb"]
MODEL_PATH_UNSET = "???"
"""model.path of a config that leaves it to the command line (OmegaConf's mark of a required
value): the schema's, and the GPU presets'. A run refuses it (`check_paths`); the planner and
the doctor read such a config without a model."""
Mode = Literal["colocated", "split", "fully_async"]
"""trainer.mode: where generation runs and how weights reach it (docs/modes.md)."""


@dataclass(frozen=True)
class DataConfig:
    train_files: list[str] = field(default_factory=list)
    """Parquet or jsonl files in the prompt layout (prompt, data_source, reward_model, extra_info)."""
    val_files: list[str] = field(default_factory=list)
    """Held-out prompts for validation (greedy); empty: no validation."""
    max_prompt_length: int = 32
    """Prompts longer than this (in tokens, after the chat template) are filtered and counted."""
    train_batch_size: int = 16
    """Prompts per step (each sampled rollout.n times)."""
    val_batch_size: int = 64
    """Prompts per validation generate call."""
    shuffle: bool = True
    """Train on the prompts in a new random order each epoch (seeded by `seed`); false: in
    file order."""
    seed: int = 0
    """Shuffling seed."""

    def __post_init__(self) -> None:
        check_positive(
            "data", max_prompt_length=self.max_prompt_length, train_batch_size=self.train_batch_size
        )
        check_positive("data", val_batch_size=self.val_batch_size)


Truncation = Literal["error", "right"]
"""sft.truncation: what an SFT row longer than sft.max_length does."""


@dataclass(frozen=True)
class SftConfig:
    """Supervised fine-tuning on the actor before RL (docs/sft.md): one stage of
    sft.total_steps optimizer steps, then the RL stage starts from its weights."""

    train_files: list[str] = field(default_factory=list)
    """Parquet or jsonl files of SFT rows: {prompt, response} or {messages}; empty: no SFT."""
    total_steps: int = 100
    """Optimizer steps of the SFT stage."""
    batch_size: int = 16
    """Rows per SFT step, across the training workers (an equal share each)."""
    max_length: int = 64
    """The most tokens of a row, prompt and target together (after the chat template)."""
    truncation: Truncation = "error"
    """A row longer than max_length. error: the run stops naming the file and row; right:
    its last tokens are cut (counted in sft/truncated_rows and a warning)."""
    lr: float = 1e-5
    """The AdamW learning rate while SFT runs (RL then trains with actor.optim.lr, from fresh
    optimizer moments)."""
    save_freq: int = 0
    """Checkpoint every N SFT steps under output_dir/sft/checkpoints (0: only at the stage's
    end; the stage's last step is always saved)."""
    seed: int = 0
    """Seed of the SFT rows' shuffle (one order per epoch)."""

    def __post_init__(self) -> None:
        check_positive(
            "sft",
            total_steps=self.total_steps,
            batch_size=self.batch_size,
            max_length=self.max_length,
            lr=self.lr,
        )
        check_choice("sft", "truncation", self.truncation, get_args(Truncation))
        if self.save_freq < 0:
            raise ValueError(
                f"sft.save_freq must be >= 0 (0: only at the stage's end), got {self.save_freq}"
            )

    @property
    def enabled(self) -> bool:
        return bool(self.train_files)


OffPolicyCorrection = Literal[
    "none", "tis", "token_tis", "decoupled", "mask", "icepop", "seq_mask_is"
]
BANDED_CORRECTIONS = ("icepop", "seq_mask_is")
"""Corrections that keep a band [1/importance_cap, importance_cap] of weights."""
AdvEstimator = Literal["grpo", "gae", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo"]


@dataclass(frozen=True)
class KlControlConfig:
    """The coefficient of the KL penalty in the reward (algorithm.use_kl_in_reward)."""

    type: Literal["fixed", "adaptive"] = "fixed"
    """fixed: kl_coef throughout; adaptive: the coefficient follows the measured KL towards
    target_kl (Ziegler et al.), by at most 20% x batch / horizon per step."""
    kl_coef: float = 0.001
    """The (starting) coefficient."""
    target_kl: float = 0.1
    """adaptive: the KL per token the controller steers towards."""
    horizon: int = 10000
    """adaptive: samples over which the coefficient may move by the full proportional error."""

    def __post_init__(self) -> None:
        check_choice("algorithm.kl_ctrl", "type", self.type, ("fixed", "adaptive"))
        if self.kl_coef < 0:
            raise ValueError(f"algorithm.kl_ctrl.kl_coef must be >= 0, got {self.kl_coef}")
        check_positive("algorithm.kl_ctrl", target_kl=self.target_kl, horizon=self.horizon)


OnExhausted = Literal["error", "short"]


@dataclass(frozen=True)
class FilterGroupsConfig:
    """DAPO's dynamic sampling: a prompt group whose rule rewards are all equal (every sample
    right, or every one wrong) has no group-relative signal, so it is dropped before the step
    and more prompts are generated until the step has data.train_batch_size groups that carry
    one (docs/algorithms.md, "Dynamic sampling (DAPO)")."""

    enable: bool = False
    """Filter groups and over-sample (needs rollout.n >= 2 and rule rewards only)."""
    max_num_gen_batches: int = 10
    """The most generation rounds one train step may take (colocated and split: batches of
    data.train_batch_size prompts; fully_async: that many times the groups of an update taken
    from the queue), the first included."""
    on_exhausted: OnExhausted = "error"
    """When the rounds run out before the batch is full of informative groups. error: stop the
    run naming this field; short: train anyway, the batch completed with the uninformative
    groups the rounds produced (they add no group-relative advantage), counted in
    filter/groups_backfilled and filter/short_batches."""

    def __post_init__(self) -> None:
        if self.max_num_gen_batches < 1:
            raise ValueError(
                "algorithm.filter_groups.max_num_gen_batches must be >= 1 (the rounds a step may "
                f"take, the first included; verl's <= 0 'unbounded' is refused: a task the "
                f"policy always or never solves would generate forever), got "
                f"{self.max_num_gen_batches}"
            )
        check_choice(
            "algorithm.filter_groups", "on_exhausted", self.on_exhausted, get_args(OnExhausted)
        )


@dataclass(frozen=True)
class AlgorithmConfig:
    adv_estimator: AdvEstimator = "grpo"
    """grpo (group-relative), rloo (leave-one-out baseline), reinforce_plus_plus (whitened
    returns-to-go), reinforce_plus_plus_baseline (verl's: the outcome minus its group's mean on
    every token, whitened over the batch), gae (PPO with a critic: generalized advantage
    estimation on its values)."""
    norm_adv_by_std: bool = True
    """Divide by the group's std (GRPO); False is Dr.GRPO."""
    gamma: float = 1.0
    """Discount per response token (gae, reinforce_plus_plus; the outcome estimators and
    reinforce_plus_plus_baseline take none), in (0, 1]."""
    lam: float = 1.0
    """GAE's lambda, in [0, 1]: 1 = Monte-Carlo returns minus the value, 0 = one-step TD."""
    use_kl_in_reward: bool = False
    """Subtract kl_ctrl's coefficient x the per-token KL(actor || ref) from the token rewards
    (PPO's penalty; independent of actor.use_kl_loss)."""
    kl_penalty: KlKind = "k1"
    """The per-token KL estimator of the in-reward penalty."""
    kl_ctrl: KlControlConfig = field(default_factory=KlControlConfig)
    """The penalty's coefficient: fixed or adaptive."""
    ppo_mini_batch_size: int = 16
    """Prompts per optimizer step (times rollout.n rows), across all workers."""
    skip_old_log_prob: bool = True
    """When the update is on-policy (actor.ppo_epochs 1 and one mini-batch per update: per
    train step colocated, per take with fully_async), take the old log-probs from the update's
    own forward instead of a separate pass (the ratio is exactly 1). False runs the pass anyway
    (the before/after benchmark)."""
    off_policy_correction: OffPolicyCorrection = "none"
    """How the update treats tokens sampled by older weights (split and fully-async runs):
    none: PPO against the trainer's own log-probs before the update; tis: those tokens'
    advantages weighted by min(pi_old / pi_rollout, importance_cap); decoupled (AReaL):
    weighted by pi_old / pi_rollout, tokens above importance_cap leave the loss; mask:
    tokens more than mask_version_lag versions old leave the loss; token_tis: another name
    for tis; icepop: weighted by pi_old / pi_rollout, tokens outside [1/importance_cap,
    importance_cap] leave the loss; seq_mask_is: each row weighted by the geometric mean of
    its tokens' pi_old / pi_rollout, rows outside [1/importance_cap, importance_cap] leave
    the loss."""
    importance_cap: float = 2.0
    """tis: the truncation of the importance weight; decoupled: the weight above which a
    token leaves the loss; icepop, seq_mask_is: the band's upper end (> 1), its lower end
    1/importance_cap. Also the cap the mismatch metrics count tokens beyond
    (rollout/ratio_above_cap, rollout/ratio_below_cap), whatever the correction."""
    mask_version_lag: int = 1
    """mask: most versions a token may lag and still be trained on."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO's dynamic sampling: groups whose rewards are all equal leave the batch, which is
    refilled from further generation rounds."""

    def __post_init__(self) -> None:
        check_choice("algorithm", "adv_estimator", self.adv_estimator, get_args(AdvEstimator))
        if not 0 < self.gamma <= 1:
            raise ValueError(f"algorithm.gamma must be in (0, 1], got {self.gamma}")
        if not 0 <= self.lam <= 1:
            raise ValueError(f"algorithm.lam must be in [0, 1], got {self.lam}")
        check_choice("algorithm", "kl_penalty", self.kl_penalty, get_args(KlKind))
        check_positive("algorithm", ppo_mini_batch_size=self.ppo_mini_batch_size)
        check_choice(
            "algorithm",
            "off_policy_correction",
            self.off_policy_correction,
            get_args(OffPolicyCorrection),
        )
        check_positive("algorithm", importance_cap=self.importance_cap)
        if self.off_policy_correction in BANDED_CORRECTIONS and self.importance_cap <= 1:
            raise ValueError(
                f"algorithm.importance_cap must be > 1 with algorithm.off_policy_correction="
                f"{self.off_policy_correction} (the band is [1/cap, cap]), got {self.importance_cap}"
            )
        if self.mask_version_lag < 0:
            raise ValueError(
                f"algorithm.mask_version_lag must be >= 0, got {self.mask_version_lag}"
            )


@dataclass(frozen=True)
class FullyAsyncConfig:
    """verl's fully-async mode (trainer.mode=fully_async): a Rollouter generates continuously
    into a message queue, the trainer updates per mini-batch as groups arrive and publishes
    weights every trigger_parameter_sync_step updates."""

    staleness_threshold: float = 0.1
    """The Rollouter starts at most (1 + threshold) x the groups one weight version trains
    before it waits for the next version (verl's users run 0.1 - 0.5)."""
    trigger_parameter_sync_step: int = 1
    """Updates (each of require_batches mini-batches) per train step; the trainer publishes
    a new weight version after each train step."""
    require_batches: int = 1
    """Mini-batches of algorithm.ppo_mini_batch_size groups the trainer takes per update."""
    partial_rollout: bool = True
    """true (plan 2): a new version is loaded between generation chunks and unfinished
    samples continue under it (their tokens carry both versions); false (plan 1): new
    versions are loaded only between whole generation batches."""
    max_version_lag: int = 1
    """Hard bound: a group whose oldest token lags more versions than this when the trainer
    takes it is dropped (and counted), never trained on."""
    chunk_tokens: int = 8
    """Plan 2: engine steps (about one token of every sample in flight each) between two
    chances to load new weights: the longest a published version waits for the Rollouter.
    Unfinished samples stay in the engine from one chunk to the next."""

    def __post_init__(self) -> None:
        if self.staleness_threshold < 0:
            raise ValueError(
                f"fully_async.staleness_threshold must be >= 0, got {self.staleness_threshold}"
            )
        check_positive(
            "fully_async",
            trigger_parameter_sync_step=self.trigger_parameter_sync_step,
            require_batches=self.require_batches,
            chunk_tokens=self.chunk_tokens,
        )
        if self.max_version_lag < 0:
            raise ValueError(
                f"fully_async.max_version_lag must be >= 0, got {self.max_version_lag}"
            )


@dataclass(frozen=True)
class TrainerConfig:
    total_steps: int = 100
    """Training steps to run (the run ends there); 0 with sft.train_files set: an SFT-only
    run (the SFT stage, then the export)."""
    output_dir: str = "outputs/run"
    """Where metrics.jsonl, checkpoints and the final HF model go."""
    num_workers: int = 2
    """WorkerDicts (GPUs, or CPU slots) in all: the single-node shorthand. With several nodes
    it must equal nnodes x n_gpus_per_node."""
    nnodes: int = 1
    """Nodes the workers are spread over, n_gpus_per_node on each (one placement group per
    node; ranks are numbered node by node)."""
    n_gpus_per_node: int | None = None
    """Workers per node (GPUs, or CPU slots); None: num_workers / nnodes."""
    use_gpu: bool = False
    """One GPU per worker when true."""
    mode: Mode = "colocated"
    """colocated: every worker generates and trains in turn (the hybrid engine). split:
    explorer workers (vLLM only) generate while trainer workers (FSDP actor + reference)
    train; weights move between them by sync.method on sync.style's schedule. fully_async:
    the split placement with a Rollouter generating continuously into a message queue
    (the fully_async group; sync.style does not apply)."""
    num_explorer_workers: int = 1
    """split and fully_async: workers that host only the rollout engine."""
    num_trainer_workers: int = 1
    """split and fully_async: workers that host the actor and the reference."""
    ray_address: str | None = None
    """Join this Ray cluster instead of starting one: an address, or `auto` for the cluster
    this machine belongs to (`ray start`); also RAY_ADDRESS. None starts a local cluster."""
    critic_warmup: int = 0
    """PPO with a critic: the first N steps train only the critic (the actor waits until its
    values are worth a baseline)."""
    save_freq: int = 0
    """Checkpoint every N steps (0: only at the end)."""
    max_checkpoints_to_keep: int | None = None
    """Keep only the newest N complete checkpoints in output_dir/checkpoints (None: keep all);
    older ones are deleted after a newer one is complete, the latest never."""
    test_freq: int = 0
    """Validate every N steps (0: never during training)."""
    val_before_train: bool = False
    """Validate once before the first step."""
    val_n: int = 1
    """Samples per validation prompt: metrics per data source report mean@n, best@n, maj@n
    and pass@k over them (docs/evaluation.md); 1 with val_temperature 0 is greedy."""
    val_temperature: float = 0.0
    """Validation's sampling temperature (0: greedy, which needs val_n=1)."""
    val_top_p: float = 1.0
    """Validation's nucleus sampling mass."""
    resume: Literal["auto", "disable"] = "auto"
    """auto: continue from the latest complete checkpoint in output_dir."""
    loggers: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Metric sinks: console, jsonl, tensorboard, wandb (offline works without network)."""
    seed: int = 0
    """Seed of everything the driver samples."""
    export_hf: bool = True
    """Write the final actor as a Hugging Face model directory."""
    memory_log_freq: int = 1
    """Append the memory ledger of every N-th step to output_dir/memory.jsonl (0: never;
    the initialisation is always written). `python -m profiling.memory_report` reads it."""
    memory_snapshot_step: int | None = None
    """On CUDA, record torch's allocation history during this step and save it under
    output_dir/memory_snapshots/ (viewable at pytorch.org/memory_viz)."""
    log_freq: int = 10
    """Print a one-line metrics summary to the console every N steps (the progress bar moves
    every step; the metric sinks, e.g. metrics.jsonl, still get every step)."""
    verbose: bool = False
    """Show vLLM, Ray and library logs on the console; false: they go to
    output_dir/logs/worker_<rank>.log and driver.log, and only warnings and errors are shown."""
    stall_timeout_s: float = 600.0
    """The shortest deadline of any phase the driver waits on (a generation, an update, a weight
    publish, a checkpoint save): a phase may take 4x the slowest it took earlier in the run,
    never less than this; its first call (model build, engine start, compilation) 3x this.
    Past it the run stops with an error naming the phase, the ranks and what they last did
    (docs/configuration.md, Deadlines)."""

    def __post_init__(self) -> None:
        check_timeout("trainer.stall_timeout_s", self.stall_timeout_s)
        check_positive("trainer", num_workers=self.num_workers, nnodes=self.nnodes)
        if self.total_steps < 0:
            raise ValueError(
                f"trainer.total_steps must be >= 0 (0: an SFT-only run), got {self.total_steps}"
            )
        self._check_nodes()
        check_choice("trainer", "mode", self.mode, get_args(Mode))
        if self.split:
            check_positive(
                "trainer",
                num_explorer_workers=self.num_explorer_workers,
                num_trainer_workers=self.num_trainer_workers,
            )
        check_positive("trainer", val_n=self.val_n, val_top_p=self.val_top_p)
        if self.val_temperature < 0 or self.val_top_p > 1:
            raise ValueError(
                "trainer.val_temperature must be >= 0 and trainer.val_top_p in (0, 1], got "
                f"{self.val_temperature} and {self.val_top_p}"
            )
        if self.val_n > 1 and self.val_temperature == 0:
            raise ValueError(
                f"trainer.val_n={self.val_n} samples greedily (trainer.val_temperature=0), so "
                "its samples are all the same answer: set trainer.val_temperature > 0"
            )
        if self.log_freq < 1:
            raise ValueError(f"trainer.log_freq must be >= 1, got {self.log_freq}")
        if self.critic_warmup < 0:
            raise ValueError(f"trainer.critic_warmup must be >= 0, got {self.critic_warmup}")
        if self.memory_log_freq < 0:
            raise ValueError(f"trainer.memory_log_freq must be >= 0, got {self.memory_log_freq}")
        if self.memory_snapshot_step is not None:
            if not self.use_gpu:
                raise ValueError(
                    "trainer.memory_snapshot_step needs CUDA (trainer.use_gpu=true): torch "
                    "records allocation history only for CUDA memory"
                )
            if not 1 <= self.memory_snapshot_step <= self.total_steps:
                raise ValueError(
                    f"trainer.memory_snapshot_step must be in [1, trainer.total_steps="
                    f"{self.total_steps}], got {self.memory_snapshot_step}"
                )
        check_choice("trainer", "resume", self.resume, ("auto", "disable"))
        if self.max_checkpoints_to_keep is not None and self.max_checkpoints_to_keep < 1:
            raise ValueError(
                "trainer.max_checkpoints_to_keep must be >= 1 (or null: keep all), "
                f"got {self.max_checkpoints_to_keep}"
            )
        for sink in self.loggers:
            check_choice("trainer", "loggers", sink, get_args(Sink))

    def _check_nodes(self) -> None:
        if self.n_gpus_per_node is None:
            if self.num_workers % self.nnodes:
                raise ValueError(
                    f"trainer.num_workers ({self.num_workers}) must be divisible by "
                    f"trainer.nnodes ({self.nnodes}): every node runs the same number of workers"
                )
            return
        if self.n_gpus_per_node < 1:
            raise ValueError(f"trainer.n_gpus_per_node must be >= 1, got {self.n_gpus_per_node}")
        if self.nnodes * self.n_gpus_per_node != self.num_workers:
            raise ValueError(
                f"trainer.num_workers ({self.num_workers}) must equal trainer.nnodes x "
                f"trainer.n_gpus_per_node ({self.nnodes} x {self.n_gpus_per_node} = "
                f"{self.nnodes * self.n_gpus_per_node}): set trainer.num_workers to the total"
            )

    @property
    def workers_per_node(self) -> int:
        return self.num_workers // self.nnodes

    @property
    def split(self) -> bool:
        """Explorer and trainer workers apart (split and fully_async)."""
        return self.mode != "colocated"

    @property
    def training_workers(self) -> int:
        """Workers that hold the actor (and so split each training batch)."""
        return self.num_trainer_workers if self.split else self.num_workers

    def group_on_nodes(self, workers: int) -> list[int]:
        """A split group's workers per placement group: one node entry for all of them on a
        single node, else whole nodes of workers_per_node."""
        if self.nnodes == 1:
            return [workers]
        return [self.workers_per_node] * (workers // self.workers_per_node)

    @property
    def process_on_nodes(self) -> list[int]:
        """Workers per placement group, one group per node (the resource pool's layout)."""
        return [self.workers_per_node] * self.nnodes


@dataclass(frozen=True)
class TrainerRunConfig:
    """The whole run: every group above and the workers' (hybrid.workers.config,
    hybrid.rewards.config, hybrid.rollout.config, hybrid.sharding.config). Built, every group
    has checked its own fields; `__post_init__` then runs the rules across groups
    (hybrid.trainer.config_rules). The properties and methods below read values the config
    implies (hybrid.trainer.config_derived); `check_paths` checks the files it names."""

    model: ModelConfig
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    fully_async: FullyAsyncConfig = field(default_factory=FullyAsyncConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    sft: SftConfig = field(default_factory=SftConfig)

    def __post_init__(self) -> None:
        check_rules(self)

    def check_paths(self) -> None:
        """The files a run reads exist (not part of __post_init__: the memory planner reads a
        run's config on a machine without its data); hybrid.trainer.config_files."""
        from hybrid.trainer.config_files import check_paths

        check_paths(self)

    # What the config implies, read at dozens of call sites: hybrid.trainer.config_derived.

    @property
    def use_critic(self) -> bool:
        return derived.use_critic(self)

    @property
    def needs_reference(self) -> bool:
        """The reference's log-probs serve the KL loss and the KL penalty in the reward."""
        return derived.needs_reference(self)

    @property
    def data_parallel_workers(self) -> int:
        """The trainer's data-parallel slots: its workers, or their sp groups."""
        return derived.data_parallel_workers(self)

    @property
    def rows_per_step(self) -> int:
        """Samples per step: prompts x rollout.n."""
        return derived.rows_per_step(self)

    @property
    def on_policy_update(self) -> bool:
        """One epoch over one mini-batch: the update's own first pass is the old log-probs."""
        return derived.on_policy_update(self)

    @property
    def groups_per_update(self) -> int:
        """fully_async: prompt groups the trainer takes for one update."""
        return derived.groups_per_update(self)

    @property
    def groups_per_version(self) -> int:
        """fully_async: prompt groups trained with one weight version (one train step)."""
        return derived.groups_per_version(self)

    @property
    def mini_batch_rows_per_worker(self) -> int:
        return derived.mini_batch_rows_per_worker(self)

    def worker_spec(self) -> WorkerSpec:
        """Rows per optimizer step on each rank and the off-policy caps in effect."""
        return derived.worker_spec(self)

    def worker_config(self) -> HybridWorkerConfig:
        """What every WorkerDict member receives: the user's groups and the derived
        `WorkerSpec`."""
        return derived.worker_config(self)
