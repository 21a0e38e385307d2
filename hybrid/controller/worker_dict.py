"""The WorkerDict: one Ray actor per bundle, hosting one instance of each member class.

Members share the process, and so the device and the torch.distributed world; the driver
reaches a member's method by name through `call(member, method, ...)`. The routing is explicit:
no class is generated at run time and nothing is patched.

With a log directory, `start` first points the process's stdout and stderr (the file
descriptors, so C-level and vLLM output too) at `<log_dir>/worker_<rank>.log`; only warnings
of our own `hybrid.*` loggers still reach the console, once each. Errors travel as
`WorkerCallError` with the worker's traceback, whatever the log setting.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from hybrid.controller.errors import WorkerCallError
from hybrid.controller.progress import ProgressWriter
from hybrid.controller.rank_env import RankEnv
from hybrid.controller.worker import Worker
from hybrid.heap import freeze_heap
from hybrid.memory.ledger import process_ledger
from hybrid.ports import free_port


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


def worker_log_path(log_dir: str | Path, rank: int) -> Path:
    """Where rank `rank` writes its stdout and stderr when the group has a log directory."""
    return Path(log_dir) / f"worker_{rank}.log"


class OnceFilter(logging.Filter):
    """Passes each message template once per process (errors always): a warning repeated
    every step reaches the console once; the log file has every occurrence."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        key = (record.name, str(record.msg))
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


def redirect_output(log_file: Path) -> TextIO:
    """Send this process's fds 1 and 2 to `log_file` (appended); return a stream on the old
    stderr, which Ray forwards to the driver's console."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    console = os.fdopen(os.dup(2), "w", buffering=1)
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):  # a hard crash must not lose the last lines
            stream.reconfigure(line_buffering=True)
    return console


def _quiet_worker_logging(console: TextIO) -> None:
    """Everything at INFO to the log file (fd 2); our own warnings to the console once."""
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
        force=True,
    )
    handler = logging.StreamHandler(console)
    handler.setLevel(logging.WARNING)
    handler.addFilter(OnceFilter())
    # No rank in the line: Ray folds identical lines from several workers into one.
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger("hybrid").addHandler(handler)


class WorkerDict:
    """The body of each Ray actor. Created empty; `start` exports the rank environment, then
    constructs the members, so a member's `__init__` already sees RANK, MASTER_ADDR, ..."""

    def __init__(self) -> None:
        self._members: dict[str, Worker] = {}
        self._rank = -1
        self._logs_redirected = False
        self._progress: ProgressWriter | None = None

    def node(self) -> tuple[str, str]:
        """(Ray node id, address) of the node this worker runs on."""
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def sees_file(self, path: str) -> bool:
        """Whether `path` exists as seen from this worker's node (a shared-directory check)."""
        return os.path.exists(path)

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's address and a free port (asked of rank 0 only)."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def start(
        self,
        env: RankEnv,
        members: Mapping[str, RayClassWithInitArgs],
        log_dir: str | None = None,
        progress_dir: str | None = None,
    ) -> None:
        self._rank = env.rank
        freeze_heap()  # the members' classes are imported by now (unpickled with `members`)
        if log_dir is not None:
            _quiet_worker_logging(redirect_output(worker_log_path(log_dir, env.rank)))
            self._logs_redirected = True
        if progress_dir is not None:
            self._progress = ProgressWriter(progress_dir, env.rank)
            self._progress.call_started("+".join(members) + ".__init__")
            # The members' phase boundaries (engine wake, sync chunks, generate, update) are
            # the progress inside a call.
            process_ledger(env.rank, env.node).listeners.append(self._progress.boundary)
        for prefix, spec in members.items():
            # Re-exported before each member: an earlier member's libraries may have rewritten
            # them (vLLM's CPU platform sets LOCAL_WORLD_SIZE to its tensor-parallel size).
            os.environ.update(env.to_environ())
            try:
                self._members[prefix] = spec.instantiate()
            except Exception as exc:
                raise self._call_error(prefix, "__init__", exc) from None
        if self._progress is not None:
            self._progress.call_finished()

    def call(self, request: MemberCall) -> Any:
        if self._progress is not None:
            self._progress.call_started(f"{request.member}.{request.method}")
        try:
            return getattr(self._members[request.member], request.method)(
                *request.args, **request.kwargs
            )
        except Exception as exc:
            raise self._call_error(request.member, request.method, exc) from None
        finally:
            if self._progress is not None:
                self._progress.call_finished()

    def pid(self) -> int:
        return os.getpid()

    def _call_error(self, member: str, method: str, exc: Exception) -> WorkerCallError:
        error = WorkerCallError(
            member, method, self._rank, "".join(traceback.format_exception(exc)).rstrip()
        )
        if self._logs_redirected:  # the log file keeps it next to what led to it
            print(error, file=sys.stderr, flush=True)
        return error
