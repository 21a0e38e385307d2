"""Tools a model may call in an agent rollout: loading them from a file, binding a row's hidden
arguments, and running one call under a deadline and an output budget.

Tool file (rollout.agent.tools_file): a Python file, loaded from its path (not an installed
module), that defines `TOOLS`, a list of OpenAI-style schemas, one per tool:

    TOOLS = [{"type": "function", "function": {
        "name": "lookup",                      # names a function of this file
        "description": "Look a word up.",
        "parameters": {"type": "object",
                       "properties": {"word": {"type": "string"}},
                       "required": ["word"]}}}]

    def lookup(word: str, *, dictionary: str = "en") -> str: ...

The schema must match its function: every property is a parameter the model may pass by name
(or the function takes **kwargs), every `required` name is a property, and every parameter the
model passes (before `*`) without a default is a property. Parameters after `*` (keyword-only)
are hidden: the model never sees them and the schema must not list them; their values come from
the prompt row, `extra_info["tools_kwargs"][tool_name]`, either the kwargs themselves or verl's
`{"create_kwargs": {...}, "execute_kwargs": {...}}` (both are bound; verl's other keys have no
meaning here). A None value there counts as unset: a Parquet struct column gives every row every
key. A hidden parameter without a default must get a value from every row. Each problem is one
error naming the file and the tool, or the row.

A call (`call_tool`) never raises and returns by its deadline. The function runs in a daemon
thread; past the deadline the model is told it timed out and the thread is abandoned, still
running (Python cannot stop a thread): a tool whose work must be killed at its deadline does that
work in a subprocess with its own limit, as the built-in python tool does (hybrid.sandbox). A
return value other than a string is shown as JSON. Output past the budget is cut and marked.
"""

from __future__ import annotations

import inspect
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hybrid.userfiles import import_python_file, one_line

ToolErrorKind = Literal["timeout", "error", "bad_json", "unknown_tool", "bad_arguments"]
TOOL_ERROR_KINDS: tuple[str, ...] = (
    "timeout",
    "error",
    "bad_json",
    "unknown_tool",
    "bad_arguments",
)
"""How a call can fail; bad_json is the parser's (a call block that could not be read)."""

TOOLS_KWARGS_KEY = "tools_kwargs"
VERL_BOUND_KEYS = ("create_kwargs", "execute_kwargs")
"""The parts of verl's per-tool layout whose kwargs bind hidden parameters here."""
VERL_KEYS = (*VERL_BOUND_KEYS, "calc_reward_kwargs", "release_kwargs")

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "object": (dict,),
    "array": (list,),
}


@dataclass(frozen=True)
class Tool:
    name: str
    function: Callable[..., Any]
    schema: dict[str, Any]
    """OpenAI style: {"type": "function", "function": {"name", "description", "parameters"}}."""
    hidden: tuple[str, ...] = ()
    """The function's keyword-only parameters: not in the schema, bound per row from data."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolResult:
    name: str
    content: str
    """Exactly what the model is shown, error text included."""
    error: str | None
    """None, or one of TOOL_ERROR_KINDS."""
    seconds: float
    """Wall time of the call."""
    truncated: bool
    """The output was cut to the output budget."""


def load_tools(path: str | Path) -> dict[str, Tool]:
    """The tools of a tool file (see the module docstring), by name."""
    module = import_python_file(path, "hybrid_tools", "tool file")
    schemas = getattr(module, "TOOLS", None)
    if not isinstance(schemas, list | tuple):
        raise ValueError(f"tool file {path} defines no TOOLS list of schemas")
    tools: dict[str, Tool] = {}
    for index, schema in enumerate(schemas):
        name = _schema_name(schema, f"tool file {path}: TOOLS[{index}]")
        if name in tools:
            raise ValueError(f"tool file {path}: tool {name!r} is defined twice in TOOLS")
        function = getattr(module, name, None)
        if not callable(function):
            found = "nothing" if function is None else f"a {type(function).__name__}"
            raise ValueError(
                f"tool file {path}: tool {name!r} names {found}, not a function of the file"
            )
        tools[name] = make_tool(schema, function, f"tool file {path}: tool {name!r}")
    return tools


def make_tool(schema: Any, function: Callable[..., Any], where: str) -> Tool:
    """A Tool from its schema and function, after checking that they match (errors start with
    `where`, which names the file and the tool)."""
    name = _schema_name(schema, where)
    parameters = schema["function"].get("parameters")
    if not isinstance(parameters, Mapping) or parameters.get("type") != "object":
        raise ValueError(f"{where}: function.parameters must be a JSON schema of type 'object'")
    properties = parameters.get("properties", {})
    if not isinstance(properties, Mapping) or not all(
        isinstance(spec, Mapping) for spec in properties.values()
    ):
        raise ValueError(f"{where}: parameters.properties must map names to JSON schemas")
    required = parameters.get("required", [])
    if not isinstance(required, list | tuple) or not all(isinstance(r, str) for r in required):
        raise ValueError(f"{where}: parameters.required must be a list of names")
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: cannot read the function's signature ({error})") from None
    _check_match(signature, properties, required, where)
    hidden = tuple(
        p.name for p in signature.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
    )
    return Tool(name=name, function=function, schema=dict(schema), hidden=hidden)


def _schema_name(schema: Any, where: str) -> str:
    if not isinstance(schema, Mapping) or schema.get("type") != "function":
        raise ValueError(f'{where}: a schema must be {{"type": "function", "function": {{...}}}}')
    function = schema.get("function")
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: the schema has no function.name")
    return name


def _check_match(
    signature: inspect.Signature, properties: Mapping[str, Any], required: Any, where: str
) -> None:
    params = signature.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for prop in properties:
        param = params.get(prop)
        if param is not None and param.kind is inspect.Parameter.KEYWORD_ONLY:
            raise ValueError(
                f"{where}: {prop!r} is a hidden (keyword-only) parameter, bound from the row's "
                f"extra_info.{TOOLS_KWARGS_KEY}; the schema must not list it"
            )
        passable = param is not None and param.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        if not passable and not (param is None and takes_any):
            raise ValueError(
                f"{where}: schema property {prop!r} is not a parameter the function takes by name"
            )
    for name in required:
        if name not in properties:
            raise ValueError(
                f"{where}: required parameter {name!r} is not one of the schema's properties"
            )
    for param in params.values():
        if (
            param.kind
            in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            and param.default is inspect.Parameter.empty
            and param.name not in properties
        ):
            raise ValueError(
                f"{where}: function parameter {param.name!r} has no default and is not in the "
                "schema's properties (make it keyword-only, after `*`, to bind it from the row)"
            )


def tool_schemas(tools: Mapping[str, Tool]) -> list[dict[str, Any]]:
    """The schemas in name order, for the chat template's `tools=`."""
    return [tools[name].schema for name in sorted(tools)]


def row_tool_kwargs(
    extra_info: Mapping[str, Any] | None, tools: Mapping[str, Tool], row: str
) -> dict[str, dict[str, Any]]:
    """{tool name: the hidden kwargs this row binds} for every tool; raises naming `row` when
    the row names a tool there is not, sets what is not a hidden parameter, or leaves one
    without a default unset."""
    given = (extra_info or {}).get(TOOLS_KWARGS_KEY)
    if given is None:
        given = {}
    where = f"prompt {row}: extra_info.{TOOLS_KWARGS_KEY}"
    if not isinstance(given, Mapping):
        raise ValueError(f"{where} must map tool names to kwargs, got a {type(given).__name__}")
    for name, entry in given.items():
        if entry is not None and name not in tools:
            raise ValueError(
                f"{where} names tool {name!r}, which this run lacks (tools: {sorted(tools)})"
            )
    return {
        name: _bound_kwargs(tool, given.get(name), f"{where}.{name}")
        for name, tool in tools.items()
    }


def _bound_kwargs(tool: Tool, entry: Any, where: str) -> dict[str, Any]:
    if entry is None:
        entry = {}
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be a mapping of kwargs, got a {type(entry).__name__}")
    if "create_kwargs" in entry and "create_kwargs" not in tool.hidden:
        unknown = sorted(str(key) for key in entry if key not in VERL_KEYS)
        if unknown:
            raise ValueError(f"{where} mixes verl's layout with other keys {unknown}")
        kwargs: dict[str, Any] = {}
        for key in VERL_BOUND_KEYS:
            part = entry.get(key) or {}
            if not isinstance(part, Mapping):
                raise ValueError(f"{where}.{key} must be a mapping, got a {type(part).__name__}")
            kwargs.update(part)
    else:
        kwargs = dict(entry)
    kwargs = {key: value for key, value in kwargs.items() if value is not None}
    params = inspect.signature(tool.function).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    visible = tool.schema["function"]["parameters"].get("properties", {})
    for key in kwargs:
        if key in visible or (key not in tool.hidden and not takes_any):
            raise ValueError(
                f"{where} sets {key!r}, which is not a hidden parameter of the tool "
                f"(hidden: {list(tool.hidden)})"
            )
    missing = [
        name
        for name in tool.hidden
        if params[name].default is inspect.Parameter.empty and name not in kwargs
    ]
    if missing:
        raise ValueError(f"{where} must set the tool's hidden parameter(s) {missing}")
    return kwargs


def call_tool(
    tools: Mapping[str, Tool],
    call: ToolCall,
    row_kwargs: Mapping[str, dict[str, Any]],
    timeout_s: float,
    max_output_chars: int,
) -> ToolResult:
    """Run one call: never raises, returns within about `timeout_s`, output cut to
    `max_output_chars` characters (plus a marker)."""
    started = time.monotonic()

    def result(content: str, error: str | None) -> ToolResult:
        shown, truncated = truncate(content, max_output_chars)
        return ToolResult(call.name, shown, error, time.monotonic() - started, truncated)

    tool = tools.get(call.name)
    if tool is None:
        return result(
            f"error: unknown tool {call.name!r}; the tools are {sorted(tools)}", "unknown_tool"
        )
    try:
        arguments = check_arguments(tool, call.arguments)
    except ValueError as error:
        return result(f"error: bad arguments for {call.name}: {error}", "bad_arguments")
    kwargs = {**arguments, **row_kwargs.get(call.name, {})}
    outcome: list[tuple[str, str | None]] = []

    def run() -> None:
        try:
            value = tool.function(**kwargs)
            outcome.append(
                (value if isinstance(value, str) else json.dumps(value, default=str), None)
            )
        except BaseException as error:  # whatever the tool does, the model is told
            outcome.append((f"error: {one_line(error)}", "error"))

    # A daemon thread, not a ThreadPoolExecutor's: a tool that never returns must not hold the
    # interpreter at exit.
    thread = threading.Thread(target=run, name=f"tool-{call.name}", daemon=True)
    try:
        thread.start()
    except RuntimeError as error:
        return result(f"error: could not start the tool: {error}", "error")
    thread.join(timeout_s)
    if not outcome:
        return result(f"error: {call.name} timed out: it ran out of its {timeout_s:g} s", "timeout")
    content, error_kind = outcome[0]
    return result(content, error_kind)


def check_arguments(tool: Tool, arguments: Any) -> dict[str, Any]:
    """The model's arguments if the schema allows them (integral floats for integers become
    ints); else ValueError saying what is wrong."""
    if not isinstance(arguments, Mapping):
        raise ValueError(f"arguments must be a JSON object, got {type(arguments).__name__}")
    parameters = tool.schema["function"]["parameters"]
    properties: Mapping[str, Any] = parameters.get("properties", {})
    params = inspect.signature(tool.function).parameters
    needed = set(parameters.get("required", [])) | {
        name
        for name in properties
        if name in params and params[name].default is inspect.Parameter.empty
    }
    missing = sorted(needed - set(arguments))
    if missing:
        raise ValueError(f"missing required argument(s) {missing}")
    unexpected = sorted(str(name) for name in arguments if name not in properties)
    if unexpected:
        raise ValueError(
            f"unexpected argument(s) {unexpected}; the parameters are {sorted(properties)}"
        )
    checked = {}
    for name, value in arguments.items():
        checked[name] = _typed(value, properties[name].get("type"), name)
    return checked


def _typed(value: Any, declared: Any, name: str) -> Any:
    types = declared if isinstance(declared, list) else [declared]
    known = [t for t in types if t in _JSON_TYPES]
    if not known:
        return value  # no simple type to check against
    for kind in known:
        if kind in ("integer", "number") and isinstance(value, bool):
            continue  # True is an int to Python, not to JSON
        if isinstance(value, _JSON_TYPES[kind]):
            return value
        if kind == "integer" and isinstance(value, float) and value.is_integer():
            return int(value)  # JSON schema counts 3.0 as an integer
    got = "null" if value is None else type(value).__name__
    raise ValueError(f"argument {name!r} must be of type {' or '.join(known)}, got {got}")


def truncate(content: str, max_chars: int) -> tuple[str, bool]:
    """`content` cut to `max_chars` characters plus a marker saying how many were cut."""
    if len(content) <= max_chars:
        return content, False
    # One slice of max_chars: a 10 MB output is not copied whole again.
    return f"{content[:max_chars]}...[truncated {len(content) - max_chars} characters]", True
