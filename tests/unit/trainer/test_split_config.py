"""trainer.mode=split and fully_async: bad input fails when the config is built, before any worker
starts, naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.trainer.config import TrainerRunConfig
from tests.unit.trainer.test_config_reachable import compose_config, to_typed

pytestmark = pytest.mark.unit


def split_config(*overrides: str) -> TrainerRunConfig:
    return to_typed(compose_config("config", ("trainer.mode=split", *overrides)))


def test_the_default_split_config_builds() -> None:
    config = split_config()
    assert config.trainer.split and config.trainer.training_workers == 1
    # Rows per trainer worker come from the trainer group alone.
    assert (
        config.mini_batch_rows_per_worker == config.algorithm.ppo_mini_batch_size * config.rollout.n
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.num_explorer_workers=0", r"trainer\.num_explorer_workers must be > 0"),
        ("trainer.num_trainer_workers=0", r"trainer\.num_trainer_workers must be > 0"),
        (
            "sync.method=carrier_pigeon",
            r"sync\.method must be one of \['nccl', 'memory', 'checkpoint'\]",
        ),
        ("sync.style=sometimes", r"sync\.style must be one of \['fixed', 'dynamic_by_explorer'\]"),
        ("sync.interval=0", r"sync\.interval must be > 0"),
        ("sync.offset=-1", r"sync\.offset must be >= 0"),
        ("sync.method=checkpoint", r"sync\.checkpoint_dir must be set"),
        ("sync.offset=2", r"sync\.max_staleness"),
        ("trainer.mode=elsewhere", r"trainer\.mode must be one of"),
    ],
)
def test_bad_split_input_names_the_field(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        split_config(override)


@pytest.mark.parametrize("offset", [0, 1])
def test_a_split_update_of_one_mini_batch_skips_the_old_log_prob_pass(offset: int) -> None:
    """One step off too: PPO's old policy is the weights the update starts from, not the
    version that sampled the tokens (the corrections compare those with the first forward)."""
    assert split_config(f"sync.offset={offset}").on_policy_update
    two = split_config(
        f"sync.offset={offset}", "data.train_batch_size=16", "algorithm.ppo_mini_batch_size=8"
    )
    assert not two.on_policy_update
    assert not split_config(
        f"sync.offset={offset}", "algorithm.skip_old_log_prob=false"
    ).on_policy_update


def test_checkpoint_method_with_a_directory_builds(tmp_path: Path) -> None:
    config = split_config("sync.method=checkpoint", f"sync.checkpoint_dir={tmp_path}")
    assert config.sync.checkpoint_dir == str(tmp_path)


def test_the_trainer_group_size_sets_the_divisibility_rule() -> None:
    with pytest.raises(ValueError, match=r"divisible by trainer\.num_trainer_workers \(3\)"):
        split_config("trainer.num_trainer_workers=3")


def test_a_step_s_prompts_split_evenly_over_the_explorers() -> None:
    # 16 prompts over 3 explorers would be padded with repeated prompts, whose groups the
    # buffer refuses as already held.
    with pytest.raises(ValueError, match=r"divisible by trainer\.num_explorer_workers \(3\)"):
        split_config("trainer.num_explorer_workers=3", "trainer.num_workers=4")
    config = split_config(
        "trainer.num_explorer_workers=3", "trainer.num_workers=4", "data.train_batch_size=48"
    )
    assert config.data.train_batch_size % config.trainer.num_explorer_workers == 0


def test_the_fully_async_sizes() -> None:
    config = split_config(
        "trainer.mode=fully_async",
        "fully_async.require_batches=2",
        "fully_async.trigger_parameter_sync_step=3",
        "algorithm.ppo_mini_batch_size=4",
    )
    assert config.groups_per_update == 8 and config.groups_per_version == 24


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("trainer.mode=fully_async", "sync.offset=1", "sync.max_staleness=1"),
            r"leave sync\.style=fixed, sync\.interval=1, sync\.offset=0",
        ),
        (
            ("fully_async.staleness_threshold=-0.1",),
            r"fully_async\.staleness_threshold must be >= 0",
        ),
        (("fully_async.max_version_lag=-1",), r"fully_async\.max_version_lag must be >= 0"),
        (("fully_async.chunk_tokens=0",), r"fully_async\.chunk_tokens must be > 0"),
        (("fully_async.require_batches=0",), r"fully_async\.require_batches must be > 0"),
        (("algorithm.off_policy_correction=sometimes",), r"algorithm\.off_policy_correction must"),
        (("algorithm.importance_cap=0",), r"algorithm\.importance_cap must be > 0"),
        (("algorithm.mask_version_lag=-1",), r"algorithm\.mask_version_lag must be >= 0"),
        (
            ("algorithm.off_policy_correction=mask", "trainer.mode=colocated"),
            r"off_policy_correction=mask needs trainer\.mode=split or fully_async",
        ),
        (
            ("algorithm.off_policy_correction=tis", "actor.tis_cap=2.0"),
            r"algorithm\.off_policy_correction=tis .* and actor\.tis_cap \(2\.0\) .*set one",
        ),
        (
            ("algorithm.off_policy_correction=decoupled", "actor.tis_cap=2.0"),
            r"algorithm\.off_policy_correction=decoupled .* and actor\.tis_cap \(2\.0\)",
        ),
        (
            ("algorithm.off_policy_correction=icepop", "actor.tis_cap=2.0"),
            r"algorithm\.off_policy_correction=icepop .* and actor\.tis_cap \(2\.0\)",
        ),
        (
            ("algorithm.off_policy_correction=icepop", "algorithm.importance_cap=1"),
            r"algorithm\.importance_cap must be > 1 with algorithm\.off_policy_correction=icepop",
        ),
        (
            ("algorithm.off_policy_correction=seq_mask_is", "algorithm.importance_cap=0.5"),
            r"algorithm\.importance_cap must be > 1 .*=seq_mask_is .*got 0\.5",
        ),
    ],
)
def test_bad_fully_async_input_names_the_field(overrides: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        split_config(*overrides)


def test_the_correction_reaches_the_workers_as_a_derived_value() -> None:
    decoupled = split_config("algorithm.off_policy_correction=decoupled").worker_config()
    assert decoupled.derived.decoupled_cap == 2.0 and decoupled.derived.tis_cap is None
    tis = split_config("algorithm.off_policy_correction=tis", "algorithm.importance_cap=3")
    assert tis.worker_config().derived.tis_cap == 3.0
    assert tis.actor.tis_cap is None  # the user's field is left as the user set it
    own = split_config("actor.tis_cap=1.5").worker_config().derived
    assert (own.tis_cap, own.decoupled_cap) == (1.5, None)


def test_the_presets_reach_the_workers() -> None:
    def derived(correction: str) -> tuple[float | None, ...]:
        config = split_config(
            f"algorithm.off_policy_correction={correction}", "algorithm.importance_cap=3"
        )
        spec = config.worker_config().derived
        assert spec.mismatch_cap == 3.0  # the metrics' cap, whatever the correction
        return spec.tis_cap, spec.decoupled_cap, spec.icepop_cap, spec.seq_mask_cap

    assert derived("none") == (None, None, None, None)
    assert derived("token_tis") == derived("tis") == (3.0, None, None, None)
    assert derived("icepop") == (None, None, 3.0, None)
    assert derived("seq_mask_is") == (None, None, None, 3.0)


@pytest.mark.parametrize(
    ("override", "instead"),
    [
        ("+trainer.placement=split", r"trainer\.placement was replaced: set trainer\.mode="),
        (
            "+fully_async.enable=true",
            r"fully_async\.enable was replaced: set trainer\.mode=fully_async",
        ),
    ],
)
def test_the_keys_trainer_mode_replaced_are_named(override: str, instead: str) -> None:
    from hybrid.trainer.compose import to_run_config

    with pytest.raises(ValueError, match=instead):
        to_run_config(compose_config("config", (override,)))


def test_split_groups_fill_whole_nodes() -> None:
    nodes = ("trainer.nnodes=3", "trainer.n_gpus_per_node=2", "trainer.num_workers=6")
    config = split_config(*nodes, "trainer.num_explorer_workers=2", "trainer.num_trainer_workers=4")
    assert config.trainer.group_on_nodes(2) == [2] and config.trainer.group_on_nodes(4) == [2, 2]
    assert split_config().trainer.group_on_nodes(1) == [1]  # one node: one entry per group
    with pytest.raises(ValueError, match=r"trainer\.num_explorer_workers \(3\) must be a multiple"):
        split_config(*nodes, "trainer.num_explorer_workers=3", "trainer.num_trainer_workers=4")
    with pytest.raises(ValueError, match=r"trainer\.num_workers \(6\) must equal"):
        split_config(*nodes, "trainer.num_explorer_workers=2", "trainer.num_trainer_workers=2")
