"""TrainerWorker: the split placement's training member, an ActorWorker that publishes its
weights through the run's `WeightTransport` instead of loading them into an engine of its own.

Every rank takes part in the gather (the all-gathers are collective); rank 0 alone hands the
full tensors to the transport, which puts them into the object store, writes a checkpoint
version or broadcasts them to the explorers, and announces the version to the Synchronizer.
The tensors reach the engine's dtype on the way, as in the colocated sync: the all-gather
casts when there is one (half the bytes to move), else the transport does while packing (one
pass over the weights instead of a cast and a copy).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import ray
import torch

from hybrid.controller import Dispatch, register
from hybrid.dtypes import torch_dtype
from hybrid.ports import free_port
from hybrid.sharding.full_weights import full_weights
from hybrid.transport.base import GroupTransport, Payload, WeightTransport
from hybrid.transport.factory import make_transport
from hybrid.workers.actor import ActorWorker

logger = logging.getLogger(__name__)


class TrainerWorker(ActorWorker):
    _transport: WeightTransport | None = None
    """This worker's end of the run's transport (made with the model)."""

    def _init_rollout(self) -> None:
        self._transport = make_transport(
            self.config.sync, "publisher", self.parallel.device, self._engine_dtype
        )
        logger.info("trainer rank %d ready (pid %d)", self.rank, os.getpid())

    @property
    def _engine_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtypes.rollout)

    def _full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The gathered weights: in the engine's dtype when an all-gather runs, else as the
        parameters hold them (the transport casts them)."""
        gathers = self.parallel.fsdp_mesh.size() > 1
        dtype = self._engine_dtype if gathers else next(self.model.parameters()).dtype
        # The explorers' engines hold plain full weights: LoRA sends the adapters folded into
        # their base weights (sync.lora_mode's merge, whatever it says).
        return full_weights(self.model, self.lora_sync, self.config.sync, dtype, merge_lora=True)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def publish_weights(self, version: int, synchronizer: Any) -> float:
        """Publish the weights as `version` through the run's transport and announce it to
        `synchronizer` (the tensors never pass through the driver); the seconds it took. A
        rendezvous transport needs the explorers receiving meanwhile."""
        transport = self._transport
        assert transport is not None, "init_model first"
        started = time.perf_counter()

        def announce(payload: Payload) -> None:
            ray.get(synchronizer.publish.remote(version, payload))

        with self._phase("publish"):
            weights = self._full_weights()
            if self.rank == 0:
                transport.publish(version, weights, announce)
            else:
                for _ in weights:  # take part in every all-gather
                    pass
        return time.perf_counter() - started

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def transport_address(self) -> tuple[str, int]:
        """Where a rendezvous transport's group will listen (this node, a free port)."""
        host = ray.util.get_node_ip_address()
        return host, free_port(host)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join_transport(self, host: str, port: int, world_size: int) -> None:
        """Join the rendezvous transport's group at `host:port` (collective with the explorer
        ranks; rank 0 joins as the sender, device-side: NCCL on a GPU, gloo on the CPU)."""
        transport = self._transport
        if not isinstance(transport, GroupTransport):
            raise RuntimeError(f"{type(transport).__name__} has no group to join")
        transport.join(host, port, world_size, self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shutdown_engine(self) -> None:
        if self._transport is not None:
            self._transport.close()
        super().shutdown_engine()
