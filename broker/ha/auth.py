"""Who may replicate: only the group's own replicas (apache/rocketmq 3015 and 1155: anyone who reached the HA port
could pose as a slave, report a large offset and make a SYNC_MASTER acknowledge writes nobody else held).

With a shared secret (``ha_secret_file``) both sides prove they know it, each over a fresh nonce of the other, so
a recorded exchange cannot be replayed and a stranger can pose as neither slave nor master:

* the slave sends Hello with its nonce; the master answers with its own nonce (Challenge);
* the slave answers ``HMAC-SHA256(secret, "sluice-ha-v1 slave" | master nonce | slave nonce | Hello bytes)``: the
  Hello (group, id, offsets, epochs) is covered, so it cannot be changed in flight;
* the master checks it in constant time (``hmac.compare_digest``) and answers, in its Handshake,
  ``HMAC-SHA256(secret, "sluice-ha-v1 master" | slave nonce | master nonce)``, which the slave checks the same way
  before it writes a byte it receives.

Without a secret (an endpoint on a loopback address only, replication_settings.py refuses any other) the proofs are
empty and the group name in Hello is the only check. The proofs do not encrypt the stream: the broker's TLS settings do
(broker/server/server_tls.py), with mutual TLS when tls_client_auth is require.
"""

from __future__ import annotations

import hashlib
import hmac
import os

NONCE_BYTES = 16
_SLAVE = b"sluice-ha-v1 slave"
_MASTER = b"sluice-ha-v1 master"


def nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def slave_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes, hello: bytes) -> bytes:
    return hmac.new(secret, _SLAVE + server_nonce + client_nonce + hello, hashlib.sha256).digest()


def master_proof(secret: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return hmac.new(secret, _MASTER + client_nonce + server_nonce, hashlib.sha256).digest()


def same(expected: bytes, given: bytes) -> bool:
    """Constant-time comparison: how long it takes says nothing about how much of a guess was right."""
    return hmac.compare_digest(expected, given)
