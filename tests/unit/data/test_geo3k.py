"""examples/data/geo3k.py: the Hub's Geometry3K parquet files (images, problem, answer) become
prompt rows with images that the dataset loads through a VLM's processor and the MATH reward
scores; a problem whose placeholders and images differ is named (file, row)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from hybrid.data.dataset import PromptDataset
from hybrid.data.images import encode_png
from hybrid.data.vision_prompts import load_vision_processor
from hybrid.models import TinyModelConfig, build_tiny_model, load_tokenizer
from hybrid.rewards import compute_score

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[3] / "examples" / "data" / "geo3k.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("examples_data_geo3k", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _raw(path: Path, problems: list[str]) -> None:
    image = {"bytes": encode_png(Image.new("RGB", (60, 40), "white")), "path": None}
    rows = [{"images": [image], "problem": p, "answer": "3"} for p in problems]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_hub_rows_convert_load_with_images_and_score(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _raw(raw / "data" / "train-00000-of-00001.parquet", ["<image>Find x.", "<image>Find y."])
    _raw(raw / "data" / "test-00000-of-00001.parquet", ["<image>Find z."])
    written = _script().main(["--input-dir", str(raw), "--output-dir", str(tmp_path / "out")])
    model = build_tiny_model(tmp_path / "vl", TinyModelConfig.preset("tiny-vl"), seed=0)
    dataset = PromptDataset(
        written["train"],
        load_tokenizer(model),
        max_prompt_length=128,
        processor=load_vision_processor(model),
    )
    assert len(dataset) == 2
    row = dataset[0]
    assert row.data_source == "hiyouga/geometry3k" and row.ground_truth == "3"
    assert row.images is not None and len(row.images) == 1
    assert "\\boxed{}" in row.raw_prompt
    assert compute_score(row.data_source, "so x = \\boxed{3}", row.ground_truth) == 1.0
    assert compute_score(row.data_source, "\\boxed{4}", row.ground_truth) == 0.0


def test_a_problem_without_its_placeholder_is_named(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _raw(raw / "train-00000-of-00001.parquet", ["<image>Find x.", "Find y."])
    _raw(raw / "test-00000-of-00001.parquet", ["<image>Find z."])
    with pytest.raises(ValueError, match=r"train-00000-of-00001\.parquet: row 1: .* 0 <image>"):
        _script().main(["--input-dir", str(raw), "--output-dir", str(tmp_path / "out")])
