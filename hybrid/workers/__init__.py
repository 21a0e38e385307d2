"""The WorkerDict members: the actor with its rollout engine, and the reference policy."""

from hybrid.workers.actor_rollout import ActorRolloutWorker
from hybrid.workers.config import ActorConfig, HybridWorkerConfig, ModelConfig, RefConfig
from hybrid.workers.ref import ReferenceWorker

__all__ = [
    "ActorConfig",
    "ActorRolloutWorker",
    "HybridWorkerConfig",
    "ModelConfig",
    "RefConfig",
    "ReferenceWorker",
]
