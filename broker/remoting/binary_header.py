"""RocketMQ's binary header (serialization type 1, ``ROCKETMQ``), big-endian, 21 fixed bytes then two blocks:

====== ==== =====================================================================================
offset size field
====== ==== =====================================================================================
0      2    code (int16: codes from 32768 up, the 5.x pop codes, only travel in JSON headers)
2      1    language code byte
3      2    version (int16)
5      4    opaque (int32)
9      4    flag (int32)
13     4    remark length, then the remark's UTF-8 bytes (length 0: no remark)
17+r   4    extFields block length, then {key length int16, key, value length int32, value} repeated
====== ==== =====================================================================================

As RocketMQ reads it, a zero-length string is no string: a remark of length 0 is null, and an extFields entry
with an empty key or value is left out (so an empty value does not survive a round trip: it is absent). A key that
occurs twice keeps its last value (5.x writes fast-encoded header fields, then extFields an ACL hook filled).
Everything else that does not add up (a length running past the header, bytes left over, text that is not UTF-8)
is a :class:`RemotingFrameError`.
"""

from __future__ import annotations

import struct

from broker.errors import RemotingFrameError
from broker.remoting.command import RemotingCommand, SerializeType
from broker.remoting.language import language_byte, language_name

FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag
FIXED_BYTES = 21  # FIXED (13) and the two length words: a header with no remark and no extFields
INT16_MAX = (1 << 15) - 1
_LEN32 = struct.Struct(">i")
_LEN16 = struct.Struct(">h")


def encode_binary_header(command: RemotingCommand) -> bytes:
    """RemotingFrameError when a field does not fit its slot (a code or version outside int16: send it as JSON)."""
    if not -INT16_MAX - 1 <= command.code <= INT16_MAX or not -INT16_MAX - 1 <= command.version <= INT16_MAX:
        raise RemotingFrameError(
            f"code {command.code} / version {command.version} does not fit the ROCKETMQ header's int16: use JSON"
        )
    remark = (command.remark or "").encode("utf-8")
    ext = bytearray()
    for key, value in command.ext_fields.items():
        k, v = key.encode("utf-8"), str(value).encode("utf-8")
        if len(k) > INT16_MAX:
            raise RemotingFrameError(f"extFields key of {len(k)} bytes does not fit the ROCKETMQ header's int16")
        ext += _LEN16.pack(len(k)) + k + _LEN32.pack(len(v)) + v
    try:
        fixed = FIXED.pack(command.code, language_byte(command.language), command.version, command.opaque,
                           command.flag)
    except struct.error as e:
        raise RemotingFrameError(f"a header field does not fit the ROCKETMQ header ({e})") from None
    return b"".join((fixed, _LEN32.pack(len(remark)), remark, _LEN32.pack(len(ext)), ext))


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise RemotingFrameError(f"ROCKETMQ header: {what} of {n} bytes runs past the header")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def text(self, n: int, what: str) -> str | None:
        raw = self.take(n, what)
        if not raw:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise RemotingFrameError(f"ROCKETMQ header: {what} is not UTF-8") from None


def decode_binary_header(data: bytes) -> RemotingCommand:
    if len(data) < FIXED_BYTES:
        raise RemotingFrameError(f"ROCKETMQ header of {len(data)} bytes; it takes at least {FIXED_BYTES}")
    code, language, version, opaque, flag = FIXED.unpack_from(data)
    reader = _Reader(data)
    reader.at = FIXED.size
    (remark_len,) = _LEN32.unpack(reader.take(4, "remark length"))
    remark = reader.text(remark_len, "remark")
    (ext_len,) = _LEN32.unpack(reader.take(4, "extFields length"))
    block = _Reader(reader.take(ext_len, "extFields block"))
    if reader.at != len(data):
        raise RemotingFrameError(f"ROCKETMQ header: {len(data) - reader.at} bytes after the extFields block")
    ext: dict[str, str] = {}
    while block.at < len(block.data):
        (key_len,) = _LEN16.unpack(block.take(2, "extFields key length"))
        key = block.text(key_len, "extFields key")
        (value_len,) = _LEN32.unpack(block.take(4, "extFields value length"))
        value = block.text(value_len, "extFields value")
        if key is not None and value is not None:
            ext[key] = value  # a repeated key: the last wins
        elif key is not None:
            ext.pop(key, None)  # an empty value is an absent one, also over an earlier occurrence
    return RemotingCommand(code=code, opaque=opaque, flag=flag, language=language_name(language), version=version,
                           remark=remark, ext_fields=ext, serialize_type=SerializeType.ROCKETMQ)
