"""What moving one model's weights from a trainer process to an explorer costs at the least,
per medium: the floors `bench_split.py` holds each weight transport against.

Every floor is the same three steps on the same bytes, with nothing of ours in between (no
buckets of many tensors, no metadata, no checksums, no engine):
  1. "gather": cast the fp32 weights into the engine dtype, into memory allocated beforehand
     (with one process per side there is nothing to all-gather: this is the gather's floor),
  2. move those bytes through the medium, as one flat buffer,
  3. copy them into destination tensors allocated beforehand (the engine's parameters).
  memcpy      2 is nothing: one process, shared memory (the floor under every medium)
  memory      2 is `ray.put` + `ray.get` of the flat buffer (the object store; the previous
              version is still alive while the next is put, as with the transport)
  nccl        2 is one broadcast of the flat buffer in a two-process gloo / NCCL group
  checkpoint  2 is `save_file` + fsync of the tensors in the given directory, then reading
              them back (page cache, as an explorer on the same machine reads them)
Each returns the median seconds of `repeats` rounds.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import ray
import torch
import torch.multiprocessing as mp
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from hybrid.ports import free_port
from hybrid.transport.collective import BroadcastGroup

Weights = list[tuple[str, torch.Tensor]]


def read_model_weights(model_dir: Path) -> Weights:
    weights: dict[str, torch.Tensor] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        weights.update(load_file(str(file)))
    return list(weights.items())


def _median_time(round_: Callable[[], None], repeats: int, pause_s: float = 0.0) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        round_()
        times.append(time.perf_counter() - started)
        time.sleep(pause_s)
    return statistics.median(times)


class _Sides:
    """Preallocated memory of both sides: the cast tensors (views into one flat buffer) and
    the destination tensors."""

    def __init__(self, weights: Weights, dtype: torch.dtype) -> None:
        self.weights = weights
        total = sum(t.numel() for _, t in weights)
        self.flat = torch.empty(total, dtype=dtype)
        self.cast = self._views(self.flat)
        self.destination = [torch.empty(t.shape, dtype=dtype) for _, t in weights]

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        views, offset = [], 0
        for _, tensor in self.weights:
            views.append(flat[offset : offset + tensor.numel()].view(tensor.shape))
            offset += tensor.numel()
        return views

    def gather(self) -> None:
        for view, (_, tensor) in zip(self.cast, self.weights, strict=True):
            view.copy_(tensor)

    def receive(self, flat: torch.Tensor) -> None:
        for target, source in zip(self.destination, self._views(flat), strict=True):
            target.copy_(source)

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()


def memcpy_floor(weights: Weights, dtype: torch.dtype, repeats: int = 5) -> tuple[float, int]:
    """(seconds, bytes): cast into the staging memory and copy into the destination."""
    sides = _Sides(weights, dtype)

    def round_() -> None:
        sides.gather()
        sides.receive(sides.flat)

    return _median_time(round_, repeats), sides.nbytes


def memory_floor(weights: Weights, dtype: torch.dtype, repeats: int = 5) -> float:
    """Cast, `ray.put` the flat bytes, `ray.get` them, copy out; starts and stops a local Ray
    of one CPU (a Ray already running in this process is shut down first)."""
    sides = _Sides(weights, dtype)
    if ray.is_initialized():  # left by a training run in this process: start a bare one
        ray.shutdown()
    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
    try:
        alive: list[ray.ObjectRef] = []

        def round_() -> None:
            sides.gather()
            alive.append(ray.put(sides.flat.view(torch.uint8).numpy()))
            # The object store hands back read-only pages; only read from them.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                received = torch.from_numpy(ray.get(alive[-1])).view(dtype)
            sides.receive(received)
            del received
            if len(alive) > 1:  # the previous version lives until the next is out
                alive.pop(0)

        # The pause lets the object store free the dropped version, as a training step does.
        return _median_time(round_, repeats + 1, pause_s=0.5)
    finally:
        ray.shutdown()


def checkpoint_floor(
    weights: Weights, dtype: torch.dtype, directory: Path, repeats: int = 5
) -> float:
    """Cast, write one safetensors file and fsync it, read it back, copy out."""
    sides = _Sides(weights, dtype)
    directory.mkdir(parents=True, exist_ok=True)
    names = [name for name, _ in weights]

    def round_() -> None:
        sides.gather()
        file = Path(tempfile.mkdtemp(dir=directory)) / "weights.safetensors"
        save_file(dict(zip(names, sides.cast, strict=True)), str(file))
        descriptor = os.open(file, os.O_RDONLY)
        os.fsync(descriptor)
        os.close(descriptor)
        with safe_open(str(file), framework="pt") as reader:
            for target, name in zip(sides.destination, names, strict=True):
                target.copy_(reader.get_tensor(name))
        file.unlink()
        file.parent.rmdir()

    return _median_time(round_, repeats)


def nccl_floor(model_dir: Path, dtype: torch.dtype, repeats: int = 5) -> float:
    """Cast on a sender process, broadcast the flat bytes to a receiver process (gloo on CPU),
    copy out there; timed on the receiver from a common start."""
    port = free_port("127.0.0.1")
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_broadcast_side, args=(port, str(model_dir), dtype, repeats, results), nprocs=2)
    seconds: float = results.get()
    return seconds


def _broadcast_side(
    rank: int, port: int, model_dir: str, dtype: torch.dtype, repeats: int, results: object
) -> None:
    torch.set_num_threads(1)
    sides = _Sides(read_model_weights(Path(model_dir)), dtype)
    group = BroadcastGroup("127.0.0.1", port, rank, 2, timeout_s=300)
    start = torch.zeros(1)
    times = []
    try:
        for _ in range(repeats):
            group._broadcast(start)  # both sides begin together
            started = time.perf_counter()
            if rank == 0:
                sides.gather()
                group._broadcast(sides.flat.view(torch.uint8))
            else:
                group._broadcast(sides.flat.view(torch.uint8))
                sides.receive(sides.flat)
            times.append(time.perf_counter() - started)
    finally:
        group.close()
    if rank == 1:
        results.put(statistics.median(times))  # type: ignore[attr-defined]
