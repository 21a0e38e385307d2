"""Validation's metrics over its sampled responses (trainer.val_n per prompt), per data source
and over every prompt (data source `all`), under the names verl logs them with:

    val-core/<data_source>/reward/mean@<n>       the mean reward: the headline
    val-aux/<data_source>/reward/best@<k>/mean   the expected best reward of k samples
    val-aux/<data_source>/reward/maj@<k>/mean    the expected reward of k samples' majority answer
    val-aux/<data_source>/reward/pass@<k>        the chance that one of k samples is correct

for every k of `default_ks(n)` when n > 1 (docs/evaluation.md, "Validation metrics"). The math
is hybrid/evaluation/estimators.py; the answers voted on come from hybrid/rewards/answers.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hybrid.data import Batch
from hybrid.evaluation.estimators import OVERALL, PromptSamples, default_ks, summarize
from hybrid.rewards.answers import AnswerFn, extract_answer


def prompt_samples(
    rollout: Batch, scores: torch.Tensor, answers: AnswerFn | None
) -> list[PromptSamples]:
    """The rows of a validation rollout (columns uid, data_source, response_text) and their
    rewards `scores` (rows,), grouped by prompt in the order the prompts first appear."""
    columns = rollout.non_tensors
    uids, sources, texts = columns["uid"], columns["data_source"], columns["response_text"]
    if len(scores) != len(uids):
        raise ValueError(f"{len(scores)} validation rewards for {len(uids)} responses")
    rows: dict[str, list[int]] = {}
    for row, uid in enumerate(uids):
        rows.setdefault(str(uid), []).append(row)
    values = scores.tolist()
    out = []
    for members in rows.values():
        source = str(sources[members[0]])
        out.append(
            PromptSamples(
                source,
                tuple(float(values[row]) for row in members),
                tuple(extract_answer(source, str(texts[row]), answers) for row in members),
            )
        )
    return out


def validation_metrics(prompts: Sequence[PromptSamples]) -> dict[str, float]:
    """The val-core / val-aux metrics of the prompts' samples (all prompts hold n of them)."""
    if not prompts:
        return {}
    n = len(prompts[0].scores)
    ks = default_ks(n) if n > 1 else []
    estimates = summarize(prompts, ks)
    sources = dict.fromkeys([*(p.data_source for p in prompts), OVERALL])
    out = {}
    for source in sources:
        out[f"val-core/{source}/reward/mean@{n}"] = estimates[f"{source}/mean@{n}"].value
        for k in ks:
            aux = f"val-aux/{source}/reward"
            out[f"{aux}/best@{k}/mean"] = estimates[f"{source}/best@{k}"].value
            out[f"{aux}/maj@{k}/mean"] = estimates[f"{source}/maj@{k}"].value
            out[f"{aux}/pass@{k}"] = estimates[f"{source}/pass@{k}"].value
    return out
