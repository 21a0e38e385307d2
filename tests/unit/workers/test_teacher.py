"""The teacher's start-up check (`hybrid.workers.teacher.check_teacher_model`) on tiny models
built here: a teacher of the student's vocabulary passes whatever its weights, one whose
tokenizer numbers a token otherwise is refused naming distill.teacher_path, both paths, the
sizes and the first differing token, and so are checkpoints that are no causal LM."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import CLIPVisionConfig, Qwen2ForSequenceClassification

from hybrid.models import TinyModelConfig, build_tiny_model, build_tokenizer, hf_config
from hybrid.models.tokenizer import VocabName, save_tokenizer
from hybrid.workers.teacher import check_teacher_model, vocab_mismatch

pytestmark = pytest.mark.unit


def tiny(path: Path, vocab: VocabName, seed: int = 0) -> str:
    config = TinyModelConfig.preset("tiny", vocab=vocab, dtype="float32")
    return str(build_tiny_model(path, config, seed=seed))


@pytest.fixture(scope="module")
def student(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny(tmp_path_factory.mktemp("student"), "arithmetic")


def test_vocab_mismatch_names_the_first_token_by_student_id() -> None:
    student = {"a": 0, "b": 1, "c": 2}
    assert vocab_mismatch(student, dict(student)) is None
    assert vocab_mismatch(student, {**student, "extra": 3}) is None  # never sampled
    assert vocab_mismatch(student, {"a": 0, "b": 2, "c": 1}) == (
        "token 'b' is id 1 for the student, id 2 for the teacher"
    )
    assert vocab_mismatch(student, {"a": 0, "c": 2}) == (
        "token 'b' is id 1 for the student, absent for the teacher"
    )


def test_a_teacher_of_the_same_vocabulary_passes(student: str, tmp_path: Path) -> None:
    check_teacher_model(tiny(tmp_path, "arithmetic", seed=1), student)  # no error
    check_teacher_model(student, student)  # the student as its own teacher


def test_a_teacher_of_another_vocabulary_of_the_same_size_is_refused(
    student: str, tmp_path: Path
) -> None:
    teacher = tiny(tmp_path, "agent")  # 16 tokens too, but "?" and "@" where "+" and "=" are
    with pytest.raises(ValueError) as error:
        check_teacher_model(teacher, student)
    message = str(error.value)
    assert message.startswith(f"distill.teacher_path={teacher!r}: its vocabulary (16 tokens)")
    assert f"model.path={student!r}, 16 tokens" in message
    assert "token '+' is id 14 for the student, absent for the teacher" in message


def test_a_teacher_of_a_larger_vocabulary_is_refused(student: str, tmp_path: Path) -> None:
    teacher = tiny(tmp_path, "text")  # bytes: the digits sit at other ids
    with pytest.raises(ValueError, match=r"distill\.teacher_path=.*\(272 tokens\).*16 tokens"):
        check_teacher_model(teacher, student)


def test_a_sequence_classifier_is_refused(student: str, tmp_path: Path) -> None:
    config = hf_config(TinyModelConfig.preset("tiny", vocab="arithmetic", dtype="float32"))
    config.architectures = ["Qwen2ForSequenceClassification"]
    config.num_labels = 1
    torch.manual_seed(0)
    Qwen2ForSequenceClassification(config).save_pretrained(tmp_path)
    save_tokenizer(build_tokenizer("arithmetic"), tmp_path)
    with pytest.raises(
        ValueError, match=r"distill\.teacher_path=.* is a \['Qwen2ForSequenceClassification'\]"
    ):
        check_teacher_model(str(tmp_path), student)


def test_a_model_without_a_causal_lm_class_is_refused(student: str, tmp_path: Path) -> None:
    CLIPVisionConfig().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"'clip_vision_model' model has no causal-LM class"):
        check_teacher_model(str(tmp_path), student)


def test_a_directory_without_a_config_is_refused(student: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"distill\.teacher_path=.*: config\.json does not load"):
        check_teacher_model(str(tmp_path), student)
