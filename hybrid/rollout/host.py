"""RolloutHost: the rollout side of a worker, the same for the colocated actor and the explorer.

It holds one engine (behind the `RolloutEngine` protocol), the tokenizer, this rank's place
among the engines (`RolloutGroup`) and the rollout settings (`n`, the response budgets), and
turns prompt rows into Samples:
  generate  n Samples per prompt row, all under one weight version;
  score     the engine's log-probs of given responses (the sync check's engine side);
  stream    fully-async partial rollouts: this rank's share of new rows joins the samples in
            flight, the engine steps, finished groups come back (hybrid.rollout.streaming).
With rollout.agent.enabled every row is a multi-turn trajectory instead (hybrid.rollout.agent):
generate runs them to the end; stream keeps them in flight across calls and weight syncs, their
environments' replies running in threads meanwhile. The engine is driven step by step either way.
Where the weights come from is the worker's business (the mode switch colocated, a transport
in the explorer); the host runs the engine on whatever it holds. Streaming requests leave the
engine (`interrupt`) before any other use of it, and before a weight load.

A Sample's `uid` is its prompt row's `uid` column (the GRPO group), or `row-<i>` (the row's
position in the call) for prompt batches without one; every other column of the row except
the tokens becomes the Sample's metadata (data_source, ground_truth, seed, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hybrid.data import Batch
from hybrid.data.images import IMAGES_COLUMN, ImageSet, image_sets
from hybrid.data.sample import Sample, SampleStatus, samples_to_batch
from hybrid.rollout.agent.chat import ReplyRenderer
from hybrid.rollout.agent.environment import Environments
from hybrid.rollout.agent.flight import AgentFlight
from hybrid.rollout.base import (
    GREEDY,
    GeneratedSample,
    RolloutEngine,
    Sampling,
    prompt_budgets,
    response_text,
)
from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.group import RolloutGroup
from hybrid.rollout.multimodal import check_no_placeholders
from hybrid.rollout.scores import response_scores
from hybrid.rollout.streaming import InFlight

_PROMPT_COLUMNS = ("input_ids", "attention_mask", "uid", IMAGES_COLUMN)
"""Prompt columns a Sample holds in its own fields, not in its metadata (images never reach
the rewards through it)."""

IDLE_WAIT_S = 0.02
"""How long an agent loop with nothing in the engine waits for an environment reply before
it looks again (at its deadlines, and in `stream` at its step budget)."""


def unpad_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """The real tokens of each left-padded prompt row."""
    return [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask, strict=True)]


def prompt_uids(prompts: Batch) -> list[str]:
    """Each row's group id: its `uid` column, else `row-<i>`."""
    if "uid" in prompts:
        return [str(uid) for uid in prompts.non_tensors["uid"]]
    return [f"row-{row}" for row in range(len(prompts))]


def row_metadata(prompts: Batch, row: int) -> dict[str, Any]:
    """A prompt row's other columns (data_source, ground_truth, seed, ...): what its Samples
    carry as metadata for the rewards."""
    metadata: dict[str, Any] = {
        k: v[row] for k, v in prompts.non_tensors.items() if k not in _PROMPT_COLUMNS
    }
    metadata.update(
        {k: t[row].tolist() for k, t in prompts.tensors.items() if k not in _PROMPT_COLUMNS}
    )
    return metadata


def row_images(prompts: Batch) -> list[ImageSet | None]:
    """Each prompt row's images (None everywhere for a text-only batch)."""
    return image_sets(prompts.non_tensors.get(IMAGES_COLUMN), len(prompts))


def build_samples(
    prompts: Batch,
    prompt_ids: list[list[int]],
    generated: list[GeneratedSample],
    n: int,
    version: int,
) -> list[Sample]:
    """n Samples per prompt row (prompt-major, as the engine returns them), every token
    marked with `version`, each with its prompt's images."""
    if len(generated) != n * len(prompts):
        raise ValueError(
            f"the engine returned {len(generated)} samples for {len(prompts)} prompts x {n}"
        )
    uids = prompt_uids(prompts)
    metadata = [row_metadata(prompts, row) for row in range(len(prompts))]
    images = row_images(prompts)
    return [
        Sample(
            uid=uids[i // n],
            index=i % n,
            prompt_ids=prompt_ids[i // n],
            response_ids=g.token_ids,
            rollout_log_probs=g.log_probs,
            versions=[version] * len(g.token_ids),
            status=SampleStatus.COMPLETED if g.stopped else SampleStatus.TRUNCATED,
            text=g.text,
            metadata=dict(metadata[i // n]),
            routed_experts=g.routed_experts,
            images=images[i // n],
        )
        for i, g in enumerate(generated)
    ]


@dataclass(frozen=True)
class Streamed:
    """What one `stream` call produced on this rank."""

    groups: list[list[Sample]]
    """Groups whose every sample finished during the call, each in index order."""
    tokens: int
    """Tokens the engine generated during the call."""
    pending_groups: int
    """Groups still generating (in the engine or waiting to be submitted again)."""


class RolloutHost:
    def __init__(
        self, engine: RolloutEngine, tokenizer: Any, group: RolloutGroup, config: RolloutConfig
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.group = group
        self.config = config
        self.environments: Environments | None = None
        self.renderer: ReplyRenderer | None = None
        self.in_flight: InFlight | AgentFlight = InFlight(config.n, config.response_length)
        if config.agent.enabled:
            self.environments = Environments(config.agent)
            self.renderer = ReplyRenderer(tokenizer, self.environments.schemas() or None)
            self.in_flight = self._agent_flight(None)

    def _agent_flight(self, sampling: Sampling | None) -> AgentFlight:
        assert self.environments is not None and self.renderer is not None
        c = self.config
        return AgentFlight(
            c.n if sampling is None else sampling.n,
            c.response_length,
            c.max_model_len,
            self.environments,
            self.renderer.reply_tokens,
            self.decode,
            runs_environments=self.group.speaks_for_group,
            sampling=sampling,
        )

    @property
    def pad_token_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    def decode(self, token_ids: list[int]) -> str:
        return response_text(self.tokenizer, token_ids)

    def generate(self, prompts: Batch, sampling: Sampling | None, version: int) -> list[Sample]:
        """`rollout.n` Samples per row of left-padded `input_ids` / `attention_mask`, sampled
        as the rollout config says (`sampling` None) or `sampling.n` sampled its way, produced
        by weight `version`. An optional `seed` column seeds each row's requests; an
        `extra_info` column may cap a row's budget (hybrid.rollout.base)."""
        self.interrupt()
        if self.environments is not None:
            return self._generate_trajectories(prompts, sampling, version)
        n = self.config.n if sampling is None else sampling.n
        prompt_ids = unpad_prompts(prompts.tensors["input_ids"], prompts.tensors["attention_mask"])
        seeds = prompts.tensors["seed"].tolist() if "seed" in prompts else [None] * len(prompts)
        budgets = prompt_budgets(prompts, self.config.response_length)
        requests = list(zip(prompt_ids, seeds, budgets, row_images(prompts), strict=True))
        shared, mine = self.group.gather(requests)
        shared_seeds = [seed for _, seed, _, _ in shared]
        shared_images = [images for _, _, _, images in shared]
        generated = self.engine.generate(
            [ids for ids, _, _, _ in shared],
            sampling=sampling,
            seeds=None if None in shared_seeds else shared_seeds,
            max_tokens=[budget for _, _, budget, _ in shared],
            **({"images": shared_images} if any(shared_images) else {}),
        )[mine.start * n : mine.stop * n]
        samples = build_samples(prompts, prompt_ids, generated, n, version)
        self._check_placeholders(samples)
        return samples

    def _check_placeholders(self, samples: list[Sample]) -> None:
        """No response holds a token the engine must never sample (a vision placeholder)."""
        banned = self.engine.banned_tokens
        if banned:
            for sample in samples:
                check_no_placeholders(
                    sample.response_ids, banned, f"sample {sample.uid}#{sample.index}"
                )

    def _generate_trajectories(
        self, prompts: Batch, sampling: Sampling | None, version: int
    ) -> list[Sample]:
        """`generate` for agent runs: every row's trajectories run to their end (the TP
        group's rows together, as `generate` shares them), returned prompt-major."""
        prompt_ids = unpad_prompts(prompts.tensors["input_ids"], prompts.tensors["attention_mask"])
        seeds = prompts.tensors["seed"].tolist() if "seed" in prompts else [None] * len(prompts)
        budgets = prompt_budgets(prompts, self.config.response_length)
        uids = prompt_uids(prompts)
        rows = [
            (uids[row], prompt_ids[row], row_metadata(prompts, row), budgets[row], seeds[row])
            for row in range(len(prompts))
        ]
        shared, mine = self.group.gather(rows)
        flight = self._agent_flight(sampling)
        for position, (uid, ids, metadata, budget, seed) in enumerate(shared):
            # The flight's uid is the row's position: rows of different TP ranks may share a uid.
            flight.add(str(position), ids, metadata, budget, seed, name=uid)
        groups = self._drive(flight, max_steps=None, version=version)[0]
        by_position = {int(group[0].uid): group for group in groups}
        out = []
        for position in range(mine.start, mine.stop):
            for sample in by_position[position]:
                sample.uid = shared[position][0]
                out.append(sample)
        return out

    def _drive(
        self, flight: AgentFlight, max_steps: int | None, version: int
    ) -> tuple[list[list[Sample]], int]:
        """Step the engine over the flight's trajectories (`max_steps` times, None: until
        every one ended), submitting each next turn as its reply lands; returns the groups that
        completed and the tokens the engine generated. Replies are applied on every TP rank in
        the order the group's first rank saw them."""
        tokens = steps = 0
        while flight.active and (max_steps is None or steps < max_steps):
            for request_id, request in flight.to_submit():
                self.engine.submit(request_id, request)
            wait = 0.0
            if self.engine.has_unfinished():
                for request_id, new, finished in self.engine.step():
                    tokens += len(new.token_ids)
                    flight.record(request_id, new, finished, version)
            elif flight.awaiting:
                wait = IDLE_WAIT_S
            flight.apply(self.group.share_from_first(flight.ready(wait)))
            steps += 1
        return flight.take_completed(), tokens

    def to_batch(self, samples: list[Sample], prompt_width: int) -> Batch:
        """The padded training batch of `samples` (hybrid.data.sample.samples_to_batch)."""
        return samples_to_batch(
            samples, self.config.response_length, self.pad_token_id, prompt_width
        )

    def answer(self, prompts: Batch, max_tokens: int) -> Batch:
        """One greedy answer (text, at most `max_tokens` tokens) per left-padded prompt row, as
        the column `judge_answer`, on whatever weights the engine holds (the generative judge:
        its budget is its own, not rollout.response_length). Streaming requests leave the
        engine first (fully_async) and continue at the next `stream`."""
        self.interrupt()
        prompt_ids = unpad_prompts(prompts.tensors["input_ids"], prompts.tensors["attention_mask"])
        shared, mine = self.group.gather(prompt_ids)
        budgets = [max_tokens] * len(shared)
        answers = self.engine.generate(shared, sampling=GREEDY, max_tokens=budgets)[mine]
        return Batch.from_dict({}, {"judge_answer": [answer.text for answer in answers]})

    def score(self, batch: Batch) -> Batch:
        """`engine_log_probs` (b, R): the engine's log-prob of each response token of
        `input_ids` (padding removed), under the weights it holds."""
        self.interrupt()
        sequences = unpad_prompts(batch.tensors["input_ids"], batch.tensors["attention_mask"])
        images = row_images(batch)
        if any(images):
            shared_rows, mine = self.group.gather(list(zip(sequences, images, strict=True)))
            shared = [ids for ids, _ in shared_rows]
            scores = self.engine.score(shared, images=[i for _, i in shared_rows])[mine]
        else:
            shared, mine = self.group.gather(sequences)
            # One positional argument: tests swap `score` for a base-model scorer of that shape.
            scores = self.engine.score(shared)[mine]
        mask = batch.tensors["response_mask"]
        real = batch.tensors["attention_mask"][:, -mask.shape[1] :]
        return Batch.from_dict({"engine_log_probs": response_scores(scores, mask, real)})

    def stream(self, prompts: Batch | None, max_steps: int | None, version: int) -> Streamed:
        """Take this rank's share of `prompts` (every dp_size-th row, from dp_rank; None: no
        new rows) into the samples in flight, then step the engine `max_steps` times (None:
        until every sample finished); new tokens are marked with `version`."""
        flight = self.in_flight
        if prompts is not None:
            share = prompts[list(range(self.group.dp_rank, len(prompts), self.group.dp_size))]
            prompt_ids = unpad_prompts(share.tensors["input_ids"], share.tensors["attention_mask"])
            budgets = prompt_budgets(share, self.config.response_length)
            images = row_images(share)
            for row, (uid, ids) in enumerate(zip(prompt_uids(share), prompt_ids, strict=True)):
                if isinstance(flight, AgentFlight):
                    flight.add(uid, ids, row_metadata(share, row), budgets[row])
                else:
                    flight.add(uid, ids, row_metadata(share, row), budgets[row], images=images[row])
        if isinstance(flight, AgentFlight):
            done, generated = self._drive(flight, max_steps, version)
            return Streamed(groups=done, tokens=generated, pending_groups=flight.groups)
        for request_id, request in flight.to_submit():
            self.engine.submit(request_id, request)
        groups: list[list[Sample]] = []
        tokens = steps = 0
        while self.engine.has_unfinished() and (max_steps is None or steps < max_steps):
            for request_id, new, finished in self.engine.step():
                tokens += len(new.token_ids)
                group = flight.record(request_id, new, finished, version, self.decode)
                if group is not None:
                    self._check_placeholders(group)
                    groups.append(group)
            steps += 1
        return Streamed(groups=groups, tokens=tokens, pending_groups=flight.groups)

    def interrupt(self) -> None:
        """Take the streaming requests out of the engine before anything else uses it (a
        weight load, a generate, a scoring pass): they continue from their tokens at the
        next `stream`."""
        request_ids = self.in_flight.interrupt()
        if request_ids:
            self.engine.abort(request_ids)
