"""Entry point: `python -m hybrid.main [overrides]` (console script `hybrid-train`).

Hydra composes configs/config.yaml with the command-line overrides; the result is converted
once into the typed tree (hybrid.trainer.config) and validated before any worker starts.
"""

from __future__ import annotations

import logging
import time

import hydra
from omegaconf import DictConfig, OmegaConf

from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.grpo import GRPOTrainer
from hybrid.trainer.schema import from_dict


def build_config(cfg: DictConfig) -> TrainerRunConfig:
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    data.pop("hydra", None)
    config = from_dict(TrainerRunConfig, data)
    config.check_paths()
    return config


@hydra.main(version_base=None, config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = build_config(cfg)
    started = time.monotonic()
    trainer = GRPOTrainer(config)
    final = trainer.fit()
    rewards = trainer.reward_history
    window = min(10, len(rewards))
    print(
        f"[hybrid] {len(rewards)} steps in {time.monotonic() - started:.0f}s; mean reward of the "
        f"first {window} steps {sum(rewards[:window]) / max(window, 1):.3f}, of the last {window} "
        f"{sum(rewards[-window:]) / max(window, 1):.3f}; validation "
        f"{final.get('val/reward_mean', float('nan')):.3f}; outputs in {config.trainer.output_dir}"
    )


def cli() -> None:
    main()


if __name__ == "__main__":
    main()
