"""CHECK_TRANSACTION_STATE (39, broker to producer): the broker's check-back of an open transaction reaches 4.x
producers over their remoting connections.

A RocketMQ broker asks a live producer of the half message's group, over a connection that producer opened, what
became of a transaction left open too long; the producer answers with END_TRANSACTION, ``fromTransactionCheck``
true. Here the connections of a producer group are known from the group's heartbeats: ``HEART_BEAT``'s
``producerDataSet`` names the groups a client produces for, and the connection it came on is kept for each group
(``UNREGISTER_CLIENT`` with ``producerGroup`` forgets it; a closed connection, or one whose last heartbeat is older
than ``PRODUCER_EXPIRE_S``, is dropped). The broker's check-back loop calls :meth:`RemotingProducers.check` for each
transaction it checks (BrokerController._check_back): when one of the group's connections may take the check, it
is sent there, one-way, round-robin over the group's connections, and the check counts as asked; otherwise the
check goes on to the other fronts' producers.

The check: header ``tranStateTableOffset`` (the half's queue offset), ``commitLogOffset`` (the half's, which the
producer echoes in its END_TRANSACTION), ``msgId`` (the message's UNIQ_KEY), ``transactionId`` (Sluice's id of the
transaction) and ``offsetMsgId``; body the half in the stored layout (message_entry.py) with its real topic and
queue, as the producer sent it, and ``PGROUP`` set (a 4.x client picks the producer by it).

With auth on, a check goes only to a connection whose user, when the check is sent, may end the group's
transactions and publish to the half's real topic (the check carries the half's body), the rule of the gRPC check
streams (broker/server/transaction_processor.py).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass, replace

from broker.auth import policy
from broker.auth.caller import Caller
from broker.auth.operations import Operation, needs_of
from broker.auth.policy import Action, need
from broker.errors import BrokerError, InvalidArgumentError
from broker.format.message import Prop, StoredMessage
from broker.remoting import fastjson
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_entry import encode_stored, offset_msg_id
from broker.remoting.message_ids import RemotingIds
from broker.remoting.message_outcomes import Access
from broker.remoting.processor import Answer, Peer, Processor, RequestContext

log = logging.getLogger(__name__)

CHECK_TRANSACTION_STATE = RequestCode.CHECK_TRANSACTION_STATE
# A producer heartbeats every 30 s; RocketMQ drops a producer channel silent for 120 s (four missed heartbeats).
PRODUCER_EXPIRE_S = 120.0
# Producer connections remembered, all groups together: each costs a table entry; a broker serves a few thousand
# clients (the transport's connection limit is 4096), so past this a new one is not recorded (its group's checks
# then go to the other connections of the group, or to the other fronts).
MAX_PRODUCER_ENTRIES = 16_384
# Java clients list this group in every heartbeat (the producer inside each consumer); it ends no transaction.
CLIENT_INNER_PRODUCER = "CLIENT_INNER_PRODUCER"


@dataclass
class _Producer:
    peer: Peer  # held here, so its id() (the table's key) is not reused while the entry lives
    caller: Caller | None
    seen: float  # time.monotonic() of its last heartbeat


def _closed(peer: Peer) -> bool:
    return bool(getattr(peer, "closed", False))


def _as_sent(half: StoredMessage, group: str) -> StoredMessage:
    """The half as its producer sent it: its real topic and queue, and its producer group."""
    props = dict(half.properties)
    topic = props.pop(Prop.REAL_TOPIC, half.topic)
    qid = props.pop(Prop.REAL_QID, "")
    props.setdefault(Prop.PGROUP, group)
    return replace(half, topic=topic, queue_id=int(qid) if qid.isdigit() else half.queue_id, properties=props)


def check_command(group: str, txn_id: str, half: StoredMessage, ids: RemotingIds | None = None) -> RemotingCommand:
    """The CHECK_TRANSACTION_STATE request for one transaction (module docstring); ``ids``: the remoting address
    the offset id and the half's store host name (message_ids.py), as the send's answer named it."""
    sent = _as_sent(half, group)
    offset_id = ids.msg_id(half.commitlog_offset) if ids else offset_msg_id(half.store_host, half.commitlog_offset)
    ext = {
        "tranStateTableOffset": str(half.queue_offset),
        "commitLogOffset": str(half.commitlog_offset),
        "msgId": half.properties.get(Prop.UNIQ_KEY) or offset_id,
        "transactionId": txn_id,
        "offsetMsgId": offset_id,
    }
    body = encode_stored(sent)
    return RemotingCommand(CHECK_TRANSACTION_STATE, ext_fields=ext, body=ids.served(body) if ids else body)


class RemotingProducers:
    """The producer groups' remoting connections; thread-safe."""

    def __init__(self, access: Access, expire_s: float = PRODUCER_EXPIRE_S, ids: RemotingIds | None = None) -> None:
        self.access = access
        self.ids = ids
        self.expire_s = expire_s
        self._lock = threading.Lock()
        self._groups: dict[str, dict[int, _Producer]] = {}  # group -> id(peer) -> producer
        self._turn = itertools.count()

    def heard(self, groups: list[str], context: RequestContext) -> None:
        """A heartbeat naming ``groups`` came on ``context``'s connection."""
        caller = self.access.caller(context)
        now = time.monotonic()
        with self._lock:
            self._prune_locked(now)
            count = sum(len(ps) for ps in self._groups.values())
            for group in groups:
                known = self._groups.setdefault(group, {})
                key = id(context.peer)
                if key not in known and count >= MAX_PRODUCER_ENTRIES:
                    log.warning("remoting: %d producer connections known; %s of %r not recorded for check-backs",
                                count, context.peer.address, group)
                    continue
                count += key not in known
                known[key] = _Producer(context.peer, caller, now)

    def forget(self, group: str, peer: Peer) -> None:
        with self._lock:
            known = self._groups.get(group)
            if known is not None:
                known.pop(id(peer), None)
                if not known:
                    del self._groups[group]

    def live(self, group: str) -> int:
        with self._lock:
            self._prune_locked(time.monotonic())
            return len(self._groups.get(group, {}))

    def _prune_locked(self, now: float) -> None:
        for group in list(self._groups):
            known = self._groups[group]
            for key in [k for k, e in known.items() if _closed(e.peer) or now - e.seen > self.expire_s]:
                del known[key]
            if not known:
                del self._groups[group]

    def check(self, group: str, txn_id: str, half: StoredMessage) -> bool:
        """Send the check to one of the group's connections that may take it; False when there is none."""
        with self._lock:
            self._prune_locked(time.monotonic())
            listing = list(self._groups.get(group, {}).values())
        real_topic = half.properties.get(Prop.REAL_TOPIC) or half.topic
        needs = [need(policy.topic(real_topic), Action.PUB), *needs_of(Operation.END_TRANSACTION, producer_group=group)]
        peers = [e.peer for e in listing if e.caller is None or all(e.caller.allows(n) for n in needs)]
        if not peers:
            return False
        peer = peers[next(self._turn) % len(peers)]
        peer.send_oneway(check_command(group, txn_id, half, self.ids))
        log.info("transaction %s: checked back with producer %s of %r over remoting", txn_id, peer.address, group)
        return True


def producer_groups(body: bytes) -> list[str]:
    """The groups a HeartbeatData body's ``producerDataSet`` names (the client's own inner producer left out)."""
    try:
        data = fastjson.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InvalidArgumentError("heartbeat: the body is not HeartbeatData JSON") from None
    entries = data.get("producerDataSet") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return []
    names = (str(e.get("groupName") or "") for e in entries if isinstance(e, dict))
    return [n for n in dict.fromkeys(names) if n and n != CLIENT_INNER_PRODUCER]


class ProducerHeartbeat:
    """HEART_BEAT: the broker's own processing (client_processor.py), then the producer groups recorded for
    check-backs once it succeeded."""

    def __init__(self, inner: Processor, producers: RemotingProducers) -> None:
        self.inner, self.producers = inner, producers

    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        answer = self.inner.process(request, context)
        if isinstance(answer, RemotingCommand) and answer.code == WireCode.SUCCESS:
            try:
                self.producers.heard(producer_groups(request.body), context)
            except BrokerError as e:  # the heartbeat itself is answered; its producers are not checked back
                log.info("remoting heartbeat from %s: producers not recorded (%s)", context.peer.address, e.message)
        return answer


class ProducerUnregister:
    """UNREGISTER_CLIENT: a producer leaving its group (``producerGroup``) gets no more check-backs."""

    def __init__(self, inner: Processor, producers: RemotingProducers) -> None:
        self.inner, self.producers = inner, producers

    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        group = request.ext_fields.get("producerGroup")
        if group:
            self.producers.forget(group, context.peer)
        return self.inner.process(request, context)
