"""TeacherWorker: the frozen teacher of on-policy distillation, its own member of the
WorkerDict (`teacher`), built and offloaded like the reference.

The teacher is any Hugging Face causal LM that reads the student's token ids: it scores the
student's rows as they are (prompt and response in the student's tokens and chat template) and
returns the log-prob of each sampled response token (hybrid/algorithms/distill.py turns them
into advantages). `check_teacher_model` runs on the driver before any worker starts and names
`distill.teacher_path` for a model that is no causal LM or whose vocabulary gives a token of
the student's another id (the directory itself is checked by `TrainerRunConfig.check_paths`).
"""

from __future__ import annotations

from collections.abc import Mapping

from hybrid.controller import Dispatch, Worker, register
from hybrid.data import Batch
from hybrid.dtypes import resolve_dtype
from hybrid.memory.components import ByDevice, parameter_bytes
from hybrid.memory.ledger import process_ledger
from hybrid.models import load_tokenizer
from hybrid.workers.config import HybridWorkerConfig
from hybrid.workers.forward import pass_config, score_responses
from hybrid.workers.frozen import build_frozen_model

CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")
"""Architecture names (config.json) of checkpoints saved with their LM head."""


def vocab_mismatch(student: Mapping[str, int], teacher: Mapping[str, int]) -> str | None:
    """The first token of the student's (by id) that the teacher lacks or numbers otherwise,
    described; None when every student token has its id in the teacher. Tokens only the
    teacher has are fine: the student never samples them."""
    for token, token_id in sorted(student.items(), key=lambda item: item[1]):
        teacher_id = teacher.get(token)
        if teacher_id != token_id:
            there = "absent" if teacher_id is None else f"id {teacher_id}"
            return f"token {token!r} is id {token_id} for the student, {there} for the teacher"
    return None


def check_teacher_model(teacher_path: str, student_path: str) -> None:
    """Fail before any worker starts, naming distill.teacher_path, unless the teacher is a
    causal LM whose tokenizer maps every token of the student's tokenizer to the same id and
    whose embedding covers those ids."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    where = f"distill.teacher_path={teacher_path!r}"
    try:
        config = AutoConfig.from_pretrained(teacher_path, local_files_only=True)
    except (OSError, ValueError) as error:
        raise ValueError(f"{where}: config.json does not load: {error}") from None
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ValueError(
            f"{where}: a {config.model_type!r} model has no causal-LM class in transformers; "
            "the teacher scores tokens with its LM head (e.g. Qwen2, Llama, Mistral)"
        )
    architectures = list(getattr(config, "architectures", None) or [])
    if architectures and not any(name.endswith(CAUSAL_LM_SUFFIXES) for name in architectures):
        # e.g. a reward model: the causal-LM class would load it with a fresh, random LM head.
        raise ValueError(
            f"{where} is a {architectures}, not a causal LM (*ForCausalLM): the teacher "
            "scores tokens with its LM head"
        )
    try:
        teacher = load_tokenizer(teacher_path).get_vocab()
    except (OSError, ValueError) as error:
        raise ValueError(f"{where}: its tokenizer does not load: {error}") from None
    student = load_tokenizer(student_path).get_vocab()
    mismatch = vocab_mismatch(student, teacher)
    if mismatch is not None:
        raise ValueError(
            f"{where}: its vocabulary ({len(teacher)} tokens) does not give the student's "
            f"tokens (model.path={student_path!r}, {len(student)} tokens) their ids: "
            f"{mismatch}. The teacher scores the student's token ids as they are, so it must "
            "share the student's tokenizer"
        )
    largest = max(student.values(), default=-1)
    if largest >= config.vocab_size:
        raise ValueError(
            f"{where}: its embedding has {config.vocab_size} token ids, the student's "
            f"tokenizer (model.path={student_path!r}) uses ids up to {largest}"
        )


class TeacherWorker(Worker):
    def __init__(self, config: HybridWorkerConfig) -> None:
        self.config = config
        # The process's ledger: shared with actor_rollout, which drains it.
        self.ledger = process_ledger(self.rank, self.rank_env.node)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        c, distill = self.config, self.config.distill
        if distill.teacher_path is None:
            raise ValueError("distill.teacher_path is null: the teacher member is off")
        frozen = build_frozen_model(
            c,
            self.rank_env,
            distill.teacher_path,
            lambda hardware: resolve_dtype(distill.precision.param_dtype, "trainer", hardware),
            distill.offload.param_offload,
            kernels=("distill", distill),
        )
        self.model, self.device, self.offloader = frozen.model, frozen.device, frozen.offloader
        self.pass_config = pass_config(
            c.model,
            distill.micro_batch_size,
            distill.use_dynamic_bsz,
            distill.log_prob_max_token_len_per_gpu,
            "distill.log_prob_max_token_len_per_gpu",
            sp=frozen.sp,
            fused_head=frozen.kernels is not None and frozen.kernels.fused_head,
        )
        self.ledger.track("teacher", self._components)
        self.offloader.offload_params()
        self.ledger.record("init/teacher")

    def _components(self) -> dict[str, ByDevice]:
        return {"teacher_params": parameter_bytes(self.model)}

    @register(dispatch_mode=Dispatch.TRAIN_DP)
    def compute_teacher_log_prob(self, batch: Batch) -> Batch:
        """The teacher's log-prob of each response token (teacher_log_prob (b, R), float32,
        0 off the response)."""
        with self.offloader.phase("teacher", self.ledger):
            scored = score_responses(
                self.model, batch.to(self.device), self.pass_config, with_entropy=False
            )
            # A no-grad forward leaves nothing that a component source counts.
            self.ledger.record("teacher/forward", reuse_components=True)
        return Batch.from_dict({"teacher_log_prob": scored["log_probs"].cpu()})
