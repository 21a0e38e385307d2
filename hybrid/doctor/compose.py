"""The doctor's inputs: the composed config and the model shape to plan with.

`compose_config` composes configs/NAME.yaml with Hydra overrides exactly as `python -m
hybrid.main` does (same typed tree, same validation), without checking that the data files
exist (the doctor reports them instead): hybrid.trainer.compose, as the planner's CLI does.

The model shape (`choose_shape`), first that applies:
  1. --model: a preset of hybrid.memory.model_shape.known_presets() or a model directory;
  2. model.path, when it is a directory;
  3. the demo's tiny model, for a demo run that builds it on first use;
  4. a preset named by the last part of model.path, or else by the config's name: the
     preset's name lower-cased with `.` and `-` turned into `_`, followed by `_` or the end
     (qwen2_5_7b_gsm8k_8gpu -> Qwen2.5-7B; /models/Qwen2.5-7B-Instruct -> Qwen2.5-7B);
  5. none: the memory plan is skipped, naming the option to pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hybrid.doctor.facts import InputFacts
from hybrid.memory.model_shape import ModelShape, known_presets, model_shape
from hybrid.trainer.compose import CONFIG_DIR, compose, config_names, to_run_config

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

UNSET = "???"
DEMO_SHAPE = "tiny"


class InputError(ValueError):
    """Bad command-line input; the message names the option or the override."""


def compose_config(config_name: str, overrides: list[str]) -> TrainerRunConfig:
    """configs/NAME.yaml + overrides as the typed config; InputError names what is wrong."""
    if not (CONFIG_DIR / f"{config_name}.yaml").is_file():
        raise InputError(
            f"--config-name: no {config_name}.yaml in {CONFIG_DIR} (known: "
            f"{', '.join(config_names())})"
        )
    try:
        return to_run_config(compose(config_name, overrides))
    except Exception as error:  # Hydra's override errors and our ValueErrors alike
        raise InputError(f"config {config_name} with overrides {overrides}: {error}") from error


def _key(name: str) -> str:
    return re.sub(r"[.\-]", "_", name.lower())


def preset_for(name: str) -> str | None:
    """The preset `name` starts with (rule 4 of the module docstring), else None."""
    key = _key(name)
    for preset in sorted(known_presets(), key=len, reverse=True):
        wanted = _key(preset)
        if key == wanted or key.startswith(wanted + "_"):
            return preset
    return None


@dataclass(frozen=True)
class ShapeChoice:
    model: str | None
    """What to pass to model_shape (a preset or a directory); None: no shape."""
    source: str
    """How it was chosen, or why there is none."""
    from_flag: bool = False


def choose_shape(
    config: TrainerRunConfig, config_name: str, model: str | None, inputs: InputFacts
) -> ShapeChoice:
    path = config.model.path
    if model is not None:
        return ShapeChoice(model, "--model", from_flag=True)
    if path != UNSET and Path(path).is_dir():
        return ShapeChoice(path, "model.path")
    if str(Path(path)) in inputs.demo_built:
        return ShapeChoice(DEMO_SHAPE, "the demo's tiny model, built on first run")
    if path != UNSET and (preset := preset_for(Path(path).name)):
        return ShapeChoice(preset, f"matched from model.path {Path(path).name}")
    if preset := preset_for(config_name):
        return ShapeChoice(preset, f"matched from the config name {config_name}")
    return ShapeChoice(
        None,
        f"model.path is {'unset' if path == UNSET else 'not a directory'} and the config name "
        f"{config_name} names no preset",
    )


def load_shape(choice: ShapeChoice) -> tuple[ModelShape | None, str]:
    """(shape, its source or why none); a bad --model raises InputError."""
    if choice.model is None:
        return None, choice.source
    try:
        return model_shape(choice.model), choice.source
    except ValueError as error:
        if choice.from_flag:
            raise InputError(f"--model: {error}") from error
        return None, f"{choice.source}: {error}"


def critic_shape(config: TrainerRunConfig) -> ModelShape | None:
    """The critic's decoder when it has its own directory (else the planner uses the actor's)."""
    path = config.critic.model.path
    if not config.use_critic or path is None or not Path(path).is_dir():
        return None
    try:
        return model_shape(path)
    except ValueError:
        return None
