"""Code reward: run the program a response wrote against the row's tests, in the sandbox
(hybrid/sandbox/), and score the fraction that pass.

`ground_truth` is a JSON object (a string, or already parsed) in one of two formats:
  - {"tests": ["assert add(1, 2) == 3", ...]}: statements run after the solution, in its
    namespace; a test passes when it raises nothing.
  - {"cases": [{"input": "1 2\\n", "output": "3\\n"}, ...]}: the solution is a program reading
    stdin; a case passes when it exits 0 within the limits and its stdout equals "output",
    both compared with trailing whitespace stripped from every line and trailing blank lines
    dropped.
The solution is the last ```python block of the response, else its last ``` block, else the
whole response. Limits: `DEFAULT_LIMITS`, overridden per row by `extra_info["sandbox"]` (a
mapping of `SandboxLimits` fields; they apply to each sandbox run).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from typing import Any

from hybrid.sandbox import SandboxLimits, run, with_overrides

DEFAULT_LIMITS = SandboxLimits(time_s=5.0, memory_mb=1024, output_bytes=1 << 20)
"""Limits of each sandbox run, unless a row's extra_info["sandbox"] overrides them."""

_FENCE_RE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"python", "python3", "py"}

# All asserts of a row run in ONE sandbox process: a row costs one interpreter start instead of
# one per assert (a batch scores thousands of rows on shared cores), and the solution runs
# once. A per-run random marker line after each test, on a copy of stdout the solution's prints
# do not reach, keeps the passes seen before a later test hangs or crashes the process, and
# makes an early sys.exit(0)/os._exit(0) score nothing rather than everything. (A program that
# reads the harness's own source could still forge the markers: this is no defense against a
# policy that learns to attack the harness; watch for scores with no plausible code.)
_HARNESS = """\
import contextlib, os, sys
_report = os.dup(1)
_namespace = {{"__name__": "solution"}}
with open(os.devnull, "w") as _sink, contextlib.redirect_stdout(_sink):
    try:
        exec(compile({solution!r}, "solution.py", "exec"), _namespace)
        _loaded = True
    except BaseException as _error:
        print(f"the solution raised {{type(_error).__name__}}: {{_error}}", file=sys.stderr)
        _loaded = False
    for _index, _test in enumerate({tests!r}):
        _status = "fail"
        if _loaded:
            try:
                exec(compile(_test, f"test_{{_index}}", "exec"), _namespace)
                _status = "pass"
            except BaseException as _error:
                print(f"test {{_index}} raised {{type(_error).__name__}}: {{_error}}", file=sys.stderr)
        os.write(_report, f"\\n{marker} {{_index}} {{_status}}\\n".encode())
"""


def extract_code(solution_str: str) -> str:
    """The last ```python (or python3, py) block, else the last ``` block, else the text."""
    blocks = _FENCE_RE.findall(solution_str)
    python = [body for tag, body in blocks if tag.lower() in _PYTHON_TAGS]
    if python:
        return python[-1]
    if blocks:
        return blocks[-1][1]
    return solution_str


def parse_ground_truth(ground_truth: Any) -> tuple[str, list[Any]]:
    """("tests", [statements]) or ("cases", [{"input", "output"}]) from the row's ground truth."""
    data = ground_truth
    if isinstance(ground_truth, str | bytes):
        try:
            data = json.loads(ground_truth)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"code ground_truth is not valid JSON ({error}): {str(ground_truth)[:200]!r}"
            ) from None
    if not isinstance(data, Mapping):
        raise ValueError(
            f"code ground_truth must be an object with 'tests' or 'cases', got a "
            f"{type(data).__name__}: {str(data)[:200]!r}"
        )
    formats = [key for key in ("tests", "cases") if key in data]
    if len(formats) != 1:
        raise ValueError(
            f"code ground_truth must hold exactly one of 'tests' or 'cases', got keys {sorted(data)}"
        )
    kind = formats[0]
    items = data[kind]
    items = items.tolist() if hasattr(items, "tolist") else items  # a Parquet list column
    if not isinstance(items, list | tuple) or not items:
        raise ValueError(
            f"code ground_truth[{kind!r}] must be a non-empty list, got {items!r:.200}"
        )
    for index, item in enumerate(items):
        if kind == "tests" and not isinstance(item, str):
            raise ValueError(
                f"code ground_truth['tests'][{index}] must be a string of Python, got {item!r:.200}"
            )
        if kind == "cases" and not (
            isinstance(item, Mapping)
            and isinstance(item.get("input", ""), str)
            and isinstance(item.get("output"), str)
        ):
            raise ValueError(
                f"code ground_truth['cases'][{index}] must be an object with string 'input' and "
                f"'output', got {item!r:.200}"
            )
    return kind, list(items)


def same_output(actual: str, expected: str) -> bool:
    """Equal once trailing whitespace is stripped from every line and trailing blank lines."""
    return _normalized(actual) == _normalized(expected)


def _normalized(text: str) -> list[str]:
    return [line.rstrip() for line in text.rstrip().splitlines()]


def count_passed_tests(solution: str, tests: list[str], limits: SandboxLimits) -> int:
    """How many of the assert-style `tests` pass after `solution`, in one sandbox run."""
    marker = f"hybrid-test-{secrets.token_hex(16)}"
    harness = _HARNESS.format(solution=solution, tests=tests, marker=marker)
    result = run(harness, limits)
    # Each index once: a forged duplicate line cannot count a test twice.
    passed = set(re.findall(rf"^{marker} (\d+) pass$", result.stdout, re.MULTILINE))
    return len(passed)


def count_passed_cases(solution: str, cases: list[Mapping[str, str]], limits: SandboxLimits) -> int:
    """How many stdin/stdout `cases` the program `solution` gets right, one sandbox run each
    (each needs its own stdin and a fresh process)."""
    passed = 0
    for case in cases:
        result = run(solution, limits, stdin=case.get("input", ""))
        if result.ok and not result.truncated and same_output(result.stdout, case["output"]):
            passed += 1
    return passed


def compute_score(
    solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """{"score": fraction passed, "passed": n, "total": m} for one response."""
    kind, items = parse_ground_truth(ground_truth)
    overrides = None if extra_info is None else extra_info.get("sandbox")
    limits = with_overrides(DEFAULT_LIMITS, overrides, "extra_info['sandbox']")
    solution = extract_code(solution_str)
    if kind == "tests":
        passed = count_passed_tests(solution, items, limits)
    else:
        passed = count_passed_cases(solution, items, limits)
    return {"score": passed / len(items), "passed": passed, "total": len(items)}
