"""The files a run reads, checked before any worker starts: the model directory (its
config.json, tokenizer, the features its family runs with), the teacher's, the data files, the
custom reward, the judge's template.

Not part of the config's `__post_init__` (hybrid.trainer.config): the memory planner and the
doctor read a run's config on a machine without its data. `TrainerRunConfig.check_paths()`
runs `check_paths` here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hybrid.model_families import check_expert_count, check_family, is_vision, num_experts
from hybrid.models import TOKENIZER_FILES, has_tokenizer
from hybrid.rewards.judge import load_template
from hybrid.trainer.config import MODEL_PATH_UNSET, TrainerRunConfig
from hybrid.trainer.config_derived import use_critic
from hybrid.workers.config import ActorConfig


def check_paths(config: TrainerRunConfig) -> None:
    """The files a run reads exist, and the model directories hold what the run needs; the
    first problem raises ValueError naming its field."""
    if config.model.path == MODEL_PATH_UNSET:
        raise ValueError(
            "model.path is not set: pass model.path=DIR, a Hugging Face model directory "
            "(the examples/run_*.sh scripts set it)"
        )
    model_config = check_model_dir("model.path", config.model.path)
    if model_config is not None:
        where = f"model.path ({config.model.path})"
        check_moe_fields(config.actor, model_config, where)
        if config.actor.sp_size > 1:
            check_sequence_parallel_model(model_config, config.actor.sp_size, where)
        if is_vision(model_config):
            check_vision_run(config, Path(config.model.path), where)
    if config.distill.teacher_path is not None:
        teacher = check_model_dir("distill.teacher_path", config.distill.teacher_path)
        if teacher is not None and num_experts(teacher) and config.actor.ep_size > 1:
            where = f"distill.teacher_path ({config.distill.teacher_path})"
            check_expert_count(num_experts(teacher), config.actor.ep_size, where)
    for name in ("train_files", "val_files"):
        for path in getattr(config.data, name):
            if not Path(path).exists():
                raise ValueError(f"data.{name}: {path} does not exist")
    for path in config.sft.train_files:
        if not Path(path).exists():
            raise ValueError(f"sft.train_files: {path} does not exist")
    reward = config.reward
    if reward.custom_path is not None and not Path(reward.custom_path).exists():
        raise ValueError(f"reward.custom_path: {reward.custom_path} does not exist")
    if reward.judge.template_path is not None:  # its placeholders, before any worker
        load_template(reward.judge.template_path)


def check_vision_run(config: TrainerRunConfig, model_dir: Path, where: str) -> None:
    """What a vision-language model needs, and the features it does not run with yet,
    each named before any worker starts."""
    if not (model_dir / IMAGE_PROCESSOR_FILE).is_file():
        raise ValueError(
            f"{where} is a vision-language model without an image processor "
            f"({IMAGE_PROCESSOR_FILE}): save the model's processor beside it"
        )
    sp = config.actor.sp_size
    refused = {
        "rollout.engine=toy (text-only; use vllm)": config.rollout.engine == "toy",
        f"actor.sp_size={sp} (sequence parallelism)": sp > 1,
        "algorithm.adv_estimator=gae (a critic: value heads are text-only here)": (
            use_critic(config)
        ),
        "rollout.agent.enabled (agent turns carry no images yet)": config.rollout.agent.enabled,
    }
    named = [name for name, on in refused.items() if on]
    if named:
        raise ValueError(
            f"{where} is a vision-language model, which does not run with: " + "; ".join(named)
        )


def check_moe_fields(actor: ActorConfig, model_config: dict[str, Any], where: str) -> None:
    """The actor's mixture-of-experts fields need routers in the model; expert parallelism
    needs an expert count it divides."""
    experts = num_experts(model_config)
    if experts and actor.ep_size > 1:
        check_expert_count(experts, actor.ep_size, where)
    if experts:
        return
    asked = [
        name
        for name, value in (
            ("actor.router_replay", actor.router_replay != "off"),
            ("actor.moe_aux_loss_coef", actor.moe_aux_loss_coef > 0),
            ("actor.ep_size", actor.ep_size > 1),
        )
        if value
    ]
    if asked:
        raise ValueError(
            f"{', '.join(asked)}: {where} is a dense model (model type "
            f"{model_config.get('model_type')!r}, no experts), so there is no router to replay "
            "to replay, balance or place by expert"
        )


IMAGE_PROCESSOR_FILE = "preprocessor_config.json"
"""A vision-language model directory's image processor settings."""


def check_sequence_parallel_model(model_config: dict[str, Any], sp: int, where: str) -> None:
    """Ulysses splits attention heads over the sp ranks (hybrid.workers.ulysses's rule), and
    the MoE routing records are not split yet."""
    from hybrid.workers.ulysses import check_head_rule

    if num_experts(model_config):
        raise ValueError(
            f"actor.sp_size ({sp}): {where} is a mixture of experts, which sequence "
            "parallelism does not run yet"
        )
    q_heads = int(model_config["num_attention_heads"])
    kv_heads = int(model_config.get("num_key_value_heads") or q_heads)
    try:
        check_head_rule(q_heads, kv_heads, sp)
    except ValueError as error:
        raise ValueError(f"actor.sp_size ({sp}) for {where}: {error}") from None


def check_model_dir(field_name: str, path: str) -> dict[str, Any] | None:
    """A local model directory has the files a run loads from it (a path that is no local
    directory may be a Hub id, left to transformers); its config.json, None for a Hub id."""
    directory = Path(path)
    if not directory.is_dir():
        if directory.is_absolute() or path.startswith("."):
            raise ValueError(f"{field_name}: {path} does not exist")
        return None
    if not (directory / "config.json").is_file():
        listed = sorted(p.name for p in directory.iterdir())[:8]
        raise ValueError(
            f"{field_name}: {path} has no config.json, so it is no Hugging Face model directory "
            f"(it holds {listed or 'nothing'})"
        )
    config_file = directory / "config.json"
    try:
        model_config = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{field_name}: {config_file} is not valid JSON ({e})") from None
    check_family(model_config, f"{field_name} ({config_file})")
    if not has_tokenizer(directory):
        raise ValueError(
            f"{field_name}: {path} has no tokenizer files (one of {list(TOKENIZER_FILES)}); "
            f"save the tokenizer beside the model"
        )
    return model_config
