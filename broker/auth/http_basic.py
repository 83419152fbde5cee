"""Who may scrape a broker's metrics when auth is on: HTTP Basic credentials (what Prometheus's ``basic_auth``
sends), a user's access key and secret key, and ``Get`` on the Cluster (or a super user).

The metrics port speaks HTTP, not gRPC, so the signed header of the client port does not apply; Basic sends the
secret itself on every request, which is why it is accepted only over HTTPS unless the broker allows plain-text
auth. Secrets are compared in constant time.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress

from broker.auth.accounts import Accounts
from broker.auth.policy import CLUSTER, Action, allows, need

MAX_HEADER_CHARS = 512


def metrics_access(accounts: Accounts, header: str | None, peer_host: str) -> int:
    """The HTTP status for a scrape with this ``Authorization`` header: 200, 401 (no or bad credentials) or 403."""
    if not header or len(header) > MAX_HEADER_CHARS or not header.startswith("Basic "):
        return 401
    try:
        access_key, sep, secret_key = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return 401
    user = accounts.user(access_key) if sep else None
    if user is None or not user.enabled or not hmac.compare_digest(user.secret_key.encode(), secret_key.encode()):
        return 401
    if user.super_user:
        return 200
    try:
        source: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(peer_host)
    except ValueError:
        source = None
    return 200 if allows(accounts.entries(access_key), need(CLUSTER, Action.GET), source) else 403
