"""The workers that generate for an evaluation: a group of explorer workers (the engine-only
member of split training, hybrid/explorer/worker.py) on Ray, each with an in-process vLLM
engine that reads the model directory from disk.

The group is the controller's (RayResourcePool, RayWorkerGroup): one worker per CPU slot or
GPU, `tensor_parallel_size` of them per engine; a generation call splits its prompts across
the workers (Dispatch.DP_COMPUTE) and gets every row back in order, n adjacent samples per
prompt. Engine arguments come from training's code (hybrid/rollout/engine_args.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from hybrid.controller import (
    Deadlines,
    GroupFuture,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ensure_ray,
)
from hybrid.data import Batch
from hybrid.evaluation.config import EvalConfig
from hybrid.explorer.worker import ExplorerWorker
from hybrid.rollout.base import Sampling
from hybrid.rollout.config import RolloutConfig
from hybrid.workers.config import HybridWorkerConfig, ModelConfig


class EvalWorkers:
    """Started by the constructor (engines built); `close` shuts the engines, then the group."""

    def __init__(self, config: EvalConfig, model_path: str, log_dir: Path | None) -> None:
        self.config = config
        self.model_path = str(Path(model_path).resolve())
        try:
            ensure_ray(config.ray_address, quiet=log_dir is not None)
        except ConnectionError as error:
            raise ValueError(f"ray_address={config.ray_address!r}: {error}") from None
        worker_config = HybridWorkerConfig(
            model=ModelConfig(path=self.model_path),
            rollout=config.rollout_config(),
        )
        self.group = RayWorkerGroup(
            RayResourcePool([config.workers], use_gpu=config.use_gpu, name_prefix="hybrid_eval"),
            RayClassWithInitArgs(ExplorerWorker, worker_config),
            ray_address=config.ray_address,
            log_dir=log_dir,
            deadlines=Deadlines(config.stall_timeout_s),
            progress_dir=None if log_dir is None else log_dir / "progress",
        )
        try:
            self.group.init_engine()
            described = self.group.describe()[0]  # rank 0 speaks for every worker
            self.facts: dict[str, Any] = {
                "hardware": described["hardware"],
                "dtype": described["rollout_dtype"],
            }
        except BaseException:
            self.group.shutdown()
            raise

    def check_serves(self, config: EvalConfig, model_path: str) -> None:
        """These engines can generate what `config` asks for: the same model and engine
        settings (how to sample is each call's own)."""
        mine, theirs = engine_settings(self.config), engine_settings(config)
        if str(Path(model_path).resolve()) != self.model_path or mine != theirs:
            raise ValueError(
                f"these workers run {self.model_path} with {mine}; the evaluation asks for "
                f"{model_path} with {theirs}"
            )

    def submit(self, prompts: Batch, sampling: Sampling) -> GroupFuture:
        """Start generating for `prompts` (left-padded rows with their columns); the future
        gives a Batch of sampling.n rows per prompt, in prompt order."""
        return self.group.generate_sequences.submit(prompts, sampling)

    def close(self) -> None:
        """vLLM goes before its process group; the workers are killed either way."""
        try:
            if not self.group.stalled:
                self.group.shutdown_engine()
        finally:
            self.group.shutdown()


def engine_settings(config: EvalConfig) -> RolloutConfig:
    """The engine's part of `config`: its rollout settings without the sampling."""
    return replace(config.rollout_config(), n=1, temperature=0.0, top_p=1.0)
