"""The calculator computes arithmetic and refuses the rest (never eval, never a huge power); the
python tool runs code in the real sandbox under its limits."""

from __future__ import annotations

import re
import time

import pytest

from hybrid.rollout.agent.builtin_tools import (
    MAX_DIGITS,
    builtin_tools,
    calculator,
    python_tool,
    run_python,
)
from hybrid.rollout.agent.tools import ToolCall, call_tool, tool_schemas
from hybrid.sandbox import SandboxLimits

pytestmark = pytest.mark.unit

SMALL = SandboxLimits(time_s=1.0, cpu_s=5.0, memory_mb=256, output_bytes=1000)
"""A second of wall time (the CPU limit further off, so the wall clock is what ends a loop)."""


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1 + 2 * 3", "7"),
        ("(1 + 2) * 3", "9"),
        ("-2 ** 2", "-4"),
        ("+-3", "-3"),
        ("7 / 2", "3.5"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("2 ** 10", "1024"),
        ("2 ** -1", "0.5"),
        ("0.1 + 0.2", "0.30000000000000004"),
        ("1_000 * 3", "3000"),
        ("10 ** 999", "1" + "0" * 999),
    ],
)
def test_calculator_values(expression: str, value: str) -> None:
    assert calculator(expression) == value


@pytest.mark.parametrize(
    ("expression", "error", "message"),
    [
        ("1 / 0", ZeroDivisionError, "division by zero"),
        ("1 // (2 - 2)", ZeroDivisionError, "division by zero"),
        ("5 % 0.0", ZeroDivisionError, "division by zero"),
        ("0 ** -1", ZeroDivisionError, "zero to a negative power"),
        ("9 ** 9 ** 9", ValueError, f"would have more than {MAX_DIGITS} digits"),
        ("10 ** 1000", ValueError, f"would have more than {MAX_DIGITS} digits"),
        ("(10 ** 600) * (10 ** 600)", ValueError, f"more than {MAX_DIGITS} digits"),
        ("1" * 1001, ValueError, f"more than {MAX_DIGITS} digits"),
        ("2.0 ** 5000", ValueError, "too large for a float"),
        ("(-8) ** 0.5", ValueError, "not a real number"),
        ("__import__('os').getcwd()", ValueError, "only numbers"),
        ("x + 1", ValueError, "only numbers"),
        ("True + 1", ValueError, "only numbers"),
        ("1 < 2", ValueError, "only numbers"),
        ("'a' * 3", ValueError, "only numbers"),
        ("1 +", ValueError, "not an arithmetic expression"),
        ("(" * 3000, ValueError, "longer than 2000 characters"),
    ],
)
def test_calculator_refusals(expression: str, error: type[Exception], message: str) -> None:
    started = time.monotonic()
    with pytest.raises(error, match=re.escape(message)):
        calculator(expression)
    assert time.monotonic() - started < 0.5


def test_calculator_error_reaches_the_model_through_call_tool() -> None:
    tools = builtin_tools()
    result = call_tool(tools, ToolCall("calculator", {"expression": "1/0"}), {}, 5.0, 200)
    assert result.error == "error"
    assert result.content == "error: ZeroDivisionError: division by zero"


def test_builtins_have_openai_schemas() -> None:
    schemas = tool_schemas(builtin_tools())
    assert [s["function"]["name"] for s in schemas] == ["calculator", "python"]
    for schema in schemas:
        assert schema["type"] == "function" and schema["function"]["description"]
        parameters = schema["function"]["parameters"]
        assert parameters["type"] == "object"
        assert parameters["required"] == list(parameters["properties"])


def test_python_prints() -> None:
    assert run_python("print(6 * 7)", SMALL) == "42\n"
    assert run_python("x = 1", SMALL) == "[no output: print() shows a value]"


def test_python_failure_shows_stderr_and_status() -> None:
    shown = run_python("print('before')\nraise SystemExit(3)", SMALL)
    assert shown == "before\n[exit status 3]"
    shown = run_python("1 / 0", SMALL)
    assert "stderr:" in shown and "ZeroDivisionError: division by zero" in shown
    assert shown.endswith("[exit status 1]")


def test_python_infinite_loop_is_killed_at_the_sandbox_limit() -> None:
    started = time.monotonic()
    shown = run_python("print('start', flush=True)\nwhile True:\n    pass", SMALL)
    assert time.monotonic() - started < 5.0
    assert shown == "start\n[timed out after 1 s and was killed]"


def test_python_output_is_limited() -> None:
    shown = run_python("print('y' * 100_000)", SMALL)
    assert shown == "y" * 1000 + "\n[output cut at 1000 bytes]"


def test_python_tool_through_call_tool() -> None:
    tools = {"python": python_tool(SMALL)}
    result = call_tool(tools, ToolCall("python", {"code": "print(sum(range(10)))"}), {}, 30.0, 100)
    assert (result.content, result.error) == ("45\n", None)
    result = call_tool(tools, ToolCall("python", {"code": "print('z' * 500)"}), {}, 30.0, 100)
    assert result.truncated and result.content.endswith("...[truncated 401 characters]")
