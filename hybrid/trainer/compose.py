"""configs/NAME.yaml + Hydra overrides -> the typed config, the way `python -m hybrid.main`
composes it. Shared by the entry point, the doctor and the planner's CLI (profiling/plan.py),
which must read a config exactly as a run would; nothing here checks that files exist."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.schema import from_dict

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def config_names() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def compose(config_name: str, overrides: list[str]) -> DictConfig:
    """configs/NAME.yaml with Hydra overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose(config_name=config_name, overrides=overrides)


REPLACED_KEYS = {
    ("trainer", "placement"): "trainer.mode=colocated|split|fully_async",
    ("fully_async", "enable"): "trainer.mode=fully_async",
}
"""Keys of earlier releases and what replaces them (named in the error, not silently mapped)."""


def check_replaced_keys(data: dict) -> None:
    for (group, key), instead in REPLACED_KEYS.items():
        section = data.get(group)
        if isinstance(section, dict) and key in section:
            raise ValueError(f"{group}.{key} was replaced: set {instead} instead")


def to_run_config(cfg: DictConfig) -> TrainerRunConfig:
    """The typed, validated config tree of a composed config."""
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    data.pop("hydra", None)
    check_replaced_keys(data)
    return from_dict(TrainerRunConfig, data)
