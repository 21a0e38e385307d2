"""What a verl-dialect run settles once Hydra has composed the config: steps from epochs over
the training file, the engine's context from the lengths, and the defaults that differ.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hybrid.verl.table import TABLE, Row
from hybrid.verl.translate import Translation, verl_schema


def apply(translation: Translation, cfg: DictConfig) -> list[str]:
    """Settle the composed config in place; the lines to show at start-up."""
    if not translation.dialect:
        return []
    lines = []
    if translation.epochs is not None:
        steps, rows, batch = steps_for_epochs(cfg, translation.epochs)
        cfg.trainer.total_steps = steps
        lines.append(
            f"trainer.total_epochs={translation.epochs}: trainer.total_steps={steps} "
            f"({translation.epochs} x {rows} training rows // data.train_batch_size {batch})"
        )
    for steps_field, ratio in translation.warmup_ratios.items():
        owner = cfg[steps_field.split(".")[0]].optim
        owner.lr_warmup_steps = int(ratio * int(cfg.trainer.total_steps))
        lines.append(
            f"{steps_field}={owner.lr_warmup_steps} ({ratio} x trainer.total_steps "
            f"{cfg.trainer.total_steps})"
        )
    if translation.fsdp_size is not None:
        lines.append(shard_groups(cfg, translation.fsdp_size))
    if translation.derive_max_model_len:
        total = int(cfg.rollout.prompt_length) + int(cfg.rollout.response_length)
        cfg.rollout.max_model_len = total
        lines.append(f"rollout.max_model_len={total} (prompt + response length, as verl's null)")
    differences = default_differences(translation, cfg)
    if differences:
        lines.append("verl's defaults that differ here (set the verl name to keep verl's):")
        lines.extend(f"  {line}" for line in differences)
    return lines


def steps_for_epochs(cfg: DictConfig, epochs: int) -> tuple[int, int, int]:
    """verl's steps per epoch: the whole batches in the training files (its loader drops
    the last partial one)."""
    files = list(cfg.data.train_files)
    if not files:
        raise ValueError("trainer.total_epochs needs data.train_files to count its steps")
    rows = sum(count_rows(Path(f)) for f in files)
    batch = int(cfg.data.train_batch_size)
    if rows < batch:
        raise ValueError(
            f"trainer.total_epochs: data.train_files hold {rows} rows, fewer than one "
            f"data.train_batch_size ({batch})"
        )
    return epochs * (rows // batch), rows, batch


def shard_groups(cfg: DictConfig, fsdp_size: int) -> str:
    """actor.hsdp_replicas from verl's fsdp_size: the training workers in groups of it."""
    t = cfg.trainer
    workers = int(t.num_workers if t.mode == "colocated" else t.num_trainer_workers)
    if workers % fsdp_size:
        raise ValueError(
            f"actor_rollout_ref.actor.fsdp_config.fsdp_size={fsdp_size} must divide the "
            f"training workers ({workers})"
        )
    cfg.actor.hsdp_replicas = workers // fsdp_size
    return (
        f"actor.hsdp_replicas={workers // fsdp_size} (fsdp_size {fsdp_size}: {workers} "
        "training workers in shard groups of that many)"
    )


def count_rows(path: Path) -> int:
    """Rows of a parquet file (from its footer) or a jsonl file."""
    if not path.exists():
        raise ValueError(f"data.train_files: {path} does not exist")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    with path.open() as lines:
        return sum(1 for line in lines if line.strip())


def default_differences(translation: Translation, cfg: DictConfig) -> list[str]:
    """The mapped verl names the command line left unset whose verl default is not the
    value this run has."""
    schema = verl_schema()
    composed = OmegaConf.to_container(cfg, resolve=True)
    set_here = {line.partition("=")[0].lstrip("+") for line in translation.overrides}
    lines = []
    for name, entry in TABLE.items():
        if not isinstance(entry, Row) or not entry.ours or name in translation.set_names:
            continue
        if set_here & set(entry.ours) or not _feature_on(name, composed):
            continue
        default = _default(schema.get(name))
        if default is _UNKNOWN or default is None:  # verl's null: derived from other fields
            continue
        if entry.ours[0].endswith(INPUT_SUFFIXES):  # a placeholder input, no default
            continue
        try:
            verl_value = entry.convert(default)
        except ValueError:
            continue
        ours = entry.ours[0]
        here = _get(composed, ours)
        if not _same(verl_value, here):
            lines.append(f"{name}: verl {default!r}, here {here!r} ({ours})")
    return lines


_UNKNOWN = object()
INPUT_SUFFIXES = ("path", "_dir", "_file", "_files")
"""Our fields that name a run's inputs and outputs: verl's defaults there are examples."""

FEATURE_GATES = {
    "async_training.": "trainer.mode",
    "reward_model.overlong_buffer.": "reward.overlong_buffer.enable",
    "reward_model.reward_kwargs.": "reward.overlong_buffer.enable",
    "actor_rollout_ref.rollout.multi_turn.": "rollout.agent.enabled",
    "reward_model.": "reward.model.path",
    "critic.": "algorithm.adv_estimator",
}
"""verl names whose defaults matter only when a feature is on (the field that turns it on)."""


def _feature_on(name: str, composed: Any) -> bool:
    for prefix, switch in FEATURE_GATES.items():
        if name.startswith(prefix):
            value = _get(composed, switch)
            if switch == "trainer.mode":
                return bool(value == "fully_async")
            if switch == "algorithm.adv_estimator":
                return bool(value == "gae")
            return bool(value) and value is not _UNKNOWN
    return True


def _default(text: str | None) -> Any:
    if text is None or "${" in text or text == '"???"':
        return _UNKNOWN
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return _UNKNOWN


def _get(tree: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _UNKNOWN
        tree = tree[part]
    return tree


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    return bool(a == b)
