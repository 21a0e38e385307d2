"""The agent demo's tool and its tool-call parser (hybrid/data/agent_task.py).

`open_vault` returns the row's code: its keyword-only `code` is hidden from the model and bound
per row from extra_info.tools_kwargs.open_vault (verl's layout). The demo's model speaks a
16-token vocabulary with no room for Hermes JSON, so its turn calls the tool by containing "@"
(`VaultParser`, named by rollout.agent.tool_parser=examples/agent/vault_tools.py:VaultParser).
"""

from __future__ import annotations

from hybrid.rollout.agent.parsers import ParsedTurn
from hybrid.rollout.agent.tools import ToolCall

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "open_vault",
            "description": "Show the code of this prompt's vault.",
            "parameters": {"type": "object", "properties": {}, "required": []},
        },
    }
]


def open_vault(*, code: str) -> str:
    return code


class VaultParser:
    """A turn that contains "@" calls open_vault; any other turn is the answer."""

    def parse(self, text: str) -> ParsedTurn:
        calls = [ToolCall("open_vault", {})] if "@" in text else []
        return ParsedTurn(calls=calls, errors=[])
