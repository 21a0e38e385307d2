"""model.attn_implementation: what `auto` picks on each machine, the refusals naming the field
and the fix, and that every preset runs where flash-attn is not installed."""

from __future__ import annotations

import pytest

from hybrid.trainer.compose import compose
from hybrid.workers.attention import resolve_attn_implementation
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.unit

PRESETS = sorted(p.stem for p in (REPO_ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize(
    ("flash_installed", "on_cuda", "kernel"),
    [
        (True, True, "flash_attention_2"),
        (False, True, "sdpa"),
        (True, False, "sdpa"),
        (False, False, "sdpa"),
    ],
)
def test_auto_takes_flash_attention_only_where_it_runs(
    flash_installed: bool, on_cuda: bool, kernel: str
) -> None:
    chosen = resolve_attn_implementation("auto", flash_installed=flash_installed, on_cuda=on_cuda)
    assert chosen == kernel


def test_flash_attention_without_the_package_names_the_field_and_the_fix() -> None:
    with pytest.raises(
        ValueError,
        match=r"model\.attn_implementation=flash_attention_2 needs flash-attn.*\.\[flash\].*sdpa",
    ):
        resolve_attn_implementation("flash_attention_2", flash_installed=False, on_cuda=True)


def test_flash_attention_on_the_cpu_is_refused() -> None:
    with pytest.raises(ValueError, match=r"CUDA only"):
        resolve_attn_implementation("flash_attention_2", flash_installed=True, on_cuda=False)


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_explicit_kernels_are_kept(kernel: str) -> None:
    assert resolve_attn_implementation(kernel, flash_installed=False, on_cuda=True) == kernel  # type: ignore[arg-type]


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_runs_on_a_gpu_node_without_flash_attn(preset: str) -> None:
    cfg = compose(preset, [])
    chosen = resolve_attn_implementation(
        cfg.model.attn_implementation, flash_installed=False, on_cuda=True
    )
    assert chosen in ("sdpa", "eager")


def test_expanded_kv_heads_attend_like_grouped_query_attention() -> None:
    """The dense block-mask path repeats kv heads on CUDA (so a fused kernel takes the mask):
    the same attention as sdpa's own GQA."""
    import torch
    import torch.nn.functional as F

    from hybrid.workers.varlen_attention import masked_kv

    g = torch.Generator().manual_seed(0)
    query = torch.randn(1, 6, 9, 8, generator=g)
    key, value = torch.randn(1, 2, 9, 8, generator=g), torch.randn(1, 2, 9, 8, generator=g)
    mask = torch.ones(9, 9, dtype=torch.bool).tril()
    mask[5:, :5] = False  # two packed sequences
    grouped = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)
    k, v, gqa = masked_kv(query, key, value, expand=True)
    assert not gqa and k.shape == v.shape == (1, 6, 9, 8)
    expanded = F.scaled_dot_product_attention(query, k, v, attn_mask=mask, enable_gqa=gqa)
    torch.testing.assert_close(expanded, grouped, rtol=0, atol=1e-6)
    assert masked_kv(query, key, value, expand=False)[2]  # CPU: GQA as it is
    assert masked_kv(query, query, query, expand=True) == (query, query, False)
