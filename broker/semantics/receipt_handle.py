"""Receipt handles of pop consumption: opaque to clients, tamper-evident, bound to one broker's store.

A handle names one delivery of one message: the queue, the queue offset and the delivery's sequence number (which
changes with every delivery and every change of invisible time), plus the time the delivery stops being invisible
(for people reading logs; the broker judges expiry by its own record). It is signed with HMAC-SHA256 over those
fields and the consumer group and topic, with a secret kept in the pop service's folder (``secret``, 32 random
bytes made at the store's first start, mode 0600). A handle altered in any bit, made up, given for another group or
topic, or issued by another broker's store fails the check and is refused with INVALID_RECEIPT_HANDLE; whether it
is still current (not acked, not expired, not superseded by a later delivery or change) is the pop service's
question.

Wire form: URL-safe base64 without padding of ``version (1) | queue id (i32) | queue offset (i64) | sequence (i64)
| invisible until ms (i64) | mac (16)``: 49 bytes, 66 characters.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import secrets
import stat
import struct
from typing import NamedTuple

from broker.errors import InvalidReceiptHandleError
from broker.private_file import PRIVATE_MODE, SHARED_BITS, write_private

log = logging.getLogger(__name__)

VERSION = 1
_FIELDS = struct.Struct(">Biqqq")
MAC_BYTES = 16  # 128 bits of HMAC-SHA256: forging one takes 2^128 tries
SECRET_BYTES = 32
SECRET_FILE = "secret"
MAX_HANDLE_CHARS = 256  # anything longer is not ours; refused before decoding


class Handle(NamedTuple):
    queue_id: int
    offset: int
    seq: int
    invisible_until_ms: int


def load_secret(folder: str) -> bytes:
    """The store's handle secret, made on first use (written before any handle can be issued), readable by the
    broker's user only. One an earlier version wrote with the umask's mode is made private and kept, not replaced: a
    new secret would refuse every handle in flight, and a handle forged with a copy of the old one is still used only
    through calls that need the rights on its group and topic."""
    path = os.path.join(folder, SECRET_FILE)
    try:
        with open(path, "rb") as f:
            secret = f.read()
            mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
            if len(secret) == SECRET_BYTES and mode & SHARED_BITS:
                log.warning("receipt-handle secret %s had mode %04o; made private (0600)", path, mode)
                os.fchmod(f.fileno(), PRIVATE_MODE)
        if len(secret) == SECRET_BYTES:
            return secret
    except FileNotFoundError:
        pass
    os.makedirs(folder, exist_ok=True)
    secret = secrets.token_bytes(SECRET_BYTES)
    write_private(path, secret)
    return secret


class HandleCodec:
    def __init__(self, secret: bytes) -> None:
        self._keyed = hmac.new(secret, digestmod=hashlib.sha256)  # copied per handle: the key is set up once

    def _mac(self, group: str, topic: str, fields: bytes) -> bytes:
        mac = self._keyed.copy()
        mac.update(group.encode() + b"\x00" + topic.encode() + b"\x00" + fields)
        return mac.digest()[:MAC_BYTES]

    def encode(self, group: str, topic: str, handle: Handle) -> str:
        fields = _FIELDS.pack(VERSION, *handle)
        raw = fields + self._mac(group, topic, fields)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def decode(self, group: str, topic: str, text: str) -> Handle:
        """The handle's fields; InvalidReceiptHandleError unless this broker issued it for this group and topic."""
        if not text or len(text) > MAX_HANDLE_CHARS:
            raise InvalidReceiptHandleError("receipt handle is empty or too long: pass the one a receive returned")
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise InvalidReceiptHandleError("receipt handle is not one this broker issued (not base64)") from None
        if len(raw) != _FIELDS.size + MAC_BYTES or raw[0] != VERSION:
            raise InvalidReceiptHandleError("receipt handle is not one this broker issued (wrong length or version)")
        fields, mac = raw[: _FIELDS.size], raw[_FIELDS.size :]
        if not hmac.compare_digest(mac, self._mac(group, topic, fields)):
            raise InvalidReceiptHandleError(
                f"receipt handle was not issued by this broker for group {group!r} and topic {topic!r}, or was altered"
            )
        _, queue_id, offset, seq, until = _FIELDS.unpack(fields)
        return Handle(queue_id, offset, seq, until)
