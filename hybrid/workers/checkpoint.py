"""Sharded training checkpoints: model, optimizer, per-rank RNG state and a small `extra` dict.

Owns `save_checkpoint` / `load_checkpoint`. Model and optimizer state go through
`torch.distributed.checkpoint` (DCP) as *sharded* state dicts: every rank writes and reads
only its own shards, no rank ever gathers the full model, and DCP reshards on load if the
world size changed. Each rank's RNG state (torch CPU, CUDA if present, Python `random`,
NumPy) is saved next to it in `rng_rank{r}.pt` so that a resumed run draws the same random
numbers as the uninterrupted one; rank 0 saves `extra` (e.g. the step) in `extra.pt`.

Layout of a checkpoint directory:

    <path>/            .metadata and __*_*.distcp (DCP), rng_rank{r}.pt, extra.pt

Atomicity: everything is written into `<path>.tmp`, all ranks meet at a barrier, and only
then rank 0 renames it to `<path>`; a crash while writing leaves any previous checkpoint at
`<path>` intact and at most a stale `.tmp` directory (removed by the next save). All ranks
must see the same filesystem.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

EXTRA_FILE = "extra.pt"
_MODEL_KEY = "model"
_OPTIM_KEY = "optimizer"


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write a sharded checkpoint of `model` (and `optimizer`) to the directory `path`.

    Collective: every rank calls it with the same `path`. An existing checkpoint at `path`
    is replaced only once the new one is complete.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    rank = _rank()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()

    dcp.save(_sharded_state(model, optimizer), checkpoint_id=tmp)
    torch.save(_rng_state(), tmp / _rng_file(rank))
    if rank == 0:
        torch.save(dict(extra or {}), tmp / EXTRA_FILE)
    _barrier()

    if rank == 0:
        # Directories cannot be replaced atomically: move the old one aside first, so that
        # `path` is never a mix of two checkpoints.
        old = path.with_name(path.name + ".old")
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    _barrier()


def load_checkpoint(
    path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> dict[str, Any]:
    """Restore `model`, `optimizer` and this rank's RNG state from `path`; return its `extra`.

    Collective: every rank calls it. Raises FileNotFoundError if `path` (or this rank's RNG
    file) does not exist.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    rng_path = path / _rng_file(_rank())
    if not rng_path.is_file():
        saved = sorted(p.name for p in path.glob("rng_rank*.pt"))
        raise FileNotFoundError(
            f"checkpoint {path} has no RNG state {rng_path.name} for this rank "
            f"(it holds {saved}: saved with a different world size?)"
        )

    state = _sharded_state(model, optimizer)
    dcp.load(state, checkpoint_id=path)
    if optimizer is None:
        set_model_state_dict(model, state[_MODEL_KEY])
    else:
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state[_MODEL_KEY],
            optim_state_dict=state[_OPTIM_KEY],
        )
    # Our own files, written by `save_checkpoint`: full unpickling is expected here.
    _set_rng_state(torch.load(rng_path, weights_only=False))
    extra: dict[str, Any] = torch.load(path / EXTRA_FILE, weights_only=False)
    return extra


def _sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    if optimizer is None:
        return {_MODEL_KEY: get_model_state_dict(model)}
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {_MODEL_KEY: model_sd, _OPTIM_KEY: optim_sd}


def _rng_state() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def _rng_file(rank: int) -> str:
    return f"rng_rank{rank}.pt"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
