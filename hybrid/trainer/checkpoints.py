"""Where checkpoints live and which one a resume picks.

`<output_dir>/checkpoints/step_<N>` holds the workers' sharded state plus the driver's
(step, data position). Workers write to a temporary name and rename when complete, so any
`step_<N>` directory present is whole; a kill mid-save leaves the previous one intact.
"""

from __future__ import annotations

import re
from pathlib import Path

_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step_{step}"


def latest_checkpoint(output_dir: str | Path) -> tuple[int, Path] | None:
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return None
    steps = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if p.is_dir() and (m := _STEP_DIR.match(p.name))
    ]
    return max(steps) if steps else None
