"""The `code` reward on the code task's rows, scored the way a run scores them: pass rates and
milliseconds per row for four kinds of response, through `RewardManager` with a reward pool.

Rows come from examples/data/code_task.py (same seed, same rows). Each row is answered four
ways, each a chat-style response with a ```python block:
  - reference: the row's own solution; must score 1.0;
  - wrong: runs cleanly, prints every line off by one; must score 0.0;
  - loop: the right answer, then `while True: pass`; every case hits the row's sandbox time limit (extra_info
    ["sandbox"]["time_s"], 2 s) and scores 0.0. Whether that is a sandbox time-limit fail (a
    score of 0, reward/errors 0) or a reward timeout (reward/errors/timeout, the row gets
    reward.error_score) depends on --timeout-s against cases x time_s; the output says which;
  - flood: prints the right answer, then 2 MiB; the output limit (1 MiB) truncates it, which
    fails the case: must score 0.0.
Every kind is scored in pools of --pools processes, the pools interleaved round by round and
started before the first timed round (a run starts its pool once); medians over --rounds
(--loop-rounds for the loop, whose rows cost seconds each). Exits 1 when a kind's pass rate is
not what it must be. Last line: a JSON object.

    python examples/code_task/check_reward.py [--rows 16] [--pools 2 8] [--rounds 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from hybrid.data import Batch
from hybrid.rewards.manager import RewardError, RewardManager

GENERATOR = Path(__file__).resolve().parents[1] / "data" / "code_task.py"
LOOP = "while True:\n    pass\n"
FLOOD = 'print("x" * (2 << 20))\n'
"""2 MiB on stdout, twice the code reward's default output limit."""
EXPECTED_PASS_RATE = {"reference": 1.0, "wrong": 0.0, "loop": 0.0, "flood": 0.0}


def load_generator() -> ModuleType:
    """examples/data/code_task.py (examples is not a package)."""
    spec = importlib.util.spec_from_file_location("examples_data_code_task", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def responses(generator: ModuleType, row: dict[str, Any]) -> dict[str, str]:
    """The four responses to one row, each a chat-style answer around a ```python block."""
    task = generator.TASKS_BY_NAME[row["extra_info"]["task"]]
    programs = {
        "reference": row["extra_info"]["solution"],
        "wrong": task.off_by_one(),
        "loop": task.reference() + LOOP,
        "flood": task.reference() + FLOOD,
    }
    return {kind: f"Sure.\n```python\n{program}```\nDone." for kind, program in programs.items()}


def batch_of(rows: list[dict[str, Any]], texts: list[str]) -> Batch:
    """The columns a run's batch hands the reward: ground_truth as the dataset gives it (the
    row's object JSON-dumped), extra_info as the row's dict."""
    return Batch.from_dict(
        {},
        {
            "response_text": texts,
            "ground_truth": [json.dumps(row["reward_model"]["ground_truth"]) for row in rows],
            "data_source": [row["data_source"] for row in rows],
            "extra_info": [row["extra_info"] for row in rows],
            "uid": [str(row["extra_info"]["index"]) for row in rows],
        },
    )


def measure(
    kind: str, batch: Batch, managers: dict[str, RewardManager], rounds: int, timeout_s: float
) -> dict[str, Any]:
    """Score `batch` `rounds` times in each pool (interleaved); the last round's reward metrics
    and the median milliseconds per row of each pool."""
    seconds: dict[str, list[float]] = {key: [] for key in managers}
    metrics: dict[str, float] = {}
    for _ in range(rounds):
        for key, manager in managers.items():
            started = time.perf_counter()
            try:
                _, metrics = manager.score(batch)
            except RewardError as error:  # every row failed: what, is in the message
                return {"pass_rate": None, "how": f"every row failed: {error}"}
            seconds[key].append(time.perf_counter() - started)
    entry: dict[str, Any] = {
        "pass_rate": metrics["reward/mean"],
        "cases_passed": metrics["reward/passed"],
        "cases": metrics["reward/total"],
        "errors": metrics["reward/errors"],
        "ms_per_row": {
            key: round(statistics.median(ts) * 1000 / len(batch), 1) for key, ts in seconds.items()
        },
    }
    if kind == "loop":
        entry["how"] = (
            f"reward timeouts (reward.timeout_s {timeout_s:g} s, reward/errors/timeout)"
            if metrics["reward/errors/timeout"]
            else "sandbox time-limit fails (score 0, reward/errors 0)"
        )
    return entry


def as_expected(kind: str, entry: dict[str, Any]) -> bool:
    """The pass rate a kind must have; a loop may instead fail every row as a reward timeout
    (--timeout-s below cases x time_s): that is the other way it can end, not a defect."""
    if entry["pass_rate"] is None:
        return kind == "loop" and "timeout" in entry["how"]
    return bool(entry["pass_rate"] == EXPECTED_PASS_RATE[kind])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--loop-rows", type=int, default=8, help="rows of the loop kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pools", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--loop-rounds", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=60.0, help="reward.timeout_s")
    args = parser.parse_args(argv)
    for name in ("rows", "loop_rows", "rounds", "loop_rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if min(args.pools) < 1:
        parser.error(f"--pools must all be >= 1, got {args.pools}")

    generator = load_generator()
    rows = generator.make_rows(args.rows, 1, args.seed)["train"]
    answers = [responses(generator, row) for row in rows]
    batches = {
        kind: batch_of(rows, [answer[kind] for answer in answers]) for kind in EXPECTED_PASS_RATE
    }
    batches["loop"] = batch_of(
        rows[: args.loop_rows], [a["loop"] for a in answers[: args.loop_rows]]
    )
    managers = {
        f"pool_{n}": RewardManager(None, num_workers=n, timeout_s=args.timeout_s, on_error="score")
        for n in args.pools
    }
    report: dict[str, Any] = {"rows": args.rows, "loop_rows": args.loop_rows, "seed": args.seed}
    try:
        for manager in managers.values():
            manager.score(batches["reference"])  # start the processes; warm the imports
        for kind, batch in batches.items():
            rounds = args.loop_rounds if kind == "loop" else args.rounds
            entry = report[kind] = measure(kind, batch, managers, rounds, args.timeout_s)
            cells = "  ".join(
                f"{k} {ms:7.1f} ms/row" for k, ms in entry.get("ms_per_row", {}).items()
            )
            how = f"  ({entry['how']})" if "how" in entry else ""
            rate = "-" if entry["pass_rate"] is None else f"{entry['pass_rate']:.3f}"
            print(f"{kind:<10} {len(batch):3d} rows  pass rate {rate}  {cells}{how}", flush=True)
    finally:
        for manager in managers.values():
            manager.close()
    print(json.dumps(report), flush=True)
    failures = [kind for kind in EXPECTED_PASS_RATE if not as_expected(kind, report[kind])]
    if failures:
        sys.exit(f"check_reward: not the expected pass rate for {failures}: {EXPECTED_PASS_RATE}")
    return report


if __name__ == "__main__":
    main()
