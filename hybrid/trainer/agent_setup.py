"""The driver's start-up checks of an agent run (rollout.agent.enabled), before any worker
starts: the tools and environments load, every prompt row names an environment and tool
arguments this run has, the chat template renders replies exactly (or the run says how it
differs and follows rollout.agent.template_mismatch), and the budgets leave room for a reply
and a further turn. Each problem is one error naming the field, file or row.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from hybrid.data import PromptDataset
from hybrid.rollout.agent.chat import ReplyRenderer, TemplateCheck
from hybrid.rollout.agent.environment import Environments
from hybrid.rollout.config import RolloutConfig
from hybrid.sandbox import network_isolation_error

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentSetup:
    environments: Environments
    schemas: list[dict[str, Any]]
    """The tools' schemas: the prompts' chat template lists them."""
    template: TemplateCheck

    @property
    def metrics(self) -> dict[str, float]:
        """Logged every step: whether the incremental tokens equal the whole rendering."""
        return {"agent/template_exact": float(self.template.status == "exact")}


def prepare_agent(rollout: RolloutConfig, tokenizer: Any) -> AgentSetup | None:
    """Load and check what an agent run needs (None when rollout.agent is off)."""
    config = rollout.agent
    if not config.enabled:
        return None
    environments = Environments(config)
    if "python" in config.builtin_tools:
        why = network_isolation_error()
        if why is not None:  # else every python call of the run would fail, one by one
            raise ValueError(f"rollout.agent.builtin_tools: the python tool cannot run here: {why}")
    schemas = environments.schemas()
    renderer = ReplyRenderer(tokenizer, schemas or None)
    check = renderer.check()
    if check.status != "exact":
        kind = "a thinking template" if check.thinking else "the template"
        message = (
            f"rollout.agent: {kind} renders a whole conversation differently from the "
            f"incremental tokens ({check.detail})"
        )
        if config.template_mismatch == "error":
            raise ValueError(f"{message}; rollout.agent.template_mismatch=error refuses to start")
        logger.warning(
            "%s; training on exactly the sampled tokens (rollout.agent.template_mismatch="
            "keep_sampled, docs/agents.md)",
            message,
        )
    reply = len(renderer.reply_tokens([{"role": "tool", "content": ""}]))
    if config.max_turns > 1 and rollout.response_length < reply + 2:
        raise ValueError(
            f"rollout.response_length={rollout.response_length} cannot hold a turn, an empty "
            f"tool reply ({reply} tokens of template) and a further turn; raise it or set "
            "rollout.agent.max_turns=1"
        )
    return AgentSetup(environments, schemas, check)


def check_agent_rows(setup: AgentSetup, *datasets: PromptDataset | None) -> None:
    """Every row's environment and tool arguments exist (the error names file:row)."""
    for dataset in datasets:
        if dataset is None:
            continue
        for row in dataset.rows:
            setup.environments.check_row(row.extra_info, row.source)
