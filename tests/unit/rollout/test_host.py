"""RolloutHost over a scripted engine (no vLLM: the engine's answers are a function of its
requests, so each test can say what the host must have asked and built).

What the host owns and both workers rely on: the Samples' uid is the prompt's uid (or the
row's position), n Samples per row in prompt-major order, the row's other columns become
metadata, seeds and budgets reach the engine, every token carries the version, the TP slice,
scores land on the response positions, and streaming requests leave the engine before
anything else runs on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest
import torch

from hybrid.data import Batch
from hybrid.data.sample import SampleStatus
from hybrid.dtypes import Dtype
from hybrid.rollout.base import GREEDY, Continuation, GeneratedSample, ResumeTag, Sampling
from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.group import RolloutGroup
from hybrid.rollout.host import RolloutHost, build_samples, prompt_uids, unpad_prompts

pytestmark = pytest.mark.unit

PAD = 0


class ScriptedEngine:
    """Answers every request with tokens derived from it: sample j of a prompt whose last
    token is t is [t + 1, ..., t + budget] (stopped when the budget is under 3), log-prob
    -0.5 per token; streaming adds one token per request per step."""

    dtype: Dtype = "float32"
    kv_cache_bytes = 0
    weights_kept_on_host = False
    banned_tokens: frozenset[int] = frozenset()

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls: list[tuple[str, object]] = []
        self.live: dict[str, Continuation] = {}
        self.resident: set[ResumeTag] = {"weights", "kv_cache"}

    def generate(
        self,
        prompts: Sequence[list[int]],
        *,
        sampling: Sampling | None = None,
        seeds: Sequence[int] | None = None,
        max_tokens: Sequence[int] | None = None,
    ) -> list[GeneratedSample]:
        self.calls.append(("generate", (list(prompts), sampling, seeds, max_tokens)))
        budgets = max_tokens or [4] * len(prompts)
        out = []
        for prompt, budget in zip(prompts, budgets, strict=True):
            for _ in range(self.n if sampling is None else sampling.n):
                tokens = [prompt[-1] + k for k in range(1, budget + 1)]
                out.append(GeneratedSample(tokens, [-0.5] * budget, str(tokens), budget < 3))
        return out

    def score(self, sequences: Sequence[list[int]], with_adapter: bool = True) -> list[list[float]]:
        self.calls.append(("score", list(sequences)))
        return [[-float(t) for t in seq[1:]] for seq in sequences]

    def submit(self, request_id: str, request: Continuation) -> None:
        self.calls.append(("submit", request_id))
        self.live[request_id] = request

    def step(self) -> list[tuple[str, GeneratedSample, bool]]:
        outputs = []
        for request_id, request in list(self.live.items()):
            token = request.token_ids[-1] + 1
            request = Continuation([*request.token_ids, token], request.max_tokens - 1)
            self.live[request_id] = request
            done = request.max_tokens == 0
            outputs.append((request_id, GeneratedSample([token], [-0.1], ""), done))
            if done:
                del self.live[request_id]
        return outputs

    def has_unfinished(self) -> bool:
        return bool(self.live)

    def abort(self, request_ids: list[str]) -> None:
        self.calls.append(("abort", list(request_ids)))
        for request_id in request_ids:
            self.live.pop(request_id, None)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        raise AssertionError("the host never loads weights")

    def load_adapter(self, path: Path) -> None:
        raise AssertionError("the host never loads adapters")

    def reset_prefix_cache(self) -> None: ...

    def shutdown(self) -> None: ...

    def release(self) -> None: ...

    def resume(self, tags: Sequence[ResumeTag]) -> None: ...


class Tokenizer:
    pad_token_id = PAD

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return ",".join(map(str, token_ids))


def host(n: int = 2, response_length: int = 4, dp: tuple[int, int] = (0, 1)) -> RolloutHost:
    config = RolloutConfig(n=n, response_length=response_length, prompt_length=4)
    group = RolloutGroup(dp_rank=dp[0], dp_size=dp[1], tp_rank=0, tp_size=1)
    return RolloutHost(ScriptedEngine(n), Tokenizer(), group, config)


def prompts(uids: bool = True, seeds: bool = True) -> Batch:
    tensors = {
        "input_ids": torch.tensor([[PAD, PAD, 5, 6], [7, 8, 9, 10], [PAD, PAD, PAD, 20]]),
        "attention_mask": torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]]),
    }
    if seeds:
        tensors["seed"] = torch.tensor([100, 101, 102])
    non_tensors = {
        "data_source": ["a", "b", "c"],
        "extra_info": [{}, {"max_response_tokens": 2}, {}],
    }
    if uids:
        non_tensors["uid"] = ["p0", "p1", "p2"]
    return Batch.from_dict(tensors, non_tensors)


def engine_of(h: RolloutHost) -> ScriptedEngine:
    assert isinstance(h.engine, ScriptedEngine)
    return h.engine


def test_unpad_prompts_keeps_the_real_tokens() -> None:
    ids = torch.tensor([[PAD, PAD, 5, 6], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert unpad_prompts(ids, mask) == [[5, 6], [7, 8, 9, 10]]
    assert unpad_prompts(ids, mask.bool()) == [[5, 6], [7, 8, 9, 10]]


def test_samples_are_grouped_under_the_prompts_uid() -> None:
    h = host(n=2)
    samples = h.generate(prompts(), None, version=3)
    assert [(s.uid, s.index) for s in samples] == [
        ("p0", 0),
        ("p0", 1),
        ("p1", 0),
        ("p1", 1),
        ("p2", 0),
        ("p2", 1),
    ]
    assert samples[2].prompt_ids == [7, 8, 9, 10]
    assert samples[2].response_ids == [11, 12]  # extra_info caps row 1 at 2 tokens
    assert all(s.versions == [3] * s.response_length for s in samples)
    assert samples[0].status is SampleStatus.TRUNCATED  # ran to its budget
    assert samples[2].status is SampleStatus.COMPLETED  # the engine stopped on its own
    # The row's other columns, seed as a plain int; the tokens and uid are fields of their own.
    assert samples[3].metadata == {
        "data_source": "b",
        "extra_info": {"max_response_tokens": 2},
        "seed": 101,
    }
    for sample in samples:
        sample.check()


def test_rows_without_a_uid_are_named_by_position() -> None:
    h = host(n=1)
    samples = h.generate(prompts(uids=False), None, version=0)
    assert [s.uid for s in samples] == ["row-0", "row-1", "row-2"]
    assert prompt_uids(prompts()) == ["p0", "p1", "p2"]


def test_seeds_and_budgets_reach_the_engine_and_greedy_takes_one_sample() -> None:
    h = host(n=2)
    samples = h.generate(prompts(), GREEDY, version=0)
    assert len(samples) == 3 and {s.index for s in samples} == {0}
    ((kind, args),) = engine_of(h).calls
    assert kind == "generate"
    assert args == ([[5, 6], [7, 8, 9, 10], [20]], GREEDY, [100, 101, 102], [4, 2, 4])
    h.generate(prompts(seeds=False), None, version=0)
    assert engine_of(h).calls[-1][1][2] is None  # unseeded rows: no per-request seeds


def test_a_call_s_own_sampling_sets_the_samples_per_prompt() -> None:
    h = host(n=2)
    validation = Sampling(n=3, temperature=1.0, top_p=0.9)
    samples = h.generate(prompts(), validation, version=0)
    assert [(s.uid, s.index) for s in samples[:4]] == [("p0", 0), ("p0", 1), ("p0", 2), ("p1", 0)]
    assert len(samples) == 9 and engine_of(h).calls[-1][1][1] == validation
    with pytest.raises(ValueError, match="greedy samples"):
        Sampling(n=2, temperature=0.0)


def test_samples_convert_to_the_padded_batch() -> None:
    h = host(n=2)
    batch = h.to_batch(h.generate(prompts(), None, version=1), prompt_width=4)
    assert batch["responses"].shape == (6, 4) and batch["prompts"].shape == (6, 4)
    assert list(batch["uid"]) == ["p0", "p0", "p1", "p1", "p2", "p2"]
    assert batch["response_mask"][2].tolist() == [1, 1, 0, 0]
    assert batch["versions"][2].tolist() == [1, 1, -1, -1]


def test_a_short_engine_answer_is_refused() -> None:
    with pytest.raises(ValueError, match="returned 1 samples for 2 prompts x 1"):
        build_samples(prompts()[:2], [[5, 6], [7]], [GeneratedSample([1], [-1.0], "")], 1, 0)


def test_scores_land_on_the_response_positions() -> None:
    h = host()
    batch = Batch.from_dict(
        {
            "input_ids": torch.tensor([[PAD, 5, 6, 7, PAD], [8, 9, 10, 11, 12]]),
            "attention_mask": torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]]),
            "response_mask": torch.tensor([[1, 0], [1, 1]]),
        }
    )
    out = h.score(batch)
    assert engine_of(h).calls == [("score", [[5, 6, 7], [8, 9, 10, 11, 12]])]
    assert out["engine_log_probs"].tolist() == [[-7.0, 0.0], [-11.0, -12.0]]


def test_stream_takes_its_share_and_returns_groups_as_they_finish() -> None:
    h = host(n=2, response_length=3, dp=(1, 2))  # the second of two engines: rows 1, 3, ...
    rows = prompts()
    first = h.stream(rows, max_steps=1, version=0)
    assert first.groups == [] and first.pending_groups == 1 and first.tokens == 2
    done = h.stream(None, max_steps=None, version=1)
    assert done.pending_groups == 0 and done.tokens == 2  # row 1's budget is 2
    ((a, b),) = done.groups
    assert (a.uid, a.index, b.index) == ("p1", 0, 1)
    assert a.response_ids == [11, 12] and a.versions == [0, 1]
    assert a.text == "11,12" and a.metadata["data_source"] == "b"


def test_streaming_requests_leave_the_engine_before_a_generate_or_score() -> None:
    h = host(n=1, response_length=4)
    h.stream(prompts()[:1], max_steps=1, version=0)
    engine = engine_of(h)
    live = list(engine.live)
    assert len(live) == 1
    h.generate(prompts()[1:], GREEDY, version=0)
    assert ("abort", live) in engine.calls and not engine.live
    # The interrupted sample continues from its token at the next stream.
    done = h.stream(None, max_steps=None, version=1)
    ((sample,),) = done.groups
    assert sample.response_ids == [7, 8, 9, 10] and sample.versions == [0, 1, 1, 1]
    h.interrupt()  # nothing in flight: the engine is not asked to abort anything
    assert engine.calls[-1][0] != "abort"


def test_a_tp_group_needs_its_process_group() -> None:
    with pytest.raises(ValueError, match="TP group of 2 ranks needs its process group"):
        RolloutGroup(dp_rank=0, dp_size=1, tp_rank=0, tp_size=2)
    alone = RolloutGroup(dp_rank=0, dp_size=1, tp_rank=0, tp_size=1)
    assert alone.gather([1, 2]) == ([1, 2], slice(0, 2)) and alone.speaks_for_group
