"""The Batch wire codec: exact round trips, zero-copy decode, and safe failure on bad bytes."""

import contextlib
import pickle

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagrl.batch import Batch, decode, decode_parts, encode, encode_parts
from dagrl.batch.codec import CODEC_VERSION
from dagrl.errors import BatchDecodeError, BatchError

ALL_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
              torch.float16, torch.bfloat16, torch.float32, torch.float64]


def every_kind_batch() -> Batch:
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for dtype in ALL_DTYPES:
        values = torch.randint(-100, 100, (3, 4, 2), generator=g)
        tensors[str(dtype)] = values.to(dtype) if dtype != torch.bool else values > 0
    tensors["empty_rows"] = torch.zeros(3, 0)
    tensors["strided"] = torch.arange(24.0).reshape(3, 8)[:, ::2]
    columns = {
        "text": ["", "héllo ☃", "a\x00b"],
        "ints": [0, -(2**62), 2**63 - 1],
        "floats": [0.5, float("inf"), -1e-300],
        "objs": [{"tool": [1, "x", None]}, [True, False], None],
    }
    return Batch(tensors=tensors, columns=columns, meta={"step": 3, "nested": {"a": [1.5]}})


def test_round_trip_every_dtype_and_column_kind() -> None:
    batch = every_kind_batch()
    decoded = decode(encode(batch))
    assert decoded.equals(batch)
    for name, tensor in batch.tensors.items():
        assert decoded.tensors[name].dtype == tensor.dtype


def test_nan_round_trips_bit_exactly() -> None:
    x = torch.tensor([[float("nan"), 1.0]])
    out = decode(encode(Batch(tensors={"x": x}))).tensors["x"]
    assert torch.equal(out.view(torch.int32), x.view(torch.int32))


def test_decode_is_zero_copy_on_writable_buffers_and_copies_read_only_ones() -> None:
    data = encode(Batch(tensors={"x": torch.arange(16, dtype=torch.float32).reshape(4, 4)}))
    writable = bytearray(data)
    shared = decode(writable).tensors["x"]
    shared[0, 0] = 42.0
    assert decode(writable).tensors["x"][0, 0].item() == 42.0
    private = decode(data).tensors["x"]
    private[0, 0] = 7.0  # must not touch the immutable bytes
    assert decode(data).tensors["x"][0, 0].item() == 0.0


def test_encode_parts_join_to_encode() -> None:
    batch = every_kind_batch()
    assert b"".join(encode_parts(batch)) == encode(batch)


def test_empty_batch_round_trips() -> None:
    assert len(decode(encode(Batch()))) == 0


def test_unencodable_column_is_a_batch_error() -> None:
    with pytest.raises(BatchError, match="JSON-able"):
        encode(Batch(columns={"bad": [object()]}))


def test_unsupported_dtype_is_refused() -> None:
    with pytest.raises(BatchError, match="complex64"):
        encode(Batch(tensors={"c": torch.zeros(2, dtype=torch.complex64)}))


def test_foreign_and_future_formats_are_refused() -> None:
    data = bytearray(encode(every_kind_batch()))
    with pytest.raises(BatchDecodeError, match="magic"):
        decode(pickle.dumps({"x": 1}))
    data[4] = CODEC_VERSION + 1
    with pytest.raises(BatchDecodeError, match="version"):
        decode(bytes(data))


def test_every_truncation_fails_cleanly() -> None:
    batch = Batch(tensors={"x": torch.arange(6).reshape(3, 2)}, columns={"s": ["a", "b", "c"]})
    data = encode(batch)
    for cut in range(len(data)):
        with pytest.raises(BatchDecodeError):
            decode(data[:cut])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_fuzz_random_bytes_only_raise_decode_errors(data: bytes) -> None:
    with contextlib.suppress(BatchDecodeError):
        decode(data)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_fuzz_corrupted_valid_batches(data: st.DataObject) -> None:
    original = bytearray(encode(every_kind_batch()))
    for _ in range(data.draw(st.integers(1, 8))):
        position = data.draw(st.integers(0, len(original) - 1))
        original[position] = data.draw(st.integers(0, 255))
    try:
        decoded = decode(bytes(original))
    except BatchDecodeError:
        return
    assert isinstance(decoded, Batch)


def test_decode_parts_owns_its_memory() -> None:
    import gc

    batch = every_kind_batch()
    parts = [bytes(p) for p in encode_parts(batch)]
    decoded = decode_parts(parts)
    del parts
    gc.collect()
    _ = [bytearray(1 << 16) for _ in range(64)]  # reuse freed memory if it were freed
    assert decoded.equals(batch)
    decoded.tensors["torch.float32"][0, 0, 0] = 1234.0  # writable, private


def test_single_element_strided_view_encodes() -> None:
    view = torch.arange(12).reshape(6, 2)[:, 0][:1]  # one element, stride 2
    assert decode(encode(Batch(tensors={"x": view}))).tensors["x"].tolist() == [0]
