"""Hand-framed bulk messages of the databuffer's two streaming RPCs.

`PutShardRequest.chunk` and `GetShardResponse.chunk` carry the shard bytes. Going through
protobuf objects costs two extra copies of every chunk on each side (into the message,
then into its serialized form; on receipt, parsed into the message, then out as `bytes`),
which made the gRPC path about half as fast. These helpers write and read the very same
wire bytes directly — tag byte, varint length, payload — so any protobuf client of
`databuffer.proto` interoperates. Everything else goes through the generated classes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from dagrl.rpc.gen.databuffer.v1 import databuffer_pb2 as pb

_LENGTH_DELIMITED = 2


def _tag(message: type, field: str) -> int:
    number = message.DESCRIPTOR.fields_by_name[field].number  # type: ignore[attr-defined]
    if number > 15:
        raise RuntimeError(f"{field} must keep a field number < 16 to fit a one-byte tag")
    return int(number) << 3 | _LENGTH_DELIMITED


PUT_CHUNK_TAG = _tag(pb.PutShardRequest, "chunk")
GET_CHUNK_TAG = _tag(pb.GetShardResponse, "chunk")


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def framed_chunks(tag: int, parts: Sequence[memoryview], size: int) -> Iterator[bytes]:
    """The concatenated parts as serialized one-field messages of `size` payload bytes."""
    pending: list[memoryview] = []
    pending_bytes = 0

    def frame() -> bytes:
        return b"".join([bytes([tag]), _varint(pending_bytes), *pending])

    for part in parts:
        view = part if part.format == "B" and part.ndim == 1 else part.cast("B")
        while view.nbytes:
            take = view[:size - pending_bytes]
            pending.append(take)
            pending_bytes += take.nbytes
            view = view[take.nbytes:]
            if pending_bytes == size:
                yield frame()
                pending, pending_bytes = [], 0
    if pending:
        yield frame()


def chunk_payload(tag: int, message: bytes) -> memoryview | None:
    """The payload of a serialized message holding only the chunk field, else None.

    None means "parse it with protobuf": another field, or an unusual encoding.
    """
    if len(message) < 2 or message[0] != tag:
        return None
    length, shift, position = 0, 0, 1
    while position < len(message) and position <= 10:
        byte = message[position]
        length |= (byte & 0x7F) << shift
        position += 1
        if not byte & 0x80:
            break
        shift += 7
    else:
        return None
    if position + length != len(message):
        return None
    return memoryview(message)[position:]
