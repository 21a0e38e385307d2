"""An evaluation's outputs in its output_dir: JSON_FILE (everything), MARKDOWN_FILE (the table
a person reads, printed to the console too) and SAMPLES_FILE (the first prompts' samples, for
inspection).

The table has one row per metric (mean@n, then pass@k, best@k and maj@k by k) and one column
per data source, then `all`; each cell is the estimate with its 95% confidence interval over
prompts, `0.812 [0.750, 0.870]`. Pure functions of the result; `write_report` writes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybrid.evaluation.estimators import OVERALL, Estimate

if TYPE_CHECKING:
    from hybrid.evaluation.runner import EvalResult

METRIC_ORDER = ("mean", "pass", "best", "maj")
JSON_FILE = "eval.json"
MARKDOWN_FILE = "eval.md"
SAMPLES_FILE = "samples.jsonl"


def split_key(key: str) -> tuple[str, str]:
    """`openai/gsm8k/pass@4` -> (`openai/gsm8k`, `pass@4`): data sources may hold slashes,
    metric names never do."""
    source, _, metric = key.rpartition("/")
    return source, metric


def metric_sort_key(metric: str) -> tuple[int, int, str]:
    family, _, k = metric.partition("@")
    rank = METRIC_ORDER.index(family) if family in METRIC_ORDER else len(METRIC_ORDER)
    return rank, int(k) if k.isdigit() else 0, metric


def table_layout(estimates: Mapping[str, Estimate]) -> tuple[list[str], list[str]]:
    """(metrics in table order, data sources sorted with `all` last)."""
    metrics, sources = set(), set()
    for key in estimates:
        source, metric = split_key(key)
        metrics.add(metric)
        sources.add(source)
    ordered_sources = sorted(sources - {OVERALL}) + ([OVERALL] if OVERALL in sources else [])
    return sorted(metrics, key=metric_sort_key), ordered_sources


def format_estimate(estimate: Estimate) -> str:
    return f"{estimate.value:.3f} [{estimate.ci_low:.3f}, {estimate.ci_high:.3f}]"


def markdown_table(estimates: Mapping[str, Estimate]) -> list[str]:
    """The metric x data source table (prompts per source in its heading)."""
    metrics, sources = table_layout(estimates)
    prompts = {
        source: next(e.prompts for k, e in estimates.items() if split_key(k)[0] == source)
        for source in sources
    }
    lines = [
        "| metric | " + " | ".join(f"{s} ({prompts[s]})" for s in sources) + " |",
        "|---|" + "---|" * len(sources),
    ]
    for metric in metrics:
        cells = [
            format_estimate(estimates[f"{s}/{metric}"]) if f"{s}/{metric}" in estimates else "-"
            for s in sources
        ]
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    return lines


def headline(result: EvalResult) -> list[str]:
    """What was evaluated, how sampled, on which prompts (what was left out counted)."""
    c = result.config
    sampling = (
        "greedy (temperature 0), 1 sample per prompt"
        if c.greedy
        else f"{c.n} samples per prompt, temperature {c.temperature:g}, top_p {c.top_p:g}"
    )
    kept = sum(f.prompts for f in result.files)
    filtered = sum(f.filtered for f in result.files)
    files = ", ".join(f"{f.path} ({f.prompts})" for f in result.files)
    left_out = (
        f"; {filtered} longer than max_prompt_length={c.max_prompt_length} left out"
        if filtered
        else ""
    )
    return [
        f"model: {result.model.describe()}",
        f"sampling: {sampling}, at most {c.response_length} tokens",
        f"prompts: {kept} from {files}{left_out}",
        f"a sample is correct when its score >= {c.correct_threshold:g}; "
        "95% confidence intervals over prompts",
    ]


def markdown(result: EvalResult) -> str:
    lines = ["# Evaluation", "", *(f"- {line}" for line in headline(result)), ""]
    lines += markdown_table(result.estimates)
    seconds = result.timing_s.get("total", float("nan"))
    lines += ["", f"{len(result.prompts)} prompts in {seconds:.1f} s (eval.json has the rest)"]
    return "\n".join(lines) + "\n"


def response_stats(result: EvalResult) -> dict[str, float]:
    lengths = [n for p in result.prompts for n in p.response_lengths]
    truncated = sum(p.truncated for p in result.prompts)
    return {
        "mean": sum(lengths) / len(lengths) if lengths else float("nan"),
        "max": float(max(lengths, default=0)),
        "truncated_fraction": truncated / len(lengths) if lengths else float("nan"),
    }


def eval_json(result: EvalResult) -> dict[str, Any]:
    sources: dict[str, int] = {}
    for prompt in result.prompts:
        sources[prompt.data_source] = sources.get(prompt.data_source, 0) + 1
    n = result.samples_per_prompt
    return {
        "model": {
            "given": result.model.given,
            "path": result.model.path,
            "kind": result.model.kind,
        },
        "data": [
            {"path": f.path, "prompts": f.prompts, "filtered": f.filtered} for f in result.files
        ],
        "config": result.config.summary(result.ks),
        "samples_per_prompt": n,
        "prompts": len(result.prompts),
        "samples": n * len(result.prompts),
        "filtered": sum(f.filtered for f in result.files),
        "sources": {source: {"prompts": count} for source, count in sorted(sources.items())},
        "metrics": {
            key: {
                "value": e.value,
                "ci_low": e.ci_low,
                "ci_high": e.ci_high,
                "prompts": e.prompts,
            }
            for key, e in result.estimates.items()
        },
        "response_length": response_stats(result),
        "rewards": result.rewards,
        "engine": result.engine,
        "timing_s": result.timing_s,
    }


def sample_rows(result: EvalResult) -> list[dict[str, Any]]:
    """The first samples_to_dump prompts with their samples, one dict per prompt."""
    return [
        {
            "index": p.index,
            "source": p.source,
            "data_source": p.data_source,
            "prompt": p.raw_prompt,
            "ground_truth": p.ground_truth,
            "responses": list(p.responses),
            "scores": list(p.scores),
            "answers": list(p.answers),
            "response_lengths": list(p.response_lengths),
        }
        for p in result.prompts[: result.config.samples_to_dump]
    ]


def write_report(result: EvalResult, echo: bool = True) -> Path:
    """Write the three files into output_dir (created); `echo`: print the table too."""
    out = Path(result.config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / JSON_FILE).write_text(json.dumps(eval_json(result), indent=1, allow_nan=True))
    text = markdown(result)
    (out / MARKDOWN_FILE).write_text(text)
    with (out / SAMPLES_FILE).open("w", encoding="utf-8") as f:
        for row in sample_rows(result):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    if echo:
        print(text, flush=True)
        written = ", ".join(str(out / name) for name in (JSON_FILE, MARKDOWN_FILE, SAMPLES_FILE))
        print(f"written: {written}")
    return out
