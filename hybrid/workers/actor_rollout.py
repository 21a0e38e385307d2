"""ActorRolloutWorker: the FSDP2 actor and the in-process vLLM engine of one WorkerDict.

The training half is `ActorWorker`; this class adds VllmEngine (generation) and ModeSwitch
(the memory hand-over between the two, with the weight sync), and runs every training-side
phase through the mode switch so that training in rollout mode is an error. The driver
reaches it through the `actor_rollout` view.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from transformers import AutoTokenizer

from hybrid.controller import Dispatch, register
from hybrid.data import Batch
from hybrid.data.sample import Sample, SampleStatus, samples_to_batch
from hybrid.dtypes import dtype_bytes
from hybrid.memory.components import ByDevice, full_parameter_count
from hybrid.rollout.base import prompt_budgets
from hybrid.rollout.scores import response_scores
from hybrid.rollout.vllm_engine import VllmEngine
from hybrid.sharding.checksum import verify
from hybrid.sharding.config import SyncConfig
from hybrid.sharding.mode import Mode, ModeSwitch
from hybrid.workers.actor import ActorWorker, WorkerFacts
from hybrid.workers.parallel import gather_across_tp
from hybrid.workers.sequences import unpad_prompts

__all__ = ["ActorRolloutWorker", "WorkerFacts"]


class ActorRolloutWorker(ActorWorker):
    def _init_rollout(self) -> None:
        c = self.config
        lora = c.model.lora
        adapter_sync = lora.enabled and c.sync.lora_mode == "adapter"
        self.engine = VllmEngine(
            c.model.path,
            c.rollout,
            self.parallel.device,
            self.dtypes.rollout,
            lora_rank=lora.rank if adapter_sync else 0,
            site=self.parallel.engine_site(),
        )
        # vLLM's weights in its dtype, split over the tensor-parallel group. A packed layout
        # holds them in buffers that are not tensors, so count from the shapes.
        self._rollout_weight_bytes = (
            full_parameter_count(self.model)
            * dtype_bytes(self.dtypes.rollout)
            // c.rollout.tensor_parallel_size
        )
        self.ledger.track("rollout", self._rollout_components)
        self.ledger.record("init/rollout")
        self.tokenizer = AutoTokenizer.from_pretrained(c.model.path)
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
        elif self.engine.sleep_level == 1:  # a pinned host copy; level 2 discards them
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
        facts["sync_strategy"] = self.modes.strategy
        facts["weight_layout"] = self.engine.weight_layout
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
        self, batch: Batch, greedy: bool = False, auto_mode: bool = True
    ) -> Batch:
        """Sample one response per row of left-padded `input_ids` / `attention_mask`.

        In trainer mode with auto_mode=True the call enters rollout mode for itself (sync,
        generate, release); with auto_mode=False it requires rollout mode. Rows may carry a
        `seed` column for per-row reproducible sampling.
        """
        if self.modes.mode is Mode.ROLLOUT or not auto_mode:
            return self._generate(batch, greedy)
        with self.modes.rollout_mode():
            return self._generate(batch, greedy)

    def _generate(self, batch: Batch, greedy: bool) -> Batch:
        self.modes.require(Mode.ROLLOUT, "generate_sequences")
        n = 1 if greedy else self.config.rollout.n
        prompt_ids = unpad_prompts(batch.tensors["input_ids"], batch.tensors["attention_mask"])
        seeds = batch.tensors["seed"].tolist() if "seed" in batch else [None] * len(batch)
        budgets = prompt_budgets(batch, self.config.rollout.response_length)
        requests = list(zip(prompt_ids, seeds, budgets, strict=True))
        shared, mine = gather_across_tp(self.parallel, requests)
        shared_seeds = [seed for _, seed, _ in shared]
        with self.ledger.timed("gen"):
            generated = self.engine.generate(
                [request for request, _, _ in shared],
                greedy=greedy,
                seeds=None if None in shared_seeds else shared_seeds,
                max_tokens=[budget for _, _, budget in shared],
            )[mine.start * n : mine.stop * n]
        # Generation allocates nothing a component source counts (the KV cache is awake).
        self.ledger.record("rollout/generate", reuse_components=True)
        # Colocated generation runs on the weights of the last sync: one version, lag 0.
        version = self.modes.num_syncs - 1
        samples = [
            Sample(
                uid=f"row-{i // n}",
                index=i % n,
                prompt_ids=prompt_ids[i // n],
                response_ids=g.token_ids,
                rollout_log_probs=g.log_probs,
                versions=[version] * len(g.token_ids),
                status=SampleStatus.COMPLETED,
                text=g.text,
            )
            for i, g in enumerate(generated)
        ]
        width = batch.tensors["input_ids"].shape[1]
        out = samples_to_batch(
            samples, self.config.rollout.response_length, self.tokenizer.pad_token_id, width
        ).select(_GENERATED_COLUMNS)
        rows = batch.repeat(n, interleave=True)  # n adjacent samples per prompt
        rest = rows.select(
            [
                k
                for k in (*rows.tensors, *rows.non_tensors)
                if k not in ("input_ids", "attention_mask")
            ]
        )
        return rest.union(out) if rest.keys() else out

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def compute_engine_log_prob(self, batch: Batch) -> Batch:
        """The engine's log-probs of the given responses (the sync check's other side).

        Scores `input_ids` without padding through vLLM prompt log-probs; enters rollout mode
        for the call unless already in it.
        """
        if self.modes.mode is Mode.ROLLOUT:
            return self._engine_log_prob(batch)
        with self.modes.rollout_mode():
            return self._engine_log_prob(batch)

    def _engine_log_prob(self, batch: Batch) -> Batch:
        sequences = unpad_prompts(batch.tensors["input_ids"], batch.tensors["attention_mask"])
        shared, mine = gather_across_tp(self.parallel, sequences)
        scores = self.engine.score(shared)[mine]
        return Batch.from_dict(
            {"engine_log_probs": response_scores(scores, batch.tensors["response_mask"])}
        )

    # --- state ---------------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def configure_sync(self, sync: SyncConfig) -> None:
        """Use another gather granularity / strategy from the next sync on (benchmarks)."""
        self.modes.configure(sync)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def verify_rollout_weights(self) -> int:
        """Re-check the engine's readable tensors against the last sync's checksums."""
        if not self.modes.last_checksums:
            raise RuntimeError(
                "no checksums recorded: run a sync with sync.verify_checksum=true first"
            )
        return verify(self.engine.model, self.modes.last_checksums)

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
