"""The weight-path checks every `RolloutEngine` must pass, whatever it is built on.

`check_weight_path` is run by the toy engine's unit tests (tests/unit/rollout/
test_engine_protocol.py) and by a real vLLM engine in a child process
(tests/integration/rollout/test_direct_load.py), so both engines answer the same questions the
same way: what the protocol lists is there and nothing of the engine's module is; a checksummed
load matches; a changed stored tensor is named; the digest follows the weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hybrid.rollout.base import RolloutEngine
from hybrid.rollout.checksum import ChecksumMismatchError

PROTOCOL_MEMBERS = sorted(
    name
    for name in vars(RolloutEngine)
    if not name.startswith("_") and name not in ("model", "weight_layout")
)


def check_weight_path(engine: Any, original: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Runs the checks on `engine` with `original` (Hugging Face name -> tensor in the
    engine's dtype, every weight the engine holds); raises AssertionError on the first that
    fails, else returns what it saw (for the caller's report)."""
    missing = [name for name in PROTOCOL_MEMBERS if not hasattr(engine, name)]
    assert not missing, f"{type(engine).__name__} lacks protocol members {missing}"
    for internal in ("model", "weight_layout", "quantization"):
        assert not hasattr(engine, internal), f"{type(engine).__name__}.{internal} is exported"
    assert "load_weights" in PROTOCOL_MEMBERS and "model" not in dir(RolloutEngine)

    facts = engine.configure_loads("auto")
    assert facts.strategy in ("direct", "reload")
    assert type(engine).supports_lora("Qwen2ForCausalLM")

    noise = torch.Generator().manual_seed(7)
    perturbed = {
        name: tensor + (0.05 * torch.randn(tensor.shape, generator=noise)).to(tensor.dtype)
        for name, tensor in original.items()
    }
    checked = engine.load_weights(original.items(), checksum=True)
    assert checked > 0, "a checksummed load compared no tensor"
    assert engine.verify_weights() == checked
    held = engine.weights_digest()
    assert held.tensors >= checked

    assert engine.load_weights(perturbed.items()) == 0, "an unchecked load reports no checks"
    assert engine.weights_digest() != held, "the digest did not follow the weights"
    assert engine.load_weights(original.items(), checksum=True) == checked
    assert engine.weights_digest() == held, "the same weights gave another digest"

    name, stored = next((n, t) for n, t in engine.stored_weights() if t.is_floating_point())
    with torch.no_grad():
        stored.view(-1)[0] += 1.0
    try:
        engine.verify_weights()
    except ChecksumMismatchError as error:
        named = repr(name) in str(error)
    else:
        raise AssertionError(f"a changed {name} passed the check")
    assert named, f"the mismatch did not name {name}"
    engine.load_weights(original.items(), checksum=True)  # leave the engine as it was
    return {"strategy": facts.strategy, "layout": facts.layout, "checked": checked}
