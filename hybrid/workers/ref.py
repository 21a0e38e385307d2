"""ReferenceWorker: the frozen reference policy, its own member of the WorkerDict (`ref`)."""

from __future__ import annotations

from hybrid.controller import Dispatch, Worker, register
from hybrid.data import Batch
from hybrid.memory.components import ByDevice, parameter_bytes
from hybrid.memory.ledger import process_ledger
from hybrid.workers.config import HybridWorkerConfig
from hybrid.workers.forward import pass_config, score_responses
from hybrid.workers.frozen import build_frozen_model
from hybrid.workers.vision_inputs import vision_family


class ReferenceWorker(Worker):
    def __init__(self, config: HybridWorkerConfig) -> None:
        self.config = config
        # The process's ledger: shared with actor_rollout, which drains it.
        self.ledger = process_ledger(self.rank, self.rank_env.node)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self._build(self.config.model.path)
        self.ledger.track("ref", self._components)
        self.offloader.offload_params()
        self.ledger.record("init/ref")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def reload_model(self, path: str) -> None:
        """Become the model at `path` (a Hugging Face directory): after an SFT stage the
        reference is the fine-tuned model, which the KL terms then stay close to."""
        del self.model, self.offloader
        self._build(path)
        self.offloader.offload_params()
        self.ledger.record("ref/reload")

    def _build(self, path: str) -> None:
        c = self.config
        frozen = build_frozen_model(
            c,
            self.rank_env,
            path,
            lambda hardware: c.compute_dtypes(hardware).ref,
            c.ref.offload.param_offload,
            kernels=("ref", c.ref),
        )
        self.model, self.device, self.offloader = frozen.model, frozen.device, frozen.offloader
        self.pass_config = pass_config(
            c.model,
            c.ref.micro_batch_size,
            c.ref.use_dynamic_bsz,
            c.ref.log_prob_max_token_len_per_gpu,
            "ref.log_prob_max_token_len_per_gpu",
            sp=frozen.sp,
            vision=vision_family(self.model, path),
            fused_head=frozen.kernels is not None and frozen.kernels.fused_head,
        )

    def _components(self) -> dict[str, ByDevice]:
        return {"ref_params": parameter_bytes(self.model)}

    @register(dispatch_mode=Dispatch.TRAIN_DP)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        with self.ledger.timed("ref"):
            moved = self.offloader.onload_params()
            self.ledger.record("ref/onload", reuse_components=not moved)
            try:
                scored = score_responses(
                    self.model, batch.to(self.device), self.pass_config, with_entropy=False
                )
                # A no-grad forward leaves nothing that a component source counts.
                self.ledger.record("ref/forward", reuse_components=True)
            finally:
                moved = self.offloader.offload_params()
                self.ledger.record("ref/offload", reuse_components=not moved)
        return Batch.from_dict({"ref_log_prob": scored["log_probs"].cpu()})
