"""`hybrid.transport.checkpoint`: versions written atomically to a shared directory, read back
bit for bit and verified; crashes, missing files and corrupt bytes are seen, never loaded."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from hybrid.transport.buckets import as_bytes
from hybrid.transport.checkpoint import (
    MANIFEST,
    complete_versions,
    drop_versions_from,
    newest_version,
    prune_versions,
    read_version,
    remove_stale_temps,
    write_version,
)
from hybrid.transport.errors import TransportChecksumError, TransportError

pytestmark = pytest.mark.unit


def mixed_weights(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        ("embed.weight", torch.randn(17, 5, generator=g).to(torch.bfloat16)),
        ("layer.0.norm", torch.tensor([float("nan"), -0.0, float("inf"), 1e-45])),
        ("layer.0.scale", torch.tensor(2.5)),
        ("layer.0.empty", torch.empty(0, 3)),
        ("layer.0.ids", torch.arange(-5, 6, dtype=torch.int64).reshape(11, 1)),
        ("layer.1.odd", torch.randn(3, 5, 7, generator=g)),
        ("lm_head.weight", torch.randn(13, 3, generator=g).to(torch.bfloat16)),
    ]


def assert_same_stream(
    got: list[tuple[str, torch.Tensor]], want: list[tuple[str, torch.Tensor]]
) -> None:
    assert [n for n, _ in got] == [n for n, _ in want]
    for (name, a), (_, b) in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(as_bytes(a), as_bytes(b)), name


def test_round_trip_is_bit_exact_in_stream_order(tmp_path: Path) -> None:
    weights = mixed_weights()
    path = write_version(tmp_path, 3, weights, bucket_bytes=200)
    assert path == tmp_path / "v3"
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["version"] == 3
    assert len(manifest["files"]) > 1, "expected several shards"
    assert [t["name"] for t in manifest["tensors"]] == [n for n, _ in weights]
    assert {t["file"] for t in manifest["tensors"]} == set(manifest["files"])
    assert sorted(p.name for p in path.iterdir()) == sorted([*manifest["files"], MANIFEST])
    assert_same_stream(list(read_version(path)), weights)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_tied_weights_share_memory_and_still_write(tmp_path: Path) -> None:
    embed = torch.randn(8, 4)
    weights = [("embed.weight", embed), ("lm_head.weight", embed), ("half", embed[:4])]
    assert_same_stream(list(read_version(write_version(tmp_path, 0, weights, 1 << 20))), weights)


def test_an_existing_version_is_not_overwritten(tmp_path: Path) -> None:
    write_version(tmp_path, 1, mixed_weights(), 1 << 20)
    with pytest.raises(FileExistsError, match="v1"):
        write_version(tmp_path, 1, mixed_weights(seed=1), 1 << 20)
    assert_same_stream(list(read_version(tmp_path / "v1")), mixed_weights())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]


def test_a_failing_stream_leaves_no_version_and_no_temp(tmp_path: Path) -> None:
    def broken_stream():
        yield from mixed_weights()[:3]
        raise RuntimeError("gather died")

    with pytest.raises(RuntimeError, match="gather died"):
        write_version(tmp_path, 1, broken_stream(), bucket_bytes=64)
    assert list(tmp_path.iterdir()) == []


def test_a_crashed_write_is_invisible(tmp_path: Path) -> None:
    write_version(tmp_path, 1, mixed_weights(), 1 << 20)
    # A crash while writing v2: shards and even a manifest in the temp dir, never renamed.
    crashed = tmp_path / ".tmp-v2-k3x9"
    shutil.copytree(tmp_path / "v1", crashed)
    (crashed / MANIFEST).write_text(
        (crashed / MANIFEST).read_text().replace('"version": 1', '"version": 2')
    )
    assert complete_versions(tmp_path) == [(1, tmp_path / "v1")]
    assert newest_version(tmp_path) == (1, tmp_path / "v1")
    assert remove_stale_temps(tmp_path) == [crashed]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]


def test_a_manifest_naming_a_missing_file_makes_the_version_incomplete(tmp_path: Path) -> None:
    write_version(tmp_path, 1, mixed_weights(), 1 << 20)
    path = write_version(tmp_path, 2, mixed_weights(), bucket_bytes=64)
    missing = path / json.loads((path / MANIFEST).read_text())["files"][-1]
    missing.unlink()
    assert newest_version(tmp_path) == (1, tmp_path / "v1")
    with pytest.raises(TransportError, match=re.escape(str(missing))):
        list(read_version(path))


@pytest.mark.parametrize("content", [None, "{not json", '{"version": 4}'])
def test_a_missing_or_corrupt_manifest_names_the_path(tmp_path: Path, content: str | None) -> None:
    path = write_version(tmp_path, 4, mixed_weights(), 1 << 20)
    if content is None:
        (path / MANIFEST).unlink()
    else:
        (path / MANIFEST).write_text(content)
    assert complete_versions(tmp_path) == []
    with pytest.raises(TransportError, match=re.escape(str(path / MANIFEST))):
        list(read_version(path))


def test_a_corrupt_shard_names_the_tensor_and_file(tmp_path: Path) -> None:
    weights = [("a", torch.ones(64)), ("b", torch.ones(64, dtype=torch.bfloat16))]
    path = write_version(tmp_path, 5, weights, bucket_bytes=64)  # one tensor per shard
    shard = path / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x40  # the last byte is b's data
    shard.write_bytes(bytes(data))
    with pytest.raises(TransportChecksumError, match=re.escape(f"'b' (version 5, {shard})")):
        list(read_version(path))
    assert len(list(read_version(path, verify=False))) == 2


def test_prune_keeps_the_newest(tmp_path: Path) -> None:
    for version in (1, 2, 5, 10):
        write_version(tmp_path, version, mixed_weights(version), 1 << 20)
    (tmp_path / ".tmp-v11-abc").mkdir()  # being written: not a version, not pruned
    deleted = prune_versions(tmp_path, keep=2)
    assert deleted == [tmp_path / "v1", tmp_path / "v2"]
    assert [v for v, _ in complete_versions(tmp_path)] == [5, 10]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-v11-abc", "v10", "v5"]
    assert prune_versions(tmp_path, keep=2) == []
    with pytest.raises(ValueError, match="keep"):
        prune_versions(tmp_path, keep=-1)


def test_a_resumed_publisher_drops_later_versions_and_killed_writes(tmp_path: Path) -> None:
    for version in (1, 2, 3):
        write_version(tmp_path, version, mixed_weights(version), 1 << 20)
    (tmp_path / ".tmp-v4-killed").mkdir()  # a publish that was killed
    dropped = drop_versions_from(tmp_path, 2)
    assert dropped == [tmp_path / "v2", tmp_path / "v3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]
    write_version(tmp_path, 2, mixed_weights(20), 1 << 20)  # published again, no clash
    assert [v for v, _ in complete_versions(tmp_path)] == [1, 2]


def test_an_empty_or_absent_root_has_no_versions(tmp_path: Path) -> None:
    assert newest_version(tmp_path / "absent") is None
    assert complete_versions(tmp_path) == []
    (tmp_path / "v7").mkdir()  # no manifest
    (tmp_path / "v08").mkdir()  # not a version name
    assert newest_version(tmp_path) is None
