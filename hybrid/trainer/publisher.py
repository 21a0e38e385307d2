"""How a trained version reaches the engines: the `WeightPublisher` of each mode.

Colocated (`InProcessPublisher`): nothing to send; the mode switch inside the next
`generate_sequences` gathers the actor's shards into the engine, and the workers' ledgers
report what that sync cost. Split and fully-async (`TransportPublisher`): the trainer side of
the Synchronizer's protocol (hybrid/trainer/weight_sync.py): the starting weights go to the
explorers before either side runs, and each step's version goes out when the style says so,
over the configured WeightTransport.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from hybrid.trainer.weight_sync import SyncSides

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
        """The run is done: write what the publisher recorded."""
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


class TransportPublisher:
    def __init__(self, sides: SyncSides, output_dir: str) -> None:
        self.sides = sides
        self.output_dir = Path(output_dir)

    def start(self, version: int) -> None:
        self.sides.start(version)
        self.sides.initial_sync(version, first_explorer_step=version + 1)

    def after_step(self, step: int) -> None:
        self.sides.trainer_sync(step, after_step=True)

    def metrics(self, worker: dict[str, float]) -> dict[str, float]:
        out = self.sides.times.drain()
        out["timing_s/sync"] = out["timing_s/publish"] + out["timing_s/explorer_load"]
        return out

    def finish(self) -> None:
        if self.sides.digests:
            path = self.output_dir / "engine_digests.json"
            path.write_text(json.dumps(self.sides.digests, indent=1))
