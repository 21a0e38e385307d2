"""The driver's shape, read from the source: composed, not inherited. No class of the trainer
package extends another of ours there, the loop lives in one file, and every worker that
generates holds the one RolloutHost (nothing outside hybrid/rollout/ builds an engine)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[3] / "hybrid"


def classes(folder: Path) -> dict[str, list[str]]:
    """Class name -> the names of its bases, for every class under `folder`."""
    found: dict[str, list[str]] = {}
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found[f"{path.relative_to(PACKAGE)}:{node.name}"] = [
                    base.id if isinstance(base, ast.Name) else ast.unparse(base)
                    for base in node.bases
                ]
    return found


def test_no_trainer_class_extends_another_of_the_trainer_package() -> None:
    trainer = classes(PACKAGE / "trainer")
    ours = {name.split(":")[1] for name in trainer}
    inherited = {name: bases for name, bases in trainer.items() if set(bases) & ours}
    assert not inherited, inherited


def test_one_loop_file_runs_every_mode() -> None:
    """The step loop (`while self.step < ...`) exists once, in hybrid/trainer/loop.py."""
    loops = [
        path.relative_to(PACKAGE).as_posix()
        for path in (PACKAGE / "trainer").rglob("*.py")
        if "while self.step <" in path.read_text()
    ]
    assert loops == ["trainer/loop.py"], loops


def test_every_generating_worker_holds_the_rollout_host() -> None:
    for module in ("workers/actor_rollout.py", "explorer/worker.py"):
        assert "RolloutHost(" in (PACKAGE / module).read_text(), module
    builders = [
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "VllmEngine(" in path.read_text() and path.parent.name != "rollout"
    ]
    assert not builders, builders
