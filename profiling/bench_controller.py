"""Overhead of a group call: a no-op ONE_TO_ALL call on 2 workers vs a plain Ray actor call.

Both are measured in the same run, interleaved (A B A B ...), so machine noise hits both alike.
Last line: {"group_call_ms": .., "ray_call_ms": .., "ratio": ..} with medians. Target: ratio <= 2.

    python profiling/bench_controller.py [--iters 300]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

# One thread per process keeps repeats comparable on small shared machines (workers inherit it).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import ray

from hybrid.controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    ensure_ray,
    register,
)


class NoOp(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def noop(self) -> None:
        return None


@ray.remote(num_cpus=0)
class PlainActor:
    def noop(self) -> None:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()

    ensure_ray(num_cpus=4)
    group = RayWorkerGroup(RayResourcePool([2]), RayClassWithInitArgs(NoOp))
    plain = PlainActor.remote()
    ray.get(plain.noop.remote())

    def time_group() -> float:
        start = time.perf_counter()
        group.noop()
        return time.perf_counter() - start

    def time_plain() -> float:
        start = time.perf_counter()
        ray.get(plain.noop.remote())
        return time.perf_counter() - start

    for _ in range(args.warmup):
        time_group()
        time_plain()
    group_s, plain_s = [], []
    for i in range(args.iters):
        group_s.append(time_group())
        plain_s.append(time_plain())
        if (i + 1) % 100 == 0:
            print(f"  {i + 1}/{args.iters} pairs", flush=True)
    group.shutdown()
    ray.kill(plain)

    group_ms = statistics.median(group_s) * 1e3
    ray_ms = statistics.median(plain_s) * 1e3
    print(
        f"group call (2 workers): median {group_ms:.3f} ms, p90 {statistics.quantiles(group_s, n=10)[-1] * 1e3:.3f} ms"
    )
    print(
        f"plain ray actor call:   median {ray_ms:.3f} ms, p90 {statistics.quantiles(plain_s, n=10)[-1] * 1e3:.3f} ms"
    )
    print(
        json.dumps(
            {
                "group_call_ms": round(group_ms, 3),
                "ray_call_ms": round(ray_ms, 3),
                "ratio": round(group_ms / ray_ms, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
