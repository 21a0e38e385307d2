"""Per-row response budgets (extra_info.max_response_tokens): default, cap, bad values named."""

from __future__ import annotations

import pytest

from hybrid.rollout.base import response_budgets

pytestmark = pytest.mark.unit


def test_budgets_default_cap_and_pass_through() -> None:
    infos = [{}, {"max_response_tokens": 4}, {"max_response_tokens": 99}, {"other": 1}]
    assert response_budgets(infos, ["a", "b", "c", "d"], 16) == [16, 4, 16, 16]
    assert response_budgets(None, ["a", "b"], 16) == [16, 16]


@pytest.mark.parametrize("bad", [0, -3, 2.5, "8", True])
def test_a_bad_budget_names_the_row(bad: object) -> None:
    with pytest.raises(ValueError, match=r"prompt b: extra_info\.max_response_tokens must be"):
        response_budgets([{}, {"max_response_tokens": bad}], ["a", "b"], 16)
