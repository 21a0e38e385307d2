"""actor.sp_size at start-up: the numbers that must divide, the model's heads, packed rows,
and what does not run with it yet, each named before any worker starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.models import TinyModelConfig, build_tiny_model
from tests.unit.trainer.test_config_reachable import compose_config, to_typed

pytestmark = pytest.mark.unit

NO_DATA = ("data.train_files=[]", "data.val_files=[]")


def test_sp_sizes_the_data_parallel_slots() -> None:
    config = to_typed(compose_config(overrides=("trainer.num_workers=4", "actor.sp_size=2")))
    assert config.data_parallel_workers == 2
    assert (
        config.mini_batch_rows_per_worker
        == config.algorithm.ppo_mini_batch_size * config.rollout.n // 2
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("trainer.num_workers=4", "actor.sp_size=3"),
            r"actor\.sp_size \(3\) must divide trainer\.num_workers \(4\)",
        ),
        (
            (
                "trainer.num_workers=4",
                "trainer.n_gpus_per_node=2",
                "trainer.nnodes=2",
                "actor.sp_size=4",
            ),
            r"actor\.sp_size \(4\) must divide the workers per node \(2\)",
        ),
        (
            ("actor.sp_size=2", "model.use_remove_padding=false"),
            r"model\.use_remove_padding must be true",
        ),
        (
            ("actor.sp_size=2", "actor.ep_size=2"),
            r"actor\.sp_size \(2\) does not run with actor\.ep_size",
        ),
        (
            ("actor.sp_size=2", "model.attn_implementation=eager"),
            r"model\.attn_implementation=eager cannot be wrapped for actor\.sp_size \(2\): "
            r"Ulysses wraps auto or sdpa",
        ),
    ],
)
def test_bad_sp_settings_are_named(overrides: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        to_typed(compose_config(overrides=overrides))


def test_the_model_s_heads_and_experts_are_checked(tmp_path: Path) -> None:
    two_heads = build_tiny_model(tmp_path / "two", TinyModelConfig.preset("tiny"))  # 2 q, 1 kv
    moe = build_tiny_model(tmp_path / "moe", TinyModelConfig.preset("tiny-moe"))
    four = ("trainer.num_workers=4", "actor.sp_size=4", *NO_DATA)
    config = to_typed(compose_config(overrides=(*four, f"model.path={two_heads}")))
    with pytest.raises(ValueError, match=r"actor\.sp_size \(4\) for model\.path .*query heads"):
        config.check_paths()
    config = to_typed(compose_config(overrides=("actor.sp_size=2", *NO_DATA, f"model.path={moe}")))
    with pytest.raises(
        ValueError, match=r"actor\.sp_size \(2\): model\.path .* is a mixture of experts"
    ):
        config.check_paths()
    to_typed(
        compose_config(overrides=("actor.sp_size=2", *NO_DATA, f"model.path={two_heads}"))
    ).check_paths()


def test_auto_attention_under_sp_is_the_varlen_sdpa_ulysses_wraps() -> None:
    from hybrid.workers.attention import resolve_attn_implementation

    on_gpu = {"flash_installed": True, "on_cuda": True}
    assert resolve_attn_implementation("auto", **on_gpu) == "flash_attention_2"
    assert resolve_attn_implementation("auto", **on_gpu, sp=2) == "sdpa"
    with pytest.raises(ValueError, match="flash_attention_2 cannot be wrapped"):
        resolve_attn_implementation("flash_attention_2", **on_gpu, sp=2)
