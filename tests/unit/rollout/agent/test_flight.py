"""Agent trajectories through RolloutHost over a scripted engine (no vLLM: the engine's answer
is a function of its request, so each test can say exactly which tokens a trajectory must hold).

What must hold: token-in/token-out (the trajectory is prompt + sampled + reply tokens, the reply
rendered alone), the loss mask covers exactly the sampled tokens, context tokens carry no
log-prob and no version, tool calls run while the engine steps others, every budget cut is
marked, a sync mid-turn leaves per-token versions that say so, bad rows are named.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from hybrid.data import Batch
from hybrid.data.sample import NO_VERSION, SampleStatus, samples_to_batch
from hybrid.models.tokenizer import build_tokenizer
from hybrid.rollout.agent.config import AgentConfig
from hybrid.rollout.agent.stats import agent_metrics
from hybrid.rollout.base import Continuation, GeneratedSample
from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.group import RolloutGroup
from hybrid.rollout.host import RolloutHost

pytestmark = pytest.mark.unit

CALL = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
ANSWER = "3"

TOOLS_FILE = """
import time

TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "a + b",
     "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
     "b": {"type": "integer"}}, "required": ["a", "b"]}}},
]


def add(a, b, *, delay=0.0):
    time.sleep(delay)
    return str(a + b)
"""


class ScriptedEngine:
    """One token per request per step. A request whose context holds no tool reply yet says
    CALL, then the end of turn; one that holds a reply says ANSWER, then the end of turn."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos = int(tokenizer.eos_token_id)
        self.live: dict[str, tuple[list[int], int]] = {}
        self.requests: list[Continuation] = []

    def _script(self, context: list[int]) -> list[int]:
        seen = self.tokenizer.decode(context)
        text = ANSWER if "<|im_start|>tool" in seen else CALL
        return [*self.tokenizer.encode(text, add_special_tokens=False), self.eos]

    def submit(self, request_id: str, request: Continuation) -> None:
        self.requests.append(request)
        self.live[request_id] = (list(request.token_ids), request.max_tokens)

    def has_unfinished(self) -> bool:
        return bool(self.live)

    def abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.live.pop(request_id, None)

    def step(self) -> list[tuple[str, GeneratedSample, bool]]:
        out = []
        for request_id, (tokens, left) in list(self.live.items()):
            # The turn's own tokens so far: what follows the last generation prompt.
            start = _turn_start(tokens, self.tokenizer)
            script = self._script(tokens[:start])
            token = script[len(tokens) - start]
            stopped = token == self.eos
            finished = stopped or left == 1
            out.append((request_id, GeneratedSample([token], [-0.5], "", stopped), finished))
            if finished:
                del self.live[request_id]
            else:
                self.live[request_id] = ([*tokens, token], left - 1)
        return out

    def generate(self, *args: Any, **kwargs: Any) -> list[GeneratedSample]:
        raise AssertionError("an agent run drives the engine step by step")


def _turn_start(tokens: list[int], tokenizer: Any) -> int:
    """Index after the last "<|im_start|>assistant\\n" (where the current turn began)."""
    marker = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    for i in range(len(tokens) - len(marker), -1, -1):
        if tokens[i : i + len(marker)] == marker:
            return i + len(marker)
    raise AssertionError("no generation prompt in the request")


def make_host(tmp_path: Path, **agent: Any) -> tuple[RolloutHost, ScriptedEngine, Any]:
    tools = tmp_path / "tools.py"
    tools.write_text(TOOLS_FILE)
    tokenizer = build_tokenizer("text")
    settings = {"enabled": True, "tools_file": str(tools), **agent}
    config = RolloutConfig(
        max_model_len=400,
        prompt_length=40,
        response_length=int(settings.pop("response_length", 200)),
        n=int(settings.pop("n", 2)),
        agent=AgentConfig(**settings),
    )
    engine = ScriptedEngine(tokenizer)
    host = RolloutHost(engine, tokenizer, RolloutGroup(0, 1, 0, 1), config)  # type: ignore[arg-type]
    return host, engine, tokenizer


def prompts(
    tokenizer: Any, rows: int, extra_infos: Sequence[dict[str, Any]] | None = None
) -> Batch:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "1+2?"}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    width = 40
    input_ids = torch.full((rows, width), int(tokenizer.pad_token_id))
    input_ids[:, width - len(ids) :] = torch.tensor(ids)
    mask = (input_ids != tokenizer.pad_token_id).long()
    non_tensors: dict[str, list[Any]] = {"uid": [f"p{i}" for i in range(rows)]}
    non_tensors["extra_info"] = list(extra_infos or [{} for _ in range(rows)])
    return Batch.from_dict({"input_ids": input_ids, "attention_mask": mask}, non_tensors)


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_a_trajectory_is_the_sampled_and_the_reply_tokens_exactly(tmp_path: Path) -> None:
    host, _, tok = make_host(tmp_path)
    samples = host.generate(prompts(tok, 1), None, version=7)
    assert len(samples) == 2
    eos = [int(tok.eos_token_id)]
    call, answer = encode(tok, CALL) + eos, encode(tok, ANSWER) + eos
    reply = encode(tok, "\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n")
    for sample in samples:
        assert sample.status is SampleStatus.COMPLETED
        assert sample.response_ids == call + reply + answer
        assert sample.loss_mask == [1] * len(call) + [0] * len(reply) + [1] * len(answer)
        assert sample.rollout_log_probs == [-0.5] * len(call) + [0.0] * len(reply) + [-0.5] * len(
            answer
        )
        assert sample.versions == [7] * len(call) + [NO_VERSION] * len(reply) + [7] * len(answer)
        assert sample.agent_stats is not None
        assert sample.agent_stats["turns"] == 2 and sample.agent_stats["tool_calls"] == 1
        assert sample.agent_stats["final_text"] == ANSWER


def test_the_batch_attends_to_replies_and_trains_only_sampled_tokens(tmp_path: Path) -> None:
    host, _, tok = make_host(tmp_path)
    samples = host.generate(prompts(tok, 1), None, version=0)
    batch = samples_to_batch(samples, 200, int(tok.pad_token_id), 40)
    mask, real = batch["response_mask"], batch["attention_mask"][:, 40:]
    n = samples[0].response_length
    assert int(real[0].sum()) == n and bool(real[0, :n].all())
    assert mask[0, :n].tolist() == samples[0].loss_mask
    assert int(mask[0, n:].sum()) == 0
    assert batch["env_rewards"].shape == mask.shape
    assert batch["agent_stats"][0]["tool_calls"] == 1


def test_tool_calls_run_while_the_engine_steps(tmp_path: Path) -> None:
    """8 trajectories, each one call of 0.3 s: one after another they would take 2.4 s."""
    rows = [{"tools_kwargs": {"add": {"delay": 0.3}}} for _ in range(4)]
    host, _, tok = make_host(tmp_path)
    started = time.perf_counter()
    samples = host.generate(prompts(tok, 4, rows), None, version=0)
    elapsed = time.perf_counter() - started
    assert len(samples) == 8 and all(s.agent_stats["tool_calls"] == 1 for s in samples)
    assert elapsed < 1.5, f"8 calls of 0.3 s took {elapsed:.2f} s: they ran one after another"


def test_a_tool_past_its_deadline_becomes_a_tool_message(tmp_path: Path) -> None:
    rows = [{"tools_kwargs": {"add": {"delay": 30.0}}}]
    host, _, tok = make_host(tmp_path, tool_timeout_s=0.3)
    started = time.perf_counter()
    samples = host.generate(prompts(tok, 1, rows), None, version=0)
    assert time.perf_counter() - started < 5
    stats = samples[0].agent_stats
    assert stats is not None and stats["errors"] == {"timeout": 1}
    assert "<|im_start|>tool\n" in tok.decode(samples[0].response_ids)
    assert agent_metrics([s.agent_stats for s in samples])["agent/tool_errors/timeout"] == 2.0


def test_budgets_end_trajectories_and_say_why(tmp_path: Path) -> None:
    host, _, tok = make_host(tmp_path, response_length=80)  # the call fits, the reply does not
    samples = host.generate(prompts(tok, 1), None, version=0)
    assert {s.status for s in samples} == {SampleStatus.TRUNCATED}
    assert {s.agent_stats["truncated"] for s in samples} == {"tokens"}
    host, _, tok = make_host(tmp_path, max_turns=1)
    samples = host.generate(prompts(tok, 1), None, version=0)
    assert {s.agent_stats["truncated"] for s in samples} == {"turns"}
    metrics = agent_metrics([s.agent_stats for s in samples])
    assert metrics["agent/truncated"] == 2.0 and metrics["agent/truncated/turns"] == 2.0


def test_a_sync_mid_turn_shows_in_the_versions(tmp_path: Path) -> None:
    host, _, tok = make_host(tmp_path, n=1)
    streamed = host.stream(prompts(tok, 1), max_steps=5, version=1)
    assert streamed.groups == [] and streamed.pending_groups == 1
    host.interrupt()  # the weights change here
    streamed = host.stream(None, max_steps=None, version=2)
    (sample,) = streamed.groups[0]
    sampled = [v for v in sample.versions if v != NO_VERSION]
    assert sampled[:5] == [1] * 5 and set(sampled[5:]) == {2}
    assert sample.status is SampleStatus.COMPLETED


def test_a_row_naming_an_unknown_environment_is_refused(tmp_path: Path) -> None:
    host, _, tok = make_host(tmp_path)
    with pytest.raises(ValueError, match=r"prompt p0: extra_info.agent_name 'shop'"):
        host.generate(prompts(tok, 1, [{"agent_name": "shop"}]), None, version=0)
