"""Vision-language prompts: `VisionProcessor` (placeholder spans expanded per image),
`read_row_images` (the `images` column), `PromptDataset`'s image checks, the loader's images
column, and the digits_vl demo data, with the tiny Qwen2-VL model's tokenizer and processor."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from hybrid.data.dataset import PromptDataset, read_rows, write_rows
from hybrid.data.images import IMAGES_COLUMN, ImageSet, decode_image, encode_png
from hybrid.data.loader import PromptLoader
from hybrid.data.vision_prompts import (
    VisionProcessor,
    load_vision_processor,
    read_row_images,
)
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.models.tokenizer import IMAGE_PAD_TOKEN, VISION_END_TOKEN, VISION_START_TOKEN
from hybrid.rewards import compute_score

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[3] / "examples" / "data" / "digits_vl.py"


@pytest.fixture(scope="module")
def processor(tmp_path_factory: pytest.TempPathFactory) -> VisionProcessor:
    config = TinyModelConfig.preset("tiny-vl", vocab="arithmetic")
    path = build_tiny_model(tmp_path_factory.mktemp("vl"), config, seed=0)
    loaded = load_vision_processor(path)
    assert loaded is not None
    return loaded


def png(width: int = 56, height: int = 56, color: str = "white") -> bytes:
    return encode_png(Image.new("RGB", (width, height), color))


def row(content: str = "<image>1+2=", images: list[Any] | None = None) -> dict[str, Any]:
    return {
        "data_source": "digits_vl",
        "prompt": [{"role": "user", "content": content}],
        "reward_model": {"ground_truth": "3"},
        IMAGES_COLUMN: images if images is not None else [{"bytes": png(), "path": None}],
    }


def dataset(path: Path, processor: VisionProcessor | None, **kwargs: Any) -> PromptDataset:
    tokenizer = processor.tokenizer if processor is not None else kwargs.pop("tokenizer")
    kwargs.setdefault("max_prompt_length", 32)
    return PromptDataset(path, tokenizer, processor=processor, **kwargs)


def test_each_image_span_holds_its_token_count(processor: VisionProcessor) -> None:
    images = [decode_image(png(56, 56)), decode_image(png(84, 28))]
    messages = [{"role": "user", "content": "<image>1+2=<image>"}]
    ids = processor.prompt_ids(messages, images)
    grid = processor.image_processor(images=images, return_tensors="np")["image_grid_thw"]
    expected = [int(thw.prod()) // processor.merge_size**2 for thw in grid]
    assert processor.image_tokens(images) == expected == [4, 3]
    start, end, pad = processor.tokenizer.convert_tokens_to_ids(
        [VISION_START_TOKEN, VISION_END_TOKEN, IMAGE_PAD_TOKEN]
    )
    starts = [i for i, t in enumerate(ids) if t == start]
    ends = [i for i, t in enumerate(ids) if t == end]
    assert [ids[s + 1 : e] for s, e in zip(starts, ends, strict=True)] == [
        [pad] * n for n in expected
    ]
    assert ids.count(pad) == sum(expected)
    text = processor.tokenizer.decode(ids, skip_special_tokens=False)
    assert "1+2=" in text and "<image>" not in text
    with pytest.raises(ValueError, match=r"2 image pads .* 1 images"):
        processor.prompt_ids(messages, images[:1])


def test_a_text_model_has_no_processor(tmp_path: Path) -> None:
    assert load_vision_processor(tmp_path) is None
    with pytest.raises(ValueError, match="no image processor"):
        VisionProcessor.from_pretrained(tmp_path)


def test_rows_load_with_their_images(processor: VisionProcessor, tmp_path: Path) -> None:
    image = png(56, 56, "black")
    path = write_rows([row(images=[image]), row(content="1+2=", images=[])], tmp_path / "a.parquet")
    rows = dataset(path, processor, max_images=1).rows
    assert rows[0].images == ImageSet((image,))
    assert rows[1].images is None
    assert rows[0].token_ids.count(processor.image_pad_id) == 4
    assert rows[1].token_ids.count(processor.image_pad_id) == 0


def test_image_paths_resolve_against_the_data_file(
    processor: VisionProcessor, tmp_path: Path
) -> None:
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(png(color="red"))
    (tmp_path / "b.png").write_bytes(png(color="blue"))
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text(json.dumps(row(images=["img/a.png"])) + "\n")
    assert dataset(jsonl, processor)[0].images == ImageSet((png(color="red"),))
    parquet = write_rows([row(images=[{"bytes": None, "path": "b.png"}])], tmp_path / "r.parquet")
    assert dataset(parquet, processor)[0].images == ImageSet((png(color="blue"),))
    assert read_row_images([str(tmp_path / "b.png")], "/elsewhere/x.parquet", 0) == ImageSet(
        (png(color="blue"),)
    )
    with pytest.raises(ValueError, match=r"r\.parquet: row 3: field 'images\[1\]'.*does not exist"):
        read_row_images([png(), "missing.png"], tmp_path / "r.parquet", 3)


def test_an_undecodable_image_names_file_row_and_entry(
    processor: VisionProcessor, tmp_path: Path
) -> None:
    path = write_rows([row(images=[png()]), row(images=[b"not a png"])], tmp_path / "bad.parquet")
    with pytest.raises(
        ValueError, match=r"bad\.parquet: row 1: field 'images\[0\]'.*not a decodable"
    ):
        dataset(path, processor)


def test_placeholders_must_match_the_images(processor: VisionProcessor, tmp_path: Path) -> None:
    path = write_rows([row(), row(content="<image><image>1=")], tmp_path / "count.parquet")
    with pytest.raises(
        ValueError, match=r"count\.parquet: row 1: .*2 <image> placeholder.*1 image"
    ):
        dataset(path, processor)
    text_row = write_rows([row(content="<image>1=", images=[])], tmp_path / "none.parquet")
    with pytest.raises(ValueError, match=r"none\.parquet: row 0: .*1 <image>.*0 image"):
        dataset(text_row, processor)


def test_too_many_images_name_the_rollout_limit(processor: VisionProcessor, tmp_path: Path) -> None:
    two = [{"bytes": png(), "path": None}] * 2
    path = write_rows([row(content="<image><image>", images=two)], tmp_path / "many.parquet")
    assert len(dataset(path, processor, max_images=2)[0].images or ()) == 2
    with pytest.raises(ValueError, match=r"many\.parquet: row 0: 2 images.*rollout\.max_images=1"):
        dataset(path, processor, max_images=1)


def test_an_image_row_too_long_is_an_error_not_a_drop(
    processor: VisionProcessor, tmp_path: Path
) -> None:
    path = write_rows([row(content="1=", images=[]), row()], tmp_path / "long.parquet")
    full = len(dataset(path, processor)[1].token_ids)  # 4 image tokens + 3 span ends + text
    with pytest.raises(
        ValueError,
        match=rf"long\.parquet: row 1: the prompt is {full} tokens, 4 of them image tokens"
        rf".*data\.max_prompt_length={full - 1}.*pixel budget",
    ):
        dataset(path, processor, max_prompt_length=full - 1)
    text_long = write_rows([row(content="1+2+3+4+5+6=", images=[]), row()], tmp_path / "t.parquet")
    kept = dataset(text_long, processor, max_prompt_length=full)
    assert kept.filtered_rows == [f"{text_long}:0"] and len(kept) == 1


def test_images_for_a_text_model_are_refused(processor: VisionProcessor, tmp_path: Path) -> None:
    path = write_rows([row()], tmp_path / "text.parquet")
    with pytest.raises(
        ValueError,
        match=r"text\.parquet: row 0: .*model\.path.*no image processor",
    ):
        dataset(path, None, tokenizer=processor.tokenizer)


def test_the_loader_batches_carry_images_only_for_image_datasets(
    processor: VisionProcessor, tmp_path: Path
) -> None:
    image = png(color="green")
    mixed = write_rows([row(images=[image]), row(content="1=", images=[])], tmp_path / "m.parquet")
    batch = PromptLoader(dataset(mixed, processor), 2, shuffle=False).next_batch()
    assert list(batch[IMAGES_COLUMN]) == [ImageSet((image,)), ImageSet(())]
    text = write_rows([row(content="1=", images=[])] * 2, tmp_path / "t.parquet")
    text_batch = PromptLoader(dataset(text, processor), 2).next_batch()
    assert IMAGES_COLUMN not in text_batch


def test_digits_vl_rows_load_with_the_tiny_vl_model(
    processor: VisionProcessor, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = importlib.util.spec_from_file_location("examples_data_digits_vl", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    args = ["--train-size", "20", "--test-size", "5", "--seed", "3"]
    written = script.main(["--output-dir", str(tmp_path / "a"), *args])
    assert "wrote 20 rows to" in capsys.readouterr().out
    again = script.main(["--output-dir", str(tmp_path / "b"), *args])
    blank = script.main(["--output-dir", str(tmp_path / "c"), *args, "--blank-images"])
    assert written["train"].read_bytes() == again["train"].read_bytes()
    loaded = dataset(written["train"], processor, max_prompt_length=16, max_images=1)
    assert len(loaded) == 20 and len(dataset(written["test"], processor)) == 5
    first = loaded[0]
    assert first.data_source == "digits_vl" and first.ground_truth in "0123456789"
    assert first.images is not None
    pixels = np.asarray(decode_image(first.images.encoded[0]))
    assert pixels.shape == (56, 56, 3) and pixels.min() == 0 and pixels.max() == 255
    blank_rows, raw_rows = read_rows(blank["train"]), read_rows(written["train"])
    assert [r["reward_model"] for r in blank_rows] == [r["reward_model"] for r in raw_rows]
    blank_pixels = np.asarray(decode_image(blank_rows[0][IMAGES_COLUMN][0]["bytes"]))
    assert blank_pixels.min() == 255
    assert compute_score("digits_vl", f" {first.ground_truth}<|im_end|>", first.ground_truth) == 1.0
    assert compute_score("digits_vl", first.ground_truth * 2, first.ground_truth) == 0.0
