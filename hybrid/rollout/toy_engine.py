"""The toy rollout engine: the `RolloutEngine` protocol over the Hugging Face model itself, on
CPU, for tests that vary only the driver logic (split styles, transports, fully-async pacing)
and cannot afford vLLM's ~20-30 s start per process. It starts in well under a second and still
receives real weights from the sync.

What it keeps from `VllmEngine` (hybrid.rollout.vllm_engine), so drivers see the same contract:
- Samples: `rollout.n` per prompt, prompt-major (a call's own `Sampling.n` when it passes one,
  as validation does); `max_tokens` per prompt.
- Seeds: with per-request seeds (`rollout.seed_requests`, hybrid.rollout.engine_args), sample
  j of a prompt seeded s draws from its own generator seeded s + j, the child seeds vLLM's
  parallel sampling gives; so `generate` and `submit` of `Continuation(..., seed=s + j)` give
  the same tokens. Unseeded requests take a seed from the engine's generator (rollout.seed +
  the data-parallel rank), in submission order.
- Sampling, per token as vLLM v1's sampler: temperature below 1e-5 is greedy (argmax of the raw
  logits); else logits / temperature, then top-k, then top-p (`filter_top_k_top_p`), then the
  exponential race argmax(probs / Exp(1) noise) that vLLM samples with.
- Log-probs: vLLM 0.32 (the version pinned here) returns `logprobs_mode="raw_logprobs"` by
  default and hybrid never changes it: the fp32 log-softmax of the model's raw logits, before
  temperature, top-k and top-p. The toy engine returns exactly that.
- Stopping: the tokenizer's EOS and the generation config's eos ids stop a request (the stop
  token is kept in `token_ids`, `stopped=True`) unless `rollout.ignore_eos`; requests with
  their own `Sampling` (greedy ones included) always stop at EOS, as VllmEngine's do. EOS is
  checked before the budget, as vLLM does, and no sequence grows past rollout.max_model_len.
- Text: `generate` decodes with skip_special_tokens; `step` deltas carry no text (VllmEngine's
  streaming requests do not detokenize either).

What differs, on purpose: every request runs alone (batch of one, its own KV cache), so a
request's tokens do not depend on which other requests share the engine, the batch, or the
step: generate and submit/step agree bit for bit, and so do any two drivers that hand the same
rows to the engine. That costs batching (about 1 ms per token for the tiny model). No prefix
cache, no sleep mode, no tensor parallelism (refused); each rank holds its own copy of the
model and never touches torch.distributed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hybrid.data.images import ImageSet
from hybrid.dtypes import Dtype, torch_dtype
from hybrid.models.routers import experts_dtype, find_routers
from hybrid.rollout.base import (
    Continuation,
    GeneratedSample,
    ResumeTag,
    Sampling,
    response_text,
)
from hybrid.rollout.checksum import WeightChecks, digest_of
from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.engine_args import EngineSite, engine_seed, seeds_requests
from hybrid.rollout.weights import (
    RequestedStrategy,
    WeightFacts,
    WeightsDigest,
    choose_strategy,
    stored_apart,
)

GREEDY_BELOW = 1e-5
NO_DIRECT = ("the toy engine copies into its Hugging Face module (it has no direct loaders)",)
"""Temperatures below this sample greedily (vLLM's _SAMPLING_EPS)."""
ADAPTER_NAME = "default"


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float
    top_k: int
    """-1: off."""
    top_p: float
    ignore_eos: bool

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """`logits` (vocab,) with everything outside the top-k, then outside the top-p mass, set
    to -inf, as vLLM's apply_top_k_top_p_pytorch: ties with the k-th value stay, and the most
    likely token always stays."""
    vocab = logits.shape[-1]
    use_k = top_k != -1 and top_k < vocab
    if not use_k and top_p >= 1.0:
        return logits
    ascending, order = logits.sort(descending=False)
    if use_k:
        ascending = ascending.masked_fill(ascending < ascending[vocab - top_k], float("-inf"))
    if top_p < 1.0:
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        outside = cumulative <= 1.0 - top_p
        outside[-1] = False
        ascending = ascending.masked_fill(outside, float("-inf"))
    return torch.empty_like(logits).scatter_(0, order, ascending)


def sample_token(
    logits: torch.Tensor, settings: SamplingSettings, generator: torch.Generator
) -> int:
    """One token from raw `logits` (vocab,). Draws vocab Exp(1) values from `generator` unless
    greedy."""
    raw = logits.float()
    if settings.greedy:
        return int(raw.argmax())
    scaled = filter_top_k_top_p(raw / settings.temperature, settings.top_k, settings.top_p)
    probs = scaled.softmax(dim=-1)
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return int((probs / noise).argmax())


def stop_token_ids(tokenizer: Any, eos_from_generation_config: int | list[int] | None) -> set[int]:
    """The tokenizer's EOS plus the generation config's eos ids (what vLLM stops on)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    if isinstance(eos_from_generation_config, int):
        ids.add(eos_from_generation_config)
    elif eos_from_generation_config is not None:
        ids.update(eos_from_generation_config)
    return ids


class _Request:
    """One sample being generated: its tokens so far (prompt first) and its KV cache."""

    def __init__(self, request: Continuation, settings: SamplingSettings, seed: int) -> None:
        self.token_ids = list(request.token_ids)
        self.num_prompt = len(request.token_ids)
        self.max_tokens = request.max_tokens
        self.settings = settings
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.cache: Any = None
        self.num_cached = 0
        """Tokens whose keys and values are in `cache`."""
        self.routing: list[torch.Tensor] = []
        """With rollout.return_routed_experts: (tokens, MoE layers, top-k) per forward."""

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.num_prompt


class ToyEngine:
    """Implements `RolloutEngine` over `AutoModelForCausalLM` on CPU (see the module doc)."""

    def __init__(
        self,
        model_path: str,
        config: RolloutConfig,
        device: torch.device,
        dtype: Dtype,
        lora_rank: int = 0,
        site: EngineSite | None = None,
    ) -> None:
        """Same arguments as VllmEngine. The model always lives on the CPU, whatever `device`:
        the tests this engine serves run there. `lora_rank` > 0 allows `load_adapter`."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if config.tensor_parallel_size != 1:
            raise ValueError(
                "rollout.engine=toy holds the whole model on every rank and has no tensor "
                f"parallelism: rollout.tensor_parallel_size must be 1, got "
                f"{config.tensor_parallel_size} (use rollout.engine=vllm)"
            )
        self.config = config
        self.dtype = dtype
        self.lora_rank = lora_rank
        self.site = site or EngineSite("cpu", 0, 0)
        self.seed_requests = seeds_requests(config, self.site)
        self._engine_generator = torch.Generator(device="cpu").manual_seed(
            engine_seed(config, self.site)
        )
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype(dtype))
        self._model: torch.nn.Module | None = model.eval().requires_grad_(False)
        # Parameters and persistent buffers by state-dict name, taken before any adapter
        # wraps a layer: the same tensors stay the base under peft, so the names stay HF's.
        self._targets: dict[str, torch.Tensor] = dict(model.state_dict(keep_vars=True))
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self._stop_ids = stop_token_ids(self.tokenizer, model.generation_config.eos_token_id)
        self._peft: Any = None
        self._live: dict[str, _Request] = {}
        # Nothing is ever released (see `release`).
        self.resident: set[ResumeTag] = {"weights", "kv_cache"}
        self._checks = WeightChecks(self.stored_weights, lambda name: name)
        self._routers = find_routers(model) if config.return_routed_experts else []
        if config.return_routed_experts and not self._routers:
            raise ValueError(
                f"rollout.return_routed_experts: {model_path} is a dense model (no MoE router)"
            )
        self._chosen: dict[int, torch.Tensor] = {}
        """Each router's experts in the forward running now (the hooks write them)."""
        for router in self._routers:
            router.module.register_forward_hook(self._recorder(router.layer))

    def _recorder(self, layer: int) -> Callable[[torch.nn.Module, Any, Any], None]:
        def record(module: torch.nn.Module, args: Any, output: Any) -> None:
            self._chosen[layer] = output[2].detach()

        return record

    @classmethod
    def supports_lora(cls, architecture: str) -> bool:
        """peft serves any architecture the Hugging Face model has."""
        return True

    @classmethod
    def describe_site(cls, config: RolloutConfig, site: EngineSite, adapter_sync: bool) -> str:
        return (
            "toy engine on cpu (the Hugging Face model, one request at a time, no KV cache "
            f"preallocated): seed_requests={seeds_requests(config, site)}"
        )

    @classmethod
    def check_kv_budget(
        cls, config: RolloutConfig, site: EngineSite, kv_bytes_per_token: int
    ) -> None:
        """Each request grows its own cache: nothing to size."""

    @property
    def _module(self) -> torch.nn.Module:
        """The Hugging Face module (by reference; LoRA layers injected once an adapter is
        loaded, the base weights then under `.base_layer.`). Read here only: callers use the
        protocol's verbs."""
        if self._model is None:
            raise RuntimeError("the toy engine was shut down")
        return self._model

    @property
    def kv_cache_bytes(self) -> int:
        """Nothing is preallocated: each request's cache grows with it and goes with it."""
        return 0

    @property
    def weights_kept_on_host(self) -> bool:
        """`release` frees nothing, so the weights never wait anywhere else."""
        return False

    @property
    def banned_tokens(self) -> frozenset[int]:
        """A text-only engine bans nothing."""
        return frozenset()

    # --- generation -----------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[list[int]],
        *,
        sampling: Sampling | None = None,
        seeds: Sequence[int] | None = None,
        max_tokens: Sequence[int] | None = None,
        images: Sequence[ImageSet | None] | None = None,
    ) -> list[GeneratedSample]:
        """`rollout.n` samples per prompt (`sampling.n` when given), prompt-major; `max_tokens`
        per prompt (default: rollout.response_length); `seeds` per prompt (sample j: seed + j)."""
        _refuse_images(images)
        budgets = [self.config.response_length] * len(prompts) if max_tokens is None else max_tokens
        if len(budgets) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(budgets)} max_tokens")
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        num_samples = self.config.n if sampling is None else sampling.n
        settings = self._settings(sampling)
        row_seeds = None if sampling is not None and sampling.greedy else seeds
        samples = []
        for index, (prompt, budget) in enumerate(zip(prompts, budgets, strict=True)):
            for j in range(num_samples):
                seed = None if row_seeds is None else int(row_seeds[index]) + j
                request = self._request(Continuation(list(prompt), int(budget), seed), settings)
                samples.append(self._run(request))
        return samples

    def _run(self, request: _Request) -> GeneratedSample:
        log_probs = []
        while True:
            log_prob, finished, stopped = self._advance(request)
            log_probs.append(log_prob)
            if finished:
                break
        response = request.token_ids[request.num_prompt :]
        text = response_text(self.tokenizer, response)
        return GeneratedSample(response, log_probs, text, stopped, self._routing_of(request))

    def _routing_of(self, request: _Request) -> torch.Tensor | None:
        """The finished request's experts for every token it ran (None unless asked for)."""
        return torch.cat(request.routing) if self._routers else None

    def submit(self, request_id: str, request: Continuation) -> None:
        """Queue one sample (its prompt plus the response so far); `step` advances it."""
        if request_id in self._live:
            raise ValueError(f"request id {request_id!r} is already in the toy engine")
        _refuse_images([request.images])
        self._live[request_id] = self._request(request, self._settings(request.sampling))

    @torch.no_grad()
    def step(self) -> list[tuple[str, GeneratedSample, bool]]:
        """Every unfinished request gains one token: (request id, that token, finished)."""
        outputs = []
        for request_id, request in list(self._live.items()):
            log_prob, finished, stopped = self._advance(request)
            routing = self._routing_of(request) if finished else None
            delta = GeneratedSample([request.token_ids[-1]], [log_prob], "", stopped, routing)
            outputs.append((request_id, delta, finished))
            if finished:
                del self._live[request_id]
        return outputs

    def has_unfinished(self) -> bool:
        return bool(self._live)

    def abort(self, request_ids: list[str]) -> None:
        """Drop these requests (ids not in the engine are ignored, as vLLM does)."""
        for request_id in request_ids:
            self._live.pop(request_id, None)

    def _settings(self, sampling: Sampling | None) -> SamplingSettings:
        """The rollout config's sampling, or a call's own (no top-k, stops at EOS)."""
        c = self.config
        if sampling is None:
            return SamplingSettings(c.temperature, c.top_k, c.top_p, c.ignore_eos)
        return SamplingSettings(sampling.temperature, -1, sampling.top_p, ignore_eos=False)

    def _request(self, request: Continuation, settings: SamplingSettings) -> _Request:
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {request.max_tokens}")
        if not 0 < len(request.token_ids) < self.config.max_model_len:
            raise ValueError(
                f"a request of {len(request.token_ids)} tokens leaves no room for a new token "
                f"under rollout.max_model_len={self.config.max_model_len} (or is empty)"
            )
        seed = request.seed if self.seed_requests else None
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._engine_generator))
        return _Request(request, settings, seed)

    def _advance(self, request: _Request) -> tuple[float, bool, bool]:
        """Sample the request's next token into it: (its log-prob, finished, stopped)."""
        pending = request.token_ids[request.num_cached :]
        out = self._module(
            input_ids=torch.tensor([pending]),
            past_key_values=request.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        request.cache = out.past_key_values
        request.num_cached = len(request.token_ids)
        if self._routers:
            chosen = [self._chosen.pop(r.layer) for r in self._routers]
            index_dtype = experts_dtype(self._routers[0].num_experts)
            request.routing.append(torch.stack(chosen, dim=1).to(index_dtype))
        logits = out.logits[0, -1]
        token = sample_token(logits, request.settings, request.generator)
        log_prob = float(logits.float().log_softmax(dim=-1)[token])
        request.token_ids.append(token)
        stopped = token in self._stop_ids and not request.settings.ignore_eos
        finished = (
            stopped
            or request.num_generated >= request.max_tokens
            or len(request.token_ids) >= self.config.max_model_len
        )
        return log_prob, finished, stopped

    @torch.no_grad()
    def score(
        self,
        sequences: Sequence[list[int]],
        with_adapter: bool = True,
        images: Sequence[ImageSet | None] | None = None,
    ) -> list[list[float]]:
        """Log-prob of every token after the first given its prefix: one forward per sequence
        (alone, like generation, so a score does not depend on its batch)."""
        _refuse_images(images)
        scores = []
        with self._adapter_off() if not with_adapter else nullcontext():
            for sequence in sequences:
                if not sequence:
                    raise ValueError("score got an empty sequence")
                ids = torch.tensor([list(sequence)])
                log_probs = self._module(input_ids=ids).logits[0, :-1].float().log_softmax(dim=-1)
                picked = log_probs.gather(1, ids[0, 1:, None])[:, 0]
                scores.append(picked.tolist())
        return scores

    def _adapter_off(self) -> AbstractContextManager[Any]:
        return nullcontext() if self._peft is None else self._peft.disable_adapter()

    # --- weights --------------------------------------------------------------------------

    def configure_loads(self, requested: RequestedStrategy) -> WeightFacts:
        """Always its own copy (`reload`); `direct` is refused as on a vLLM engine whose
        layers rule it out."""
        return WeightFacts(
            strategy=choose_strategy(requested, "plain", False, NO_DIRECT),
            layout="plain",
            blockers=NO_DIRECT,
            apart=stored_apart(self.stored_weights(), torch_dtype(self.dtype)),
        )

    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], checksum: bool = False
    ) -> int:
        """Copy each Hugging Face-named full tensor into the parameter or buffer of that
        state-dict name, in place (a tied lm_head.weight lands in the shared embedding)."""
        self._copy(self._checks.recording(weights) if checksum else weights)
        return self._checks.verify() if checksum else 0

    def verify_weights(self) -> int:
        return self._checks.verify()

    def stored_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The base weights and persistent buffers by Hugging Face state-dict name."""
        return iter(self._targets.items())

    def weights_digest(self) -> WeightsDigest:
        return digest_of(self.stored_weights())

    @torch.no_grad()
    def _copy(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in weights:
            target = self._targets.get(name)
            if target is None:
                raise KeyError(f"the toy engine's model has no parameter or buffer {name!r}")
            if target.shape != tensor.shape:
                raise ValueError(
                    f"weight {name!r}: got shape {tuple(tensor.shape)}, the toy engine's model "
                    f"holds {tuple(target.shape)}"
                )
            target.copy_(tensor)

    def load_adapter(self, path: Path) -> None:
        """Serve the peft adapter at `path` for every request from now on (loaded once, then
        its weights replaced in place); `score(with_adapter=False)` still scores the base."""
        from peft import PeftConfig, PeftModel

        if self.lora_rank == 0:
            raise ValueError(
                "the toy engine was built without LoRA (lora_rank=0): it cannot load the "
                f"adapter at {path}"
            )
        adapter = PeftConfig.from_pretrained(str(path))
        if adapter.r > self.lora_rank:
            raise ValueError(
                f"the adapter at {path} has rank {adapter.r}, above the engine's lora_rank "
                f"({self.lora_rank})"
            )
        if self._peft is None:
            self._peft = PeftModel.from_pretrained(
                self._module, str(path), adapter_name=ADAPTER_NAME, autocast_adapter_dtype=False
            ).eval()
            return
        loaded = self._peft.peft_config[ADAPTER_NAME]
        if (adapter.r, set(adapter.target_modules)) != (loaded.r, set(loaded.target_modules)):
            raise ValueError(
                f"the adapter at {path} (rank {adapter.r}, modules "
                f"{sorted(adapter.target_modules)}) does not match the one loaded before "
                f"(rank {loaded.r}, modules {sorted(loaded.target_modules)})"
            )
        result = self._peft.load_adapter(
            str(path), adapter_name=ADAPTER_NAME, autocast_adapter_dtype=False
        )
        if result.missing_keys or result.unexpected_keys:
            raise ValueError(
                f"the adapter at {path} does not fill the loaded adapter: missing "
                f"{result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]}"
            )

    def reset_prefix_cache(self) -> None:
        """No prefix cache: nothing to forget."""

    # --- memory ---------------------------------------------------------------------------

    def release(self) -> None:
        """Nothing to free on CPU (as VllmEngine there): no preallocated cache, no sleep."""

    def resume(self, tags: Sequence[ResumeTag]) -> None:
        """Nothing was released."""

    def shutdown(self) -> None:
        """Drop the model and every request (the process group is never used)."""
        self._live.clear()
        self._peft = None
        self._targets.clear()
        self._model = None


def _refuse_images(images: Sequence[ImageSet | None] | None) -> None:
    if images is not None and any(images):
        raise ValueError(
            "rollout.engine=toy runs text-only models; a vision-language run needs "
            "rollout.engine=vllm"
        )
