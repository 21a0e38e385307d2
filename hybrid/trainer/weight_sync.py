"""The split placement's two sides of a weight sync, as the Synchronizer's state machine says.

`WeightChannel` knows, per transport, what publishing a version (trainer side) and loading
one (explorer side) means; `trainer_sync` and `explorer_sync` decide when, from the style
(`SyncPolicy`) and the other side's state, and move their side through the four states:

  nccl:              trainer RUNNING -> WAITING_SYNC -> RUNNING (the broadcast needs both)
                     explorer RUNNING -> REQUIRE_SYNC -> WAITING_SYNC -> RUNNING
  memory/checkpoint: trainer stays RUNNING (publishes and goes on)
                     explorer RUNNING -> REQUIRE_SYNC -> RUNNING (pulls the newest version)

Versions: 0 is the initial weights; the trainer's step t turns version t-1 into t. Every wait
has a deadline (sync.timeout_s); a dynamic request not answered in time is retried at the
explorer's next step, a wait the staleness bound requires fails naming the other side.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import ray

from hybrid.controller import RayWorkerGroup, WorkerGroupView
from hybrid.data import Batch
from hybrid.sharding.config import SyncConfig
from hybrid.synchronizer.policy import SyncPolicy
from hybrid.synchronizer.states import SyncState

RUNNING, REQUIRE, WAITING = SyncState.RUNNING, SyncState.REQUIRE_SYNC, SyncState.WAITING_SYNC


class SyncTimeoutError(TimeoutError):
    """The other side did not do its part of a sync within sync.timeout_s."""


@dataclass
class SyncTimes:
    """Seconds spent per side since the last drain (step metrics)."""

    publish_s: float = 0.0
    load_s: float = 0.0
    explorer_wait_s: float = 0.0
    syncs: int = 0
    probe_diffs: list[float] = field(default_factory=list)

    def drain(self) -> dict[str, float]:
        out = {
            "timing_s/publish": self.publish_s,
            "timing_s/explorer_load": self.load_s,
            "timing_s/explorer_wait": self.explorer_wait_s,
            "sync/explorer_syncs": float(self.syncs),
            "sync/probes": float(len(self.probe_diffs)),
            "sync/probe_logprob_diff_max": max(self.probe_diffs, default=0.0),
        }
        self.publish_s = self.load_s = self.explorer_wait_s = 0.0
        self.syncs = 0
        self.probe_diffs = []
        return out


class WeightChannel:
    """Publishing and loading a version over sync.method."""

    def __init__(
        self,
        sync: SyncConfig,
        synchronizer: Any,
        trainer: WorkerGroupView,
        explorers: RayWorkerGroup,
    ) -> None:
        self.method = sync.method
        self.timeout_s = sync.timeout_s
        self.verify = sync.verify_checksum
        self.synchronizer = synchronizer
        self.trainer = trainer
        self.explorers = explorers

    def connect(self) -> None:
        """nccl: build the broadcast group (trainer rank 0 + every explorer rank) once."""
        if self.method != "nccl":
            return
        host, port = self.trainer.broadcast_address()
        world = 1 + self.explorers.world_size
        joining = self.explorers.join_broadcast.submit(host, port, world, self.timeout_s)
        self.trainer.join_broadcast(host, port, world, self.timeout_s)
        joining.get(timeout=self.timeout_s)

    def publish(self, version: int) -> float:
        publish = {
            "nccl": self.trainer.publish_to_broadcast,
            "memory": self.trainer.publish_to_memory,
            "checkpoint": self.trainer.publish_to_checkpoint,
        }[self.method]
        return float(publish(version, self.synchronizer)[0])

    def load(self, version: int) -> float:
        """Load `version` into every explorer (for nccl: while the trainer publishes it)."""
        if self.method == "nccl":
            return float(max(self.explorers.load_from_broadcast(version)))
        newest, payload = ray.get(self.synchronizer.newest.remote())
        if newest != version:
            version, payload = version, ray.get(self.synchronizer.payload.remote(version))
        load = (
            self.explorers.load_from_memory
            if self.method == "memory"
            else self.explorers.load_from_checkpoint
        )
        return float(max(load(version, payload)))


class SyncSides:
    """Both sides' decisions; the trainer's run on the driver's main thread, the explorer's on
    the explorer loop's thread. All shared state lives in the Synchronizer actor."""

    def __init__(
        self, policy: SyncPolicy, channel: WeightChannel, synchronizer: Any, total_steps: int
    ) -> None:
        self.policy = policy
        self.channel = channel
        self.sync = synchronizer
        self.total_steps = total_steps
        self.nccl = channel.method == "nccl"
        self.timeout_s = channel.timeout_s
        self.times = SyncTimes()
        self.explorer_version = -1
        self.verify = channel.verify
        self.probes: dict[int, Batch] = {}
        """Per weight version, a few trained rows with the trainer's log-probs under it: the
        explorer scores them before it leaves that version (the sync check of every version,
        also where no sample is trained at lag 0)."""
        self.digests: dict[int, str] = {}
        """With sync.verify_checksum: per loaded version, the digest of the engine's readable
        tensors (the same for every transport and every explorer rank)."""

    def _set(self, side: str, state: SyncState, version: int | None = None, note: str = "") -> None:
        ray.get(self.sync.set_state.remote(side, state, version, note))

    def _state(self, side: str) -> SyncState:
        return SyncState(ray.get(self.sync.state.remote(side)))

    # --- trainer side --------------------------------------------------------------------

    def trainer_sync(self, version: int, after_step: bool) -> None:
        """Publish `version` (the trainer's weights now) if the style or a request wants it.
        Called after each step and while waiting for data."""
        if version >= self.total_steps:
            return  # no explorer step is left to use it
        newest, _ = ray.get(self.sync.newest.remote())
        if newest >= version or self._state("explorer") is SyncState.STOPPED:
            return
        asked = (
            self.policy.style == "dynamic_by_explorer"
            and self._state("explorer") in (REQUIRE, WAITING)
            and ray.get(self.sync.version.remote("explorer")) < version
        )
        if not ((after_step and self.policy.trainer_publishes_after(version)) or asked):
            return
        if not self.nccl:
            self.times.publish_s += self.channel.publish(version)
            return
        self._broadcast(version)

    def _broadcast(self, version: int) -> None:
        """nccl: offer `version`, wait for the explorer to join, send it. An explorer that
        finished (or died: the driver raises its error next) ends the offer."""
        self._set("trainer", WAITING, version)
        seen = ray.get(
            self.sync.wait_for_state.remote(
                "explorer", [WAITING, SyncState.STOPPED], self.timeout_s, "trainer"
            )
        )
        if seen is None:
            raise SyncTimeoutError(
                f"the explorer did not join the broadcast of weight version {version} within "
                f"sync.timeout_s={self.timeout_s}s"
            )
        if SyncState(seen) is WAITING:
            self.times.publish_s += self.channel.publish(version)
        self._set("trainer", RUNNING, version)

    def start(self, version: int) -> None:
        """Both sides leave STOPPED before either loop runs (so STOPPED means gone)."""
        self._set("trainer", RUNNING, version, note="start")
        self._set("explorer", RUNNING, -1, note="start")

    def initial_sync(self, version: int, first_explorer_step: int) -> None:
        """Both sides at once, before either loop runs: the trainer publishes the weights the
        explorer starts from (0, or the resumed step) and the explorer loads them (nccl needs
        the two halves at the same time, so the explorer's runs on a thread of its own). A
        side that fails is marked stopped, which wakes the other at once."""
        if self.channel.method == "checkpoint":
            self.channel.trainer.prepare_checkpoint_dir(version)
        with ThreadPoolExecutor(1, thread_name_prefix="initial-sync") as pool:
            explorer = pool.submit(
                self._stopping_on_error, "explorer", self.explorer_sync, first_explorer_step
            )
            if self.nccl:
                self._stopping_on_error("trainer", self._broadcast, version)
            else:
                self.times.publish_s += self._stopping_on_error(
                    "trainer", self.channel.publish, version
                )
            explorer.result()

    def _stopping_on_error(self, side: str, work: Callable[..., Any], *args: Any) -> Any:
        """`work(*args)`; if it raises, `side` is marked stopped first (waking the other)."""
        try:
            return work(*args)
        except BaseException as error:
            reason = f"initial sync failed: {type(error).__name__}: {error}"
            ray.get(self.sync.stop.remote(side, reason))
            raise

    # --- explorer side -------------------------------------------------------------------

    def explorer_sync(self, step: int) -> None:
        """Before explorer step `step`: bring the engine to a version the style allows."""
        held = self.explorer_version
        required = self.policy.required_version(step)
        must = held < required
        asks = self.policy.style == "dynamic_by_explorer" and self.policy.explorer_requests(
            step, held
        )
        if self.nccl:
            if not (must or asks or self._offered(held)):
                return
            self._set("explorer", REQUIRE, held)
            seen = self._wait_for_offer(held)
            if seen is None:
                self._give_up(step, required, must)
                return
            version = int(ray.get(self.sync.version.remote("trainer")))
            self._probe(held)
            self._set("explorer", WAITING, held)
            self._loaded(version, self.channel.load(version))
            return
        newest, _ = ray.get(self.sync.newest.remote())
        fresher = self.policy.style == "fixed" and newest > held
        if not (must or asks or fresher):
            return
        self._set("explorer", REQUIRE, held)
        if newest <= held or newest < required:
            got = ray.get(
                self.sync.wait_for_version.remote(
                    max(required, held + 1), self.timeout_s, "explorer"
                )
            )
            if got is None:
                self._give_up(step, required, must)
                return
            newest = int(got)
        self._probe(held)
        self._loaded(newest, self.channel.load(newest))

    def explorer_catch_up(self, wait: bool) -> int:
        """Fully-async: load the newest version if the trainer has a newer one than the
        engine holds (nccl: if it is offering one now); with `wait`, block until it has.
        Returns the version held afterwards."""
        held = self.explorer_version
        if self.nccl:
            if not (wait or self._offered(held)):
                return held
            self._set("explorer", REQUIRE, held)
            seen = self._wait_for_offer(held)
            if seen is None:
                raise SyncTimeoutError(self._no_newer_version(held))
            version = int(ray.get(self.sync.version.remote("trainer")))
            self._probe(held)
            self._set("explorer", WAITING, held)
            self._loaded(version, self.channel.load(version))
            return version
        newest, _ = ray.get(self.sync.newest.remote())
        if newest <= held and not wait:
            return held
        self._set("explorer", REQUIRE, held)
        if newest <= held:
            got = ray.get(self.sync.wait_for_version.remote(held + 1, self.timeout_s, "explorer"))
            if got is None:
                raise SyncTimeoutError(self._no_newer_version(held))
            newest = int(got)
        self._probe(held)
        self._loaded(newest, self.channel.load(newest))
        return newest

    def _offered(self, held: int) -> bool:
        """nccl: the trainer offers a version newer than `held` right now. Its state alone
        would not do: it stays WAITING_SYNC for a moment after the explorer has received its
        broadcast, and joining that finished offer would wait for a send that never comes."""
        return (
            self._state("trainer") == WAITING
            and int(ray.get(self.sync.version.remote("trainer"))) > held
        )

    def _wait_for_offer(self, held: int) -> SyncState | None:
        """nccl: wait until the trainer offers a version newer than `held` (None: timed out)."""
        seen = ray.get(
            self.sync.wait_for_state.remote(
                "trainer", [WAITING], self.timeout_s, "explorer", min_version=held + 1
            )
        )
        return None if seen is None else SyncState(seen)

    def _no_newer_version(self, held: int) -> str:
        return (
            f"the Rollouter waited for a weight version newer than {held} and the trainer did "
            f"not publish one within sync.timeout_s={self.timeout_s}s"
        )

    def explorer_finished(self) -> None:
        """The explorer's last step is done: no sync can be used any more."""
        self._set("explorer", SyncState.STOPPED, self.explorer_version, note="finished")

    def _probe(self, version: int) -> None:
        """Score the probe of the version the engine holds, if the trainer has made one."""
        probe = self.probes.pop(version, None)
        if probe is None:
            return
        engine = self.channel.explorers.compute_engine_log_prob(probe)
        mask = probe.tensors["response_mask"].bool()
        diff = (engine.tensors["engine_log_probs"] - probe.tensors["old_log_probs"]).abs()[mask]
        self.times.probe_diffs.append(float(diff.max()) if diff.numel() else 0.0)

    def _loaded(self, version: int, load_s: float) -> None:
        if self.verify:
            digests = {d["digest"] for d in self.channel.explorers.weights_digest()}
            if len(digests) != 1:
                raise RuntimeError(f"explorer ranks hold different weights for version {version}")
            self.digests[version] = digests.pop()
        self.times.load_s += load_s
        self.times.syncs += 1
        self.explorer_version = version
        self._set("explorer", RUNNING, version)

    def _give_up(self, step: int, required: int, must: bool) -> None:
        if must:
            raise SyncTimeoutError(
                f"explorer step {step} needs weight version >= {required} (sync.max_staleness="
                f"{self.policy.max_staleness}, style {self.policy.style}) and the trainer did "
                f"not publish it within sync.timeout_s={self.timeout_s}s"
            )
        # A dynamic request nobody answered: go on with the weights held, ask again next step.
        self._set("explorer", RUNNING, self.explorer_version, note="request timed out")
