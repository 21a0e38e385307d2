"""The single controller on Ray: register + dispatch modes, Worker, resource pools, worker
groups and the colocated WorkerDict. Knows no worker, trainer or model."""

from hybrid.controller.cluster import ensure_ray
from hybrid.controller.deadlines import Deadlines
from hybrid.controller.dispatch import Dispatch, register
from hybrid.controller.errors import StallError, WorkerCallError, WorkerDiedError
from hybrid.controller.rank_env import RankEnv
from hybrid.controller.resource_pool import RayResourcePool
from hybrid.controller.worker import Worker
from hybrid.controller.worker_dict import (
    RayClassWithInitArgs,
    WorkerDict,
    WorkerDictClass,
    create_colocated_worker_cls,
)
from hybrid.controller.worker_group import GroupFuture, RayWorkerGroup, WorkerGroupView

__all__ = [
    "Deadlines",
    "Dispatch",
    "GroupFuture",
    "RankEnv",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "StallError",
    "Worker",
    "WorkerCallError",
    "WorkerDict",
    "WorkerDictClass",
    "WorkerDiedError",
    "WorkerGroupView",
    "create_colocated_worker_cls",
    "ensure_ray",
    "register",
]
