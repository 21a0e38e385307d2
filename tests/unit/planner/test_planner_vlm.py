"""The planner with a vision-language model: the Qwen2.5-VL-7B preset's parameters counted by
hand (the language model as Qwen2.5-7B's, the vision tower beside it), its vision blocks grouped
as units like the decoder layers, the decoder's sizes read from the text config, and the
Geometry3K 8-GPU preset fits on 8 x 80 GB with its launcher and converter in place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hybrid.memory.model_shape import layer_key, model_shape
from hybrid.planner.plan import plan_memory
from profiling.plan import compose_config

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
PRESET = "qwen2_5_vl_7b_geo3k_8gpu"
# Qwen2.5-VL-7B's vision tower: width, MLP width, blocks, patch (3 x 2 x 14 x 14), merged width.
VH, VMLP, VL, PATCH, MERGED, OUT = 1280, 3420, 32, 3 * 2 * 14 * 14, 4 * 1280, 3584
VISION_BLOCK = (
    (VH * 3 * VH + 3 * VH) + (VH * VH + VH) + 2 * (VH * VMLP + VMLP) + (VMLP * VH + VH) + 2 * VH
)  # qkv, proj, gate/up, down (all with bias), two RMSNorms
VISION = PATCH * VH + VL * VISION_BLOCK + VH + (MERGED * MERGED + MERGED) + (MERGED * OUT + OUT)


def test_the_qwen2_5_vl_7b_preset_counts_its_tower_by_hand() -> None:
    vl, text = model_shape("Qwen2.5-VL-7B"), model_shape("Qwen2.5-7B")
    assert (vl.hidden_size, vl.num_layers, vl.num_kv_heads, vl.head_dim) == (3584, 28, 4, 128)
    assert vl.vocab_size == 152064 and not vl.tied_embeddings
    assert vl.num_params - text.num_params == VISION
    print(f"\nQwen2.5-VL-7B: {vl.num_params / 1e9:.3f}B parameters, tower {VISION / 1e6:.1f}M")
    assert vl.kv_bytes_per_token(2) == text.kv_bytes_per_token(2)  # the decoder's KV
    blocks = {k for k in vl.layer_params if ".visual.blocks." in k}
    assert len(blocks) == VL and layer_key("model.visual.blocks.7.mlp.up_proj.weight") in blocks
    assert vl.largest_layer == text.largest_layer  # a decoder layer outweighs a vision block


def test_the_geometry3k_preset_fits_on_8_x_80_gb() -> None:
    config = compose_config(PRESET, [])
    assert config.rollout.max_images == 1
    assert config.data.max_prompt_length == config.rollout.prompt_length  # image tokens in it
    p = plan_memory(config, model_shape("Qwen2.5-VL-7B"), 80.0, gpu="h100")
    assert p.fits and not p.warnings, (p.problems, p.warnings)
    print(f"\n{PRESET}: peak {p.peak_gib:.2f} GiB at {p.peak_phase}, margin {p.margin_gib:+.2f}")
    launcher = REPO / "examples" / "run_qwen2_5_vl_7b_geo3k_8gpu.sh"
    assert os.access(launcher, os.X_OK)
    assert f"--config-name {PRESET}" in launcher.read_text()
    assert "examples/data/geo3k.py" in launcher.read_text()
