"""The sysFlag bits remoting clients set beyond Sluice's own (``broker.format.message.SysFlag``), and compressed bodies.

A 4.x producer compresses a body of 4 KiB or more with zlib (level 5, zlib-wrapped) and sets COMPRESSED; from 4.9.4
it also writes the algorithm in bits 8-10 (``COMPRESSION_*``; 0 means zlib, what older producers meant). The broker
stores the body as sent, flag included: a remoting consumer inflates it itself. Sluice's own readers are given it
inflated (``inflated_body``), so that a body reads the same whichever protocol wrote it.
"""

from __future__ import annotations

import zlib

from broker.errors import MessageIllegalError
from broker.format.message import SysFlag

COMPRESSED = SysFlag.COMPRESSED
BORNHOST_V6 = SysFlag.BORNHOST_V6
STOREHOST_V6 = SysFlag.STOREHOST_V6
NEED_UNWRAP = 0x40  # MessageSysFlag.NEED_UNWRAP_FLAG (5.x: a batch wrapped in one message)
INNER_BATCH = 0x80  # MessageSysFlag.INNER_BATCH_FLAG (5.x: a batch kept as one entry)
COMPRESSION_TYPE_SHIFT = 8  # MessageSysFlag.COMPRESSION_TYPE_COMPARATOR: bits 8-10
COMPRESSION_TYPE_MASK = 0x7 << COMPRESSION_TYPE_SHIFT
COMPRESSION_LZ4 = 1  # CompressionType.LZ4
COMPRESSION_ZSTD = 2  # CompressionType.ZSTD
COMPRESSION_ZLIB = 3  # CompressionType.ZLIB
# RocketMQ's producer level (compressLevel, default 5): what a Sluice sender that compresses uses too.
ZLIB_LEVEL = 5
# A compressed body is inflated only up to this many bytes: RocketMQ's largest message (maxMessageSize 4 MiB) well
# compressed inflates far beyond it, and a reader must not be made to allocate without bound by a crafted body.
MAX_INFLATED_BYTES = 64 << 20


def compression_type(sys_flag: int) -> int:
    """The algorithm of a COMPRESSED body: bits 8-10, 0 (an older producer) meaning zlib."""
    kind = (sys_flag & COMPRESSION_TYPE_MASK) >> COMPRESSION_TYPE_SHIFT
    return kind or COMPRESSION_ZLIB


def inflated_body(sys_flag: int, body: bytes) -> bytes:
    """The body a reader is given: inflated when COMPRESSED (zlib only: LZ4 and ZSTD have no library here, and such
    a body is refused with the reason rather than handed over still compressed)."""
    if not sys_flag & COMPRESSED:
        return body
    kind = compression_type(sys_flag)
    if kind != COMPRESSION_ZLIB:
        name = {COMPRESSION_LZ4: "LZ4", COMPRESSION_ZSTD: "ZSTD"}.get(kind, f"type {kind}")
        raise MessageIllegalError(f"the body is compressed with {name}; only zlib bodies can be read here")
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(body, MAX_INFLATED_BYTES)
    except zlib.error as e:
        raise MessageIllegalError(f"the body is flagged compressed but is not zlib data ({e})") from None
    if inflater.unconsumed_tail:
        raise MessageIllegalError(f"the body inflates past {MAX_INFLATED_BYTES} bytes; not read")
    return out


def compressed_body(body: bytes) -> tuple[bytes, int]:
    """``body`` compressed as a 4.9.4+ producer does it, with the sysFlag bits that say so."""
    return zlib.compress(body, ZLIB_LEVEL), COMPRESSED | (COMPRESSION_ZLIB << COMPRESSION_TYPE_SHIFT)
