"""Ulysses sequence parallelism for attention: the head rule, the two all-to-alls and the
wrapper that runs any packed attention function (`fn(module, q, k, v, mask, ...)`) on a row
split by sequence across the ranks of a process group.

The DeepSpeed-Ulysses scheme (as in verl): each of the sp ranks holds a contiguous slice of
t = T / sp tokens of one packed row, all heads. An all-to-all turns that into the whole row
for H / sp heads, attention runs per head as usual (so the inner function sees every packed
sequence whole, and only needs the full row's boundaries in its kwargs), and a second
all-to-all turns the output back into this rank's tokens, all heads. Gradients flow back
through the same all-to-alls (`all_to_all_single_autograd`), so the wrapper is
differentiable end to end.

Shapes: q (1, q_heads, t, d), k/v (1, kv_heads, t, d) per rank in; (1, t, q_heads, d) out.
The caller pads T to a multiple of sp (`padded_length`) before slicing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_to_all_single_autograd

AttentionFn = Callable[..., tuple[torch.Tensor, Any]]
"""transformers' attention interface: fn(module, q, k, v, mask, dropout=, scaling=, **kw)."""


def check_head_rule(q_heads: int, kv_heads: int, sp: int) -> None:
    """Raise ValueError unless the heads split evenly over sp ranks: sp divides the query
    heads, and either sp divides the kv heads or the kv heads divide sp (then each kv head
    is repeated onto the sp / kv_heads ranks whose query heads use it)."""
    if q_heads % sp != 0:
        raise ValueError(
            f"Ulysses sequence parallelism needs sp to divide the query heads: "
            f"q_heads={q_heads} is not a multiple of sp={sp}"
        )
    if kv_heads % sp != 0 and sp % kv_heads != 0:
        raise ValueError(
            f"Ulysses sequence parallelism needs sp to divide the kv heads or the kv heads to "
            f"divide sp: kv_heads={kv_heads}, sp={sp} (and sp must divide the query heads, "
            f"q_heads={q_heads})"
        )


def padded_length(tokens: int, sp: int) -> int:
    """The smallest multiple of sp that holds `tokens`: the row length each rank slices."""
    return -(-tokens // sp) * sp


def seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(1, H, t, d) this rank's tokens, all heads -> (1, H/sp, t*sp, d) this rank's heads,
    the whole row. Rank r gets head block r from every rank, in rank (= sequence) order."""
    sp = dist.get_world_size(group)
    _, heads, t, d = x.shape
    # all_to_all_single splits dim 0 by destination rank: put the head blocks there.
    blocks = x[0].reshape(sp, heads // sp, t, d).contiguous()
    received = all_to_all_single_autograd(blocks, None, None, group)  # (sp_src, H/sp, t, d)
    return received.transpose(0, 1).reshape(1, heads // sp, sp * t, d)


def heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(1, T, H/sp, d) this rank's heads over the whole row -> (1, T/sp, H, d) this rank's
    tokens, all heads: the inverse of `seq_to_heads` in the attention output's layout."""
    sp = dist.get_world_size(group)
    _, tokens, heads, d = x.shape
    # Sequence blocks along dim 0, one per destination rank (already contiguous row-major).
    blocks = x[0].reshape(sp, tokens // sp, heads, d).contiguous()
    received = all_to_all_single_autograd(blocks, None, None, group)  # (sp_src, t, H/sp, d)
    return received.transpose(0, 1).reshape(1, tokens // sp, sp * heads, d)


def repeat_kv_for_sp(kv: torch.Tensor, sp: int) -> torch.Tensor:
    """(1, kv_heads, t, d) -> (1, max(kv_heads, sp), t, d). Where kv_heads < sp, each kv head
    is repeated sp / kv_heads times in place (repeat_interleave, not tile): after the split
    rank r then holds kv head r // (sp / kv_heads), the one GQA's query heads on rank r use
    (query head h reads kv head h // (q_heads / kv_heads))."""
    kv_heads = kv.shape[1]
    if kv_heads % sp == 0:
        return kv
    if sp % kv_heads != 0:
        raise ValueError(f"kv_heads={kv_heads} neither divides nor is a multiple of sp={sp}")
    return kv.repeat_interleave(sp // kv_heads, dim=1)


def ulysses_attention(
    inner: AttentionFn,
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    group: dist.ProcessGroup,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Run `inner` on this rank's heads over the whole row; return this rank's tokens.

    query (1, q_heads, t, d), key/value (1, kv_heads, t, d) -> ((1, t, q_heads, d), None).
    attention_mask and kwargs (position ids, cu_seq_lens, ...) go to `inner` unchanged: they
    must describe the full padded row of t * sp tokens, since that is what `inner` attends
    over."""
    sp = dist.get_world_size(group)
    if sp == 1:
        out, _ = inner(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
        return out, None
    check_head_rule(query.shape[1], key.shape[1], sp)
    # Each rank keeps q_heads/sp query heads and max(kv_heads/sp, 1) kv heads: the GQA ratio
    # the inner function expands with stays the one its query heads need (see repeat_kv_for_sp).
    key, value = repeat_kv_for_sp(key, sp), repeat_kv_for_sp(value, sp)
    q, k, v = (seq_to_heads(x, group) for x in (query, key, value))
    out, _ = inner(module, q, k, v, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    return heads_to_seq(out, group), None
