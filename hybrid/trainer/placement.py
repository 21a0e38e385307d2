"""Where the members run: one worker group that generates and trains in turn (colocated), or
explorer workers (vLLM only) beside trainer workers (FSDP actor, reference, critic).

Either way the driver gets the same `Members` for the train step, plus the explorer group when
there is one. Starting is the one place that talks to Ray's placement; stopping shuts the
engines down first (vLLM must go before its process group), best effort after a failure so
that a dead worker's error does not replace the one that ended the run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybrid.controller import (
    Deadlines,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerGroupView,
    create_colocated_worker_cls,
    ensure_ray,
)
from hybrid.explorer.worker import ExplorerWorker
from hybrid.trainer.checkpoints import shared_dir_error
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.console import print_lines, print_startup_summary, run_log_dir
from hybrid.trainer.judge import make_judge
from hybrid.trainer.step import Members
from hybrid.workers.actor_rollout import ActorRolloutWorker
from hybrid.workers.critic import CriticWorker
from hybrid.workers.ref import ReferenceWorker
from hybrid.workers.reward_model import RewardModelWorker
from hybrid.workers.teacher import TeacherWorker
from hybrid.workers.trainer_worker import TrainerWorker

logger = logging.getLogger(__name__)

AFTER_FAILURE_SHUTDOWN_S = 30.0
"""After a failure, how long the engines get to shut down before their workers are killed."""


@dataclass
class Placement:
    members: Members
    group: RayWorkerGroup
    """The group that holds the actor (colocated: every worker)."""
    explorers: RayWorkerGroup | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    """What the workers resolved (dtypes for `auto`, the sync strategy): rank 0 speaks for
    all, since every rank sees the same hardware kind."""

    def stop(self, after_failure: bool = False) -> None:
        sides = [("trainer", self.members.actor.shutdown_engine, self.group)]
        if self.explorers is not None:
            sides.insert(0, ("explorer", self.explorers.shutdown_engine, self.explorers))
        for name, shutdown_engine, group in sides:
            try:
                if not group.stalled:  # a stuck worker would not answer: it is killed
                    # After a failure, a worker may be stuck without its group knowing yet.
                    wait = AFTER_FAILURE_SHUTDOWN_S if after_failure else None
                    shutdown_engine.submit().get(timeout=wait)
            except Exception as error:
                if not after_failure:
                    raise
                logger.debug("%s engine shutdown after a failure: %s", name, error)
            group.shutdown()


def start(config: TrainerRunConfig) -> Placement:
    """Start the workers of trainer.mode, build their models and write the run's resolved
    config (config.json, with `auto` resolved) and, when split, placement.json."""
    t = config.trainer
    log_dir = run_log_dir(t.output_dir, t.verbose)
    try:
        ensure_ray(t.ray_address, quiet=log_dir is not None)
    except ConnectionError as error:
        raise ValueError(f"trainer.ray_address={t.ray_address!r}: {error}") from None
    deadlines = Deadlines(t.stall_timeout_s)  # one clock for every group and phase of the run
    started: list[RayWorkerGroup] = []
    try:
        placement = (
            start_split(config, log_dir, deadlines, started)
            if t.split
            else start_colocated(config, log_dir, deadlines, started)
        )
    except BaseException:
        # A start that failed or stalled part-way leaves no worker running.
        for group in started:
            group.shutdown()
        raise
    print_startup_summary(config, placement.facts, log_dir)
    write_resolved_config(config, placement.facts)
    return placement


def trainer_members(
    config: TrainerRunConfig, views: dict[str, WorkerGroupView], actor_name: str, workers: int
) -> Members:
    """Build the models of the trainer-side members (the actor's already started); `workers`:
    the trainer's data-parallel slots (its ranks / sp)."""
    c = config
    actor = views[actor_name]
    # With LoRA the reference is the actor's own base (adapters disabled): no second model.
    lora_base = c.model.lora.enabled
    reference = actor if lora_base else views["ref"]
    if c.needs_reference and not lora_base:
        views["ref"].init_model()
    critic = views["critic"] if c.use_critic else None
    if critic is not None:
        critic.init_model()
    reward_model = views["reward_model"] if c.reward.model.enabled else None
    if reward_model is not None:
        reward_model.init_model()
    teacher = views["teacher"] if c.distill.enabled else None
    if teacher is not None:
        teacher.init_model()
    return Members(
        actor=actor,
        reference=reference,
        critic=critic,
        training_workers=workers,
        reward_model=reward_model,
        teacher=teacher,
    )


def progress_dir(config: TrainerRunConfig, side: str) -> Path:
    """Where a group's workers say what they are doing (quoted by a StallError)."""
    return Path(config.trainer.output_dir) / "logs" / "progress" / side


def start_colocated(
    config: TrainerRunConfig,
    log_dir: Path | None,
    deadlines: Deadlines,
    started: list[RayWorkerGroup],
) -> Placement:
    """`started` gets the group as soon as it exists (the caller stops it on a failure)."""
    c, t = config, config.trainer
    worker_config = c.worker_config()
    cls = create_colocated_worker_cls(
        {
            "actor_rollout": RayClassWithInitArgs(ActorRolloutWorker, worker_config),
            "ref": RayClassWithInitArgs(ReferenceWorker, worker_config),
            "critic": RayClassWithInitArgs(CriticWorker, worker_config),
            "reward_model": RayClassWithInitArgs(RewardModelWorker, worker_config),
            "teacher": RayClassWithInitArgs(TeacherWorker, worker_config),
        }
    )
    pool = RayResourcePool(t.process_on_nodes, use_gpu=t.use_gpu)
    print_lines([f"starting {t.num_workers} workers (Ray, FSDP2, vLLM) ..."])
    group = RayWorkerGroup(
        pool,
        cls,
        ray_address=t.ray_address,
        log_dir=log_dir,
        deadlines=deadlines,
        progress_dir=progress_dir(c, "workers"),
        sp_size=c.actor.sp_size,
    )
    started.append(group)
    if t.nnodes > 1:
        unshared = shared_dir_error(t.output_dir, group.ranks_missing, group.rank_nodes)
        if unshared:
            raise ValueError(unshared)
    views = group.spawn(prefix_set={"actor_rollout", "ref", "critic", "reward_model", "teacher"})
    views["actor_rollout"].init_model()
    facts = dict(views["actor_rollout"].describe()[0])
    members = trainer_members(c, views, "actor_rollout", t.num_workers // c.actor.sp_size)
    members.judge = make_judge(c, views["actor_rollout"])
    return Placement(members=members, group=group, facts=facts)


def start_split(
    config: TrainerRunConfig,
    log_dir: Path | None,
    deadlines: Deadlines,
    started: list[RayWorkerGroup],
) -> Placement:
    """`started` gets each group as soon as it exists (the caller stops them on a failure)."""
    c, t = config, config.trainer
    worker_config = c.worker_config()
    print_lines(
        [
            f"starting {t.num_explorer_workers} explorer + {t.num_trainer_workers} trainer "
            "workers (Ray, vLLM | FSDP2) ..."
        ]
    )
    explorers = RayWorkerGroup(
        RayResourcePool(t.group_on_nodes(t.num_explorer_workers), use_gpu=t.use_gpu),
        RayClassWithInitArgs(ExplorerWorker, worker_config),
        ray_address=t.ray_address,
        log_dir=None if log_dir is None else Path(log_dir) / "explorer",
        deadlines=deadlines,
        progress_dir=progress_dir(c, "explorer"),
    )
    started.append(explorers)
    cls = create_colocated_worker_cls(
        {
            # "trainer": the name errors from this member carry (trainer.<method> failed).
            "trainer": RayClassWithInitArgs(TrainerWorker, worker_config),
            "ref": RayClassWithInitArgs(ReferenceWorker, worker_config),
            "critic": RayClassWithInitArgs(CriticWorker, worker_config),
            "reward_model": RayClassWithInitArgs(RewardModelWorker, worker_config),
            "teacher": RayClassWithInitArgs(TeacherWorker, worker_config),
        }
    )
    group = RayWorkerGroup(
        RayResourcePool(t.group_on_nodes(t.num_trainer_workers), use_gpu=t.use_gpu),
        cls,
        ray_address=t.ray_address,
        log_dir=None if log_dir is None else Path(log_dir) / "trainer",
        deadlines=deadlines,
        progress_dir=progress_dir(c, "trainer"),
        sp_size=c.actor.sp_size,
    )
    started.append(group)
    if t.nnodes > 1:  # the trainers' checkpoints and the weight versions need a shared disk
        unshared = shared_dir_error(t.output_dir, group.ranks_missing, group.rank_nodes)
        if unshared:
            raise ValueError(unshared)
    # The reference, PPO's critic, the reward model and the teacher live with the trainer
    # group: they serve the update.
    views = group.spawn(prefix_set={"trainer", "ref", "critic", "reward_model", "teacher"})
    engines = explorers.init_engine.submit()  # the explorers start while the trainers do
    views["trainer"].init_model()
    members = trainer_members(c, views, "trainer", t.num_trainer_workers // c.actor.sp_size)
    members.judge = make_judge(c, explorers)
    engines.get()
    facts = dict(views["trainer"].describe()[0])
    facts.update(explorers.describe()[0])
    placement = {
        "explorer": [str(node) for node in explorers.rank_nodes],
        "trainer": [str(node) for node in group.rank_nodes],
    }
    (Path(t.output_dir) / "placement.json").write_text(json.dumps(placement, indent=1))
    return Placement(members=members, group=group, explorers=explorers, facts=facts)


def write_resolved_config(config: TrainerRunConfig, facts: dict[str, Any]) -> None:
    """config.json with `auto` dtypes replaced by what the workers chose (the memory report
    plans from it)."""
    c = config
    resolved = dataclasses.replace(
        c,
        actor=dataclasses.replace(
            c.actor,
            precision=dataclasses.replace(c.actor.precision, param_dtype=facts["actor_dtype"]),
        ),
        ref=dataclasses.replace(
            c.ref, precision=dataclasses.replace(c.ref.precision, param_dtype=facts["ref_dtype"])
        ),
        rollout=dataclasses.replace(c.rollout, dtype=facts["rollout_dtype"]),
    )
    path = Path(c.trainer.output_dir) / "config.json"
    path.write_text(json.dumps(dataclasses.asdict(resolved), indent=1))
