"""RayWorkerGroup: one WorkerDict actor per bundle, and the views the driver calls through.

A group built from a plain `RayClassWithInitArgs` hosts one member and exposes its registered
methods directly. A group built from `create_colocated_worker_cls(...)` hosts several;
`spawn(prefix_set=...)` returns one `WorkerGroupView` per member over the same actors
(`actor_rollout_wg.generate_sequences(batch)`), and the group itself answers the prefixed names
(`group.actor_rollout_generate_sequences(batch)`).

Calls fail fast: a worker that raises or dies surfaces at once, named by member, method and
rank, even while its peers are blocked in a collective. With a `log_dir`, each worker's output
goes to `<log_dir>/worker_<rank>.log` (see worker_dict.py) and a dead worker's error carries
the last lines of its log.

Calls never wait forever: with `deadlines`, a call that is still running past its phase's
deadline (hybrid/controller/deadlines.py) raises `StallError`, naming the ranks still in it and
what each was last seen doing (its progress file, its process state: hybrid/controller/stall.py).
A stalled group cannot be asked to do anything more; `shutdown` kills its workers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybrid.controller.cluster import ensure_ray
from hybrid.controller.deadlines import Deadlines
from hybrid.controller.dispatch import MethodSpec, plan_call, registered_methods
from hybrid.controller.errors import WorkerCallError, WorkerDiedError
from hybrid.controller.rank_env import RankEnv
from hybrid.controller.resource_pool import Bundle, NodeRef, RayResourcePool, ranks_by_node
from hybrid.controller.stall import Watch
from hybrid.controller.worker_dict import (
    MemberCall,
    RayClassWithInitArgs,
    WorkerDict,
    WorkerDictClass,
    worker_log_path,
)

_RemoteWorkerDict = ray.remote(WorkerDict)

DEATH_GRACE_S = 5.0
"""After a rank fails, how long the driver waits for the others before it picks the error to
report (a dead worker is the root cause of its peers' collective errors)."""

LOG_TAIL_LINES = 20
"""How many last lines of a dead worker's log its WorkerDiedError quotes."""


def log_tail(path: Path | None, num_lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a worker's log, as a paragraph for an error ("" if there is none)."""
    if path is None or not path.is_file():  # no log dir, or on another node
        return ""
    with path.open("rb") as file:
        file.seek(max(0, path.stat().st_size - 64 * 1024))
        lines = file.read().decode(errors="replace").splitlines()[-num_lines:]
    return f"\nlast lines of {path}:\n" + "\n".join(lines)


class GroupFuture:
    """The pending result of a group call; `get()` waits and folds the per-rank results."""

    def __init__(
        self,
        refs: list[ray.ObjectRef],
        member: str,
        method: str,
        collect: Callable[[list[Any]], Any],
        log_dir: str | None = None,
        rank_nodes: list[NodeRef] | None = None,
        watch: Watch | None = None,
    ) -> None:
        self._refs = refs
        self._member = member
        self._method = method
        self._collect = collect
        self._log_dir = log_dir
        self._rank_nodes = rank_nodes
        self._watch = watch
        self._submitted = time.monotonic()

    @property
    def phase(self) -> str:
        return f"{self._member}.{self._method}"

    def get(self, timeout: float | None = None) -> Any:
        """The folded result. `timeout` (seconds since the call started) raises TimeoutError;
        without one, the group's deadlines apply and a call past its phase's deadline raises
        StallError."""
        watch = None if timeout is not None else self._watch
        limit = timeout if watch is None else watch.deadlines.for_phase(self.phase)
        remaining = None if limit is None else max(limit - self._elapsed(), 0.0)
        try:
            # ray.get on a list raises as soon as any element fails, even while the other
            # ranks are still running (e.g. blocked in a collective with the dead one).
            results = ray.get(self._refs, timeout=remaining)
        except GetTimeoutError:
            if watch is None:
                raise TimeoutError(f"{self.phase} did not finish in {timeout}s") from None
            ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=0)
            pending = [rank for rank, ref in enumerate(self._refs) if ref not in ready]
            rule = watch.deadlines.rule(self.phase)
            raise watch.stall_error(self.phase, pending, self._elapsed(), rule) from None
        except (RayTaskError, RayActorError):
            self._raise_first_failure()
            raise
        if watch is not None:
            watch.deadlines.done(self.phase, self._elapsed())
        return self._collect(list(results))

    def _elapsed(self) -> float:
        return time.monotonic() - self._submitted

    def _raise_first_failure(self) -> None:
        """Raise the root cause among the ranks that have finished: a dead worker if there is
        one (its peers then fail in their collectives, naming nobody), else the error of the
        lowest failed rank.

        A dead worker's peers can notice before Ray reports the death, so the others get
        DEATH_GRACE_S to finish. Every finished rank's error is fetched, so Ray does not
        report the others as unhandled: one failure is one report.
        """
        ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=DEATH_GRACE_S)
        failures: list[WorkerCallError] = []
        for rank, ref in enumerate(self._refs):
            if ref in ready:
                try:
                    self._fetch(ref, rank)
                except WorkerCallError as error:
                    failures.append(error)
        deaths = [f for f in failures if isinstance(f, WorkerDiedError)]
        if deaths or failures:
            raise (deaths or failures)[0]

    def _fetch(self, ref: ray.ObjectRef, rank: int) -> Any:
        try:
            return ray.get(ref)
        except RayTaskError as exc:
            if isinstance(exc.cause, WorkerCallError):
                raise exc.cause from None
            raise WorkerCallError(self._member, self._method, rank, str(exc)) from None
        except RayActorError as exc:
            log = worker_log_path(self._log_dir, rank) if self._log_dir else None
            raise WorkerDiedError(
                self._member,
                self._method,
                rank,
                f"the worker process died{self._where(rank)}: {exc}{log_tail(log)}",
            ) from None

    def _where(self, rank: int) -> str:
        """' on node X (ranks [..] run there)' when the group knows its nodes, and whether
        the node itself is gone."""
        if not self._rank_nodes:
            return ""
        node = self._rank_nodes[rank]
        peers = [r for r, n in enumerate(self._rank_nodes) if n == node]
        gone = "" if node.is_alive() else "; that node has left the Ray cluster"
        return f" on node {node} (ranks {peers} run there{gone})"


@dataclass(frozen=True)
class GroupMethod:
    """A registered member method, bound to a group: calling it runs on every rank."""

    group: RayWorkerGroup
    member: str
    name: str
    spec: MethodSpec

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        future = self.submit(*args, **kwargs)
        return future.get() if self.spec.blocking else future

    def submit(self, *args: Any, **kwargs: Any) -> GroupFuture:
        """Start the call on every rank and return at once (the driver works meanwhile)."""
        return self.group.execute(self.member, self.name, self.spec, args, kwargs)


class RayWorkerGroup:
    """Creates one WorkerDict actor per bundle of `resource_pool` and starts the members.

    `log_dir`: each worker's stdout and stderr go to `<log_dir>/worker_<rank>.log` instead of
    the console (and Ray, if this starts it, shows only its errors on the driver); None leaves
    all output on the console.
    `deadlines`: every call (the members' construction included) raises StallError past its
    phase's deadline; None: calls wait as long as they run. `progress_dir`: where the workers
    write what they are doing (hybrid/controller/progress.py), which a StallError quotes.
    `sp_size`: the trainer's sequence-parallel group size (TRAIN_DP splits by data-parallel
    group).
    """

    def __init__(
        self,
        resource_pool: RayResourcePool,
        ray_cls_with_init: RayClassWithInitArgs | WorkerDictClass,
        ray_address: str | None = None,
        log_dir: str | Path | None = None,
        deadlines: Deadlines | None = None,
        progress_dir: str | Path | None = None,
        sp_size: int = 1,
    ) -> None:
        ensure_ray(ray_address, quiet=log_dir is not None)
        self.sp_size = sp_size
        """Consecutive ranks that split one data-parallel slot's sequences (TRAIN_DP calls)."""
        self.log_dir = None if log_dir is None else str(Path(log_dir).resolve())
        progress = None if progress_dir is None else Path(progress_dir).resolve()
        self.progress_dir = None if progress is None else str(progress)
        self.watch = None if deadlines is None else Watch(deadlines, progress)
        if isinstance(ray_cls_with_init, RayClassWithInitArgs):
            self._members = {ray_cls_with_init.cls.__name__: ray_cls_with_init}
            self._default_member: str | None = ray_cls_with_init.cls.__name__
        else:
            self._members = dict(ray_cls_with_init.members)
            self._default_member = None
        self._methods = {p: registered_methods(spec.cls) for p, spec in self._members.items()}
        self.resource_pool = resource_pool
        self.rank_nodes: list[NodeRef] = []
        """Per rank, the node it runs on."""
        self.actors = self._start_actors(resource_pool)

    @property
    def world_size(self) -> int:
        return len(self.actors)

    @property
    def member_names(self) -> list[str]:
        return list(self._members)

    def spawn(self, prefix_set: Iterable[str]) -> dict[str, WorkerGroupView]:
        """One view per member prefix; views share this group's actors."""
        views = {}
        for prefix in prefix_set:
            if prefix not in self._members:
                raise ValueError(
                    f"no member {prefix!r} in this group; members: {self.member_names}"
                )
            views[prefix] = WorkerGroupView(self, prefix)
        return views

    def method(self, member: str, name: str) -> GroupMethod:
        spec = self._methods[member].get(name)
        if spec is None:
            raise AttributeError(
                f"{member} has no registered method {name!r}; registered: {sorted(self._methods[member])}"
            )
        return GroupMethod(self, member, name, spec)

    def execute(
        self,
        member: str,
        name: str,
        spec: MethodSpec,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> GroupFuture:
        plan = plan_call(spec.dispatch_mode, args, kwargs, self.world_size, self.sp_size)
        refs = [
            actor.call.remote(MemberCall(member, name, rank_args, rank_kwargs))
            for actor, (rank_args, rank_kwargs) in zip(self.actors, plan.per_rank, strict=True)
        ]
        return GroupFuture(
            refs, member, name, plan.collect, self.log_dir, self.rank_nodes, self.watch
        )

    @property
    def stalled(self) -> bool:
        """A call of this group passed its deadline: its workers only answer `shutdown`."""
        return self.watch is not None and self.watch.stalled

    def shutdown(self) -> None:
        """Kill the actors and give the bundles back to the pool. After a stall, the workers
        on this machine are SIGKILLed too: a stopped process ignores Ray's request to exit,
        and Ray's own kill comes seconds later, possibly after this driver is gone."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        if self.watch is not None and self.watch.stalled:
            for pid in self.watch.local_pids.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.actors = []
        self.resource_pool.release()

    def __getattr__(self, name: str) -> GroupMethod:
        # Only reached for names that are not real attributes: route to a member method.
        if name.startswith("_"):
            raise AttributeError(name)
        if self._default_member is not None:
            return self.method(self._default_member, name)
        for prefix in self._members:
            if name.startswith(prefix + "_") and name[len(prefix) + 1 :] in self._methods[prefix]:
                return self.method(prefix, name[len(prefix) + 1 :])
        raise AttributeError(
            f"RayWorkerGroup has no method {name!r}; colocated members {self.member_names} are "
            "reached as <member>_<method> or through spawn(prefix_set=...)"
        )

    def __dir__(self) -> list[str]:
        names = list(super().__dir__())
        for prefix, methods in self._methods.items():
            names += list(methods) if self._default_member else [f"{prefix}_{m}" for m in methods]
        return names

    def ranks_missing(self, path: str | Path) -> list[int]:
        """Ranks whose node does not see `path` (empty when every node shares it)."""
        seen = ray.get([actor.sees_file.remote(str(path)) for actor in self.actors])
        return [rank for rank, ok in enumerate(seen) if not ok]

    def _start_actors(self, pool: RayResourcePool) -> list[Any]:
        bundles = pool.bundles()
        started: list[Any] = []
        try:
            return self._start_members(pool, bundles, started)
        except BaseException:
            # A member that failed or stalled in __init__: nothing of this group stays up.
            for actor in started:
                ray.kill(actor, no_restart=True)
            pool.release()
            raise

    def _start_members(
        self, pool: RayResourcePool, bundles: list[Bundle], started: list[Any]
    ) -> list[Any]:
        in_bundle_order: list[Any] = [
            _RemoteWorkerDict.options(
                num_cpus=pool.bundle_resources["CPU"],
                num_gpus=pool.bundle_resources.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=b.placement_group, placement_group_bundle_index=b.index
                ),
            ).remote()
            for b in bundles
        ]
        started.extend(in_bundle_order)
        # Ranks go node by node from where Ray placed each worker (rank 0's node hosts the
        # rendezvous), so local ranks are right however the placement groups landed.
        nodes = ray.get([actor.node.remote() for actor in in_bundle_order])
        pids = ray.get([actor.pid.remote() for actor in in_bundle_order])
        placements = ranks_by_node([node_id for node_id, _ in nodes])
        by_rank = sorted(range(len(bundles)), key=lambda i: placements[i].rank)
        actors = [in_bundle_order[i] for i in by_rank]
        self.rank_nodes = [NodeRef(*nodes[i]) for i in by_rank]
        if self.watch is not None:  # the driver can read these workers' process states
            here = ray.get_runtime_context().get_node_id()
            self.watch.local_pids = {
                rank: pids[i] for rank, i in enumerate(by_rank) if nodes[i][0] == here
            }
        master_addr, master_port = ray.get(actors[0].rendezvous_address.remote())
        envs = [
            RankEnv(
                rank,
                len(bundles),
                placements[i].local_rank,
                placements[i].local_world_size,
                master_addr,
                master_port,
                node=str(self.rank_nodes[rank]),
            )
            for rank, i in enumerate(by_rank)
        ]
        # Members are constructed concurrently: their __init__ may rendezvous with each other.
        refs = [
            a.start.remote(env, self._members, self.log_dir, self.progress_dir)
            for a, env in zip(actors, envs, strict=True)
        ]
        GroupFuture(
            refs,
            "+".join(self._members),
            "__init__",
            list,
            self.log_dir,
            self.rank_nodes,
            self.watch,
        ).get()
        return actors


class WorkerGroupView:
    """The methods of one member of a colocated group, without the prefix."""

    def __init__(self, group: RayWorkerGroup, member: str) -> None:
        self.group = group
        self.member = member

    @property
    def world_size(self) -> int:
        return self.group.world_size

    def __getattr__(self, name: str) -> GroupMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.group.method(self.member, name)

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self.group._methods[self.member]]

    def __repr__(self) -> str:
        return f"WorkerGroupView(member={self.member!r}, world_size={self.world_size})"
