"""The WorkerDict: one Ray actor per bundle, hosting one instance of each member class.

Members share the process, and so the device and the torch.distributed world; the driver
reaches a member's method by name through `call(member, method, ...)`. The routing is explicit:
no class is generated at run time and nothing is patched.
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybrid.controller.errors import WorkerCallError
from hybrid.controller.rank_env import RankEnv
from hybrid.controller.worker import Worker


@dataclass(frozen=True, init=False, eq=False)
class RayClassWithInitArgs:
    """A Worker class and the arguments to construct it with inside each actor."""

    cls: type[Worker]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def __init__(self, cls: type[Worker], *args: Any, **kwargs: Any) -> None:
        if not (isinstance(cls, type) and issubclass(cls, Worker)):
            raise TypeError(f"RayClassWithInitArgs needs a Worker subclass, got {cls!r}")
        object.__setattr__(self, "cls", cls)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "kwargs", kwargs)

    def instantiate(self) -> Worker:
        return self.cls(*self.args, **self.kwargs)


@dataclass(frozen=True)
class WorkerDictClass:
    """What `create_colocated_worker_cls` returns: the members each WorkerDict actor hosts."""

    members: Mapping[str, RayClassWithInitArgs]
    """Member prefix (e.g. "actor_rollout", "ref") -> its class and init arguments."""


def create_colocated_worker_cls(members: Mapping[str, RayClassWithInitArgs]) -> WorkerDictClass:
    """Colocate several Worker classes in one actor per bundle (see `RayWorkerGroup.spawn`)."""
    if not members:
        raise ValueError("create_colocated_worker_cls needs at least one member")
    for prefix, spec in members.items():
        if not prefix.isidentifier():
            raise ValueError(f"member prefix {prefix!r} must be a Python identifier")
        if not isinstance(spec, RayClassWithInitArgs):
            raise TypeError(f"member {prefix!r} must be a RayClassWithInitArgs, got {spec!r}")
    return WorkerDictClass(members=dict(members))


@dataclass(frozen=True)
class MemberCall:
    """One rank's share of a group call; sent as a single Ray argument (one serialisation)."""

    member: str
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class WorkerDict:
    """The body of each Ray actor. Created empty; `start` exports the rank environment, then
    constructs the members, so a member's `__init__` already sees RANK, MASTER_ADDR, ..."""

    def __init__(self) -> None:
        self._members: dict[str, Worker] = {}
        self._rank = -1

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's address and a free port (asked of rank 0 only)."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def start(self, env: RankEnv, members: Mapping[str, RayClassWithInitArgs]) -> None:
        self._rank = env.rank
        for prefix, spec in members.items():
            # Re-exported before each member: an earlier member's libraries may have rewritten
            # them (vLLM's CPU platform sets LOCAL_WORLD_SIZE to its tensor-parallel size).
            os.environ.update(env.to_environ())
            try:
                self._members[prefix] = spec.instantiate()
            except Exception as exc:
                raise _call_error(prefix, "__init__", env.rank, exc) from None

    def call(self, request: MemberCall) -> Any:
        try:
            return getattr(self._members[request.member], request.method)(
                *request.args, **request.kwargs
            )
        except Exception as exc:
            raise _call_error(request.member, request.method, self._rank, exc) from None

    def pid(self) -> int:
        return os.getpid()


def _call_error(member: str, method: str, rank: int, exc: Exception) -> WorkerCallError:
    detail = "".join(traceback.format_exception(exc))
    return WorkerCallError(member, method, rank, detail.rstrip())
