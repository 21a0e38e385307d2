"""The `checkpoint` transport: weight versions as safetensors files in a shared directory.

Layout of `root`:

    v<N>/                     one complete version
        shard-00000.safetensors, ...   one file per bucket-sized group of tensors
        manifest.json         {"version", "tensors": [{name, shape, dtype, file, checksum}],
                               "files"}, tensors in stream order
    .tmp-v<N>-<random>/       a version being written (or left by a crash): never read

Atomicity, the way our training checkpoints do it: a version is written into a temp
directory, every file is fsynced, and only then the directory is renamed to `v<N>`, so a crash
at any point leaves either no `v<N>` or a complete one. A version counts as complete only when
its manifest reads and every file it names exists. The manifest carries each tensor's digest
so that the explorer verifies what it loaded. Needs: a filesystem every process sees.
`CheckpointTransport` is this medium behind the `WeightTransport` protocol.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from hybrid.transport.base import Announce, Side, TransportSettings
from hybrid.transport.buckets import (
    Weights,
    cast_floating,
    dtype_name,
    group_by_size,
    tensor_digest,
)
from hybrid.transport.errors import TransportChecksumError, TransportError

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
TEMP_PREFIX = ".tmp-"
_VERSION_DIR = re.compile(r"v(0|[1-9][0-9]*)")


def write_version(root: str | Path, version: int, weights: Weights, bucket_bytes: int) -> Path:
    """Write the stream as `root/v<version>/` atomically and return that path.

    Raises FileExistsError if `v<version>` already exists. On an error the temp directory is
    removed; after a crash it stays behind, ignored (see `remove_stale_temps`).
    """
    if version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    root = Path(root)
    final = version_dir(root, version)
    if final.exists():
        raise FileExistsError(f"weight version {version} already exists at {final}")
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}v{version}-", dir=root))
    try:
        manifest = _write_files(tmp, version, weights, bucket_bytes)
        _write_json(tmp / MANIFEST, manifest)
        _fsync(tmp)
        # rename() would silently replace an empty directory: check again right before it.
        if final.exists():
            raise FileExistsError(f"weight version {version} already exists at {final}")
        os.rename(tmp, final)
        _fsync(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def version_dir(root: str | Path, version: int) -> Path:
    return Path(root) / f"v{version}"


def complete_versions(root: str | Path) -> list[tuple[int, Path]]:
    """The complete versions under `root`, ascending; temp and broken directories are skipped."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _VERSION_DIR.fullmatch(path.name)
        if match and path.is_dir() and _is_complete(path, int(match.group(1))):
            found.append((int(match.group(1)), path))
    return sorted(found)


def newest_version(root: str | Path) -> tuple[int, Path] | None:
    """The newest complete version, or None if there is none."""
    versions = complete_versions(root)
    return versions[-1] if versions else None


def read_version(path: str | Path, verify: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield the tensors of the version at `path` in stream order, checking their digests.

    Raises `TransportError` naming the path for a missing or unreadable manifest, naming the
    file and tensor for a missing or corrupt shard, and `TransportChecksumError` for a digest
    that does not match.
    """
    path = Path(path)
    # Read the manifest now, so that a missing version fails at the call, not at iteration.
    return _stream_tensors(path, read_manifest(path), verify)


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of the version at `path`; `TransportError` naming it if absent or bad."""
    file = Path(path) / MANIFEST
    try:
        manifest = json.loads(file.read_text())
        if not (
            isinstance(manifest["version"], int)
            and isinstance(manifest["tensors"], list)
            and isinstance(manifest["files"], list)
        ):
            raise ValueError("wrong field types")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TransportError(f"weight manifest {file} is missing or unreadable: {e}") from e
    return manifest


def prune_versions(root: str | Path, keep: int) -> list[Path]:
    """Delete the complete versions older than the newest `keep`; return what was deleted.

    Each version is first renamed to a temp name, so that it disappears at once rather than
    file by file. A reader still streaming a deleted version fails: prune only versions no
    explorer reads any more.
    """
    if keep < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    root = Path(root)
    versions = complete_versions(root)
    doomed = versions[: max(len(versions) - keep, 0)]
    for version, path in doomed:
        trash = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}del-v{version}-", dir=root))
        os.rename(path, trash / path.name)
        shutil.rmtree(trash)
    return [path for _, path in doomed]


def drop_versions_from(root: str | Path, first: int) -> list[Path]:
    """Delete the complete versions >= `first` (left by a run that went further and is now
    resumed from an earlier step: they will be published again) and every leftover temp
    directory (a publish that was killed); return the versions deleted. The publisher calls
    it before its first publish."""
    remove_stale_temps(root)
    root = Path(root)
    doomed = [(version, path) for version, path in complete_versions(root) if version >= first]
    for version, path in doomed:
        trash = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}del-v{version}-", dir=root))
        os.rename(path, trash / path.name)
        shutil.rmtree(trash)
    return [path for _, path in doomed]


def remove_stale_temps(root: str | Path) -> list[Path]:
    """Delete the `.tmp-*` directories under `root` (left by crashes); return them.

    Only the publisher should call it, when it is not writing: it would delete a version being
    written.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    stale = sorted(p for p in root.iterdir() if p.name.startswith(TEMP_PREFIX) and p.is_dir())
    for path in stale:
        shutil.rmtree(path)
    return stale


class CheckpointTransport:
    """`sync.method=checkpoint`: each version is written to `root/v<N>/` and that directory is
    the payload; the publisher goes on at once. Floating tensors are cast to `cast_to` as they
    are written; receivers check the manifest's digests when `verify`.

    The first publish of a publisher first clears what a killed publish or a run that went
    further left in `root` (a resumed run writes versions >= its first one again); every
    publish drops the versions beyond the newest `keep_versions` once the new one is announced
    (the Synchronizer, which keeps as many, then no longer hands out the dropped ones).
    """

    rendezvous: ClassVar[bool] = False

    def __init__(
        self,
        root: str | Path,
        bucket_bytes: int,
        keep_versions: int,
        verify: bool,
        cast_to: torch.dtype | None = None,
    ) -> None:
        self.root = Path(root)
        self.bucket_bytes = bucket_bytes
        self.keep_versions = keep_versions
        self.verify = verify
        self.cast_to = cast_to
        self._cleared = False

    @classmethod
    def from_settings(
        cls,
        settings: TransportSettings,
        side: Side,
        device: torch.device,
        cast_to: torch.dtype | None = None,
    ) -> CheckpointTransport:
        if not settings.checkpoint_dir:
            raise ValueError(
                "sync.checkpoint_dir must be set for sync.method=checkpoint: the directory of "
                "weight versions every node sees"
            )
        return cls(
            settings.checkpoint_dir,
            settings.bucket_mb << 20,
            settings.keep_versions,
            settings.verify_checksum,
            cast_to,
        )

    def publish(self, version: int, weights: Weights, announce: Announce) -> str:
        if not self._cleared:
            for dropped in drop_versions_from(self.root, version):
                logger.info("dropped %s: a resumed run publishes it again", dropped)
            self._cleared = True
        weights = cast_floating(weights, self.cast_to)
        written = str(write_version(self.root, version, weights, self.bucket_bytes))
        announce(written)
        prune_versions(self.root, self.keep_versions)
        return written

    def receive(self, version: int, payload: Any) -> Iterator[tuple[str, torch.Tensor]]:
        if not isinstance(payload, str | Path):
            raise TransportError(
                f"checkpoint transport, version {version}: the payload must be the version's "
                f"directory its publisher announced, got {type(payload).__name__}"
            )
        return read_version(payload, self.verify)

    def close(self) -> None:
        """Nothing to release: the versions stay for the next run to find (or clear)."""


def _stream_tensors(
    path: Path, manifest: dict[str, Any], verify: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    version = manifest["version"]
    handle: Any = None
    open_file: str | None = None
    for entry in manifest["tensors"]:
        file = path / entry["file"]
        if entry["file"] != open_file:
            handle, open_file = _open_shard(file), entry["file"]
        where = f"version {version}, {file}"
        try:
            tensor = handle.get_tensor(entry["name"])
        except (SafetensorError, OSError) as e:
            raise TransportError(f"cannot read tensor {entry['name']!r} from {file}: {e}") from e
        if list(tensor.shape) != entry["shape"] or dtype_name(tensor.dtype) != entry["dtype"]:
            raise TransportError(
                f"tensor {entry['name']!r} in {file} is {dtype_name(tensor.dtype)} "
                f"{list(tensor.shape)}, the manifest says {entry['dtype']} {entry['shape']}"
            )
        if verify:
            actual = tensor_digest(tensor)
            if actual != entry["checksum"]:
                raise TransportChecksumError(entry["name"], entry["checksum"], actual, where)
        yield entry["name"], tensor


def _write_files(tmp: Path, version: int, weights: Weights, bucket_bytes: int) -> dict[str, Any]:
    tensors: list[dict[str, Any]] = []
    files: list[str] = []
    seen: set[str] = set()
    for index, group in enumerate(group_by_size(weights, bucket_bytes)):
        file = f"shard-{index:05d}.safetensors"
        shard: dict[str, torch.Tensor] = {}
        storages: set[int] = set()
        for name, tensor in group:
            if name in seen:
                raise ValueError(f"tensor name {name!r} appears twice in the weight stream")
            seen.add(name)
            tensor = tensor.detach().contiguous()
            storage = tensor.untyped_storage().data_ptr()
            # safetensors refuses tensors that share memory in one file (tied weights).
            shard[name] = tensor.clone() if storage in storages else tensor
            storages.add(storage)
            tensors.append(
                {
                    "name": name,
                    "shape": list(tensor.shape),
                    "dtype": dtype_name(tensor.dtype),
                    "file": file,
                    "checksum": tensor_digest(tensor),
                }
            )
        save_file(shard, str(tmp / file))
        _fsync(tmp / file)
        files.append(file)
    return {"version": version, "tensors": tensors, "files": files}


def _write_json(file: Path, data: dict[str, Any]) -> None:
    with open(file, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _fsync(path: Path) -> None:
    """Flush a file's data, or a directory's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_complete(path: Path, version: int) -> bool:
    try:
        manifest = read_manifest(path)
    except TransportError:
        return False
    return manifest["version"] == version and all(
        isinstance(f, str) and (path / f).is_file() for f in manifest["files"]
    )


def _open_shard(file: Path) -> Any:
    try:
        return safe_open(str(file), framework="pt")
    except (SafetensorError, OSError) as e:
        raise TransportError(f"cannot open weight shard {file}: {e}") from e
