"""The Hermes parser reads every well-formed <tool_call> block of a turn and reports each bad one;
a parser can also come from a file, and a bad spec is named."""

from __future__ import annotations

import pytest

from hybrid.rollout.agent.parsers import PARSERS, HermesParser, ParsedTurn, load_parser
from hybrid.rollout.agent.tools import ToolCall
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.unit

PARSER_FILE = REPO_ROOT / "tests" / "assets" / "agent" / "upper_parser.py"


def parse(text: str) -> ParsedTurn:
    return HermesParser().parse(text)


def test_one_call_with_whitespace_around_its_json() -> None:
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert parse(text) == ParsedTurn(calls=[ToolCall("add", {"a": 1, "b": 2})], errors=[])


def test_two_calls_in_order() -> None:
    text = (
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call> and '
        '<tool_call>{"name": "search", "arguments": {"q": "</tool"}}</tool_call>'
    )
    assert parse(text).calls == [ToolCall("add", {"a": 1}), ToolCall("search", {"q": "</tool"})]


def test_no_block_is_no_call_and_no_error() -> None:
    assert parse("The answer is 3.") == ParsedTurn(calls=[], errors=[])
    assert parse("") == ParsedTurn(calls=[], errors=[])


def test_arguments_as_a_json_string_are_read() -> None:
    text = '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>'
    assert parse(text).calls == [ToolCall("add", {"a": 1, "b": 2})]


def test_missing_arguments_are_empty() -> None:
    assert parse('<tool_call>{"name": "now"}</tool_call>').calls == [ToolCall("now", {})]


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ('{"name": "add", "arguments": {"a": 1}', "not valid JSON"),
        ('{"arguments": {"a": 1}}', "has no name"),
        ('{"name": "", "arguments": {}}', "has no name"),
        ('["add", {"a": 1}]', "must be a JSON object with name and arguments"),
        ('{"name": "add", "arguments": [1, 2]}', "arguments must be a JSON object, got list"),
        ('{"name": "add", "arguments": "{a: 1}"}', "arguments are not valid JSON"),
        ('{"name": "add", "arguments": "[1]"}', "arguments must be a JSON object, got list"),
    ],
)
def test_a_bad_block_is_one_error_and_the_good_ones_still_run(block: str, message: str) -> None:
    good = '<tool_call>{"name": "ok", "arguments": {}}</tool_call>'
    parsed = parse(f"{good}\n<tool_call>{block}</tool_call>\n{good}")
    assert parsed.calls == [ToolCall("ok", {}), ToolCall("ok", {})]
    assert len(parsed.errors) == 1 and message in parsed.errors[0]


def test_an_unterminated_block_at_the_end_is_malformed() -> None:
    parsed = parse('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b"')
    assert parsed.calls == [ToolCall("a", {})]
    assert parsed.errors == ["<tool_call> block never closed with </tool_call>"]


def test_the_builtin_parser_by_name() -> None:
    assert set(PARSERS) == {"hermes"}
    assert isinstance(load_parser("hermes"), HermesParser)


@pytest.mark.parametrize("name", ["UpperParser", "make_parser"])
def test_a_parser_class_or_factory_from_a_file(name: str) -> None:
    parser = load_parser(f"{PARSER_FILE}:{name}")
    assert parser.parse("thinking\nCALL lookup\n").calls == [ToolCall("lookup", {})]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("mistral", r"'mistral' is neither a built-in parser \(\['hermes'\]\) nor"),
        (f"{PARSER_FILE}:", "is neither a built-in parser"),
        ("nowhere.py:Parser", "rollout.agent.tool_parser file nowhere.py does not exist"),
        (f"{PARSER_FILE}:Missing", "defines no parser class or factory 'Missing'"),
        (f"{PARSER_FILE}:NOT_A_PARSER", "defines no parser class or factory 'NOT_A_PARSER'"),
        (f"{PARSER_FILE}:no_parse", "made a object, which has no parse"),
    ],
)
def test_a_bad_spec_is_named_in_one_line(spec: str, message: str) -> None:
    with pytest.raises((ValueError, FileNotFoundError), match=message) as caught:
        load_parser(spec)
    assert "rollout.agent.tool_parser" in str(caught.value) and "\n" not in str(caught.value)
