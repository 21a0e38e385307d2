"""Environments: what answers a model's turn in a multi-turn trajectory.

The interface is two calls. An environment is made per trajectory from its prompt row's
`extra_info` (a dict; {} when the row has none), and then, after each model turn,

    reply(turn_text) -> EnvReply(messages, done, reward)

`messages` are chat messages (role "tool" or "user", with "content") the chat template renders
into the tokens appended after the turn (hybrid.rollout.agent.chat); `done` ends the trajectory
(its last turn was the answer); `reward` is the reward for the turn just taken, if the
environment gives one (it lands on that turn's last token; hybrid.data.sample). `reply` runs in a
thread of its own while the engine keeps stepping the other trajectories, under
rollout.agent.env_timeout_s; it may block (a tool, a simulator, a remote service), and what it
raises ends the trajectory with the error counted, never the run.

Built in: `tools` (ToolEnvironment): the model's turn is parsed for tool calls (a pluggable
parser, Hermes by default); each call runs with its own deadline and output budget, all calls of
a turn at once; every result, error or timeout comes back as a tool message. A turn with no tool
call is the answer: done. Other environments come from the config, `name: path.py:factory`, and
a row picks one by `extra_info.agent_name` (verl's key); the row's `extra_info.tools_kwargs`
(verl's layout) binds the tools' hidden parameters.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from hybrid.rollout.agent.builtin_tools import builtin_tools
from hybrid.rollout.agent.config import AgentConfig
from hybrid.rollout.agent.parsers import ToolCallParser, load_parser
from hybrid.rollout.agent.tools import (
    Tool,
    ToolCall,
    ToolResult,
    call_tool,
    load_tools,
    row_tool_kwargs,
    tool_schemas,
)
from hybrid.userfiles import import_python_file

AGENT_NAME_KEY = "agent_name"


@dataclass(frozen=True)
class EnvReply:
    messages: list[dict[str, Any]]
    """What the model is shown next (empty when done)."""
    done: bool = False
    reward: float | None = None
    """The environment's reward for the turn just taken (None: it gives none)."""
    tool_results: list[ToolResult] = field(default_factory=list)
    """The tool calls this reply ran (the tools environment; for the metrics)."""
    malformed_calls: int = 0
    """Tool-call blocks of the turn that could not be read (bad JSON, no name)."""


class Environment(Protocol):
    def reply(self, turn_text: str) -> EnvReply: ...


EnvironmentFactory = Callable[[dict[str, Any]], Environment]


class ToolEnvironment:
    """Tool calls in, tool messages out; a turn without a call is the answer."""

    def __init__(
        self,
        tools: Mapping[str, Tool],
        parser: ToolCallParser,
        row_kwargs: Mapping[str, dict[str, Any]],
        timeout_s: float,
        max_output_chars: int,
    ) -> None:
        self.tools = tools
        self.parser = parser
        self.row_kwargs = row_kwargs
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars

    def reply(self, turn_text: str) -> EnvReply:
        parsed = self.parser.parse(turn_text)
        if not parsed.calls and not parsed.errors:
            return EnvReply(messages=[], done=True)
        results = self._run_all(parsed.calls)
        messages = [{"role": "tool", "name": r.name, "content": r.content} for r in results]
        messages += [{"role": "tool", "content": f"error: {error}"} for error in parsed.errors]
        return EnvReply(messages, tool_results=results, malformed_calls=len(parsed.errors))

    def _run_all(self, calls: list[ToolCall]) -> list[ToolResult]:
        """Every call of the turn at once (each under its own deadline), results in call order."""
        if len(calls) == 1:
            return [self._call(calls[0])]
        results: list[ToolResult | None] = [None] * len(calls)

        def run(i: int) -> None:
            results[i] = self._call(calls[i])

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()  # call_tool returns by its deadline
        return [result for result in results if result is not None]

    def _call(self, call: ToolCall) -> ToolResult:
        return call_tool(self.tools, call, self.row_kwargs, self.timeout_s, self.max_output_chars)


def load_factory(spec: str, field_name: str) -> EnvironmentFactory:
    """`path/to/file.py:name` -> that file's environment class or factory."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(f"{field_name}: expected 'path/to/file.py:name', got {spec!r}")
    module = import_python_file(path, "hybrid_env", f"{field_name}: environment file")
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ValueError(f"{field_name}: {path} defines no callable {name!r}")
    return cast(EnvironmentFactory, factory)


class Environments:
    """The run's environments by name, and the trajectory-level choice among them."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.tools: dict[str, Tool] = {}
        if config.tools_file:
            self.tools.update(load_tools(config.tools_file))
        available = builtin_tools()
        for name in config.builtin_tools:
            if name in self.tools:
                raise ValueError(
                    f"rollout.agent.builtin_tools: {name!r} is also defined in {config.tools_file}"
                )
            self.tools[name] = available[name]
        self.parser = load_parser(config.tool_parser)
        self.factories: dict[str, EnvironmentFactory] = {
            name: load_factory(spec, f"rollout.agent.environments.{name}")
            for name, spec in (config.environments or {}).items()
        }
        if "tools" in self.factories:
            raise ValueError(
                "rollout.agent.environments: 'tools' is the built-in environment's name"
            )
        known = ["tools", *self.factories]
        if config.default_environment not in known:
            raise ValueError(
                f"rollout.agent.default_environment {config.default_environment!r} is not one of "
                f"{known}"
            )

    def names(self) -> list[str]:
        return ["tools", *self.factories]

    def check_row(self, extra_info: Any, row: str) -> str:
        """The environment a prompt row asks for; an unknown one, or tools_kwargs naming an
        unknown tool, raises naming the row (at admission, before any generation)."""
        info = extra_info if isinstance(extra_info, dict) else {}
        name = info.get(AGENT_NAME_KEY) or self.config.default_environment
        if name not in self.names():
            raise ValueError(
                f"prompt {row}: extra_info.{AGENT_NAME_KEY} {name!r} is not an environment of "
                f"this run ({self.names()}; rollout.agent.environments adds one)"
            )
        if name == "tools":
            row_tool_kwargs(info, self.tools, row)
        return str(name)

    def make(self, extra_info: Any, row: str) -> Environment:
        info = extra_info if isinstance(extra_info, dict) else {}
        name = self.check_row(info, row)
        if name == "tools":
            c = self.config
            return ToolEnvironment(
                self.tools,
                self.parser,
                row_tool_kwargs(info, self.tools, row),
                c.tool_timeout_s,
                c.max_tool_output_chars,
            )
        return self.factories[name](dict(info))

    def schemas(self) -> list[dict[str, Any]]:
        """The tools' schemas, for the prompt's chat template."""
        return tool_schemas(self.tools)
