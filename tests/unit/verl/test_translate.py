"""verl's names as a dialect: the translation of single names, of verl's own run scripts
(tests/assets/verl_scripts/, their overrides as facts with the source noted), and the
errors a user sees."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybrid.trainer.compose import compose, to_run_config
from hybrid.verl.overrides import parse_overrides, render
from hybrid.verl.page import SCRIPTS_DIR
from hybrid.verl.page import script_overrides as overrides_in
from hybrid.verl.resolve import apply, steps_for_epochs
from hybrid.verl.table import PREFIXES, TABLE, Derived, Refused, Row
from hybrid.verl.translate import is_ours, translate, verl_schema

pytestmark = pytest.mark.unit

RUNNABLE = ("grpo_qwen2-7b", "ppo_gemma", "grpo_lora_qwen2_5-3b")
"""The scripts the integration test runs on CPU: translated with no refusal."""


def script_overrides(name: str) -> list[str]:
    return overrides_in(SCRIPTS_DIR / f"{name}.txt")


def all_scripts() -> list[str]:
    return sorted(p.stem for p in SCRIPTS_DIR.glob("*.txt"))


def test_the_scripts_cover_the_modes() -> None:
    names = all_scripts()
    assert len(names) >= 10
    for mode in ("grpo", "ppo", "lora", "dapo", "seq_balance", "multiturn", "fully_async", "rm"):
        assert any(mode in name for name in names), mode


@pytest.mark.parametrize("name", all_scripts())
def test_every_override_of_a_script_is_translated_or_named(name: str) -> None:
    lines = script_overrides(name)
    translation = translate(lines)
    assert translation.dialect
    mapped = {verl for verl, _ in translation.mapped}
    for line in lines:
        refused = [r for r in translation.refused if r.startswith(f"{line}:")]
        assert (line in mapped) != bool(refused), (line, refused)
    for refusal in translation.refused:  # each names the override and says why
        line, _, why = refusal.partition(": ")
        assert line in lines and why, refusal


@pytest.mark.parametrize("name", RUNNABLE)
def test_the_runnable_scripts_translate_in_full(name: str) -> None:
    translation = translate(script_overrides(name))
    assert translation.refused == []
    assert translation.epochs == 15  # trainer.total_epochs=15: steps once the data is known


def test_a_mixed_command_line_takes_both_dialects() -> None:
    translation = translate(
        [
            "actor_rollout_ref.actor.optim.lr=2e-6",
            "+actor_rollout_ref.actor.clip_ratio=0.25",
            "trainer.logger=['console','wandb']",
            "trainer.save_freq=-1",
            "rollout.n=4",  # ours, beside verl's
            "actor_rollout_ref.rollout.dtype=bf16",
            "actor_rollout_ref.rollout.load_format=dummy_dtensor",
        ]
    )
    assert translation.refused == []
    assert translation.overrides[:8] == [
        "actor.optim.lr=2e-6",
        "actor.clip_ratio_low=0.25",  # the `+` is dropped: the field exists here
        "actor.clip_ratio_high=0.25",
        "trainer.loggers=[console,wandb,jsonl]",
        "trainer.save_freq=0",
        "rollout.n=4",
        "rollout.dtype=bfloat16",
        "rollout.load_format=dummy",
    ]


def test_our_own_names_pass_through_untouched() -> None:
    lines = ["trainer.total_steps=3", "data.max_prompt_length=8", "trainer.save_freq=2"]
    translation = translate(lines)
    assert not translation.dialect
    assert translation.overrides == lines and translation.refused == []


def test_every_refusal_is_named_at_once() -> None:
    translation = translate(
        [
            "actor_rollout_ref.rollout.name=sglang",
            "actor_rollout_ref.actor.strategy=megatron",
            "actor_rollout_ref.rollout.engine_kwargs.vllm.foo=1",
            "actor_rollout_ref.actor.optim.lr=1e-6",
        ]
    )
    with pytest.raises(ValueError) as error:
        translation.check()
    message = str(error.value)
    assert "3 overrides of verl's dialect have no counterpart" in message
    assert "actor_rollout_ref.rollout.name=sglang: only vLLM is built" in message
    assert "actor_rollout_ref.actor.strategy=megatron: only FSDP2" in message
    assert "engine_kwargs.vllm.foo=1: raw engine arguments" in message


def test_a_misspelled_name_suggests_the_nearest_of_both_dialects() -> None:
    verl = translate(["actor_rollout_ref.actor.optim.lrr=1e-6", "actor_rollout_ref.rollout.n=2"])
    (refusal,) = verl.refused
    assert "no such field here or in verl's config" in refusal
    assert "verl's: actor_rollout_ref.actor.optim.lr" in refusal
    ours = translate(["trainer.total_step=3"])
    (refusal,) = ours.refused
    assert "ours: trainer.total_steps" in refusal


def test_a_verl_name_without_a_counterpart_is_named_as_such() -> None:
    name = "actor_rollout_ref.actor.optim.optimizer"  # in verl's schema, not in the table
    assert name in verl_schema() and name not in TABLE
    (refusal,) = translate([f"{name}=AdamW"]).refused
    assert refusal.startswith(f"{name}=AdamW: not supported here")


def test_values_with_no_meaning_here_are_refused_with_the_accepted_ones() -> None:
    (refusal,) = translate(
        ["algorithm.adv_estimator=remax", "actor_rollout_ref.rollout.n=2"]
    ).refused
    assert "remax" in refusal and "grpo" in refusal


def test_resources_lengths_and_greedy_validation_are_derived() -> None:
    translation = translate(
        [
            "trainer.nnodes=2",
            "trainer.n_gpus_per_node=4",
            "trainer.device=cuda",
            "data.max_prompt_length=100",
            "data.max_response_length=50",
            "actor_rollout_ref.rollout.val_kwargs.do_sample=False",
            "actor_rollout_ref.rollout.val_kwargs.n=8",
        ]
    )
    assert translation.refused == []
    lines = translation.overrides
    assert "trainer.use_gpu=true" in lines
    assert "trainer.num_workers=8" in lines and "trainer.nnodes=2" in lines
    assert "rollout.prompt_length=100" in lines and "rollout.response_length=50" in lines
    assert lines.index("trainer.val_n=8") < lines.index("trainer.val_n=1")  # greedy wins
    assert translation.derive_max_model_len


def test_the_fully_async_recipe_sets_the_mode_and_both_groups() -> None:
    translation = translate(
        [
            "trainer.n_gpus_per_node=4",
            "rollout.n_gpus_per_node=12",
            "async_training.staleness_threshold=0.5",
        ]
    )
    assert translation.refused == []
    for line in (
        "trainer.mode=fully_async",
        "trainer.num_trainer_workers=4",
        "trainer.num_explorer_workers=12",
        "trainer.num_workers=16",
        "fully_async.staleness_threshold=0.5",
    ):
        assert line in translation.overrides


def test_members_that_must_agree_with_the_actor_are_checked() -> None:
    translation = translate(
        [
            "actor_rollout_ref.actor.ppo_mini_batch_size=16",
            "critic.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1",
        ]
    )
    assert len(translation.refused) == 2
    assert any(
        "critic.ppo_mini_batch_size=8: must equal the actor's (16)" in r
        for r in translation.refused
    )


def test_a_reward_model_path_counts_only_when_enabled() -> None:
    off = translate(["reward_model.enable=False", "reward_model.model.path=/rm"])
    assert not any(line.startswith("reward.model.path") for line in off.overrides)
    on = translate(["reward_model.enable=True", "reward_model.model.path=/rm"])
    assert "reward.model.path=/rm" in on.overrides


def test_epochs_count_whole_batches_of_the_training_file(tmp_path: Path) -> None:
    train = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": [f"p{i}" for i in range(10)]}), train)
    cfg = compose("config", [f"data.train_files=[{train}]", "data.train_batch_size=4"])
    assert steps_for_epochs(cfg, 3) == (6, 10, 4)  # 3 x (10 // 4)
    translation = translate(
        [
            "trainer.total_epochs=3",
            f"data.train_files=[{train}]",
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "data.max_response_length=6",
        ]
    )
    cfg = compose("config", translation.overrides)
    lines = apply(translation, cfg)
    assert cfg.trainer.total_steps == 6
    assert cfg.rollout.max_model_len == cfg.rollout.prompt_length + 6
    assert any("verl's defaults that differ here" in line for line in lines)
    assert any(line.strip().startswith("actor_rollout_ref.rollout.n: verl 1") for line in lines)
    config = to_run_config(cfg)
    assert config.trainer.total_steps == 6 and config.rollout.response_length == 6


def test_rendered_values_read_back_the_same() -> None:
    values = [None, True, False, 3, 1e-6, "bfloat16", "1e-6", "a b", "it's", ["x", 2, None]]
    for value in values:
        (parsed,) = parse_overrides([f"k={render(value)}"])
        assert parsed.value == value, (value, render(value))


def test_every_table_row_names_fields_that_exist() -> None:
    for name, entry in {**TABLE, **PREFIXES}.items():
        assert isinstance(entry, Row | Refused | Derived), name
        if isinstance(entry, Row):
            for ours in entry.ours:
                assert is_ours(ours), (name, ours)
            assert entry.note or entry.ours, name


def test_the_page_shows_the_table_and_the_scripts_as_they_are() -> None:
    from hybrid.verl.page import rewrite, scripts_markdown, table_markdown

    page = Path(__file__).parents[3] / "docs" / "verl.md"
    expected = rewrite(page, {"table": table_markdown(), "scripts": scripts_markdown(SCRIPTS_DIR)})
    assert page.read_text() == expected, "run: python -m hybrid.verl.page docs/verl.md"


def test_explain_prints_the_translation_and_the_resolved_config() -> None:
    from hybrid.verl.explain import explain

    translation = translate(
        ["actor_rollout_ref.rollout.n=4", "data.max_response_length=6", "trainer.total_steps=2"]
    )
    lines = explain(translation)
    text = "\n".join(lines)
    assert "actor_rollout_ref.rollout.n=4 -> rollout.n=4" in text
    assert "rollout.max_model_len=22 (prompt + response length" in text  # 16 + 6
    assert "  'n': 4" in text and "  response_length: 6" in text


def test_the_entry_point_refuses_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from hybrid import main

    argv = ["hybrid.main", "actor_rollout_ref.rollout.name=sglang", "trainer.logger=[mlflow]"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as stopped:
        main.cli()
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "2 overrides of verl's dialect have no counterpart here" in err
    assert "trainer.logger=[mlflow]: loggers ['mlflow']" in err


def test_warm_up_ratios_become_steps_of_the_run() -> None:
    translation = translate(
        [
            "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1",
            "critic.optim.lr_warmup_steps_ratio=0.05",
            "critic.optim.lr_warmup_steps=3",  # a positive count wins over the ratio, as in verl
            "trainer.total_training_steps=40",
            "actor_rollout_ref.actor.optim.lr_warmup_steps=-1",  # verl's "use the ratio"
        ]
    )
    assert translation.refused == []
    cfg = compose("config", translation.overrides)
    apply(translation, cfg)
    assert cfg.actor.optim.lr_warmup_steps == 4  # 0.1 x 40
    assert cfg.critic.optim.lr_warmup_steps == 3


def test_fsdp_size_becomes_replicas_over_the_training_workers() -> None:
    translation = translate(
        [
            "actor_rollout_ref.actor.fsdp_config.fsdp_size=4",
            "trainer.nnodes=2",
            "trainer.n_gpus_per_node=4",
        ]
    )
    assert translation.refused == [] and translation.fsdp_size == 4
    cfg = compose("config", translation.overrides)
    lines = apply(translation, cfg)
    assert cfg.actor.hsdp_replicas == 2  # 8 workers in shard groups of 4
    assert any(line.startswith("actor.hsdp_replicas=2") for line in lines)
    odd = translate(
        ["actor_rollout_ref.actor.fsdp_config.fsdp_size=3", "trainer.n_gpus_per_node=4"]
    )
    with pytest.raises(ValueError, match="fsdp_size=3 must divide the training workers"):
        apply(odd, compose("config", odd.overrides))
