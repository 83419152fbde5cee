"""sluice.v1's transaction check-back streams (``TransactionCheckStream``), the gRPC front's side of check-back.

RocketMQ's broker sends CHECK_TRANSACTION_STATE to one live producer of the half message's group over the
producer's connection. Here a transactional producer keeps a server-streaming call open; ``CheckHub`` keeps one
bounded queue per open stream, grouped by producer group, and the TransactionService's checker puts the check on one
of them (round-robin) and returns None ("asked"): the producer answers later with ``EndTransaction(from_check=true)``.
A group with no live producer is not asked; the check still counts, so a transaction whose producer never comes
back is rolled back after ``check_max`` checks.

With auth on, a check goes only to a stream whose user, when the check is sent, may end the transaction and publish
to the half's real topic (the check carries the half's body): a right on a producer group that several producers
share is no right to read the topics the others write, and a right revoked while the stream is open stops its
checks (the same rule as a RocketMQ 5 producer's, broker/rmqv2/clients.py).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import weakref
from collections.abc import Callable, Iterator

import grpc

from broker.auth import policy
from broker.auth.caller import Caller, current_caller
from broker.auth.operations import Operation, authorize, needs_of
from broker.auth.policy import Action, need
from broker.errors import InvalidArgumentError, SystemBusyError, shown
from broker.format.message import Prop, StoredMessage
from broker.format.send_checks import validate_producer_group
from broker.proto import sluice_pb2 as pb
from broker.semantics import TxState
from broker.server.admin_processor import encode_stored

log = logging.getLogger(__name__)

MAX_PENDING_CHECKS = 10_000  # per stream: a producer that stops reading loses checks, never broker memory
STREAM_POLL_S = 1.0  # how often an idle stream looks whether its client went away
MAX_CLIENT_ID_CHARS = 255  # a producer's id, logged when its stream opens


class CheckHub:
    """Open check streams per producer group; thread-safe. Each open stream holds a gRPC worker thread for as
    long as its producer lives, so at most ``max_streams`` are open at once (the held-pull budget counts them too):
    past that, a stream is refused with SYSTEM_BUSY and its producer opens it again later."""

    def __init__(self, max_streams: int = 1 << 30) -> None:
        if max_streams < 1:
            raise InvalidArgumentError(f"max_streams={max_streams}: at least one check stream must be possible")
        self.max_streams = max_streams
        self._lock = threading.Lock()
        self._streams: dict[str, list[queue.Queue[pb.TransactionCheckRequest | None]]] = {}
        self._callers: dict[int, Caller] = {}  # id of a stream's queue -> its user (with auth on)
        self._turn = itertools.count()
        self._closed = False
        # The store's entry at a commit-log offset, as stored (set once the store runs): a check carries the half
        # exactly as it lies in the log, as pulls and queries do.
        self.read_entry: Callable[[int], bytes | None] | None = None

    def open(self, group: str, caller: Caller | None = None) -> queue.Queue[pb.TransactionCheckRequest | None]:
        """``caller``: the stream's user, whose rights each check is decided on (module docstring)."""
        q: queue.Queue[pb.TransactionCheckRequest | None] = queue.Queue(MAX_PENDING_CHECKS)
        with self._lock:
            opened = self._open_locked()
            if opened >= self.max_streams:
                raise SystemBusyError(
                    f"{opened} transaction check streams are open, this broker's limit (each holds a worker "
                    "thread: half of grpc_max_workers - grpc_reserved_workers); the producer opens it again later, "
                    "or raise grpc_max_workers"
                )
            if self._closed:
                q.put(None)
            self._streams.setdefault(group, []).append(q)
            if caller is not None:
                self._callers[id(q)] = caller
        return q

    def close_stream(self, group: str, q: queue.Queue[pb.TransactionCheckRequest | None]) -> None:
        with self._lock:
            streams = self._streams.get(group, [])
            if q in streams:
                streams.remove(q)
                self._callers.pop(id(q), None)
            if not streams:
                self._streams.pop(group, None)

    def live(self, group: str) -> int:
        with self._lock:
            return len(self._streams.get(group, []))

    def open_count(self) -> int:
        """Streams open, all groups (each holds a gRPC worker)."""
        with self._lock:
            return self._open_locked()

    def _open_locked(self) -> int:
        return sum(len(qs) for qs in self._streams.values())

    def check(self, group: str, txn_id: str, half: StoredMessage) -> TxState | None:
        """The TransactionService's checker: hand the check to one live producer of the group."""
        with self._lock:
            listing = [(self._callers.get(id(q)), q) for q in self._streams.get(group, [])]
        real_topic = half.properties.get(Prop.REAL_TOPIC) or half.topic  # a half's, or an in-place entry's own
        needs = [need(policy.topic(real_topic), Action.PUB), *needs_of(Operation.END_TRANSACTION, producer_group=group)]
        streams = [q for caller, q in listing if caller is None or all(caller.allows(n) for n in needs)]
        if not streams:
            log.info("transaction %s: no live producer of group %r (allowed to read %r) to check back with", txn_id,
                     group, real_topic)
            return None
        target = streams[next(self._turn) % len(streams)]
        raw = self.read_entry(half.commitlog_offset) if self.read_entry is not None else None
        request = pb.TransactionCheckRequest(
            transaction_id=txn_id, producer_group=group, half_commitlog_offset=half.commitlog_offset,
            half_entry=raw if raw is not None else encode_stored(half),
        )
        try:
            target.put_nowait(request)
        except queue.Full:
            log.warning("transaction %s: producer of group %r is not reading its checks; skipped", txn_id, group)
        return None

    def shutdown(self) -> None:
        """End every stream (before the gRPC server stops, which waits for open calls)."""
        with self._lock:
            self._closed = True
            everything = [q for qs in self._streams.values() for q in qs]
        for q in everything:
            try:
                q.put_nowait(None)
            except queue.Full:
                pass  # a full queue's reader is gone or stuck; its call ends with the server's grace period


def open_check_stream(
    hub: CheckHub, request: pb.TransactionCheckSubscribe, context: grpc.ServicerContext
) -> Iterator[pb.TransactionCheckRequest]:
    """Open the stream now (SystemBusyError past the limit, before any response), then serve it. The caller
    receives the check-backs of the producer group's transactions: Pub on the group."""
    authorize(Operation.CHECK_TRANSACTIONS, producer_group=request.producer_group)
    validate_producer_group(request.producer_group)
    if len(request.client_id) > MAX_CLIENT_ID_CHARS:
        raise InvalidArgumentError(
            f"client_id {shown(request.client_id)} is over {MAX_CLIENT_ID_CHARS} characters; it names the producer"
        )
    q = hub.open(request.producer_group, current_caller())
    log.info("producer %s of %s opened a transaction check stream", request.client_id, request.producer_group)
    stream = _serve_stream(hub, request, context, q)
    # A call cancelled before gRPC first iterates the stream never runs its ``finally``: the stream is closed
    # when the generator is dropped, too (close_stream does nothing the second time).
    weakref.finalize(stream, hub.close_stream, request.producer_group, q)
    return stream


def _serve_stream(
    hub: CheckHub,
    request: pb.TransactionCheckSubscribe,
    context: grpc.ServicerContext,
    q: queue.Queue[pb.TransactionCheckRequest | None],
) -> Iterator[pb.TransactionCheckRequest]:
    try:
        while context.is_active():
            try:
                item = q.get(timeout=STREAM_POLL_S)
            except queue.Empty:
                continue
            if item is None:
                return
            yield item
    finally:
        hub.close_stream(request.producer_group, q)
