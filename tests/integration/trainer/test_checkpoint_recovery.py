"""Resuming over damaged checkpoints, on the real driver (Ray, FSDP2 trainers, DCP files):
a shard a user deleted, and a driver SIGKILLed in the middle of a save. Each time the run
resumes from the newest whole checkpoint, names the damaged newer one, and metrics.jsonl ends
with every step exactly once.

By default one short in-process run pair on the toy engine (checkpoints are the trainers'
business; the engine only receives the resumed weights). The SIGKILL of the real entry point,
with vLLM, is in the full tier.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from hybrid.trainer.checkpoints import (
    MANIFEST_FILE,
    checkpoint_dir,
    resumable_checkpoint,
)
from hybrid.trainer.loop import Driver
from tests.conftest import REPO_ROOT
from tests.integration.trainer.helpers import (
    UNREPEATABLE,
    child_env,
    read_metrics,
    small_config,
    small_run_overrides,
    write_assets,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TOY = ("rollout.engine=toy", "trainer.save_freq=1")


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_assets(tmp_path_factory.mktemp("recovery"))


def steps_logged(out: Path) -> list[int]:
    return [row["step"] for row in read_metrics(out)]


@pytest.mark.full  # the default tier's budget: manifests and damaged checkpoints are unit
# tests (tests/unit/trainer/test_checkpoints_manifest.py); resumes run by default elsewhere
def test_a_deleted_shard_resumes_from_the_previous_checkpoint(
    ray_cluster: None, assets: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "run"
    Driver(small_config(assets, out, *TOY, "trainer.total_steps=2")).fit()
    shards = sorted(checkpoint_dir(out, 2).glob("__*_*.distcp"))
    assert len(shards) == 2  # one per rank
    shards[-1].unlink()  # as a user would, by mistake
    first_step_2 = read_metrics(out)[1]

    caplog.set_level(logging.INFO, logger="hybrid")
    Driver(small_config(assets, out, *TOY, "trainer.total_steps=3")).fit()

    damaged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    expected = (
        f"checkpoint {checkpoint_dir(out, 2)} is damaged (file {shards[-1].name} missing); "
        "resuming from step_1"
    )
    assert expected in damaged, damaged
    assert f"resumed from {checkpoint_dir(out, 1)} at step 1" in caplog.text
    assert steps_logged(out) == [1, 2, 3]
    # The crashed run's step-2 row is kept aside, and the resumed step 2 repeats it: the run
    # really continued from step 1's weights, optimizer, RNG and data position.
    aside = out / "metrics.jsonl.before_resume_1"
    assert [json.loads(line) for line in aside.read_text().splitlines()] == [first_step_2]
    again = read_metrics(out)[1]
    repeatable = [k for k in first_step_2 if not k.startswith(UNREPEATABLE)]
    assert len(repeatable) > 10
    for key in repeatable:
        assert again[key] == first_step_2[key], key
    # step_2 was saved anew; nothing is damaged any more.
    choice = resumable_checkpoint(out, needs_critic=False)
    assert choice.found == (3, checkpoint_dir(out, 3)) and choice.skipped == ()
    assert (checkpoint_dir(out, 2) / MANIFEST_FILE).is_file()


# --- a driver killed while it saves ---------------------------------------------------------


def mid_save(out: Path, step: int) -> bool:
    """The workers are writing step `step`, or wrote it and the manifest is not there yet."""
    final = checkpoint_dir(out, step)
    return final.with_name(final.name + ".tmp").is_dir() or (
        final.is_dir() and not (final / MANIFEST_FILE).exists()
    )


def processes_of(session: int, marker: str) -> list[int]:
    """Pids of the processes a killed child left: in its session (it was started with one of
    its own) or carrying its environment marker (in case one started a session of its own)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
            sid = int(stat.rsplit(")", 1)[1].split()[3])
            environ = (entry / "environ").read_bytes()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
        if sid == session or marker.encode() in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def reap(session: int, marker: str, grace_s: float = 10.0) -> list[str]:
    """Wait up to `grace_s` for what the killed driver left to exit by itself (the cluster's
    own clean-up), then SIGKILL what is still there; "pid command" of each it had to kill."""
    deadline = time.monotonic() + grace_s
    while (left := processes_of(session, marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    killed = []
    for pid in left:
        with contextlib.suppress(OSError):  # it exited after all
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            os.kill(pid, signal.SIGKILL)
            killed.append(f"{pid} {command.decode(errors='replace').strip()[:120]}")
    return killed


@pytest.mark.full
@pytest.mark.timeout(900)
def test_a_driver_killed_mid_save_resumes_from_the_previous_checkpoint(
    ray_cluster: None, assets: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "run"
    marker = f"HYBRID_TEST_RUN={uuid.uuid4().hex}"
    env = child_env()
    env["PYTHONPATH"] = str(REPO_ROOT)
    env[marker.split("=")[0]] = marker.split("=")[1]
    args = small_run_overrides(assets, out, "trainer.total_steps=3", "trainer.save_freq=1")
    with (tmp_path / "driver.log").open("w") as log:
        driver = subprocess.Popen(
            [sys.executable, "-m", "hybrid.main", *args],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its Ray cluster stays in this session: found, then reaped
        )
        try:
            deadline = time.monotonic() + 600
            while not mid_save(out, 2):
                finished = driver.poll() is not None
                assert not finished and time.monotonic() < deadline, (
                    f"the driver {'exited' if finished else 'ran 600 s'} without being caught "
                    f"saving step 2: {(tmp_path / 'driver.log').read_text()[-3000:]}"
                )
                time.sleep(0.002)
            driver.send_signal(signal.SIGKILL)
            driver.wait(timeout=60)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
            leftover = reap(driver.pid, marker)
    print(f"processes the killed driver left after 10 s, killed by the test: {leftover}")
    assert processes_of(driver.pid, marker) == []
    logged = steps_logged(out)  # step 2's row, logged before its save began
    assert logged[0] == 1
    choice = resumable_checkpoint(out, needs_critic=False)
    assert choice.found == (1, checkpoint_dir(out, 1))  # step_2 never became whole

    caplog.set_level(logging.INFO, logger="hybrid")
    Driver(small_config(assets, out, "trainer.total_steps=3", "trainer.save_freq=1")).fit()
    assert f"resumed from {checkpoint_dir(out, 1)} at step 1" in caplog.text
    assert steps_logged(out) == [1, 2, 3]
    aside = out / "metrics.jsonl.before_resume_1"
    dropped = [json.loads(line)["step"] for line in aside.read_text().splitlines()]
    assert dropped == [step for step in logged if step > 1] == [2]
    assert resumable_checkpoint(out, needs_critic=False).found == (3, checkpoint_dir(out, 3))
