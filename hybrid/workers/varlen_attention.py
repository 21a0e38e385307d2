"""sdpa that attends within each packed sequence, without a dense block mask.

For packed inputs (one row of T tokens, position ids restarting at each sequence, no
attention mask) transformers' sdpa path builds a dense (T x T) block-causal mask: every
head then costs T^2 however short the sequences are, and the CPU math kernel materialises
(heads, T, T) scores, so a larger packed micro-batch gets slower per token. Here each
sequence is attended to on its own with causal sdpa: sum(L_i^2) per head, what flash-attn's
varlen kernel does on GPU. Short packs (up to DENSE_MAX_TOKENS) take one call with the block
mask instead, where per-call overhead would dominate (on a CPU only packs of very short
sequences: `takes_dense_call`). Padded inputs (a 2-D attention mask) take transformers' sdpa path
unchanged, so `sdpa_varlen` can stand in for `sdpa` everywhere.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from hybrid.workers.sequence_parallel import active_group
from hybrid.workers.ulysses import ulysses_attention

NAME = "sdpa_varlen"
# Below this many packed tokens one call with a dense block-causal mask is cheaper than one
# call per sequence on a GPU: the T^2 scores are small, and many tiny kernel launches cost more.
DENSE_MAX_TOKENS = 1024
# On a CPU a call costs little and the masked kernel's backward a lot: forward and backward,
# d 64, one thread (AVX-512, 2026-12-03), the calls per sequence (split, below) took 0.16-0.87x
# the dense call's time for 32 to 256 sequences of 2.5 to 8 tokens on average at 2 and 12
# heads, except 32 sequences of 4 tokens at 2 heads (2.06x); longer sequences favour them more.
# So the dense call is taken there only for sequences of at most this many tokens on average.
CPU_DENSE_MAX_MEAN_TOKENS = 4


def takes_dense_call(tokens: int, sequences: int, device: torch.device) -> bool:
    """A pack of `tokens` in `sequences` is attended in one call with its block mask (else one
    causal call per sequence)."""
    if tokens > DENSE_MAX_TOKENS:
        return False
    return device.type != "cpu" or tokens <= CPU_DENSE_MAX_MEAN_TOKENS * sequences


def sequence_bounds(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of each packed sequence: a sequence starts where the position does not
    continue the previous one. position_ids: (1, T)."""
    positions = position_ids[0]
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[1:] = positions[1:] != positions[:-1] + 1
    edges = [*starts.nonzero().flatten().tolist(), positions.numel()]
    return list(itertools.pairwise(edges))


def bounds_from_cu_seqlens(cu_seqlens: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of each packed sequence from its (n + 1,) cumulative starts."""
    return list(itertools.pairwise(cu_seqlens.tolist()))


@dataclass
class PackedLayout:
    """Where a packed row's sequences start and end, read on the host once per forward pass
    (every decoder layer gets the same `cu_seq_lens_q` / `position_ids` tensors, so the second
    layer on finds it here instead of syncing with the device again), and the block-causal
    mask of a short pack, built on its first use."""

    sources: tuple[weakref.ref[torch.Tensor] | None, ...]
    versions: tuple[int, ...]
    tokens: int
    bounds: list[tuple[int, int]]
    _masks: dict[torch.device, torch.Tensor] = field(default_factory=dict)

    def describes(self, tensors: tuple[torch.Tensor | None, ...], tokens: int) -> bool:
        """The same tensors, unchanged in place, for a row of the same length."""
        if tokens != self.tokens or len(tensors) != len(self.sources):
            return False
        for tensor, source, version in zip(tensors, self.sources, self.versions, strict=True):
            held = None if source is None else source()
            if held is not tensor or (tensor is not None and tensor._version != version):
                return False
        return True

    @property
    def lengths(self) -> list[int]:
        """Each sequence's token count, in order."""
        return [end - start for start, end in self.bounds]

    def block_mask(self, device: torch.device) -> torch.Tensor:
        """(T, T) bool: causal within each sequence, nothing across them."""
        if device not in self._masks:
            sequence = torch.cat(
                [
                    torch.full((end - start,), i, device=device)
                    for i, (start, end) in enumerate(self.bounds)
                ]
            )
            causal = torch.ones(len(sequence), len(sequence), dtype=torch.bool, device=device)
            self._masks[device] = causal.tril() & (sequence[:, None] == sequence[None, :])
        return self._masks[device]


_last_layout: PackedLayout | None = None
"""The layout of the row the current forward pass attends over (one pass at a time per
process; a stale one never matches: its tensors are gone or differ)."""


def packed_layout(
    cu_seqlens: torch.Tensor | None, position_ids: torch.Tensor | None, tokens: int
) -> PackedLayout:
    """The row's sequence bounds: from `cu_seqlens` when they cover its `tokens`, else read off
    the position ids; computed on the first layer of a pass, reused by the others."""
    global _last_layout
    tensors = (cu_seqlens, position_ids)
    if _last_layout is not None and _last_layout.describes(tensors, tokens):
        return _last_layout
    bounds = bounds_from_cu_seqlens(cu_seqlens) if cu_seqlens is not None else None
    if bounds is None or bounds[-1][1] != tokens:
        # Bounds of another row (a caller that passed them for other tokens) fall back too.
        assert position_ids is not None, "cu_seq_lens_q do not cover the row and no positions"
        bounds = sequence_bounds(position_ids)
    _last_layout = PackedLayout(
        tuple(None if t is None else weakref.ref(t) for t in tensors),
        tuple(-1 if t is None else t._version for t in tensors),
        tokens,
        bounds,
    )
    return _last_layout


@torch.compiler.disable
def varlen_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """query (1, heads, T, d), key/value (1, kv_heads, T, d) -> (1, T, heads, d). The packed
    row's sequences are `cu_seq_lens_q` where the caller passes them (hybrid.workers.packing),
    else read off the position ids. Under sequence parallelism (a pass that opened
    `sequence_parallel.sliced_pass`) the tensors are this rank's slice of the row, and the attention
    of the whole row runs behind two all-to-alls (hybrid.workers.ulysses)."""
    group = active_group()
    if group is not None:
        return ulysses_attention(
            _attend_packed, module, query, key, value, attention_mask, group, **kwargs
        )
    return _attend_packed(module, query, key, value, attention_mask, **kwargs)


def _attend_packed(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    position_ids = kwargs.get("position_ids")
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    packed = cu_seqlens is not None or position_ids is not None
    if attention_mask is not None or not packed or query.shape[0] != 1:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    layout = packed_layout(cu_seqlens, position_ids, query.shape[2])
    bounds = layout.bounds
    gqa = query.shape[1] != key.shape[1]
    dropout_p = dropout if module.training else 0.0
    if takes_dense_call(query.shape[2], len(bounds), query.device):
        dense_key, dense_value, dense_gqa = masked_kv(query, key, value, expand=query.is_cuda)
        out = F.scaled_dot_product_attention(
            query,
            dense_key,
            dense_value,
            attn_mask=layout.block_mask(query.device),
            dropout_p=dropout_p,
            scale=scaling,
            enable_gqa=dense_gqa,
        )
        return out.transpose(1, 2).contiguous(), None
    # One split per tensor rather than a slice per sequence: backward then joins the
    # sequences' gradients in one cat, where each slice's backward would zero-fill a
    # full-length buffer (forward + backward 0.37-0.98x the slices' time on a CPU).
    lengths = layout.lengths
    segments = [
        F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=True, scale=scaling, enable_gqa=gqa
        )
        for q, k, v in zip(
            query.split(lengths, dim=2),
            key.split(lengths, dim=2),
            value.split(lengths, dim=2),
            strict=True,
        )
    ]
    return torch.cat(segments, dim=2).transpose(1, 2).contiguous(), None


def masked_kv(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, expand: bool
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """key and value for an sdpa call with a mask, and its `enable_gqa`. With grouped-query
    attention and a mask, CUDA's sdpa has no fused kernel (flash takes no mask, the
    memory-efficient kernel no GQA) and falls back to the math kernel, which materialises
    (heads, T, T) scores; with `expand` the kv heads are repeated to the query's, a copy of
    2 x (T, kv_heads x group, d), and the memory-efficient kernel takes the call. The CPU
    kernels take GQA with a mask as it is."""
    group = query.shape[1] // key.shape[1]
    if group == 1:
        return key, value, False
    if not expand:
        return key, value, True
    return key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1), False


def varlen_mask(**kwargs: Any) -> Any:
    """No mask for packed inputs (the position ids say where sequences start); sdpa's mask
    for padded ones. transformers passes every argument by keyword."""
    if kwargs.get("attention_mask") is None:
        return None
    return sdpa_mask(**kwargs)


def register() -> str:
    """Make `sdpa_varlen` a transformers attention implementation; returns its name."""
    AttentionInterface.register(NAME, varlen_sdpa_attention)
    AttentionMaskInterface.register(NAME, varlen_mask)
    return NAME
