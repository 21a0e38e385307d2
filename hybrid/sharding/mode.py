"""The mode switch: the one place that moves memory between training and generation.

    trainer mode                         rollout mode
    actor params on device (or CPU)      engine weights freshly synced, KV cache allocated
    engine KV cache released             actor params offloaded (if configured)

`rollout_mode()` is a context manager: onload the actor if it was offloaded, wake the engine's
weights, stream the gathered shards into the engine in place, offload the actor, wake the KV
cache, swap to the rollout RNG. Leaving the block (normally or by exception) runs
`trainer_mode()`: release the KV cache, reset the prefix cache, swap the RNG back, free
caches. `trainer_phase()` brackets training-side work with the same onload/offload rules.
Nothing else calls sleep, wake, offload or onload. Every boundary lands in the memory ledger
under the names of hybrid.memory.records.STEP_PHASES.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum

import torch

from hybrid.dtypes import torch_dtype
from hybrid.memory.ledger import MemoryLedger, TimedIterator
from hybrid.rollout.base import RolloutEngine
from hybrid.rollout.weights import WeightFacts
from hybrid.sharding.config import WeightPathConfig
from hybrid.sharding.full_weights import full_weights
from hybrid.sharding.lora_sync import LoraSync, SyncTally, counted
from hybrid.sharding.offload import Offloader


@dataclass(frozen=True)
class SyncTimes:
    total_s: float
    gather_s: float
    """Time spent producing full tensors (all-gathers); the rest is the engine's load."""


class Mode(Enum):
    TRAINER = "trainer"
    ROLLOUT = "rollout"


class ModeError(RuntimeError):
    """An action was asked for in the wrong mode."""


class RngState:
    """A saved torch RNG state (CPU, and CUDA when present) that can be swapped in and out."""

    def __init__(self, seed: int) -> None:
        saved = self.capture()
        torch.manual_seed(seed)
        self.state = self.capture()
        self.restore(saved)

    @staticmethod
    def capture() -> tuple[torch.Tensor, torch.Tensor | None]:
        cuda = (
            torch.cuda.get_rng_state()
            if torch.cuda.is_available() and torch.cuda.is_initialized()
            else None
        )
        return torch.get_rng_state(), cuda

    @staticmethod
    def restore(state: tuple[torch.Tensor, torch.Tensor | None]) -> None:
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1])


class ModeSwitch:
    def __init__(
        self,
        actor: torch.nn.Module,
        engine: RolloutEngine,
        offloader: Offloader,
        sync: WeightPathConfig,
        ledger: MemoryLedger,
        rollout_seed: int,
        lora: LoraSync | None = None,
    ) -> None:
        self.actor = actor
        self.lora = lora
        # With adapter syncs the base goes to the engine once; a fresh engine needs it again.
        self.base_in_engine = False
        self.engine = engine
        self.offloader = offloader
        self.sync_config = sync
        self.ledger = ledger
        self.mode = Mode.TRAINER
        self._rollout_rng = RngState(rollout_seed)
        self._trainer_rng: tuple[torch.Tensor, torch.Tensor | None] | None = None
        # Chosen by the engine, from what it knows of its own storage (hybrid.rollout.weights).
        self.weight_facts: WeightFacts = engine.configure_loads(sync.strategy)
        self._engine_dtype = torch_dtype(engine.dtype)
        self.num_syncs = 0

    def require(self, mode: Mode, action: str) -> None:
        if self.mode is not mode:
            hint = (
                "enter rollout_mode() first"
                if mode is Mode.ROLLOUT
                else "leave rollout_mode() first"
            )
            raise ModeError(
                f"{action} needs {mode.value} mode, but the worker is in {self.mode.value} mode: {hint}"
            )

    @contextmanager
    def rollout_mode(self) -> Iterator[ModeSwitch]:
        self.require(Mode.TRAINER, "entering rollout mode")
        entered = time.perf_counter()
        self.ledger.record("rollout/enter")
        try:
            with self.ledger.timed("sync"):
                moved = self.offloader.onload_params()
                self.ledger.record("sync/onload_actor", reuse_components=not moved)
                woke = self._engine_moved(lambda: self.engine.resume(["weights"]))
                self.ledger.record("sync/wake_weights", reuse_components=not woke)
                transfer = self.sync_weights()
                moved = self.offloader.offload_params()
                self.ledger.record("sync/offload_actor", reuse_components=not moved)
            woke = self._engine_moved(lambda: self.engine.resume(["kv_cache"]))
            self._trainer_rng = RngState.capture()
            RngState.restore(self._rollout_rng.state)
            self.mode = Mode.ROLLOUT
            self.ledger.record("rollout/wake_kv", reuse_components=not woke)
            # The switch's own cost: everything on the way in but the weight transfer.
            self.ledger.add_time("mode_switch", time.perf_counter() - entered - transfer.total_s)
            yield self
        finally:
            self.trainer_mode()

    def trainer_mode(self) -> None:
        """Release the engine's KV cache and restore training state (idempotent)."""
        started = time.perf_counter()
        released = self._engine_moved(self.engine.release)
        self.ledger.record("trainer/release_kv", reuse_components=not released)
        self.engine.reset_prefix_cache()
        if self._trainer_rng is not None:
            self._rollout_rng.state = RngState.capture()
            RngState.restore(self._trainer_rng)
            self._trainer_rng = None
        self.offloader.empty_cache()
        self.mode = Mode.TRAINER
        # Caches emptied, RNG swapped: nothing a component source counts has changed.
        self.ledger.record("trainer/ready", reuse_components=True)
        self.ledger.add_time("mode_switch", time.perf_counter() - started)

    @contextmanager
    def trainer_phase(
        self, name: str, with_optimizer: bool = False, caller: str | None = None
    ) -> Iterator[None]:
        """Training-side work (log-probs, updates) with the actor on device. `name` labels the
        ledger's boundaries; `caller`, the worker method a mode error names (default: name)."""
        self.require(Mode.TRAINER, caller or name)
        with self.offloader.phase(name, self.ledger, with_optimizer):
            yield

    def _engine_moved(self, act: Callable[[], None]) -> bool:
        """Run an engine release / resume; whether what the engine holds changed (never on
        CPU, where the next ledger boundary can then reuse the previous breakdown)."""
        resident = set(self.engine.resident)
        act()
        return self.engine.resident != resident

    def configure(self, sync: WeightPathConfig) -> None:
        self.require(Mode.TRAINER, "changing the sync configuration")
        self.sync_config = sync
        self.weight_facts = self.engine.configure_loads(sync.strategy)

    def sync_weights(self) -> SyncTimes:
        """Gather the actor's shards group by group and load them into the engine in place
        (with LoRA adapters: see hybrid.sharding.lora_sync for what moves)."""
        start = time.perf_counter()
        tally = SyncTally()
        gathered = TimedIterator(counted(self._full_weights(), tally))
        sends_weights = self.lora is None or self.sync_config.lora_mode == "merge"
        if sends_weights or not self.base_in_engine:
            # With sync.verify_checksum the engine compares what it stored with what was sent.
            self.engine.load_weights(gathered, checksum=self.sync_config.verify_checksum)
            self.base_in_engine = True
        gather_s = gathered.produce_s
        if not sends_weights:
            assert self.lora is not None
            gather_start = time.perf_counter()
            adapter = self.lora.gather_adapter(self.sync_config.layered_summon, self._chunk_loaded)
            gather_s += time.perf_counter() - gather_start
            for tensor in adapter.values():
                tally.count(tensor)
            self.engine.load_adapter(self.lora.write_adapter(adapter))
        self.num_syncs += 1
        times = SyncTimes(total_s=time.perf_counter() - start, gather_s=gather_s)
        self.ledger.add_time("sync_gather", times.gather_s)
        self.ledger.add_time("sync_load", times.total_s - times.gather_s)
        self.ledger.add_count("sync/bytes", tally.bytes)
        self.ledger.add_count("sync/tensors", tally.tensors)
        return times

    def _full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full tensors under Hugging Face names: the model, its LoRA base, or base + adapter
        merged (sync.lora_mode)."""
        merge = self.sync_config.lora_mode == "merge"
        return full_weights(
            self.actor, self.lora, self.sync_config, self._engine_dtype, merge, self._chunk_loaded
        )

    def _chunk_loaded(self, index: int, full_bytes: int) -> None:
        self.ledger.record(
            "sync/gather_load",
            chunk=index,
            transient={"gather_buffers": full_bytes},
            reuse_components=True,
        )

    @property
    def strategy(self) -> str:
        return self.weight_facts.strategy
