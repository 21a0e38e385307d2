"""What scoring a step's rows costs: inline on the driver against the reward pool.

Two reward functions over the demo's batch shape (`--rows`, default 128 = 16 prompts x 8):
the built-in arithmetic reward (microseconds a row: the pool's own overhead shows) and one that
waits `--cost-ms` a row (default 50: a sandbox or a remote judge, which waits rather than
computes). Each is scored inline (`reward.num_workers=0`) and in pools of `--pools` processes,
interleaved round by round; the pool's processes are started before the first timed round
(a run starts them once). Medians over `--rounds`. Last line: a JSON object.

    python profiling/bench_rewards.py [--rows 128] [--cost-ms 50] [--pools 2 8] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hybrid.data import Batch
from hybrid.rewards import load_reward_function
from hybrid.rewards.manager import RewardManager

WAITING_REWARD = """
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep({cost_s})
    return float(solution_str.strip() == str(ground_truth))
"""


def demo_batch(rows: int) -> Batch:
    """Rows shaped like the demo's: 'a+b=' answers, half of them right."""
    answers = [str((i % 10 + i // 10 % 10) % 10) for i in range(rows)]
    responses = [a if i % 2 else "0" for i, a in enumerate(answers)]
    return Batch.from_dict(
        {"responses": torch.zeros(rows, 4, dtype=torch.long)},
        {
            "response_text": responses,
            "ground_truth": answers,
            "data_source": ["arithmetic"] * rows,
            "uid": [str(i // 8) for i in range(rows)],
        },
    )


def timed_score(manager: RewardManager, batch: Batch) -> float:
    started = time.perf_counter()
    manager.score(batch)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--cost-ms", type=float, default=50.0)
    parser.add_argument("--pools", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    batch = demo_batch(args.rows)
    report: dict[str, Any] = {"rows": args.rows, "cost_ms": args.cost_ms}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "waiting_reward.py"
        path.write_text(WAITING_REWARD.format(cost_s=args.cost_ms / 1000))
        functions = {"builtin": None, f"wait_{args.cost_ms:g}ms": load_reward_function(str(path))}
        for name, fn in functions.items():
            managers = {"inline": RewardManager(fn, num_workers=0)}
            managers.update({f"pool_{n}": RewardManager(fn, num_workers=n) for n in args.pools})
            for manager in managers.values():
                manager.score(batch)  # start the processes; warm the imports
            times: dict[str, list[float]] = {key: [] for key in managers}
            rounds = args.rounds if fn is None else max(1, args.rounds // 2)
            for _ in range(rounds):
                for key, manager in managers.items():
                    times[key].append(timed_score(manager, batch))
            for manager in managers.values():
                manager.close()
            medians = {key: round(statistics.median(ts), 4) for key, ts in times.items()}
            report[name] = medians
            cells = "  ".join(f"{key} {s * 1000:8.1f} ms" for key, s in medians.items())
            print(f"{name:<14} {args.rows} rows:  {cells}", flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
