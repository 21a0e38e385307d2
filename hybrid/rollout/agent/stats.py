"""What the agent loop counts: per trajectory while it runs (`TrajectoryStats`, kept on the
Sample as `agent_stats`), and per step over a batch (`agent_metrics`, pure).

Step metrics (every mode alike; docs/agents.md says how to read them):
  agent/turns/mean, agent/turns/max          model turns per trajectory
  agent/tool_calls_mean                      tool calls per trajectory
  agent/tool_call_rate                       fraction of trajectories that called a tool
  agent/tool_errors/<kind>                   failed calls by kind (timeout, error, bad_json,
                                             unknown_tool, bad_arguments); bad_json counts
                                             malformed call blocks too
  agent/env_errors                           environment replies that raised or timed out
  agent/tool_latency_s/p50, /max             wall time of the tool calls
  agent/context_token_fraction               response tokens that are tool/environment replies
  agent/truncated, agent/truncated/<why>     trajectories a budget cut (turns, tokens, context,
                                             env_error)
  agent/env_reward_mean                      the environments' per-turn rewards, summed per
                                             trajectory
  agent/multi_version_trajectories           trajectories whose model tokens were sampled by
                                             more than one weight version (a sync landed
                                             mid-trajectory: fully_async)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hybrid.data.sample import Sample
from hybrid.rollout.agent.environment import EnvReply
from hybrid.rollout.agent.tools import TOOL_ERROR_KINDS

TRUNCATION_REASONS = ("turns", "tokens", "context", "env_error")
COUNTED = ("agent/tool_errors/", "agent/truncated", "agent/env_errors", "agent/multi_version")
"""Prefixes of the metrics that count events (a step that trains several batches sums them)."""


@dataclass
class TrajectoryStats:
    turns: int = 0
    tool_calls: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    tool_seconds: list[float] = field(default_factory=list)
    env_seconds: list[float] = field(default_factory=list)
    env_errors: int = 0
    truncated: str | None = None

    def add_reply(self, reply: EnvReply) -> None:
        self.tool_calls += len(reply.tool_results) + reply.malformed_calls
        for result in reply.tool_results:
            self.tool_seconds.append(result.seconds)
            if result.error is not None:
                self.errors[result.error] = self.errors.get(result.error, 0) + 1
        if reply.malformed_calls:
            self.errors["bad_json"] = self.errors.get("bad_json", 0) + reply.malformed_calls

    def count_env_error(self, kind: str) -> None:
        key = f"env_{kind.strip() or 'error'}"
        self.errors[key] = self.errors.get(key, 0) + 1

    def summary(self, sample: Sample, final_text: str) -> dict[str, Any]:
        """The Sample's `agent_stats`: plain values (they travel through Ray and the batch).
        `final_text`: the model's last turn, decoded (what a reward reads as the answer)."""
        mask = sample.model_mask
        return {
            "final_text": final_text,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "errors": dict(self.errors),
            "tool_seconds": list(self.tool_seconds),
            "env_errors": self.env_errors,
            "truncated": self.truncated,
            "context_tokens": len(mask) - sum(mask),
            "response_tokens": len(mask),
            "env_reward": float(sum(sample.token_rewards or [])),
            "versions": sorted({v for v, m in zip(sample.versions, mask, strict=True) if m}),
        }


def agent_metrics(stats: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The step's agent/ metrics over its trajectories' `agent_stats`."""
    n = max(len(stats), 1)
    latencies = [s for st in stats for s in st["tool_seconds"]]
    response_tokens = sum(st["response_tokens"] for st in stats)
    metrics = {
        "agent/turns/mean": sum(st["turns"] for st in stats) / n,
        "agent/turns/max": float(max((st["turns"] for st in stats), default=0)),
        "agent/tool_calls_mean": sum(st["tool_calls"] for st in stats) / n,
        "agent/tool_call_rate": sum(st["tool_calls"] > 0 for st in stats) / n,
        "agent/env_errors": float(sum(st["env_errors"] for st in stats)),
        "agent/tool_latency_s/p50": statistics.median(latencies) if latencies else 0.0,
        "agent/tool_latency_s/max": max(latencies, default=0.0),
        "agent/context_token_fraction": (
            sum(st["context_tokens"] for st in stats) / response_tokens if response_tokens else 0.0
        ),
        "agent/truncated": float(sum(st["truncated"] is not None for st in stats)),
        "agent/env_reward_mean": sum(st["env_reward"] for st in stats) / n,
        "agent/multi_version_trajectories": float(sum(len(st["versions"]) > 1 for st in stats)),
    }
    for kind in TOOL_ERROR_KINDS:
        metrics[f"agent/tool_errors/{kind}"] = float(sum(st["errors"].get(kind, 0) for st in stats))
    for why in TRUNCATION_REASONS:
        metrics[f"agent/truncated/{why}"] = float(sum(st["truncated"] == why for st in stats))
    return metrics
