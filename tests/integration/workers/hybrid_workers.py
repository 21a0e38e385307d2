"""Test-only views into a real ActorRolloutWorker (importable by the Ray workers)."""

from __future__ import annotations

import gc

import psutil
import torch

from hybrid.controller import Dispatch, register
from hybrid.data import Batch
from hybrid.workers.actor_rollout import ActorRolloutWorker


class InspectableActorRollout(ActorRolloutWorker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def engine_param_ptrs(self) -> dict[str, int]:
        """Storage address of every engine parameter that holds real storage."""
        return {n: p.data_ptr() for n, p in self.engine.stored_weights()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def readable_engine_weights(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.engine.stored_weights()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rss_bytes(self) -> int:
        return psutil.Process().memory_info().rss

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def live_tensor_bytes(self) -> int:
        """Bytes of the distinct storages of every tensor a Python object of this process
        still references (what a sync that keeps its gathered tensors would grow)."""
        gc.collect()
        storages = {}
        for obj in gc.get_objects():
            if not isinstance(obj, torch.Tensor) or obj.is_meta:
                continue
            try:
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
            except RuntimeError:  # a wrapper without storage of its own (DTensor): its local
                continue  # tensor is counted on its own
        return sum(storages.values())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def corrupt_engine_tensor(self, name: str) -> None:
        with torch.no_grad():
            dict(self.engine.stored_weights())[name].view(-1)[0] += 1.0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_once(self) -> None:
        with self.modes.rollout_mode():
            pass

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def raise_inside_rollout_mode(self, batch: Batch) -> Batch:
        with self.modes.rollout_mode():
            raise RuntimeError("deliberate failure inside rollout_mode")

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def engine_base_log_prob(self, batch: Batch) -> Batch:
        """The engine's log-probs of `responses` without the LoRA adapter (its base weights)."""
        original = self.engine.score
        self.engine.score = lambda sequences: original(sequences, with_adapter=False)  # type: ignore[method-assign]
        try:
            return self.compute_engine_log_prob(batch)
        finally:
            del self.engine.score
