"""Do tool calls overlap with each other and with generation in an agent rollout?

Acceptance: with 16 trajectories each making one tool call that takes 500 ms, the rollout takes
less than 1.5 s longer than with a 0 ms tool (the calls made one after another would add 8 s).

The set-up: a tiny Qwen2 (the "text" vocabulary: ChatML template) in the real vLLM engine,
in this process (CPU), driven by RolloutHost.generate with rollout.agent on and one environment,
`SleepyTool` (this file, named by rollout.agent.environments). Every trajectory's first turn is
answered by ONE tool call that sleeps `sleep_ms` (its prompt row's extra_info) and runs through
the tool path of the tools environment (hybrid.rollout.agent.tools.call_tool: a thread, a
deadline, an output budget); its second turn is the answer (done). The engine ignores the end
of sequence and every turn stops at rollout.agent.max_turn_tokens (a turn cut there still goes
to the environment), so every trajectory is two equal turns and the two arms differ only in the
tool's sleep. Rollouts alternate 0 ms / --tool-ms (A B A B, after one warm-up of each); the
table shows the median wall time of `generate` per arm, the difference, the tool calls made
per rollout (checked: one per trajectory) and the bound a serial tool loop would add.
Last line: a JSON object with every figure.

    python profiling/bench_agent_overlap.py [--tool-ms 500] [--prompts 16] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hybrid.data import Batch
from hybrid.data.prompts import left_pad
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.models.tokenizer import load_tokenizer
from hybrid.rollout.agent.config import AgentConfig
from hybrid.rollout.agent.environment import EnvReply
from hybrid.rollout.agent.tools import Tool, ToolCall, call_tool
from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.group import RolloutGroup
from hybrid.rollout.host import RolloutHost
from hybrid.rollout.vllm_engine import VllmEngine

TOOL_TIMEOUT_S = 10.0
ACCEPTANCE_S = 1.5
SCHEMA = {
    "type": "function",
    "function": {
        "name": "sleep",
        "description": "Wait a while, then say so.",
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
}


class SleepyTool:
    """The benchmark's environment: one tool call of extra_info["sleep_ms"] after the first
    turn, done after the second."""

    def __init__(self, extra_info: dict[str, Any]) -> None:
        seconds = float(extra_info["sleep_ms"]) / 1000

        def sleep() -> str:
            time.sleep(seconds)
            return "done"

        self.tools = {"sleep": Tool("sleep", sleep, SCHEMA)}
        self.replies = 0

    def reply(self, turn_text: str) -> EnvReply:
        self.replies += 1
        if self.replies > 1:
            return EnvReply(messages=[], done=True)
        result = call_tool(self.tools, ToolCall("sleep", {}), {}, TOOL_TIMEOUT_S, 100)
        message = {"role": "tool", "name": result.name, "content": result.content}
        return EnvReply(messages=[message], tool_results=[result])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tool-ms", type=int, default=500, help="the slow arm's tool sleep")
    parser.add_argument("--prompts", type=int, default=16, help="trajectories per rollout (n=1)")
    parser.add_argument("--repeats", type=int, default=7, help="timed rollouts per arm")
    parser.add_argument("--turn-tokens", type=int, default=8, help="tokens per model turn")
    args = parser.parse_args(argv)
    if not 0 < args.tool_ms < TOOL_TIMEOUT_S * 1000:
        parser.error(f"--tool-ms must be in 1 .. {int(TOOL_TIMEOUT_S * 1000) - 1}")
    for name in ("prompts", "repeats", "turn_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def start_process_group() -> None:
    """A world of one (VllmEngine is built after torch.distributed is initialised)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
    )
    dist.init_process_group("gloo")


def rollout_config(args: argparse.Namespace) -> RolloutConfig:
    """Two equal turns per trajectory (the engine ignores EOS, turns stop at
    --turn-tokens), the SleepyTool environment for every row."""
    prompt_length = 48
    # Two turns and one reply (the template's end of turn, the tool message, the next
    # assistant header: ~30 tokens) with room to spare.
    response_length = 2 * args.turn_tokens + 64
    agent = AgentConfig(
        enabled=True,
        environments={"sleepy": f"{Path(__file__).resolve()}:SleepyTool"},
        default_environment="sleepy",
        max_turns=2,
        max_turn_tokens=args.turn_tokens,
        tool_timeout_s=TOOL_TIMEOUT_S,
        env_timeout_s=4 * TOOL_TIMEOUT_S,
    )
    return RolloutConfig(
        dtype="float32",
        n=1,
        prompt_length=prompt_length,
        response_length=response_length,
        max_model_len=prompt_length + response_length,
        load_format="auto",
        kv_cache_memory_bytes=32 << 20,
        ignore_eos=True,
        agent=agent,
    )


def prompt_batch(tokenizer: Any, num_prompts: int, prompt_length: int, sleep_ms: int) -> Batch:
    """`num_prompts` ChatML prompt rows whose tool sleeps `sleep_ms`."""
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {i} + {i}?"}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for i in range(num_prompts)
    ]
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    columns: dict[str, list[Any]] = {
        "uid": [f"p{i}" for i in range(num_prompts)],
        "extra_info": [{"sleep_ms": sleep_ms} for _ in range(num_prompts)],
    }
    batch = left_pad(ids, prompt_length, tokenizer.pad_token_id)
    return batch.union(Batch.from_dict({}, columns))


def time_rollouts(
    host: RolloutHost, arms: dict[int, Batch], args: argparse.Namespace
) -> tuple[dict[int, list[float]], dict[int, list[int]]]:
    """Seconds and tool calls of each timed rollout per arm, the arms alternating; every
    trajectory must make one call and two turns."""
    seconds: dict[int, list[float]] = {ms: [] for ms in arms}
    calls: dict[int, list[int]] = {ms: [] for ms in arms}
    for round_index in range(args.repeats + 1):  # round 0 warms up
        for ms, batch in arms.items():
            start = time.perf_counter()
            samples = host.generate(batch, None, version=0)
            elapsed = time.perf_counter() - start
            stats = [s.agent_stats or {} for s in samples]  # None: not a trajectory
            made = sum(int(st.get("tool_calls", 0)) for st in stats)
            turns = sorted({int(st.get("turns", 0)) for st in stats})
            print(
                f"  round {round_index}/{args.repeats} tool {ms} ms: {elapsed:.3f} s, "
                f"{made} tool calls, turns {turns}",
                flush=True,
            )
            if len(samples) != args.prompts or made != args.prompts or turns != [2]:
                raise AssertionError(
                    f"expected {args.prompts} trajectories of 2 turns and 1 tool call each, got "
                    f"{len(samples)} trajectories, {made} calls, turns {turns}"
                )
            if round_index:
                seconds[ms].append(elapsed)
                calls[ms].append(made)
    return seconds, calls


def report(
    args: argparse.Namespace, seconds: dict[int, list[float]], calls: dict[int, list[int]]
) -> dict[str, Any]:
    """Print the table and the acceptance line; the figures as a dict."""
    medians = {ms: statistics.median(values) for ms, values in seconds.items()}
    difference = medians[args.tool_ms] - medians[0]
    serial = args.prompts * args.tool_ms / 1000
    print(f"\n{args.prompts} trajectories x 1 tool call, {args.repeats} rollouts per arm")
    header = ("tool ms", "median rollout s", "vs 0 ms", "tool calls", "serial bound s")
    print(f"{header[0]:>8} {header[1]:>17} {header[2]:>9} {header[3]:>11} {header[4]:>15}")
    for ms, median in medians.items():
        print(
            f"{ms:>8} {median:>17.3f} {median - medians[0]:>+9.3f} "
            f"{statistics.median(calls[ms]):>11.0f} {args.prompts * ms / 1000:>15.1f}"
        )
    passed = difference < ACCEPTANCE_S
    print(
        f"acceptance: the {args.tool_ms} ms tool adds {difference:.3f} s "
        f"({'<' if passed else '>='} {ACCEPTANCE_S} s; calls one after another: {serial:.1f} s): "
        f"{'PASS' if passed else 'FAIL'}"
    )
    return {
        "prompts": args.prompts,
        "tool_ms": args.tool_ms,
        "repeats": args.repeats,
        "turn_tokens": args.turn_tokens,
        "median_s": {str(ms): round(value, 4) for ms, value in medians.items()},
        "seconds": {str(ms): [round(v, 4) for v in values] for ms, values in seconds.items()},
        "difference_s": round(difference, 4),
        "serial_bound_s": serial,
        "tool_calls_per_rollout": {str(ms): values for ms, values in calls.items()},
        "passed": passed,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    config = rollout_config(args)
    start_process_group()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = build_tiny_model(
                Path(tmp) / "model", TinyModelConfig.preset("tiny", vocab="text"), seed=0
            )
            tokenizer = load_tokenizer(model_dir)
            engine = VllmEngine(str(model_dir), config, torch.device("cpu"), "float32")
            try:
                host = RolloutHost(engine, tokenizer, RolloutGroup(0, 1, 0, 1), config)
                arms = {
                    ms: prompt_batch(tokenizer, args.prompts, config.prompt_length, ms)
                    for ms in (0, args.tool_ms)
                }
                seconds, calls = time_rollouts(host, arms, args)
            finally:
                engine.shutdown()
    finally:
        if dist.is_initialized():  # the engine's shutdown may have ended it
            dist.destroy_process_group()
    result = report(args, seconds, calls)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
