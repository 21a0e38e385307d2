"""A generative judge's pure parts: its prompt template, reading a number from its answer, and
how its scores join the rule rewards (no engine here: hybrid/trainer/judge.py drives it).

A template is plain text with `{prompt}`, `{response}` and `{ground_truth}` placeholders
(str.format syntax: a literal brace is doubled, `{{`). The judge's answer is read with a regex
of one group; its LAST match in the answer is the score (a judge that reasons first states its
verdict last). An answer with no match, or whose match is no finite number, is `unparsable`.

Shapes: rule, judge, combined (b,) float32; rule is NaN where a row has no rule score, judge is
NaN where the judge's answer was unparsable.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Sequence
from pathlib import Path

import torch

from hybrid.rewards.model_score import Combine, combine_scores, combined_metrics

PLACEHOLDERS = ("prompt", "response", "ground_truth")
"""What a template may name: the row's user prompt, the policy's response, the reference."""

DEFAULT_PATTERN = r"(-?\d+(?:\.\d+)?)"
"""A signed integer or decimal: the last one in the answer is the score."""

UNPARSABLE = "unparsable"
"""The error kind of an answer the pattern reads no finite number from."""


def template_fields(template: str, where: str) -> list[str]:
    """The placeholders `template` names, in order; a malformed template raises naming
    `where` (the file)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as error:
        raise ValueError(
            f"{where}: not a valid template ({error}); write a literal brace as {{{{ or }}}}"
        ) from None
    return [name for _, name, _, _ in parsed if name is not None]


def check_template(template: str, where: str) -> str:
    """`template` if it names `{response}` and no placeholder but PLACEHOLDERS, else a
    ValueError naming `where` and the offending placeholders."""
    names = template_fields(template, where)
    unknown = sorted({name for name in names if name not in PLACEHOLDERS})
    if unknown:
        shown = ", ".join("{" + name + "}" for name in unknown)
        raise ValueError(
            f"{where}: unknown placeholders {shown}; a judge template may name "
            f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)} (a literal brace is written "
            "{{ or }})"
        )
    if "response" not in names:
        raise ValueError(
            f"{where}: the template has no {{response}} placeholder: the judge would never see "
            "what it scores"
        )
    return template


def load_template(path: str | Path) -> str:
    """The checked template in the file `path` (reward.judge.template_path)."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"reward.judge.template_path: {path} is not a file")
    return check_template(file.read_text(), f"reward.judge.template_path {path}")


def render_prompt(template: str, prompt: str, response: str, ground_truth: str) -> str:
    """The judge's user message for one row (the values are inserted as they are: braces in
    a response are not read as placeholders)."""
    return template.format(prompt=prompt, response=response, ground_truth=ground_truth)


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """reward.judge.pattern compiled; an invalid regex, or one without exactly one group,
    raises naming the field."""
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        raise ValueError(
            f"reward.judge.pattern {pattern!r} is not a valid regex: {error}"
        ) from None
    if compiled.groups != 1:
        raise ValueError(
            f"reward.judge.pattern {pattern!r} must have exactly one group (the number), "
            f"it has {compiled.groups}; make other groups non-capturing: (?:...)"
        )
    return compiled


def parse_score(answer: str, pattern: re.Pattern[str]) -> float | None:
    """The number in the last match of `pattern` in `answer`; None when nothing matches or
    the match is no finite number (unparsable)."""
    matches = list(pattern.finditer(answer))
    if not matches:
        return None
    try:
        value = float(matches[-1].group(1))
    except (TypeError, ValueError):  # the group did not take part, or is no number
        return None
    return value if math.isfinite(value) else None


def keep_last(ids: Sequence[int], max_length: int) -> tuple[list[int], bool]:
    """The last `max_length` ids (a long judge prompt loses its start) and whether it was cut."""
    return list(ids[-max_length:]), len(ids) > max_length


def combine_judged(
    rule: torch.Tensor,
    judge: torch.Tensor,
    modes: Sequence[Combine],
    coef: float,
    error_score: float,
) -> torch.Tensor:
    """(b,) rewards: the judge's score joins the rule reward like a reward model's
    (hybrid.rewards.model_score.combine_scores); a row whose answer was unparsable (NaN)
    scores `error_score` as a whole, as a failed rule call does (reward.on_error=score)."""
    failed = judge.isnan()
    combined = combine_scores(rule, judge.nan_to_num(0.0), modes, coef)
    return torch.where(failed, torch.full_like(combined, error_score), combined)


def judged_metrics(
    rule: torch.Tensor, judge: torch.Tensor, combined: torch.Tensor, truncated: torch.Tensor
) -> dict[str, float]:
    """reward/mean, max, min of the combined rewards, reward/rule_mean where rows have one,
    and the judge's own: reward/judge_mean (raw, before coef, over the parsed rows; NaN when
    none parsed), reward/judge_unparsable, reward/judge_truncated (prompts cut on the left)."""
    parsed = judge[~judge.isnan()]
    metrics = combined_metrics(rule, judge.nan_to_num(0.0), combined, truncated)
    del metrics["reward/model_mean"], metrics["reward/model_truncated"]
    metrics["reward/judge_mean"] = float(parsed.mean()) if parsed.numel() else float("nan")
    metrics["reward/judge_unparsable"] = float(judge.numel() - parsed.numel())
    metrics["reward/judge_truncated"] = float(truncated.sum())
    return metrics
