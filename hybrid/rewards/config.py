"""Everything under `reward.*`, one typed group: how rule rewards are called (`RewardConfig`:
the custom function, the process pool, deadlines, what a failed row does), the reward model
(`reward.model`, a WorkerDict member: hybrid/workers/reward_model.py), the generative judge
(`reward.judge`, the policy's own engine: hybrid/trainer/judge.py) and DAPO's overlong shaping
(`reward.overlong_buffer`: hybrid/rewards/overlong.py).

Each class checks its own fields in `__post_init__`, naming them as a user writes them; the
rules that span groups (the overlong buffer against rollout.response_length, dynamic sampling
against the scorers) are the run's, in hybrid.trainer.config_rules. Here, below the workers and
the trainer, so that both import it (docs/architecture.md, "Import arrows").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import get_args

from hybrid.model_groups import ForwardPrecisionConfig, ParamOffloadConfig
from hybrid.rewards.judge import DEFAULT_PATTERN, compile_pattern
from hybrid.rewards.model_score import COMBINE_CHOICES, Combine
from hybrid.rewards.outcome import OnError as OnRewardError
from hybrid.validation import check_choice, check_positive, check_timeout


def combine_for(
    data_source: str, combine: Combine, by_source: dict[str, Combine] | None
) -> Combine:
    """How a scorer's score joins the rule reward for `data_source`: its override, else
    `combine` (reward.model and reward.judge alike)."""
    return (by_source or {}).get(data_source, combine)


def check_combination(
    owner: str, combine: str, by_source: dict[str, Combine] | None, coef: float
) -> None:
    """A scorer's combine, per-source combines and coefficient (reward.model, reward.judge);
    each error names the field under `owner`."""
    check_choice(owner, "combine", combine, COMBINE_CHOICES)
    if by_source is not None and not isinstance(by_source, dict):
        raise ValueError(
            f"{owner}.combine_by_source must map data sources to one of "
            f"{list(COMBINE_CHOICES)}, got {by_source!r}"
        )
    for source, mode in (by_source or {}).items():
        check_choice(f"{owner}.combine_by_source", str(source), mode, COMBINE_CHOICES)
    if not math.isfinite(coef) or coef == 0:
        raise ValueError(f"{owner}.coef must be a finite number other than 0, got {coef}")


@dataclass(frozen=True)
class RewardModelConfig:
    """A discriminative reward model (`reward.model`): a Hugging Face sequence classifier with
    one label, a WorkerDict member beside the reference (hybrid/workers/reward_model.py). It
    reads each row as text in its own tokenizer and chat template; its score joins the rule
    reward per data source (hybrid/rewards/model_score.py; docs/reward-models.md)."""

    path: str | None = None
    """Hugging Face directory of an AutoModelForSequenceClassification checkpoint with
    num_labels=1 (config.json names a *ForSequenceClassification architecture); null: no
    reward model."""
    tokenizer_path: str | None = None
    """Where its tokenizer (and chat template) is read from; null: `path` itself, which must
    then hold tokenizer files. Set it (e.g. to model.path) for a reward model that reads the
    policy's tokens; its vocabulary must then cover that tokenizer's ids."""
    combine: Combine = "sum"
    """How its score joins the rule reward: sum (rule + coef x score) or replace (coef x
    score; the data source then needs no rule reward)."""
    combine_by_source: dict[str, Combine] | None = None
    """Per data source overrides of `combine`, e.g. {gsm8k: sum, chat: replace}; sources that
    no row carries are ignored. null: `combine` for every source (a mapping, not {}: Hydra
    lets a command line replace a null with a mapping, not add keys to an empty one)."""
    coef: float = 1.0
    """Scale of the model's score in the reward (a finite number, not 0)."""
    micro_batch_size: int = 8
    """Rows per forward pass on each rank."""
    max_length: int = 1024
    """Most tokens (prompt + response, in its tokenizer) it reads per row; a longer row loses
    tokens from the left of its prompt, counted in reward/model_truncated."""
    precision: ForwardPrecisionConfig = field(default_factory=ForwardPrecisionConfig)
    """The dtype it is stored and computed in."""
    offload: ParamOffloadConfig = field(default_factory=ParamOffloadConfig)
    """Its weights on CPU outside its pass (CUDA only; no-op on CPU), like the reference's."""

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def combine_for(self, data_source: str) -> Combine:
        return combine_for(data_source, self.combine, self.combine_by_source)

    def __post_init__(self) -> None:
        owner = "reward.model"
        if self.path is not None and not self.path.strip():
            raise ValueError(f"{owner}.path is empty: a model directory, or null for none")
        check_combination(owner, self.combine, self.combine_by_source, self.coef)
        check_positive(owner, micro_batch_size=self.micro_batch_size, max_length=self.max_length)
        self.precision.check(f"{owner}.precision")
        if self.path is None:
            # Settings that change what the reward is: without a model they would do nothing.
            given = {
                "tokenizer_path": self.tokenizer_path is not None,
                "combine": self.combine != "sum",
                "combine_by_source": bool(self.combine_by_source),
            }
            changed = [name for name, set_ in given.items() if set_]
            if changed:
                raise ValueError(
                    f"{owner}.path is null (no reward model) but {owner}.{changed[0]} is set: "
                    f"set {owner}.path to a sequence-classification model, or drop the setting"
                )


@dataclass(frozen=True)
class JudgeConfig:
    """A generative judge (`reward.judge`): the policy's own rollout engine (the actor_rollout
    group colocated, the explorers split and fully_async) reads each row through a prompt
    template, answers greedily, and the number a regex reads from its answer joins the rule
    reward per data source like a reward model's score (hybrid/trainer/judge.py;
    docs/reward-models.md). Not together with reward.model: a run scores with one model."""

    template_path: str | None = None
    """A text file with {prompt}, {response} and {ground_truth} placeholders (str.format
    syntax, a literal brace doubled): the judge's user message, put through the policy's chat
    template. It must name {response}. null: no judge."""
    pattern: str = DEFAULT_PATTERN
    """A regex with one group: the number in its LAST match in the answer is the score; no
    match (or no finite number) makes the row `unparsable`, which reward.on_error handles."""
    max_tokens: int = 64
    """Most tokens of the judge's answer (greedy)."""
    max_prompt_length: int = 448
    """Most tokens of a judge prompt; a longer one loses tokens from the left, counted in
    reward/judge_truncated. With max_tokens it must fit rollout.max_model_len."""
    combine: Combine = "sum"
    """How its score joins the rule reward: sum (rule + coef x score) or replace (coef x
    score; the data source then needs no rule reward)."""
    combine_by_source: dict[str, Combine] | None = None
    """Per data source overrides of `combine`, as reward.model.combine_by_source."""
    coef: float = 1.0
    """Scale of the judge's score in the reward (a finite number, not 0)."""

    @property
    def enabled(self) -> bool:
        return self.template_path is not None

    def combine_for(self, data_source: str) -> Combine:
        return combine_for(data_source, self.combine, self.combine_by_source)

    def __post_init__(self) -> None:
        owner = "reward.judge"
        if self.template_path is not None and not self.template_path.strip():
            raise ValueError(f"{owner}.template_path is empty: a template file, or null for none")
        compile_pattern(self.pattern)  # its errors name reward.judge.pattern
        check_positive(owner, max_tokens=self.max_tokens, max_prompt_length=self.max_prompt_length)
        check_combination(owner, self.combine, self.combine_by_source, self.coef)
        if self.template_path is None:
            # Settings that change what the reward is: without a judge they would do nothing.
            changed = [
                name
                for name, set_ in (
                    ("combine", self.combine != "sum"),
                    ("combine_by_source", bool(self.combine_by_source)),
                )
                if set_
            ]
            if changed:
                raise ValueError(
                    f"{owner}.template_path is null (no judge) but {owner}.{changed[0]} is set: "
                    f"set {owner}.template_path to a prompt template, or drop the setting"
                )


@dataclass(frozen=True)
class OverlongBufferConfig:
    """reward.overlong_buffer: DAPO's soft length penalty (verl's
    reward_model.overlong_buffer.{enable,len,penalty_factor})."""

    enable: bool = False
    """Add the penalty to every training row's reward (validation scores stay unshaped)."""
    len: int = 1
    """L_cache: the buffer before a row's budget over which the penalty ramps from 0 to
    -penalty_factor; must be < rollout.response_length. 1 penalises only the rows that reach
    their budget (in effect a hard penalty on cut responses); DAPO used 4096 of 20480."""
    penalty_factor: float = 1.0
    """Scale of the penalty: a response at its budget scores this much less. 0 logs the
    reward/overlong_* metrics without changing the rewards."""

    def __post_init__(self) -> None:
        if isinstance(self.len, bool) or not isinstance(self.len, int) or self.len < 1:
            raise ValueError(
                f"reward.overlong_buffer.len must be an integer >= 1 (tokens), got {self.len!r}"
            )
        if not (math.isfinite(self.penalty_factor) and self.penalty_factor >= 0):
            raise ValueError(
                "reward.overlong_buffer.penalty_factor must be a finite number >= 0, "
                f"got {self.penalty_factor}"
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
