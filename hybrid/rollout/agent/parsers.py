"""Tool-call parsers: a model turn's text -> the tool calls it makes (rollout.agent.tool_parser).

A parser is anything with `parse(text) -> ParsedTurn`. Built in: `hermes` (Qwen2.5, Hermes and
the many models trained on their format). Others come from a file, `path/to/file.py:name`, where
`name` is a parser class or a factory taking no arguments.

A call block that cannot be read (bad JSON, no name, arguments that are not an object, a block
never closed) is an error of the turn, one message per block, shown to the model; the blocks
around it still run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from hybrid.rollout.agent.tools import ToolCall
from hybrid.userfiles import import_python_file

FIELD = "rollout.agent.tool_parser"
_SNIPPET_CHARS = 200


@dataclass(frozen=True)
class ParsedTurn:
    calls: list[ToolCall]
    errors: list[str]
    """One message per malformed call block (bad JSON, no name, arguments not an object)."""


class ToolCallParser(Protocol):
    def parse(self, text: str) -> ParsedTurn: ...


class HermesParser:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number per turn;
    `arguments` may also be a JSON string holding the object (some models write that)."""

    OPEN = "<tool_call>"
    CLOSE = "</tool_call>"

    def parse(self, text: str) -> ParsedTurn:
        calls: list[ToolCall] = []
        errors: list[str] = []
        position = 0
        while (start := text.find(self.OPEN, position)) != -1:
            body_start = start + len(self.OPEN)
            end = text.find(self.CLOSE, body_start)
            if end == -1:
                errors.append(f"{self.OPEN} block never closed with {self.CLOSE}")
                break
            position = end + len(self.CLOSE)
            call = read_call(text[body_start:end])
            if isinstance(call, ToolCall):
                calls.append(call)
            else:
                errors.append(call)
        return ParsedTurn(calls=calls, errors=errors)


def read_call(body: str) -> ToolCall | str:
    """One block's JSON {"name", "arguments"} as a call, or the message saying what is wrong."""
    snippet = body.strip()[:_SNIPPET_CHARS]
    try:
        data = json.loads(body)
    except json.JSONDecodeError as error:
        return f"tool call is not valid JSON ({error.msg} at char {error.pos}): {snippet!r}"
    if not isinstance(data, dict):
        return f"tool call must be a JSON object with name and arguments: {snippet!r}"
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return f"tool call has no name: {snippet!r}"
    arguments: Any = data.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            return f"tool call {name}: arguments are not valid JSON ({error.msg}): {snippet!r}"
    if arguments is None:
        arguments = {}  # a tool without parameters
    if not isinstance(arguments, dict):
        return f"tool call {name}: arguments must be a JSON object, got {type(arguments).__name__}"
    return ToolCall(name=name, arguments=arguments)


PARSERS: dict[str, type] = {"hermes": HermesParser}


def load_parser(spec: str) -> ToolCallParser:
    """`hermes`, or `path/to/file.py:name` (a parser class or zero-argument factory there)."""
    if spec in PARSERS:
        parser: ToolCallParser = PARSERS[spec]()
        return parser
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(
            f"{FIELD} {spec!r} is neither a built-in parser ({sorted(PARSERS)}) nor "
            "'path/to/file.py:name'"
        )
    module = import_python_file(path, "hybrid_tool_parser", f"{FIELD} file")
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ValueError(f"{FIELD}: {path} defines no parser class or factory {name!r}")
    try:
        made: Any = factory()
    except Exception as error:
        raise ValueError(f"{FIELD}: {spec} raised when made with no arguments: {error}") from error
    if not callable(getattr(made, "parse", None)):
        raise ValueError(f"{FIELD}: {spec} made a {type(made).__name__}, which has no parse(text)")
    return made
