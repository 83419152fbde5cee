"""The replication endpoint (``--ha-listen``): the master's side of the Replication service (ha.proto).

Every replica runs it; only the group's current master serves it (others answer NOT_MASTER). A slave:

1. Open: its Hello must name the same cluster and broker group, another broker id, the same commit-log file size
   (offsets name the same files) and a protocol version this broker speaks. The answer: a handshake id and a nonce.
   Nothing else happens before the peer proved the group's secret: the handshake waits in a table of its own
   (``Unproven``: at most MAX_UNPROVEN, MAX_UNPROVEN_PER_SOURCE from one source address, each for
   UNPROVEN_TIMEOUT_S), apart from the replica sessions, so strangers can neither fence this master with a made-up
   epoch nor take the replicas' places. A source over its limit is refused with SYSTEM_BUSY.
2. Join: with a secret, the slave's proof is checked first, in constant time (auth.py). Only a proven peer goes
   on: a slave that knows a newer master epoch than this master's is refused, and tells this master it is stale
   (fencing); then it takes one of MAX_SESSIONS replica sessions. The Handshake carries the master's own proof and
   says where the slave's log continues (divergence.py): at its end, after cutting it back to the divergence point,
   or from the master's first file. A slave told to cut or discard does so (crash-safely, at its next start) and
   opens a new session.
   Without a secret (``ha_secret_file`` unset, allowed on a loopback endpoint only, and never with ``auth_enabled``)
   the proof is empty and every peer counts as proven: the port is then unauthenticated, open to every process of
   the machine.
3. Fetch, again and again: the request reports what the slave holds (its acknowledgement, to the in-sync set) and
   asks for bytes from an offset; the answer carries up to MAX_CHUNK_BYTES of one file and one epoch, the config
   files that changed since the slave's version, the confirmed offset and whether the slave is in sync. When there
   is nothing new the fetch is held up to its max_wait_ms and answered as soon as something is (bytes written, the
   confirmed offset moved, files changed). One fetch in flight per slave is the flow control.

A session not fetched from for SESSION_IDLE_S is dropped and its replica counts as disconnected.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

from broker.errors import BrokerError, InvalidArgumentError, NotMasterError, ResponseCode
from broker.ha import auth, divergence
from broker.ha.chunk import MAX_CHUNK_BYTES
from broker.ha.epoch_file import EpochEntry
from broker.ha.unproven import Unproven, source_of
from broker.proto import ha_pb2 as hpb
from broker.proto import ha_pb2_grpc as hpb_grpc
from broker.proto.status import RESPONSE_CODE_KEY, grpc_code_for

if TYPE_CHECKING:
    from broker.ha.manager import ReplicationManager

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
QUEUE_KEY_SEPARATOR = "\x01"  # topic and queue id in Handshake.queue_starts (topics never hold it)
MAX_WAIT_MS = 1000  # longest a fetch is held; a slave asks for less (slave.FETCH_WAIT_MS)
MAX_SESSIONS = 64  # proven sessions at once (a group has at most 16 replicas; the rest is room for reconnects)
SESSION_IDLE_S = 5.0
MAX_EPOCH_ENTRIES_IN_HELLO = 10_000  # epoch_file.MAX_EPOCH_ENTRIES: a longer history is not a replica's


class StreamRefused(BrokerError):
    """A replication request the master will not serve (wrong group, bad proof, unknown session...)."""


@dataclass
class Session:
    """A proven replica's stream, from its Join on."""

    hello: hpb.Hello
    epoch: int  # the master epoch it was joined under
    number: int  # the in-sync set's session number
    last_fetch: float
    confirmed_sent: int = -1
    in_sync_sent: bool = False


def _refuse(context: grpc.ServicerContext, e: BrokerError) -> NoReturn:
    log.info("replication request refused: %s", e.message)
    context.set_trailing_metadata(((RESPONSE_CODE_KEY, str(int(e.code))),))
    context.abort(grpc_code_for(e.code), e.message)
    raise AssertionError("unreachable: context.abort raises")


class MasterEndpoint(hpb_grpc.ReplicationServicer):
    def __init__(self, manager: ReplicationManager) -> None:
        self.manager = manager
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self.unproven = Unproven()

    # ------------------------------------------------------------------------------------------ rpcs
    def Open(self, request: hpb.Hello, context: grpc.ServicerContext) -> Any:
        try:
            return self._open(request, source_of(context.peer()))
        except BrokerError as e:
            _refuse(context, e)

    def Join(self, request: hpb.JoinRequest, context: grpc.ServicerContext) -> Any:
        try:
            return self._join(request)
        except BrokerError as e:
            _refuse(context, e)

    def Fetch(self, request: hpb.FetchRequest, context: grpc.ServicerContext) -> Any:
        try:
            return self._fetch(request, context)
        except BrokerError as e:
            _refuse(context, e)

    # ------------------------------------------------------------------------------------------ sessions
    def _open(self, hello: hpb.Hello, source: str) -> hpb.Opened:
        """A handshake, waiting for the peer's proof: nothing the Hello says is acted on before Join checks it."""
        self._check_hello(hello)
        m = self.manager
        if m.master_state() is None:
            raise NotMasterError(f"{m.identity_text()} is not the master of its group now")
        hid, nonce = self.unproven.add(hello, source)
        return hpb.Opened(session=hid, server_nonce=nonce)

    def _expire(self, now: float) -> None:
        for sid, s in list(self._sessions.items()):
            if now - s.last_fetch > SESSION_IDLE_S:
                del self._sessions[sid]
                self._disconnected(s)

    def _disconnected(self, s: Session) -> None:
        state = self.manager.master_state()
        if state is not None:
            state[1].disconnect(s.hello.broker_id, s.number)
        log.info("replica %d (%s): session ended", s.hello.broker_id, s.hello.address)

    def session_count(self) -> int:
        """Proven replica sessions open now (each holds one of MAX_SESSIONS slots)."""
        with self._lock:
            return len(self._sessions)

    def sweep(self) -> None:
        """Drop idle sessions (called by the master's review loop)."""
        with self._lock:
            self._expire(time.monotonic())
        self.unproven.sweep()

    def _join(self, request: hpb.JoinRequest) -> hpb.Handshake:
        m = self.manager
        pending = self.unproven.take(request.session)
        if pending is None:
            raise StreamRefused("unknown, expired or already joined replication handshake; open a new one",
                                ResponseCode.INVALID_ARGUMENT)
        hello, server_nonce = pending.hello, pending.server_nonce
        secret = m.settings.secret
        if secret:  # first: until the proof holds, the Hello is a stranger's word
            expected = auth.slave_proof(secret, server_nonce, hello.client_nonce, hello.SerializeToString())
            if not auth.same(expected, request.proof):
                raise StreamRefused(
                    f"a peer at {pending.source} posing as replica {hello.broker_name[:60]}/{hello.broker_id} failed "
                    "the challenge: its ha_secret_file differs from this master's", ResponseCode.UNAUTHENTICATED,
                )
        state = m.master_state()
        if state is None:
            raise NotMasterError(f"{m.identity_text()} is not the master of its group now")
        epoch, in_sync = state
        if hello.known_epoch > epoch:  # a proven replica knows of a newer master: this one is stale
            m.saw_newer_epoch(hello.known_epoch, f"replica {hello.broker_id} knows epoch {hello.known_epoch}")
            raise NotMasterError(f"this master's epoch {epoch} is older than epoch {hello.known_epoch}")
        store = m.store
        slave_epochs = [EpochEntry(e.epoch, e.start_offset) for e in hello.epochs]
        plan = divergence.plan(m.epochs.entries, store.min_phys_offset(), store.max_phys_offset(), slave_epochs,
                               hello.max_offset)
        proof = auth.master_proof(secret, hello.client_nonce, server_nonce) if secret else b""
        answer = hpb.Handshake(
            master_epoch=epoch, start_offset=plan.start_offset, truncate_to=plan.truncate_to, reset=plan.reset,
            proof=proof, master_min_offset=store.min_phys_offset(), master_max_offset=store.max_phys_offset(),
        )
        if plan.reset:
            for (topic, qid), cq in list(store.queues.queues.items()):
                key = f"{topic}{QUEUE_KEY_SEPARATOR}{qid}"
                answer.queue_starts[key] = cq.first_readable(plan.start_offset, cq.min_offset)
        if plan.truncate_to >= 0 or plan.reset:
            log.warning("replica %d (%s) must %s before it follows", hello.broker_id, hello.address,
                        "start again from this master's first file" if plan.reset
                        else f"truncate its log to {plan.truncate_to} (it ends at {hello.max_offset})")
            return answer
        with self._lock:
            self._expire(time.monotonic())
            for sid, other in list(self._sessions.items()):  # a replica's older session: replaced
                if other.hello.broker_id == hello.broker_id:
                    del self._sessions[sid]
            if len(self._sessions) >= MAX_SESSIONS:
                raise StreamRefused(f"{MAX_SESSIONS} replication sessions are open; try again later",
                                    ResponseCode.SYSTEM_BUSY)
            number = in_sync.connect(hello.broker_id, hello.store_id, hello.address)
            self._sessions[request.session] = Session(hello, epoch, number, time.monotonic())
        log.info("replica %d (%s) follows from commit-log offset %d", hello.broker_id, hello.address,
                 plan.start_offset)
        return answer

    def _check_hello(self, hello: hpb.Hello) -> None:
        m = self.manager
        ident = m.identity
        if hello.protocol_version != PROTOCOL_VERSION:
            raise StreamRefused(f"replication protocol {hello.protocol_version}; this broker speaks {PROTOCOL_VERSION}",
                                ResponseCode.VERSION_NOT_SUPPORTED)
        if (hello.cluster, hello.broker_name) != (ident.cluster, ident.broker_name):
            raise StreamRefused(
                f"replica of {hello.cluster[:60]}/{hello.broker_name[:60]} asked {ident.cluster}/{ident.broker_name}: "
                "only the group's own replicas may replicate", ResponseCode.NO_PERMISSION,
            )
        if hello.broker_id == m.own_broker_id:
            raise InvalidArgumentError(f"replica claims this master's own broker id {hello.broker_id}")
        size = m.store.config.mapped_file_size_commit_log
        if hello.commit_log_file_size != size:
            raise InvalidArgumentError(
                f"replica {hello.broker_id} uses commit-log files of {hello.commit_log_file_size} bytes, this master "
                f"{size}: every replica of a group needs the same mapped_file_size_commit_log"
            )
        if len(hello.epochs) > MAX_EPOCH_ENTRIES_IN_HELLO or hello.max_offset < 0 or len(hello.client_nonce) > 64:
            raise InvalidArgumentError("replica's Hello is malformed (offsets, epoch history or nonce)")

    # ------------------------------------------------------------------------------------------ fetch
    def _fetch(self, request: hpb.FetchRequest, context: grpc.ServicerContext) -> hpb.FetchResponse:
        m = self.manager
        with self._lock:
            session = self._sessions.get(request.session)
            if session is not None:
                session.last_fetch = time.monotonic()
        if session is None:
            raise StreamRefused("unknown replication session (expired, or replaced); open a new one",
                                ResponseCode.INVALID_ARGUMENT)
        state = m.master_state()
        if state is None or state[0] != session.epoch:
            raise NotMasterError(f"{m.identity_text()} is no longer master of epoch {session.epoch}")
        epoch, in_sync = state
        rid = session.hello.broker_id
        in_sync.report(rid, session.number, request.written_offset, request.flushed_offset, request.metadata_version)
        wait_s = min(max(request.max_wait_ms, 0), MAX_WAIT_MS) / 1000
        deadline = time.monotonic() + wait_s
        pos = request.fetch_offset
        while True:
            generation = m.changes.generation
            version, files = m.metadata.changes_since(request.metadata_version)
            read = self._read(pos)
            confirmed, member = in_sync.confirmed, in_sync.in_sync(rid)
            news = confirmed != session.confirmed_sent or member != session.in_sync_sent
            remaining = deadline - time.monotonic()
            if read is not None or files or news or remaining <= 0 or not context.is_active():
                break
            if pos < m.store.min_phys_offset():
                raise StreamRefused(f"offset {pos} expired on the master meanwhile; open a new session",
                                    ResponseCode.INVALID_ARGUMENT)
            m.changes.wait(generation, remaining)
            if m.master_state() is None:
                raise NotMasterError(f"{m.identity_text()} is no longer master of epoch {epoch}")
        session.confirmed_sent, session.in_sync_sent = confirmed, member
        answer = hpb.FetchResponse(master_epoch=epoch, confirmed_offset=confirmed, in_sync=member,
                                   master_max_offset=m.store.max_phys_offset(), offset=pos,
                                   metadata_version=version, files=files)
        if read is not None:
            answer.data, answer.epoch = read
        return answer

    def _read(self, pos: int) -> tuple[bytes, int] | None:
        """Up to MAX_CHUNK_BYTES of the log at ``pos``, inside one file and one epoch; None when nothing is there."""
        m = self.manager
        f = m.store.commit_log.files.find(pos)
        if f is None:
            return None
        rel = pos - f.file_from_offset
        n = min(f.wrote_position - rel, MAX_CHUNK_BYTES)
        next_epoch = m.epochs.next_start_after(pos)
        if next_epoch is not None:
            n = min(n, next_epoch - pos)
        if n <= 0:
            return None
        try:
            data = f.read(rel, n)
        except ValueError:  # the file expired between find() and read()
            return None
        return data, m.epochs.epoch_at(pos)
