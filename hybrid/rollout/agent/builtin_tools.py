"""The built-in tools (rollout.agent.builtin_tools): `calculator` and `python`.

calculator: arithmetic on int and float literals with + - * / // % ** and parentheses, read with
`ast` (never eval). Results are bounded (MAX_DIGITS digits) before they are computed, so a
model cannot ask for 9**9**9 and stall its rollout; what it cannot compute raises, and the model
is shown the error.

python: runs the model's code in the sandbox (hybrid.sandbox: its own process with wall time,
CPU, memory and output limits, no network) and shows what it printed, plus stderr and the exit
status when it failed. Where the sandbox cannot run (SandboxUnavailable) the call fails with
that message.
"""

from __future__ import annotations

import ast
import math
import operator
import signal
from collections.abc import Callable
from typing import Any

from hybrid.rollout.agent.tools import Tool, make_tool
from hybrid.sandbox import SandboxLimits, SandboxResult, run

MAX_DIGITS = 1000
"""Largest integer (in decimal digits) the calculator reads or makes."""
MAX_EXPRESSION_CHARS = 2000
"""Longer expressions are refused before parsing (deep nesting would exhaust the parser)."""
PYTHON_LIMITS = SandboxLimits(time_s=5.0, memory_mb=512, output_bytes=64 << 10)
"""Each python call's sandbox; its wall time stays under rollout.agent.tool_timeout_s's default
(10 s) so that the model is told its program timed out rather than the call."""

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_LOG10_2 = math.log10(2)

CALCULATOR_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": (
            "Evaluate an arithmetic expression of integers and decimals with + - * / // % ** "
            f"and parentheses. Integers up to {MAX_DIGITS} digits."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "For example: (3 + 4) * 2 ** 10"}
            },
            "required": ["expression"],
        },
    },
}

PYTHON_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "python",
        "description": (
            "Run a Python program (standard library only, no network, a few seconds) and return "
            "what it printed. Use print() to see a value."
        ),
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The program's source."}},
            "required": ["code"],
        },
    },
}


def calculator(expression: str) -> str:
    """The value of an arithmetic expression, as text; ValueError or ZeroDivisionError when it
    is not arithmetic or cannot be computed."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"not an arithmetic expression: {error.msg}") from None
    return str(_evaluate(tree.body))


def _evaluate(node: ast.AST) -> int | float:
    value = node.value if isinstance(node, ast.Constant) else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _bounded(value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
            raise ZeroDivisionError("division by zero")
        try:
            value = _BINARY[type(node.op)](left, right)
        except OverflowError:
            raise ValueError("the result is too large for a float") from None
        if isinstance(value, complex):
            raise ValueError(
                "the result is not a real number (a negative base to a fractional power)"
            )
        return _bounded(value)
    raise ValueError(
        f"only numbers, + - * / // % ** and parentheses are allowed, got {ast.unparse(node)!r}"
    )


def _digits(value: int) -> float:
    """Decimal digits of an int, estimated without converting it to text."""
    return abs(value).bit_length() * _LOG10_2


def _bounded(value: int | float) -> int | float:
    if isinstance(value, int) and _digits(value) > MAX_DIGITS:
        raise ValueError(f"the result has more than {MAX_DIGITS} digits")
    return value


def _check_power(base: int | float, exponent: int | float) -> None:
    """Refuse an integer power before computing it when its result would be too long."""
    integers = isinstance(base, int) and isinstance(exponent, int)
    if (
        integers
        and abs(base) > 1
        and exponent > 0
        and exponent * math.log10(abs(base)) >= MAX_DIGITS
    ):
        raise ValueError(f"the power would have more than {MAX_DIGITS} digits")
    if base == 0 and exponent < 0:
        raise ZeroDivisionError("zero to a negative power")


def run_python(code: str, limits: SandboxLimits = PYTHON_LIMITS) -> str:
    """Run `code` in the sandbox: its stdout when it succeeded, else stdout, stderr and how it
    ended. SandboxUnavailable propagates (the call fails with its message)."""
    return describe_run(run(code, limits), limits)


def describe_run(result: SandboxResult, limits: SandboxLimits) -> str:
    """What the model is shown of one sandbox run."""
    if result.ok and not result.stderr and not result.truncated:
        return result.stdout or "[no output: print() shows a value]"
    parts = [result.stdout] if result.stdout else []
    if result.stderr:
        parts.append(f"stderr:\n{result.stderr}")
    if result.truncated:
        parts.append(f"[output cut at {limits.output_bytes} bytes]")
    if result.timed_out:
        parts.append(f"[timed out after {limits.time_s:g} s and was killed]")
    elif result.killed_by_signal is not None:
        try:
            name = signal.Signals(result.killed_by_signal).name
        except ValueError:
            name = f"signal {result.killed_by_signal}"
        why = " (CPU time limit)" if result.killed_by_signal == signal.SIGXCPU else ""
        parts.append(f"[killed by {name}{why}]")
    elif result.exit_code:
        parts.append(f"[exit status {result.exit_code}]")
    return "\n".join(part.rstrip("\n") for part in parts)


def python_tool(limits: SandboxLimits = PYTHON_LIMITS) -> Tool:
    """The python tool with its sandbox limits."""

    def python(code: str) -> str:
        return run_python(code, limits)

    return make_tool(PYTHON_SCHEMA, python, "built-in tool 'python'")


def builtin_tools() -> dict[str, Tool]:
    """The built-in tools by name."""
    return {
        "calculator": make_tool(CALCULATOR_SCHEMA, calculator, "built-in tool 'calculator'"),
        "python": python_tool(),
    }
