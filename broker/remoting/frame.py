"""The remoting frame: ``total length (int32) | serialization type (1 byte) + header length (3 bytes) | header |
body``, big-endian; the total length counts everything after itself.

A frame is read in two steps, as a stream gives it: :func:`body_length` checks the 4-byte prefix before anything
more is read (so a hostile length never makes the reader wait for, or buffer, 2 GiB), then :func:`decode_frame`
takes the rest. Every way a frame can be wrong raises :class:`RemotingFrameError`; the transport then closes the
connection, since the stream's frame boundaries can no longer be trusted.
"""

from __future__ import annotations

import struct

from broker.errors import RemotingFrameError
from broker.remoting.binary_header import decode_binary_header, encode_binary_header
from broker.remoting.command import RemotingCommand, SerializeType
from broker.remoting.json_header import decode_json_header, encode_json_header

# The largest frame, its length prefix included: RocketMQ's frameMaxLength default (16 MiB). A 4 MiB message
# (RocketMQ's maxMessageSize) or a pull answer of 32 of them at RocketMQ's pull byte limits fits; anything larger
# is refused before it is read, so one connection cannot make the server buffer more than this.
MAX_FRAME_BYTES = 16 * 1024 * 1024
PREFIX_BYTES = 4
HEADER_WORD_BYTES = 4  # the serialization type byte and the 3-byte header length
MAX_HEADER_BYTES = (1 << 24) - 1  # what 3 bytes can say; the frame limit bounds it further
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")


def body_length(prefix: bytes) -> int:
    """The number of bytes that follow a frame's 4-byte length prefix; RemotingFrameError for one no frame has."""
    (length,) = _INT32.unpack(prefix)
    if length < HEADER_WORD_BYTES:
        raise RemotingFrameError(f"frame length {length} is below the {HEADER_WORD_BYTES} bytes of its header word")
    if length > MAX_FRAME_BYTES - PREFIX_BYTES:
        raise RemotingFrameError(f"frame length {length} is over the limit of {MAX_FRAME_BYTES} bytes")
    return length


def decode_frame(data: bytes) -> RemotingCommand:
    """A command from the bytes after the length prefix (exactly ``body_length`` of them)."""
    if len(data) < HEADER_WORD_BYTES:
        raise RemotingFrameError(f"frame of {len(data)} bytes is truncated: no header word")
    (word,) = _UINT32.unpack_from(data)
    kind, header_len = word >> 24, word & MAX_HEADER_BYTES
    if header_len > len(data) - HEADER_WORD_BYTES:
        raise RemotingFrameError(
            f"header length {header_len} is over the {len(data) - HEADER_WORD_BYTES} bytes the frame holds"
        )
    header = data[HEADER_WORD_BYTES : HEADER_WORD_BYTES + header_len]
    if kind == SerializeType.JSON:
        command = decode_json_header(header)
    elif kind == SerializeType.ROCKETMQ:
        command = decode_binary_header(header)
    else:
        raise RemotingFrameError(f"serialization type {kind} is neither JSON (0) nor ROCKETMQ (1)")
    command.body = data[HEADER_WORD_BYTES + header_len :]
    return command


def encode_frame(command: RemotingCommand) -> bytes:
    """The whole frame, length prefix included, with the header in ``command.serialize_type``."""
    if command.serialize_type == SerializeType.ROCKETMQ:
        header = encode_binary_header(command)
    else:
        header = encode_json_header(command)
    total = PREFIX_BYTES + HEADER_WORD_BYTES + len(header) + len(command.body)
    if total > MAX_FRAME_BYTES:
        raise RemotingFrameError(f"a frame of {total} bytes is over the limit of {MAX_FRAME_BYTES}")
    word = (int(command.serialize_type) << 24) | len(header)
    return b"".join((_INT32.pack(total - PREFIX_BYTES), _UINT32.pack(word), header, command.body))
