"""Unit tests for `hybrid.data.batch.Batch`: validation, row selection, the pad/chunk/concat
round trip, union, repeat, select, device moves and pickling."""

import pickle

import numpy as np
import pytest
import torch

from hybrid.data.batch import Batch, RowIndex

pytestmark = pytest.mark.unit


def make_batch(size: int = 4) -> Batch:
    return Batch.from_dict(
        {
            "ids": torch.arange(size * 3).reshape(size, 3),
            "reward": torch.arange(size, dtype=torch.float32) / 10,
        },
        {"prompt": [f"p{i}" for i in range(size)], "info": [{"row": i} for i in range(size)]},
        {"step": 7},
    )


def rows_of(batch: Batch) -> list[int]:
    """The original row ids of `batch`, read back from the `ids` tensor."""
    return [int(v) for v in batch.tensors["ids"][:, 0] // 3]


def assert_rows(batch: Batch, expected: list[int]) -> None:
    assert rows_of(batch) == expected
    assert list(batch["prompt"]) == [f"p{i}" for i in expected]
    assert list(batch["info"]) == [{"row": i} for i in expected]
    assert torch.equal(batch.tensors["reward"], torch.tensor(expected, dtype=torch.float32) / 10)


# ---- construction and validation ----------------------------------------------------------


def test_from_dict_sizes_and_storage() -> None:
    batch = make_batch(4)
    assert len(batch) == batch.batch_size == 4
    assert batch.keys() == ["ids", "reward", "prompt", "info"]
    assert "ids" in batch and "prompt" in batch and "step" not in batch
    assert batch["prompt"].dtype == object and batch["prompt"].shape == (4,)


def test_from_dict_mismatched_tensor_names_key_and_sizes() -> None:
    with pytest.raises(ValueError, match=r"'mask'.*first dim 3, expected 4"):
        Batch.from_dict({"ids": torch.zeros(4, 2), "mask": torch.zeros(3, 2)})


def test_from_dict_mismatched_non_tensor_names_key_and_sizes() -> None:
    with pytest.raises(ValueError, match=r"'prompt'.*length 2, expected 4"):
        Batch.from_dict({"ids": torch.zeros(4)}, {"prompt": ["a", "b"]})


def test_from_dict_rejects_scalar_tensor_and_key_in_both() -> None:
    with pytest.raises(ValueError, match="'x' is 0-d"):
        Batch.from_dict({"x": torch.tensor(1.0)})
    with pytest.raises(ValueError, match=r"\['x'\] are both tensor and non-tensor"):
        Batch.from_dict({"x": torch.zeros(2)}, {"x": ["a", "b"]})
    with pytest.raises(TypeError, match="'s'"):
        Batch.from_dict({}, {"s": "not a list"})


def test_non_tensors_of_lists_stay_one_dimensional() -> None:
    batch = Batch.from_dict({}, {"tokens": [[1, 2], [3, 4], [5, 6]]})
    assert batch["tokens"].shape == (3,)
    assert batch["tokens"][1] == [3, 4]
    assert len(batch) == 3


def test_size_without_tensors_and_empty_batch() -> None:
    assert len(Batch.from_dict({}, {"a": np.array([1, 2, 3])})) == 3
    assert len(Batch.from_dict({})) == 0
    assert len(Batch()) == 0


def test_missing_key_lists_available_keys() -> None:
    with pytest.raises(KeyError, match=r"'nope'.*\['ids', 'reward', 'prompt', 'info'\]"):
        make_batch()["nope"]


# ---- row selection -------------------------------------------------------------------------


def test_int_index_keeps_row_dim() -> None:
    batch = make_batch(4)
    assert_rows(batch[2], [2])
    assert batch[2]["ids"].shape == (1, 3)
    assert_rows(batch[-1], [3])
    with pytest.raises(IndexError):
        batch[4]


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (slice(1, 3), [1, 2]),
        (slice(None, None, 2), [0, 2]),
        ([3, 0, 0], [3, 0, 0]),
        (torch.tensor([2, 1]), [2, 1]),
        (np.array([1, 3]), [1, 3]),
        (torch.tensor([True, False, False, True]), [0, 3]),
        (np.array([False, True, True, False]), [1, 2]),
        ([], []),
    ],
)
def test_row_indexing(index: RowIndex, expected: list[int]) -> None:
    assert_rows(make_batch(4)[index], expected)


def test_bool_mask_of_wrong_length_raises() -> None:
    with pytest.raises(IndexError, match="bool mask"):
        make_batch(4)[torch.tensor([True, False])]


# ---- chunk / pad / concat / unpad ----------------------------------------------------------


def test_chunk_is_consecutive_and_ordered() -> None:
    chunks = make_batch(6).chunk(3)
    assert [rows_of(c) for c in chunks] == [[0, 1], [2, 3], [4, 5]]
    assert all(c.meta == {"step": 7} for c in chunks)


def test_chunk_non_divisible_points_to_pad() -> None:
    with pytest.raises(ValueError, match=r"5 is not divisible by 2.*pad_to_multiple"):
        make_batch(5).chunk(2)


def test_pad_repeats_rows_from_the_start() -> None:
    padded, num_pad = make_batch(5).pad_to_multiple(4)
    assert num_pad == 3
    assert_rows(padded, [0, 1, 2, 3, 4, 0, 1, 2])
    small, num_pad = make_batch(1).pad_to_multiple(4)
    assert num_pad == 3
    assert_rows(small, [0, 0, 0, 0])


def test_pad_noop_cases() -> None:
    padded, num_pad = make_batch(4).pad_to_multiple(2)
    assert num_pad == 0 and rows_of(padded) == [0, 1, 2, 3]
    empty, num_pad = make_batch(0).pad_to_multiple(4)
    assert num_pad == 0 and len(empty) == 0


@pytest.mark.parametrize("size", [5, 7])
@pytest.mark.parametrize("n", [2, 4])
def test_pad_chunk_concat_unpad_round_trip(size: int, n: int) -> None:
    batch = make_batch(size)
    padded, num_pad = batch.pad_to_multiple(n)
    assert len(padded) % n == 0 and num_pad == len(padded) - size
    restored = Batch.concat(padded.chunk(n))
    assert restored.unpad(num_pad).equals(batch)
    assert restored[: len(restored) - num_pad].equals(batch)


def test_unpad_rejects_bad_count() -> None:
    with pytest.raises(ValueError, match="num_pad"):
        make_batch(2).unpad(3)


def test_concat_key_mismatch_names_keys_and_index() -> None:
    a, b = make_batch(2), make_batch(2).select(["ids", "prompt", "info"])
    with pytest.raises(ValueError, match=r"batch 1 tensor keys.*missing \['reward'\]"):
        Batch.concat([a, b])
    with pytest.raises(ValueError, match="empty"):
        Batch.concat([])


def test_concat_meta_conflict_names_key() -> None:
    a, b = make_batch(2), make_batch(2)
    b.meta["step"] = 8
    with pytest.raises(ValueError, match="'step'"):
        Batch.concat([a, b])


# ---- union / repeat / select / to ----------------------------------------------------------


def test_union_merges_keys_and_accepts_identical_values() -> None:
    batch = make_batch(3)
    extra = Batch.from_dict(
        {"ids": batch.tensors["ids"].clone(), "adv": torch.ones(3)},
        {"tag": ["x", "y", "z"]},
        {"lr": 0.1},
    )
    merged = batch.union(extra)
    assert set(merged.keys()) == {"ids", "reward", "prompt", "info", "adv", "tag"}
    assert merged.meta == {"step": 7, "lr": 0.1}
    assert_rows(merged, [0, 1, 2])


@pytest.mark.parametrize(
    ("tensors", "non_tensors", "meta", "key"),
    [
        ({"ids": torch.zeros(3, 3, dtype=torch.int64)}, {}, {}, "ids"),
        ({}, {"prompt": ["p0", "p1", "other"]}, {}, "prompt"),
        ({}, {"tag": ["a", "b", "c"]}, {"step": 9}, "step"),
    ],
)
def test_union_conflict_names_key(
    tensors: dict[str, torch.Tensor], non_tensors: dict[str, list[str]], meta: dict, key: str
) -> None:
    other = Batch.from_dict(tensors, non_tensors, meta)
    with pytest.raises(ValueError, match=f"'{key}'"):
        make_batch(3).union(other)


def test_union_size_mismatch() -> None:
    with pytest.raises(ValueError, match="3 and 2"):
        make_batch(3).union(make_batch(2))


def test_repeat_interleave_and_tile_orders() -> None:
    batch = make_batch(2)
    assert_rows(batch.repeat(2), [0, 0, 1, 1])
    expected = batch.tensors["ids"].repeat_interleave(3, dim=0)
    assert torch.equal(batch.repeat(3).tensors["ids"], expected)
    assert_rows(batch.repeat(2, interleave=False), [0, 1, 0, 1])


def test_select_keeps_requested_keys_and_meta() -> None:
    selected = make_batch(3).select(["reward", "prompt"])
    assert selected.keys() == ["reward", "prompt"]
    assert selected.meta == {"step": 7}
    with pytest.raises(KeyError, match=r"\['nope'\] not in batch"):
        make_batch(3).select(["ids", "nope"])


def test_to_cpu() -> None:
    moved = make_batch(3).to("cpu")
    assert moved.tensors["ids"].device.type == "cpu"
    assert moved.equals(make_batch(3))


# ---- pickling, meta isolation, repr --------------------------------------------------------


def test_pickle_round_trip() -> None:
    batch = make_batch(5)
    assert pickle.loads(pickle.dumps(batch)).equals(batch)


def test_pickled_chunk_ships_only_its_rows() -> None:
    big = Batch.from_dict({"x": torch.zeros(1000, 64)})
    chunk = big.chunk(10)[3]
    assert len(pickle.dumps(chunk)) < len(pickle.dumps(big)) / 5
    assert pickle.loads(pickle.dumps(chunk)).equals(chunk)


WIRE_DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.int64, torch.int8, torch.bool]


@pytest.mark.parametrize("dtype", WIRE_DTYPES, ids=str)
def test_pickled_tensors_keep_dtype_shape_and_bits(dtype: torch.dtype) -> None:
    values = torch.randn(6, 3, 2, generator=torch.Generator().manual_seed(0)) * 50
    batch = Batch.from_dict({"x": values.to(dtype), "col": values.to(dtype)[:, 1]})
    back = pickle.loads(pickle.dumps(batch, protocol=5))
    for key in ("x", "col"):
        assert back.tensors[key].dtype == dtype
        assert back.tensors[key].shape == batch.tensors[key].shape
    assert back.equals(batch)


def test_tensors_unpickled_from_read_only_buffers_are_writable() -> None:
    """Ray hands out-of-band buffers from its object store read-only; the rows must still be
    writable (and writing must not reach the sender's memory)."""
    batch = Batch.from_dict({"x": torch.arange(8, dtype=torch.float32).view(4, 2)})
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
    assert buffers  # the tensor went out of band
    read_only = [memoryview(bytes(b.raw())) for b in buffers]
    sent = [view.tobytes() for view in read_only]
    back = pickle.loads(data, buffers=read_only)
    back.tensors["x"] += 1
    assert back.tensors["x"][0, 0] == 1
    assert [view.tobytes() for view in read_only] == sent  # the read-only memory is untouched


def test_meta_is_isolated_in_derived_batches() -> None:
    batch = make_batch(4)
    derived = [batch[0], batch[1:], batch.chunk(2)[0], batch.repeat(2), batch.select(["ids"])]
    derived += [batch.to("cpu"), batch.pad_to_multiple(3)[0], Batch.concat([batch])]
    for i, other in enumerate(derived):
        other.meta[f"new{i}"] = i
        other.meta["step"] = -1
    assert batch.meta == {"step": 7}


def test_repr_is_short() -> None:
    text = repr(make_batch(2))
    assert text.startswith("Batch(size=2")
    assert "ids: (2, 3) torch.int64" in text and "'prompt'" in text and "'step'" in text
