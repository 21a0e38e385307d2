"""A vision-language model on two FSDP2 ranks where one rank's micro-batch has images and the
other's has none: the forward and backward finish on both (the text-only rank runs the vision
tower on a blank image, so every FSDP collective of the tower happens on both ranks), the
log-probs equal a single-process transformers forward, and the step's gradients equal the
single-process gradient of the two ranks' mean loss (fp32, tight bounds). With
`freeze_vision_tower` the tower gets no gradient and the language model still trains.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from hybrid.data.images import ImageSet, encode_png
from hybrid.data.sample import Sample, samples_to_batch
from hybrid.models import TinyModelConfig, build_tiny_model
from tests.integration.workers.gloo_ranks import spawn_ranks

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

RESPONSE = 3
ATOL = 1e-5  # fp32 on both sides; measured below 1e-6
CHECKED = (
    "model.visual.patch_embed.proj.weight",
    "model.visual.blocks.0.attn.qkv.weight",
    "model.visual.merger.mlp.0.weight",
    "model.language_model.layers.1.mlp.down_proj.weight",
    "model.language_model.embed_tokens.weight",
)


def _samples(config: Any, rank: int) -> list[Sample]:
    """Rank 0: two image prompts (one with two images); rank 1: two text-only prompts."""
    start, end, pad = (
        config.vision_start_token_id,
        config.vision_end_token_id,
        config.image_token_id,
    )

    def picture(color: tuple[int, int, int], size: tuple[int, int] = (56, 56)) -> bytes:
        return encode_png(Image.new("RGB", size, color))

    if rank == 0:
        one = [1, start, *[pad] * 4, end, 5, 2, 1]
        two = [1, start, *[pad] * 4, end, start, *[pad] * 2, end, 2, 1]
        return [
            Sample("a", 0, one, [6, 7, 2], [0.0] * 3, [0] * 3, images=ImageSet((picture((200, 30, 30)),))),
            Sample(
                "b", 0, two, [9, 2], [0.0] * 2, [0] * 2,
                images=ImageSet((picture((30, 200, 30)), picture((30, 30, 200), (28, 56)))),
            ),
        ]  # fmt: skip
    return [
        Sample("c", 0, [1, 6, 7, 2, 1], [8, 2], [0.0] * 2, [0] * 2),
        Sample("d", 0, [1, 4, 4, 4, 2, 1], [5, 5, 2], [0.0] * 3, [0] * 3),
    ]


def _loss(log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return -(log_probs * mask).sum() / mask.sum()


def _reference(model_dir: str, batches: list[Any]) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """transformers in one process: each rank's log-probs, and the gradient of the ranks' mean
    loss."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    processor = AutoImageProcessor.from_pretrained(model_dir)
    pad = model.config.image_token_id
    per_rank, losses = [], []
    for batch in batches:
        rows = []
        for row in range(len(batch)):
            mask = batch.tensors["attention_mask"][row].bool()
            ids = batch.tensors["input_ids"][row][mask][None]
            images = batch.non_tensors.get("images")
            kwargs: dict[str, Any] = {}
            if images is not None and images[row]:
                pixels = processor(images=images[row].decode(), return_tensors="pt")
                kwargs = dict(
                    pixel_values=pixels["pixel_values"],
                    image_grid_thw=pixels["image_grid_thw"],
                    mm_token_type_ids=(ids == pad).int(),
                )
            log_probs = model(input_ids=ids, **kwargs).logits[0].float().log_softmax(-1)
            responses = batch.tensors["responses"][row]
            real = int(batch.tensors["response_mask"][row].sum())
            prompt = ids.shape[1] - real
            picked = torch.stack(
                [log_probs[prompt - 1 + j, responses[j]] for j in range(real)]
                + [log_probs.new_zeros(())] * (RESPONSE - real)
            )
            rows.append(picked)
        scores = torch.stack(rows)
        per_rank.append(scores.detach())
        losses.append(_loss(scores, batch.tensors["response_mask"].float()))
    torch.stack(losses).mean().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if name in CHECKED}
    return per_rank, grads


def _run(rank: int, mesh: DeviceMesh, model_dir: Path) -> dict[str, Any]:
    from transformers import AutoConfig

    from hybrid.workers.forward import PassConfig, score_micro_batch
    from hybrid.workers.fsdp import build_fsdp_model
    from hybrid.workers.vision_inputs import vision_family

    config = AutoConfig.from_pretrained(model_dir)
    batches = [samples_to_batch(_samples(config, r), RESPONSE, 0) for r in range(2)]
    batch = batches[rank]
    out: dict[str, Any] = {}
    for frozen in (False, True):
        model = build_fsdp_model(
            str(model_dir),
            mesh,
            torch.device("cpu"),
            param_dtype=torch.float32,
            freeze_vision_tower=frozen,
        )
        family = vision_family(model, str(model_dir))
        passes = PassConfig(micro_batch_size=2, packed=True, chunk_tokens=1024, vision=family)
        scores = score_micro_batch(model, batch, passes, with_entropy=False)
        _loss(scores.log_probs, batch.tensors["response_mask"].float()).backward()
        grads = {}
        for name, param in model.named_parameters():
            if name in CHECKED and param.grad is not None:
                grad = param.grad
                grads[name] = grad.full_tensor() if isinstance(grad, DTensor) else grad
        out["frozen" if frozen else "trained"] = {
            "log_probs": scores.log_probs.detach(),
            "grads": grads,
            "trainable": sorted(n for n, p in model.named_parameters() if p.requires_grad),
        }
    if rank == 0:
        out["reference"] = _reference(str(model_dir), batches)
    return out


def test_a_text_only_rank_runs_the_tower_and_the_step_equals_one_process(tmp_path: Path) -> None:
    config = TinyModelConfig.preset(
        "tiny-vl", vocab="arithmetic", dtype="float32", initializer_range=0.1
    )
    model_dir = build_tiny_model(tmp_path / "vl", config, seed=0)
    results = spawn_ranks(_run, tmp_path / "run", model_dir)
    log_probs, grads = results[0]["reference"]
    for rank in range(2):
        got = results[rank]["trained"]["log_probs"]
        gap = float((got - log_probs[rank]).abs().max())
        print(f"rank {rank} ({'images' if rank == 0 else 'text only'}): |log-prob gap| {gap:.2e}")
        assert gap < ATOL
    trained = results[0]["trained"]["grads"]
    assert set(trained) == set(CHECKED)
    for name in CHECKED:
        gap = float((trained[name] - grads[name]).abs().max())
        assert gap < ATOL, (name, gap)
        assert float(grads[name].abs().max()) > 0, name  # every checked tensor learns
    frozen = results[0]["frozen"]
    assert not any(".visual." in f".{n}" for n in frozen["trainable"]), frozen["trainable"]
    assert set(frozen["grads"]) == {n for n in CHECKED if ".visual." not in f".{n}"}
