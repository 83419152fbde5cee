"""Who may scrape a broker's metrics when auth is on: HTTP Basic credentials (what Prometheus's ``basic_auth``
sends), a user's access key and secret key, and ``Get`` on the Cluster (or a super user).

The metrics port speaks HTTP, not gRPC, so the signed header of the client port does not apply; Basic sends the
secret itself on every request, which is why it is accepted only over HTTPS unless the broker allows plain-text
auth. Secrets are compared in constant time, an unknown access key's too (with a random one), and every failure
is the same 401.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import secrets

from broker.auth.accounts import Accounts
from broker.auth.policy import CLUSTER, Action, allows, need

MAX_HEADER_CHARS = 512
_NO_USER_SECRET = secrets.token_hex(16)  # what an unknown access key's secret is compared with: matches nothing


def metrics_access(accounts: Accounts, header: str | None, peer_host: str) -> int:
    """The HTTP status for a scrape with this ``Authorization`` header: 200, 401 (no or bad credentials) or 403."""
    if not header or len(header) > MAX_HEADER_CHARS or not header.startswith("Basic "):
        return 401
    try:
        access_key, sep, secret_key = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return 401
    user = accounts.user(access_key) if sep else None
    expected = user.secret_key if user is not None else _NO_USER_SECRET  # compared either way: same timing
    matches = hmac.compare_digest(expected.encode(), secret_key.encode())
    if user is None or not user.enabled or not matches:
        return 401
    if user.super_user:
        return 200
    try:
        source: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(peer_host)
    except ValueError:
        source = None
    return 200 if allows(accounts.entries(access_key), need(CLUSTER, Action.GET), source) else 403
