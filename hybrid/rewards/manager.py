"""`RewardManager`: one scalar reward per row of a `Batch`, plus `reward/` metrics.

Reads the non-tensor columns `response_text`, `data_source`, `ground_truth` and, if present,
`extra_info` and `uid`. An agent trajectory's `response_text` is the whole trajectory (tool
replies included), and its extra_info gains `agent`: the trajectory's `agent_stats` (turns,
tool_calls, errors, final_text: the model's last turn; hybrid/rollout/agent/stats.py). Each row is one call of the reward function: in a `RewardPool` of
worker processes under a per-call deadline (`num_workers >= 1`, the trainer's default;
`calls_per_worker` calls at once in each, for functions that wait), or inline on the calling
thread with no deadline (`num_workers=0`). `submit` starts scoring and
returns at once, so the caller overlaps it with other work (the trainer: the workers' passes);
`stream` scores a batch whose rows arrive in parts, each part as soon as it is there;
`score_rows` scores rows at once and keeps each row's outcome, so that a chosen subset of them
(dynamic sampling's kept groups) is summarised later as if only those had been scored.

A row fails when its call times out, raises, returns NaN or inf, or returns something that is
neither a number nor a dict with a numeric 'score' (ERROR_KINDS). `on_error` says what then:
- `fail` (the default): `RewardError` naming the first failed row (index, uid, data_source),
  the kind, the error and how many rows failed.
- `score`: the row scores `error_score`; `reward/errors` counts the step's failed rows and
  `reward/errors/<kind>` each kind; the first failure's message is logged. A batch whose every
  row failed still raises: training on nothing but error scores is no run.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol, get_args

import torch

from hybrid.data import Batch
from hybrid.rewards.outcome import ERROR_KINDS, OnError, Outcome
from hybrid.rewards.pool import RewardPool
from hybrid.rewards.registry import RewardFn, compute_score
from hybrid.rewards.worker import call

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("response_text", "data_source", "ground_truth")
ON_ERROR_CHOICES = get_args(OnError)


class Scores(Protocol):
    """A batch's rule rewards, being scored or scored already: what a train step waits on."""

    def result(self) -> tuple[torch.Tensor, dict[str, float]]:
        """(scores (batch,) float32, reward/ metrics), as `RewardManager.score` gives them."""
        ...


class RewardError(RuntimeError):
    """A reward call failed and `reward.on_error` says to stop (or every row failed)."""


def default_pool_size() -> int:
    """The cores this process may run on, at least 2 (a reward call often waits rather than
    computes: a sandbox, a judge) and at most 8."""
    return max(2, min(8, len(os.sched_getaffinity(0))))


class RewardManager:
    """Scores batches with `reward_fn` (verl's compute_score signature; built-ins by default)."""

    def __init__(
        self,
        reward_fn: RewardFn | None = None,
        *,
        num_workers: int = 0,
        calls_per_worker: int = 1,
        timeout_s: float = 60.0,
        on_error: OnError = "fail",
        error_score: float = 0.0,
    ) -> None:
        if on_error not in ON_ERROR_CHOICES:
            raise ValueError(f"reward.on_error must be one of {ON_ERROR_CHOICES}, got {on_error!r}")
        if num_workers < 0:
            raise ValueError(f"reward.num_workers must be >= 0 (0: inline), got {num_workers}")
        self.reward_fn: RewardFn = compute_score if reward_fn is None else reward_fn
        self.on_error, self.error_score = on_error, error_score
        self.pool = (
            RewardPool(self.reward_fn, num_workers, timeout_s, calls_per_worker)
            if num_workers
            else None
        )
        self._runner = ThreadPoolExecutor(1, thread_name_prefix="rewards")

    def submit(self, batch: Batch) -> Future[tuple[torch.Tensor, dict[str, float]]]:
        """Start scoring `batch`; the future gives `score`'s result (or raises its error)."""
        calls = _calls(batch)  # missing columns fail here, on the caller's thread
        return self._runner.submit(lambda: self._summarise(batch, self._outcomes(calls)))

    def stream(self) -> RewardStream:
        """Scoring of a batch that arrives in parts: each part starts as soon as it is added
        (fully_async: groups as they leave the queue, while others still generate)."""
        return RewardStream(self)

    def score(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Returns (scores (batch,) float32, metrics: reward/mean, max, min, errors, errors/<kind>
        and the mean of each extra numeric key the function's dicts carry)."""
        return self.submit(batch).result()

    def score_rows(self, batch: Batch) -> ScoredRows:
        """Score `batch` now (the failure rules apply to it as to `score`); the result keeps
        each row's outcome, so that `ScoredRows.select` can summarise a subset of them."""
        # On the runner thread, as every other call: the pool serves one caller at a time (the
        # split explorer loop scores while the trainer's step does).
        outcomes = self._runner.submit(self._outcomes, _calls(batch)).result()
        scores, _ = self._summarise(batch, outcomes, whole=False)
        return ScoredRows(self, batch, outcomes, scores)

    def close(self) -> None:
        """Stop scoring (a batch still in the pool is abandoned) and end the processes."""
        if self.pool is not None:
            self.pool.cancel()
        self._runner.shutdown(wait=True)
        if self.pool is not None:
            self.pool.close()

    def _outcomes(self, calls: list[tuple]) -> list[Outcome]:
        if self.pool is not None:
            return self.pool.map(calls)
        return [call(self.reward_fn, args) for args in calls]  # what a worker does

    def _summarise(
        self, batch: Batch, outcomes: list[Outcome], report: bool = True, whole: bool = True
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """`report`: apply reward.on_error to the failed rows (False: reported already);
        `whole`: the rows are a train batch, which must not fail entirely (False: a part of
        one, e.g. a single group that dynamic sampling scores as it arrives)."""
        failed = [row for row, outcome in enumerate(outcomes) if outcome[0] != "ok"]
        if failed:
            self._handle_failures(batch, outcomes, failed, report, whole)
        values = [o[1] if o[0] == "ok" else self.error_score for o in outcomes]
        extras: defaultdict[str, list[float]] = defaultdict(list)
        for *_, row_extras in outcomes:
            for key, value in row_extras.items():
                extras[key].append(value)
        scores = torch.tensor(values, dtype=torch.float32)  # (batch,)
        metrics = {f"reward/{key}": sum(vs) / len(vs) for key, vs in extras.items()}
        metrics.update(_summary(scores))  # a dict key "mean" cannot mask reward/mean
        kinds = [outcomes[row][0] for row in failed]
        metrics["reward/errors"] = float(len(failed))
        metrics.update({f"reward/errors/{kind}": float(kinds.count(kind)) for kind in ERROR_KINDS})
        return scores, metrics

    def _handle_failures(
        self,
        batch: Batch,
        outcomes: list[Outcome],
        failed: list[int],
        report: bool = True,
        whole: bool = True,
    ) -> None:
        first = failed[0]
        kind, message = outcomes[first][0], str(outcomes[first][1])
        headline = message.splitlines()[0] if message else kind
        where = _row_name(batch, first)
        count = f"{len(failed)} of {len(outcomes)} rows failed"
        if self.on_error == "fail" and report:
            raise RewardError(
                f"reward of {where}: {kind}: {headline} ({count}). reward.on_error=fail stops "
                f"the run; reward.on_error=score gives such rows reward.error_score "
                f"({self.error_score:g}) and counts them in reward/errors"
            )
        if whole and len(failed) == len(outcomes):
            raise RewardError(
                f"every reward of the batch failed ({count}); the first, {where}: {kind}: "
                f"{headline}. Fix the reward function: a step of nothing but error scores "
                f"trains on nothing"
            )
        if not report:
            return
        logger.error(
            "reward of %s: %s: %s; it scores %g (reward.on_error=score; %s, see reward/errors)",
            where,
            kind,
            message,
            self.error_score,
            count,
        )


class RewardStream:
    """One batch's scores, its rows added part by part (`add`, in row order); `result()` waits
    for every part and gives what `RewardManager.score` gives for the parts concatenated: the
    failure rules (which row is named, "every row failed") apply to the whole batch."""

    def __init__(self, manager: RewardManager) -> None:
        self._manager = manager
        self._parts: list[Batch] = []
        self._outcomes: list[Future[list[Outcome]]] = []

    def add(self, part: Batch) -> None:
        calls = _calls(part)
        self._parts.append(part)
        self._outcomes.append(self._manager._runner.submit(self._manager._outcomes, calls))

    @property
    def num_parts(self) -> int:
        return len(self._parts)

    def result(self) -> tuple[torch.Tensor, dict[str, float]]:
        if not self._parts:
            raise ValueError("RewardStream.result: no rows were added")
        outcomes = [outcome for part in self._outcomes for outcome in part.result()]
        whole = self._parts[0] if len(self._parts) == 1 else Batch.concat(self._parts)
        return self._manager._summarise(whole, outcomes)


class ScoredRows:
    """Rows scored already (`RewardManager.score_rows`): their scores, and a `Scores` of any
    subset of them whose metrics are those of that subset alone (failures were reported when
    the rows were scored, once)."""

    def __init__(
        self, manager: RewardManager, batch: Batch, outcomes: list[Outcome], scores: torch.Tensor
    ) -> None:
        self._manager, self._batch, self._outcomes = manager, batch, outcomes
        self.scores = scores
        """(rows,) float32: each row's score (reward.error_score where its call failed)."""

    def __len__(self) -> int:
        return len(self._outcomes)

    def select(self, rows: list[int]) -> ScoredRows:
        return ScoredRows(
            self._manager,
            self._batch[rows],
            [self._outcomes[row] for row in rows],
            self.scores[rows],
        )

    @staticmethod
    def concat(parts: list[ScoredRows]) -> ScoredRows:
        if not parts:
            raise ValueError("ScoredRows.concat: no parts")
        return ScoredRows(
            parts[0]._manager,
            Batch.concat([p._batch for p in parts]),
            [outcome for p in parts for outcome in p._outcomes],
            torch.cat([p.scores for p in parts]),
        )

    def result(self) -> tuple[torch.Tensor, dict[str, float]]:
        return self._manager._summarise(self._batch, self._outcomes, report=False)


def _calls(batch: Batch) -> list[tuple]:
    missing = [key for key in REQUIRED_COLUMNS if key not in batch.non_tensors]
    if missing:
        raise KeyError(
            f"reward needs non-tensor columns {missing}; "
            f"batch has tensors {list(batch.tensors)} and non-tensors {list(batch.non_tensors)}"
        )
    columns = batch.non_tensors
    extra_infos = columns.get("extra_info")
    trajectories = columns.get("agent_stats")
    calls = []
    for row in range(len(batch)):
        extra_info = None if extra_infos is None else extra_infos[row]
        if trajectories is not None:  # an agent trajectory: its turns, tool use, final turn
            extra_info = {**(extra_info or {}), "agent": trajectories[row]}
        calls.append(
            (
                str(columns["data_source"][row]),
                str(columns["response_text"][row]),
                columns["ground_truth"][row],
                extra_info,
            )
        )
    return calls


def _row_name(batch: Batch, row: int) -> str:
    columns = batch.non_tensors
    uid = f", uid {columns['uid'][row]}" if "uid" in columns else ""
    return f"row {row}{uid} (data_source {str(columns['data_source'][row])!r})"


def _summary(scores: torch.Tensor) -> dict[str, float]:
    if scores.numel() == 0:
        return {"reward/mean": float("nan"), "reward/max": float("nan"), "reward/min": float("nan")}
    return {
        "reward/mean": scores.mean().item(),
        "reward/max": scores.max().item(),
        "reward/min": scores.min().item(),
    }
