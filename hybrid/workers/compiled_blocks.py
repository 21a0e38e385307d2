"""Decoder layers compiled one by one with torch.compile (`actor.compile`, `ref.compile`,
`critic.compile`, `distill.compile`).

Why per block and not the whole model: every decoder layer runs the same code, so one
compiled graph (parameters are its inputs) serves all of them and compiling costs one layer's
trace, not the model's; FSDP2's hooks stay outside the graphs (dynamo skips them by default),
so the all-gathers and reduce-scatters run as in eager mode. What compiling buys is the
elementwise work between the matmuls fused into a few kernels: RMSNorm, the rotary embedding,
SwiGLU, the residual adds and the dtype casts around them (on a GPU profile of the eager update
they were about half of the device time).

Shapes are dynamic from the first call: packed micro-batches differ in length every step, and
a graph specialised to one length would recompile for the next. The attention call stays
eager: our varlen sdpa reads the packed sequence bounds on the host
(hybrid.workers.varlen_attention), so each layer runs as two graphs around it.

torch.compile works lazily: a layer is traced and compiled at its first call. A compile that
fails there is an error naming the layer when the user asked for `on`, and with `auto` a
warning naming the layer, after which that layer runs eagerly from then on. (A backward graph
that AOT autograd could not compile at the first forward is compiled again at the first
backward; a failure there ends the step, whatever the setting.) With TORCHDYNAMO_DISABLE=1 in
the environment nothing compiles: the layers stay eager, with a warning.
`compiled_graphs()` counts what dynamo compiled in this process: the actor reports the graphs
each update compiled (actor/compiled_graphs), which is 0 after the first one unless something
recompiles.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch._dynamo.exc import TorchDynamoException
from torch._dynamo.utils import counters

from hybrid.workers.config import KernelChoice

log = logging.getLogger(__name__)

BACKEND = "inductor"


def resolve_compile(
    choice: KernelChoice, owner: str, *, on_cuda: bool, mixture_of_experts: bool, vision: bool
) -> bool:
    """Whether `owner`'s model compiles its decoder layers: `auto` on CUDA for a dense text
    model; `on` anywhere it can (a mixture of experts or a vision-language model is refused:
    their routing records and image rows are written from inside the layers, which the graphs
    would not replay)."""
    if choice == "off":
        return False
    unsupported = (
        "a mixture-of-experts model (the router's records are written inside the layers)"
        if mixture_of_experts
        else "a vision-language model (not covered by the compiled path yet)"
        if vision
        else None
    )
    if choice == "auto":
        return on_cuda and unsupported is None
    if unsupported is not None:
        raise ValueError(
            f"{owner}.compile=on: compiled decoder layers are not supported for {unsupported}; "
            f"set {owner}.compile=off (or auto, which leaves it off)"
        )
    return True


def compile_blocks(
    layers: Sequence[tuple[str, nn.Module]],
    owner: str,
    *,
    required: bool,
    backend: str | Callable[..., Any] = BACKEND,
) -> None:
    """Compile each (name, layer) in place, dynamic shapes. `required`: a failing compile
    raises naming the layer (compile=on); otherwise the layer warns and stays eager."""
    if torch._dynamo.config.disable:
        log.warning(
            "%s.compile: TORCHDYNAMO_DISABLE is set, so torch.compile does nothing; the %d "
            "decoder layers run eagerly",
            owner,
            len(layers),
        )
        return
    for name, layer in layers:
        layer.compile(dynamic=True, backend=backend)
        # Module.compile keeps the compiled callable in `_compiled_call_impl`; wrapping it is
        # the one way to see the failure of the lazy first compile and fall back per layer.
        compiled = layer._compiled_call_impl
        assert compiled is not None
        layer._compiled_call_impl = _FirstCallGuard(compiled, layer, name, owner, required)


class _FirstCallGuard:
    """Calls a layer's compiled forward; the first call's compile failure is an error (on)
    or a warning and an eager layer (auto)."""

    def __init__(
        self,
        compiled: Callable[..., Any],
        layer: nn.Module,
        name: str,
        owner: str,
        required: bool,
    ) -> None:
        self.compiled = compiled
        self.layer = layer
        self.name = name
        self.owner = owner
        self.required = required
        self.compiled_once = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.compiled_once:
            return self.compiled(*args, **kwargs)
        try:
            out = self.compiled(*args, **kwargs)
        except TorchDynamoException as error:
            if self.required:
                raise RuntimeError(
                    f"{self.owner}.compile=on: compiling {self.name} failed "
                    f"({type(error).__name__}: {_first_line(error)}); set {self.owner}.compile="
                    "off, or auto to run the layers that fail eagerly"
                ) from error
            log.warning(
                "%s.compile=auto: compiling %s failed (%s: %s); it runs eagerly",
                self.owner,
                self.name,
                type(error).__name__,
                _first_line(error),
            )
            self.layer._compiled_call_impl = None
            return self.layer._call_impl(*args, **kwargs)
        self.compiled_once = True
        return out


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (its own counter): a number that
    grows after the first step means shapes or guards are recompiling."""
    return int(counters["stats"]["unique_graphs"])


def is_compiled(layer: nn.Module) -> bool:
    """The layer runs through a compiled graph (not, or no longer, eager)."""
    return getattr(layer, "_compiled_call_impl", None) is not None


def compiled_layers(model: nn.Module) -> list[str]:
    """Names of the model's modules that run compiled."""
    return [name for name, module in model.named_modules() if is_compiled(module)]
