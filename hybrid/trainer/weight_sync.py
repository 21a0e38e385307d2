"""The split placement's two sides of a weight sync, as the Synchronizer's state machine says.

`WeightChannel` publishes a version (trainer side) and loads one (explorer side) over the run's
`WeightTransport` (hybrid/transport: sync.method is read there, nowhere here). `SyncSides`
decides when, from the style (`SyncPolicy`) and one view of the Synchronizer
(hybrid.synchronizer.decide), and moves its side through the four states. Its one branch is on
the transport's `rendezvous`, which picks the route a version takes:

  rendezvous (nccl): trainer RUNNING -> WAITING_SYNC -> RUNNING (the broadcast needs both)
                     explorer RUNNING -> REQUIRE_SYNC -> WAITING_SYNC -> RUNNING
  publish and go on: trainer stays RUNNING (publishes and goes on)
  (memory,           explorer RUNNING -> REQUIRE_SYNC -> RUNNING (pulls the newest version)
   checkpoint)

Versions: 0 is the initial weights; the trainer's step t turns version t-1 into t. Every wait
has a deadline (sync.timeout_s); a dynamic request not answered in time is retried at the
explorer's next step, a wait the staleness bound requires fails naming the other side.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import ray

from hybrid.controller import RayWorkerGroup, WorkerGroupView
from hybrid.data import Batch
from hybrid.sharding.config import SyncConfig
from hybrid.synchronizer.decide import SyncView, explorer_syncs, trainer_publishes
from hybrid.synchronizer.policy import SyncPolicy
from hybrid.synchronizer.states import Side, SyncState
from hybrid.transport.factory import transport_class

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
    """Publishing and loading a version over the run's transport (sync.method)."""

    def __init__(
        self,
        sync: SyncConfig,
        synchronizer: Any,
        trainer: WorkerGroupView,
        explorers: RayWorkerGroup,
    ) -> None:
        self.method = sync.method
        """For reports only: what the transport is, not how it behaves."""
        self.rendezvous = transport_class(sync).rendezvous
        """Both sides meet for every version (the explorers receive while the trainer sends)."""
        self.timeout_s = sync.timeout_s
        self.verify = sync.verify_checksum
        self.synchronizer = synchronizer
        self.trainer = trainer
        self.explorers = explorers

    def connect(self) -> None:
        """A rendezvous transport: form its group (trainer rank 0 + every explorer rank) once."""
        if not self.rendezvous:
            return
        host, port = self.trainer.transport_address()
        world = 1 + self.explorers.world_size
        joining = self.explorers.join_transport.submit(host, port, world)
        self.trainer.join_transport(host, port, world)
        joining.get(timeout=self.timeout_s)

    def publish(self, version: int) -> float:
        """The trainer publishes its weights as `version`; the seconds it took."""
        return float(self.trainer.publish_weights(version, self.synchronizer)[0])

    def load(self, version: int) -> float:
        """Load `version` into every explorer (rendezvous: while the trainer publishes it;
        else from the payload the Synchronizer keeps for it); the slowest rank's seconds."""
        payload = None if self.rendezvous else self._payload(version)
        return float(max(self.explorers.load_weights(version, payload)))

    def _payload(self, version: int) -> Any:
        newest, payload = ray.get(self.synchronizer.newest.remote())
        if newest == version:
            return payload
        return ray.get(self.synchronizer.payload.remote(version))


class _Route(Protocol):
    """How a version travels between the sides: the acts that differ by `rendezvous`."""

    def publish(self, version: int) -> None:
        """Trainer side: get `version` to the explorer."""
        ...

    def version_to_load(self, view: SyncView, held: int, min_version: int) -> int | None:
        """Explorer side, having asked (REQUIRE_SYNC): the version to load now, waiting for it
        if need be; None when the wait timed out."""
        ...

    def load(self, version: int, held: int) -> float:
        """Explorer side: load `version` into the engine; the seconds it took."""
        ...


class _Rendezvous:
    """The trainer offers a version (WAITING_SYNC) and sends it once the explorer has joined
    (WAITING_SYNC too): both halves of the broadcast run at the same time."""

    def __init__(self, sides: SyncSides) -> None:
        self.sides = sides

    def publish(self, version: int) -> None:
        """Offer `version`, wait for the explorer to join, send it. An explorer that finished
        (or died: the driver raises its error next) ends the offer."""
        s = self.sides
        s.set_state("trainer", WAITING, version)
        seen = ray.get(
            s.sync.wait_for_state.remote(
                "explorer", [WAITING, SyncState.STOPPED], s.timeout_s, "trainer"
            )
        )
        if seen is None:
            raise SyncTimeoutError(
                f"the explorer did not join the broadcast of weight version {version} within "
                f"sync.timeout_s={s.timeout_s}s"
            )
        if SyncState(seen) is WAITING:
            s.times.publish_s += s.channel.publish(version)
        s.set_state("trainer", RUNNING, version)

    def version_to_load(self, view: SyncView, held: int, min_version: int) -> int | None:
        # The offer is the trainer's version now: its schedule, not the explorer, picks it.
        s = self.sides
        seen = ray.get(
            s.sync.wait_for_state.remote(
                "trainer", [WAITING], s.timeout_s, "explorer", min_version=held + 1
            )
        )
        return None if seen is None else int(ray.get(s.sync.version.remote("trainer")))

    def load(self, version: int, held: int) -> float:
        self.sides.set_state("explorer", WAITING, held)  # the trainer starts sending
        return self.sides.channel.load(version)


class _PublishAndGoOn:
    """The trainer publishes into a store (object store, directory) and goes on; the explorer
    loads the newest version kept there."""

    def __init__(self, sides: SyncSides) -> None:
        self.sides = sides

    def publish(self, version: int) -> None:
        self.sides.times.publish_s += self.sides.channel.publish(version)

    def version_to_load(self, view: SyncView, held: int, min_version: int) -> int | None:
        if view.newest >= min_version:
            return view.newest
        s = self.sides
        got = ray.get(s.sync.wait_for_version.remote(min_version, s.timeout_s, "explorer"))
        return None if got is None else int(got)

    def load(self, version: int, held: int) -> float:
        return self.sides.channel.load(version)


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
        self.timeout_s = channel.timeout_s
        self.route: _Route = _Rendezvous(self) if channel.rendezvous else _PublishAndGoOn(self)
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

    def set_state(
        self, side: Side, state: SyncState, version: int | None = None, note: str = ""
    ) -> None:
        ray.get(self.sync.set_state.remote(side, state, version, note))

    def _view(self) -> SyncView:
        view: SyncView = ray.get(self.sync.view.remote())
        return view

    # --- trainer side --------------------------------------------------------------------

    def trainer_sync(self, version: int, after_step: bool) -> None:
        """Publish `version` (the trainer's weights now) if the style or a request wants it.
        Called after each step and while waiting for data."""
        if version >= self.total_steps:
            return  # no explorer step is left to use it
        if trainer_publishes(self._view(), self.policy, version, after_step):
            self.route.publish(version)

    def start(self, version: int) -> None:
        """Both sides leave STOPPED before either loop runs (so STOPPED means gone)."""
        self.set_state("trainer", RUNNING, version, note="start")
        self.set_state("explorer", RUNNING, -1, note="start")

    def initial_sync(self, version: int, first_explorer_step: int) -> None:
        """Both sides at once, before either loop runs: the trainer publishes the weights the
        explorer starts from (0, or the resumed step) and the explorer loads them (a
        rendezvous needs the two halves at the same time, so the explorer's runs on a thread
        of its own). A side that fails is marked stopped, which wakes the other at once."""
        with ThreadPoolExecutor(1, thread_name_prefix="initial-sync") as pool:
            explorer = pool.submit(
                self._stopping_on_error, "explorer", self.explorer_sync, first_explorer_step
            )
            self._stopping_on_error("trainer", self.route.publish, version)
            explorer.result()

    def _stopping_on_error(self, side: Side, work: Callable[..., Any], *args: Any) -> Any:
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
        self._explorer_update(
            wanted=must or asks,
            takes_newer=self.policy.style == "fixed",
            min_version=max(required, held + 1),
            timeout_error=(
                f"explorer step {step} needs weight version >= {required} (sync.max_staleness="
                f"{self.policy.max_staleness}, style {self.policy.style}) and the trainer did "
                f"not publish it within sync.timeout_s={self.timeout_s}s"
                if must
                else None
            ),
        )

    def explorer_catch_up(self, wait: bool) -> int:
        """Fully-async: load the newest version if the trainer has a newer one than the
        engine holds (rendezvous: if it is offering one now); with `wait`, block until it has.
        Returns the version held afterwards."""
        held = self.explorer_version
        return self._explorer_update(
            wanted=wait,
            takes_newer=True,
            min_version=held + 1,
            timeout_error=(
                f"the Rollouter waited for a weight version newer than {held} and the trainer "
                f"did not publish one within sync.timeout_s={self.timeout_s}s"
            ),
        )

    def _explorer_update(
        self, wanted: bool, takes_newer: bool, min_version: int, timeout_error: str | None
    ) -> int:
        """Load a newer version if `wanted`, or if one is there and taken (`explorer_syncs`);
        the version held afterwards. A version older than `min_version` is waited out; if the
        wait times out, `timeout_error` is raised (SyncTimeoutError) or, when None (a dynamic
        request nobody answered), the explorer goes on with the weights held and asks again
        at its next step."""
        held = self.explorer_version
        view = self._view()
        if not explorer_syncs(view, held, wanted, takes_newer, self.channel.rendezvous):
            return held
        self.set_state("explorer", REQUIRE, held)
        version = self.route.version_to_load(view, held, min_version)
        if version is None:
            if timeout_error is not None:
                raise SyncTimeoutError(timeout_error)
            self.set_state("explorer", RUNNING, held, note="request timed out")
            return held
        self._probe(held)
        self._loaded(version, self.route.load(version, held))
        return version

    def explorer_finished(self) -> None:
        """The explorer's last step is done: no sync can be used any more."""
        self.set_state("explorer", SyncState.STOPPED, self.explorer_version, note="finished")

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
        self.set_state("explorer", RUNNING, version)
