"""What the rollout tests' child processes share: each builds a VllmEngine of its own (vLLM runs
in a child process for the reason given in tests/integration/models/test_tiny_model_vllm.py).

The parent starts the child with `engine_child_env()`; the child script calls
`start_single_rank_world()` before it builds the engine.
"""

from __future__ import annotations

import os

from hybrid.ports import free_port

DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""torch.distributed's variables: the child sets its own."""


def engine_child_env() -> dict[str, str]:
    """This process's environment without torch.distributed's variables, with the engine in
    the child's own process."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


def start_single_rank_world() -> None:
    """A one-rank gloo world on a free local port, as the engine's external launcher expects."""
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port("127.0.0.1")),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
    )
    dist.init_process_group("gloo")
