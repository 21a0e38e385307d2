"""`python -m hybrid.main ... --explain`: the translation and the resolved config, printed
without starting anything (no worker, no demo assets, no file checks)."""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import OmegaConf

from hybrid.verl.resolve import apply
from hybrid.verl.translate import Translation


def explain(translation: Translation, config_name: str = "config") -> list[str]:
    from hybrid.trainer.compose import compose, to_run_config

    lines = []
    if translation.dialect:
        lines.append("verl's names, translated:")
        lines.extend(f"  {verl} -> {ours}" for verl, ours in translation.mapped)
    else:
        lines.append("no verl names: the overrides are ours")
    cfg = compose(config_name, translation.overrides)
    settled = apply(translation, cfg)
    if settled:
        lines.append("settled on the composed config:")
        lines.extend(f"  {line}" for line in settled)
    config = to_run_config(cfg)  # every field's type and every rule checked
    lines.append(f"the resolved config (configs/{config_name}.yaml and the overrides):")
    resolved = OmegaConf.to_yaml(OmegaConf.create(_plain(dataclasses.asdict(config))))
    lines.extend(resolved.rstrip().splitlines())
    return lines


def _plain(value: Any) -> Any:
    """Tuples as lists: OmegaConf holds lists."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value
