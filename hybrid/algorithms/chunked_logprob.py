"""Log-probabilities and entropy of the LM head's softmax, computed a chunk of tokens at a time.

Shapes: hidden (n, H); weight (V, H), the LM head; labels, log-probs and entropy (n,).

The plain path builds (n, V) float32 logits (16k tokens x 152k vocab is 9.7 GB) and autograd
then keeps them, or their softmax, for backward. Here only one chunk's (chunk_tokens, V)
float32 logits and a few same-size temporaries are ever alive, so memory no longer scales with
tokens x vocab. Backward saves only the inputs and the per-row log-normaliser (and entropy),
and recomputes each chunk's logits from them: one extra head matmul buys the (n, V)
activations back.

Logits are computed in the inputs' dtype, as `nn.Linear` would, then log-softmaxed in float32,
so results equal `log_probs_from_logits` / `entropy_from_logits` applied to the full logits.
float64 inputs stay float64 throughout, so `torch.autograd.gradcheck` can check the backward.
"""

from __future__ import annotations

from typing import Any

import torch


def chunked_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk_tokens: int,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(label) (n,) fp32 and entropy (n,) fp32 (or None) of softmax(hidden @ weight.T).

    Outputs are float64 instead when the inputs are. `chunk_tokens` rows share one matmul and
    set the peak memory: a few (chunk_tokens, V) float32 buffers, forward and backward.
    """
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be > 0, got {chunk_tokens}")
    if hidden.dim() != 2 or weight.dim() != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(
            f"hidden must be (n, H) and weight (V, H), got hidden {tuple(hidden.shape)} "
            f"and weight {tuple(weight.shape)}"
        )
    if labels.shape != hidden.shape[:1]:
        raise ValueError(f"labels must have shape ({hidden.shape[0]},), got {tuple(labels.shape)}")
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        log_probs, entropy = _ChunkedLogProbs.apply(
            hidden, weight, labels, chunk_tokens, with_entropy
        )
        return log_probs, entropy
    log_probs, _, entropy = _forward(hidden, weight, labels, chunk_tokens, with_entropy)
    return log_probs, entropy


def _forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk_tokens: int,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(log_probs, log_z, entropy), each (n,) in the softmax dtype."""
    n = hidden.shape[0]
    log_probs = hidden.new_empty(n, dtype=_softmax_dtype(hidden))
    log_z = torch.empty_like(log_probs)
    entropy = torch.empty_like(log_probs) if with_entropy else None
    for start in range(0, n, chunk_tokens):
        rows = slice(start, start + chunk_tokens)
        logits = (hidden[rows] @ weight.T).to(log_probs.dtype)  # (chunk, V)
        log_z[rows] = logits.logsumexp(-1)
        log_probs[rows] = logits.gather(-1, labels[rows, None]).squeeze(-1) - log_z[rows]
        if entropy is not None:
            probs = (logits - log_z[rows, None]).exp_()
            entropy[rows] = log_z[rows] - probs.mul_(logits).sum(-1)
    return log_probs, log_z, entropy


def _softmax_dtype(hidden: torch.Tensor) -> torch.dtype:
    return torch.promote_types(hidden.dtype, torch.float32)


class _ChunkedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        labels: torch.Tensor,
        chunk_tokens: int,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        log_probs, log_z, entropy = _forward(hidden, weight, labels, chunk_tokens, with_entropy)
        # Unused outputs arrive as None in backward, so their terms can be skipped.
        ctx.set_materialize_grads(False)
        ctx.chunk_tokens = chunk_tokens
        ctx.save_for_backward(hidden, weight, labels, log_z, entropy)
        return log_probs, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None]:
        hidden, weight, labels, log_z, entropy = ctx.saved_tensors
        want_hidden, want_weight = ctx.needs_input_grad[:2]
        grad_hidden = torch.zeros_like(hidden) if want_hidden else None
        # float32 accumulator: summing many chunks' contributions in bf16 would lose them.
        grad_weight = torch.zeros_like(weight, dtype=log_z.dtype) if want_weight else None
        for start in range(0, hidden.shape[0], ctx.chunk_tokens):
            rows = slice(start, start + ctx.chunk_tokens)
            h = hidden[rows]
            # In place from here: log p, then dlogits, reuse the one (chunk, V) float32 buffer.
            log_p = (h @ weight.T).to(log_z.dtype).sub_(log_z[rows, None])
            probs = log_p.exp()
            # dH/dz = -p (log p + H) and dlogp/dz = onehot - p, both scaled by their upstream.
            if grad_entropy is not None:
                coef = log_p.add_(entropy[rows, None]).mul_(grad_entropy[rows, None])
            else:
                coef = log_p.zero_()
            if grad_log_probs is not None:
                coef.add_(grad_log_probs[rows, None])
            grad_logits = coef.mul_(probs).neg_()
            if grad_log_probs is not None:
                grad_logits.scatter_add_(-1, labels[rows, None], grad_log_probs[rows, None])
            # Back to the inputs' dtype, as the gradient through nn.Linear's .float() would be.
            grad_logits = grad_logits.to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight += grad_logits.T @ h
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None
