"""ExplorerWorker: a WorkerDict member that hosts the rollout engine only (split placement).

It generates Samples for its share of a prompt batch and puts them into the experience
buffer itself (the driver never holds them), loads weight versions from whichever transport
the run uses, and scores given tokens with the engine (the sync check's explorer side). No
FSDP model lives here: the explorer's process group and TP meshes are its own, independent
of the trainer group's.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterable
from typing import Any

import ray
import torch
from transformers import AutoTokenizer

from hybrid.controller import Dispatch, Worker, register
from hybrid.data import Batch
from hybrid.data.sample import Sample, SampleStatus, samples_to_batch
from hybrid.dtypes import Hardware
from hybrid.explorer.streaming import InFlight
from hybrid.rollout.base import GeneratedSample, prompt_budgets
from hybrid.rollout.scores import response_scores
from hybrid.rollout.vllm_engine import VllmEngine
from hybrid.sharding.loader import WeightLoader
from hybrid.transport.buckets import Staging
from hybrid.transport.checkpoint import read_version
from hybrid.transport.collective import BroadcastGroup, broadcast_group_for
from hybrid.transport.memory import get_version
from hybrid.workers.config import HybridWorkerConfig
from hybrid.workers.parallel import ParallelState, gather_across_tp, init_parallel
from hybrid.workers.sequences import unpad_prompts

logger = logging.getLogger(__name__)

_PROMPT_COLUMNS = ("input_ids", "attention_mask", "uid")


def row_metadata(prompts: Batch, row: int) -> dict[str, Any]:
    """A prompt row's other columns (data_source, ground_truth, seed, ...): what its Samples
    carry as metadata for the rewards."""
    metadata: dict[str, Any] = {
        k: v[row] for k, v in prompts.non_tensors.items() if k not in _PROMPT_COLUMNS
    }
    metadata.update(
        {k: t[row].tolist() for k, t in prompts.tensors.items() if k not in _PROMPT_COLUMNS}
    )
    return metadata


def build_samples(
    prompts: Batch,
    prompt_ids: list[list[int]],
    generated: list[GeneratedSample],
    n: int,
    version: int,
) -> list[Sample]:
    """n Samples per prompt row, prompt-major; every other column of a row (data_source,
    ground_truth, seed, ...) becomes the Samples' metadata."""
    samples = []
    for i, g in enumerate(generated):
        row = i // n
        samples.append(
            Sample(
                uid=str(prompts.non_tensors["uid"][row]),
                index=i % n,
                prompt_ids=prompt_ids[row],
                response_ids=g.token_ids,
                rollout_log_probs=g.log_probs,
                versions=[version] * len(g.token_ids),
                status=SampleStatus.COMPLETED if g.stopped else SampleStatus.TRUNCATED,
                text=g.text,
                metadata=row_metadata(prompts, row),
            )
        )
    return samples


class ExplorerWorker(Worker):
    def __init__(self, config: HybridWorkerConfig) -> None:
        self.config = config
        self.version = -1
        """The weight version in the engine (-1: the dummy weights it started with)."""
        self._broadcast: BroadcastGroup | None = None
        self._staging: Staging | None = None
        """Receive buffers of the broadcast transport on its device (the GPU under NCCL), made
        when the group is joined and kept between syncs (two: one bucket loads into the engine
        while the next arrives)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_engine(self) -> None:
        c = self.config
        self.parallel: ParallelState = init_parallel(self.rank_env, c.rollout.tensor_parallel_size)
        self.hardware = Hardware.detect(self.parallel.device)
        self.dtypes = c.compute_dtypes(self.hardware)
        self.engine = VllmEngine(
            c.model.path,
            c.rollout,
            self.parallel.device,
            self.dtypes.rollout,
            site=self.parallel.engine_site(),
        )
        self.loader = WeightLoader(self.engine, c.sync.strategy)
        self.tokenizer = AutoTokenizer.from_pretrained(c.model.path)
        self._in_flight = InFlight(c.rollout.n, c.rollout.response_length)
        logger.info("explorer rank %d ready (pid %d)", self.rank, os.getpid())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self) -> dict[str, str]:
        return {
            "hardware": self.hardware.description,
            "rollout_dtype": self.dtypes.rollout,
            "sync_strategy": self.loader.strategy,
            "weight_layout": self.engine.weight_layout,
        }

    # --- generation ----------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def explore(self, prompts: Batch, buffer: Any, timeout_s: float) -> dict[str, float]:
        """Generate rollout.n Samples per prompt row with the current weights and put them
        into `buffer` (an ExperienceBuffer actor); the first rank of each TP group puts them."""
        started = time.perf_counter()
        samples = self._generate(prompts)
        gen_s = time.perf_counter() - started
        if self.parallel.tp_rank == 0:
            ray.get(buffer.put.remote(samples, timeout_s))
        return {
            "samples": float(len(samples)),
            "tokens": float(sum(s.response_length for s in samples)),
            "gen_s": gen_s,
            "version": float(self.version),
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stream(self, prompts: Batch | None, queue: Any, max_steps: int | None) -> dict[str, float]:
        """Fully-async: take this rank's share of `prompts` (every dp_size-th row; None: no new
        rows) into the samples in flight, step the engine `max_steps` times (None: until
        every sample finished) with the weights held, and put the groups that finished into
        `queue` (a MessageQueue actor; the first rank of each TP group puts them)."""
        started = time.perf_counter()
        flight = self._in_flight
        if prompts is not None:
            dp_size = self.parallel.rollout_mesh.size(0)
            mine = list(range(self.parallel.dp_rank, len(prompts), dp_size))
            share = prompts[mine]
            prompt_ids = unpad_prompts(share.tensors["input_ids"], share.tensors["attention_mask"])
            budgets = prompt_budgets(share, self.config.rollout.response_length)
            for row, ids in enumerate(prompt_ids):
                uid = str(share.non_tensors["uid"][row])
                flight.add(uid, ids, row_metadata(share, row), budgets[row])
        for request_id, request in flight.to_submit():
            self.engine.submit(request_id, request)
        groups: list[list[Sample]] = []
        tokens = steps = 0
        while self.engine.has_unfinished() and (max_steps is None or steps < max_steps):
            for request_id, new, finished in self.engine.step():
                tokens += len(new.token_ids)
                group = flight.record(request_id, new, finished, self.version, self._decode)
                if group is not None:
                    groups.append(group)
            steps += 1
        first = self.parallel.tp_rank == 0
        if groups and first:
            ray.get(queue.put.remote(groups))
        return {
            "groups_done": float(len(groups) if first else 0),
            "pending_groups": float(flight.groups if first else 0),
            "tokens": float(tokens if first else 0),
            "gen_s": time.perf_counter() - started,
        }

    def _interrupt_streaming(self) -> None:
        """Take the fully-async requests out of the engine before anything else uses it (a
        weight load, a validation generate, a scoring pass): they continue from their tokens
        at the next `stream`."""
        self.engine.abort(self._in_flight.interrupt())

    def _decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=True))

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def generate_sequences(self, prompts: Batch, greedy: bool = True) -> Batch:
        """One response per prompt row as a Batch (validation), with the weights held."""
        samples = self._generate(prompts, greedy)
        width = prompts.tensors["input_ids"].shape[1]
        return samples_to_batch(
            samples, self.config.rollout.response_length, self.tokenizer.pad_token_id, width
        )

    def _generate(self, prompts: Batch, greedy: bool = False) -> list[Sample]:
        self._interrupt_streaming()
        c = self.config.rollout
        n = 1 if greedy else c.n
        prompt_ids = unpad_prompts(prompts.tensors["input_ids"], prompts.tensors["attention_mask"])
        seeds = prompts.tensors["seed"].tolist() if "seed" in prompts else [None] * len(prompts)
        budgets = prompt_budgets(prompts, c.response_length)
        requests = list(zip(prompt_ids, seeds, budgets, strict=True))
        shared, mine = gather_across_tp(self.parallel, requests)
        shared_seeds = [seed for _, seed, _ in shared]
        generated = self.engine.generate(
            [request for request, _, _ in shared],
            greedy=greedy,
            seeds=None if None in shared_seeds else shared_seeds,
            max_tokens=[budget for _, _, budget in shared],
        )[mine.start * n : mine.stop * n]
        return build_samples(prompts, prompt_ids, generated, n, self.version)

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def compute_engine_log_prob(self, batch: Batch) -> Batch:
        """The engine's log-probs of the given responses under the weights it holds."""
        self._interrupt_streaming()
        sequences = unpad_prompts(batch.tensors["input_ids"], batch.tensors["attention_mask"])
        shared, mine = gather_across_tp(self.parallel, sequences)
        scores = self.engine.score(shared)[mine]
        return Batch.from_dict(
            {"engine_log_probs": response_scores(scores, batch.tensors["response_mask"])}
        )

    # --- weights -------------------------------------------------------------------------

    def _load(self, version: int, weights: Iterable[tuple[str, torch.Tensor]]) -> float:
        started = time.perf_counter()
        self._interrupt_streaming()
        self.loader.load(weights)
        # Cached prefixes were computed by the old weights.
        self.engine.llm.reset_prefix_cache()
        self.version = version
        return time.perf_counter() - started

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_from_memory(self, version: int, refs: list[Any]) -> float:
        """Load `version` from the object store (its bucket refs); returns the seconds taken."""
        return self._load(version, get_version(refs, version=version))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_from_checkpoint(self, version: int, path: str) -> float:
        """Load the complete version directory `path` (its manifest's checksums verified with
        sync.verify_checksum)."""
        return self._load(version, read_version(path, self.config.sync.verify_checksum))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join_broadcast(self, host: str, port: int, world_size: int, timeout_s: float) -> None:
        """Join the trainer's broadcast group (rank 0 is the trainer's rank 0), on this rank's
        device: NCCL into GPU buffers on a GPU, gloo into host buffers on the CPU."""
        self._broadcast = broadcast_group_for(
            self.parallel.device, host, port, 1 + self.rank, world_size, timeout_s
        )
        self._staging = Staging(slots=2, device=self._broadcast.device)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_from_broadcast(self, version: int) -> float:
        if self._broadcast is None:
            raise RuntimeError("load_from_broadcast before join_broadcast")
        # The loaders copy every tensor as it arrives, so received buckets can share a buffer.
        return self._load(version, self._broadcast.receive(staging=self._staging))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights_digest(self) -> dict[str, Any]:
        """The weight version held and a digest of every engine tensor it keeps readable (a
        packed layout keeps its linear weights outside tensors: those are not covered)."""
        digest = hashlib.blake2b(digest_size=16)
        covered = 0
        for name, param in sorted(self.engine.model.named_parameters()):
            if param.numel():
                digest.update(name.encode())
                digest.update(param.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
                covered += 1
        return {"version": self.version, "digest": digest.hexdigest(), "tensors": covered}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shutdown_engine(self) -> None:
        if self._broadcast is not None:
            self._broadcast.close()
        self.engine.shutdown()
