"""The built-in `code` reward: real sandbox runs of right, partly right and wrong programs in
both ground-truth formats, the cheap hacks that must score nothing, and malformed rows named."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hybrid.rewards import registry
from hybrid.rewards.code import compute_score, extract_code, same_output

pytestmark = pytest.mark.unit

ADD_TESTS = {"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]}
SUM_CASES = json.dumps(
    {
        "cases": [
            {"input": "1 2\n", "output": "3\n"},
            {"input": "10 -4\n", "output": "6"},
            {"input": "0 0\n", "output": "0\n"},
        ]
    }
)


def fenced(code: str, tag: str = "python") -> str:
    return f"Here is my solution.\n```{tag}\n{code}\n```\nIt adds the numbers."


@pytest.mark.parametrize(
    ("body", "passed"),
    [
        ("def add(a, b):\n    return a + b", 3),
        ("def add(a, b):\n    return a + b if a >= 0 else 99", 2),  # fails add(-1, 1)
        ("def add(a, b):\n    return a * b", 1),  # only 2 * 2 == 2 + 2
        ("def add(a, b):\n    return a - b - 1", 0),
    ],
)
def test_assert_tests_score_the_fraction_that_pass(body: str, passed: int) -> None:
    score = compute_score(fenced(body), ADD_TESTS)
    assert score == {"score": passed / 3, "passed": passed, "total": 3}


@pytest.mark.parametrize(
    ("body", "passed"),
    [
        ("a, b = map(int, input().split())\nprint(a + b)", 3),
        ("a, b = map(int, input().split())\nprint(abs(a) + abs(b))", 2),  # wrong on 10 -4
        ("print(42)", 0),
    ],
)
def test_stdin_cases_score_the_fraction_that_pass(body: str, passed: int) -> None:
    score = compute_score(fenced(body), SUM_CASES)
    assert score == {"score": passed / 3, "passed": passed, "total": 3}


def test_a_case_passes_despite_trailing_whitespace_but_not_after_a_crash() -> None:
    assert same_output("3  \n\n", "3") and same_output("1 \r\n2\n", "1\n2\n")
    assert not same_output("3 4", "34")
    crash = "print(3)\nraise SystemExit(1)"
    cases = {"cases": [{"input": "", "output": "3"}]}
    assert compute_score(fenced(crash), cases)["passed"] == 0
    assert compute_score(fenced("print('3   ')"), cases)["passed"] == 1


@pytest.mark.parametrize(
    "body",
    [
        "import sys\nsys.exit(0)",
        "import os\nos._exit(0)",
        "print('pass')\nprint('0 pass')",
    ],
)
def test_exiting_early_or_printing_passes_scores_nothing(body: str) -> None:
    assert compute_score(fenced(body), ADD_TESTS)["passed"] == 0


def test_a_hanging_test_keeps_the_passes_before_it() -> None:
    tests = {"tests": ["assert add(1, 2) == 3", "while True: pass", "assert add(2, 2) == 4"]}
    extra_info = {"sandbox": {"time_s": 1.0}}
    score = compute_score(fenced("def add(a, b):\n    return a + b"), tests, extra_info)
    assert score == {"score": 1 / 3, "passed": 1, "total": 3}


def test_the_solution_is_the_last_python_block_else_the_last_block_else_the_text() -> None:
    two = "```python\nfirst\n```\ntext\n```python3\nsecond\n```\n```text\noutput\n```"
    assert extract_code(two) == "second\n"
    assert extract_code("```\nplain\n```\n```bash\nls\n```") == "ls\n"
    assert extract_code("print(1)") == "print(1)"


def test_per_row_limits_come_from_extra_info() -> None:
    slow = "import time\ntime.sleep(3)\nprint(3)"
    cases = {"cases": [{"input": "", "output": "3"}]}
    assert compute_score(fenced(slow), cases, {"sandbox": {"time_s": 0.5}})["passed"] == 0
    with pytest.raises(ValueError, match=r"extra_info\['sandbox'\]: sandbox\.time_s"):
        compute_score(fenced(slow), cases, {"sandbox": {"time_s": -1}})


@pytest.mark.parametrize(
    ("ground_truth", "named"),
    [
        ("assert add(1, 2) == 3", "not valid JSON"),
        ('["assert add(1, 2) == 3"]', "must be an object with 'tests' or 'cases', got a list"),
        ({"test": ["assert True"]}, "exactly one of 'tests' or 'cases', got keys \\['test'\\]"),
        ({"tests": [], "cases": []}, "exactly one of 'tests' or 'cases'"),
        ({"tests": []}, r"ground_truth\['tests'\] must be a non-empty list"),
        ({"tests": "assert True"}, r"ground_truth\['tests'\] must be a non-empty list"),
        ({"tests": ["assert True", 3]}, r"ground_truth\['tests'\]\[1\] must be a string"),
        ({"cases": [{"input": "1"}]}, r"ground_truth\['cases'\]\[0\] must be an object"),
        ({"cases": ["1 2"]}, r"ground_truth\['cases'\]\[0\] must be an object"),
    ],
)
def test_a_malformed_ground_truth_is_named(ground_truth: Any, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        compute_score(fenced("print(1)"), ground_truth)


def test_the_registry_scores_data_source_code() -> None:
    score = registry.compute_score("code", fenced("def add(a, b):\n    return a + b"), ADD_TESTS)
    assert score == {"score": 1.0, "passed": 3, "total": 3}
