"""How a packed row is cut for sequence parallelism (hybrid.workers.sequence_parallel.
shard_inputs), pure: the padding is a sequence of its own, every scored position is on exactly
one rank, and labels come from the whole row, so a rank's last position is scored against the
next rank's first token (verl #6068: labels shifted after slicing gave it a wrong one)."""

from __future__ import annotations

import pytest
import torch

from hybrid.workers.packing import ModelInputs, cu_seqlens
from hybrid.workers.sequence_parallel import shard_inputs

pytestmark = pytest.mark.unit


def _row() -> ModelInputs:
    """Two packed sequences, 5 + 4 = 9 tokens: [10 11 12 13 14 | 20 21 22 23]; the responses
    are 13 14 (scored from positions 2, 3) and 21 22 23 (from positions 5, 6, 7)."""
    ids = torch.tensor([[10, 11, 12, 13, 14, 20, 21, 22, 23]])
    return ModelInputs(
        input_ids=ids,
        position_ids=torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3]]),
        attention_mask=None,
        score_index=torch.tensor([2, 3, 5, 6, 7]),
        labels=torch.tensor([13, 14, 21, 22, 23]),
        target=torch.arange(5),
        response_shape=(1, 5),
        cu_seqlens=cu_seqlens(torch.tensor([5, 4])),
        max_seqlen=5,
    )


def test_two_ranks_split_the_row_and_score_across_the_edge() -> None:
    first, second = (shard_inputs(_row(), rank, 2) for rank in (0, 1))
    # 9 tokens -> 10: one padding token, its own sequence. Each rank embeds the whole row and
    # keeps its span of the embeddings.
    assert first.inputs.input_ids.tolist() == [[10, 11, 12, 13, 14, 20, 21, 22, 23, 0]]
    assert (first.span, second.span) == ((0, 5), (5, 10))
    assert first.inputs.position_ids.tolist() == [[0, 1, 2, 3, 4]]
    assert second.inputs.position_ids.tolist() == [[0, 1, 2, 3, 0]]
    assert first.inputs.cu_seqlens.tolist() == [0, 5, 9, 10]
    assert first.counts == second.counts == [2, 3]
    assert first.inputs.score_index.tolist() == [2, 3]
    assert first.inputs.labels.tolist() == [13, 14]
    assert second.inputs.score_index.tolist() == [0, 1, 2]
    assert second.inputs.labels.tolist() == [21, 22, 23]


def test_the_last_position_of_a_slice_is_scored_against_the_next_slice_s_token() -> None:
    """Position 4 (rank 0's last of 5) predicts token 20 at position 5 (rank 1's first)."""
    row = _row()
    scored = ModelInputs(
        **{
            **row.__dict__,
            "score_index": torch.tensor([3, 4, 5]),
            "labels": torch.tensor([14, 20, 21]),
        }
    )
    first = shard_inputs(scored, 0, 2)
    assert first.inputs.score_index.tolist() == [3, 4]
    assert first.inputs.labels.tolist() == [14, 20]  # 20 lives on rank 1's slice
    # Shifting after slicing would read the label off rank 0's own span of ids: none past 14.
    start, end = first.span
    shifted_locally = first.inputs.input_ids[0, start + 1 : end].tolist()
    assert 20 not in shifted_locally


def test_no_padding_when_the_row_fills_the_ranks() -> None:
    row = _row()
    even = shard_inputs(
        ModelInputs(
            **{
                **row.__dict__,
                "input_ids": row.input_ids[:, :8],
                "position_ids": row.position_ids[:, :8],
                "score_index": torch.tensor([2, 3, 5, 6]),
                "labels": torch.tensor([13, 14, 21, 22]),
                "cu_seqlens": cu_seqlens(torch.tensor([5, 3])),
            }
        ),
        1,
        4,
    )
    assert even.span == (2, 4) and even.inputs.position_ids.tolist() == [[2, 3]]
    assert even.inputs.cu_seqlens.tolist() == [0, 5, 8]
    assert even.counts == [0, 2, 1, 1]


def test_padded_rows_are_refused() -> None:
    row = _row()
    padded = ModelInputs(**{**row.__dict__, "cu_seqlens": None})
    with pytest.raises(ValueError, match="packed inputs"):
        shard_inputs(padded, 0, 2)
