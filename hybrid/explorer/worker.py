"""ExplorerWorker: a WorkerDict member that hosts the rollout engine only (split placement).

It generates Samples for its share of a prompt batch and puts them into the experience
buffer itself (the driver never holds them), loads weight versions from whichever transport
the run uses, and scores given tokens with the engine (the sync check's explorer side).
Generation, scoring and the fully-async streaming are the RolloutHost's (hybrid.rollout.host),
the same the colocated worker holds; what is the explorer's own is where the weights come
from. No FSDP model lives here: the explorer's process group and TP meshes are its own,
independent of the trainer group's.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import ray
from transformers import AutoTokenizer

from hybrid.controller import Dispatch, Worker, register
from hybrid.data import Batch
from hybrid.data.sample import Sample
from hybrid.dtypes import Hardware
from hybrid.rollout.base import Sampling
from hybrid.rollout.engines import make_engine
from hybrid.rollout.group import RolloutGroup
from hybrid.rollout.host import RolloutHost
from hybrid.transport.base import GroupTransport, Payload, WeightTransport
from hybrid.transport.factory import make_transport
from hybrid.workers.config import HybridWorkerConfig
from hybrid.workers.parallel import ParallelState, init_parallel

logger = logging.getLogger(__name__)


class ExplorerWorker(Worker):
    def __init__(self, config: HybridWorkerConfig) -> None:
        self.config = config
        self.version = -1
        """The weight version in the engine (-1: the dummy weights it started with)."""
        self._transport: WeightTransport | None = None
        """This rank's receiving end of the run's transport (made at its first use)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_engine(self) -> None:
        c = self.config
        self.parallel: ParallelState = init_parallel(self.rank_env, c.rollout.tensor_parallel_size)
        self.hardware = Hardware.detect(self.parallel.device)
        self.dtypes = c.compute_dtypes(self.hardware)
        self.engine = make_engine(
            c.model.path,
            c.rollout,
            self.parallel.device,
            self.dtypes.rollout,
            site=self.parallel.engine_site(),
        )
        self.weight_facts = self.engine.configure_loads(c.sync.strategy)
        self.rollout = RolloutHost(
            self.engine,
            AutoTokenizer.from_pretrained(c.model.path),
            RolloutGroup.of_mesh(self.parallel.rollout_mesh),
            c.rollout,
        )
        logger.info("explorer rank %d ready (pid %d)", self.rank, os.getpid())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self) -> dict[str, Any]:
        return {
            "hardware": self.hardware.description,
            "rollout_dtype": self.dtypes.rollout,
            "sync_strategy": self.weight_facts.strategy,
            "weight_layout": self.weight_facts.layout,
            "weight_notes": self.weight_facts.notes(),
        }

    # --- generation ----------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def explore(self, prompts: Batch, buffer: Any, timeout_s: float) -> dict[str, float]:
        """Generate rollout.n Samples per prompt row with the current weights and put them
        into `buffer` (an ExperienceBuffer actor). Every rank puts its own rows: the TP ranks
        of an engine got different rows, which the engine generated together."""
        started = time.perf_counter()
        samples = self.rollout.generate(prompts, None, version=self.version)
        gen_s = time.perf_counter() - started
        if samples:
            ray.get(buffer.put.remote(samples, timeout_s))
        return {
            "samples": float(len(samples)),
            "tokens": float(sum(s.response_length for s in samples)),
            "gen_s": gen_s,
            "version": float(self.version),
        }

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def explore_samples(self, prompts: Batch) -> list[Sample]:
        """As `explore`, but the Samples come back to the caller (dynamic sampling scores them
        before any reaches the buffer); every rank returns its own rows."""
        return self.rollout.generate(prompts, None, version=self.version)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stream(self, prompts: Batch | None, queue: Any, max_steps: int | None) -> dict[str, float]:
        """Fully-async: take this rank's share of `prompts` (every dp_size-th row; None: no new
        rows) into the samples in flight, step the engine `max_steps` times (None: until
        every sample finished) with the weights held, and put the groups that finished into
        `queue` (a MessageQueue actor; the first rank of each TP group puts them)."""
        started = time.perf_counter()
        streamed = self.rollout.stream(prompts, max_steps, self.version)
        first = self.rollout.group.speaks_for_group
        if streamed.groups and first:
            ray.get(queue.put.remote(streamed.groups))
        return {
            "groups_done": float(len(streamed.groups) if first else 0),
            "pending_groups": float(streamed.pending_groups if first else 0),
            "tokens": float(streamed.tokens if first else 0),
            "gen_s": time.perf_counter() - started,
        }

    def _interrupt_streaming(self) -> None:
        """Take the fully-async requests out of the engine before a weight load: they continue
        from their tokens at the next `stream`."""
        self.rollout.interrupt()

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def generate_sequences(self, prompts: Batch, sampling: Sampling) -> Batch:
        """`sampling.n` responses per prompt row, drawn its way, as a Batch (validation), with
        the weights held."""
        samples = self.rollout.generate(prompts, sampling, version=self.version)
        return self.rollout.to_batch(samples, prompts.tensors["input_ids"].shape[1])

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def compute_engine_log_prob(self, batch: Batch) -> Batch:
        """The engine's log-probs of the given responses under the weights it holds."""
        return self.rollout.score(batch)

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def judge_generate(self, prompts: Batch, max_tokens: int) -> Batch:
        """The generative judge's answers (reward.judge): one greedy answer of at most
        `max_tokens` per row of left-padded `input_ids` / `attention_mask`, as the non-tensor
        column `judge_answer` (text), with the weights held (the version the explorer last
        loaded, which may be newer than the one that sampled the judged rows). Streaming
        requests leave the engine first and continue at the next `stream`."""
        return self.rollout.answer(prompts, max_tokens)

    # --- weights -------------------------------------------------------------------------

    def _receiving_end(self) -> WeightTransport:
        if self._transport is None:
            self._transport = make_transport(self.config.sync, "receiver", self.parallel.device)
        return self._transport

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_weights(self, version: int, payload: Payload) -> float:
        """Load `version` from the run's transport (`payload`: what its publisher announced;
        a rendezvous transport receives it while the trainer sends); the seconds taken."""
        started = time.perf_counter()
        weights = self._receiving_end().receive(version, payload)
        self._interrupt_streaming()
        self.engine.load_weights(weights)  # resets the prefix cache (the old weights' KV)
        self.version = version
        return time.perf_counter() - started

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join_transport(self, host: str, port: int, world_size: int) -> None:
        """Join the rendezvous transport's group at `host:port` (collective with the trainer's
        rank 0), on this rank's device: NCCL into GPU buffers on a GPU, gloo on the CPU."""
        transport = self._receiving_end()
        if not isinstance(transport, GroupTransport):
            raise RuntimeError(f"{type(transport).__name__} has no group to join")
        transport.join(host, port, world_size, self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights_digest(self) -> dict[str, Any]:
        """The weight version held and a digest of every engine tensor it keeps readable (a
        packed layout keeps its linear weights outside tensors: those are not covered)."""
        held = self.engine.weights_digest()
        return {"version": self.version, "digest": held.digest, "tensors": held.tensors}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shutdown_engine(self) -> None:
        if self._transport is not None:
            self._transport.close()
        self.engine.shutdown()
