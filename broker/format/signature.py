"""RocketMQ 5's request signature, ``MQv2-HMAC-SHA1``: how a client signs a request and how the broker checks it.

A request carries two headers (gRPC metadata, lower-case names)::

    x-mq-date-time: 20261126T113208Z
    authorization: MQv2-HMAC-SHA1 Credential=<accessKey>, SignedHeaders=x-mq-date-time, Signature=<hex>

The signature is the hex HMAC-SHA1 of the ``x-mq-date-time`` value under the user's secret key (RocketMQ's
clients write upper-case hex, its server accepts either case; so does this one). Only the timestamp is signed, so a
header captured off the wire is a valid header: RocketMQ's server never looks at the timestamp and such a header
works for ever. Sluice refuses a timestamp more than ``window_s`` away from its own clock (15 minutes by default,
as AWS's SigV4 allows), which bounds a replay; TLS keeps headers off the wire in the first place (an authenticated
endpoint without TLS must be allowed explicitly).

The timestamp is read as UTC. RocketMQ's official clients format local time and append a literal ``Z``; on a
machine whose zone is not UTC their timestamps are hours off and are refused, unless the client runs with TZ=UTC
or the operator widens the window knowingly (docs/security.md).

Signatures are compared with ``hmac.compare_digest`` (constant time), on lower-cased hex of a fixed length.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
import re
from dataclasses import dataclass

from broker.errors import AuthenticationError, InvalidArgumentError

AUTHORIZATION_HEADER = "authorization"
DATE_TIME_HEADER = "x-mq-date-time"
ALGORITHM = "MQv2-HMAC-SHA1"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
DEFAULT_WINDOW_S = 15 * 60
# The broker's first super user, read at start (a broker with auth and no user refuses to start).
ROOT_ACCESS_KEY_ENV = "SLUICE_ROOT_ACCESS_KEY"
ROOT_SECRET_KEY_ENV = "SLUICE_ROOT_SECRET_KEY"
ACCESS_KEY_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
# A secret is any string of 1 to this many characters: long enough for any generated key, short enough that a
# user file stays small and an HMAC key never needs hashing first (HMAC-SHA1 hashes keys over 64 bytes).
MAX_SECRET_KEY_CHARS = 64
_SIGNATURE_HEX_CHARS = 40  # SHA-1: 20 bytes
# A header longer than this is not one a client wrote: refused before any parsing (the longest valid one is about
# 160 characters).
MAX_AUTHORIZATION_CHARS = 512
_HEADER = re.compile(
    rf"{re.escape(ALGORITHM)} Credential=(?P<credential>[^,\s]*), ?SignedHeaders=(?P<signed>[^,\s]*), ?"
    r"Signature=(?P<signature>[0-9A-Fa-f]*)"
)


@dataclass(frozen=True, slots=True)
class SignedHeader:
    """What an ``authorization`` header says: who (the access key), and the signature to check."""

    access_key: str
    signature_hex: str  # lower case


def validate_access_key(access_key: str) -> str:
    if not isinstance(access_key, str) or not ACCESS_KEY_PATTERN.fullmatch(access_key):
        raise InvalidArgumentError("an access key is 1 to 64 characters of letters, digits, '_', '.' and '-'")
    return access_key


def validate_secret_key(secret_key: str) -> str:
    if not isinstance(secret_key, str) or not 1 <= len(secret_key) <= MAX_SECRET_KEY_CHARS:
        raise InvalidArgumentError(f"a secret key is 1 to {MAX_SECRET_KEY_CHARS} characters")
    return secret_key


def format_date_time(at: dt.datetime) -> str:
    """``at`` (aware) as the header's ``yyyyMMddTHHmmssZ`` in UTC."""
    return at.astimezone(dt.UTC).strftime(DATE_TIME_FORMAT)


def sign(secret_key: str, date_time: str) -> str:
    """The hex signature of ``date_time`` under ``secret_key`` (upper case, as RocketMQ's clients write it)."""
    return hmac.new(secret_key.encode("utf-8"), date_time.encode("utf-8"), hashlib.sha1).hexdigest().upper()


def signed_metadata(access_key: str, secret_key: str, now: dt.datetime) -> tuple[tuple[str, str], tuple[str, str]]:
    """The two metadata entries that authenticate one request made at ``now``."""
    date_time = format_date_time(now)
    header = (
        f"{ALGORITHM} Credential={access_key}, SignedHeaders={DATE_TIME_HEADER}, "
        f"Signature={sign(secret_key, date_time)}"
    )
    return (DATE_TIME_HEADER, date_time), (AUTHORIZATION_HEADER, header)


def parse_header(value: str) -> SignedHeader:
    """The access key and signature of an ``authorization`` header; AuthenticationError saying what is wrong."""
    if len(value) > MAX_AUTHORIZATION_CHARS:
        raise AuthenticationError(f"the authorization header is over {MAX_AUTHORIZATION_CHARS} characters")
    m = _HEADER.fullmatch(value.strip())
    if m is None:
        raise AuthenticationError(
            f"malformed authorization header; expected '{ALGORITHM} Credential=<accessKey>, "
            f"SignedHeaders={DATE_TIME_HEADER}, Signature=<hex>'"
        )
    if m["signed"].lower() != DATE_TIME_HEADER:
        raise AuthenticationError(f"SignedHeaders must be {DATE_TIME_HEADER}, not {m['signed'][:40]!r}")
    if not ACCESS_KEY_PATTERN.fullmatch(m["credential"]):
        raise AuthenticationError("malformed access key in the authorization header")
    if len(m["signature"]) != _SIGNATURE_HEX_CHARS:
        raise AuthenticationError(f"the signature must be {_SIGNATURE_HEX_CHARS} hex digits (HMAC-SHA1)")
    return SignedHeader(m["credential"], m["signature"].lower())


@functools.lru_cache(maxsize=256)
def _epoch_s(date_time: str) -> int | None:
    """Seconds since the epoch of a ``yyyyMMddTHHmmssZ`` timestamp; None when it is not one. Cached: every client
    sends the same value for a whole second, and strptime costs some 15 us a call."""
    if len(date_time) != 16 or date_time[8] != "T" or date_time[15] != "Z" or not date_time[:8].isdigit():
        return None
    if not (date_time[9:15].isascii() and date_time[9:15].isdigit()):
        return None
    try:
        at = dt.datetime(int(date_time[0:4]), int(date_time[4:6]), int(date_time[6:8]), int(date_time[9:11]),
                         int(date_time[11:13]), int(date_time[13:15]), tzinfo=dt.UTC)
    except ValueError:  # a month 13, a second 61...
        return None
    return int(at.timestamp())


def check_date_time(date_time: str | None, now: dt.datetime, window_s: float) -> None:
    """AuthenticationError unless ``date_time`` is a header timestamp within ``window_s`` of ``now``."""
    if not date_time:
        raise AuthenticationError(f"the {DATE_TIME_HEADER} header is missing; it is what the signature signs")
    signed_at_s = _epoch_s(date_time)
    if signed_at_s is None:
        raise AuthenticationError(
            f"malformed {DATE_TIME_HEADER} {date_time[:40]!r}; expected yyyyMMddTHHmmssZ in UTC"
        )
    skew_s = abs(now.timestamp() - signed_at_s)
    if skew_s > window_s:
        raise AuthenticationError(
            f"the request was signed {skew_s:.0f} s away from the broker's clock, over the {window_s:.0f} s window: "
            "a replayed header, or a clock (or time zone: the timestamp is UTC) that is off"
        )


def signature_matches(secret_key: str, date_time: str, signature_hex: str) -> bool:
    """Constant-time comparison of the expected and the given signature (both lower-case hex)."""
    return hmac.compare_digest(sign(secret_key, date_time).lower(), signature_hex)
