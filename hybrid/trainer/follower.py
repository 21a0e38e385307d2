"""The explorer side of the decoupled sync protocol: `SyncFollower`, which brings the engines to
the versions the trainer side publishes.

It runs on the source's thread (split's explorer loop before each explorer step, fully-async's
Rollouter between turns; the initial sync's helper thread before either starts) and follows:
the trainer side (`TransportPublisher`) alone decides what is published and when; the follower
loads what its style requires or allows, scores the probe of the version it leaves, and
reports its figures and digests into the `SyncExchange` the two sides share. The version held
is the follower's own state, touched only by that one thread at a time; `finished` and `stop`
only tell the Synchronizer, so they may come from any thread.

A wait the staleness bound requires fails naming the trainer (SyncTimeoutError); a dynamic
request nobody answered in time is given up, and asked again at the next step.
"""

from __future__ import annotations

import time

from hybrid.synchronizer.client import SynchronizerClient
from hybrid.synchronizer.decide import explorer_syncs
from hybrid.synchronizer.policy import SyncPolicy
from hybrid.trainer.sync_exchange import SyncExchange
from hybrid.trainer.weight_sync import (
    REQUIRE,
    RUNNING,
    SyncTimeoutError,
    WeightChannel,
    route_for,
)


class SyncFollower:
    def __init__(
        self,
        policy: SyncPolicy,
        channel: WeightChannel,
        exchange: SyncExchange,
    ) -> None:
        self.policy = policy
        self.channel = channel
        self.route = route_for(channel)
        self.exchange = exchange
        self.sync: SynchronizerClient = channel.synchronizer
        self.timeout_s = channel.timeout_s
        self.held = -1
        """The version the engines hold (-1: none yet)."""

    def start(self) -> None:
        """Leave STOPPED before either loop runs (so STOPPED means gone)."""
        self.sync.set_state("explorer", RUNNING, -1, note="start")

    def initial_sync(self, first_step: int) -> None:
        """Load the weights the first explorer step starts from (while the trainer side
        publishes them). A failure marks this side stopped, which wakes the trainer at once."""
        try:
            self._sync_for(first_step)
        except BaseException as error:
            self.stop(f"initial sync failed: {type(error).__name__}: {error}")
            raise

    def before_step(self, step: int) -> None:
        """Split: before explorer step `step`, bring the engines to a version the style allows;
        the time it took is the explorer's wait."""
        started = time.perf_counter()
        self._sync_for(step)
        self.exchange.add_explorer_wait(time.perf_counter() - started)

    def catch_up(self, wait: bool) -> int:
        """Fully-async: load the newest version if the trainer has a newer one than the
        engines hold (rendezvous: if it is offering one now); with `wait`, block until it has.
        Returns the version held afterwards."""
        held = self.held
        return self._update(
            wanted=wait,
            takes_newer=True,
            min_version=held + 1,
            timeout_error=(
                f"the Rollouter waited for a weight version newer than {held} and the trainer "
                f"did not publish one within sync.timeout_s={self.timeout_s}s"
            ),
        )

    def finished(self) -> None:
        """The explorer side is done: no sync can be used any more (idempotent)."""
        self.sync.stop("explorer", "finished")

    def stop(self, reason: str) -> None:
        """This side failed for `reason`: marked stopped, which wakes the trainer's waits."""
        self.sync.stop("explorer", reason)

    def _sync_for(self, step: int) -> None:
        held = self.held
        required = self.policy.required_version(step)
        must = held < required
        asks = self.policy.style == "dynamic_by_explorer" and self.policy.explorer_requests(
            step, held
        )
        self._update(
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

    def _update(
        self, wanted: bool, takes_newer: bool, min_version: int, timeout_error: str | None
    ) -> int:
        """Load a newer version if `wanted`, or if one is there and taken (`explorer_syncs`);
        the version held afterwards. A version older than `min_version` is waited out; if the
        wait times out, `timeout_error` is raised (SyncTimeoutError) or, when None (a dynamic
        request nobody answered), the explorer goes on with the weights held and asks again
        at its next step."""
        held = self.held
        view = self.sync.view()
        if not explorer_syncs(view, held, wanted, takes_newer, self.channel.rendezvous):
            return held
        self.sync.set_state("explorer", REQUIRE, held)
        # The trainer hands a version's probe over before its update: one already here is
        # scored now, while the trainer trains, instead of while it waits to send (a
        # rendezvous); one made later is scored once the offer is in, as the engines still
        # hold `held` until the load.
        self._probe(held)
        version = self.route.version_to_load(view, held, min_version)
        if version is None:
            if timeout_error is not None:
                raise SyncTimeoutError(timeout_error)
            self.sync.set_state("explorer", RUNNING, held, note="request timed out")
            return held
        self._probe(held)
        self._loaded(version, self.route.load(version, held))
        return version

    def _probe(self, version: int) -> None:
        """Score the probe of the version the engines hold, if the trainer has made one (a
        probe is scored once: popped)."""
        probe = self.exchange.pop_probe(version)
        if probe is None:
            return
        engine = self.channel.explorers.compute_engine_log_prob(probe)
        mask = probe.tensors["response_mask"].bool()
        diff = (engine.tensors["engine_log_probs"] - probe.tensors["old_log_probs"]).abs()[mask]
        self.exchange.add_probe_diff(float(diff.max()) if diff.numel() else 0.0)

    def _loaded(self, version: int, load_s: float) -> None:
        digest = None
        if self.channel.verify:
            digests = {d["digest"] for d in self.channel.explorers.weights_digest()}
            if len(digests) != 1:
                raise RuntimeError(f"explorer ranks hold different weights for version {version}")
            digest = digests.pop()
        self.exchange.add_load(version, load_s, digest)
        self.held = version
        self.sync.set_state("explorer", RUNNING, version)
