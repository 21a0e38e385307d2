"""The LM head replaced, for one forward, by one that returns log-probs instead of logits.

The full logits are (tokens x vocab) in fp32 for the log-softmax: for a 7B model's 152k
vocabulary that is 0.6 MB per token, more than the rest of the activations. The scoring head
takes the final hidden states, keeps the positions that predict response tokens, and runs
the LM head chunk by chunk (hybrid.algorithms.chunked_logprob), gradients included; or, when
the model fuses its kernels and the pass wants no entropy, liger-kernel's fused linear
cross-entropy (hybrid.workers.fused_kernels.fused_log_probs), the same log-probs in one op.

Why a swap and not a call to the decoder alone: under FSDP2 the root module's hooks gather
the embedding and head weights and reduce their gradients; calling the inner decoder would
skip them. The model is called as usual and HF returns what the head produced as `logits`:
(n, 2) = [log-prob, entropy] of the n scored tokens. The wrapped Linear is read at call time,
when FSDP has put the unsharded weight on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from hybrid.algorithms.chunked_logprob import chunked_log_probs
from hybrid.workers.fused_kernels import fused_log_probs


class ScoringHead(nn.Module):
    def __init__(
        self,
        head: nn.Linear,
        score_index: torch.Tensor,
        labels: torch.Tensor,
        chunk_tokens: int,
        with_entropy: bool,
        fused: bool = False,
    ) -> None:
        super().__init__()
        if head.bias is not None:
            raise ValueError("the scoring head supports LM heads without bias (Llama, Qwen)")
        # In a list: not a submodule, so its parameters are not listed twice.
        self._head: list[nn.Linear] = [head]
        self.score_index: torch.Tensor = score_index
        self.labels: torch.Tensor = labels
        self.chunk_tokens: int = chunk_tokens
        self.with_entropy: bool = with_entropy
        self.fused: bool = fused and not with_entropy

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        states = hidden.flatten(0, 1)[self.score_index]
        if self.fused:
            log_probs = fused_log_probs(states, self._head[0].weight, self.labels)
            return torch.stack([log_probs, torch.zeros_like(log_probs)], dim=-1)
        log_probs, entropy = chunked_log_probs(
            states, self._head[0].weight, self.labels, self.chunk_tokens, self.with_entropy
        )
        if entropy is None:
            entropy = torch.zeros_like(log_probs)
        return torch.stack([log_probs, entropy], dim=-1)


def unwrapped_model(model: nn.Module) -> nn.Module:
    """The transformers model under a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


@contextmanager
def scoring_head(
    model: nn.Module,
    score_index: torch.Tensor,
    labels: torch.Tensor,
    chunk_tokens: int,
    with_entropy: bool,
    fused: bool = False,
) -> Iterator[None]:
    """Within the block, `model(...).logits` is (n, 2): log-prob and entropy per scored token.
    `fused`: liger's fused head where no entropy is asked for (its op returns none)."""
    causal_lm = unwrapped_model(model)
    head = causal_lm.get_output_embeddings()  # type: ignore[operator]
    if not isinstance(head, nn.Linear):
        raise TypeError(f"expected a Linear LM head, got {type(head).__name__}")
    # Not set_output_embeddings: with tied weights it would re-tie the new module's weight.
    name = next(name for name, child in causal_lm.named_children() if child is head)
    setattr(
        causal_lm, name, ScoringHead(head, score_index, labels, chunk_tokens, with_entropy, fused)
    )
    try:
        yield
    finally:
        setattr(causal_lm, name, head)
