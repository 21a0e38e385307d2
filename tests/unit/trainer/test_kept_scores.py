"""Split's dynamic sampling hands the explorer loop's scores to the train batch that takes the
groups (`KeptScores`): the rows come back in the batch's order, whatever order the explorer
scored them in, and each group is claimed once."""

from __future__ import annotations

import pytest
import torch

from hybrid.data import Batch
from hybrid.rewards import RewardManager
from hybrid.trainer.sources.buffer import KeptScores

pytestmark = pytest.mark.unit


def rows(*rows: tuple[str, int, str]) -> Batch:
    """(uid, index, answer) per row, for the arithmetic prompt "1+1=" (ground truth 2)."""
    return Batch.from_dict(
        {"responses": torch.zeros(len(rows), 1, dtype=torch.long)},
        {
            "uid": [uid for uid, _, _ in rows],
            "index": [index for _, index, _ in rows],
            "response_text": [text for _, _, text in rows],
            "ground_truth": ["2"] * len(rows),
            "data_source": ["arithmetic"] * len(rows),
        },
    )


def test_the_scores_follow_the_train_batch_order_and_are_claimed_once() -> None:
    explored = rows(("b", 1, "2"), ("a", 0, "2"), ("b", 0, "3"), ("a", 1, "7"))
    kept = KeptScores()
    kept.put(explored, RewardManager(num_workers=0).score_rows(explored))
    # The buffer hands whole groups back, each in index order, first completed first.
    taken = rows(("a", 0, "2"), ("a", 1, "7"), ("b", 0, "3"), ("b", 1, "2"))
    scores, metrics = kept.take(taken).result()
    assert scores.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert metrics["reward/mean"] == 0.5
    with pytest.raises(KeyError):
        kept.take(taken)
