"""Scores and parsed answers of generated samples, grouped by prompt.

The rewards are the project's: the built-in ones by data_source (hybrid/rewards/registry.py)
or a custom file's compute_score, called through the `RewardManager` that training scores with
(its failure rules included: a row whose reward raises stops the evaluation, naming the row).
The answers maj@k votes on are parsed by `extract_answer` (hybrid/rewards/answers.py): the
built-in reader of the data source, or with a custom file its own
`extract_answer(data_source, solution_str)` (the stripped response when it defines none).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybrid.data import Batch, PromptDataset
from hybrid.evaluation.estimators import PromptSamples
from hybrid.rewards.answers import AnswerFn, answer_function, extract_answer
from hybrid.rewards.manager import RewardManager
from hybrid.rewards.registry import BUILTIN_REWARDS, load_reward_function


@dataclass(frozen=True)
class ScoredPrompt:
    """One prompt's samples, scored."""

    index: int
    """The prompt's position in the dataset (after the length filter)."""
    data_source: str
    ground_truth: str
    raw_prompt: str
    responses: tuple[str, ...]
    scores: tuple[float, ...]
    answers: tuple[str | None, ...]
    response_lengths: tuple[int, ...]
    """Tokens of each response."""
    truncated: int
    """Samples cut at response_length."""
    source: str = ""
    """Where the prompt came from, "file:row" (set once the dataset is at hand)."""

    def samples(self) -> PromptSamples:
        return PromptSamples(self.data_source, self.scores, self.answers)


@dataclass(frozen=True)
class Rewards:
    """What scores a sample and what parses its answer."""

    manager: RewardManager
    custom_answers: AnswerFn | None = None

    @classmethod
    def build(
        cls, custom_path: str | None, custom_name: str, num_workers: int, dataset: PromptDataset
    ) -> Rewards:
        """The custom file's functions, or the built-ins (every row's data_source must have
        one: refused before any worker starts, naming the row)."""
        if custom_path is None:
            check_data_sources(dataset)
            return cls(RewardManager(None, num_workers=num_workers))
        if not Path(custom_path).is_file():
            raise FileNotFoundError(f"custom_path: {custom_path} does not exist")
        reward_fn = load_reward_function(custom_path, custom_name)
        return cls(RewardManager(reward_fn, num_workers=num_workers), answer_function(custom_path))

    def answer(self, data_source: str, text: str) -> str | None:
        return extract_answer(data_source, text, self.custom_answers)

    def score(self, generated: Batch, samples_per_prompt: int) -> list[ScoredPrompt]:
        """`generated`: `samples_per_prompt` adjacent rows per prompt, each row's `uid` the
        prompt's `val-<index>` (PromptLoader.validation_batches)."""
        scores, _ = self.manager.score(generated)
        columns = generated.non_tensors
        lengths = generated.tensors["response_mask"].sum(dim=1).tolist()
        n = samples_per_prompt
        assert len(generated) % n == 0, f"{len(generated)} rows are not {n} per prompt"
        out = []
        for first in range(0, len(generated), n):
            rows = range(first, first + n)
            uids = {str(columns["uid"][row]) for row in rows}
            assert len(uids) == 1, f"rows {first}..{first + n - 1} mix prompts {sorted(uids)}"
            source = str(columns["data_source"][first])
            texts = tuple(str(columns["response_text"][row]) for row in rows)
            out.append(
                ScoredPrompt(
                    index=int(uids.pop().rpartition("-")[2]),
                    data_source=source,
                    ground_truth=str(columns["ground_truth"][first]),
                    raw_prompt=str(columns["raw_prompt"][first]),
                    responses=texts,
                    scores=tuple(float(scores[row]) for row in rows),
                    answers=tuple(self.answer(source, text) for text in texts),
                    response_lengths=tuple(int(lengths[row]) for row in rows),
                    truncated=sum(columns["status"][row] == "truncated" for row in rows),
                )
            )
        return out

    def close(self) -> None:
        self.manager.close()


def check_data_sources(dataset: PromptDataset) -> None:
    """Every row has a built-in reward (without a custom file): the first that has none is
    named with its file and row."""
    for row in dataset.rows:
        if row.data_source not in BUILTIN_REWARDS:
            raise ValueError(
                f"{row.source}: data_source {row.data_source!r} has no built-in reward (known: "
                f"{sorted(BUILTIN_REWARDS)}); pass custom_path=FILE with a compute_score"
            )


def describe_rewards(custom_path: str | None, custom_name: str) -> dict[str, Any]:
    """What scored and parsed, for eval.json."""
    return {
        "reward": f"{custom_path}:{custom_name}" if custom_path else "built-in by data_source",
        "answers": (
            f"{custom_path}: its extract_answer, else the stripped response"
            if custom_path
            else "built-in readers by data_source (hybrid.rewards.answers)"
        ),
    }
