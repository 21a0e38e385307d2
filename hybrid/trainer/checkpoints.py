"""Where checkpoints live, which ones are whole, which one a resume picks, and which old ones
retention deletes.

`<output_dir>/checkpoints/step_<N>` holds the workers' sharded state plus the driver's
(step, data position); PPO's critic keeps its own under `checkpoints/critic/step_<N>`. Workers
write into `step_<N>.tmp` and rename when done (a `.tmp` or `.old` directory is never a
checkpoint), but a directory alone does not prove a whole checkpoint: the driver may die after
the actor's rename and before the LoRA adapter is written, and a user may delete or truncate a
file later. So the driver's last act of a save is `manifest.json` in `step_<N>`: the step, a
format version and the size of every file of the checkpoint (the actor's and the critic's),
written atomically. A checkpoint is *whole* when its manifest exists and every file it lists
is on disk with that size (`manifest_problem` names the first thing that is not). Bit flips
inside a file of the right size are not detected: DCP has no checksums to compare against and
hashing every shard on each resume would cost a full read of the checkpoint.

A resume (`resumable_checkpoint`) takes the newest whole checkpoint and reports each newer
damaged one with its reason; nothing is deleted for being damaged.

Retention (`trainer.max_checkpoints_to_keep`, like verl's max_actor_ckpt_to_keep): after a
save completes, the whole checkpoints beyond the newest `keep` are deleted, oldest first.
Damaged ones are neither counted nor deleted. The newest whole one (what a resume loads) and
the one just written are never deleted, so an old one goes only once a newer one is whole.

`CheckpointWriter` is the one save both the driver (under output_dir) and the SFT stage (under
output_dir/sft) use: it removes a stale manifest of the same step first, has the critic then the
actor write their state (and the actor its LoRA adapter), writes the manifest, then applies
retention. It also appends the workers' memory ledger to the same directory's memory.jsonl.

Across nodes every rank writes its shards under the same path, so the output directory must
be one that every node sees (a shared file system): `shared_dir_error` says which ranks and
nodes do not, before any model is built.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybrid.memory.records import write_records
from hybrid.workers.lora import LORA_ADAPTER_DIR

if TYPE_CHECKING:
    from hybrid.controller import WorkerGroupView

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d+)$")

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1
"""Bumped when the manifest's layout changes; a reader refuses formats it does not know."""

_MANIFEST_TMP = f"{MANIFEST_FILE}.tmp"
MISSING_MANIFEST = (
    f"{MANIFEST_FILE} missing (a save that did not finish, or a checkpoint from before manifests)"
)


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step_{step}"


def critic_checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    """The critic's state of step N: written before the actor's `step_<N>`, under a name no
    resume mistakes for a checkpoint; the manifest in `step_<N>` covers it."""
    return Path(output_dir) / "checkpoints" / "critic" / f"step_{step}"


# --- the manifest -----------------------------------------------------------------------------


def file_sizes(root: Path) -> dict[str, int]:
    """Every file under `root` as {path relative to root (POSIX): size in bytes}, the manifest
    itself (and its temporary name) left out."""
    own = {MANIFEST_FILE, _MANIFEST_TMP}
    return {
        path.relative_to(root).as_posix(): path.stat().st_size
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.relative_to(root).as_posix() not in own
    }


def write_manifest(step_dir: Path, step: int, critic_dir: Path | None) -> Path:
    """Record what `step_dir` (and the critic's `critic_dir`, if the run has one) hold now, in
    `step_dir/manifest.json`, atomically: a kill leaves either no manifest or the whole one."""
    manifest = {
        "format": MANIFEST_FORMAT,
        "step": step,
        "files": file_sizes(step_dir),
        "critic_files": None if critic_dir is None else file_sizes(critic_dir),
    }
    path = step_dir / MANIFEST_FILE
    tmp = step_dir / _MANIFEST_TMP
    with tmp.open("w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    # The rename itself is durable only once the directory entry is on disk.
    directory = os.open(step_dir, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return path


def manifest_problem(step_dir: Path, critic_dir: Path | None) -> str | None:
    """None if the checkpoint in `step_dir` is whole; else the first reason it is not, short
    enough for one log line. `critic_dir`: the critic's files are checked too (None: a run
    without a critic, which does not load them). A manifest that lists no critic files passes
    here; the resume names the missing critic state as a config mismatch, not as damage."""
    path = step_dir / MANIFEST_FILE
    if not path.is_file():
        return MISSING_MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"{MANIFEST_FILE} is not valid JSON"
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return f"{MANIFEST_FILE} is not a checkpoint manifest (no 'files' map)"
    if manifest.get("format") != MANIFEST_FORMAT:
        return (
            f"{MANIFEST_FILE} has format {manifest.get('format')!r}; this version reads "
            f"format {MANIFEST_FORMAT}"
        )
    expected_step = _step_of(step_dir)
    if expected_step is not None and manifest.get("step") != expected_step:
        return f"{MANIFEST_FILE} is for step {manifest.get('step')!r}, not {expected_step}"
    problem = _sizes_problem(step_dir, manifest["files"], "file")
    critic_files = manifest.get("critic_files")
    if problem is None and critic_dir is not None and isinstance(critic_files, dict):
        problem = _sizes_problem(critic_dir, critic_files, "critic file")
    return problem


def _sizes_problem(root: Path, sizes: dict[str, object], what: str) -> str | None:
    for name, size in sorted(sizes.items()):
        path = root / name
        if not path.is_file():
            return f"{what} {name} missing"
        actual = path.stat().st_size
        if actual != size:
            return f"{what} {name} is {actual} bytes, the manifest says {size}"
    return None


def _step_of(step_dir: Path) -> int | None:
    match = _STEP_DIR.match(step_dir.name)
    return int(match.group(1)) if match else None


# --- which checkpoints exist, which are whole ---------------------------------------------------


def step_dirs(output_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every `step_<N>` directory, whole or damaged, oldest first."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(
        (int(m.group(1)), p)
        for p in root.iterdir()
        if p.is_dir() and (m := _STEP_DIR.match(p.name))
    )


def complete_checkpoints(
    output_dir: str | Path, needs_critic: bool = False
) -> list[tuple[int, Path]]:
    """(step, directory) of every whole checkpoint, oldest first. `needs_critic`: the
    critic's files count too (a PPO run loads them)."""
    return [
        (step, path)
        for step, path in step_dirs(output_dir)
        if manifest_problem(path, _critic_of(output_dir, step, needs_critic)) is None
    ]


@dataclass(frozen=True)
class ResumeChoice:
    """What `resumable_checkpoint` found."""

    found: tuple[int, Path] | None
    """(step, directory) of the newest whole checkpoint; None: there is none."""
    skipped: tuple[tuple[int, str], ...]
    """(step, reason) of each damaged checkpoint newer than `found`, newest first."""


def resumable_checkpoint(output_dir: str | Path, needs_critic: bool) -> ResumeChoice:
    """The newest whole checkpoint, and the damaged newer ones passed over on the way."""
    skipped: list[tuple[int, str]] = []
    for step, path in reversed(step_dirs(output_dir)):
        problem = manifest_problem(path, _critic_of(output_dir, step, needs_critic))
        if problem is None:
            return ResumeChoice((step, path), tuple(skipped))
        skipped.append((step, problem))
    return ResumeChoice(None, tuple(skipped))


def _critic_of(output_dir: str | Path, step: int, needs_critic: bool) -> Path | None:
    return critic_checkpoint_dir(output_dir, step) if needs_critic else None


# --- retention --------------------------------------------------------------------------------


def checkpoints_to_delete(
    complete: Sequence[tuple[int, Path]], keep: int | None, just_saved: int | None = None
) -> list[Path]:
    """The directories retention deletes, oldest first: all but the newest `keep` of the
    whole checkpoints `complete` (None: none), never the checkpoint of step `just_saved`."""
    if keep is None:
        return []
    if keep < 1:
        raise ValueError(f"trainer.max_checkpoints_to_keep must be >= 1, got {keep}")
    ordered = sorted(complete)
    stale = ordered[: max(len(ordered) - keep, 0)]
    return [path for step, path in stale if step != just_saved]


def prune_checkpoints(
    output_dir: str | Path, keep: int | None, just_saved: int, needs_critic: bool = False
) -> list[Path]:
    """Delete what `checkpoints_to_delete` names among the whole checkpoints under
    output_dir (and their critic state); returns the deleted dirs. Damaged ones stay: they
    are the user's to inspect, and the newest whole one is always among the kept."""
    whole = complete_checkpoints(output_dir, needs_critic) if keep is not None else []
    doomed = checkpoints_to_delete(whole, keep, just_saved)
    for path in doomed:
        shutil.rmtree(path)
        shutil.rmtree(path.parent / "critic" / path.name, ignore_errors=True)
    return doomed


# --- writing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointWriter:
    """What a stage writes under `root` (output_dir for RL, output_dir/sft for the SFT stage):
    its `step_<N>` checkpoints and its memory.jsonl."""

    root: Path
    keep: int | None
    """trainer.max_checkpoints_to_keep (None: keep all)."""
    memory_log_freq: int
    """trainer.memory_log_freq: the ledger of every N-th step goes to memory.jsonl (0: only
    step 0's, the initialisation)."""
    what: str = "checkpoint"
    """How the retention log line names a checkpoint ("SFT checkpoint")."""

    def save(
        self,
        step: int,
        actor: WorkerGroupView,
        extra: dict[str, Any],
        critic: WorkerGroupView | None = None,
        adapter: bool = False,
    ) -> Path:
        """`step_<step>` under root: the critic's state (under `critic/`), the actor's with
        `extra`, the LoRA adapter in peft's format when `adapter`, then the manifest; whole
        only once that is written. Then the whole ones beyond `keep` are deleted."""
        path = checkpoint_dir(self.root, step)
        critic_dir = critic_checkpoint_dir(self.root, step) if critic is not None else None
        # A step_N of an earlier run (resume=disable, or one resumed before step N) stops
        # counting as whole before any of its files, the critic's first, is replaced.
        (path / MANIFEST_FILE).unlink(missing_ok=True)
        if critic is not None and critic_dir is not None:
            critic.save_checkpoint(str(critic_dir))
        actor.save_checkpoint(str(path), extra=extra)
        if adapter:
            actor.export_adapter(str(path / LORA_ADAPTER_DIR))
        write_manifest(path, step, critic_dir)
        # Only now is this checkpoint whole: the older ones beyond the limit may go.
        needs_critic = critic_dir is not None
        for old in prune_checkpoints(self.root, self.keep, step, needs_critic=needs_critic):
            logger.info(
                "deleted %s %s (trainer.max_checkpoints_to_keep=%s)", self.what, old, self.keep
            )
        return path

    def log_memory(self, actor: WorkerGroupView, step: int) -> None:
        """Drain every worker's memory ledger, stamped `step`; append it to root/memory.jsonl
        at step 0 and every `memory_log_freq`-th step."""
        per_rank = actor.pop_memory_records(step)
        freq = self.memory_log_freq
        if step == 0 or (freq and step % freq == 0):
            records = [record for records in per_rank for record in records]
            write_records(self.root / "memory.jsonl", records)


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
