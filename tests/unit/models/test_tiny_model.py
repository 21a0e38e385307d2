"""The tiny-model builder: transformers loads what it writes for every architecture family, and
it is deterministic."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybrid.models import (
    Architecture,
    TinyModelConfig,
    build_tiny_model,
    count_parameters,
    unknown_characters,
    vocab_size,
)
from hybrid.models.__main__ import main as models_cli
from hybrid.models.config import MOE_ARCHITECTURES, TEXT_ARCHITECTURES
from hybrid.models.tiny import WEIGHTS_NAME, parameter_shapes

pytestmark = pytest.mark.unit

EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
}


# What the builder wrote before `architecture` existed (seed 0, default config): the default
# must keep writing exactly this, so every existing test model and benchmark stays the same.
DEFAULT_WEIGHTS_SHA256 = "70fa3025376d7fc08c0ab0794d3ee6e307cb8cdfa13758838c0315b06a589606"
DEFAULT_CONFIG_JSON = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 0,
    "dtype": "bfloat16", "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 128,
    "initializer_range": 0.02, "intermediate_size": 256,
    "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 512,
    "max_window_layers": 2, "model_type": "qwen2", "num_attention_heads": 2,
    "num_hidden_layers": 2, "num_key_value_heads": 1, "pad_token_id": 0, "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "sliding_window": None,
    "tie_word_embeddings": True, "use_cache": True, "use_sliding_window": False,
    "vocab_size": 272,
}  # fmt: skip
# Per family: HF class, q/k/v biases, q/k norms (as each family has them by default).
FAMILIES: dict[Architecture, tuple[str, bool, bool]] = {
    "qwen2": ("Qwen2ForCausalLM", True, False),
    "llama": ("LlamaForCausalLM", False, False),
    "mistral": ("MistralForCausalLM", False, False),
    "qwen3": ("Qwen3ForCausalLM", False, True),
    "qwen3_moe": ("Qwen3MoeForCausalLM", False, True),
    "qwen2_moe": ("Qwen2MoeForCausalLM", True, False),
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig(), seed=0)


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_writes_a_complete_qwen2_directory(tiny_dir: Path) -> None:
    assert {p.name for p in tiny_dir.iterdir()} == EXPECTED_FILES
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, local_files_only=True)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.model_type == "qwen2"
    assert model.dtype == torch.bfloat16
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    assert len(tokenizer) == model.config.vocab_size == vocab_size("text")
    for ids in (model.config, model.generation_config):
        assert (ids.bos_token_id, ids.eos_token_id, ids.pad_token_id) == (
            tokenizer.bos_token_id,
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
        )


def test_untied_float32_variant(tmp_path: Path) -> None:
    config = TinyModelConfig(tie_word_embeddings=False, dtype="float32")
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path, config))
    assert model.dtype == torch.float32
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    assert count_parameters(config) == sum(p.numel() for p in model.parameters())


def test_forward_and_generate(tiny_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    inputs = tokenizer(["1+2=", "12+34="], return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        logits = model(**inputs).logits  # (batch, seq, vocab)
        out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert logits.shape == (2, 6, model.config.vocab_size)
    assert torch.isfinite(logits).all()
    assert out.shape[0] == 2 and 6 < out.shape[1] <= 11
    assert int(out.max()) < model.config.vocab_size


def test_tokenizer_round_trip_and_chat_template(tiny_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    for text in ("12+34=46", 'Hi, "Bob"! (3*4)/2 = 6; 50% of $8 #1?\n\tok.'):
        ids = tokenizer(text)["input_ids"]
        assert len(ids) == len(text)  # one token per ASCII character, nothing prepended
        assert tokenizer.decode(ids) == text
    # Byte-level: nothing is unknown, non-ASCII text round-trips too (é is 2 bytes, 😀 is 4).
    ids = tokenizer("1é2😀")["input_ids"]
    assert len(ids) == 8 and tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == "1é2😀"
    assert unknown_characters("1é2😀", "text") == []
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "1+2="}], add_generation_prompt=True, tokenize=False
    )
    assert rendered == "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(rendered)["input_ids"]
    assert ids[0] == ids[-11] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids.count(tokenizer.eos_token_id) == 1
    assert tokenizer.decode(ids) == rendered
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\n1+2=\nassistant\n"


def test_arithmetic_vocab(tmp_path: Path) -> None:
    build_tiny_model(tmp_path, TinyModelConfig(vocab="arithmetic"), seed=0)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert len(tokenizer) == vocab_size("arithmetic") == 16
    assert tokenizer.decode(tokenizer("12+34=46")["input_ids"]) == "12+34=46"
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "1+2="}], add_generation_prompt=True, tokenize=False
    )
    assert rendered == "<|im_start|>1+2=<|im_end|><|im_start|>"
    assert tokenizer(rendered)["input_ids"] == [1, 5, 14, 6, 15, 2, 1]
    assert unknown_characters("1-2 =x-", "arithmetic") == ["-", " ", "x"]


def test_transformers_loads_qwen2_dirs_as_byte_level_qwen2_tokenizer(tmp_path: Path) -> None:
    """Why tokenizer.py builds a byte-level BPE (transformers 5.x): AutoTokenizer (and vLLM)
    rebuild any qwen2 directory's tokenizer as Qwen2Tokenizer, keeping only vocab and merges,
    with no unk token, so a character outside a small vocabulary is dropped. If this test
    fails, transformers honours tokenizer.json again and a WordLevel tokenizer with a real
    <|unk|> becomes possible for the arithmetic vocabulary."""
    build_tiny_model(tmp_path, TinyModelConfig(vocab="arithmetic"), seed=0)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    assert tokenizer.decode(tokenizer("1-2")["input_ids"]) == "12"


def test_build_is_byte_identical_and_seeded(tiny_dir: Path, tmp_path: Path) -> None:
    rng_before = torch.random.get_rng_state()
    again = build_tiny_model(tmp_path / "again", TinyModelConfig(), seed=0)
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # global RNG untouched
    assert _digests(again) == _digests(tiny_dir)
    other = _digests(build_tiny_model(tmp_path / "other", TinyModelConfig(), seed=1))
    assert other["model.safetensors"] != _digests(tiny_dir)["model.safetensors"]
    assert {k: v for k, v in other.items() if k != "model.safetensors"} == {
        k: v for k, v in _digests(tiny_dir).items() if k != "model.safetensors"
    }


def test_default_is_the_unchanged_qwen2(tiny_dir: Path, tmp_path: Path) -> None:
    assert TinyModelConfig().architecture == "qwen2"
    config = json.loads((tiny_dir / "config.json").read_text())
    config.pop("transformers_version")
    assert config == DEFAULT_CONFIG_JSON
    weights = hashlib.sha256((tiny_dir / WEIGHTS_NAME).read_bytes()).hexdigest()
    assert weights == DEFAULT_WEIGHTS_SHA256
    explicit = build_tiny_model(tmp_path, TinyModelConfig(architecture="qwen2"), seed=0)
    assert _digests(explicit) == _digests(tiny_dir)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("architecture", TEXT_ARCHITECTURES)
def test_every_architecture_loads_in_transformers(
    architecture: Architecture, tied: bool, tiny_dir: Path, tmp_path: Path
) -> None:
    config = TinyModelConfig(architecture=architecture, tie_word_embeddings=tied)
    model_dir = build_tiny_model(tmp_path / "model", config, seed=0)
    class_name, qkv_bias, qk_norm = FAMILIES[architecture]
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    assert type(model).__name__ == class_name
    assert model.config.model_type == architecture
    assert model.dtype == torch.bfloat16
    attention = model.model.layers[0].self_attn
    assert attention.head_dim == config.head_dim >= 32
    assert attention.k_proj.weight.shape == (config.head_dim, config.hidden_size)  # GQA: 1 KV head
    for proj in (attention.q_proj, attention.k_proj, attention.v_proj):
        assert (proj.bias is not None) == qkv_bias
    assert attention.o_proj.bias is None
    assert hasattr(attention, "q_norm") == hasattr(attention, "k_norm") == qk_norm
    tied_now = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tied_now == tied
    # Every checkpoint tensor was ours (none left to transformers' init), and counted.
    shapes = parameter_shapes(config)
    assert {n: p.shape for n, p in model.named_parameters()} == shapes
    assert count_parameters(config) == sum(p.numel() for p in model.parameters())
    # Our init: unit norms (q/k norms included), zero biases, normal(0, 0.02) matrices.
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.equal(param, torch.ones_like(param)), name
        elif name.endswith(".bias"):
            assert not param.any(), name
        else:
            assert 0.015 < param.float().std().item() < 0.025, name
    # The same tokenizer whatever the family: same ids, same chat template.
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    reference = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    chat = [{"role": "user", "content": "1+2= é😀"}]
    for kwargs in ({"tokenize": False}, {"tokenize": True}):
        assert tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, **kwargs
        ) == reference.apply_chat_template(chat, add_generation_prompt=True, **kwargs)
    inputs = tokenizer(["1+2=", "12+34="], return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        logits = model(**inputs).logits  # (batch, seq, vocab)
    assert logits.shape == (2, 6, vocab_size("text")) and torch.isfinite(logits).all()
    # Deterministic per family.
    again = build_tiny_model(tmp_path / "again", config, seed=0)
    assert _digests(again) == _digests(model_dir)


def test_cli_architecture_flag(tmp_path: Path) -> None:
    path = models_cli(
        ["--output-dir", str(tmp_path), "--architecture", "llama", "--untied", "--vocab",
         "arithmetic"]
    )  # fmt: skip
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is False and config["vocab_size"] == 16


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"architecture": "gpt2"}, "architecture"),
        ({"hidden_size": 64, "num_attention_heads": 4}, "num_attention_heads"),
        ({"hidden_size": 130}, "hidden_size"),
        (
            {"num_key_value_heads": 3, "hidden_size": 192, "num_attention_heads": 2},
            "num_key_value_heads",
        ),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"vocab": "bpe"}, "vocab"),
        ({"dtype": "float16"}, "dtype"),
    ],
)
def test_invalid_config_names_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TinyModelConfig(**overrides)  # type: ignore[arg-type]


def test_small_head_dim_error_says_why() -> None:
    with pytest.raises(ValueError, match=r"head_dim 16 .*vLLM"):
        TinyModelConfig(hidden_size=128, num_attention_heads=8, num_key_value_heads=1)


def test_presets() -> None:
    assert TinyModelConfig.preset("tiny") == TinyModelConfig()
    bench = TinyModelConfig.preset("bench-100m")
    assert bench.head_dim == 64
    assert 80e6 <= count_parameters(bench) <= 130e6  # counted on the meta device
    assert TinyModelConfig.preset("bench-100m", vocab="arithmetic").vocab == "arithmetic"
    for architecture in set(TEXT_ARCHITECTURES) - set(MOE_ARCHITECTURES):
        config = TinyModelConfig.preset("bench-100m", architecture=architecture)
        assert 80e6 <= count_parameters(config) <= 130e6, architecture
    with pytest.raises(ValueError, match="preset"):
        TinyModelConfig.preset("huge")  # type: ignore[arg-type]


@pytest.mark.parametrize("vocab", ["text", "arithmetic"])
def test_tiny_vl_loads_as_an_image_text_to_text_model(vocab: str, tmp_path: Path) -> None:
    """The vision-language preset: transformers builds Qwen2-VL from it, the tokenizer holds
    the vision tokens at the config's ids, and the saved PIL image processor turns a 56 x 56
    image into a 4 x 4 patch grid (4 image tokens) whose features the model takes."""
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    from hybrid.models.tokenizer import IMAGE_PAD_TOKEN, VISION_END_TOKEN, VISION_START_TOKEN

    config = TinyModelConfig.preset("tiny-vl", vocab=vocab)  # type: ignore[arg-type]
    model_dir = build_tiny_model(tmp_path / "vl", config, seed=0)
    assert EXPECTED_FILES | {"preprocessor_config.json"} == {p.name for p in model_dir.iterdir()}
    model = AutoModelForImageTextToText.from_pretrained(model_dir, local_files_only=True).eval()
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    ids = tokenizer.convert_tokens_to_ids
    assert model.config.image_token_id == ids(IMAGE_PAD_TOKEN)
    assert model.config.vision_start_token_id == ids(VISION_START_TOKEN)
    assert model.config.vision_end_token_id == ids(VISION_END_TOKEN)
    assert len(tokenizer) == model.config.text_config.vocab_size == vocab_size(vocab, vision=True)  # type: ignore[arg-type]
    sections = model.config.text_config.rope_parameters["mrope_section"]
    assert sum(sections) == config.head_dim // 2
    processor = AutoImageProcessor.from_pretrained(model_dir)
    pixels = processor(images=[Image.new("RGB", (56, 56), "white")], return_tensors="pt")
    assert pixels["image_grid_thw"].tolist() == [[1, 4, 4]]
    pad = ids(IMAGE_PAD_TOKEN)
    text = f"{VISION_START_TOKEN}{IMAGE_PAD_TOKEN * 4}{VISION_END_TOKEN}1"
    input_ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    assert int((input_ids == pad).sum()) == 4
    with torch.no_grad():
        logits = model(
            input_ids=input_ids,
            pixel_values=pixels["pixel_values"],
            image_grid_thw=pixels["image_grid_thw"],
            mm_token_type_ids=(input_ids == pad).int(),
        ).logits
    assert logits.shape == (1, input_ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()
    assert count_parameters(config) == sum(p.numel() for p in model.parameters())


def test_tiny_vl_cli_takes_the_preset_family(tmp_path: Path) -> None:
    models_cli(["--output-dir", str(tmp_path), "--preset", "tiny-vl", "--vocab", "arithmetic"])
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["Qwen2VLForConditionalGeneration"]
