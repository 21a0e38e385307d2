"""Every field of the typed config tree is listed in configs/config.yaml, so `key=value` on the
command line sets it without Hydra's `+`; an override of each one reaches the typed config."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator
from typing import Any, get_args, get_origin, get_type_hints

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.demo_assets import DEMO_MODEL_PATH, DEMO_TRAIN_FILE, DEMO_VAL_FILE
from hybrid.trainer.schema import from_dict
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.unit

CONFIG_DIR = REPO_ROOT / "configs"
# Schema fields the YAML must not set: the trainer derives them (and rejects a set value).
DERIVED = {"actor.mini_batch_size", "actor.decoupled_cap", "critic.mini_batch_size"}
# Overrides that are only valid together with others (the rest take a generic new value).
COMPANIONS: dict[str, tuple[str, ...]] = {
    "model.lora.alpha": ("model.lora.rank=8",),
    "model.lora.dropout": ("model.lora.rank=8",),
    "model.lora.target_modules": ("model.lora.rank=8",),
    "trainer.memory_snapshot_step": ("trainer.use_gpu=true",),
    "trainer.nnodes": ("trainer.num_workers=4",),
    "trainer.critic_warmup": ("algorithm.adv_estimator=gae",),
}
# New values where the generic one breaks a cross-field rule (divisibility, lengths).
VALUES: dict[str, Any] = {
    "algorithm.ppo_mini_batch_size": 8,
    "data.max_prompt_length": 8,
    "model.lora.target_modules": ("q_proj", "v_proj"),
    "model.path": "some/model",
    "trainer.n_gpus_per_node": 2,
    "trainer.nnodes": 2,
}
_ABSENT = object()


def leaves(cls: type, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, type hint) of every non-dataclass field under `cls`, recursively."""
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            yield from leaves(hints[f.name], f"{path}.")
        else:
            yield path, hints[f.name]


def schema_default(path: str) -> Any:
    """The dataclass default of a leaf (MISSING for a required field)."""
    cls: Any = TrainerRunConfig
    *parents, name = path.split(".")
    for parent in parents:
        cls = get_type_hints(cls)[parent]
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


LEAVES = dict(leaves(TrainerRunConfig))
DEFAULTS = {path: schema_default(path) for path in LEAVES}


def compose_config(name: str = "config", overrides: tuple[str, ...] = ()) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(name, overrides=list(overrides))


def to_typed(cfg: DictConfig) -> TrainerRunConfig:
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    data.pop("hydra", None)
    return from_dict(TrainerRunConfig, data)


def get_path(obj: Any, path: str) -> Any:
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def new_value(path: str, hint: Any, current: Any) -> Any:
    """A valid value other than `current` for a field of type `hint`."""
    if path in VALUES:
        return VALUES[path]
    options = [o for o in get_args(hint) if o is not type(None)]
    if get_origin(hint) in (typing.Union, types.UnionType):
        if current is None:  # e.g. int | None: a value of the first option
            return new_value(path, options[0], None)
        hint = options[0]
    if get_origin(hint) is typing.Literal:
        return next((o for o in get_args(hint) if o != current), current)  # one choice: itself
    if hint is bool:
        return not current
    if hint is int:
        return 1 if current is None or current <= 0 else current * 2
    if hint is float:
        return 0.5 if current is None or current == 0 else current / 2
    if hint is str:
        return f"{current or 'x'}-other"
    if get_origin(hint) is list:
        return ["jsonl"] if path == "trainer.loggers" else ["other.parquet"]
    if get_origin(hint) is tuple:
        return tuple(round(v * 0.9, 4) for v in current)
    raise AssertionError(f"{path}: no new value for {hint}")


def as_override_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ",".join(as_override_value(v) for v in value) + "]"
    return str(value)


def test_the_walk_sees_every_section_and_the_new_fields() -> None:
    sections = {path.split(".")[0] for path in LEAVES}
    assert sections == {f.name for f in dataclasses.fields(TrainerRunConfig)}
    for path in ("actor.param_dtype", "actor.weight_decay", "model.lora.rank",
                 "rollout.dtype", "trainer.max_checkpoints_to_keep"):  # fmt: skip
        assert path in LEAVES


def test_every_schema_field_is_in_the_default_yaml() -> None:
    cfg = compose_config()
    missing = [
        path
        for path in LEAVES
        if path not in DERIVED and OmegaConf.select(cfg, path, default=_ABSENT) is _ABSENT
    ]
    assert not missing, f"add these to configs/config.yaml (else they need `+`): {missing}"
    derived = [p for p in DERIVED if OmegaConf.select(cfg, p, default=_ABSENT) is not _ABSENT]
    assert not derived, derived


def test_the_yaml_lists_the_schema_defaults_where_the_demo_keeps_them() -> None:
    """Fields the demo does not tune show the schema's default (the YAML must not drift)."""
    config = to_typed(compose_config())
    tuned = {  # the demo's own choices (tiny model, CPU, small batches)
        "model.path", "actor.lr", "actor.micro_batch_size", "ref.micro_batch_size",
        "rollout.max_model_len", "rollout.prompt_length", "rollout.response_length",
        "rollout.n", "rollout.kv_cache_memory_bytes", "data.train_files", "data.val_files",
        "data.max_prompt_length", "trainer.total_steps", "trainer.output_dir",
        "trainer.test_freq", "trainer.val_before_train", "critic.lr", "critic.micro_batch_size",
    }  # fmt: skip
    drifted = [
        path for path in LEAVES if path not in tuned and get_path(config, path) != DEFAULTS[path]
    ]
    assert not drifted, drifted
    assert config.model.path == DEMO_MODEL_PATH
    assert config.data.train_files == [DEMO_TRAIN_FILE]
    assert config.data.val_files == [DEMO_VAL_FILE]


@pytest.mark.parametrize("path", sorted(set(LEAVES) - DERIVED))
def test_each_field_overrides_without_a_plus(path: str) -> None:
    current = get_path(to_typed(compose_config()), path)
    value = new_value(path, LEAVES[path], current)
    assert value != current or get_args(LEAVES[path]) == (current,)
    overrides = (*COMPANIONS.get(path, ()), f"{path}={as_override_value(value)}")
    config = to_typed(compose_config(overrides=overrides))
    got = get_path(config, path)
    assert (tuple(got) if isinstance(got, list) else got) == (
        tuple(value) if isinstance(value, list) else value
    )


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
def test_every_config_in_configs_composes_into_the_typed_tree(name: str) -> None:
    cfg = compose_config(name, ("model.path=some/model",))
    config = to_typed(cfg)
    assert config.model.path == "some/model"
    missing = [
        p
        for p in LEAVES
        if p not in DERIVED and OmegaConf.select(cfg, p, default=_ABSENT) is _ABSENT
    ]
    assert not missing, missing


def test_the_derived_micro_batch_is_rejected_when_set() -> None:
    derived = r"actor\.mini_batch_size .*algorithm\.ppo_mini_batch_size"
    with pytest.raises(ValueError, match=derived):
        to_typed(compose_config(overrides=("+actor.mini_batch_size=4",)))


def test_max_checkpoints_to_keep_is_validated() -> None:
    assert to_typed(compose_config()).trainer.max_checkpoints_to_keep is None
    with pytest.raises(ValueError, match=r"trainer\.max_checkpoints_to_keep must be >= 1"):
        to_typed(compose_config(overrides=("trainer.max_checkpoints_to_keep=0",)))
