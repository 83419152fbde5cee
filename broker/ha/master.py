"""The replication endpoint (``--ha-listen``): the master's side of ``Replication.Replicate`` (ha.proto).

Every replica runs it; only the group's current master accepts streams (others answer NOT_MASTER). For each slave:

1. Hello: the same cluster and broker group, another broker id, the same commit-log file size (offsets name the
   same files), a protocol version this broker speaks. A slave that knows a newer master epoch than this master's
   is refused, and tells this master it is stale (fencing).
2. With a secret, the challenge (auth.py): the slave's proof is checked in constant time; the master proves itself
   in the Handshake.
3. The Handshake says where the slave's log continues (divergence.py): at its own end, or after cutting it back to
   the divergence point, or from the master's first file when the slave's log is older than that. A slave told to
   cut or discard ends the stream, does so (crash-safely, at its next start), and comes back.
4. Streaming: chunks of the log from that offset on (chunk.py) as soon as they are written, the config files that
   changed (metadata_sync.py), and a heartbeat when nothing else was sent for HEARTBEAT_MS or the confirmed offset
   moved. A reader thread takes the slave's Acks to the in-sync set (in_sync.py). The stream ends when the slave
   goes, or when this broker stops being master of that epoch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

from broker.errors import BrokerError, InvalidArgumentError, NotMasterError, ResponseCode
from broker.ha import auth, divergence
from broker.ha.chunk import MAX_CHUNK_BYTES
from broker.ha.epoch_file import EpochEntry
from broker.ha.in_sync import InSyncSet
from broker.proto import ha_pb2 as hpb
from broker.proto import ha_pb2_grpc as hpb_grpc
from broker.proto.status import RESPONSE_CODE_KEY, grpc_code_for

if TYPE_CHECKING:
    from broker.ha.manager import ReplicationManager

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
HEARTBEAT_MS = 500  # a quiet stream still tells its slave the master lives (and its confirmed offset) this often
MAX_EPOCH_ENTRIES_IN_HELLO = 10_000  # epoch_file.MAX_EPOCH_ENTRIES: a longer history is not a replica's


class StreamRefused(BrokerError):
    """A replication stream the master will not serve (wrong group, bad proof, not master...)."""


def _refuse(context: grpc.ServicerContext, e: BrokerError) -> NoReturn:
    log.warning("replication stream refused: %s", e.message)
    context.set_trailing_metadata(((RESPONSE_CODE_KEY, str(int(e.code))),))
    context.abort(grpc_code_for(e.code), e.message)
    raise AssertionError("unreachable: context.abort raises")


class ReplicationServicer(hpb_grpc.ReplicationServicer):
    def __init__(self, manager: ReplicationManager) -> None:
        self.manager = manager

    def Replicate(self, request_iterator: Iterator[hpb.SlaveMessage], context: grpc.ServicerContext) -> Any:
        try:
            yield from self._replicate(request_iterator, context)
        except BrokerError as e:
            _refuse(context, e)

    def _replicate(self, requests: Iterator[hpb.SlaveMessage], context: grpc.ServicerContext) -> Iterator[Any]:
        m = self.manager
        first = next(requests, None)
        if first is None:
            return
        if first.WhichOneof("kind") != "hello":
            raise StreamRefused("a replication stream starts with Hello", ResponseCode.INVALID_ARGUMENT)
        hello = first.hello
        self._check_hello(hello)
        server_nonce = b""
        secret = m.settings.secret
        if secret:
            server_nonce = auth.nonce()
            yield hpb.MasterMessage(challenge=hpb.Challenge(server_nonce=server_nonce))
            answer = next(requests, None)
            if answer is None:
                return
            expected = auth.slave_proof(secret, server_nonce, hello.client_nonce, hello.SerializeToString())
            if answer.WhichOneof("kind") != "auth" or not auth.same(expected, answer.auth.proof):
                raise StreamRefused(
                    f"replica {hello.broker_name}/{hello.broker_id} at {context.peer()} failed the challenge: its "
                    "ha_secret_file differs from this master's", ResponseCode.NO_PERMISSION,
                )  # fmt: skip
        state = m.master_state()
        if state is None:
            raise NotMasterError(f"{m.identity_text()} is not the master of its group now")
        epoch, in_sync = state
        if hello.known_epoch > epoch:
            m.saw_newer_epoch(hello.known_epoch, f"replica {hello.broker_id} knows epoch {hello.known_epoch}")
            raise NotMasterError(f"this master's epoch {epoch} is older than epoch {hello.known_epoch}")
        store = m.store
        slave_epochs = [EpochEntry(e.epoch, e.start_offset) for e in hello.epochs]
        plan = divergence.plan(m.epochs.entries, store.min_phys_offset(), store.max_phys_offset(), slave_epochs,
                               hello.max_offset)  # fmt: skip
        proof = auth.master_proof(secret, hello.client_nonce, server_nonce) if secret else b""
        yield hpb.MasterMessage(handshake=hpb.Handshake(
            master_epoch=epoch, start_offset=plan.start_offset, truncate_to=plan.truncate_to, reset=plan.reset,
            proof=proof, master_min_offset=store.min_phys_offset(), master_max_offset=store.max_phys_offset(),
        ))  # fmt: skip
        if plan.truncate_to >= 0 or plan.reset:
            log.warning("replica %d (%s) must %s before it follows", hello.broker_id, hello.address,
                        "start again from this master's first file" if plan.reset
                        else f"truncate its log to {plan.truncate_to} (it ends at {hello.max_offset})")  # fmt: skip
            return
        log.info("replica %d (%s) follows from commit-log offset %d", hello.broker_id, hello.address,
                 plan.start_offset)  # fmt: skip
        session = in_sync.connect(hello.broker_id, hello.store_id, hello.address)
        gone = threading.Event()
        reader = threading.Thread(target=self._read_acks, args=(requests, in_sync, hello.broker_id, session, gone),
                                  name=f"ha-acks-{hello.broker_id}", daemon=True)  # fmt: skip
        reader.start()
        try:
            yield from self._stream(context, plan.start_offset, epoch, in_sync, hello.broker_id, gone)
        finally:
            in_sync.disconnect(hello.broker_id, session)
            log.info("replica %d (%s) stream ended", hello.broker_id, hello.address)

    def _check_hello(self, hello: hpb.Hello) -> None:
        m = self.manager
        ident = m.identity
        if hello.protocol_version != PROTOCOL_VERSION:
            raise StreamRefused(f"replication protocol {hello.protocol_version}; this broker speaks {PROTOCOL_VERSION}",
                                ResponseCode.VERSION_NOT_SUPPORTED)  # fmt: skip
        if (hello.cluster, hello.broker_name) != (ident.cluster, ident.broker_name):
            raise StreamRefused(
                f"replica of {hello.cluster[:60]}/{hello.broker_name[:60]} connected to {ident.cluster}/"
                f"{ident.broker_name}: only the group's own replicas may replicate", ResponseCode.NO_PERMISSION,
            )  # fmt: skip
        if hello.broker_id == m.own_broker_id:
            raise InvalidArgumentError(f"replica claims this master's own broker id {hello.broker_id}")
        size = m.store.config.mapped_file_size_commit_log
        if hello.commit_log_file_size != size:
            raise InvalidArgumentError(
                f"replica {hello.broker_id} uses commit-log files of {hello.commit_log_file_size} bytes, this master "
                f"{size}: every replica of a group needs the same mapped_file_size_commit_log"
            )
        if len(hello.epochs) > MAX_EPOCH_ENTRIES_IN_HELLO or hello.max_offset < 0:
            raise InvalidArgumentError("replica's Hello is malformed (offsets or epoch history)")

    def _read_acks(self, requests: Iterator[hpb.SlaveMessage], in_sync: InSyncSet, broker_id: int, session: int,
                   gone: threading.Event) -> None:  # fmt: skip
        try:
            for msg in requests:
                if msg.WhichOneof("kind") == "ack":
                    a = msg.ack
                    in_sync.report(broker_id, session, a.written_offset, a.flushed_offset, a.metadata_version)
        except grpc.RpcError:
            pass  # the slave went; the sender sees ``gone``
        except ValueError:  # the stream was closed under the iterator
            pass
        finally:
            gone.set()
            self.manager.changes.notify()

    def _stream(self, context: grpc.ServicerContext, start: int, epoch: int, in_sync: InSyncSet, broker_id: int,
                gone: threading.Event) -> Iterator[Any]:  # fmt: skip
        m = self.manager
        store = m.store
        pos = start
        meta_sent = 0
        beat_at = 0.0
        confirmed_sent = -1
        in_sync_sent: bool | None = None
        while not gone.is_set() and context.is_active():
            state = m.master_state()
            if state is None or state[0] != epoch:
                return  # no longer master of this epoch: the slave finds the new one
            generation = m.changes.generation
            version, files = m.metadata.changes_since(meta_sent)
            if files:
                yield hpb.MasterMessage(metadata=hpb.Metadata(version=version, files=files))
                meta_sent = version
            read = self._read(pos)
            member = in_sync.in_sync(broker_id)
            if read is not None:
                data, data_epoch = read
                yield hpb.MasterMessage(chunk=hpb.Chunk(
                    offset=pos, data=data, epoch=data_epoch, master_epoch=epoch, confirmed_offset=in_sync.confirmed,
                    in_sync=member, master_max_offset=store.max_phys_offset(),
                ))  # fmt: skip
                pos += len(data)
                confirmed_sent, in_sync_sent, beat_at = in_sync.confirmed, member, time.monotonic()
                continue
            if pos < store.min_phys_offset():
                log.warning("replica %d is at %d, below this master's first byte now: it starts again", broker_id, pos)
                return
            confirmed = in_sync.confirmed
            now = time.monotonic()
            if confirmed != confirmed_sent or member != in_sync_sent or now - beat_at >= HEARTBEAT_MS / 1000:
                yield hpb.MasterMessage(heartbeat=hpb.Heartbeat(
                    master_epoch=epoch, confirmed_offset=confirmed, in_sync=member,
                    master_max_offset=store.max_phys_offset(),
                ))  # fmt: skip
                confirmed_sent, in_sync_sent, beat_at = confirmed, member, now
            m.changes.wait(generation, HEARTBEAT_MS / 1000)

    def _read(self, pos: int) -> tuple[bytes, int] | None:
        """Up to MAX_CHUNK_BYTES of the log at ``pos``, inside one file and one epoch; None when nothing is there."""
        m = self.manager
        files = m.store.commit_log.files
        f = files.find(pos)
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
