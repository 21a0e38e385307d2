"""Explorer workers with a tensor-parallel engine: each TP rank receives its own rows (the
group's calls split prompts over every worker), the engine generates the group's rows together,
and every rank hands its own rows on. Before this was checked, only the first rank of a group
put its samples into the buffer (`explore`) or returned them (`explore_samples`): with
rollout.tensor_parallel_size=2 half of a split run's prompts were generated and dropped.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray

from hybrid.buffer.experience import ExperienceBufferActor
from hybrid.data import PromptLoader
from hybrid.data.arithmetic_task import write_arithmetic_task
from hybrid.evaluation.config import EvalConfig
from hybrid.evaluation.runner import prepare
from hybrid.evaluation.workers import EvalWorkers
from hybrid.models import TinyModelConfig, build_tiny_model

# test-full: 20 s that the default tier's budget has no room for; the split runs of the
# default tier use one-rank engines.
pytestmark = [pytest.mark.integration, pytest.mark.full, pytest.mark.timeout(300)]

PROMPTS, N = 6, 2


@pytest.fixture(scope="module")
def setup(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    root = tmp_path_factory.mktemp("tp_explorers")
    build_tiny_model(root / "model", TinyModelConfig.preset("tiny", vocab="arithmetic"), seed=0)
    write_arithmetic_task(root / "data", num_train=1, num_test=PROMPTS, seed=0)
    config = EvalConfig(
        model=str(root / "model"),
        data=(str(root / "data" / "test.parquet"),),
        workers=2,
        tensor_parallel_size=2,
        n=N,
        temperature=1.0,
        max_prompt_length=16,
        response_length=4,
        output_dir=str(root / "out"),
    )
    inputs = prepare(config)
    workers = EvalWorkers(config, inputs.model.path, log_dir=root / "logs")
    loader = PromptLoader(inputs.dataset, PROMPTS, shuffle=False, drop_last=False)
    prompts = next(iter(loader.validation_batches(PROMPTS)))
    yield workers, prompts
    workers.close()


def expected(prompts) -> list[tuple[str, int]]:
    return sorted((str(uid), i) for uid in prompts.non_tensors["uid"] for i in range(N))


def test_every_rank_returns_its_own_rows(setup: tuple) -> None:
    workers, prompts = setup
    per_rank = workers.group.explore_samples(prompts)
    samples = [s for rank in per_rank for s in rank]
    assert sorted((s.uid, s.index) for s in samples) == expected(prompts)


def test_every_rank_puts_its_own_rows_into_the_buffer(setup: tuple) -> None:
    workers, prompts = setup
    buffer = ExperienceBufferActor.remote(group_size=N, capacity_groups=2 * PROMPTS)
    try:
        workers.group.explore(prompts, buffer, 60.0)
        taken = ray.get(buffer.take.remote(PROMPTS, timeout_s=30), timeout=120)
        assert taken is not None, "fewer groups than prompts reached the buffer"
        assert sorted((s.uid, s.index) for s in taken) == expected(prompts)
    finally:
        ray.kill(buffer)
