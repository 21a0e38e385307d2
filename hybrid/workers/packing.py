"""What the model reads for one micro-batch, padded or packed, and where the scores go back.

Padded layout (hybrid.data.sample): row i = [left-padded prompt (P)][right-padded
response (R)], width S = P + R. Packed layout: the valid tokens of every row concatenated into
one row of T tokens, position ids restarting at 0 at each sequence. transformers derives a
block-causal mask from such position ids when no attention mask is given (sdpa; flash-attn
varlen takes its cu_seqlens from them), so attention never crosses sequences and no FLOP is
spent on padding.

Either way only the n valid response tokens are scored: `score_index` holds, in the flattened
(rows x width) input, the position whose hidden state predicts each of them, `labels` the
tokens, and `target` where each score goes in the flattened (b, R) output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from hybrid.data import Batch


@dataclass(frozen=True)
class ModelInputs:
    input_ids: torch.Tensor  # (rows, width): (b, S) padded, (1, T) packed
    position_ids: torch.Tensor  # (rows, width)
    attention_mask: torch.Tensor | None  # (b, S) padded; None packed (the ids carry the mask)
    score_index: torch.Tensor  # (n,) into the flattened (rows x width) hidden states
    labels: torch.Tensor  # (n,) the response tokens scored
    target: torch.Tensor  # (n,) into the flattened (b x R) output
    response_shape: tuple[int, int]  # (b, R)
    cu_seqlens: torch.Tensor | None = None
    """Packed: (sequences + 1,) int32, where each sequence starts in the row and where the
    last ends (what varlen attention reads instead of re-deriving it from positions)."""
    max_seqlen: int = 0
    """Packed: the longest sequence's tokens."""
    pixel_values: torch.Tensor | None = None
    """A vision-language model's micro-batch with images: every image's patches, in row
    order (hybrid.workers.vision_inputs); `position_ids` are then the family's mRoPE rows."""
    image_grid_thw: torch.Tensor | None = None
    """(images, 3): each image's (temporal, height, width) patch grid."""

    def model_kwargs(self) -> dict[str, Any]:
        """What the model is called with: ids, mask, positions, and for a packed row its
        sequence bounds under transformers' varlen names (they reach the attention function)."""
        kwargs: dict[str, Any] = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
            "use_cache": False,
        }
        if self.pixel_values is not None:
            kwargs.update(pixel_values=self.pixel_values, image_grid_thw=self.image_grid_thw)
        if self.cu_seqlens is not None:
            kwargs.update(
                cu_seq_lens_q=self.cu_seqlens,
                cu_seq_lens_k=self.cu_seqlens,
                max_length_q=self.max_seqlen,
                max_length_k=self.max_seqlen,
            )
        return kwargs

    def scatter(self, scores: torch.Tensor) -> torch.Tensor:
        """(n,) scores to (b, R), zero at padding; differentiable."""
        b, r = self.response_shape
        flat = scores.new_zeros(b * r).index_put((self.target,), scores)
        return flat.view(b, r)


def token_positions(attention_mask: torch.Tensor, packed: bool) -> torch.Tensor:
    """(tokens,) where each token the model reads sits in the flattened (b x S) micro-batch, in
    the order the model reads them: every position padded, the valid ones row-major packed.
    What a per-token record of one pass (the MoE routing, hybrid.workers.routing) is keyed by,
    so that another pass with other micro-batches or another layout finds its tokens."""
    if not packed:
        return torch.arange(attention_mask.numel(), device=attention_mask.device)
    return attention_mask.flatten().nonzero().flatten()


def _response_tokens(micro: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(rows, cols) of the valid response tokens, their ids, and the prompt width P."""
    responses = micro.tensors["responses"]
    rows, cols = micro.tensors["response_mask"].nonzero(as_tuple=True)
    prompt_width = micro.tensors["input_ids"].shape[1] - responses.shape[1]
    return rows, cols, responses[rows, cols], prompt_width


def padded_inputs(micro: Batch) -> ModelInputs:
    t = micro.tensors
    rows, cols, labels, prompt_width = _response_tokens(micro)
    width = t["input_ids"].shape[1]
    return ModelInputs(
        input_ids=t["input_ids"],
        position_ids=t["position_ids"],
        attention_mask=t["attention_mask"],
        score_index=rows * width + prompt_width - 1 + cols,
        labels=labels,
        target=rows * t["responses"].shape[1] + cols,
        response_shape=tuple(t["responses"].shape),  # type: ignore[arg-type]
    )


def packed_inputs(micro: Batch) -> ModelInputs:
    t = micro.tensors
    valid = t["attention_mask"].bool()
    rows, cols, labels, prompt_width = _response_tokens(micro)
    empty = (~valid[:, :prompt_width].any(dim=1)).nonzero().flatten().tolist()
    if empty:
        # Nothing would precede the first response token: there is no state to score it from.
        raise ValueError(f"rows {empty} have an empty prompt (attention_mask is 0 over it)")
    # Row-major order: the packed index of each valid token is its rank among valid tokens.
    packed_index = valid.flatten().cumsum(0) - 1
    width = valid.shape[1]
    lengths = valid.sum(dim=1)
    return ModelInputs(
        input_ids=t["input_ids"][valid].unsqueeze(0),
        position_ids=t["position_ids"][valid].unsqueeze(0),
        attention_mask=None,
        score_index=packed_index[rows * width + prompt_width - 1 + cols],
        labels=labels,
        target=rows * t["responses"].shape[1] + cols,
        response_shape=tuple(t["responses"].shape),  # type: ignore[arg-type]
        cu_seqlens=cu_seqlens(lengths),
        max_seqlen=int(lengths.max()),
    )


def cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    """(n + 1,) int32: 0, then the running total of the (n,) sequence lengths."""
    return F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
