"""Forward passes that score response tokens, micro-batch by micro-batch.

Shapes: input_ids / attention_mask / position_ids (b, P + R); responses (b, R); outputs (b, R).
"""

from __future__ import annotations

import torch

from hybrid.algorithms.logprob import entropy_from_logits, log_probs_from_logits
from hybrid.data import Batch


def response_logits(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Logits that predict each response token: (b, R, vocab)."""
    responses = batch.tensors["responses"]
    output = model(
        input_ids=batch.tensors["input_ids"],
        attention_mask=batch.tensors["attention_mask"],
        position_ids=batch.tensors["position_ids"],
        use_cache=False,
    )
    return output.logits[:, -responses.shape[1] - 1 : -1]


@torch.no_grad()
def score_responses(
    model: torch.nn.Module, batch: Batch, micro_batch_size: int, with_entropy: bool
) -> dict[str, torch.Tensor]:
    """Log-probs (and entropy) of `responses` under `model`, in micro-batches."""
    log_probs, entropies = [], []
    for start in range(0, len(batch), micro_batch_size):
        micro = batch[start : start + micro_batch_size]
        logits = response_logits(model, micro)
        log_probs.append(log_probs_from_logits(logits, micro.tensors["responses"]))
        if with_entropy:
            entropies.append(entropy_from_logits(logits))
    out = {"log_probs": torch.cat(log_probs)}
    if with_entropy:
        out["entropy"] = torch.cat(entropies)
    return out
