"""The package's dependency arrows point one way (docs/architecture.md, "Import arrows"): read
every module's imports (typing-only and function-local imports included, they are arrows too
for a reader) and check the rules that keep the layers apart."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "hybrid"

LAYERS = frozenset(p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.glob("*.py")))
"""The subpackages of hybrid."""

# layer -> layers of ours it must never import
FORBIDDEN = {
    "sharding": {"workers", "trainer", "controller"},
    "rollout": {"workers", "trainer", "sharding", "controller"},
    "controller": {"workers", "trainer", "models", "sharding", "rollout"},
    "algorithms": {"workers", "trainer", "sharding", "rollout", "controller", "rewards"},
    "data": {"workers", "trainer", "sharding", "rollout", "controller", "rewards", "algorithms"},
    "rewards": {"workers", "trainer", "sharding", "rollout", "controller", "algorithms"},
    "workers": {"trainer", "explorer", "synchronizer", "buffer"},
    # The runtime memory ledger: workers, the sync and the engine import it every step, so it
    # knows none of them and no config above it (the offline planner is hybrid.planner).
    "memory": {
        "workers",
        "trainer",
        "controller",
        "sharding",
        "rollout",
        "explorer",
        "synchronizer",
        "buffer",
        "transport",
        "planner",
        "doctor",
    },
    # The doctor runs the planner; the planner never asks the doctor.
    "planner": {"doctor"},
    # The sandbox runs untrusted programs for rewards and tools: it knows nothing of ours.
    "sandbox": LAYERS - {"sandbox"},
    # The decoupled modes' seams (docs/architecture.md, "Import arrows").
    "transport": {
        "workers",
        "trainer",
        "controller",
        "sharding",
        "rollout",
        "models",
        "explorer",
        "synchronizer",
        "buffer",
        "data",
        "memory",
    },
    "synchronizer": {
        "workers",
        "trainer",
        "controller",
        "sharding",
        "rollout",
        "models",
        "explorer",
        "transport",
        "buffer",
        "data",
        "memory",
    },
    "buffer": {
        "workers",
        "trainer",
        "controller",
        "sharding",
        "rollout",
        "models",
        "explorer",
        "transport",
        "synchronizer",
        "memory",
    },
    "explorer": {"trainer", "synchronizer"},
}
# Only the top floor may import the trainer: the entry point main.py, the doctor (it composes
# and judges a run's config before anything starts) and the offline planner (it reads the run
# config).
TRAINER_IMPORTERS = {"main.py", "trainer", "planner", "doctor", "verl", "verl_compat.py", "eval.py"}
"""The top floor: the entry points (training, evaluation, verl's names) and the tools that
read a run's config as the entry point composes it."""
# The planner sits on the same floor: what runs a step (workers, rollout, sharding, memory ...)
# must not depend on the tool that predicts it.
PLANNER_IMPORTERS = {"main.py", "trainer", "planner", "doctor"}


def layer_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0]


def imported_layers(path: Path) -> set[str]:
    layers = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "hybrid" and len(parts) > 1:
                layers.add(parts[1])
    return layers


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_layer_imports_only_downstream() -> None:
    wrong = [
        f"{path.relative_to(PACKAGE)} imports hybrid.{target}"
        for path in modules()
        for target in imported_layers(path) & FORBIDDEN.get(layer_of(path), set())
    ]
    assert not wrong, wrong


def test_nothing_but_the_entry_point_imports_the_trainer() -> None:
    wrong = [
        str(path.relative_to(PACKAGE))
        for path in modules()
        if "trainer" in imported_layers(path) and layer_of(path) not in TRAINER_IMPORTERS
    ]
    assert not wrong, wrong


def test_nothing_below_the_top_floor_imports_the_planner() -> None:
    wrong = [
        str(path.relative_to(PACKAGE))
        for path in modules()
        if "planner" in imported_layers(path) and layer_of(path) not in PLANNER_IMPORTERS
    ]
    assert not wrong, wrong


def test_the_rules_see_real_imports() -> None:
    # A check that reads nothing passes vacuously: the sync does import the engine.
    assert "rollout" in imported_layers(PACKAGE / "sharding" / "mode.py")
    assert "sharding" in imported_layers(PACKAGE / "workers" / "actor_rollout.py")
    assert "transport" in imported_layers(PACKAGE / "explorer" / "worker.py")
    # ... and the planner's arrows: down to the run config (typing-only), up from the doctor.
    assert "trainer" in imported_layers(PACKAGE / "planner" / "plan.py")
    assert "planner" in imported_layers(PACKAGE / "doctor" / "diagnose.py")
