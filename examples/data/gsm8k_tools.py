"""GSM8K prompt parquet files for tool use (rollout.agent with the calculator and python tools).

The rows of examples/data/gsm8k.py (same questions, ground truths, data_source "openai/gsm8k"
so the GSM8K reward scores them), with the instruction changed: compute with the `calculator`
or `python` tool, then end with "#### <number>". extra_info gains agent_name "tools" (verl's
key): the built-in tool environment answers each turn's tool calls (docs/agents.md). The
tools' schemas are not in the rows: the trainer hands them to the chat template of every prompt.

    python examples/data/gsm8k_tools.py --output-dir data/gsm8k_tools [--input-dir /path/to/gsm8k]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Run as a script (examples is not a package): the plain conversion is the sibling file.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gsm8k import DEFAULT_INPUT_DIR, INSTRUCTION, SPLITS, convert_file

from hybrid.data.dataset import write_rows

TOOL_INSTRUCTION = (
    "Use the calculator tool (arithmetic expressions) or the python tool (a program that "
    "prints its result) for every computation instead of doing it in your head. When you "
    'know the answer, end your reply with "#### <number>".'
)
ENVIRONMENT = "tools"


def with_tools(row: dict[str, Any]) -> dict[str, Any]:
    """A converted GSM8K row whose user message asks for tool use; the row is not changed."""
    content = row["prompt"][0]["content"]
    question = content.removesuffix(f" {INSTRUCTION}")
    if question == content:
        raise ValueError(
            f"GSM8K row {row['extra_info']['index']}: the prompt does not end with the plain "
            "instruction of examples/data/gsm8k.py (did its INSTRUCTION change?)"
        )
    return {
        **row,
        "prompt": [{"role": "user", "content": f"{question} {TOOL_INSTRUCTION}"}],
        "extra_info": {**row["extra_info"], "agent_name": ENVIRONMENT},
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Path]:
    """Convert {input_dir}/{train,test}.jsonl; returns the written file of each split."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--input-dir", type=Path, default=DEFAULT_INPUT_DIR)
    args = parser.parse_args(argv)
    written = {}
    for split in SPLITS:
        source = args.input_dir / f"{split}.jsonl"
        if not source.is_file():
            raise FileNotFoundError(f"GSM8K {split} file {source} does not exist")
        rows = [with_tools(row) for row in convert_file(source, split)]
        written[split] = write_rows(rows, args.output_dir / f"{split}.parquet")
        print(f"wrote {len(rows)} rows to {written[split]}")
    return written


if __name__ == "__main__":
    main()
