"""A vision-language model at start-up: its image processor must be there, and what it does not
run with yet (the toy engine, sequence parallelism, a critic, agent turns) is named, all at
once, before any worker starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.models import TinyModelConfig, build_tiny_model
from tests.unit.trainer.test_config_reachable import compose_config, to_typed

pytestmark = pytest.mark.unit

NO_DATA = ("data.train_files=[]", "data.val_files=[]")


@pytest.fixture(scope="module")
def vl_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vl")
    return build_tiny_model(root / "model", TinyModelConfig.preset("tiny-vl", vocab="arithmetic"))


def test_a_vlm_with_its_processor_passes(vl_model: Path) -> None:
    to_typed(compose_config(overrides=(*NO_DATA, f"model.path={vl_model}"))).check_paths()


def test_a_vlm_without_an_image_processor_is_named(vl_model: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for item in vl_model.iterdir():
        if item.name != "preprocessor_config.json":
            (bare / item.name).symlink_to(item)
    config = to_typed(compose_config(overrides=(*NO_DATA, f"model.path={bare}")))
    with pytest.raises(ValueError, match=r"vision-language model without an image processor"):
        config.check_paths()


def test_what_a_vlm_does_not_run_with_is_named_at_once(vl_model: Path) -> None:
    asked = ("rollout.engine=toy", "algorithm.adv_estimator=gae")
    config = to_typed(compose_config(overrides=(*NO_DATA, f"model.path={vl_model}", *asked)))
    with pytest.raises(ValueError, match=r"rollout\.engine=toy .*; algorithm\.adv_estimator=gae"):
        config.check_paths()
