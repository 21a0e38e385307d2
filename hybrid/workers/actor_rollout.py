"""ActorRolloutWorker: the FSDP2 actor and the in-process rollout engine of one WorkerDict.

The training half is `ActorWorker`; this class adds a RolloutHost (generation and scoring,
the same one the explorer holds: hybrid.rollout.host) and the ModeSwitch that feeds its engine
the actor's weights (the memory hand-over between the two, with the weight sync), and runs
every training-side phase through the mode switch so that training in rollout mode is an
error. The driver reaches it through the `actor_rollout` view.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from transformers import AutoTokenizer

from hybrid.controller import Dispatch, register
from hybrid.data import Batch
from hybrid.data.sample import ROUTED_EXPERTS, ROUTED_EXPERTS_KNOWN
from hybrid.dtypes import dtype_bytes
from hybrid.memory.components import ByDevice, full_parameter_count
from hybrid.rollout.base import Sampling
from hybrid.rollout.engines import make_engine
from hybrid.rollout.group import RolloutGroup
from hybrid.rollout.host import RolloutHost
from hybrid.sharding.config import WeightPathConfig
from hybrid.sharding.mode import Mode, ModeSwitch
from hybrid.workers.actor import ActorWorker, WorkerFacts

__all__ = ["ActorRolloutWorker", "WorkerFacts"]


class ActorRolloutWorker(ActorWorker):
    def _init_rollout(self) -> None:
        c = self.config
        lora = c.model.lora
        adapter_sync = lora.enabled and c.sync.lora_mode == "adapter"
        self.engine = make_engine(
            c.model.path,
            c.rollout,
            self.parallel.device,
            self.dtypes.rollout,
            lora_rank=lora.rank if adapter_sync else 0,
            site=self.parallel.engine_site(),
        )
        # The engine's weights in its dtype, split over the tensor-parallel group. A packed layout
        # holds them in buffers that are not tensors, so count from the shapes.
        self._rollout_weight_bytes = (
            full_parameter_count(self.model)
            * dtype_bytes(self.dtypes.rollout)
            // c.rollout.tensor_parallel_size
        )
        self.ledger.track("rollout", self._rollout_components)
        self.ledger.record("init/rollout")
        self.rollout = RolloutHost(
            self.engine,
            AutoTokenizer.from_pretrained(c.model.path),
            RolloutGroup.of_mesh(self.parallel.rollout_mesh),
            c.rollout,
        )
        self.modes = ModeSwitch(
            self.model,
            self.engine,
            self.offloader,
            c.sync,
            self.ledger,
            c.rollout.seed + self.rank,
            self.lora_sync,
        )
        self.modes.trainer_mode()  # start with the KV cache released

    def _phase(
        self, name: str, with_optimizer: bool = False, caller: str | None = None
    ) -> AbstractContextManager[None]:
        return self.modes.trainer_phase(name, with_optimizer, caller)

    def _rollout_components(self) -> dict[str, ByDevice]:
        device, host = self.parallel.device.type, "cpu"
        resident = self.engine.resident
        if "weights" in resident:
            weights = ByDevice({device: self._rollout_weight_bytes})
        elif self.engine.weights_kept_on_host:
            weights = ByDevice({host: self._rollout_weight_bytes})
        else:
            weights = ByDevice({})
        components = {"rollout_weights": weights}
        if "kv_cache" in resident:
            components["kv_cache"] = ByDevice({device: self.engine.kv_cache_bytes})
        return components

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self) -> WorkerFacts:
        facts = super().describe()
        weights = self.modes.weight_facts
        facts["sync_strategy"] = weights.strategy
        facts["weight_layout"] = weights.layout
        facts["weight_notes"] = weights.notes()
        return facts

    # --- rollout -------------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def enter_rollout_mode(self) -> None:
        """Sync and stay in rollout mode across several generate calls (exit_rollout_mode ends it)."""
        # Check before replacing the open window: dropping it would run its cleanup.
        self.modes.require(Mode.TRAINER, "entering rollout mode")
        self._window = self.modes.rollout_mode()
        self._window.__enter__()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def exit_rollout_mode(self) -> None:
        self.modes.require(Mode.ROLLOUT, "exit_rollout_mode")
        self._window.__exit__(None, None, None)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def current_mode(self) -> str:
        return self.modes.mode.value

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def generate_sequences(
        self, batch: Batch, sampling: Sampling | None = None, auto_mode: bool = True
    ) -> Batch:
        """Sample rollout.n responses (`sampling.n`, drawn its way, when given: validation)
        per row of left-padded `input_ids` / `attention_mask`, as n adjacent rows that keep
        the prompt row's other columns.

        In trainer mode with auto_mode=True the call enters rollout mode for itself (sync,
        generate, release); with auto_mode=False it requires rollout mode. Rows may carry a
        `seed` column for per-row reproducible sampling.
        """
        if self.modes.mode is Mode.ROLLOUT or not auto_mode:
            return self._generate(batch, sampling)
        with self.modes.rollout_mode():
            return self._generate(batch, sampling)

    def _generate(self, batch: Batch, sampling: Sampling | None) -> Batch:
        self.modes.require(Mode.ROLLOUT, "generate_sequences")
        # Colocated generation runs on the weights of the last sync: one version, lag 0.
        with self.ledger.timed("gen"):
            samples = self.rollout.generate(batch, sampling, version=self.modes.num_syncs - 1)
        # Generation allocates nothing a component source counts (the KV cache is awake).
        self.ledger.record("rollout/generate", reuse_components=True)
        generated = self.rollout.to_batch(samples, batch.tensors["input_ids"].shape[1])
        n = self.config.rollout.n if sampling is None else sampling.n
        optional = (*_AGENT_COLUMNS, *_ROUTING_COLUMNS)
        columns = [*_GENERATED_COLUMNS, *(c for c in optional if c in generated)]
        return beside_prompts(batch, generated.select(columns), n)

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def compute_engine_log_prob(self, batch: Batch) -> Batch:
        """The engine's log-probs of the given responses (the sync check's other side).

        Scores `input_ids` without padding through the engine; enters rollout mode for the
        call unless already in it.
        """
        if self.modes.mode is Mode.ROLLOUT:
            return self._engine_log_prob(batch)
        with self.modes.rollout_mode():
            return self._engine_log_prob(batch)

    def _engine_log_prob(self, batch: Batch) -> Batch:
        return self.rollout.score(batch)

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def judge_generate(self, prompts: Batch, max_tokens: int) -> Batch:
        """The generative judge's answers (reward.judge): one greedy answer of at most
        `max_tokens` per row of left-padded `input_ids` / `attention_mask`, as the non-tensor
        column `judge_answer` (text).

        The train step calls it in trainer mode, after generation left rollout mode and before
        the update: the call enters rollout mode for itself, which syncs the actor's weights
        again. Those are the weights the batch was sampled with (nothing updated them since),
        so the judge is the policy that answered; the sync's cost is the price of needing no
        extra state in the mode switch, and the driver's version bookkeeping is unaffected
        (colocated versions come from the step, not from the worker's sync count).
        """
        if self.modes.mode is Mode.ROLLOUT:
            return self.rollout.answer(prompts, max_tokens)
        with self.modes.rollout_mode():
            return self.rollout.answer(prompts, max_tokens)

    # --- state ---------------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def configure_sync(self, sync: WeightPathConfig) -> None:
        """Use another gather granularity / strategy from the next sync on (benchmarks)."""
        self.modes.configure(sync)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def verify_rollout_weights(self) -> int:
        """Re-check the engine's readable tensors against the last sync's checksums."""
        return self.engine.verify_weights()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shutdown_engine(self) -> None:
        """Free the engine before the process group ends (vLLM raises otherwise)."""
        self.engine.shutdown()
        super().shutdown_engine()


# What generation adds to the prompt rows (the rows keep their own uid and metadata).
_GENERATED_COLUMNS = (
    "prompts",
    "responses",
    "response_mask",
    "rollout_log_probs",
    "input_ids",
    "attention_mask",
    "position_ids",
    "response_text",
)
_AGENT_COLUMNS = ("env_rewards", "agent_stats")
"""What an agent run's trajectories add (hybrid.data.sample)."""
_ROUTING_COLUMNS = (ROUTED_EXPERTS, ROUTED_EXPERTS_KNOWN)
"""What an engine asked for the experts it chose adds (rollout.return_routed_experts)."""


def beside_prompts(prompts: Batch, generated: Batch, n: int) -> Batch:
    """The colocated rollout batch: each prompt row repeated n times (adjacent) with its own
    columns (uid, seed, data_source, ...) beside the generated ones; the padded prompt
    tensors give way to the generated `input_ids` / `attention_mask`."""
    rows = prompts.repeat(n, interleave=True)
    kept = [
        k for k in (*rows.tensors, *rows.non_tensors) if k not in ("input_ids", "attention_mask")
    ]
    rest = rows.select(kept)
    return rest.union(generated) if rest.keys() else generated
