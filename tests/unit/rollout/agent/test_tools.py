"""Tool files load only when each schema matches its function; a call never raises and never
outlives its deadline; a row binds the hidden parameters in either of verl's layouts."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hybrid.rollout.agent.tools import (
    TOOL_ERROR_KINDS,
    Tool,
    ToolCall,
    ToolResult,
    call_tool,
    load_tools,
    make_tool,
    row_tool_kwargs,
    tool_schemas,
    truncate,
)
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.unit

ASSETS = REPO_ROOT / "tests" / "assets" / "agent"
GOOD = ASSETS / "good_tools.py"


def schema(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": name,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def sleepy(seconds: float) -> str:
    time.sleep(seconds)
    return "awake"


def broken(message: str) -> str:
    raise KeyError(message)


def flood(size: int) -> str:
    return "x" * size


SLEEPY = make_tool(schema("sleepy", {"seconds": {"type": "number"}}, ["seconds"]), sleepy, "test")
BROKEN = make_tool(schema("broken", {"message": {"type": "string"}}, ["message"]), broken, "test")
FLOOD = make_tool(schema("flood", {"size": {"type": "integer"}}, ["size"]), flood, "test")


DOOR_ROW = {"tools_kwargs": {"open_door": {"password": "sesame"}}}
"""A row of good_tools.py (open_door's password has no default: every row must bind it)."""


def call(
    tools: dict[str, Tool], name: str, row: dict[str, Any] | None = None, **arguments: Any
) -> ToolResult:
    if row is None:
        row = DOOR_ROW if "open_door" in tools else {}
    row_kwargs = row_tool_kwargs(row, tools, "row 0")
    return call_tool(
        tools, ToolCall(name, arguments), row_kwargs, timeout_s=2.0, max_output_chars=100
    )


# --- loading -------------------------------------------------------------------------------------


def test_a_good_file_loads_its_tools_with_their_hidden_parameters() -> None:
    tools = load_tools(GOOD)
    assert sorted(tools) == ["add", "open_door", "record"]
    assert tools["open_door"].hidden == ("password", "greeting")
    assert tools["add"].hidden == ()
    assert [s["function"]["name"] for s in tool_schemas(tools)] == ["add", "open_door", "record"]
    assert tools["add"].function(1, 2) == 3


@pytest.mark.parametrize(
    ("file", "tool", "message"),
    [
        ("no_tools_list.py", None, "defines no TOOLS list of schemas"),
        ("bad_no_name.py", None, r"TOOLS\[0\]: the schema has no function.name"),
        ("bad_parameters.py", "lookup", "must be a JSON schema of type 'object'"),
        ("bad_not_callable.py", "lookup", "names a str, not a function of the file"),
        ("bad_missing_function.py", "lookup", "names nothing, not a function of the file"),
        ("bad_property.py", "lookup", "property 'lang' is not a parameter the function takes"),
        ("bad_required.py", "lookup", "required parameter 'lang' is not one of the schema's"),
        ("bad_uncovered.py", "lookup", "parameter 'lang' has no default and is not in the schema"),
        ("bad_hidden_listed.py", "lookup", "'key' is a hidden \\(keyword-only\\) parameter"),
        ("bad_duplicate.py", "lookup", "is defined twice"),
        ("raises_on_import.py", None, "raised while loading: RuntimeError: cannot reach the"),
    ],
)
def test_each_bad_file_is_one_line_naming_the_file_and_tool(
    file: str, tool: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        load_tools(ASSETS / file)
    text = str(caught.value)
    assert "\n" not in text
    assert str(ASSETS / file) in text
    if tool is not None:
        assert f"tool {tool!r}" in text


def test_a_missing_file_is_named() -> None:
    with pytest.raises(FileNotFoundError, match=r"tool file .*nowhere\.py does not exist"):
        load_tools(ASSETS / "nowhere.py")


def test_a_tool_with_kwargs_takes_any_property() -> None:
    def anything(**kwargs: Any) -> str:
        return json.dumps(kwargs)

    tool = make_tool(schema("anything", {"x": {"type": "string"}}, ["x"]), anything, "test")
    assert tool.hidden == ()


# --- calls ---------------------------------------------------------------------------------------


def test_an_ok_call_shows_a_non_string_as_json() -> None:
    tools = load_tools(GOOD)
    result = call(tools, "add", a=2, b=0.5)
    assert (result.content, result.error, result.truncated) == ("2.5", None, False)
    assert result.name == "add" and 0 <= result.seconds < 1
    recorded = call(tools, "record", note=None)
    assert json.loads(recorded.content) == {"note": None}


def test_a_sleeping_tool_times_out_by_its_deadline() -> None:
    started = time.monotonic()
    result = call_tool({"sleepy": SLEEPY}, ToolCall("sleepy", {"seconds": 30}), {}, 0.5, 100)
    elapsed = time.monotonic() - started
    assert result.error == "timeout"
    assert "ran out of its 0.5 s" in result.content
    assert 0.5 <= elapsed < 1.0 and 0.5 <= result.seconds < 1.0
    # The abandoned thread must not hold the interpreter at exit.
    assert all(t.daemon for t in threading.enumerate() if t.name == "tool-sleepy")


def test_a_raising_tool_is_an_error_of_one_line() -> None:
    result = call({"broken": BROKEN}, "broken", message="no\nsuch key")
    assert result.error == "error"
    assert result.content == "error: KeyError: 'no\\nsuch key'"


def test_a_huge_output_is_cut_to_the_budget_quickly() -> None:
    started = time.monotonic()
    result = call_tool({"flood": FLOOD}, ToolCall("flood", {"size": 10_000_000}), {}, 5.0, 10)
    assert time.monotonic() - started < 1.0
    assert result.truncated and result.error is None
    assert result.content == "xxxxxxxxxx...[truncated 9999990 characters]"


def test_truncate_keeps_short_text_whole() -> None:
    assert truncate("abc", 3) == ("abc", False)
    assert truncate("abcd", 3) == ("abc...[truncated 1 characters]", True)


def test_an_unknown_tool_lists_the_known_ones() -> None:
    result = call(load_tools(GOOD), "subtract", a=1, b=2)
    assert result.error == "unknown_tool"
    assert "'subtract'" in result.content and "['add', 'open_door', 'record']" in result.content


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"a": 1}, r"missing required argument\(s\) \['b'\]"),
        ({"a": 1, "b": 2, "c": 3}, r"unexpected argument\(s\) \['c'\]"),
        ({"a": "1", "b": 2}, "'a' must be of type integer, got str"),
        ({"a": True, "b": 2}, "'a' must be of type integer, got bool"),
        ({"a": 1.5, "b": 2}, "'a' must be of type integer, got float"),
        ({"a": 1, "b": None}, "'b' must be of type number, got null"),
    ],
)
def test_bad_arguments_say_what_is_wrong(arguments: dict[str, Any], message: str) -> None:
    result = call(load_tools(GOOD), "add", **arguments)
    assert result.error == "bad_arguments"
    assert result.content.startswith("error: bad arguments for add: ")
    assert re.search(message, result.content), result.content


def test_an_integral_float_is_an_integer() -> None:
    assert call(load_tools(GOOD), "add", a=2.0, b=1).content == "3"


def test_the_model_cannot_set_a_hidden_parameter() -> None:
    row = {"tools_kwargs": {"open_door": {"password": "sesame"}}}
    result = call(load_tools(GOOD), "open_door", row, word="x", password="x")
    assert result.error == "bad_arguments" and "'password'" in result.content


def test_every_error_kind_is_listed() -> None:
    assert TOOL_ERROR_KINDS == ("timeout", "error", "bad_json", "unknown_tool", "bad_arguments")


# --- hidden parameters from the row ---------------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [
        {"password": "sesame"},
        {"create_kwargs": {"password": "sesame"}},
        {"create_kwargs": {"password": "sesame"}, "execute_kwargs": None, "release_kwargs": {}},
    ],
    ids=["plain", "verl", "verl-with-other-keys"],
)
def test_a_row_binds_hidden_parameters_in_either_layout(entry: dict[str, Any]) -> None:
    tools = load_tools(GOOD)
    row = {"tools_kwargs": {"open_door": entry, "add": None}}
    assert row_tool_kwargs(row, tools, "row 3") == {
        "add": {},
        "open_door": {"password": "sesame"},
        "record": {},
    }
    assert call(tools, "open_door", row, word="sesame").content == "welcome"
    assert call(tools, "open_door", row, word="sesame", loud=True).content == "WELCOME"
    assert call(tools, "open_door", row, word="guess").content == "locked"


def test_a_row_overrides_a_hidden_default() -> None:
    row = {"tools_kwargs": {"open_door": {"password": "p", "greeting": "hi", "unused": None}}}
    assert call(load_tools(GOOD), "open_door", row, word="p").content == "hi"


def test_rows_without_tools_kwargs_bind_nothing() -> None:
    tools = {"sleepy": SLEEPY, "broken": BROKEN}
    assert row_tool_kwargs(None, tools, "r") == {"sleepy": {}, "broken": {}}
    assert row_tool_kwargs({"index": 1}, tools, "r") == {"sleepy": {}, "broken": {}}


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"tools_kwargs": {"teleport": {"x": 1}}}, "names tool 'teleport', which this run lacks"),
        ({}, r"open_door must set the tool's hidden parameter\(s\) \['password'\]"),
        (
            {"tools_kwargs": {"open_door": {"create_kwargs": {}}}},
            r"hidden parameter\(s\) \['password'\]",
        ),
        (
            {"tools_kwargs": {"open_door": {"password": "p", "pin": 1}}},
            "sets 'pin', which is not a hidden",
        ),
        (
            {"tools_kwargs": {"open_door": {"password": "p", "word": "w"}}},
            "sets 'word', which is not",
        ),
        (
            {"tools_kwargs": {"open_door": {"create_kwargs": {}, "pin": 1}}},
            r"mixes verl's layout .*\['pin'\]",
        ),
        ({"tools_kwargs": ["open_door"]}, "must map tool names to kwargs, got a list"),
        ({"tools_kwargs": {"open_door": "sesame"}}, "must be a mapping of kwargs, got a str"),
    ],
)
def test_a_bad_row_is_named(row: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        row_tool_kwargs(row, load_tools(GOOD), "data.parquet: row 7")
    assert str(caught.value).startswith("prompt data.parquet: row 7: extra_info.tools_kwargs")


def test_the_tool_file_in_the_examples_loads() -> None:
    tools = load_tools(REPO_ROOT / "examples" / "agent" / "vault_tools.py")
    row = {"tools_kwargs": {"open_vault": {"code": "42"}}}
    assert call(tools, "open_vault", row).content == "42"


def test_a_tool_file_named_by_a_str_loads(tmp_path: Path) -> None:
    file = tmp_path / "one.py"
    file.write_text(
        "TOOLS = [{'type': 'function', 'function': {'name': 'one', "
        "'parameters': {'type': 'object', 'properties': {}}}}]\n"
        "def one():\n    return 1\n"
    )
    assert call(load_tools(str(file)), "one").content == "1"
