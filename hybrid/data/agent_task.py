"""The agent demo's task: open a vault whose code only a tool knows.

Every prompt is "?" (the "agent" vocabulary of hybrid/models/tokenizer.py: digits, "?", "@");
every row has its own two-digit code, which the prompt does not contain. The row's
extra_info.tools_kwargs hands the code to the `open_vault` tool (verl's layout; the tool's
hidden parameter), so a model that calls the tool (its turn contains "@") is shown the code and
can repeat it; a model without the tool can only guess (1 in 100). The reward
(examples/agent/vault_reward.py) pays 1 for the code as the final turn and 0.1 for a call that
did not end in the code, the nudge that makes the first calls worth repeating.

`write_agent_task` is what examples/data/agent_task.py (the CLI) and the demo set-up call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hybrid.data.dataset import write_rows

DATA_SOURCE = "agent_vault"
TOOL_NAME = "open_vault"
CODE_DIGITS = 2


def make_rows(num_rows: int, split: str, rng: np.random.Generator) -> list[dict[str, Any]]:
    """`num_rows` prompts "?", each with its own code."""
    codes = rng.integers(0, 10**CODE_DIGITS, size=num_rows).tolist()
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": "?"}],
            "reward_model": {"style": "rule", "ground_truth": f"{code:0{CODE_DIGITS}d}"},
            "extra_info": {
                "split": split,
                "index": index,
                "tools_kwargs": {TOOL_NAME: {"code": f"{code:0{CODE_DIGITS}d}"}},
            },
        }
        for index, code in enumerate(codes)
    ]


def write_agent_task(
    output_dir: str | Path, num_train: int = 1000, num_test: int = 100, seed: int = 0
) -> dict[str, Path]:
    """Write output_dir/train.parquet and test.parquet (train drawn first from one generator
    seeded with `seed`); returns the written file of each split."""
    for name, value in (("num_train", num_train), ("num_test", num_test)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    rng = np.random.default_rng(seed)
    written = {}
    for split, num_rows in (("train", num_train), ("test", num_test)):
        written[split] = write_rows(
            make_rows(num_rows, split, rng), Path(output_dir) / f"{split}.parquet"
        )
    return written
