"""verl's config names and what each one is here: the one table the translation reads.

Every row is keyed by verl's dotted name (as `python3 -m verl.trainer.main_ppo` takes it) and
is one of:
- `Row` with our fields: the value is set on them, converted where the units or the names
  of the values differ (`convert` raises `Unsupported` for a value that has no meaning here);
- `Row` without fields: the setting asks for what `hybrid` does anyway (`convert` accepts
  those values and refuses the others), so it is accepted and noted;
- `Refused`: no counterpart; the reason, and the nearest field when there is one;
- `Derived`: the value joins a rule over several names (resources, lengths, epochs), written
  in hybrid.verl.translate.

Names under a prefix in `PREFIXES` share one row. docs/verl.md shows this table as a page.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


class Unsupported(ValueError):
    """A verl value with no meaning here (the message says why)."""


def _identity(value: Any) -> Any:
    return value


DROP = object()
"""What a conversion returns for a value that sets nothing here (verl's null for `default`)."""


@dataclass(frozen=True)
class Row:
    ours: tuple[str, ...] = ()
    """Our fields that take the value; empty: nothing to set (the behaviour is ours already)."""
    convert: Callable[[Any], Any] = _identity
    note: str = ""
    """What differs (units, value names), or why nothing needs setting."""


@dataclass(frozen=True)
class Refused:
    why: str
    nearest: str | None = None


@dataclass(frozen=True)
class Derived:
    note: str


Entry = Row | Refused | Derived


def same(*ours: str, note: str = "") -> Row:
    return Row(tuple(ours), _identity, note)


def renamed(ours: str | tuple[str, ...], convert: Callable[[Any], Any], note: str) -> Row:
    return Row((ours,) if isinstance(ours, str) else ours, convert, note)


def only(accepted: Iterable[Any], why: str, otherwise: str) -> Row:
    """A setting that has one meaning here: the accepted values pass, noted; others refused."""
    allowed = tuple(accepted)

    def check(value: Any) -> Any:
        if _matches(value, allowed):
            return value
        raise Unsupported(f"{otherwise} (accepted: {_listed(allowed)})")

    return Row((), check, why)


def any_value(why: str) -> Row:
    """A setting of verl's machinery that has no effect on what a run computes here."""
    return Row((), _identity, why)


def _matches(value: Any, allowed: tuple[Any, ...]) -> bool:
    for option in allowed:
        if isinstance(option, bool) or isinstance(value, bool):
            if value is option:
                return True
        elif isinstance(option, int | float) and isinstance(value, int | float):
            if float(value) == float(option):
                return True
        elif value == option:
            return True
    return False


def _listed(values: tuple[Any, ...]) -> str:
    return ", ".join("null" if v is None else str(v) for v in values)


# --- value conversions ----------------------------------------------------------------------


def _never_is_zero(value: Any) -> int:
    """verl's -1 (never) and 0 for a frequency are our 0 (never during the run)."""
    number = int(value)
    return 0 if number < 0 else number


def _dtype(value: Any) -> str:
    names = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32"}
    text = str(value)
    text = names.get(text, text)
    if text not in ("auto", "bfloat16", "float16", "float32"):
        raise Unsupported(f"dtype {value!r} (auto, bfloat16, float16, float32)")
    return text


def _load_format(value: Any) -> str:
    text = str(value)
    if text.startswith("dummy"):
        return "dummy"  # verl's dummy_dtensor / dummy_hf / dummy_megatron: random, then synced
    if text in ("auto", "hf", "safetensors"):
        return "auto"
    raise Unsupported(f"load_format {value!r} (dummy*, auto, hf, safetensors)")


VERL_LOGGERS = {"console": "console", "wandb": "wandb", "tensorboard": "tensorboard"}


def _loggers(value: Any) -> list[str]:
    """verl's logger list; metrics.jsonl is always kept (our tools read it)."""
    names = [value] if isinstance(value, str) else list(value)
    unknown = [name for name in names if name not in VERL_LOGGERS]
    if unknown:
        raise Unsupported(f"loggers {unknown} (console, wandb, tensorboard; jsonl is always on)")
    sinks = [VERL_LOGGERS[name] for name in names]
    return sinks + (["jsonl"] if "jsonl" not in sinks else [])


def _resume(value: Any) -> str:
    if value in ("auto", "disable"):
        return str(value)
    raise Unsupported(
        f"resume_mode {value!r}: a run resumes from its own trainer.output_dir (auto or disable)"
    )


def _on_off(value: Any) -> str:
    return "on" if _flag(value) else "off"


def _auto_off(value: Any) -> str:
    return "auto" if _flag(value) else "off"


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Unsupported(f"expected true or false, got {value!r}")
    return value


def _adv_estimator(value: Any) -> str:
    known = ("grpo", "gae", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
    if value not in known:
        raise Unsupported(f"adv_estimator {value!r} is not built here (built: {', '.join(known)})")
    return str(value)


def _loss_mode(value: Any) -> str:
    known = ("vanilla", "gspo", "gspo_token", "cispo", "sapo")
    if value not in known:
        raise Unsupported(f"policy loss {value!r} is not built here (built: {', '.join(known)})")
    return str(value)


def _keep_positive_or_null(value: Any) -> Any:
    """verl's null / -1 (keep all checkpoints) is our null."""
    if value is None or int(value) < 1:
        return None
    return int(value)


def _val_do_sample(value: Any) -> Any:
    return value  # read by the validation rule in hybrid.verl.translate


ON_GPUS = "verl's resource layout"


TABLE: dict[str, Entry] = {
    # --- the model ------------------------------------------------------------------------
    "actor_rollout_ref.model.path": same("model.path"),
    "actor_rollout_ref.model.use_remove_padding": same("model.use_remove_padding"),
    "actor_rollout_ref.model.enable_gradient_checkpointing": same("model.gradient_checkpointing"),
    "actor_rollout_ref.model.lora_rank": same("model.lora.rank"),
    "actor_rollout_ref.model.lora_alpha": same("model.lora.alpha"),
    "actor_rollout_ref.model.target_modules": same("model.lora.target_modules"),
    "actor_rollout_ref.model.use_shm": any_value(
        "models load from their directory; copying them to shared memory first gains nothing here"
    ),
    "actor_rollout_ref.model.trust_remote_code": only(
        (False,),
        "not needed: the supported families are built into transformers",
        "models with remote code are not loaded",
    ),
    "actor_rollout_ref.model.external_lib": only(
        (None,), "no external model library", "importing a model library is not supported"
    ),
    "actor_rollout_ref.model.enable_activation_offload": only(
        (False,), "activations stay on the device", "activation offload is not built"
    ),
    "actor_rollout_ref.model.use_liger": renamed(
        ("actor.fused_kernels", "ref.fused_kernels"),
        _on_off,
        "true: on (liger-kernel's fused ops; refused where liger, CUDA or the family is "
        "missing), false: off",
    ),
    "actor_rollout_ref.model.use_fused_kernels": only(
        (False,),
        "the log-prob head is chunked already (model.log_prob_chunk_tokens)",
        "verl's fused kernels are not built",
    ),
    "actor_rollout_ref.model.custom_chat_template": only(
        (None,), "the tokenizer's chat template", "a custom chat template is not supported"
    ),
    "actor_rollout_ref.model.lora_adapter_path": Refused(
        "starting from a saved adapter is not supported", "model.lora.rank"
    ),
    "actor_rollout_ref.hybrid_engine": Derived(
        "true: colocated (the default); false: a split or fully-async run"
    ),
    # --- the actor -------------------------------------------------------------------------
    "actor_rollout_ref.actor.strategy": only(
        ("fsdp", "fsdp2"), "the actor is FSDP2 here", "only FSDP2 is built (no Megatron)"
    ),
    "actor_rollout_ref.actor.ppo_mini_batch_size": same(
        "algorithm.ppo_mini_batch_size", note="prompts per optimizer step, as in verl"
    ),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": same(
        "actor.micro_batch_size", note="rows per worker per forward/backward"
    ),
    "actor_rollout_ref.actor.ppo_micro_batch_size": Refused(
        "the global micro-batch size is deprecated in verl too",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (actor.micro_batch_size)",
    ),
    "actor_rollout_ref.actor.use_dynamic_bsz": same("actor.use_dynamic_bsz"),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": same("actor.ppo_max_token_len_per_gpu"),
    "actor_rollout_ref.actor.grad_clip": same("actor.optim.max_grad_norm"),
    "actor_rollout_ref.actor.clip_ratio": same(
        "actor.clip_ratio_low", "actor.clip_ratio_high", note="both ends of the clip range"
    ),
    "actor_rollout_ref.actor.clip_ratio_low": same("actor.clip_ratio_low"),
    "actor_rollout_ref.actor.clip_ratio_high": same("actor.clip_ratio_high"),
    "actor_rollout_ref.actor.clip_ratio_c": same("actor.clip_ratio_c"),
    "actor_rollout_ref.actor.loss_agg_mode": same("actor.loss_agg_mode"),
    "actor_rollout_ref.actor.entropy_coeff": same("actor.entropy_coeff"),
    "actor_rollout_ref.actor.use_kl_loss": same("actor.use_kl_loss"),
    "actor_rollout_ref.actor.kl_loss_coef": same("actor.kl_loss_coef"),
    "actor_rollout_ref.actor.kl_loss_type": same("actor.kl_loss_type"),
    "actor_rollout_ref.actor.ppo_epochs": same("actor.ppo_epochs"),
    "actor_rollout_ref.actor.shuffle": any_value(
        "mini-batches are taken in the batch's balanced order"
    ),
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": same("actor.sp_size"),
    "actor_rollout_ref.actor.use_torch_compile": renamed(
        "actor.compile", _auto_off, "true: auto (compiled decoder layers on CUDA), false: off"
    ),
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking": any_value(
        "log-probs and entropies are taken in chunks always (model.log_prob_chunk_tokens)"
    ),
    "actor_rollout_ref.actor.entropy_checkpointing": any_value(
        "the chunked head recomputes in the backward already"
    ),
    "actor_rollout_ref.actor.policy_loss.loss_mode": renamed(
        "actor.policy_loss", _loss_mode, "the same loss names"
    ),
    "actor_rollout_ref.actor.optim.lr": same("actor.optim.lr"),
    "actor_rollout_ref.actor.optim.weight_decay": same("actor.optim.weight_decay"),
    "actor_rollout_ref.actor.optim.betas": same("actor.optim.betas"),
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": Derived(
        "ratio x trainer.total_steps warm-up steps (actor.optim.lr_warmup_steps) unless "
        "lr_warmup_steps is set"
    ),
    "actor_rollout_ref.actor.optim.lr_warmup_steps": renamed(
        "actor.optim.lr_warmup_steps", _never_is_zero, "-1 (verl: use the ratio) -> 0"
    ),
    "actor_rollout_ref.actor.optim.warmup_style": only(
        ("constant",), "the learning rate is constant", "only a constant learning rate is built"
    ),
    "actor_rollout_ref.actor.optim.lr_scheduler_type": only(
        ("constant",), "the learning rate is constant", "only a constant learning rate is built"
    ),
    "actor_rollout_ref.actor.optim.min_lr_ratio": any_value("no schedule: nothing to floor"),
    "actor_rollout_ref.actor.optim.num_cycles": any_value("no schedule: no cycles"),
    "actor_rollout_ref.actor.optim.total_training_steps": any_value(
        "filled in by verl at run time; not a user setting"
    ),
    "actor_rollout_ref.actor.fsdp_config.param_offload": same("actor.offload.param_offload"),
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": same(
        "actor.offload.optimizer_offload"
    ),
    "actor_rollout_ref.actor.fsdp_config.offload_policy": only(
        (False,), "offload is actor.offload.*", "FSDP2's CPU offload policy is not wired"
    ),
    "actor_rollout_ref.actor.fsdp_config.reshard_after_forward": only(
        (True,), "FSDP2 reshards after the forward", "keeping the gathered weights is not built"
    ),
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": Derived(
        "-1: actor.hsdp_replicas stays auto (every training worker shards the model on GPUs; "
        "on a CPU a small model is replicated on each); N: HSDP, actor.hsdp_replicas = the "
        "training workers / N (shard groups of N consecutive ranks)"
    ),
    "actor_rollout_ref.actor.fsdp_config.forward_prefetch": any_value(
        "FSDP2 prefetches the next unit itself"
    ),
    "actor_rollout_ref.actor.fsdp_config.model_dtype": Refused(
        "the master weights' dtype is a field of its own", "actor.precision.master_dtype"
    ),
    "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params": any_value(
        "the units FSDP2 shards are the decoder layers, always"
    ),
    "actor_rollout_ref.actor.checkpoint.save_contents": any_value(
        "a checkpoint holds the model, optimizer and extra state always"
    ),
    "actor_rollout_ref.actor.checkpoint.load_contents": any_value(
        "a resumed run loads the whole checkpoint"
    ),
    # --- the reference -----------------------------------------------------------------
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": same("ref.micro_batch_size"),
    "actor_rollout_ref.ref.log_prob_micro_batch_size": Refused(
        "the global micro-batch size is deprecated in verl too",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu (ref.micro_batch_size)",
    ),
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": same("ref.use_dynamic_bsz"),
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": same(
        "ref.log_prob_max_token_len_per_gpu"
    ),
    "actor_rollout_ref.ref.fsdp_config.param_offload": same("ref.offload.param_offload"),
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": Derived(
        "must equal the actor's: the reference runs on the actor's sp groups"
    ),
    "actor_rollout_ref.ref.strategy": only(
        ("fsdp", "fsdp2"), "the reference is FSDP2 here", "only FSDP2 is built (no Megatron)"
    ),
    "actor_rollout_ref.ref.use_torch_compile": renamed(
        "ref.compile", _auto_off, "true: auto (compiled decoder layers on CUDA), false: off"
    ),
    "actor_rollout_ref.ref.entropy_from_logits_with_chunking": any_value(
        "the reference takes no entropy"
    ),
    # --- the rollout ---------------------------------------------------------------------
    "actor_rollout_ref.rollout.name": only(
        ("vllm",), "the rollout engine is vLLM", "only vLLM is built (no SGLang)"
    ),
    "actor_rollout_ref.rollout.mode": only(
        ("sync", "async"),
        "the engine runs inside each worker; agent turns are asynchronous",
        "unknown rollout mode",
    ),
    "actor_rollout_ref.rollout.n": same("rollout.n"),
    "actor_rollout_ref.rollout.temperature": same("rollout.temperature"),
    "actor_rollout_ref.rollout.top_p": same("rollout.top_p"),
    "actor_rollout_ref.rollout.top_k": same("rollout.top_k"),
    "actor_rollout_ref.rollout.do_sample": only(
        (True,), "training samples", "greedy training rollouts: set rollout.temperature=0"
    ),
    "actor_rollout_ref.rollout.ignore_eos": same("rollout.ignore_eos"),
    "actor_rollout_ref.rollout.prompt_length": same("rollout.prompt_length"),
    "actor_rollout_ref.rollout.response_length": same("rollout.response_length"),
    "actor_rollout_ref.rollout.max_model_len": Derived(
        "null (verl's default): prompt + response length"
    ),
    "actor_rollout_ref.rollout.dtype": renamed("rollout.dtype", _dtype, "bf16 -> bfloat16"),
    "actor_rollout_ref.rollout.gpu_memory_utilization": same("rollout.gpu_memory_utilization"),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": same("rollout.tensor_parallel_size"),
    "actor_rollout_ref.rollout.data_parallel_size": only(
        (1,),
        "each tensor-parallel group is a data-parallel rank already",
        "vLLM's internal data parallelism is not used",
    ),
    "actor_rollout_ref.rollout.expert_parallel_size": only(
        (1,),
        "the engine's experts follow its tensor parallelism",
        "expert parallelism in the engine is not wired",
    ),
    "actor_rollout_ref.rollout.pipeline_model_parallel_size": only(
        (1,), "no pipeline stages", "pipeline parallelism in the engine is not built"
    ),
    "actor_rollout_ref.rollout.enforce_eager": same("rollout.enforce_eager"),
    "actor_rollout_ref.rollout.free_cache_engine": same("rollout.free_cache_engine"),
    "actor_rollout_ref.rollout.load_format": renamed(
        "rollout.load_format", _load_format, "dummy_* -> dummy; hf/safetensors -> auto"
    ),
    "actor_rollout_ref.rollout.layered_summon": same("sync.layered_summon"),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": any_value(
        "the old-log-prob pass runs at actor.micro_batch_size (with dynamic batches, "
        "actor.log_prob_max_token_len_per_gpu)"
    ),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": any_value(
        "the old-log-prob pass runs at actor.micro_batch_size"
    ),
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": any_value(
        "the old-log-prob pass batches as the update does (actor.use_dynamic_bsz)"
    ),
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": same(
        "actor.log_prob_max_token_len_per_gpu"
    ),
    "actor_rollout_ref.rollout.max_num_batched_tokens": any_value(
        "the engine's scheduler limits are set from rollout.max_model_len (engine_args)"
    ),
    "actor_rollout_ref.rollout.max_num_seqs": any_value(
        "the engine's scheduler limits are set by hybrid.rollout.engine_args"
    ),
    "actor_rollout_ref.rollout.enable_chunked_prefill": any_value("vLLM's default scheduling"),
    "actor_rollout_ref.rollout.enable_prefix_caching": any_value("vLLM's default"),
    "actor_rollout_ref.rollout.disable_log_stats": any_value(
        "engine logs go to output_dir/logs unless trainer.verbose"
    ),
    "actor_rollout_ref.rollout.calculate_log_probs": any_value(
        "the engine's log-probs are kept whenever a correction reads them"
    ),
    "actor_rollout_ref.rollout.seed": same("rollout.seed"),
    "actor_rollout_ref.rollout.multi_stage_wake_up": any_value(
        "the weights are loaded before the KV cache is resumed, always"
    ),
    "actor_rollout_ref.rollout.over_sample_rate": only(
        (0,),
        "every sampled request is finished",
        "cancelling the slowest requests is not built",
    ),
    "actor_rollout_ref.rollout.val_kwargs.n": same("trainer.val_n"),
    "actor_rollout_ref.rollout.val_kwargs.temperature": same("trainer.val_temperature"),
    "actor_rollout_ref.rollout.val_kwargs.top_p": same("trainer.val_top_p"),
    "actor_rollout_ref.rollout.val_kwargs.top_k": only(
        (-1, 0), "validation samples without top-k", "top-k in validation is not built"
    ),
    "actor_rollout_ref.rollout.val_kwargs.do_sample": Derived(
        "false: greedy validation (trainer.val_temperature=0)"
    ),
    "actor_rollout_ref.rollout.multi_turn.enable": same("rollout.agent.enabled"),
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": same("rollout.agent.max_turns"),
    "actor_rollout_ref.rollout.multi_turn.tool_config_path": same("rollout.agent.tools_file"),
    "actor_rollout_ref.rollout.multi_turn.format": same("rollout.agent.tool_parser"),
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": same(
        "rollout.agent.max_tool_output_chars"
    ),
    "actor_rollout_ref.rollout.multi_turn.max_user_turns": any_value(
        "an environment answers every assistant turn; max_turns bounds them"
    ),
    "actor_rollout_ref.rollout.multi_turn.max_parallel_calls": any_value(
        "a turn's tool calls run in order"
    ),
    "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": only(
        ("right", "middle"),
        "long tool outputs are cut at the end",
        "only the end of a tool output is cut",
    ),
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": any_value(
        "turns are rendered with the tokenizer's template (rollout.agent.template_mismatch)"
    ),
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path": Refused(
        "verl's interaction classes are not loaded", "rollout.agent.environments"
    ),
    "actor_rollout_ref.rollout.agent.num_workers": any_value(
        "agent loops run as tasks on each worker's event loop"
    ),
    "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space": any_value(
        "no swap: the KV cache is sized by kv_cache_memory_bytes / gpu_memory_utilization"
    ),
    # --- the critic -------------------------------------------------------------------------
    "critic.strategy": only(
        ("fsdp", "fsdp2"), "the critic is FSDP2 here", "only FSDP2 is built (no Megatron)"
    ),
    "critic.optim.lr": same("critic.optim.lr"),
    "critic.optim.weight_decay": same("critic.optim.weight_decay"),
    "critic.optim.betas": same("critic.optim.betas"),
    "critic.optim.lr_warmup_steps": renamed(
        "critic.optim.lr_warmup_steps", _never_is_zero, "-1 (verl: use the ratio) -> 0"
    ),
    "critic.optim.lr_warmup_steps_ratio": Derived(
        "ratio x trainer.total_steps warm-up steps (critic.optim.lr_warmup_steps) unless "
        "lr_warmup_steps is set"
    ),
    "critic.optim.warmup_style": only(
        ("constant",), "constant after the warm-up", "only a constant schedule is built"
    ),
    "critic.optim.lr_scheduler_type": only(
        ("constant",), "constant after the warm-up", "only a constant schedule is built"
    ),
    "critic.optim.min_lr_ratio": any_value("no decay: nothing to floor"),
    "critic.optim.total_training_steps": any_value("filled in by verl at run time"),
    "critic.grad_clip": same("critic.optim.max_grad_norm"),
    "critic.model.path": same("critic.model.path"),
    "critic.model.tokenizer_path": any_value("the critic reads the actor's tokens"),
    "critic.model.enable_gradient_checkpointing": same("critic.gradient_checkpointing"),
    "critic.model.use_remove_padding": any_value(
        "the critic packs rows as the actor does (model.use_remove_padding)"
    ),
    "critic.model.trust_remote_code": only(
        (False,), "not needed", "models with remote code are not loaded"
    ),
    "critic.model.external_lib": only((None,), "no external library", "not supported"),
    "critic.model.fsdp_config.param_offload": same("critic.offload.param_offload"),
    "critic.model.fsdp_config.optimizer_offload": same("critic.offload.optimizer_offload"),
    "critic.model.fsdp_config.fsdp_size": only(
        (-1,), "every training worker shards the critic", "sharding groups are not built"
    ),
    "critic.model.fsdp_config.wrap_policy.min_num_params": any_value("decoder layers, always"),
    "critic.ppo_micro_batch_size_per_gpu": same("critic.micro_batch_size"),
    "critic.ppo_micro_batch_size": Refused(
        "the global micro-batch size is deprecated in verl too",
        "critic.ppo_micro_batch_size_per_gpu (critic.micro_batch_size)",
    ),
    "critic.ppo_mini_batch_size": Derived(
        "must equal the actor's: one mini-batch split serves both updates"
    ),
    "critic.use_dynamic_bsz": same("critic.use_dynamic_bsz"),
    "critic.ppo_max_token_len_per_gpu": same("critic.ppo_max_token_len_per_gpu"),
    "critic.forward_max_token_len_per_gpu": same("critic.forward_max_token_len_per_gpu"),
    "critic.ppo_epochs": same("critic.ppo_epochs"),
    "critic.cliprange_value": same("critic.cliprange_value"),
    "critic.loss_agg_mode": same("critic.loss_agg_mode"),
    "critic.shuffle": any_value("mini-batches are taken in the batch's balanced order"),
    "critic.ulysses_sequence_parallel_size": Derived(
        "must equal the actor's: the critic runs on the actor's sp groups"
    ),
    "critic.rollout_n": any_value("read from rollout.n"),
    "critic.checkpoint.save_contents": any_value("the critic's whole state is saved"),
    "critic.checkpoint.load_contents": any_value("the critic's whole state is loaded"),
    # --- the reward ---------------------------------------------------------------------
    "reward_model.enable": Derived("true needs reward_model.model.path (reward.model.path)"),
    "reward_model.model.path": Derived(
        "reward.model.path when reward_model.enable=true (verl ignores it otherwise)"
    ),
    "reward_model.model.input_tokenizer": any_value(
        "the reward model re-reads the decoded text with its own tokenizer always"
    ),
    "reward_model.model.use_remove_padding": any_value("the reward model packs rows"),
    "reward_model.model.trust_remote_code": only(
        (False,), "not needed", "models with remote code are not loaded"
    ),
    "reward_model.model.external_lib": only((None,), "no external library", "not supported"),
    "reward_model.model.fsdp_config.param_offload": same("reward.model.offload.param_offload"),
    "reward_model.model.fsdp_config.fsdp_size": only(
        (-1,), "every worker shards it", "sharding groups are not built"
    ),
    "reward_model.model.fsdp_config.wrap_policy.min_num_params": any_value(
        "decoder layers, always"
    ),
    "reward_model.micro_batch_size_per_gpu": same("reward.model.micro_batch_size"),
    "reward_model.micro_batch_size": Refused(
        "the global micro-batch size is deprecated in verl too",
        "reward_model.micro_batch_size_per_gpu (reward.model.micro_batch_size)",
    ),
    "reward_model.max_length": same("reward.model.max_length"),
    "reward_model.use_dynamic_bsz": only(
        (False,),
        "fixed micro-batches of reward.model.micro_batch_size",
        "dynamic batches for the reward model are not built",
    ),
    "reward_model.forward_max_token_len_per_gpu": any_value(
        "the reward model's micro-batches are sized by rows"
    ),
    "reward_model.strategy": only(
        ("fsdp", "fsdp2"), "the reward model is FSDP2 here", "only FSDP2 is built"
    ),
    "reward_model.reward_manager": only(
        ("naive", "dapo"),
        "rule rewards are scored per row in a process pool; DAPO's overlong penalty is "
        "reward.overlong_buffer",
        "verl's batch and prime managers are not built (a custom compute_score per row is)",
    ),
    "reward_model.launch_reward_fn_async": any_value(
        "rule rewards are always scored while the next phase runs"
    ),
    "reward_model.overlong_buffer.enable": same("reward.overlong_buffer.enable"),
    "reward_model.overlong_buffer.len": same("reward.overlong_buffer.len"),
    "reward_model.overlong_buffer.penalty_factor": same("reward.overlong_buffer.penalty_factor"),
    "reward_model.reward_kwargs.overlong_buffer_cfg.enable": same("reward.overlong_buffer.enable"),
    "reward_model.reward_kwargs.overlong_buffer_cfg.len": same("reward.overlong_buffer.len"),
    "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor": same(
        "reward.overlong_buffer.penalty_factor"
    ),
    "reward_model.reward_kwargs.overlong_buffer_cfg.log": any_value(
        "the overlong metrics are logged always"
    ),
    "reward_model.reward_kwargs.max_resp_len": any_value(
        "the overlong buffer is measured against rollout.response_length"
    ),
    "reward_model.num_workers": same("reward.num_workers"),
    "reward_model.use_reward_loop": any_value(
        "rule rewards are scored in a process pool as the groups finish, always"
    ),
    "reward_model.overlong_buffer.log": any_value("the overlong metrics are logged always"),
    "custom_reward_function.path": same("reward.custom_path"),
    "custom_reward_function.name": same("reward.custom_name"),
    # --- the algorithm ------------------------------------------------------------------
    "algorithm.adv_estimator": renamed(
        "algorithm.adv_estimator", _adv_estimator, "the same estimator names"
    ),
    "algorithm.norm_adv_by_std_in_grpo": same("algorithm.norm_adv_by_std"),
    "algorithm.use_pf_ppo": only(
        (False,), "every sample is trained on", "preference-feedback PPO is not built"
    ),
    "algorithm.filter_groups.metric": only(
        ("acc", "score", "seq_reward", "seq_final_reward"),
        "groups are filtered on the rule reward",
        "groups are filtered on the rule reward only",
    ),
    # --- the data -----------------------------------------------------------------------
    "data.max_response_length": Derived("the rollout's response_length (rollout.response_length)"),
    "data.max_prompt_length": Derived(
        "data.max_prompt_length, and the rollout's prompt_length unless set"
    ),
    "data.val_batch_size": renamed(
        "data.val_batch_size", lambda v: DROP if v is None else v, "null: our default"
    ),
    "data.prompt_key": only(
        ("prompt",), "the prompt column", "rename the column to `prompt` in the file"
    ),
    "data.reward_fn_key": only(
        ("data_source",),
        "rewards are chosen by data_source",
        "rewards are chosen by the data_source column",
    ),
    "data.image_key": only(
        ("images",), "the images column", "rename the column to `images` in the file"
    ),
    "data.filter_overlong_prompts": any_value(
        "longer prompts are always filtered, counted and reported"
    ),
    "data.filter_overlong_prompts_workers": any_value("prompts are measured in the driver"),
    "data.truncation": only(
        ("error", "left", "right", "middle"),
        "overlong prompts are filtered and counted (never cut)",
        "unknown truncation",
    ),
    "data.return_raw_input_ids": any_value("prompts are re-tokenized where needed"),
    "data.return_raw_chat": any_value("the chat rows are kept for agent turns"),
    "data.return_full_prompt": any_value("the prompt text is kept"),
    "data.dataloader_num_workers": any_value("the loader runs in the driver"),
    "data.tokenizer": only((None,), "the model's tokenizer", "a separate tokenizer is not used"),
    "data.use_shm": any_value("data files are read in place"),
    "data.trust_remote_code": any_value("not needed"),
    "data.custom_cls.path": only((None,), "the prompt layout", "custom dataset classes"),
    "data.custom_cls.name": only((None,), "the prompt layout", "custom dataset classes"),
    "data.gen_batch_size": Derived("DAPO's generation batch: must equal data.train_batch_size"),
    "data.validation_shuffle": any_value("validation is taken in file order"),
    "data.return_multi_modal_inputs": any_value("pixel inputs are built in the workers"),
    # --- the trainer --------------------------------------------------------------------
    "trainer.total_epochs": Derived(
        "epochs x (train rows // data.train_batch_size) steps (trainer.total_steps)"
    ),
    "trainer.total_training_steps": same("trainer.total_steps", note="wins over total_epochs"),
    "trainer.logger": renamed(
        "trainer.loggers", _loggers, "the same sink names; metrics.jsonl is always added"
    ),
    "trainer.project_name": any_value("the run is named by trainer.output_dir"),
    "trainer.experiment_name": any_value("the run is named by trainer.output_dir"),
    "trainer.nnodes": Derived(ON_GPUS + ": trainer.nnodes, trainer.num_workers"),
    "trainer.n_gpus_per_node": Derived(ON_GPUS + ": trainer.n_gpus_per_node, num_workers"),
    "trainer.device": Derived("cuda: trainer.use_gpu=true; cpu: false"),
    "trainer.save_freq": renamed(
        "trainer.save_freq", _never_is_zero, "-1 (never) -> 0 (only at the end)"
    ),
    "trainer.test_freq": renamed("trainer.test_freq", _never_is_zero, "-1 (never) -> 0"),
    "trainer.critic_warmup": same("trainer.critic_warmup"),
    "trainer.val_before_train": same("trainer.val_before_train"),
    "trainer.val_only": only((False,), "a run trains", "evaluate with python -m hybrid.eval"),
    "trainer.default_local_dir": same(
        "trainer.output_dir", note="checkpoints go under output_dir/checkpoints"
    ),
    "trainer.default_hdfs_dir": only((None,), "no HDFS copy", "copying to HDFS is not built"),
    "trainer.resume_mode": renamed("trainer.resume", _resume, "auto / disable"),
    "trainer.resume_from_path": only(
        (None,),
        "a run resumes from its own output_dir",
        "resuming from another directory is not built: point trainer.default_local_dir there",
    ),
    "trainer.max_actor_ckpt_to_keep": renamed(
        "trainer.max_checkpoints_to_keep", _keep_positive_or_null, "null = keep all"
    ),
    "trainer.max_critic_ckpt_to_keep": any_value(
        "the critic's checkpoints follow the actor's (max_checkpoints_to_keep)"
    ),
    "trainer.balance_batch": only(
        (True,),
        "rows are balanced over workers by tokens, always",
        "balancing cannot be turned off",
    ),
    "trainer.log_val_generations": any_value(
        "validation answers are scored, not printed; python -m hybrid.eval dumps samples"
    ),
    "trainer.ray_wait_register_center_timeout": any_value(
        "worker start is bounded by trainer.stall_timeout_s"
    ),
    "trainer.del_local_ckpt_after_load": any_value("checkpoints are kept"),
    "trainer.use_legacy_worker_impl": any_value("one worker implementation"),
    "trainer.rollout_data_dir": only(
        (None,), "rollouts are not dumped during training", "dumping rollouts is not built"
    ),
    "trainer.validation_data_dir": only(
        (None,), "validation samples are not dumped", "use python -m hybrid.eval (samples.jsonl)"
    ),
    "trainer.esi_redundant_time": any_value("checkpoints are saved on trainer.save_freq"),
    "trainer.profile_steps": only((None,), "no profiler", "the nsys profiler is not wired"),
    "trainer.controller_nsight_options": any_value("no profiler"),
    "trainer.worker_nsight_options": any_value("no profiler"),
    "trainer.profile_continuous_steps": any_value("no profiler"),
    # --- verl's fully-async recipe (recipe/fully_async_policy) -------------------------------
    "async_training.staleness_threshold": same("fully_async.staleness_threshold"),
    "async_training.trigger_parameter_sync_step": same("fully_async.trigger_parameter_sync_step"),
    "async_training.require_batches": same("fully_async.require_batches"),
    "async_training.partial_rollout": same("fully_async.partial_rollout"),
    "async_training.use_rollout_log_probs": any_value(
        "the engine's log-probs are read by algorithm.off_policy_correction"
    ),
    "rollout.nnodes": Derived("the Rollouter's nodes: trainer.num_explorer_workers"),
    "rollout.n_gpus_per_node": Derived("the Rollouter's GPUs: trainer.num_explorer_workers"),
    "rollout.total_epochs": any_value("the Rollouter follows the trainer's trainer.total_epochs"),
    "rollout.total_rollout_steps": any_value("generation follows the trainer's steps"),
    "rollout.test_freq": any_value("validation runs on trainer.test_freq"),
}


PREFIXES: dict[str, Entry] = {
    "ray_init.": any_value("Ray is started (or joined: trainer.ray_address) by the driver"),
    "actor_rollout_ref.rollout.engine_kwargs.": Refused(
        "raw engine arguments are not passed through (the engine is configured by rollout.*)"
    ),
    "actor_rollout_ref.model.override_config.": Derived(
        "dropout set to 0 is accepted (the models train without dropout); other changes to "
        "the model's config are refused"
    ),
    "actor_rollout_ref.actor.profiler.": any_value("no profiler"),
    "actor_rollout_ref.ref.profiler.": any_value("no profiler"),
    "actor_rollout_ref.rollout.profiler.": any_value("no profiler"),
    "actor_rollout_ref.rollout.trace.": any_value("no tracing backend"),
    "critic.profiler.": any_value("no profiler"),
    "reward_model.profiler.": any_value("no profiler"),
    "global_profiler.": any_value("no profiler"),
    "reward_model.rollout.": any_value(
        "verl's engine that serves the reward model: here the reward model is a sequence "
        "classifier run by the workers (reward.model.*; a generative judge is reward.judge.*)"
    ),
    "actor_rollout_ref.rollout.agent.custom_async_server.": Refused(
        "the engine is in-process; custom servers are not loaded"
    ),
    "actor_rollout_ref.rollout.multi_turn.": Refused(
        "this part of verl's multi-turn settings is not built", "rollout.agent.*"
    ),
    "actor_rollout_ref.actor.policy_loss.": Refused(
        "this policy-loss setting is not built", "actor.policy_loss"
    ),
    "algorithm.rollout_correction.": Refused(
        "verl's rollout correction block", "algorithm.off_policy_correction"
    ),
}


def lookup(name: str) -> Entry | None:
    """The row of a verl name: its own, else its longest prefix's."""
    if name in TABLE:
        return TABLE[name]
    prefixes = [p for p in PREFIXES if name.startswith(p)]
    return PREFIXES[max(prefixes, key=len)] if prefixes else None
