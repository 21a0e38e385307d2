"""GSM8K raw jsonl to prompt parquet files in verl's layout (see hybrid/data/dataset.py).

Each raw row is {"question", "answer"}, the answer ending in "#### N". Output rows: data_source
"openai/gsm8k", one user message (the question and an instruction to answer after "####"),
reward_model {"style": "rule", "ground_truth": N} with commas removed from N, and extra_info
{split, index, answer}. Same conversion as verl's examples/data_preprocess/gsm8k.py.

    python examples/data/gsm8k.py --output-dir data/gsm8k [--input-dir /path/to/gsm8k]
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybrid.data.dataset import write_rows

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
DEFAULT_INPUT_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "gsm8k"
SPLITS = ("train", "test")
_FINAL_ANSWER = re.compile(r"####\s*(-?[0-9.,]+)")


def convert_row(raw: dict[str, Any], split: str, index: int, where: str) -> dict[str, Any]:
    """One raw GSM8K row to a prompt row; `where` ("file: line n") names it in errors."""
    for key in ("question", "answer"):
        if not isinstance(raw.get(key), str):
            raise ValueError(f"{where}: field {key!r} is missing or not a str")
    match = _FINAL_ANSWER.search(raw["answer"])
    if match is None:
        raise ValueError(f"{where}: field 'answer' has no '#### <number>' final answer")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{raw['question']} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": match.group(1).replace(",", "")},
        "extra_info": {"split": split, "index": index, "answer": raw["answer"]},
    }


def convert_file(path: Path, split: str) -> list[dict[str, Any]]:
    """All rows of one raw jsonl file, in order; blank lines are skipped."""
    rows: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}: line {line_number}"
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON: {e}") from e
            if not isinstance(raw, dict):
                raise ValueError(f"{where}: a {type(raw).__name__}, not an object")
            rows.append(convert_row(raw, split, len(rows), where))
    return rows


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
        rows = convert_file(source, split)
        written[split] = write_rows(rows, args.output_dir / f"{split}.parquet")
        print(f"wrote {len(rows)} rows to {written[split]}")
    return written


if __name__ == "__main__":
    main()
