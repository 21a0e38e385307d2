"""What a weight sync sends when the actor carries LoRA adapters.

Two modes (`sync.lora_mode`):
  adapter: the frozen base reaches the engine once (the first sync after the engine starts),
           under its Hugging Face names; every sync then gathers only the lora_A / lora_B
           tensors, writes them as a peft adapter to a RAM-backed directory and has vLLM
           reload that adapter in place (`LoRARequest(..., load_inplace=True)`). vLLM's
           public LoRA API takes adapters from a path; /dev/shm keeps it off the disk.
  merge:   every sync sends full weights with the adapters folded in, W + (alpha / r) B A in
           fp32, cast to the engine's dtype: the engine needs no LoRA support (TRL's way; the
           slow baseline). Adapters on a mixture of experts' stacked experts are merged
           expert by expert (merge_experts_into_base); they have no adapter mode.
`sync.layered_summon` gathers one decoder layer's tensors at a time (else all at once), so
the peak is one layer's adapters (adapter) or one layer's base + adapters (merge).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from hybrid.sharding.gather import (
    Granularity,
    NamedParam,
    full_parameter,
    group_parameters,
    iter_full_tensors,
    prefetched_groups,
)
from hybrid.sharding.lora_files import (
    AdapterSpec,
    ExpertAdapter,
    hf_name,
    is_lora_name,
    merge_experts_into_base,
    merge_into_base,
    write_adapter_config,
    write_adapter_weights,
)

GroupDone = Callable[[int, int], None]


@dataclass
class SyncTally:
    """Tensors and bytes one sync handed to the engine."""

    tensors: int = 0
    bytes: int = 0

    def count(self, tensor: torch.Tensor) -> None:
        self.tensors += 1
        self.bytes += tensor.nbytes


def counted(weights: Iterator[NamedParam], tally: SyncTally) -> Iterator[NamedParam]:
    for name, tensor in weights:
        tally.count(tensor)
        yield name, tensor


def adapter_directory(rank: int) -> Path:
    """A per-process directory in RAM (/dev/shm) when there is one, for the adapter files."""
    root = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return Path(root) / f"hybrid-lora-{os.getpid()}-rank{rank}"


class LoraSync:
    """Gathers a peft actor's tensors for the engine: its base, its adapter, or both merged."""

    def __init__(
        self,
        actor: torch.nn.Module,
        spec: AdapterSpec,
        directory: Path,
        dtype: torch.dtype,
        experts: dict[str, ExpertAdapter] | None = None,
    ) -> None:
        """`dtype` is the engine's: every tensor handed over is cast to it (the merge itself
        runs in fp32). `experts`: the adapters on stacked expert tensors, by the peft name of
        the tensor each adapts (hybrid.workers.lora.expert_adapters)."""
        self.spec = spec
        self.experts = experts or {}
        self.directory = directory
        self.dtype = dtype
        named: list[NamedParam] = list(actor.named_parameters())
        self.base = [(name, p) for name, p in named if not is_lora_name(name)]
        self.adapter = [(name, p) for name, p in named if is_lora_name(name)]
        self.all = named
        self.config_written = False

    @staticmethod
    def granularity(layered: bool) -> Granularity:
        return "layer" if layered else "full"

    def iter_base(
        self, granularity: Granularity, bucket_bytes: int, on_group_done: GroupDone | None
    ) -> Iterator[NamedParam]:
        """The frozen base, full tensors in the engine's dtype, under Hugging Face names."""
        full = iter_full_tensors(self.base, granularity, self.dtype, bucket_bytes, on_group_done)
        return ((hf_name(name), tensor) for name, tensor in full)

    def gather_adapter(
        self, layered: bool, on_group_done: GroupDone | None
    ) -> dict[str, torch.Tensor]:
        """Every adapter tensor, full, in the engine's dtype, by peft name, on the host."""
        tensors: dict[str, torch.Tensor] = {}
        groups = group_parameters(self.adapter, self.granularity(layered), 0, self.dtype)
        for index, gathered in enumerate(prefetched_groups(groups, self.dtype)):
            full = dict(gathered)
            if on_group_done is not None:
                on_group_done(index, sum(t.nbytes for t in full.values()))
            # The file is written from host memory: few groups are on the device at once.
            tensors.update({name: t.cpu() for name, t in full.items()})
        return tensors

    def write_adapter(self, tensors: dict[str, torch.Tensor]) -> Path:
        """The adapter as peft files in this process's directory. The config never changes:
        it is written once; later syncs replace only the weights file."""
        if not self.config_written:
            shutil.rmtree(self.directory, ignore_errors=True)
            write_adapter_config(self.directory, self.spec)
            self.config_written = True
        return write_adapter_weights(self.directory, tensors)

    def remove_files(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        self.config_written = False

    def iter_merged(self, layered: bool, on_group_done: GroupDone | None) -> Iterator[NamedParam]:
        """Full weights with each adapter folded into its base weight, Hugging Face names."""
        groups = group_parameters(self.all, self.granularity(layered), 0, self.dtype)
        for index, group in enumerate(groups):
            # Adapters in fp32 for the merge; the base in the engine's dtype.
            full = {
                name: full_parameter(p, torch.float32 if is_lora_name(name) else self.dtype)
                for name, p in group
            }
            merged = []
            for name, tensor in full.items():
                if is_lora_name(name):
                    continue
                module = name.rsplit(".base_layer.", 1)[0]
                lora_a = full.get(f"{module}.lora_A.default.weight")
                expert = self.experts.get(name)
                if expert is not None:  # a layer's group holds its experts' adapters too
                    a, b = full[expert.lora_a], full[expert.lora_b]
                    tensor = merge_experts_into_base(tensor, a, b, expert)
                elif name.endswith(".base_layer.weight") and lora_a is not None:
                    lora_b = full[f"{module}.lora_B.default.weight"]
                    tensor = merge_into_base(tensor, lora_a, lora_b, self.spec.scaling)
                merged.append((hf_name(name), tensor))
            nbytes = sum(t.nbytes for t in full.values())
            del full
            merged.reverse()
            while merged:
                yield merged.pop()
            if on_group_done is not None:
                on_group_done(index, nbytes)
