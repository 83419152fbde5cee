"""Replication settings of a broker, checked before anything starts (the fields live in broker.config.BrokerConfig).

* ``role`` (""): classic mode, ``ASYNC_MASTER``, ``SYNC_MASTER`` or ``SLAVE`` (RocketMQ's names); "": none.
* ``controller`` (""): ``etcd://HOST:PORT[,HOST:PORT...]``, controller mode (automatic failover): every replica is
  started the same way and etcd decides who is master.
* ``ha_listen`` (""): HOST:PORT of the replication endpoint; "": the client listen host, client port + 1 (a free
  port when the client port is 0).
* ``ha_master_address`` (""): classic slave, the master's replication endpoint; "": learned from the name servers.
* ``ha_secret_file`` (""): a file holding the group's shared secret (auth.py); required unless the replication
  endpoint is on a loopback address, and always with ``auth_enabled``: without it the replication port is
  unauthenticated, and any process that reaches it (any local user, on loopback) could pose as a replica and read
  every topic's messages from the log, around the users' rights. Refused when group or others can
  read it (broker/private_file.py).
* ``min_insync_replicas`` (2): SYNC_MASTER and controller mode, writes are refused while fewer replicas (the master
  counts) are in sync.
* ``ha_max_lag_ms`` (5000): a replica not caught up with the master for this long leaves the in-sync set.
* ``ha_ack_timeout_ms`` (5000): longest a write waits for the in-sync replicas; then FLUSH_SLAVE_TIMEOUT.
* ``ha_lease_ttl_s`` (5): controller mode, the etcd lease of each replica; a master not heard from for this long
  is replaced.
* ``allow_unclean_election`` (false): controller mode, elect a live replica outside the in-sync set when no member
  of it is alive (acknowledged messages it lacks are lost).
* ``ha_metadata_sync_ms`` (200): how often a master sends changed config files to its slaves.
* ``etcd_ca_file``, ``etcd_cert_file``, ``etcd_key_file``, ``etcd_user``, ``etcd_password_file``: controller
  mode, how the broker reaches etcd (TLS, a client certificate, an etcd user): etcd_security.py.
* ``tls``: the broker's TLS settings (tls_cert, tls_key, tls_ca, tls_client_auth), not a setting of its own: with
  them the replication endpoint serves TLS and a replica connects to its master over TLS, presenting the broker's
  certificate (broker/server/server_tls.py). The shared secret is still required off loopback: TLS keeps the stream
  private, the secret proves the peer is a replica of this group.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.errors import InvalidArgumentError
from broker.ha.etcd_security import EtcdSecurity
from broker.private_file import refuse_if_shared

if TYPE_CHECKING:
    from broker.server.server_tls import ServerTls

ASYNC_MASTER, SYNC_MASTER, SLAVE = "ASYNC_MASTER", "SYNC_MASTER", "SLAVE"
ROLES = (ASYNC_MASTER, SYNC_MASTER, SLAVE)
CONTROLLER_SCHEME = "etcd://"
MAX_REPLICAS = 16  # replicas of one group; each slave holds a stream and a thread on the master
MAX_SECRET_BYTES = 4096
MIN_SECRET_BYTES = 16  # shorter secrets are guessable; 16 random bytes are 128 bits
MAX_LEASE_TTL_S = 600
MAX_ETCD_ENDPOINTS = 16


@dataclass(frozen=True)
class ReplicationSettings:
    role: str  # ASYNC_MASTER | SYNC_MASTER | SLAVE in classic mode; "" in controller mode (decided by etcd)
    controller: tuple[tuple[str, int], ...]  # etcd endpoints; () in classic mode
    ha_listen: tuple[str, int]
    ha_master_address: str
    secret: bytes
    min_insync_replicas: int
    max_lag_ms: int
    ack_timeout_ms: int
    lease_ttl_s: int
    allow_unclean_election: bool
    metadata_sync_ms: int
    tls: ServerTls | None = None  # the broker's (BrokerConfig.replication sets it)
    etcd: EtcdSecurity = field(default_factory=EtcdSecurity)  # controller mode: TLS and credentials for etcd

    @property
    def controller_mode(self) -> bool:
        return bool(self.controller)

    @property
    def waits_for_replicas(self) -> bool:
        """Acknowledgements wait for the in-sync set (SYNC_MASTER, and every master in controller mode)."""
        return self.controller_mode or self.role == SYNC_MASTER


def parse_controller(text: str) -> tuple[tuple[str, int], ...]:
    from broker.address import parse_listen

    if not text.startswith(CONTROLLER_SCHEME):
        raise InvalidArgumentError(f"controller {text[:60]!r} must be {CONTROLLER_SCHEME}HOST:PORT[,HOST:PORT...]")
    items = [t.strip() for t in text[len(CONTROLLER_SCHEME) :].split(",") if t.strip()]
    if not items or len(items) > MAX_ETCD_ENDPOINTS:
        raise InvalidArgumentError(f"controller {text[:60]!r}: name 1..{MAX_ETCD_ENDPOINTS} etcd endpoints")
    out = []
    for item in items:
        host, port = parse_listen(item, 2379)
        if port == 0 or host in ("0.0.0.0", "::"):
            raise InvalidArgumentError(f"etcd endpoint {item!r} must name a host and a port other than 0")
        out.append((host, port))
    return tuple(out)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_secret(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())  # the file read, not whatever the path names by then
            if info.st_size > MAX_SECRET_BYTES:
                raise InvalidArgumentError(
                    f"ha_secret_file {path} is {info.st_size} bytes; a secret is at most {MAX_SECRET_BYTES}"
                )
            refuse_if_shared(path, "ha_secret_file", info)
            secret = f.read(MAX_SECRET_BYTES).strip()
    except OSError as e:
        raise InvalidArgumentError(f"cannot read ha_secret_file {path}: {e.strerror}") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise InvalidArgumentError(
            f"ha_secret_file {path} holds {len(secret)} bytes; use at least {MIN_SECRET_BYTES} random bytes "
            "(e.g. `(umask 077; head -c 32 /dev/urandom | base64 > FILE)`), the same file on every replica of the group"
        )
    return secret


def from_config(
    *, role: str, controller: str, ha_listen: str, listen: tuple[str, int], ha_master_address: str,
    ha_secret_file: str, min_insync_replicas: int, ha_max_lag_ms: int, ha_ack_timeout_ms: int, ha_lease_ttl_s: int,
    allow_unclean_election: bool, ha_metadata_sync_ms: int, broker_id: int, read_files: bool = True,
    auth_enabled: bool = False,
) -> ReplicationSettings | None:
    """The settings, or None for a broker without replication; InvalidArgumentError naming the first bad one.
    ``read_files=False`` checks everything but the secret file's content (a config validated before the file is
    readable)."""
    from broker.config import parse_host_port

    if role and role not in ROLES:
        raise InvalidArgumentError(f"role {role!r} must be one of {', '.join(ROLES)} (or empty: no replication)")
    endpoints = parse_controller(controller) if controller else ()
    if endpoints and role:
        raise InvalidArgumentError(
            f"role {role} is for classic mode; in controller mode ({controller}) etcd decides who is master: "
            "start every replica the same way, without --role"
        )
    if endpoints and broker_id < 1:
        raise InvalidArgumentError(
            "in controller mode give each replica of a group its own --broker-id of 1 or more: the master registers "
            "as broker id 0 whichever replica it is"
        )
    if not role and not endpoints:
        if ha_listen or ha_master_address:
            raise InvalidArgumentError("ha_listen / ha_master_address need a role or a controller")
        return None
    if not 1 <= min_insync_replicas <= MAX_REPLICAS:
        raise InvalidArgumentError(f"min_insync_replicas is {min_insync_replicas}; it must be in 1..{MAX_REPLICAS}")
    for name, value in (("ha_max_lag_ms", ha_max_lag_ms), ("ha_ack_timeout_ms", ha_ack_timeout_ms),
                        ("ha_metadata_sync_ms", ha_metadata_sync_ms)):
        if value <= 0:
            raise InvalidArgumentError(f"{name} is {value}; it must be a positive number of milliseconds")
    if not 2 <= ha_lease_ttl_s <= MAX_LEASE_TTL_S:  # etcd grants no lease shorter than about 2 s by default
        raise InvalidArgumentError(f"ha_lease_ttl_s is {ha_lease_ttl_s}; it must be in 2..{MAX_LEASE_TTL_S} seconds")
    if ha_listen:
        ha_host, ha_port = parse_host_port(ha_listen)
    else:
        ha_host, ha_port = listen[0], (listen[1] + 1 if listen[1] else 0)
    if ha_port > 65535:
        raise InvalidArgumentError(f"the replication port (client port + 1) would be {ha_port}; set ha_listen")
    if ha_master_address:
        parse_host_port(ha_master_address)
    secret = b""
    if ha_secret_file:
        secret = read_secret(ha_secret_file) if read_files else b"?" * MIN_SECRET_BYTES
    elif auth_enabled:
        raise InvalidArgumentError(
            "a replicated broker with auth_enabled (--auth) needs the group's shared secret (ha_secret_file): "
            "without it the replication port asks for no proof, and any process that reaches it, on loopback any "
            "local user, could pose as a replica and read every topic from the log around the users' rights"
        )
    elif not is_loopback(ha_host):
        raise InvalidArgumentError(
            f"the replication endpoint {ha_host}:{ha_port} is not a loopback address: give the group's replicas a "
            "shared secret with ha_secret_file (--ha-secret-file), or anyone who reaches the port could pose as a "
            "replica and acknowledge writes nobody holds (apache/rocketmq 3015)"
        )
    return ReplicationSettings(
        role=role, controller=endpoints, ha_listen=(ha_host, ha_port), ha_master_address=ha_master_address,
        secret=secret, min_insync_replicas=min_insync_replicas, max_lag_ms=ha_max_lag_ms,
        ack_timeout_ms=ha_ack_timeout_ms, lease_ttl_s=ha_lease_ttl_s, allow_unclean_election=allow_unclean_election,
        metadata_sync_ms=ha_metadata_sync_ms,
    )
