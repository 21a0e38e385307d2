"""Agent trajectories through the whole trainer, in every mode, on the real engine: the agent
demo's vault task (hybrid/data/agent_task.py) with its tool and parser (examples/agent/).

Each run checks what every mode must give: every step's agent/ metrics, tool calls made, the
template check exact, and the sync check across turns (the engine's log-probs of the model's
tokens against the actor's, tool tokens in the context, within bf16 noise). Colocated runs by
default; split and fully-async (where a sync lands mid-trajectory and the per-token versions say
so) run under `make test-full`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.data.agent_task import write_agent_task
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.trainer.loop import Driver
from tests.integration.trainer.helpers import ONE_WORKER, config_from_overrides, read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

LOGPROB_DIFF_MAX = 0.05  # bf16 noise, as the single-turn runs
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def assets(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("agent")
    build_tiny_model(root / "model", TinyModelConfig.preset("tiny", vocab="agent"), seed=0)
    write_agent_task(root / "data", num_train=64, num_test=8)
    return root


def run_agent(assets: Path, out: Path, steps: int, *extra: str) -> list[dict]:
    tools = ROOT / "examples" / "agent" / "vault_tools.py"
    overrides = [
        f"model.path={assets / 'model'}",
        f"data.train_files=[{assets / 'data' / 'train.parquet'}]",
        "data.val_files=[]",
        "data.max_prompt_length=8",
        f"trainer.output_dir={out}",
        f"trainer.total_steps={steps}",
        "data.train_batch_size=4",
        "algorithm.ppo_mini_batch_size=4",
        "rollout.n=8",
        "rollout.prompt_length=8",
        "rollout.response_length=12",
        "rollout.max_model_len=64",
        "rollout.agent.enabled=true",
        f"rollout.agent.tools_file={tools}",
        f"rollout.agent.tool_parser={tools}:VaultParser",
        "rollout.agent.max_turns=2",
        "rollout.agent.max_turn_tokens=3",
        f"reward.custom_path={ROOT / 'examples' / 'agent' / 'vault_reward.py'}",
        "actor.micro_batch_size=16",
        "trainer.loggers=[jsonl]",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "trainer.export_hf=false",
        *extra,
    ]
    Driver(config_from_overrides(overrides)).fit()
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    return metrics


def check_agent_metrics(metrics: list[dict]) -> None:
    for m in metrics:
        assert m["agent/template_exact"] == 1.0
        assert 1.0 <= m["agent/turns/mean"] <= 2.0
        assert m["rollout/logprob_diff_max"] < LOGPROB_DIFF_MAX, m["rollout/logprob_diff_max"]
        assert 0.0 < m["agent/context_token_fraction"] < 1.0 or m["agent/tool_call_rate"] == 0.0
    assert sum(m["agent/tool_calls_mean"] for m in metrics) > 0, "no tool call in the run"


def test_colocated_agent_run(assets: Path, tmp_path: Path) -> None:
    metrics = run_agent(assets, tmp_path / "run", 3, *ONE_WORKER)
    check_agent_metrics(metrics)


@pytest.mark.full
def test_split_agent_run(assets: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    metrics = run_agent(
        assets,
        out,
        3,
        "trainer.mode=split",
        "sync.timeout_s=60",
        f"sync.checkpoint_dir={out / 'w'}",
    )
    check_agent_metrics(metrics)


@pytest.mark.full
def test_fully_async_agent_run_syncs_mid_trajectory(assets: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    metrics = run_agent(
        assets,
        out,
        8,
        "trainer.mode=fully_async",
        "sync.timeout_s=60",
        "sync.method=checkpoint",
        f"sync.checkpoint_dir={out / 'w'}",
        "algorithm.ppo_mini_batch_size=1",
        "actor.micro_batch_size=8",
        "fully_async.chunk_tokens=1",
        "fully_async.staleness_threshold=2.0",
        "fully_async.max_version_lag=3",
    )
    check_agent_metrics(metrics)
    assert sum(m["agent/multi_version_trajectories"] for m in metrics) > 0


@pytest.mark.full
def test_tensor_parallel_agent_run_shares_the_replies(assets: Path, tmp_path: Path) -> None:
    """One engine over both ranks (TP 2): only its first rank runs the tools and shares their
    replies, so both ranks feed the engine the same tokens (else the engine's collectives hang)."""
    metrics = run_agent(assets, tmp_path / "run", 3, "rollout.tensor_parallel_size=2")
    check_agent_metrics(metrics)


@pytest.mark.full
def test_colocated_agent_run_with_sequence_parallelism(assets: Path, tmp_path: Path) -> None:
    """actor.sp_size=2: the trajectories' packed rows (prompt, sampled turns, tool replies)
    split over both workers; the tool replies stay context (masked), the gap stays small."""
    metrics = run_agent(assets, tmp_path / "run", 3, "actor.sp_size=2")
    check_agent_metrics(metrics)
