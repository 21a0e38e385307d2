"""The engine owns its weight path: nothing outside hybrid/rollout/ reaches into an engine's
module or its weight internals, and the protocol exports none of them. Read from the source,
so a new caller that reaches past the protocol fails here, not on the next engine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hybrid.rollout.base import RolloutEngine

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[3] / "hybrid"

REACHES_IN = re.compile(r"engine\.(model|_module|llm|quantization|weight_layout)\b")
"""An engine's module, vLLM's LLM, or the layout facts the loaders used to sniff."""
INTERNAL_MODULES = re.compile(r"hybrid\.rollout\.(vllm_loader|direct_fit|checksum|vllm_compat)\b")
"""The engines' own weight machinery (errors and facts come through hybrid.rollout.base and
hybrid.rollout.weights)."""


def outside_rollout() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if "rollout" not in p.relative_to(PACKAGE).parts[:1]]


def is_import(line: str) -> bool:
    return line.lstrip().startswith(("from ", "import "))


def test_no_module_outside_rollout_reads_an_engines_internals() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
        for path in outside_rollout()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if REACHES_IN.search(line) or (is_import(line) and INTERNAL_MODULES.search(line))
    ]
    assert not found, "\n".join(found)


def test_the_scan_sees_real_files() -> None:
    files = outside_rollout()
    assert PACKAGE / "sharding" / "mode.py" in files
    assert not any(p.relative_to(PACKAGE).parts[0] == "rollout" for p in files)
    assert REACHES_IN.search("verify(self.engine.model, sums)")  # what 956db88 did
    assert INTERNAL_MODULES.search("from hybrid.rollout.vllm_compat import engine_supports_lora")


def test_the_protocol_exports_no_module_and_no_layout() -> None:
    members = set(vars(RolloutEngine))
    assert not members & {"model", "weight_layout", "quantization", "after_load"}
    assert {"configure_loads", "load_weights", "verify_weights", "weights_digest"} <= members
    assert {"stored_weights", "supports_lora", "describe_site", "check_kv_budget"} <= members
