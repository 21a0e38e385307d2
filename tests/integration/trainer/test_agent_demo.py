"""The agent demo as a user runs it (`python -m hybrid.main --config-name agent_demo`, from a
directory where nothing exists): the tiny model learns to call the vault tool and repeat its
code, and the control run without the tool stays near 0. About 3 minutes: `make test-full`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.integration.trainer.helpers import read_metrics, run_entry_point

pytestmark = [pytest.mark.integration, pytest.mark.full, pytest.mark.timeout(900)]

EXAMPLES = REPO_ROOT / "examples" / "agent"
# The demo names its tool, parser and reward files relative to the checkout it runs from.
FILES = (
    f"rollout.agent.tools_file={EXAMPLES / 'vault_tools.py'}",
    f"rollout.agent.tool_parser={EXAMPLES / 'vault_tools.py'}:VaultParser",
    f"reward.custom_path={EXAMPLES / 'vault_reward.py'}",
)


def last_ten(metrics: list[dict], key: str) -> float:
    rows = [m[key] for m in metrics if key in m][-10:]
    return sum(rows) / len(rows)


def test_the_agent_demo_learns_to_use_its_tool_and_the_control_cannot(tmp_path: Path) -> None:
    done = run_entry_point(tmp_path, "--config-name", "agent_demo", *FILES, timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = read_metrics(tmp_path / "outputs" / "agent_demo" / "run")
    metrics = [m for m in rows if "reward/mean" in m]  # validation before training: step 0
    assert [m["step"] for m in metrics] == list(range(1, 301))
    first = sum(m["reward/mean"] for m in metrics[:10]) / 10
    assert first < 0.15, first
    assert last_ten(metrics, "reward/mean") >= 0.8
    assert last_ten(metrics, "agent/tool_call_rate") >= 0.9
    assert metrics[0]["agent/tool_call_rate"] < 0.5  # the rate rose with the reward

    control = run_entry_point(
        tmp_path, "--config-name", "agent_demo", *FILES, "rollout.agent.enabled=false",
        "trainer.output_dir=control", timeout=420,
    )  # fmt: skip
    assert control.returncode == 0, control.stdout[-3000:] + control.stderr[-3000:]
    assert last_ten(read_metrics(tmp_path / "control"), "reward/mean") < 0.05
