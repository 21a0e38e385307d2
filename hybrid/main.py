"""Entry point: `python -m hybrid.main [overrides]` (console script `hybrid-train`).

Hydra composes configs/config.yaml with the command-line overrides; the result is converted
once into the typed tree (hybrid.trainer.config) and validated before any worker starts.
With the default model and data paths missing (a fresh checkout), the demo's tiny model and
arithmetic task are built first (hybrid/trainer/demo_assets.py).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.demo_assets import build_missing_demo_assets, demo_notice
from hybrid.trainer.grpo import GRPOTrainer
from hybrid.trainer.schema import from_dict


def build_config(cfg: DictConfig) -> TrainerRunConfig:
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    data.pop("hydra", None)
    config = from_dict(TrainerRunConfig, data)
    # A fresh checkout has no outputs/demo: the default run builds its own model and data.
    built = build_missing_demo_assets(config)
    if built:
        print(demo_notice(built), flush=True)
    config.check_paths()
    return config


# Absolute: Hydra resolves a relative config_path as a package (`pkg://configs`) when the
# caller is imported rather than run as a file, which the console script hybrid-train does.
CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")


@hydra.main(version_base=None, config_path=CONFIG_DIR, config_name="config")
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
