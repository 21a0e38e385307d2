"""Where checkpoints live, which one a resume picks, and which old ones retention deletes.

`<output_dir>/checkpoints/step_<N>` holds the workers' sharded state plus the driver's
(step, data position). Workers write to a temporary name and rename when complete, so any
`step_<N>` directory present is whole; a kill mid-save leaves the previous one intact (and a
`step_<N>.tmp` or `step_<N>.old` directory, which is never counted as a checkpoint).

Retention (`trainer.max_checkpoints_to_keep`, like verl's max_actor_ckpt_to_keep): after a
save completes, the complete checkpoints beyond the newest `keep` are deleted, oldest first.
The latest (what a resume loads) and the one just written are never deleted, so an old one
goes only once a newer one is complete.

Across nodes every rank writes its shards under the same path, so the output directory must
be one that every node sees (a shared file system): `shared_dir_error` says which ranks and
nodes do not, before any model is built.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step_{step}"


def critic_checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    """The critic's state of step N: written before the actor's `step_<N>` (whose presence
    marks the checkpoint complete), under a name no resume mistakes for a checkpoint."""
    return Path(output_dir) / "checkpoints" / "critic" / f"step_{step}"


def complete_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every complete checkpoint, oldest first."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(
        (int(m.group(1)), p)
        for p in root.iterdir()
        if p.is_dir() and (m := _STEP_DIR.match(p.name))
    )


def latest_checkpoint(output_dir: str | Path) -> tuple[int, Path] | None:
    found = complete_checkpoints(output_dir)
    return found[-1] if found else None


def checkpoints_to_delete(
    complete: Sequence[tuple[int, Path]], keep: int | None, just_saved: int | None = None
) -> list[Path]:
    """The directories retention deletes, oldest first: all but the newest `keep` of the
    complete checkpoints (None: none), never the checkpoint of step `just_saved`."""
    if keep is None:
        return []
    if keep < 1:
        raise ValueError(f"trainer.max_checkpoints_to_keep must be >= 1, got {keep}")
    ordered = sorted(complete)
    stale = ordered[: max(len(ordered) - keep, 0)]
    return [path for step, path in stale if step != just_saved]


def prune_checkpoints(output_dir: str | Path, keep: int | None, just_saved: int) -> list[Path]:
    """Delete what `checkpoints_to_delete` names under output_dir; returns the deleted dirs."""
    doomed = checkpoints_to_delete(complete_checkpoints(output_dir), keep, just_saved)
    for path in doomed:
        shutil.rmtree(path)
        shutil.rmtree(path.parent / "critic" / path.name, ignore_errors=True)
    return doomed


def shared_dir_error(
    output_dir: str | Path,
    ranks_missing: Callable[[Path], list[int]],
    rank_nodes: Sequence[object],
) -> str | None:
    """Write a marker file into `output_dir` (the driver's view) and ask the workers which of
    them do not see it; the error text naming those ranks and nodes, or None if all do."""
    marker = Path(output_dir).resolve() / f".shared-check-{uuid.uuid4().hex[:12]}"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    try:
        missing = ranks_missing(marker)
    finally:
        marker.unlink()
    if not missing:
        return None
    nodes = sorted({str(rank_nodes[r]) for r in missing})
    return (
        f"trainer.output_dir {marker.parent} is not visible from ranks {missing} on nodes "
        f"{nodes}: checkpoints are written by every rank into one directory, so with "
        "trainer.nnodes > 1 it must be on a file system every node shares"
    )
