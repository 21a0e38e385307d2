"""A partial rollout on the real engine (plan 2 of the fully-async mode): samples interrupted
mid-generation by a weight load continue from their tokens under the new weights.

The child process drives VllmEngine step by step through InFlight, exactly as
`ExplorerWorker.stream` does: a few engine steps under version 0, then the requests are
aborted, perturbed weights are loaded in place (version 1), and the same samples are submitted
again (prompt + partial response) and run to their budget. The parent checks that every
finished response starts with exactly the tokens it had at the interruption, that the tokens
after it carry version 1, and that each token's rollout log-prob is the one transformers gives
under the weights of the token's own version. vLLM runs in a child process for the reason given
in tests/integration/models/test_tiny_model_vllm.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybrid.models import TinyModelConfig, build_tiny_model
from tests.forked import check_python
from tests.integration.rollout.engine_child import engine_child_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

LOGPROB_ATOL = 1e-3  # fp32 on both sides
STEPS_BEFORE_SYNC = 5
BUDGET = 16
PERTURBATION = 0.05
PROMPTS = ([5, 17, 23, 9], [40, 41, 42])

_CHILD = """
import json, sys
import torch
from safetensors.torch import load_file

model_dir, out_path = sys.argv[1], sys.argv[2]
prompts, steps_before, budget, scale = json.loads(sys.argv[3])
from tests.integration.rollout.engine_child import start_single_rank_world
start_single_rank_world()

from hybrid.rollout.streaming import InFlight
from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.vllm_engine import VllmEngine

config = RolloutConfig(dtype="float32", response_length=budget, prompt_length=8,
                       max_model_len=64, n=2,
                       ignore_eos=True, load_format="auto", kv_cache_memory_bytes=32 << 20)
engine = VllmEngine(model_dir, config, torch.device("cpu"), "float32")
flight = InFlight(group_size=config.n, response_length=budget)
for index, prompt in enumerate(prompts):
    flight.add(f"p{index}", prompt, metadata={})
finished = []

def run(version, max_steps=None):
    for request_id, request in flight.to_submit():
        engine.submit(request_id, request)
    steps = 0
    while engine.has_unfinished() and (max_steps is None or steps < max_steps):
        for request_id, new, done in engine.step():
            group = flight.record(request_id, new, done, version, str)
            if group is not None:
                finished.extend(group)
        steps += 1

run(0, steps_before)
at_sync = {f"{s.uid}#{s.index}": list(s.response_ids) for s in flight.pending}
engine.abort(flight.interrupt())
# Version 1: every weight moved by scale x noise, loaded in place (the sync's reload).
weights = load_file(model_dir + "/model.safetensors")
noise = torch.Generator().manual_seed(1)
new = {k: v + scale * torch.randn(v.shape, generator=noise) for k, v in weights.items()}
engine.load_weights(new.items())
run(1)
assert not flight.pending
json.dump({
    "at_sync": at_sync,
    "new_weights": {k: v.tolist() for k, v in new.items()},
    "samples": [{"key": f"{s.uid}#{s.index}", "prompt": s.prompt_ids,
                 "response": s.response_ids, "versions": s.versions,
                 "log_probs": s.rollout_log_probs} for s in finished],
}, open(out_path, "w"))
engine.shutdown()
"""


def token_log_probs(model: torch.nn.Module, prompt: list[int], response: list[int]) -> list[float]:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits.float()
    log_probs = torch.log_softmax(logits[0, len(prompt) - 1 : -1], dim=-1)
    return log_probs.gather(-1, torch.tensor(response)[:, None])[:, 0].tolist()


@pytest.mark.full  # by default end to end: test_fully_async.py's mid-generation syncs
def test_interrupted_samples_continue_under_the_new_weights(tmp_path: Path) -> None:
    model_dir = build_tiny_model(
        tmp_path / "model", TinyModelConfig.preset("tiny", dtype="float32"), seed=0
    )
    out = tmp_path / "out.json"
    env = engine_child_env()
    args = json.dumps([list(PROMPTS), STEPS_BEFORE_SYNC, BUDGET, PERTURBATION])
    check_python(_CHILD, str(model_dir), str(out), args, env=env, timeout=240)
    result = json.loads(out.read_text())
    samples = result["samples"]
    assert len(samples) == len(PROMPTS) * 2

    old = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    new = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    state = {k: torch.tensor(v) for k, v in result["new_weights"].items()}
    missing, unexpected = new.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied: the embedding's
    new.tie_weights()
    for sample in samples:
        before = result["at_sync"][sample["key"]]
        cut = len(before)
        # The interruption came mid-response: the sample had started and was not done.
        assert 0 < cut < BUDGET, sample["key"]
        assert len(sample["response"]) == BUDGET  # ignore_eos: every response runs to its budget
        assert sample["response"][:cut] == before
        assert sample["versions"] == [0] * cut + [1] * (BUDGET - cut)
        by_old = token_log_probs(old, sample["prompt"], sample["response"])
        by_new = token_log_probs(new, sample["prompt"], sample["response"])
        want = by_old[:cut] + by_new[cut:]
        got = sample["log_probs"]
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < LOGPROB_ATOL
        # The versions differ enough that the check above could fail on the wrong weights.
        assert max(abs(a - b) for a, b in zip(got[cut:], by_old[cut:], strict=True)) > 0.01
