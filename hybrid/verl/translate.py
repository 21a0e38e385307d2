"""verl's overrides to ours: one pass over the command line, every problem found at once.

A command line that names any field only verl has is in verl's dialect; then the names both
configs share take verl's meaning too (they mean the same but for `-1` frequencies and the
lengths, which also size the rollout). Our own names pass through unchanged, so a script
can mix the two. What needs several names at once (the resources, the lengths, validation's
greedy switch, the members that must agree with the actor) is derived after the rows; what
needs the composed config (epochs over the training file, the engine's context length, the
defaults that differ) is applied by `VerlRun.apply` once Hydra has composed it.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybrid.verl.overrides import Override, parse_overrides, render
from hybrid.verl.table import DROP, Derived, Refused, Row, Unsupported, lookup

SCHEMA_FILE = Path(__file__).with_name("verl_schema.txt")
PASS_THROUGH_PREFIXES = ("hydra.", "hydra/")
"""Hydra's own settings (hydra.run.dir=...) are neither dialect's fields."""
ROLLOUTER_RESOURCES = ("rollout.nnodes", "rollout.n_gpus_per_node")
"""verl's fully-async entry: the Rollouter's own nodes and GPUs."""
VERL_GPUS_PER_NODE = 8
"""verl's default trainer.n_gpus_per_node."""


@functools.cache
def verl_schema() -> dict[str, str]:
    """verl's config names and their defaults (JSON text), from hybrid/verl/verl_schema.txt."""
    names: dict[str, str] = {}
    for line in SCHEMA_FILE.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, default = line.partition("\t")
            names[name] = default
    return names


@functools.cache
def our_fields() -> dict[str, Any]:
    """Every leaf field of our config tree with its dataclass default."""
    from hybrid.trainer.compose import schema_defaults

    leaves: dict[str, Any] = {}

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict) and value:
                walk(value, f"{prefix}{key}.")
            else:
                leaves[f"{prefix}{key}"] = value

    walk(schema_defaults(), "")
    return leaves


def is_ours(name: str) -> bool:
    fields = our_fields()
    if name in fields:
        return True
    # A mapping field (reward.model.combine_by_source) takes keys below it.
    parent = name.rpartition(".")[0]
    while parent:
        if parent in fields:
            return fields[parent] is None or isinstance(fields[parent], dict)
        parent = parent.rpartition(".")[0]
    return False


def is_verls(name: str) -> bool:
    return name in verl_schema() or lookup(name) is not None


@dataclass
class Translation:
    """The overrides in our names, with what each verl name became."""

    overrides: list[str] = field(default_factory=list)
    mapped: list[tuple[str, str]] = field(default_factory=list)
    """(the verl override, what it became here)."""
    refused: list[str] = field(default_factory=list)
    """One line per override with no counterpart: the override and why."""
    dialect: bool = False
    """Whether the command line used verl's names."""
    epochs: int | None = None
    """trainer.total_epochs, when steps are to be counted from the training file."""
    derive_max_model_len: bool = False
    fsdp_size: int | None = None
    """verl's shard group size, to become actor.hsdp_replicas once the workers are known."""
    warmup_ratios: dict[str, float] = field(default_factory=dict)
    """Our lr_warmup_steps field -> verl's ratio of the run's steps (settled once composed)."""
    set_names: frozenset[str] = frozenset()
    """The verl names the command line set (the others keep our defaults)."""

    fully_async: bool = False
    """Whether the command line is verl's fully-async entry's (a Rollouter's GPUs, or
    async_training.*)."""
    derived_lines: dict[str, str] = field(default_factory=dict)
    """verl name -> its override line, for the names the rules over several names read."""

    def refuse(self, name: str, why: str) -> None:
        """Refuse the override that set verl's `name` (its rule's note withdrawn)."""
        line = self.derived_lines.get(name, name)
        self.mapped = [(verl, ours) for verl, ours in self.mapped if verl != line]
        self.refused.append(f"{line}: {why}")

    def check(self) -> None:
        """Raise one ValueError naming every override that has no counterpart."""
        if self.refused:
            count = len(self.refused)
            lines = "\n".join(f"  {line}" for line in self.refused)
            raise ValueError(
                f"{count} override{'s' if count > 1 else ''} of verl's dialect "
                f"{'have' if count > 1 else 'has'} no counterpart here "
                f"(docs/verl.md has the table):\n{lines}"
            )


def translate(lines: list[str]) -> Translation:
    """Translate a command line's overrides; refusals are collected, not raised."""
    out = Translation()
    overrides = []
    for line in lines:
        try:
            overrides.extend(parse_overrides([line]))
        except ValueError as error:
            out.refused.append(f"{line}: {error}")
    out.dialect = any(_is_verl_only(o.key) for o in overrides)
    if not out.dialect:
        for o in overrides:
            if not is_ours(o.key) and not o.key.startswith(PASS_THROUGH_PREFIXES):
                out.refused.append(_unknown(o))
        out.overrides = list(lines)
        return out
    ours_set = {o.key: o.value for o in overrides if is_ours(o.key) and lookup(o.key) is None}
    derived: dict[str, Any] = {}
    for o in overrides:
        _translate_one(o, out, derived)
    out.set_names = frozenset(o.key for o in overrides)
    out.fully_async = any(
        o.key.startswith("async_training.") or o.key in ROLLOUTER_RESOURCES for o in overrides
    )
    for rule in DERIVATIONS:
        rule(derived, ours_set, out)
    return out


def _is_verl_only(name: str) -> bool:
    return not is_ours(name) and is_verls(name)


def _translate_one(o: Override, out: Translation, derived: dict[str, Any]) -> None:
    if o.key.startswith(PASS_THROUGH_PREFIXES):
        out.overrides.append(o.line)
        return
    if o.kind == "~":
        out.refused.append(f"{o.line}: deleting a field is not supported; set its value")
        return
    entry = lookup(o.key)
    if entry is None:
        if is_ours(o.key):
            out.overrides.append(f"{o.key}={o.text}")  # ours exist already: no `+`
            out.mapped.append((o.line, "the same name here"))
        elif o.key in verl_schema():
            out.refused.append(f"{o.line}: not supported here{_nearest_ours(o.key)}")
        else:
            out.refused.append(_unknown(o))
        return
    if isinstance(entry, Refused):
        nearest = f" (nearest: {entry.nearest})" if entry.nearest else ""
        out.refused.append(f"{o.line}: {entry.why}{nearest}")
        return
    if isinstance(entry, Derived):
        derived[o.key] = o.value
        out.derived_lines[o.key] = o.line
        out.mapped.append((o.line, f"with the rule over several names: {entry.note}"))
        return
    _apply_row(o, entry, out)


def _apply_row(o: Override, row: Row, out: Translation) -> None:
    try:
        value = row.convert(o.value)
    except Unsupported as error:
        out.refused.append(f"{o.line}: {error}")
        return
    except (TypeError, ValueError) as error:
        out.refused.append(f"{o.line}: not a valid value ({error})")
        return
    if value is DROP or not row.ours:
        out.mapped.append((o.line, f"nothing to set: {row.note}"))
        return
    text = o.text if value is o.value else render(value)
    for name in row.ours:
        out.overrides.append(f"{name}={text}")
    out.mapped.append((o.line, ", ".join(f"{name}={text}" for name in row.ours)))


def _emit(out: Translation, because: str, **values: Any) -> None:
    """Overrides a derivation sets (keys given with __ for dots)."""
    lines = [f"{key.replace('__', '.')}={render(value)}" for key, value in values.items()]
    out.overrides.extend(lines)
    out.mapped.append((because, ", ".join(lines)))


# --- the rules over several names -----------------------------------------------------------

Derivation = Callable[[dict[str, Any], dict[str, Any], Translation], None]


def _resources(derived: dict[str, Any], ours: dict[str, Any], out: Translation) -> None:
    """verl's nodes x GPUs per node: our worker counts; a Rollouter's own GPUs make the run
    fully asynchronous (verl's fully-async entry)."""
    device = derived.get("trainer.device")
    if device is not None and device not in ("cuda", "cpu"):
        out.refuse("trainer.device", "only cuda and cpu workers are built")
    elif "trainer.use_gpu" not in ours:
        use_gpu = device == "cuda" if device is not None else _cuda_available()
        because = (
            f"trainer.device={device}"
            if device
            else "trainer.device unset (verl: cuda; here: CUDA if present)"
        )
        _emit(out, because, trainer__use_gpu=use_gpu)
    keys = (
        "trainer.nnodes",
        "trainer.n_gpus_per_node",
        "rollout.nnodes",
        "rollout.n_gpus_per_node",
    )
    if not any(key in derived for key in keys):
        return
    nodes = int(derived.get("trainer.nnodes", 1))
    per_node = int(derived.get("trainer.n_gpus_per_node", VERL_GPUS_PER_NODE))
    if not any(key in derived for key in ROLLOUTER_RESOURCES):
        counts: dict[str, Any] = {"trainer__nnodes": nodes, "trainer__n_gpus_per_node": per_node}
        if "trainer.num_workers" not in ours:
            counts["trainer__num_workers"] = nodes * per_node
        _emit(out, "trainer.nnodes x trainer.n_gpus_per_node", **counts)
        return
    rollout_nodes = int(derived.get("rollout.nnodes", 1))
    rollout_per_node = int(derived.get("rollout.n_gpus_per_node", VERL_GPUS_PER_NODE))
    if nodes != 1 or rollout_nodes != 1:
        for name in ("trainer.nnodes", "rollout.nnodes"):
            if name in derived:
                out.refuse(
                    name,
                    "a fully-async run over several nodes is set in our names (trainer.nnodes, "
                    "trainer.num_trainer_workers, trainer.num_explorer_workers; "
                    "docs/multi-node.md)",
                )
        return
    trainers, explorers = per_node, rollout_per_node
    _emit(
        out,
        "the trainer's and the Rollouter's GPUs",
        trainer__mode=ours.get("trainer.mode", "fully_async"),
        trainer__num_trainer_workers=trainers,
        trainer__num_explorer_workers=explorers,
        trainer__num_workers=trainers + explorers,
    )


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _lengths(derived: dict[str, Any], ours: dict[str, Any], out: Translation) -> None:
    """verl sizes the rollout from data.max_prompt_length / max_response_length; the engine's
    context is their sum unless rollout.max_model_len is set (applied once composed)."""
    values: dict[str, Any] = {}
    if "data.max_prompt_length" in derived:
        prompt = derived["data.max_prompt_length"]
        values["data__max_prompt_length"] = prompt
        if not _set(out, ours, "rollout.prompt_length", "actor_rollout_ref.rollout.prompt_length"):
            values["rollout__prompt_length"] = prompt
    if "data.max_response_length" in derived and not _set(
        out, ours, "rollout.response_length", "actor_rollout_ref.rollout.response_length"
    ):
        values["rollout__response_length"] = derived["data.max_response_length"]
    if values:
        _emit(out, "data.max_prompt_length / data.max_response_length", **values)
    max_len = derived.get("actor_rollout_ref.rollout.max_model_len")
    if max_len is not None:
        _emit(out, "actor_rollout_ref.rollout.max_model_len", rollout__max_model_len=max_len)
    elif values and "rollout.max_model_len" not in ours:
        out.derive_max_model_len = True


def _set(out: Translation, ours: dict[str, Any], *names: str) -> bool:
    return any(
        name in ours or any(line.startswith(f"{name}=") for line, _ in out.mapped) for name in names
    )


def _validation(derived: dict[str, Any], ours: dict[str, Any], out: Translation) -> None:
    """val_kwargs.do_sample=false is greedy validation, whatever its temperature and n."""
    do_sample = derived.get("actor_rollout_ref.rollout.val_kwargs.do_sample")
    if do_sample is False:
        _emit(
            out,
            "actor_rollout_ref.rollout.val_kwargs.do_sample=False",
            trainer__val_temperature=0.0,
            trainer__val_n=1,
        )


def _members_agree(derived: dict[str, Any], ours: dict[str, Any], out: Translation) -> None:
    """The reference and the critic run on the actor's sequence-parallel groups, and the
    critic's mini-batches are the actor's."""
    actor_sp = _last_value(out, "actor.sp_size", ours.get("actor.sp_size", 1))
    for name in (
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
        "critic.ulysses_sequence_parallel_size",
    ):
        if name in derived and int(derived[name]) != int(actor_sp):
            out.refuse(name, f"must equal the actor's sequence parallelism ({actor_sp}) here")
    critic = derived.get("critic.ppo_mini_batch_size")
    if critic is not None:
        actor = _last_value(
            out, "algorithm.ppo_mini_batch_size", ours.get("algorithm.ppo_mini_batch_size")
        )
        if actor is None:
            _emit(out, "critic.ppo_mini_batch_size", algorithm__ppo_mini_batch_size=critic)
        elif int(actor) != int(critic):
            out.refuse(
                "critic.ppo_mini_batch_size",
                f"must equal the actor's ({actor}): one split of the batch serves both updates",
            )
    _generation_batch(derived, out)
    if derived.get("actor_rollout_ref.hybrid_engine") is False:
        mode = _last_value(out, "trainer.mode", "colocated")
        if mode == "colocated" and not out.fully_async:
            out.refuse(
                "actor_rollout_ref.hybrid_engine",
                "generation apart from training is trainer.mode=split or fully_async here",
            )


def _generation_batch(derived: dict[str, Any], out: Translation) -> None:
    """DAPO's generation batch is a train batch here; the fully-async Rollouter streams
    prompts, and its trainer takes require_batches mini-batches per update."""
    generation = derived.get("data.gen_batch_size")
    fully_async = out.fully_async
    train = _last_value(out, "data.train_batch_size", None)
    if fully_async:
        if train is not None and int(train) == 0:  # verl's fully-async: no train batch
            mini = _last_value(out, "algorithm.ppo_mini_batch_size", None)
            batches = _last_value(out, "fully_async.require_batches", 1)
            if mini is not None:
                _emit(
                    out,
                    "data.train_batch_size=0 (fully async: the groups of one update)",
                    data__train_batch_size=int(mini) * int(batches),
                )
        return
    if generation is not None and (train is None or int(train) != int(generation)):
        out.refuse(
            "data.gen_batch_size",
            f"each generation round here is data.train_batch_size ({train}) prompts; dynamic "
            "sampling takes up to algorithm.filter_groups.max_num_gen_batches rounds",
        )


def _last_value(out: Translation, name: str, default: Any) -> Any:
    """The value the translated overrides give our `name` last (Hydra's rule), else default."""
    value = default
    for line in out.overrides:
        if line.partition("=")[0].lstrip("+") == name:
            (parsed,) = parse_overrides([line])
            value = parsed.value
    return value


def _reward_model(derived: dict[str, Any], ours: dict[str, Any], out: Translation) -> None:
    """verl reads reward_model.model.path only when reward_model.enable is true."""
    enabled = derived.get("reward_model.enable")
    path = derived.get("reward_model.model.path")
    if enabled is True:
        if path is None:
            out.refuse("reward_model.enable", "needs reward_model.model.path")
        else:
            _emit(out, "reward_model.enable=True", reward__model__path=path)
    elif path is not None:
        out.mapped.append(
            (f"reward_model.model.path={path}", "nothing to set: reward_model.enable is false")
        )


def _model_config_changes(derived: dict[str, Any], ours: dict[str, Any], out: Translation) -> None:
    """Dropout set to 0 is what our models train with; other config changes are refused."""
    prefix = "actor_rollout_ref.model.override_config."
    for name, value in derived.items():
        if not name.startswith(prefix):
            continue
        if name.endswith("dropout") and value in (0, 0.0):
            out.mapped.append(
                (f"{name}={value}", "nothing to set: the models train without dropout")
            )
        else:
            out.refuse(
                name,
                "changing the model's config from the command line is not supported (edit "
                "its config.json)",
            )


def _epochs(derived: dict[str, Any], ours: dict[str, Any], out: Translation) -> None:
    epochs = derived.get("trainer.total_epochs")
    if epochs is None:
        return
    if _set(out, ours, "trainer.total_steps", "trainer.total_training_steps"):
        out.mapped.append((f"trainer.total_epochs={epochs}", "nothing to set: steps are given"))
        return
    if int(epochs) < 1:
        out.refuse("trainer.total_epochs", "must be >= 1")
        return
    out.epochs = int(epochs)


WARMUPS = {
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": "actor.optim.lr_warmup_steps",
    "critic.optim.lr_warmup_steps_ratio": "critic.optim.lr_warmup_steps",
}
"""verl's warm-up ratios and the step counts they become here."""


def _warmup_ratios(derived: dict[str, Any], ours: dict[str, Any], out: Translation) -> None:
    """verl warms up for ratio x the run's steps unless lr_warmup_steps is positive."""
    for name, steps_field in WARMUPS.items():
        ratio = derived.get(name)
        if ratio is None or float(ratio) <= 0:
            continue
        if float(ratio) >= 1:
            out.refuse(name, "must be < 1 (a share of the run's steps)")
        elif int(_last_value(out, steps_field, 0)) > 0:
            out.mapped.append((f"{name}={ratio}", f"nothing to set: {steps_field} is given"))
        else:
            out.warmup_ratios[steps_field] = float(ratio)


def _shard_groups(derived: dict[str, Any], ours: dict[str, Any], out: Translation) -> None:
    """verl's fsdp_size (ranks per shard group) is our replica count over the workers."""
    size = derived.get("actor_rollout_ref.actor.fsdp_config.fsdp_size")
    if size is None or int(size) == -1:
        return
    if int(size) < 1:
        out.refuse("actor_rollout_ref.actor.fsdp_config.fsdp_size", "must be -1 or >= 1")
    elif "actor.hsdp_replicas" in ours:
        out.refuse(
            "actor_rollout_ref.actor.fsdp_config.fsdp_size",
            "set it or actor.hsdp_replicas, not both",
        )
    else:
        out.fsdp_size = int(size)


DERIVATIONS: tuple[Derivation, ...] = (
    _resources,
    _lengths,
    _validation,
    _members_agree,
    _reward_model,
    _model_config_changes,
    _epochs,
    _warmup_ratios,
    _shard_groups,
)


# --- names nobody has -----------------------------------------------------------------------


def _unknown(o: Override) -> str:
    """A name in neither dialect: the nearest of each."""
    ours = difflib.get_close_matches(o.key, list(our_fields()), n=1, cutoff=0.6)
    verls = difflib.get_close_matches(o.key, list(verl_schema()), n=1, cutoff=0.6)
    hints = [f"ours: {ours[0]}" for _ in ours[:1]] + [f"verl's: {verls[0]}" for _ in verls[:1]]
    hint = f"; did you mean {' or '.join(hints)}?" if hints else ""
    return f"{o.line}: no such field here or in verl's config{hint}"


def _nearest_ours(name: str) -> str:
    """The field of ours whose last parts read most like verl's name."""
    tail = ".".join(name.split(".")[-2:])
    candidates = {".".join(field_name.split(".")[-2:]): field_name for field_name in our_fields()}
    match = difflib.get_close_matches(tail, list(candidates), n=1, cutoff=0.7)
    return f" (nearest: {candidates[match[0]]})" if match else ""
