"""The trajectories one rollout rank has in flight: multi-turn, token-in/token-out.

A prompt row becomes `group_size` trajectories. Each is, at any moment, in one of three
places: waiting to be submitted (new, interrupted by a weight sync, or just given a reply), in
the engine (one request: prompt + everything so far), or waiting for its environment's reply
(a thread of its own, so the engine keeps stepping the others). A turn that ends with the end
of turn token goes to the environment; the reply's messages are rendered to tokens by the chat
template (only the reply: hybrid.rollout.agent.chat) and appended as context. The history is
never re-rendered, so what the trainer sees is exactly what the engine saw.

Budgets, every cut marked on the trajectory (status TRUNCATED, `agent_stats` says why):
  turns    rollout.agent.max_turns model turns, and the environment was not done;
  tokens   the response budget (rollout.response_length, or the row's max_response_tokens) holds
           model and context tokens alike; a reply that does not fit is not appended;
  context  prompt + trajectory within rollout.max_model_len (the engine's window).
A turn the engine cut at its max_tokens ends the trajectory the same way (tokens or context).

Per token: the model's tokens carry their log-prob and the weight version that sampled them
(an interrupted turn continues under newer weights, so versions may change mid-turn); context
tokens carry log-prob 0.0, NO_VERSION and loss mask 0. An environment's per-turn reward lands
on the turn's last model token.

TP groups: every TP rank of an engine must feed it the same requests. Only the group's first
rank runs environments (`runs_environments`); `ready()` hands its finished replies to the host,
which shares them across the group before every rank `apply`s them in the same order.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hybrid.data.sample import NO_VERSION, Sample, SampleStatus
from hybrid.rollout.agent.environment import Environment, Environments, EnvReply
from hybrid.rollout.agent.stats import TrajectoryStats
from hybrid.rollout.base import Continuation, GeneratedSample, Sampling

SampleKey = tuple[str, int]


class Where(Enum):
    TO_SUBMIT = "to_submit"
    IN_ENGINE = "in_engine"
    AWAITING_REPLY = "awaiting_reply"


@dataclass
class Trajectory:
    sample: Sample
    env: Environment | None
    budget: int
    """Response tokens (model and context) this trajectory may hold."""
    seed: int | None
    where: Where = Where.TO_SUBMIT
    turn_start: int = 0
    """Where the current model turn began in the response."""
    turns: int = 0
    turn_stopped: bool = True
    """The last turn ended with the end-of-turn token (not at rollout.agent.max_turn_tokens)."""
    stats: TrajectoryStats = field(default_factory=TrajectoryStats)
    waiting_since: float = 0.0
    wait_id: int = 0
    """Which reply the trajectory waits for (a late reply of an abandoned wait is dropped)."""


Ready = tuple[SampleKey, int, EnvReply | str, float]
"""(trajectory, wait id, the reply or the error text, seconds): a finished environment reply."""


class AgentFlight:
    """Trajectories in flight and the finished trajectories of groups not yet complete."""

    def __init__(
        self,
        group_size: int,
        response_length: int,
        max_model_len: int,
        environments: Environments,
        reply_tokens: Callable[[list[dict[str, Any]], bool], list[int]],
        decode: Callable[[list[int]], str],
        runs_environments: bool = True,
        sampling: Sampling | None = None,
    ) -> None:
        self.group_size = group_size
        self.response_length = response_length
        self.max_model_len = max_model_len
        self.environments = environments
        self.config = environments.config
        self.reply_tokens = reply_tokens
        self.decode = decode
        self.runs_environments = runs_environments
        self.sampling = sampling
        """How every turn samples (None: the rollout's settings)."""
        self._trajectories: dict[SampleKey, Trajectory] = {}
        self._live: dict[str, SampleKey] = {}
        """Engine request id -> the trajectory it generates."""
        self._submitted = 0
        self._waits = 0
        self._replies: queue.SimpleQueue[Ready] = queue.SimpleQueue()
        self._finished: dict[str, list[Sample]] = {}
        """Finished trajectories of groups not yet complete."""
        self._completed: list[list[Sample]] = []
        """Complete groups not yet taken (`take_completed`)."""

    # --- what the host asks ---------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Some trajectory is still going (in the engine, to submit, or awaiting a reply)."""
        return bool(self._trajectories)

    @property
    def groups(self) -> int:
        """Groups with at least one trajectory still going."""
        return len({uid for uid, _ in self._trajectories})

    @property
    def awaiting(self) -> int:
        """Trajectories waiting for their environment."""
        return sum(t.where is Where.AWAITING_REPLY for t in self._trajectories.values())

    def add(
        self,
        uid: str,
        prompt_ids: list[int],
        metadata: dict[str, Any],
        budget: int,
        seed: int | None = None,
        name: str | None = None,
    ) -> None:
        """One prompt row: group_size trajectories of at most `budget` response tokens.
        `name`: how errors name the row (default: its uid)."""
        if not 1 <= budget <= self.response_length:
            raise ValueError(
                f"prompt uid {uid!r}: budget {budget} outside 1 .. {self.response_length}"
            )
        if (uid, 0) in self._trajectories or uid in self._finished:
            raise ValueError(f"prompt uid {uid!r} is already in flight")
        extra_info = metadata.get("extra_info")
        name = uid if name is None else name
        self.environments.check_row(extra_info, name)
        for index in range(self.group_size):
            sample = Sample(
                uid=uid,
                index=index,
                prompt_ids=prompt_ids,
                metadata=dict(metadata),
                loss_mask=[],
                token_rewards=[],
            )
            env = self.environments.make(extra_info, name) if self.runs_environments else None
            row_seed = None if seed is None else (int(seed) * 7919 + index * 104729) % 2**31
            self._trajectories[uid, index] = Trajectory(sample, env, budget, row_seed)

    def to_submit(self) -> list[tuple[str, Continuation]]:
        """(request id, request) for every trajectory whose next turn (or the rest of an
        interrupted one) should run now."""
        out = []
        for key, traj in list(self._trajectories.items()):
            if traj.where is not Where.TO_SUBMIT:
                continue
            sample = traj.sample
            context = len(sample.prompt_ids) + sample.response_length
            room = min(traj.budget - sample.response_length, self.max_model_len - context)
            if room < 1:  # a reply filled it exactly
                self._end(key, SampleStatus.TRUNCATED, "tokens")
                continue
            turn_left = self.config.max_turn_tokens
            if turn_left is not None:  # an interrupted turn continues with what it has left
                room = min(room, turn_left - (sample.response_length - traj.turn_start))
            self._submitted += 1
            request_id = f"{key[0]}#{key[1]}.{self._submitted}"
            self._live[request_id] = key
            traj.where = Where.IN_ENGINE
            seed = None if traj.seed is None else (traj.seed + traj.turns) % 2**31
            tokens = sample.prompt_ids + sample.response_ids
            out.append((request_id, Continuation(tokens, room, seed, self.sampling)))
        return out

    def interrupt(self) -> list[str]:
        """The engine requests to abort before the weights change; their trajectories keep
        their tokens and continue at the next `to_submit` (environment replies in progress
        go on: a sync never waits for a tool)."""
        request_ids = list(self._live)
        for key in self._live.values():
            self._trajectories[key].where = Where.TO_SUBMIT
        self._live.clear()
        return request_ids

    def record(self, request_id: str, new: GeneratedSample, finished: bool, version: int) -> None:
        """Append what request `request_id` generated since its last output, under
        `version`; a finished turn goes to its environment (or ends the trajectory)."""
        key = self._live[request_id]
        traj = self._trajectories[key]
        sample = traj.sample
        n = len(new.token_ids)
        sample.response_ids.extend(new.token_ids)
        sample.rollout_log_probs.extend(new.log_probs)
        sample.versions.extend([version] * n)
        assert sample.loss_mask is not None and sample.token_rewards is not None
        sample.loss_mask.extend([1] * n)
        sample.token_rewards.extend([0.0] * n)
        if not finished:
            return
        del self._live[request_id]
        # Each turn's request runs the whole trajectory so far: the newest routing covers it.
        if new.routed_experts is not None:
            sample.routed_experts = new.routed_experts
        traj.turns += 1
        context = len(sample.prompt_ids) + sample.response_length
        full = context >= self.max_model_len or sample.response_length >= traj.budget
        if not new.stopped and full:  # cut by the trajectory's budget or the window
            why = "context" if context >= self.max_model_len else "tokens"
            self._end(key, SampleStatus.TRUNCATED, why)
            return
        traj.turn_stopped = new.stopped  # else cut at max_turn_tokens: still a turn
        traj.where = Where.AWAITING_REPLY
        traj.waiting_since = time.monotonic()
        self._waits += 1
        traj.wait_id = self._waits
        if self.runs_environments:
            turn_text = self.decode(sample.response_ids[traj.turn_start :])
            self._start_reply(key, traj, turn_text)

    def ready(self, block_s: float = 0.0) -> list[Ready]:
        """Environment replies finished since the last call (waiting up to `block_s` for the
        first), and a timeout for each wait past rollout.agent.env_timeout_s."""
        out: list[Ready] = []
        if not self.runs_environments:
            return out
        try:
            out.append(
                self._replies.get(timeout=block_s) if block_s > 0 else self._replies.get_nowait()
            )
            while True:
                out.append(self._replies.get_nowait())
        except queue.Empty:
            pass
        now = time.monotonic()
        answered = {(key, wait) for key, wait, _, _ in out}
        for key, traj in self._trajectories.items():
            late = now - traj.waiting_since > self.config.env_timeout_s
            if traj.where is Where.AWAITING_REPLY and late and (key, traj.wait_id) not in answered:
                seconds = now - traj.waiting_since
                message = f"the environment did not reply within {self.config.env_timeout_s:g} s"
                out.append((key, traj.wait_id, f"timeout: {message}", seconds))
        return out

    def apply(self, replies: list[Ready]) -> None:
        """Append each reply's tokens to its trajectory, or end the trajectory."""
        for key, wait_id, reply, seconds in replies:
            traj = self._trajectories.get(key)
            if traj is None or traj.where is not Where.AWAITING_REPLY or traj.wait_id != wait_id:
                continue  # a late reply to a wait that timed out
            self._apply_one(key, traj, reply, seconds)

    def take_completed(self) -> list[list[Sample]]:
        """Groups whose every trajectory ended since the last call, each in index order."""
        done, self._completed = self._completed, []
        return done

    # --- inside ---------------------------------------------------------------------------

    def _start_reply(self, key: SampleKey, traj: Trajectory, turn_text: str) -> None:
        env, wait_id, replies = traj.env, traj.wait_id, self._replies
        assert env is not None

        def run() -> None:
            started = time.monotonic()
            try:
                reply: EnvReply | str = env.reply(turn_text)
            except Exception as error:  # the environment is user code: counted, never fatal
                reply = f"error: {type(error).__name__}: {error}"
            replies.put((key, wait_id, reply, time.monotonic() - started))

        threading.Thread(target=run, name=f"env-{key[0]}#{key[1]}", daemon=True).start()

    def _apply_one(
        self, key: SampleKey, traj: Trajectory, reply: EnvReply | str, seconds: float
    ) -> None:
        sample = traj.sample
        assert sample.loss_mask is not None and sample.token_rewards is not None
        traj.stats.env_seconds.append(seconds)
        if isinstance(reply, str):  # the environment raised or timed out
            traj.stats.env_errors += 1
            traj.stats.count_env_error(reply.split(":", 1)[0])
            self._end(key, SampleStatus.TRUNCATED, "env_error")
            return
        traj.stats.add_reply(reply)
        if reply.reward is not None:
            sample.token_rewards[-1] += float(reply.reward)
        if reply.done:
            self._end(key, SampleStatus.COMPLETED, None)
            return
        if traj.turns >= self.config.max_turns:
            self._end(key, SampleStatus.TRUNCATED, "turns")
            return
        tokens = self.reply_tokens(reply.messages, traj.turn_stopped)
        total = sample.response_length + len(tokens)
        if total >= traj.budget:
            self._end(key, SampleStatus.TRUNCATED, "tokens")
            return
        if len(sample.prompt_ids) + total >= self.max_model_len:
            self._end(key, SampleStatus.TRUNCATED, "context")
            return
        sample.response_ids.extend(tokens)
        sample.rollout_log_probs.extend([0.0] * len(tokens))
        sample.versions.extend([NO_VERSION] * len(tokens))
        sample.loss_mask.extend([0] * len(tokens))
        sample.token_rewards.extend([0.0] * len(tokens))
        traj.turn_start = sample.response_length
        traj.where = Where.TO_SUBMIT

    def _end(self, key: SampleKey, status: SampleStatus, truncated: str | None) -> None:
        traj = self._trajectories.pop(key)
        sample = traj.sample
        sample.status = status
        sample.text = self.decode(sample.response_ids)
        traj.stats.turns = traj.turns
        traj.stats.truncated = truncated
        final_text = self.decode(sample.response_ids[traj.turn_start :])
        sample.agent_stats = traj.stats.summary(sample, final_text)
        group = self._finished.setdefault(sample.uid, [])
        group.append(sample)
        if len(group) == self.group_size:
            del self._finished[sample.uid]
            self._completed.append(sorted(group, key=lambda s: s.index))
