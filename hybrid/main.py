"""Entry point: `python -m hybrid.main [overrides]` (console script `hybrid-train`).

Hydra composes configs/config.yaml with the command-line overrides; the result is converted
once into the typed tree (hybrid.trainer.config) and validated before any worker starts.
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig, OmegaConf

from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.grpo import GRPOTrainer
from hybrid.trainer.schema import from_dict


def build_config(cfg: DictConfig) -> TrainerRunConfig:
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    data.pop("hydra", None)
    return from_dict(TrainerRunConfig, data)


@hydra.main(version_base=None, config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = build_config(cfg)
    final = GRPOTrainer(config).fit()
    summary = {
        k: round(v, 4)
        for k, v in final.items()
        if k.startswith(("reward/", "val/", "timing_s/step"))
    }
    print(f"[hybrid] finished {config.trainer.total_steps} steps; last step: {summary}")


def cli() -> None:
    main()


if __name__ == "__main__":
    main()
