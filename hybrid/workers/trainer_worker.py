"""TrainerWorker: the split placement's training member, an ActorWorker that publishes its
weights through a transport instead of loading them into an engine of its own.

Every rank takes part in the gather (the all-gathers are collective); rank 0 alone holds
the full tensors' destination: it puts them into the object store, writes a checkpoint
version, or broadcasts them to the explorers, and tells the Synchronizer the version is out.
The tensors are cast to the engine's dtype on the way, as the colocated sync does: before the
all-gather when there is one (half the bytes to move), else while packing the buckets (one pass
over the weights instead of a cast and a copy). Bucket memory is kept between publishes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray
import torch

from hybrid.controller import Dispatch, register
from hybrid.dtypes import torch_dtype
from hybrid.sharding.gather import iter_full_parameters
from hybrid.transport.buckets import Staging
from hybrid.transport.checkpoint import drop_versions_from, prune_versions, write_version
from hybrid.transport.collective import BroadcastGroup, broadcast_group_for, free_port
from hybrid.transport.memory import put_version
from hybrid.workers.actor import ActorWorker

logger = logging.getLogger(__name__)


class TrainerWorker(ActorWorker):
    _broadcast: BroadcastGroup | None = None

    def _init_rollout(self) -> None:
        self._staging = Staging(slots=2)  # one bucket packs while the previous one is sent
        logger.info("trainer rank %d ready (pid %d)", self.rank, os.getpid())

    @property
    def _engine_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtypes.rollout)

    def _full_weights(self, cast: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """The gathered weights; in the engine's dtype when `cast` or when an all-gather runs,
        else as the parameters hold them (the bucket packer casts them)."""
        s = self.config.sync
        gathers = self.parallel.fsdp_mesh.size() > 1
        dtype = self._engine_dtype
        if not (cast or gathers):
            dtype = next(self.model.parameters()).dtype
        return iter_full_parameters(self.model, s.gather, dtype, s.bucket_mb << 20)

    def _bucket_options(self) -> dict[str, Any]:
        """How publishes through buckets pack them (see `iter_buckets`)."""
        return {"cast_to": self._engine_dtype, "staging": self._staging}

    def _publish(self, send: Any, cast: bool = True) -> float:
        """Run `send(weights)` on rank 0 over the gathered stream (other ranks only gather);
        the seconds the whole publish took. `cast=False`: `send` casts to the engine dtype."""
        started = time.perf_counter()
        with self._phase("publish"):
            weights = self._full_weights(cast)
            if self.rank == 0:
                send(weights)
            else:
                for _ in weights:  # take part in every all-gather
                    pass
        return time.perf_counter() - started

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def publish_to_memory(self, version: int, synchronizer: Any) -> float:
        """Put `version` into Ray's object store, bucket by bucket, and hand the refs to the
        Synchronizer (the tensors never pass through the driver)."""
        bucket = self.config.sync.bucket_mb << 20

        def send(weights: Iterator[tuple[str, torch.Tensor]]) -> None:
            checksums = self.config.sync.verify_checksum
            refs = put_version(weights, bucket, checksums, **self._bucket_options())
            ray.get(synchronizer.publish.remote(version, refs))

        return self._publish(send, cast=False)

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def prepare_checkpoint_dir(self, first_version: int) -> list[str]:
        """Before the first publish: clear what a killed publish or a run that went further
        left in sync.checkpoint_dir (versions >= first_version will be written again)."""
        assert self.config.sync.checkpoint_dir is not None
        if self.rank:
            return []
        dropped = drop_versions_from(self.config.sync.checkpoint_dir, first_version)
        for path in dropped:
            logger.info("dropped %s: a resumed run publishes it again", path)
        return [str(path) for path in dropped]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def publish_to_checkpoint(self, version: int, synchronizer: Any) -> float:
        """Write `version` under sync.checkpoint_dir (atomically), drop versions beyond
        sync.keep_versions, and tell the Synchronizer where it is."""
        s = self.config.sync
        assert s.checkpoint_dir is not None
        root = Path(s.checkpoint_dir)

        def send(weights: Iterator[tuple[str, torch.Tensor]]) -> None:
            path = write_version(root, version, weights, s.bucket_mb << 20)
            ray.get(synchronizer.publish.remote(version, str(path)))
            prune_versions(root, s.keep_versions)

        return self._publish(send)

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def broadcast_address(self) -> tuple[str, int]:
        """Where the broadcast group's store will listen (this node, a free port)."""
        host = ray.util.get_node_ip_address()
        return host, free_port(host)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join_broadcast(self, host: str, port: int, world_size: int, timeout_s: float) -> None:
        """Rank 0 joins the broadcast group as its sender (rank 0 of world_size), on its
        device: NCCL from GPU buckets on a GPU, gloo from host buckets on the CPU."""
        if self.rank == 0:
            self._broadcast = broadcast_group_for(
                self.parallel.device, host, port, 0, world_size, timeout_s
            )
            # Buckets are packed where the group sends from (the GPU under NCCL).
            self._staging = Staging(slots=2, device=self._broadcast.device)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def publish_to_broadcast(self, version: int, synchronizer: Any) -> float:
        """Broadcast `version` to every explorer rank (they must be receiving), then record
        it with the Synchronizer."""

        def send(weights: Iterator[tuple[str, torch.Tensor]]) -> None:
            assert self._broadcast is not None, "join_broadcast first"
            s = self.config.sync
            self._broadcast.send(
                weights, s.bucket_mb << 20, s.verify_checksum, **self._bucket_options()
            )
            ray.get(synchronizer.publish.remote(version, None))

        return self._publish(send, cast=False)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shutdown_engine(self) -> None:
        if self._broadcast is not None:
            self._broadcast.close()
        super().shutdown_engine()
