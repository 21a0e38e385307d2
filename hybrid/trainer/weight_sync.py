"""How a weight version travels between the split placement's two sides, and nothing about when.

`WeightChannel` publishes a version (trainer side) and loads one (explorer side) over the run's
`WeightTransport` (hybrid/transport: sync.method is read there, nowhere here). A `Route` is the
part of the Synchronizer's protocol that differs by the transport's `rendezvous`: the moves of
each side while a version travels.

  rendezvous (nccl): trainer RUNNING -> WAITING_SYNC -> RUNNING (the broadcast needs both)
                     explorer RUNNING -> REQUIRE_SYNC -> WAITING_SYNC -> RUNNING
  publish and go on: trainer stays RUNNING (publishes and goes on)
  (memory,           explorer RUNNING -> REQUIRE_SYNC -> RUNNING (pulls the newest version)
   checkpoint)

A route holds no state of its own: the trainer side (`TransportPublisher`,
hybrid/trainer/publisher.py) calls its `publish`, the explorer side (`SyncFollower`,
hybrid/trainer/follower.py) its `version_to_load` and `load`, each on its own thread, and each
call returns its seconds to its caller. When to sync is the two sides' decision (the style,
`SyncPolicy`, on one `SyncView`: hybrid.synchronizer.decide).

Versions: 0 is the initial weights; the trainer's step t turns version t-1 into t. Every wait
has a deadline (sync.timeout_s) and names the other side.
"""

from __future__ import annotations

from typing import Protocol

from hybrid.controller import RayWorkerGroup, WorkerGroupView
from hybrid.sharding.config import SyncConfig
from hybrid.synchronizer.client import SynchronizerClient
from hybrid.synchronizer.decide import SyncView
from hybrid.synchronizer.states import SyncState
from hybrid.transport.factory import transport_class

RUNNING, REQUIRE, WAITING = SyncState.RUNNING, SyncState.REQUIRE_SYNC, SyncState.WAITING_SYNC


class SyncTimeoutError(TimeoutError):
    """The other side did not do its part of a sync within sync.timeout_s."""


class WeightChannel:
    """Publishing and loading a version over the run's transport (sync.method)."""

    def __init__(
        self,
        sync: SyncConfig,
        synchronizer: SynchronizerClient,
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
        return float(self.trainer.publish_weights(version, self.synchronizer.handle)[0])

    def load(self, version: int) -> float:
        """Load `version` into every explorer (rendezvous: while the trainer publishes it;
        else from the payload the Synchronizer keeps for it); the slowest rank's seconds."""
        payload = None if self.rendezvous else self._payload(version)
        return float(max(self.explorers.load_weights(version, payload)))

    def _payload(self, version: int) -> object:
        newest, payload = self.synchronizer.newest()
        if newest == version:
            return payload
        return self.synchronizer.payload(version)


class Route(Protocol):
    """How a version travels between the sides: the acts that differ by `rendezvous`."""

    def publish(self, version: int) -> float:
        """Trainer side: get `version` to the explorer; the seconds spent sending it."""
        ...

    def version_to_load(self, view: SyncView, held: int, min_version: int) -> int | None:
        """Explorer side, having asked (REQUIRE_SYNC): the version to load now, waiting for it
        if need be; None when the wait timed out."""
        ...

    def load(self, version: int, held: int) -> float:
        """Explorer side: load `version` into the engine; the seconds it took."""
        ...


def route_for(channel: WeightChannel) -> Route:
    """The route of the run's transport (its one branch on `rendezvous`)."""
    return Rendezvous(channel) if channel.rendezvous else PublishAndGoOn(channel)


class Rendezvous:
    """The trainer offers a version (WAITING_SYNC) and sends it once the explorer has joined
    (WAITING_SYNC too): both halves of the broadcast run at the same time."""

    def __init__(self, channel: WeightChannel) -> None:
        self.channel = channel
        self.sync = channel.synchronizer
        self.timeout_s = channel.timeout_s

    def publish(self, version: int) -> float:
        """Offer `version`, wait for the explorer to join, send it. An explorer that finished
        (or died: the driver raises its error next) ends the offer."""
        self.sync.set_state("trainer", WAITING, version)
        seen = self.sync.wait_for_state(
            "explorer", [WAITING, SyncState.STOPPED], self.timeout_s, "trainer"
        )
        if seen is None:
            raise SyncTimeoutError(
                f"the explorer did not join the broadcast of weight version {version} within "
                f"sync.timeout_s={self.timeout_s}s"
            )
        seconds = self.channel.publish(version) if seen is WAITING else 0.0
        self.sync.set_state("trainer", RUNNING, version)
        return seconds

    def version_to_load(self, view: SyncView, held: int, min_version: int) -> int | None:
        # The offer is the trainer's version now: its schedule, not the explorer, picks it.
        seen = self.sync.wait_for_state(
            "trainer", [WAITING], self.timeout_s, "explorer", min_version=held + 1
        )
        return None if seen is None else self.sync.version("trainer")

    def load(self, version: int, held: int) -> float:
        self.sync.set_state("explorer", WAITING, held)  # the trainer starts sending
        return self.channel.load(version)


class PublishAndGoOn:
    """The trainer publishes into a store (object store, directory) and goes on; the explorer
    loads the newest version kept there."""

    def __init__(self, channel: WeightChannel) -> None:
        self.channel = channel
        self.sync = channel.synchronizer
        self.timeout_s = channel.timeout_s

    def publish(self, version: int) -> float:
        return self.channel.publish(version)

    def version_to_load(self, view: SyncView, held: int, min_version: int) -> int | None:
        if view.newest >= min_version:
            return view.newest
        return self.sync.wait_for_version(min_version, self.timeout_s, "explorer")

    def load(self, version: int, held: int) -> float:
        return self.channel.load(version)
