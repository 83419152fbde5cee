"""The RocketMQ 5 clients this broker knows: their settings, when they were last heard from, and their Telemetry
streams, through which the broker answers settings and sends transaction check-backs.

A client is known by its ``x-mq-client-id`` header (required on every call, as the RocketMQ proxy requires it).
Its settings arrive on its Telemetry stream; the broker keeps the last ones (a receive before any settings uses
the defaults: the proxy's NullPointerException there, apache/rocketmq 8133, is not repeated). A client unheard of
for ``expire_ms`` (heartbeats come every 10 s) is gone: its auto-renewed messages are released.

Check-backs: the RocketMQ proxy uses a transactional message's topic as its producer group, and so does this
broker; a half message whose group is a topic some live producer publishes to (its settings list the topic) is
checked back through that producer's stream with ``recover_orphaned_transaction_command``.

With auth on, a check-back goes only to a producer whose user may end the transaction, decided when the check is
sent (a right revoked since the settings arrived counts): Pub on the half's own topic, and when the producer group
is not that topic (a Sluice producer's transaction), Pub on ``Group:<producer group>`` too, as the Sluice
protocol's check stream needs. A stream that merely lists the topic gets nothing it could not have sent.

A client id belongs to the user whose call first named it (its owner) until the client is forgotten: a call of
another user naming it is refused with FORBIDDEN, so nobody can replace another client's settings, join its
stream or end it. At most ``max_clients`` are remembered, and one user's at most a quarter of them; past either, a
new client is refused with TOO_MANY_REQUESTS (clients unheard of for the expiry time are forgotten first).

Each open Telemetry stream holds a gRPC worker thread for its client's lifetime, so at most ``max_streams`` are
open; past that a stream is refused with TOO_MANY_REQUESTS and the client opens it again later.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as v2s

from broker.auth import policy
from broker.auth.caller import Caller, owner_of
from broker.auth.operations import Operation, needs_of
from broker.auth.policy import Action, need
from broker.errors import NoPermissionError, SystemBusyError
from broker.format.message import Prop, StoredMessage
from broker.rmqv2.convert import to_v2

log = logging.getLogger(__name__)

MAX_PENDING_COMMANDS = 10_000  # per stream: a client that stops reading loses commands, never broker memory
MAX_CLIENTS = 100_000  # clients remembered at once; each keeps its settings (a few hundred bytes)
# One user's clients: a quarter of the table, so that one credential (a client restarted in a loop with new ids, or
# an attacker making up ids) leaves three quarters to the others; a quarter of the default is 25,000 processes.
USER_SHARE = 4
Outbox = queue.Queue[Any]  # TelemetryCommand, or None to end the stream


@dataclass
class Client:
    client_id: str
    owner: str = ""  # the access key of the user whose call named it first; "" with auth off
    caller: Caller | None = None  # that user as of its last Telemetry stream, for the rights of a check-back
    last_seen: float = field(default_factory=time.monotonic)
    settings: Any = None  # the client's own Settings, as last sent
    streams: list[Outbox] = field(default_factory=list)
    terminated: bool = False


class ClientRegistry:
    """Thread-safe."""

    def __init__(self, *, expire_ms: int, max_streams: int, max_clients: int = MAX_CLIENTS) -> None:
        self.expire_s = expire_ms / 1000
        self.max_streams = max(1, max_streams)
        self.max_clients = max(1, max_clients)
        self.max_per_user = max(1, self.max_clients // USER_SHARE)
        self._lock = threading.Lock()
        self._clients: dict[str, Client] = {}
        self._per_owner: dict[str, int] = {}
        self._turn = itertools.count()
        self._closed = False

    def seen(self, client_id: str, caller: Caller | None = None) -> Client:
        """The client, heard from now; created for ``caller`` when new. NoPermissionError when another user owns
        the id, SystemBusyError when a new client would pass a limit (module docstring)."""
        with self._lock:
            c = self._get_locked(client_id, owner_of(caller))
            c.last_seen = time.monotonic()
            c.terminated = False
            return c

    def _get_locked(self, client_id: str, owner: str) -> Client:
        c = self._clients.get(client_id)
        if c is not None:
            if c.owner != owner:
                raise NoPermissionError(f"client id {client_id[:80]!r} is in use by another user; each client "
                                        "process needs an id of its own")
            return c
        if len(self._clients) >= self.max_clients or self._over_share_locked(owner):
            self._expire_locked()
        if len(self._clients) >= self.max_clients:
            raise SystemBusyError(f"this broker remembers {len(self._clients)} RocketMQ 5 clients, its limit "
                                  "(rmqv2_max_clients); retry once idle clients have expired")
        if self._over_share_locked(owner):
            raise SystemBusyError(f"user {owner!r} has {self._per_owner[owner]} RocketMQ 5 clients, at most "
                                  f"{self.max_per_user} per user (a quarter of rmqv2_max_clients); retry once idle "
                                  "clients have expired")
        c = self._clients[client_id] = Client(client_id, owner)
        self._per_owner[owner] = self._per_owner.get(owner, 0) + 1
        return c

    def _over_share_locked(self, owner: str) -> bool:
        """True when ``owner`` holds its share of the table already (no share with auth off: one owner, "")."""
        return bool(owner) and self._per_owner.get(owner, 0) >= self.max_per_user

    def _forget_locked(self, client_id: str) -> Client | None:
        c = self._clients.pop(client_id, None)
        if c is not None:
            left = self._per_owner.get(c.owner, 1) - 1
            if left > 0:
                self._per_owner[c.owner] = left
            else:
                self._per_owner.pop(c.owner, None)
        return c

    def count(self) -> int:
        with self._lock:
            return len(self._clients)

    def owner(self, client_id: str) -> str | None:
        with self._lock:
            c = self._clients.get(client_id)
            return c.owner if c is not None else None

    def settings(self, client_id: str) -> Any:
        with self._lock:
            c = self._clients.get(client_id)
            return c.settings if c else None

    def update_settings(self, client_id: str, settings: Any, caller: Caller | None = None) -> None:
        c = self.seen(client_id, caller)
        c.settings = settings
        c.caller = caller

    def alive(self, client_id: str) -> bool:
        with self._lock:
            c = self._clients.get(client_id)
            return c is not None and not c.terminated and time.monotonic() - c.last_seen < self.expire_s

    def terminate(self, client_id: str) -> None:
        with self._lock:
            c = self._forget_locked(client_id)
        if c is not None:
            c.terminated = True
            for outbox in c.streams:
                _offer(outbox, None)

    def expire(self) -> list[str]:
        """Forget clients unheard of for the expiry time; their ids (so their messages can be released)."""
        with self._lock:
            return self._expire_locked()

    def _expire_locked(self) -> list[str]:
        now = time.monotonic()
        gone = [cid for cid, c in self._clients.items() if not c.streams and now - c.last_seen >= self.expire_s]
        for cid in gone:
            self._forget_locked(cid)
        return gone

    # ------------------------------------------------------------------------------------------ streams
    def open_stream(self, client_id: str, caller: Caller | None = None) -> Outbox:
        outbox: Outbox = queue.Queue(MAX_PENDING_COMMANDS)
        with self._lock:
            if self.open_count_locked() >= self.max_streams:
                raise SystemBusyError(
                    f"{self.max_streams} Telemetry streams are open, this broker's limit (each holds a worker thread; "
                    "raise grpc_max_workers); the client opens it again later"
                )
            c = self._get_locked(client_id, owner_of(caller))
            if self._closed:
                outbox.put(None)
            c.caller = caller
            c.streams.append(outbox)
        return outbox

    def close_stream(self, client_id: str, outbox: Outbox) -> None:
        with self._lock:
            c = self._clients.get(client_id)
            if c is not None and outbox in c.streams:
                c.streams.remove(outbox)
                c.last_seen = time.monotonic()

    def open_count(self) -> int:
        with self._lock:
            return self.open_count_locked()

    def open_count_locked(self) -> int:
        return sum(len(c.streams) for c in self._clients.values())

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            outboxes = [o for c in self._clients.values() for o in c.streams]
        for o in outboxes:
            _offer(o, None)

    # ------------------------------------------------------------------------------------------ check-backs
    def check(self, group: str, txn_id: str, half: StoredMessage) -> bool:
        """Send a check-back to one live producer publishing to ``group`` (a topic) whose user may end the
        transaction (module docstring); False when there is none."""
        with self._lock:
            listing = [
                (c.caller, o) for c in self._clients.values() if c.settings is not None
                and c.settings.HasField("publishing") and any(t.name == group for t in c.settings.publishing.topics)
                for o in c.streams
            ]
        real = _as_real(half)
        # A check-back hands the half's body to the client and lets it end the transaction: Pub on the topic, and
        # what ending needs (operations.py: Pub on the transaction's group, a v2 transaction's being its topic's).
        needs = [need(policy.topic(real.topic), Action.PUB), *needs_of(Operation.END_TRANSACTION, producer_group=group)]
        candidates = [o for caller, o in listing if caller is None or all(caller.allows(n) for n in needs)]
        if not candidates:
            return False
        message = to_v2(real)
        command = v2s.TelemetryCommand(
            recover_orphaned_transaction_command=v2s.RecoverOrphanedTransactionCommand(
                message=message, transaction_id=txn_id
            )
        )
        target = candidates[next(self._turn) % len(candidates)]
        if not _offer(target, command):
            log.warning("transaction %s: producer stream of %r is not reading; check skipped", txn_id, group)
        return True


def _offer(outbox: Outbox, item: Any) -> bool:
    try:
        outbox.put_nowait(item)
        return True
    except queue.Full:
        return False


def _as_real(half: StoredMessage) -> StoredMessage:
    """A half message as its producer sent it: its real topic and queue."""
    props = dict(half.properties)
    topic = props.get(Prop.REAL_TOPIC, half.topic)
    qid = props.get(Prop.REAL_QID, "")
    return StoredMessage(topic, int(qid) if qid.isdigit() else half.queue_id, half.queue_offset, half.commitlog_offset,
                         half.body, props, half.flag, half.sys_flag, half.born_timestamp, half.born_host,
                         half.store_timestamp, half.store_host, half.reconsume_times, 0, half.store_size,
                         half.msg_id)


def settings_kind(settings: Any) -> str:
    return "" if settings is None else str(settings.WhichOneof("pub_sub") or "")


__all__ = ["Client", "ClientRegistry", "settings_kind", "v2"]
