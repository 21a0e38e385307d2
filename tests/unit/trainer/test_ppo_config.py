"""PPO with a critic in the typed config: bad input fails when the config is built, before
any worker starts, naming the field; worker_config() fills in the critic's model path and
mini-batch; check_critic_model refuses a critic the actor's token ids do not fit."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import CLIPVisionConfig

from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.demo_assets import DEMO_MODEL_PATH
from hybrid.workers.critic import check_critic_model
from tests.unit.trainer.test_config_reachable import compose_config, to_typed

pytestmark = pytest.mark.unit

GAE = "algorithm.adv_estimator=gae"


def config(*overrides: str) -> TrainerRunConfig:
    return to_typed(compose_config("config", overrides))


def test_the_default_config_builds_with_gae() -> None:
    built = config(GAE, "algorithm.gamma=0.99", "algorithm.lam=0.95", "trainer.critic_warmup=2")
    assert built.use_critic and built.trainer.critic_warmup == 2
    assert (built.algorithm.gamma, built.algorithm.lam) == (0.99, 0.95)
    assert not config().use_critic  # the default grpo run has no critic


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("algorithm.lam=-0.1",), r"algorithm\.lam must be in \[0, 1\], got -0\.1"),
        (("algorithm.lam=1.5",), r"algorithm\.lam must be in \[0, 1\], got 1\.5"),
        (("algorithm.gamma=0",), r"algorithm\.gamma must be in \(0, 1\], got 0"),
        (("algorithm.gamma=1.2",), r"algorithm\.gamma must be in \(0, 1\], got 1\.2"),
        (
            ("algorithm.kl_ctrl.type=linear",),
            r"algorithm\.kl_ctrl\.type must be one of \['fixed', 'adaptive'\], got 'linear'",
        ),
        (("algorithm.adv_estimator=ppo",), r"algorithm\.adv_estimator must be one of"),
        (
            (GAE, "trainer.critic_warmup=300"),  # the demo's trainer.total_steps is 300
            r"trainer\.critic_warmup \(300\) must be < trainer\.total_steps \(300\)",
        ),
        (
            (GAE, "trainer.total_steps=5", "trainer.critic_warmup=7"),
            r"trainer\.critic_warmup \(7\) must be < trainer\.total_steps \(5\)",
        ),
        ((GAE, "trainer.critic_warmup=-1"), r"trainer\.critic_warmup must be >= 0, got -1"),
        (
            ("trainer.critic_warmup=3",),
            r"trainer\.critic_warmup \(3\) needs a critic \(algorithm\.adv_estimator=gae, "
            r"got grpo\)",
        ),
        (("+critic.mini_batch_size=4",), r"unknown config keys \['critic\.mini_batch_size'\]"),
        (("critic.optim.lr=0",), r"critic\.optim\.lr must be > 0, got 0"),
        (("critic.optim.lr_warmup_steps=-2",), r"critic\.optim\.lr_warmup_steps must be >= 0"),
        (
            (GAE, "critic.micro_batch_size=48"),  # 16 x 8 / 2 = 64 rows per worker
            r"rows per worker per optimizer step \(64\) .*critic\.micro_batch_size \(48\)",
        ),
    ],
)
def test_bad_ppo_input_names_the_field(overrides: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config(*overrides)


@pytest.mark.parametrize("mode", ["split", "fully_async"])
def test_the_critic_and_kl_in_reward_build_on_the_decoupled_placements(mode: str) -> None:
    split = (f"trainer.mode={mode}",)
    built = config(GAE, "algorithm.use_kl_in_reward=true", *split)
    assert built.use_critic and built.needs_reference and built.trainer.split
    # The critic's mini-batch follows the trainer group's share, like the actor's.
    # (one derived value, WorkerSpec.mini_batch_rows, serves both)
    rows = built.worker_config().derived.mini_batch_rows
    assert rows == 16 * 8 // built.trainer.num_trainer_workers
    assert not built.on_policy_update  # the penalty needs the old log-probs


def test_critic_warmup_just_below_total_steps_builds() -> None:
    assert config(GAE, "trainer.critic_warmup=299").trainer.critic_warmup == 299


# rollout.n=1: 16 x 1 / 2 = 8 rows per worker per optimizer step, so micro-batches of 4.
ONE_SAMPLE = ("rollout.n=1", "actor.micro_batch_size=4", "critic.micro_batch_size=4")


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_group_estimators_need_two_samples_per_prompt(estimator: str) -> None:
    with pytest.raises(
        ValueError, match=rf"rollout\.n must be >= 2 for algorithm\.adv_estimator={estimator}"
    ):
        config(*ONE_SAMPLE, f"algorithm.adv_estimator={estimator}")
    assert config("rollout.n=2", f"algorithm.adv_estimator={estimator}").rollout.n == 2


@pytest.mark.parametrize("estimator", ["gae", "reinforce_plus_plus"])
def test_estimators_without_a_group_take_one_sample_per_prompt(estimator: str) -> None:
    built = config(*ONE_SAMPLE, f"algorithm.adv_estimator={estimator}")
    assert built.rollout.n == 1 and built.algorithm.adv_estimator == estimator
    assert built.mini_batch_rows_per_worker == 8


def test_worker_config_gives_the_critic_the_actor_s_model_by_default() -> None:
    built = config(GAE)
    assert built.critic.model.path is None
    critic = built.worker_config().critic
    assert critic.model.path == DEMO_MODEL_PATH == built.model.path
    # derived for actor and critic alike: 16 prompts x 8 samples / 2 workers
    assert built.worker_config().derived.mini_batch_rows == 64
    # the run's own config is not mutated
    assert built.critic.model.path is None


def test_worker_config_keeps_an_explicit_critic_path() -> None:
    built = config(GAE, "critic.model.path=some/critic", "algorithm.ppo_mini_batch_size=8")
    worker = built.worker_config()
    assert worker.critic.model.path == "some/critic"
    assert worker.derived.mini_batch_rows == 32  # 8 x 8 / 2


@pytest.fixture(scope="module")
def actor_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(
        tmp_path_factory.mktemp("actor"), TinyModelConfig.preset("tiny", dtype="float32")
    )


def test_the_actor_s_own_model_is_a_valid_critic(actor_path: Path) -> None:
    check_critic_model(str(actor_path), str(actor_path))  # no error


def test_a_directory_without_a_model_is_refused(actor_path: Path, tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"critic\.model\.path=.* is not a Hugging Face model directory"
    ):
        check_critic_model(str(tmp_path), str(actor_path))


def test_a_model_without_a_value_head_class_is_refused(actor_path: Path, tmp_path: Path) -> None:
    CLIPVisionConfig().save_pretrained(tmp_path)
    with pytest.raises(
        ValueError, match=r"critic\.model\.path=.*'clip_vision_model' model has no token-class"
    ):
        check_critic_model(str(tmp_path), str(actor_path))


def test_a_critic_of_another_vocabulary_is_refused(actor_path: Path, tmp_path: Path) -> None:
    critic = build_tiny_model(
        tmp_path, TinyModelConfig.preset("tiny", vocab="arithmetic", dtype="float32")
    )
    # the "arithmetic" tokenizer has 16 ids, the actor's "text" one 272
    with pytest.raises(
        ValueError,
        match=r"critic\.model\.path=.*: vocabulary of 16 tokens, the actor's .* has 272",
    ):
        check_critic_model(str(critic), str(actor_path))
