"""A publisher SIGKILLed in the middle of a `checkpoint` publish: the previous version stays
the newest complete one and loads bit for bit, the half-written version is never read, and the
publisher's restart clears it and publishes that version again.

The kill is live and deterministic: the child process publishes a stream that, after its first
shard is on disk, signals the test and blocks; the test kills it there, inside `write_version`.
(`tests/integration/trainer/test_split.py` resumes a whole split run from this state.)
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hybrid.transport.buckets import as_bytes
from hybrid.transport.checkpoint import (
    TEMP_PREFIX,
    drop_versions_from,
    newest_version,
    read_version,
    write_version,
)

pytestmark = pytest.mark.integration

BUCKET_BYTES = 4096

PUBLISHER = """
import sys, time
from pathlib import Path
import torch
from hybrid.transport.checkpoint import write_version

root, signal_file = Path(sys.argv[1]), Path(sys.argv[2])

def weights(seed):
    g = torch.Generator().manual_seed(seed)
    return [(f"layer.{i}.weight", torch.randn(32, 32, generator=g)) for i in range(4)]

write_version(root, 1, weights(1), BUCKET)

def stalled():
    stream = weights(2)
    yield stream[0]
    yield stream[1]  # does not fit the first shard: that one is written before this returns
    signal_file.write_text("first shard written")
    time.sleep(600)  # killed here, mid-publish
    yield from stream[2:]

write_version(root, 2, stalled(), BUCKET)
"""


def weights(seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(f"layer.{i}.weight", torch.randn(32, 32, generator=g)) for i in range(4)]


def test_a_publisher_killed_mid_write_leaves_the_previous_version_loadable(tmp_path: Path) -> None:
    root, signal_file = tmp_path / "weights", tmp_path / "stalled"
    publisher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            PUBLISHER.replace("BUCKET", str(BUCKET_BYTES)),
            str(root),
            str(signal_file),
        ]
    )
    try:
        deadline = time.monotonic() + 120
        while not signal_file.exists():
            assert publisher.poll() is None, "the publisher exited before the stall"
            assert time.monotonic() < deadline, "the publisher never reached its second version"
            time.sleep(0.05)
        # Inside write_version: a temp directory with the first shard, no v2.
        (temp,) = [p for p in root.iterdir() if p.name.startswith(TEMP_PREFIX)]
        assert [p.name for p in temp.iterdir()] == ["shard-00000.safetensors"]
        os.kill(publisher.pid, signal.SIGKILL)
        assert publisher.wait(timeout=30) == -signal.SIGKILL
    finally:
        if publisher.poll() is None:
            publisher.kill()

    newest = newest_version(root)
    assert newest is not None and newest[0] == 1
    loaded = list(read_version(newest[1]))
    assert [n for n, _ in loaded] == [n for n, _ in weights(1)]
    for (name, got), (_, want) in zip(loaded, weights(1), strict=True):
        assert torch.equal(as_bytes(got), as_bytes(want)), name
    assert temp.exists()  # left behind, ignored by readers

    # The restarted publisher clears the leftover and publishes version 2 again.
    assert drop_versions_from(root, 2) == []
    assert not temp.exists()
    path = write_version(root, 2, weights(2), BUCKET_BYTES)
    assert newest_version(root) == (2, path)
    assert [n for n, _ in read_version(path)] == [n for n, _ in weights(2)]
