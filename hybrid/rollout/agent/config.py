"""AgentConfig (`rollout.agent`): multi-turn rollouts with tools and environments.

Off while `enabled` is false. On, every rollout call (training, validation; every mode) runs
each prompt row as a trajectory: the model's turn, then its environment's reply appended as
tokens, until the environment says done or a budget ends it. Which environment a row gets is
its `extra_info.agent_name` (verl's layout), else `default_environment`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hybrid.validation import check_choice, check_positive, check_timeout

TEMPLATE_MISMATCH_RULES = ("keep_sampled", "error")


@dataclass(frozen=True)
class AgentConfig:
    enabled: bool = False
    tools_file: str | None = None
    """A Python file of tool functions and their OpenAI-style schemas (`TOOLS`, see
    hybrid/rollout/agent/tools.py and docs/agents.md)."""
    builtin_tools: list[str] = field(default_factory=list)
    """Built-in tools to offer besides the file's: calculator, python."""
    tool_parser: str = "hermes"
    """How a model turn's tool calls are read: hermes (`<tool_call>{json}</tool_call>`,
    Qwen2.5 / Hermes) or `path/to/file.py:name` (a parser class or factory of that file)."""
    environments: dict[str, str] | None = None
    """Extra environments by name: `path/to/file.py:name`, a class (or factory) taking the
    row's extra_info (hybrid/rollout/agent/environment.py). `tools` is always there."""
    default_environment: str = "tools"
    """The environment of rows whose extra_info names none."""
    max_turns: int = 4
    """Model turns per trajectory; a trajectory that would need more ends truncated."""
    max_turn_tokens: int | None = None
    """New tokens per model turn (None: what the trajectory's budget leaves). A turn cut here
    still goes to its environment (the template's end of turn is appended as context); a turn
    cut by the trajectory's budget or the context window ends the trajectory."""
    tool_timeout_s: float = 10.0
    """Each tool call's deadline: past it the model is told the call timed out."""
    max_tool_output_chars: int = 2000
    """A tool's output is cut to this many characters (the cut is marked in the message)."""
    env_timeout_s: float = 60.0
    """A whole environment reply's deadline (a tools turn runs its calls concurrently, each
    under tool_timeout_s): past it the trajectory ends as an error, counted."""
    template_mismatch: Literal["keep_sampled", "error"] = "keep_sampled"
    """When the chat template's whole rendering of a conversation differs from our
    incremental tokens (thinking templates that drop or re-format earlier reasoning):
    keep_sampled trains on exactly what the engine saw and says so at start-up; error refuses
    to start (hybrid/rollout/agent/chat.py)."""

    def __post_init__(self) -> None:
        check_positive(
            "rollout.agent",
            max_turns=self.max_turns,
            max_tool_output_chars=self.max_tool_output_chars,
        )
        if self.max_turn_tokens is not None:
            check_positive("rollout.agent", max_turn_tokens=self.max_turn_tokens)
        check_timeout("rollout.agent.tool_timeout_s", self.tool_timeout_s)
        check_timeout("rollout.agent.env_timeout_s", self.env_timeout_s)
        check_choice(
            "rollout.agent", "template_mismatch", self.template_mismatch, TEMPLATE_MISMATCH_RULES
        )
        for name in self.builtin_tools:
            check_choice("rollout.agent", "builtin_tools", name, ("calculator", "python"))
        if (
            self.enabled
            and self.default_environment == "tools"
            and not (self.tools_file or self.builtin_tools)
        ):
            raise ValueError(
                "rollout.agent.enabled with the tools environment needs rollout.agent.tools_file "
                "or rollout.agent.builtin_tools"
            )
