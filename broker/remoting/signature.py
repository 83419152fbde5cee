"""RocketMQ 4's ACL signature of a remoting request: what is signed, and how.

A signed request carries ``AccessKey`` and ``Signature`` in its ``extFields`` (and, with temporary credentials,
``SecurityToken``, which Sluice does not issue). The signed content is every ext field but ``Signature``, sorted by
key in Java's ``String`` order (UTF-16 code units), their **values only** concatenated and written as UTF-8, then
the body's bytes as they are. The signature is ``Base64(HMAC-SHA1(secret key as UTF-8, content))``.

Clients up to 4.9.3 sign only their header class's fields with ``AccessKey`` (and ``SecurityToken``); those are the
request's ext fields anyway, so one rule checks both generations. The one ext field a 4.9 client adds after its
hook ran is ``_UNIQUE_KEY_QUERY`` (a by-id message query); a signature that does not match with it is checked once
more without it, as RocketMQ's 4.9 server leaves it out.

No time, nonce or connection is signed: the same request signs the same way whenever it is sent, so a signature
someone recorded stays valid (docs/remoting.md, "Replay").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"  # MixAll.UNIQUE_MSG_QUERY_FLAG


def _java_order(key: str) -> bytes:
    """Java's ``String.compareTo`` compares UTF-16 code units: big-endian UTF-16 bytes sort the same way (Python's
    own ``str`` order, by code point, differs for characters past U+FFFF)."""
    return key.encode("utf-16-be", "surrogatepass")


def signed_content(ext_fields: Mapping[str, str], body: bytes, *, leave_out: frozenset[str] = frozenset()) -> bytes:
    """The bytes a request's signature is computed over."""
    keys = sorted((k for k in ext_fields if k != SIGNATURE and k not in leave_out), key=_java_order)
    return "".join(ext_fields[k] for k in keys).encode("utf-8", "surrogatepass") + body


def compute(secret_key: str, content: bytes) -> str:
    return base64.b64encode(hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()).decode("ascii")


def sign(ext_fields: dict[str, str], body: bytes, access_key: str, secret_key: str) -> None:
    """Add ``AccessKey`` and ``Signature`` to ``ext_fields`` (in place), as a RocketMQ 4 client's RPC hook does."""
    ext_fields.pop(SIGNATURE, None)
    ext_fields[ACCESS_KEY] = access_key
    ext_fields[SIGNATURE] = compute(secret_key, signed_content(ext_fields, body))


def matches(secret_key: str, ext_fields: Mapping[str, str], body: bytes) -> bool:
    """Whether the request's ``Signature`` is the one ``secret_key`` gives (compared in constant time)."""
    given = ext_fields.get(SIGNATURE, "").encode("ascii", "replace")
    if hmac.compare_digest(compute(secret_key, signed_content(ext_fields, body)).encode("ascii"), given):
        return True
    if UNIQUE_KEY_QUERY in ext_fields:
        without = compute(secret_key, signed_content(ext_fields, body, leave_out=frozenset({UNIQUE_KEY_QUERY})))
        return hmac.compare_digest(without.encode("ascii"), given)
    return False
