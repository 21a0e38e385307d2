"""How a trained version reaches the engines: the `WeightPublisher` of each mode.

Colocated (`InProcessPublisher`): nothing to send; the mode switch inside the next
`generate_sequences` gathers the actor's shards into the engine, and the workers' ledgers
report what that sync cost. Split and fully-async (`TransportPublisher`): the trainer side of
the Synchronizer's protocol, and its one owner there. It alone publishes: the starting weights
before either side runs (while its `SyncFollower` loads them), each step's version when the
style says so, and, while the trainer waits for data, the versions an explorer asks for
(`serve_while_waiting`). It takes the trainer's probes, drains the figures both sides report
(`SyncExchange`), and announces each version it publishes to its listeners once, as it goes
out (`on_published`: fully-async's queue learns that way which groups each version trained).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from hybrid.data import Batch
from hybrid.synchronizer.client import SynchronizerClient
from hybrid.synchronizer.decide import trainer_publishes
from hybrid.synchronizer.policy import SyncPolicy
from hybrid.trainer.follower import SyncFollower
from hybrid.trainer.sync_exchange import SyncExchange
from hybrid.trainer.weight_sync import RUNNING, WeightChannel, route_for

PUBLISHER_KEYS = frozenset({"timing_s/sync"})
"""Keys every publisher adds to a step's metrics."""

COLOCATED_SYNC_KEYS = (
    "timing_s/sync",
    "timing_s/sync_gather",
    "timing_s/sync_load",
    "timing_s/mode_switch",
)


class WeightPublisher(Protocol):
    def start(self, version: int) -> None:
        """Before the first step: the engines get `version` (0, or the resumed step)."""
        ...

    def after_step(self, step: int) -> None:
        """Step `step` made version `step`: publish it if the schedule wants it now."""
        ...

    def metrics(self, worker: dict[str, float]) -> dict[str, float]:
        """This step's sync figures (`worker`: the trainer workers' own records)."""
        ...

    def finish(self) -> None:
        """The last step is done: the trainer side ends, and what it recorded is written."""
        ...


class InProcessPublisher:
    def start(self, version: int) -> None:
        pass  # the first generate syncs

    def after_step(self, step: int) -> None:
        pass  # the next generate syncs

    def metrics(self, worker: dict[str, float]) -> dict[str, float]:
        out = {key: worker.get(key, 0.0) for key in COLOCATED_SYNC_KEYS}
        out.update({k: v for k, v in worker.items() if k.startswith("sync/")})
        return out

    def finish(self) -> None:
        pass


class PublishListener(Protocol):
    def on_published(self, version: int) -> None:
        """`version` goes out now: called before any explorer can load it."""
        ...


class TransportPublisher:
    def __init__(
        self,
        policy: SyncPolicy,
        channel: WeightChannel,
        follower: SyncFollower,
        exchange: SyncExchange,
        total_steps: int,
        output_dir: str,
    ) -> None:
        """`follower`: the explorer side, which this publisher drives only for the initial
        sync (both halves at once, before the source's thread exists)."""
        self.policy = policy
        self.route = route_for(channel)
        self.sync: SynchronizerClient = channel.synchronizer
        self.follower = follower
        self.exchange = exchange
        self.total_steps = total_steps
        self.output_dir = Path(output_dir)
        self.listeners: list[PublishListener] = []

    def subscribe(self, listener: PublishListener) -> None:
        """`listener` hears of every version published from now on."""
        self.listeners.append(listener)

    def start(self, version: int) -> None:
        """Both sides leave STOPPED, then the trainer publishes the weights the explorer starts
        from (0, or the resumed step) while the follower loads them: a rendezvous needs the two
        halves at the same time, so the follower's runs on a thread of its own. A side that
        fails is marked stopped, which wakes the other at once."""
        self.sync.set_state("trainer", RUNNING, version, note="start")
        self.follower.start()
        with ThreadPoolExecutor(1, thread_name_prefix="initial-sync") as pool:
            loading = pool.submit(self.follower.initial_sync, version + 1)
            try:
                self._publish(version)
            except BaseException as error:
                self.stop(f"initial sync failed: {type(error).__name__}: {error}")
                raise
            loading.result()

    def after_step(self, step: int) -> None:
        self._publish_if_due(step, after_step=True)

    def serve_while_waiting(self, step: int) -> None:
        """Trainer step `step` waits for data: publish the weights it holds (version step - 1)
        if an explorer asks for them (dynamic style)."""
        self._publish_if_due(step - 1, after_step=False)

    def take_probe(self, version: int, rows: Batch | None, oldest_kept: int) -> None:
        """A few rows trained under `version`, with the trainer's log-probs: the follower scores
        them before it leaves that version. Probes of versions before `oldest_kept` go."""
        self.exchange.put_probe(version, rows, oldest_kept)

    def metrics(self, worker: dict[str, float]) -> dict[str, float]:
        out = self.exchange.drain().metrics()
        out["timing_s/sync"] = out["timing_s/publish"] + out["timing_s/explorer_load"]
        return out

    def finish(self) -> None:
        self.sync.stop("trainer", "finished", version=self.total_steps)
        digests = self.exchange.digests()
        if digests:
            path = self.output_dir / "engine_digests.json"
            path.write_text(json.dumps(digests, indent=1))

    def stop(self, reason: str) -> None:
        """The trainer side ends for `reason` (it failed, or it is done and a generating side
        must stop waiting for versions): marked stopped, which wakes the explorer's waits.
        The first reason stays."""
        self.sync.stop("trainer", reason)

    def _publish_if_due(self, version: int, after_step: bool) -> None:
        """Publish `version` (the trainer's weights now) if the style or a request wants it."""
        if version >= self.total_steps:
            return  # no explorer step is left to use it
        if trainer_publishes(self.sync.view(), self.policy, version, after_step):
            self._publish(version)

    def _publish(self, version: int) -> None:
        # Listeners first: once the route has run an explorer may hold `version`, and the
        # fully-async queue must by then know what was trained under it (its pacing rule).
        for listener in self.listeners:
            listener.on_published(version)
        self.exchange.add_publish(self.route.publish(version))


def transport_sides(
    policy: SyncPolicy, channel: WeightChannel, total_steps: int, output_dir: str
) -> tuple[TransportPublisher, SyncFollower]:
    """The two sides of a decoupled run's sync and the one exchange between them."""
    exchange = SyncExchange()
    follower = SyncFollower(policy, channel, exchange)
    publisher = TransportPublisher(policy, channel, follower, exchange, total_steps, output_dir)
    return publisher, follower
