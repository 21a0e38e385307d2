"""configs/NAME.yaml + Hydra overrides -> the typed config, the way `python -m hybrid.main`
composes it. Shared by the entry point, the doctor and the planner's CLI (profiling/plan.py),
which must read a config exactly as a run would; nothing here checks that files exist.

The defaults live in the dataclasses only: `register_schema` stores every field of the typed
tree at its default as Hydra's config `schema` (model.path unset), and configs/config.yaml
starts from it (`defaults: [schema, inputs: demo, ...]`), so the YAML carries only what a run
changes while every field still takes a `key=value` override without Hydra's `+`. The GPU
presets drop the demo's inputs (configs/inputs/demo.yaml), so their model.path stays unset:
OmegaConf keeps a value that a preset's `???` is merged onto, so `model.path: ???` in a preset
could not undo the demo's path. The node is plain data,
not a structured config (OmegaConf cannot hold our `Literal`s and frozen classes): types and
unknown keys are checked once, by the strict `from_dict` of the composed result.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hybrid.trainer.config import MODEL_PATH_UNSET, TrainerRunConfig
from hybrid.trainer.schema import from_dict
from hybrid.workers.config import ModelConfig

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
SCHEMA_NODE = "schema"
"""The name configs/config.yaml's defaults list gives the registered schema."""


def schema_defaults() -> dict[str, Any]:
    """Every field of TrainerRunConfig at its dataclass default, section by section (the
    sections' own checks run; the cross-field ones do not: the schema alone is no run, e.g.
    rollout.n=1 does not suit GRPO), with model.path unset."""
    sections: dict[str, Any] = {}
    for section in dataclasses.fields(TrainerRunConfig):
        if section.name == "model":
            value: Any = ModelConfig(path=MODEL_PATH_UNSET)
        else:
            assert section.default_factory is not dataclasses.MISSING, section.name
            value = section.default_factory()
        sections[section.name] = dataclasses.asdict(value)
    return sections


def register_schema() -> None:
    """Store the schema in Hydra's ConfigStore (again: the same node) before Hydra composes:
    every entry that composes configs/ calls it (hybrid.main at import, `compose` here)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NODE, node=schema_defaults())


def config_names() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def compose(config_name: str, overrides: list[str]) -> DictConfig:
    """configs/NAME.yaml with Hydra overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_schema()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose(config_name=config_name, overrides=overrides)


GROUPED_FIELDS = {
    "optim": {
        "actor": ("lr", "weight_decay", "betas", "eps", "max_grad_norm"),
        "critic": ("lr", "lr_warmup_steps", "weight_decay", "betas", "eps", "max_grad_norm"),
    },
    "precision": {
        "actor": ("param_dtype", "reduce_dtype", "master_dtype"),
        "critic": ("param_dtype", "reduce_dtype", "master_dtype"),
        "ref": ("param_dtype",),
    },
    "offload": {
        "actor": ("param_offload", "optimizer_offload"),
        "critic": ("param_offload", "optimizer_offload"),
        "ref": ("param_offload",),
    },
}
"""Fields that moved from their owner into a shared group (actor.lr -> actor.optim.lr)."""

REPLACED_KEYS = {
    ("trainer", "placement"): "trainer.mode=colocated|split|fully_async",
    ("fully_async", "enable"): "trainer.mode=fully_async",
    **{
        (owner, name): f"{owner}.{group}.{name}"
        for group, owners in GROUPED_FIELDS.items()
        for owner, names in owners.items()
        for name in names
    },
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
