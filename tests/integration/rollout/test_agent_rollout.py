"""Agent trajectories on the real engine: token-in/token-out, the loss mask, per-token versions
across a weight sync, and the engine's log-probs against transformers' across turns.

The child process drives VllmEngine through RolloutHost.stream, exactly as the fully-async
explorer does, with the agent demo's vault tool and parser (examples/agent/): one engine step
under version 0, then the weights change (the requests leave the engine, perturbed weights are
loaded in place) and the trajectories run to their end under version 1, their tool calls
answered meanwhile. Every request the engine got and every token it returned is logged. The
parent checks that:
- each trajectory is its last request's tokens plus what the engine returned for it, and every
  request was the trajectory so far: what the trainer sees is what the engine saw, bit for bit;
- the loss mask is 1 exactly on the tokens the engine returned; the rest (tool replies) carry
  log-prob 0 and no version, and are the template's rendering of the tool message;
- every model token's rollout log-prob is transformers' under its own version's weights, given
  the whole trajectory before it (tool tokens included);
- some trajectory holds tokens of both versions (the sync landed mid-trajectory).
vLLM runs in a child process for the reason given in tests/integration/models/test_tiny_model_vllm.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybrid.data.agent_task import write_agent_task
from hybrid.data.sample import NO_VERSION
from hybrid.models import TinyModelConfig, build_tiny_model
from tests.forked import check_python

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

LOGPROB_ATOL = 1e-3  # fp32 on both sides
PERTURBATION = 0.05
ROOT = Path(__file__).resolve().parents[3]

_CHILD = """
import json, sys
import torch
from safetensors.torch import load_file

model_dir, data_file, out_path, scale = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
from tests.integration.rollout.engine_child import start_single_rank_world
start_single_rank_world()

from hybrid.data import PromptDataset
from hybrid.data.prompts import left_pad
from hybrid.data import Batch
from hybrid.models.tokenizer import load_tokenizer
from hybrid.rollout.agent.config import AgentConfig
from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.group import RolloutGroup
from hybrid.rollout.host import RolloutHost
from hybrid.rollout.vllm_engine import VllmEngine

agent = AgentConfig(enabled=True, tools_file="examples/agent/vault_tools.py",
                    tool_parser="examples/agent/vault_tools.py:VaultParser",
                    max_turns=3, max_turn_tokens=2)
config = RolloutConfig(dtype="float32", response_length=16, prompt_length=8, max_model_len=64,
                       n=16, load_format="auto", kv_cache_memory_bytes=32 << 20, agent=agent)
tokenizer = load_tokenizer(model_dir)
engine = VllmEngine(model_dir, config, torch.device("cpu"), "float32")
requests, outputs = {}, {}
submit, step = engine.submit, engine.step
def logged_submit(request_id, request):
    requests[request_id] = list(request.token_ids)
    submit(request_id, request)
def logged_step():
    out = step()
    for request_id, new, _ in out:
        outputs.setdefault(request_id, []).extend(new.token_ids)
    return out
engine.submit, engine.step = logged_submit, logged_step
host = RolloutHost(engine, tokenizer, RolloutGroup(0, 1, 0, 1), config)

rows = PromptDataset([data_file], tokenizer, 8).rows[:8]
prompts = left_pad([r.token_ids for r in rows], 8, tokenizer.pad_token_id)
prompts = prompts.union(Batch.from_dict({}, {"uid": [f"p{i}" for i in range(len(rows))],
                                             "extra_info": [r.extra_info for r in rows]}))
groups = host.stream(prompts, max_steps=1, version=0).groups
host.interrupt()
weights = load_file(model_dir + "/model.safetensors")
noise = torch.Generator().manual_seed(1)
engine.load_weights([(k, v + scale * torch.randn(v.shape, generator=noise)) for k, v in weights.items()])
engine.reset_prefix_cache()
groups += host.stream(None, max_steps=None, version=1).groups
torch.save({k: v + 0 for k, v in weights.items()}, out_path + ".v0")
noise = torch.Generator().manual_seed(1)
torch.save({k: v + scale * torch.randn(v.shape, generator=noise) for k, v in weights.items()},
           out_path + ".v1")
samples = [s for g in groups for s in g]
codes = {r.extra_info["tools_kwargs"]["open_vault"]["code"] for r in rows}
message = lambda code: [{"role": "tool", "name": "open_vault", "content": code}]
replies = {code: [host.renderer.reply_tokens(message(code), stopped) for stopped in (True, False)]
           for code in codes}
json.dump({
    "requests": requests, "outputs": outputs, "replies": replies,
    "samples": [{"uid": s.uid, "index": s.index, "prompt": s.prompt_ids, "response": s.response_ids,
                 "mask": s.loss_mask, "log_probs": s.rollout_log_probs, "versions": s.versions,
                 "stats": s.agent_stats, "code": s.metadata["extra_info"]["tools_kwargs"]["open_vault"]["code"]}
                for s in samples],
}, open(out_path, "w"))
engine.shutdown()
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("agent")
    model_dir = build_tiny_model(
        root / "model", TinyModelConfig.preset("tiny", vocab="agent", dtype="float32"), seed=0
    )
    data = write_agent_task(root / "data", num_train=8, num_test=1)
    out = root / "out.json"
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    check_python(
        _CHILD, str(model_dir), str(data["train"]), str(out), str(PERTURBATION),
        env=env, cwd=ROOT, timeout=240,
    )  # fmt: skip
    result = json.loads(out.read_text())
    result["model_dir"] = str(model_dir)
    result["weights"] = [str(out) + ".v0", str(out) + ".v1"]
    return result


def test_every_trajectory_ended_and_some_called_the_tool(run: dict) -> None:
    samples = run["samples"]
    assert len(samples) == 8 * 16
    calls = [s for s in samples if s["stats"]["tool_calls"] > 0]
    assert calls, "no trajectory called the tool: the checks below would check nothing"


def test_trained_tokens_are_what_the_engine_saw(run: dict) -> None:
    requests, outputs = run["requests"], run["outputs"]
    for s in run["samples"]:
        mine = sorted(
            (rid for rid in requests if rid.startswith(f"{s['uid']}#{s['index']}.")),
            key=lambda rid: int(rid.rsplit(".", 1)[1]),
        )
        trajectory = s["prompt"] + s["response"]
        sampled = [0] * len(s["response"])
        for rid in mine:
            seen = requests[rid]
            assert trajectory[: len(seen)] == seen, (
                f"{rid}: the request is not the trajectory so far"
            )
            returned = outputs.get(rid, [])
            start = len(seen) - len(s["prompt"])
            assert s["response"][start : start + len(returned)] == returned, rid
            sampled[start : start + len(returned)] = [1] * len(returned)
        last = requests[mine[-1]] + outputs.get(mine[-1], [])
        assert trajectory == last, "the trajectory ends with its last request's output"
        assert s["mask"] == sampled, "the loss mask is 1 exactly on the engine's tokens"


def test_context_tokens_are_the_rendered_reply_with_no_log_prob_or_version(run: dict) -> None:
    checked = 0
    for s in run["samples"]:
        context = [t for t, m in zip(s["response"], s["mask"], strict=True) if m == 0]
        if not context:
            continue
        # The first reply, rendered alone: after a turn that ended on its own or was cut.
        assert any(context[: len(r)] == r for r in run["replies"][s["code"]]), context
        for lp, v, m in zip(s["log_probs"], s["versions"], s["mask"], strict=True):
            if m == 0:
                assert lp == 0.0 and v == NO_VERSION
        checked += 1
    assert checked > 0


def test_log_probs_match_transformers_across_turns(run: dict) -> None:
    models = []
    for path in run["weights"]:
        model = AutoModelForCausalLM.from_pretrained(run["model_dir"], torch_dtype=torch.float32)
        model.load_state_dict(torch.load(path), strict=False)
        models.append(model.eval())
    worst = 0.0
    for s in run["samples"]:
        ids = torch.tensor([s["prompt"] + s["response"]])
        p = len(s["prompt"])
        for version, model in enumerate(models):
            with torch.no_grad():
                logits = model(ids).logits[0].float()
            log_probs = torch.log_softmax(logits, dim=-1)
            for j, (token, v, m) in enumerate(
                zip(s["response"], s["versions"], s["mask"], strict=True)
            ):
                if m and v == version:
                    expected = float(log_probs[p + j - 1, token])
                    worst = max(worst, abs(expected - s["log_probs"][j]))
    assert worst < LOGPROB_ATOL, f"max |engine - transformers| = {worst:.2e}"


def test_the_sync_landed_mid_trajectory(run: dict) -> None:
    both = [
        s
        for s in run["samples"]
        if {v for v, m in zip(s["versions"], s["mask"], strict=True) if m} == {0, 1}
    ]
    assert both, "no trajectory holds tokens of both versions"


# --- tools that misbehave, on the real engine --------------------------------------------------

MISBEHAVING_TOOLS = '''
import time

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "look it up",
          "parameters": {"type": "object", "properties": {}, "required": []}}}]


def lookup(*, mode):
    if mode == "sleep":
        time.sleep(60)
    if mode == "raise":
        raise RuntimeError("the index is gone")
    if mode == "huge":
        return "x" * 10_000_000
    return "found it"


class AlwaysCall:
    """Every turn calls lookup (a random model would rarely write a call itself)."""

    def parse(self, text):
        from hybrid.rollout.agent.parsers import ParsedTurn
        from hybrid.rollout.agent.tools import ToolCall

        return ParsedTurn(calls=[ToolCall("lookup", {})], errors=[])
'''
MODES = ("sleep", "raise", "huge", "ok")
TOOL_TIMEOUT_S = 0.5
MAX_OUTPUT_CHARS = 64

_MISBEHAVING_CHILD = """
import json, sys, time
import torch

model_dir, tools, out_path, modes, timeout_s, max_chars = sys.argv[1:7]
modes = json.loads(modes)
from tests.integration.rollout.engine_child import start_single_rank_world
start_single_rank_world()

from hybrid.data import Batch
from hybrid.data.prompts import chat_prompts
from hybrid.models.tokenizer import load_tokenizer
from hybrid.rollout.agent.config import AgentConfig
from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.group import RolloutGroup
from hybrid.rollout.host import RolloutHost
from hybrid.rollout.vllm_engine import VllmEngine

agent = AgentConfig(enabled=True, tools_file=tools, tool_parser=tools + ":AlwaysCall", max_turns=2,
                    max_turn_tokens=4, tool_timeout_s=float(timeout_s),
                    max_tool_output_chars=int(max_chars))
config = RolloutConfig(dtype="float32", response_length=200, prompt_length=32, max_model_len=256,
                       n=2, load_format="auto", kv_cache_memory_bytes=32 << 20, agent=agent)
tokenizer = load_tokenizer(model_dir)
engine = VllmEngine(model_dir, config, torch.device("cpu"), "float32")
host = RolloutHost(engine, tokenizer, RolloutGroup(0, 1, 0, 1), config)
prompts = chat_prompts(tokenizer, ["find it"] * len(modes), 32)
infos = [{"tools_kwargs": {"lookup": {"mode": mode}}} for mode in modes]
prompts = prompts.union(Batch.from_dict({}, {"extra_info": infos}))
started = time.perf_counter()
samples = host.generate(prompts, None, version=0)
seconds = time.perf_counter() - started
json.dump({
    "seconds": seconds,
    "samples": [{"mode": s.metadata["extra_info"]["tools_kwargs"]["lookup"]["mode"],
                 "context": tokenizer.decode([t for t, m in zip(s.response_ids, s.loss_mask) if not m]),
                 "stats": s.agent_stats, "status": s.status.value} for s in samples],
}, open(out_path, "w"))
engine.shutdown()
"""


@pytest.fixture(scope="module")
def misbehaving(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("misbehaving")
    model_dir = build_tiny_model(
        root / "model", TinyModelConfig.preset("tiny", vocab="text", dtype="float32"), seed=0
    )
    tools = root / "tools.py"
    tools.write_text(MISBEHAVING_TOOLS)
    out = root / "out.json"
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    args = [str(model_dir), str(tools), str(out), json.dumps(MODES), str(TOOL_TIMEOUT_S)]
    check_python(_MISBEHAVING_CHILD, *args, str(MAX_OUTPUT_CHARS), env=env, cwd=ROOT, timeout=240)
    return json.loads(out.read_text())


@pytest.mark.full  # the unit tier runs the same cases over a scripted engine (test_flight.py)
def test_a_misbehaving_tool_ends_as_a_tool_message_within_its_budget(misbehaving: dict) -> None:
    # Two turns each, every turn a call: a 60 s tool cut at 0.5 s twice, whatever the others do.
    assert misbehaving["seconds"] < 10 * TOOL_TIMEOUT_S + 5, misbehaving["seconds"]
    by_mode = {mode: [s for s in misbehaving["samples"] if s["mode"] == mode] for mode in MODES}
    for mode, samples in by_mode.items():
        assert len(samples) == 2, mode
        for s in samples:
            assert s["stats"]["tool_calls"] == 2 and s["stats"]["truncated"] == "turns", s
            context = s["context"]
            if mode == "sleep":
                assert "timed out" in context and s["stats"]["errors"] == {"timeout": 2}
            elif mode == "raise":
                assert "RuntimeError: the index is gone" in context
                assert s["stats"]["errors"] == {"error": 2}
            elif mode == "huge":
                assert "[truncated 9999936 characters]" in context
                assert context.count("x") <= MAX_OUTPUT_CHARS + len("xxx")
            else:
                assert "found it" in context and s["stats"]["errors"] == {}
