"""What the three GPU smoke scripts (tests/gpu/smoke_*.py) share: the run record, the model
shapes, a randomly initialised FSDP2 model, synthetic packed batches, memory snapshots.

`Smoke` is one run: its deadline, its progress log (printed and written to
`<out>/<name>.log`), its figures, its named checks, and `<out>/<name>.json` at the end. A
failed check or a section that raises is recorded under its name and the run goes on with
what does not depend on it. Exit code: 1 when anything failed, 2 when the deadline cut work
short, else 0.

The scripts run on a bare GPU machine without ray, vllm, hydra or omegaconf, where `hybrid`
is not installed: importing this module puts the repository root on `sys.path`, so it must
be imported before any `hybrid` module (isort keeps it there: it sorts as third-party).
"""

# ruff: noqa: E402 (the repository root goes on sys.path before the first hybrid import)
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from hybrid.data import Batch
from hybrid.data.sample import position_ids_from_mask
from hybrid.memory.ledger import MemoryLedger
from hybrid.memory.records import GIB, MemoryRecord
from hybrid.models import TinyModelConfig, hf_config
from hybrid.workers import varlen_attention
from hybrid.workers.fsdp import _init_rope_buffers

T = TypeVar("T")

# Decoder shapes by name. The vocabulary is always the tiny tokenizer's (272 ids), so the
# LM head stays small unless a script overrides vocab_size.
SHAPES: dict[str, TinyModelConfig] = {
    "tiny": TinyModelConfig.preset("tiny", max_position_embeddings=8192),
    "bench-100m": TinyModelConfig.preset("bench-100m", max_position_embeddings=8192),
    "qwen2.5-0.5b": TinyModelConfig(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": TinyModelConfig(
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
    "qwen2.5-7b": TinyModelConfig(
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    ),
}


# --- the run record --------------------------------------------------------------------------


class Smoke:
    """One smoke run: deadline, log, figures, named checks, JSON result."""

    def __init__(self, name: str, out_dir: Path, budget_s: float) -> None:
        self.name = name
        self.out_dir = out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.deadline = self.started + budget_s
        self.log_file = (out_dir / f"{name}.log").open("w")
        self.figures: dict[str, Any] = {}
        self.checks: dict[str, dict[str, Any]] = {}
        self.skipped: dict[str, str] = {}
        self.cut_short: list[str] = []

    def left_s(self) -> float:
        """Seconds left before the deadline."""
        return self.deadline - time.monotonic()

    def log(self, message: str) -> None:
        line = f"[{self.name} {time.monotonic() - self.started:7.1f}s] {message}"
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    def figure(self, key: str, value: Any) -> None:
        self.figures[key] = value
        self.log(f"  {key} = {_text(value)}")

    def check(self, name: str, ok: bool, detail: str) -> bool:
        """Record a named check; a failure does not stop the run, it fails its exit code."""
        self.checks[name] = {"ok": bool(ok), "detail": detail}
        self.log(f"  {'PASS' if ok else 'FAIL'} [{name}] {detail}")
        return bool(ok)

    def skip(self, name: str, reason: str, deadline: bool = False) -> None:
        """Record work left out: by design (listed in the verdict), or for the deadline
        (the run is incomplete: exit code 2)."""
        self.skipped[name] = reason
        if deadline:
            self.cut_short.append(name)
        self.log(f"SKIP {name} ({reason})")

    def section(self, name: str, needs_s: float, fn: Callable[..., T], *args: Any) -> T | None:
        """Run `fn(*args)` as a named section: skipped (None) when fewer than `needs_s`
        seconds are left; an exception is recorded as the failed check `name` (None)."""
        if self.left_s() < needs_s:
            reason = f"deadline: {self.left_s():.0f}s left, needs {needs_s:.0f}s"
            self.skip(name, reason, deadline=True)
            return None
        self.log(f"== {name}")
        start = time.monotonic()
        try:
            result = fn(*args)
        except Exception as error:  # recorded by name; the remaining sections still run
            self.log(traceback.format_exc().rstrip())
            self.check(name, False, f"raised {type(error).__name__}: {error}")
            return None
        self.log(f"   {name} done in {time.monotonic() - start:.1f}s")
        return result

    def finish(self, args: argparse.Namespace) -> int:
        """Write `<out>/<name>.json`, print the figures and the verdict; the exit code."""
        failed = sorted(name for name, c in self.checks.items() if not c["ok"])
        wall_s = round(time.monotonic() - self.started, 1)
        result = {
            "script": self.name,
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "torch": torch.__version__,
            "wall_s": wall_s,
            "figures": self.figures,
            "checks": self.checks,
            "skipped": self.skipped,
            "cut_short_by_deadline": self.cut_short,
            "failed": failed,
        }
        path = self.out_dir / f"{self.name}.json"
        path.write_text(json.dumps(result, indent=2, default=str))
        self.log(f"figures ({path}):")
        for key, value in self.figures.items():
            self.log(f"  {key} = {_text(value)}")
        if failed:
            verdict, code = f"FAILED {failed}", 1
        elif self.cut_short:
            verdict, code = f"INCOMPLETE (deadline) {sorted(self.cut_short)}", 2
        else:
            verdict, code = "OK", 0
        skipped = f", skipped {sorted(self.skipped)}" if self.skipped else ""
        self.log(
            f"{verdict}: {len(self.checks) - len(failed)}/{len(self.checks)} checks "
            f"passed{skipped}, {wall_s}s"
        )
        self.log_file.close()
        return code


def _text(value: Any) -> str:
    return json.dumps(value, default=str) if isinstance(value, dict | list) else str(value)


def base_parser(description: str, budget_s: float) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="directory for JSON and logs")
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cuda (the real run) or cpu (small shapes, gloo or fake process group: a logic "
        "check on a machine without a GPU)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=budget_s,
        help="wall-clock budget; later sections are skipped or shortened to stay within it",
    )
    return parser


def script_device(name: str) -> torch.device:
    if name == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("FAIL [cuda_available]: --device cuda but no CUDA device is visible")
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    return torch.device("cpu")


# --- device memory and time ----------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable[[], T]) -> tuple[T, float]:
    """(fn(), seconds), with the device synchronised before and after."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, time.perf_counter() - start


def gib(nbytes: float) -> float:
    return round(nbytes / GIB, 4)


def allocated(device: torch.device) -> int:
    """CUDA allocated bytes (0 on CPU, where no allocator counts)."""
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_allocated(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def release(device: torch.device) -> None:
    """Free dropped models now (modules and autograd keep reference cycles) and return the
    cached blocks to the driver."""
    gc.collect()
    empty_cache(device)


def empty_cache(device: torch.device) -> None:
    """Return the caching allocator's free blocks to the driver."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def device_info(device: torch.device) -> dict[str, float | None]:
    """`torch.cuda.mem_get_info` in GiB: what the driver sees, the CUDA context, NCCL and the
    allocator's cache included (None on CPU)."""
    if device.type != "cuda":
        return {"free_gib": None, "total_gib": None, "used_gib": None}
    free, total = torch.cuda.mem_get_info(device)
    return {"free_gib": gib(free), "total_gib": gib(total), "used_gib": gib(total - free)}


class DeviceLedger(MemoryLedger):
    """The memory ledger, plus `mem_get_info` and a run label at every boundary: the gap
    between the driver's view and the allocator's is the CUDA context, NCCL and the cache."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.label = ""
        self.rows: list[dict[str, Any]] = []

    def record(
        self,
        phase: str,
        chunk: int | None = None,
        transient: dict[str, int] | None = None,
        reuse_components: bool = False,
    ) -> MemoryRecord:
        entry = super().record(phase, chunk, transient, reuse_components)
        row = {"label": self.label, **dataclasses.asdict(entry), **device_info(self.device)}
        self.rows.append(row)
        return entry

    def untrack(self, name: str) -> None:
        """Forget a member's component source (it holds the member: drop it with the member)."""
        self._sources.pop(name, None)

    def phase_peaks(self, label: str) -> dict[str, dict[str, Any]]:
        """Per phase of the rows labelled `label`: the highest peak and the last free."""
        peaks: dict[str, dict[str, Any]] = {}
        for row in self.rows:
            if row["label"] != label:
                continue
            seen = peaks.setdefault(row["phase"], {"peak_gib": 0.0})
            seen["peak_gib"] = round(max(seen["peak_gib"], row["peak_gib"]), 4)
            seen["free_gib"] = row["free_gib"]
        return peaks

    def write(self, path: Path) -> None:
        path.write_text(json.dumps({"records": self.rows}, indent=1))


# --- models and batches ----------------------------------------------------------------------


def random_fsdp_model(
    config: TinyModelConfig,
    mesh: DeviceMesh,
    device: torch.device,
    *,
    param_dtype: torch.dtype = torch.bfloat16,
    gradient_checkpointing: bool = True,
    vocab: int | None = None,
    seed: int = 0,
) -> nn.Module:
    """A causal LM of `config`'s shape (its vocabulary or `vocab` ids), sharded like
    hybrid.workers.fsdp.build_fsdp_model (built on meta in fp32, `fully_shard` per layer and
    the root, bf16 compute with fp32 reduction, `sdpa_varlen`), with random weights drawn
    on the device instead of a checkpoint load: no host copy of a multi-GB model."""
    hf = hf_config(config)
    if vocab is not None:
        hf.vocab_size = vocab
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            hf, attn_implementation=varlen_attention.register(), dtype=torch.float32
        )
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.train()
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=True)
    model.to_empty(device=device)
    if config.tie_word_embeddings:
        model.tie_weights()
        assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    _init_rope_buffers(model, device)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            local = param.to_local() if isinstance(param, DTensor) else param
            if name.endswith("norm.weight"):
                local.fill_(1.0)
            elif name.endswith(".bias"):
                local.zero_()
            else:
                local.normal_(0.0, config.initializer_range, generator=generator)
    return model


def synthetic_batch(
    prompt_lengths: list[int], response_lengths: list[int], vocab: int, seed: int = 0
) -> Batch:
    """Rows as the rollout delivers them: prompts left-padded to the longest, responses
    right-padded, random token ids. Old and rollout log-probs sit near a uniform policy's
    (-log vocab), so the first ratios are near 1 and the loss depends on the model."""
    g = torch.Generator().manual_seed(seed)
    rows, width_p, width_r = len(prompt_lengths), max(prompt_lengths), max(response_lengths)
    prompt = torch.tensor(prompt_lengths)[:, None]
    response = torch.tensor(response_lengths)[:, None]
    prompt_mask = (torch.arange(width_p) >= width_p - prompt).long()
    response_mask = (torch.arange(width_r) < response).long()
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    ids = torch.randint(1, vocab, mask.shape, generator=g) * mask
    log_probs = -math.log(vocab) + 0.1 * torch.randn((rows, width_r), generator=g)
    return Batch.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": position_ids_from_mask(mask),
            "responses": ids[:, width_p:],
            "response_mask": response_mask,
            "old_log_probs": log_probs * response_mask,
            "rollout_log_probs": log_probs * response_mask,
            "advantages": torch.randn(rows, generator=g),
        }
    )
