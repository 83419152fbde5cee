"""Requests with one big ``bytes`` field, framed by hand: the rest serialized by protobuf, the big field appended.

Why: in the client, protobuf 7.36 (upb) serializing a SendBatchRequest built around 1 MiB of entries took about
1.2 ms of each call (cProfile), where appending the same bytes to a buffer takes about 0.05 ms. Framed by hand,
``Producer.send_encoded`` of 1,000 messages of 1 KiB to a local broker takes 5.5 ms a call instead of 7.7 (medians,
2026-11-27; docs/decisions.md, "The produce path"). The broker's answers keep protobuf's serializer:
serializing a 4 MiB answer there measured 0.4 ms.

Protobuf's wire format lets fields come in any order (the last value of a field wins), so
``head.SerializeToString() + key + length + data``, with ``head``'s own value of the field empty, parses to the
same message as the whole one serialized by protobuf. ``Framed`` stands for such a request until gRPC serializes
it (``serialize``, the stub's request serializer, takes messages and ``Framed`` alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from google.protobuf.message import Message

WIRE_TYPE_LEN = 2  # protobuf's length-delimited wire type: bytes, strings, embedded messages

# The big field's value: one buffer, or its parts in order (a batch's entries), joined only into the request itself.
Data = bytes | bytearray | memoryview | Sequence[bytes]


class Serializable(Protocol):
    def SerializeToString(self) -> bytes: ...


def varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative int."""
    if value < 0:
        raise ValueError(f"varint of {value}: lengths and keys are never negative")
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _parts(data: Data) -> Sequence[bytes | bytearray | memoryview]:
    return (data,) if isinstance(data, bytes | bytearray | memoryview) else data


def framed(head: Message, field: str, data: Data) -> bytes:
    """``head`` serialized with ``data`` (or its parts, in order) as its bytes field ``field`` (which ``head`` must
    leave empty). Parts are copied once, into the request: joining a batch's entries first would copy a megabyte
    more, into a fresh block of its own."""
    descriptor = head.DESCRIPTOR.fields_by_name[field]
    if getattr(head, field):
        raise ValueError(f"{head.DESCRIPTOR.name}.{field} must be empty in the head: the data is appended")
    key = varint(descriptor.number << 3 | WIRE_TYPE_LEN)
    parts = _parts(data)
    return b"".join((head.SerializeToString(), key, varint(sum(map(len, parts))), *parts))


class Framed:
    """A message to send whose big bytes field ``field`` is appended when it is serialized (``framed``). The other
    fields are read and set on ``head``, as on the message itself."""

    __slots__ = ("data", "field", "head")

    def __init__(self, head: Message, field: str, data: Data) -> None:
        object.__setattr__(self, "head", head)
        object.__setattr__(self, "field", field)
        object.__setattr__(self, "data", data)

    def SerializeToString(self) -> bytes:
        return framed(self.head, self.field, self.data)

    def __getattr__(self, name: str) -> Any:
        return b"".join(_parts(self.data)) if name == self.field else getattr(self.head, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == self.field:
            raise AttributeError(f"{name} is the framed field; make a new Framed")
        setattr(self.head, name, value)


def serialize(message: Any) -> bytes:
    """A gRPC request serializer for messages and ``Framed`` alike."""
    serializable: Serializable = message
    return serializable.SerializeToString()


__all__ = ["Data", "Framed", "framed", "serialize", "varint"]
