"""Run a function on a few gloo ranks on this machine (no Ray): `spawn_ranks(fn, out_dir, ...)`.

The ranks are forked from the suite's preloaded server (tests/forked.py): a fresh interpreter
per rank spent about 5 of its 8.6 s of CPU importing torch, transformers and our FSDP code (18
such processes in the default suite, 2026-12-03). Each rank takes the environment its parent
had at the call (a test may change it, e.g. to turn torch.compile on for its ranks).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh

from hybrid.ports import free_port
from tests.forked import forkserver

WORLD_SIZE = 2
SPAWN_TIMEOUT_S = 180


def _entry(
    rank: int,
    fn: Callable[..., dict[str, Any]],
    port: int,
    out_dir: Path,
    args: tuple,
    world: int,
    environ: dict[str, str],
) -> None:
    os.environ.clear()
    os.environ.update(environ)
    torch.set_num_threads(1)  # 2 ranks on 2 cores
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
        result = fn(rank, mesh, *args)
        written = out_dir / f"result_rank{rank}.pt.tmp"
        torch.save(result, written)
        written.rename(out_dir / f"result_rank{rank}.pt")  # whole, or not there
        # Leave together: a rank that tears gloo down while its peer is still inside the last
        # collective's teardown can take the peer down with std::terminate (a rare abort).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn_ranks(
    fn: Callable[..., dict[str, Any]], out_dir: Path, *args: Any, world: int = WORLD_SIZE
) -> list[dict[str, Any]]:
    """Run `fn(rank, mesh, *args)` on `world` (2) gloo ranks; return each rank's result."""
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    context = mp.start_processes(
        _entry,
        args=(fn, free_port("127.0.0.1"), out_dir, args, world, dict(os.environ)),
        nprocs=world,
        join=False,
        start_method=forkserver(fn.__module__),  # the ranks need not import it
    )
    results = [out_dir / f"result_rank{r}.pt" for r in range(world)]
    try:
        while not context.join(timeout=1):  # raises if a rank failed
            if time.monotonic() - start > SPAWN_TIMEOUT_S:
                raise TimeoutError(f"{fn.__name__} did not finish in {SPAWN_TIMEOUT_S} s")
    except mp.ProcessExitedException as error:
        # gloo's teardown can still abort a rank (std::terminate) after every rank wrote its
        # result: what the test checks is done then; any earlier failure is raised.
        if not all(path.is_file() for path in results):
            raise
        print(f"{fn.__name__}: a rank aborted in gloo's teardown after the results ({error})")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join()
    print(f"{fn.__name__}: {time.monotonic() - start:.1f} s on {world} ranks")
    return [torch.load(path, weights_only=False) for path in results]
