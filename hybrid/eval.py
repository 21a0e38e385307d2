"""Entry point: `python -m hybrid.eval key=value ...` (console script `hybrid-eval`).

Evaluates a Hugging Face model directory, a run's export or one of its checkpoints on prompt
files with the project's rewards: n samples per prompt on vLLM workers (Ray), then mean@n,
pass@k, best@k and maj@k per data source and overall, with 95% confidence intervals over
prompts, in output_dir/eval.json and a Markdown table (printed too) and the first prompts'
samples in samples.jsonl (hybrid/evaluation/report.py). For example:

    python -m hybrid.eval model=outputs/demo/run/hf_model data=[outputs/demo/data/test.parquet] \\
        n=8 temperature=1.0 workers=2 max_prompt_length=16 response_length=4

The arguments are the fields of EvalConfig (hybrid/evaluation/config.py; `--help` lists them),
parsed like the trainer's overrides and built strictly: an unknown key, a wrong type or a bad
value is named before any file is read, and a missing file, a row without
reward_model.ground_truth or k > n before any worker starts (docs/evaluation.md).
"""

from __future__ import annotations

import ast
import inspect
import itertools
import sys
from collections.abc import Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import OmegaConf

from hybrid.controller.errors import StallError, WorkerCallError
from hybrid.evaluation.config import EvalConfig
from hybrid.rewards.manager import RewardError
from hybrid.trainer.console import INPUT_ERRORS, configure_logging
from hybrid.trainer.console import stop as stop_with
from hybrid.trainer.schema import from_dict

RUN_ERRORS = (RewardError, StallError, WorkerCallError)
"""What stops an evaluation under way: the row, the phase or the worker named (exit code 1)."""
LIST_FIELDS = ("data", "k")
"""Fields that take a list; a single value is taken as a list of one."""


def parse_args(argv: Sequence[str]) -> EvalConfig:
    """`key=value` pairs (values in YAML: lists in brackets, null, true) into an EvalConfig."""
    values: dict[str, Any] = {}
    for arg in argv:
        key, sep, _ = arg.partition("=")
        if not sep or not key.strip():
            raise ValueError(
                f"argument {arg!r} is not key=value (e.g. n=8); the keys are "
                f"{[f.name for f in fields(EvalConfig)]}"
            )
        try:
            parsed = OmegaConf.to_container(OmegaConf.from_dotlist([arg]), resolve=True)
        except Exception as error:  # YAML's and OmegaConf's parse errors
            raise ValueError(f"argument {arg!r}: {error}") from None
        assert isinstance(parsed, dict)
        values.update({str(k): v for k, v in parsed.items()})
    for name in LIST_FIELDS:
        if values.get(name) is not None and not isinstance(values[name], list | tuple):
            values[name] = [values[name]]
    for name in ("model", "data"):
        if values.get(name) is None:
            raise ValueError(
                f"{name}= is required: model=DIR (a Hugging Face directory or a checkpoint) and "
                "data=[FILE, ...] (prompt files); python -m hybrid.eval --help lists every field"
            )
    return from_dict(EvalConfig, values)


def field_docs(cls: type) -> dict[str, str]:
    """Each field's attribute docstring, from the class source."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def usage() -> str:
    docs = field_docs(EvalConfig)
    lines = [(__doc__ or "").split("\n\n")[0], "", "fields (key=value):"]
    for f in fields(EvalConfig):
        default = "required" if f.default is MISSING else f"default {f.default!r}"
        lines.append(f"  {f.name} ({default}): {docs.get(f.name, '')}")
    return "\n".join(lines)


def stop(error: BaseException, output_dir: str | None, code: int) -> NoReturn:
    """One line instead of a traceback (hybrid.trainer.console.stop)."""
    stop_with("hybrid-eval", error, output_dir, code)


def main(argv: Sequence[str] | None = None) -> None:
    from hybrid.evaluation.runner import run_eval  # vLLM, Ray and transformers: after parsing

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        raise SystemExit(0 if args else 2)
    try:
        config = parse_args(args)
    except INPUT_ERRORS as error:
        stop(error, None, 2)
    out = config.output_dir
    configure_logging(config.verbose, None if config.verbose else Path(out) / "logs")
    try:
        run_eval(config)
    except INPUT_ERRORS as error:
        stop(error, out, 2)
    except RUN_ERRORS as error:
        stop(error, out, 1)


def cli() -> None:
    main()


if __name__ == "__main__":
    main()
