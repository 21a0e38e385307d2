"""Unit tests for `hybrid.algorithms.chunked_logprob`: forward and gradients against the full-
logits reference in float32 and bf16, gradcheck in float64, what is saved for backward, frozen
inputs, and input validation."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from hybrid.algorithms.chunked_logprob import chunked_log_probs

pytestmark = pytest.mark.unit

N, V, H = 37, 1000, 64

# (hidden, weight, labels) -> (log-probs, entropy), either the chunked function or the reference.
LogProbFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]
]


def make_inputs(
    n: int = N, v: int = V, h: int = H, dtype: torch.dtype = torch.float32, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).to(dtype)
    # Scaled so logits are O(few): a peaked but not one-hot softmax exercises every term.
    weight = (torch.randn(v, h, generator=g) / h**0.5 * 3).to(dtype)
    labels = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, labels


def reference(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = (hidden @ weight.T).float()
    lp = logits.gather(-1, labels[:, None]).squeeze(-1) - logits.logsumexp(-1)
    ent = logits.logsumexp(-1) - (logits.softmax(-1) * logits).sum(-1)
    return lp, ent


def grads(
    fn: LogProbFn,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    a: torch.Tensor | None,
    b: torch.Tensor | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Grads of sum(lp * a) + sum(ent * b) w.r.t. fresh leaf copies of hidden and weight."""
    hidden = hidden.detach().clone().requires_grad_(hidden.requires_grad)
    weight = weight.detach().clone().requires_grad_(weight.requires_grad)
    lp, ent = fn(hidden, weight, labels)
    loss = torch.zeros(())
    if a is not None:
        loss = loss + (lp * a).sum()
    if b is not None:
        assert ent is not None
        loss = loss + (ent * b).sum()
    loss.backward()
    return hidden.grad, weight.grad


# ---- forward ---------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 7, N, N + 50])
def test_forward_matches_full_logits_float32(chunk: int) -> None:
    hidden, weight, labels = make_inputs()
    lp, ent = chunked_log_probs(hidden, weight, labels, chunk, with_entropy=True)
    ref_lp, ref_ent = reference(hidden, weight, labels)
    assert lp.dtype == torch.float32 and lp.shape == (N,)
    assert ent is not None and ent.dtype == torch.float32 and ent.shape == (N,)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)
    # The entropy must be non-trivial, or a zero entropy would pass the check above.
    assert ref_ent.min() > 0.1


def test_without_entropy_returns_none_and_same_log_probs() -> None:
    hidden, weight, labels = make_inputs()
    lp, ent = chunked_log_probs(hidden, weight, labels, 5, with_entropy=False)
    assert ent is None
    torch.testing.assert_close(lp, reference(hidden, weight, labels)[0], rtol=0, atol=1e-5)


def test_no_grad_equals_grad_enabled_and_returns_plain_tensors() -> None:
    hidden, weight, labels = make_inputs()
    with torch.no_grad():
        lp, ent = chunked_log_probs(hidden, weight, labels, 8, with_entropy=True)
    assert not lp.requires_grad and ent is not None and not ent.requires_grad
    lp_g, ent_g = chunked_log_probs(
        hidden.requires_grad_(), weight.requires_grad_(), labels, 8, with_entropy=True
    )
    assert lp_g.requires_grad and ent_g is not None and ent_g.requires_grad
    assert torch.equal(lp, lp_g.detach()) and torch.equal(ent, ent_g.detach())


@pytest.mark.parametrize("requires_grad", [False, True])
def test_zero_tokens_give_empty_outputs(requires_grad: bool) -> None:
    hidden, weight, labels = make_inputs(n=0)
    hidden.requires_grad_(requires_grad)
    lp, ent = chunked_log_probs(hidden, weight, labels, 4, with_entropy=True)
    assert lp.shape == (0,) and ent is not None and ent.shape == (0,)


# ---- gradients -------------------------------------------------------------------------------


def chunked(chunk: int, with_entropy: bool = True) -> LogProbFn:
    return lambda h, w, y: chunked_log_probs(h, w, y, chunk, with_entropy)


@pytest.mark.parametrize("chunk", [5, 64])
@pytest.mark.parametrize("terms", ["both", "log_probs", "entropy"])
def test_gradients_match_full_logits_float32(chunk: int, terms: str) -> None:
    hidden, weight, labels = make_inputs()
    hidden.requires_grad_()
    weight.requires_grad_()
    g = torch.Generator().manual_seed(1)
    a = torch.randn(N, generator=g) if terms != "entropy" else None
    b = torch.randn(N, generator=g) if terms != "log_probs" else None
    got = grads(chunked(chunk, with_entropy=b is not None), hidden, weight, labels, a, b)
    want = grads(reference, hidden, weight, labels, a, b)
    for got_grad, want_grad in zip(got, want, strict=True):
        assert got_grad is not None and want_grad is not None
        assert want_grad.abs().max() > 0.1
        # fp32 rounding of differently ordered sums, relative to the gradient's scale: max
        # |diff| / max |grad| measured 2.4e-6 (AVX-512) and 3.6e-6 (AVX2 only); a chunking
        # error is of the gradient's own size.
        scale = float(want_grad.abs().max())
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("frozen", ["weight", "hidden"])
def test_frozen_input_gets_no_grad_and_the_other_matches(frozen: str) -> None:
    hidden, weight, labels = make_inputs()
    hidden.requires_grad_(frozen != "hidden")
    weight.requires_grad_(frozen != "weight")
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(N, generator=g), torch.randn(N, generator=g)
    got = grads(chunked(5), hidden, weight, labels, a, b)
    want = grads(reference, hidden, weight, labels, a, b)
    frozen_index = 0 if frozen == "hidden" else 1
    assert got[frozen_index] is None
    got_live, want_live = got[1 - frozen_index], want[1 - frozen_index]
    assert got_live is not None and want_live is not None
    torch.testing.assert_close(got_live, want_live, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("hidden_grad", "weight_grad", "num_matmuls"),
    [(True, True, 3), (True, False, 2), (False, True, 2)],
)
def test_backward_skips_the_matmul_of_a_frozen_input(
    hidden_grad: bool, weight_grad: bool, num_matmuls: int
) -> None:
    # Autograd drops a gradient returned for a frozen input, so only the work shows the skip:
    # per chunk, the logits recompute plus one (n, V, H) matmul per input that needs a grad.
    hidden, weight, labels = make_inputs()
    hidden.requires_grad_(hidden_grad)
    weight.requires_grad_(weight_grad)
    lp, ent = chunked_log_probs(hidden, weight, labels, 5, with_entropy=True)
    assert ent is not None
    with FlopCounterMode(display=False) as counter:
        (lp.sum() + ent.sum()).backward()
    assert counter.get_total_flops() == num_matmuls * 2 * N * V * H


def test_gradcheck_float64_both_outputs() -> None:
    hidden, weight, labels = make_inputs(n=6, v=11, h=4, dtype=torch.float64)
    hidden.requires_grad_()
    weight.requires_grad_()

    def fn(h: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lp, ent = chunked_log_probs(h, w, labels, 4, with_entropy=True)
        assert ent is not None
        return lp, ent

    assert fn(hidden, weight)[0].dtype == torch.float64
    assert torch.autograd.gradcheck(fn, (hidden, weight))


# ---- bf16 ------------------------------------------------------------------------------------


def test_bf16_matches_full_logits_from_same_inputs() -> None:
    # Measured on CPU (torch 2.13), seed 0, chunk 8: max |chunked - full| is 0 for log-probs,
    # 6.7e-6 for entropy (float32 summation order), 0 for grad_hidden and 0.0156 for
    # grad_weight (max |grad| 6.69, so 0.23%): each chunk's weight grad is rounded to bf16 before
    # the float32 sum. Both are 0.083 away from float64 math on the same inputs, so the chunking
    # adds less than the bf16 logits already cost. Tolerances leave about 4x room.
    hidden, weight, labels = make_inputs(dtype=torch.bfloat16)
    hidden.requires_grad_()
    weight.requires_grad_()
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(N, generator=g), torch.randn(N, generator=g)
    lp, ent = chunked_log_probs(hidden, weight, labels, 8, with_entropy=True)
    ref_lp, ref_ent = reference(hidden, weight, labels)
    assert ent is not None and lp.dtype == ent.dtype == torch.float32
    got = grads(chunked(8), hidden, weight, labels, a, b)
    want = grads(reference, hidden, weight, labels, a, b)
    assert got[0] is not None and got[1] is not None and want[0] is not None
    assert want[1] is not None and got[1].dtype == torch.bfloat16
    diffs = {
        "log_probs": (lp - ref_lp).abs().max().item(),
        "entropy": (ent - ref_ent).abs().max().item(),
        "grad_hidden": (got[0] - want[0]).float().abs().max().item(),
        "grad_weight": (got[1] - want[1]).float().abs().max().item(),
    }
    print("bf16 max |chunked - full|:", diffs)
    assert diffs["log_probs"] <= 3e-5 and diffs["entropy"] <= 3e-5
    assert diffs["grad_hidden"] <= 1e-2 * want[0].float().abs().max().item()
    assert diffs["grad_weight"] <= 1e-2 * want[1].float().abs().max().item()


# ---- memory ----------------------------------------------------------------------------------


def saved_numels(fn: LogProbFn, *args: torch.Tensor) -> list[int]:
    """Element counts of every tensor autograd saves for backward while fn runs."""
    numels: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        numels.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return numels


def test_reference_saves_full_logits_so_the_check_below_can_fail() -> None:
    hidden, weight, labels = make_inputs()
    numels = saved_numels(reference, hidden.requires_grad_(), weight.requires_grad_(), labels)
    assert max(numels) >= N * V


def test_backward_saves_only_inputs_and_per_row_stats() -> None:
    n, v, h = 4096, 32000, 64
    hidden, weight, labels = make_inputs(n=n, v=v, h=h)
    hidden.requires_grad_()
    weight.requires_grad_()
    numels = saved_numels(chunked(256), hidden, weight, labels)
    # hidden, weight, labels, log-normaliser, entropy: nothing of size tokens x vocab.
    assert sorted(numels) == sorted([n * h, v * h, n, n, n])


# ---- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [0, -3])
def test_non_positive_chunk_is_rejected(chunk: int) -> None:
    hidden, weight, labels = make_inputs()
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_log_probs(hidden, weight, labels, chunk, with_entropy=True)


@pytest.mark.parametrize("shape", [(N + 1,), (N, 1), ()])
def test_labels_of_wrong_shape_are_rejected(shape: tuple[int, ...]) -> None:
    hidden, weight, _ = make_inputs()
    with pytest.raises(ValueError, match="labels"):
        chunked_log_probs(hidden, weight, torch.zeros(shape, dtype=torch.long), 4, True)


def test_weight_of_wrong_width_is_rejected() -> None:
    hidden, weight, labels = make_inputs()
    with pytest.raises(ValueError, match="weight"):
        chunked_log_probs(hidden, weight[:, :-1], labels, 4, with_entropy=True)
