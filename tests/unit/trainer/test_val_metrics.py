"""Unit tests for `hybrid.trainer.val_metrics`: validation rows grouped by prompt with their
parsed answers, and the val-core / val-aux names per data source and for `all`."""

from __future__ import annotations

import pytest
import torch

from hybrid.data import Batch
from hybrid.evaluation.estimators import PromptSamples
from hybrid.trainer.val_metrics import prompt_samples, validation_metrics

pytestmark = pytest.mark.unit


def rollout() -> Batch:
    """Two arithmetic prompts and one gsm8k prompt, two samples each, adjacent."""
    return Batch.from_dict(
        {},
        {
            "uid": ["val-0", "val-0", "val-1", "val-1", "val-2", "val-2"],
            "data_source": ["arithmetic"] * 4 + ["gsm8k"] * 2,
            "response_text": ["7", "7<|im_end|>", "5", "6", "#### 1,600", "no answer"],
        },
    )


def test_rows_group_by_prompt_with_their_answers() -> None:
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    prompts = prompt_samples(rollout(), scores, None)
    assert prompts == [
        PromptSamples("arithmetic", (1.0, 1.0), ("7", "7")),
        PromptSamples("arithmetic", (0.0, 1.0), ("5", "6")),
        PromptSamples("gsm8k", (1.0, 0.0), ("1600", None)),
    ]
    custom = prompt_samples(rollout(), scores, lambda source, text: source)
    assert custom[2].answers == ("gsm8k", "gsm8k")
    with pytest.raises(ValueError, match="5 validation rewards for 6 responses"):
        prompt_samples(rollout(), scores[:5], None)


def test_names_per_data_source_and_overall() -> None:
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    metrics = validation_metrics(prompt_samples(rollout(), scores, None))
    for source in ("arithmetic", "gsm8k", "all"):
        assert f"val-core/{source}/reward/mean@2" in metrics
        for k in (1, 2):
            for name in (f"best@{k}/mean", f"maj@{k}/mean", f"pass@{k}"):
                assert f"val-aux/{source}/reward/{name}" in metrics
    assert len(metrics) == 3 * (1 + 2 * 3)
    assert metrics["val-core/arithmetic/reward/mean@2"] == 0.75
    assert metrics["val-aux/arithmetic/reward/pass@2"] == 1.0
    assert metrics["val-aux/gsm8k/reward/maj@2/mean"] == 1.0  # None never outvotes "1600"
    assert metrics["val-core/all/reward/mean@2"] == pytest.approx(4 / 6)


def test_one_sample_per_prompt_reports_only_the_mean() -> None:
    prompts = [PromptSamples("math", (1.0,), ("2",)), PromptSamples("math", (0.0,), (None,))]
    assert validation_metrics(prompts) == {
        "val-core/math/reward/mean@1": 0.5,
        "val-core/all/reward/mean@1": 0.5,
    }
