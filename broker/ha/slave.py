"""A slave's side of ``Replication.Replicate``: follow the master's log, byte for byte, at the master's offsets.

One thread per slave (``Follower``). It finds its master (controller mode: etcd; classic: ``ha_master_address`` or
the name servers), sends Hello (its group, id, store id, log range, epoch history and the newest epoch it knows),
answers the challenge when the group has a secret, and checks the master's proof before it writes anything.

* The Handshake may ask it to cut its log back to the divergence point, or to start again from the master's first
  file: the follower records that intent (store/truncation.py, on disk at once) and has the broker restart in place;
  start-up carries the cut out crash-safely and the follower connects again.
* Chunks: bytes from an older master than the newest epoch it knows are refused (fencing); the rest are checked
  (chunk.py) and written at their own offsets (CommitLog.append_replicated); the slave's dispatcher builds its
  consume queues and index from them, as the master's did. A chunk of a newer epoch adds that epoch to the epoch
  file before its bytes are written.
* After each chunk (and each metadata message) it reports what it holds; reports are coalesced, so a slow network
  carries the newest offsets, not a queue of old ones.
* Heartbeats and chunks carry the confirmed offset: consumers of this slave read below it only (read_limit.py).

Any error ends the stream; the follower connects again after a short pause (doubling up to RECONNECT_MAX_S).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import grpc

from broker.errors import BrokerError, CorruptionError, InvalidArgumentError, NotMasterError, ResponseCode
from broker.ha import auth, chunk
from broker.ha.master import PROTOCOL_VERSION
from broker.proto import ha_pb2 as hpb
from broker.proto import ha_pb2_grpc as hpb_grpc
from broker.proto.status import error_from_rpc
from broker.store.truncation import Truncation

if TYPE_CHECKING:
    from broker.ha.manager import ReplicationManager

log = logging.getLogger(__name__)

RECONNECT_MIN_S = 0.1
RECONNECT_MAX_S = 1.0
# Replication messages: a chunk (chunk.MAX_CHUNK_BYTES) or the config files (metadata_sync.MAX_METADATA_BYTES).
CHANNEL_MAX_MESSAGE_BYTES = 80 * 1024 * 1024
CONNECT_TIMEOUT_S = 3.0
CONNECT_POLL_S = 0.05  # how often a pending connection checks whether the master changed


class Outbox:
    """The slave's messages to the master, as the request iterator of the stream: Hello and Auth in order, then
    the newest Ack (older unsent ones are replaced: only the latest offsets matter)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: collections.deque[hpb.SlaveMessage] = collections.deque()
        self._ack: hpb.Ack | None = None
        self._closed = False

    def put(self, msg: hpb.SlaveMessage) -> None:
        with self._cond:
            self._items.append(msg)
            self._cond.notify()

    def ack(self, written: int, flushed: int, metadata_version: int) -> None:
        with self._cond:
            self._ack = hpb.Ack(written_offset=written, flushed_offset=flushed, metadata_version=metadata_version)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def __iter__(self) -> Iterator[hpb.SlaveMessage]:
        while True:
            with self._cond:
                while not self._items and self._ack is None and not self._closed:
                    self._cond.wait()
                if self._items:
                    msg = self._items.popleft()
                elif self._ack is not None:
                    msg, self._ack = hpb.SlaveMessage(ack=self._ack), None
                else:
                    return
            yield msg


class Follower:
    def __init__(self, manager: ReplicationManager) -> None:
        self.manager = manager
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._call: grpc.Future | None = None
        self._outbox: Outbox | None = None
        self.connected_to = ""  # the master's replication endpoint while a stream is up
        self.master_max_offset = 0
        self.in_sync = False
        self._carry = b""  # an entry's beginning, completed by the next chunk
        self._carry_at = 0
        self._skip_until = 0  # bytes before this belong to an end-of-file blank already written

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ha-follower", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._hang_up()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _hang_up(self) -> None:
        call, outbox = self._call, self._outbox
        if outbox is not None:
            outbox.close()
        if call is not None:
            call.cancel()

    def reconnect(self) -> None:
        """Drop the stream (the master changed): the loop connects to whoever is master now."""
        self._hang_up()

    # ------------------------------------------------------------------------------------------ loop
    def _run(self) -> None:
        pause = RECONNECT_MIN_S
        last_error = ""
        while not self._stop.is_set():
            target = self.manager.master_ha_address()
            if not target:
                self._stop.wait(RECONNECT_MIN_S)
                continue
            try:
                self._follow(target)
                pause = RECONNECT_MIN_S
            except BrokerError as e:
                if e.message != last_error:  # a master that stays down is logged once, not every pause
                    log.warning("replication from %s stopped: %s", target, e.message)
                last_error = e.message
            except grpc.RpcError as e:
                err = error_from_rpc(e)
                if not self._stop.is_set() and err.message != last_error:
                    log.warning("replication from %s stopped: %s", target, err.message)
                last_error = err.message
            finally:
                self.connected_to, self._call, self._outbox = "", None, None
                self._carry, self._skip_until = b"", 0
            self._stop.wait(pause)
            pause = min(pause * 2, RECONNECT_MAX_S)

    def _follow(self, target: str) -> None:
        m = self.manager
        store = m.store
        ident = m.identity
        client_nonce = auth.nonce()
        hello = hpb.Hello(
            protocol_version=PROTOCOL_VERSION, cluster=ident.cluster, broker_name=ident.broker_name,
            broker_id=m.own_broker_id, store_id=ident.store_id, address=ident.address,
            min_offset=store.min_phys_offset(), max_offset=store.max_phys_offset(),
            commit_log_file_size=store.config.mapped_file_size_commit_log,
            epochs=[hpb.EpochEntry(epoch=e.epoch, start_offset=e.start_offset) for e in m.epochs.entries],
            known_epoch=m.known_epoch(), client_nonce=client_nonce,
        )  # fmt: skip
        outbox = Outbox()
        outbox.put(hpb.SlaveMessage(hello=hello))
        options = [("grpc.max_receive_message_length", CHANNEL_MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", CHANNEL_MAX_MESSAGE_BYTES), ("grpc.enable_retries", 0)]  # fmt: skip
        with grpc.insecure_channel(target, options=options) as channel:
            self._await_ready(channel, target)
            call = hpb_grpc.ReplicationStub(channel).Replicate(iter(outbox))
            self._call, self._outbox = call, outbox
            if self._stop.is_set():
                call.cancel()
                return
            server_nonce = b""
            try:
                for msg in call:
                    kind = msg.WhichOneof("kind")
                    if kind == "challenge":
                        server_nonce = msg.challenge.server_nonce
                        proof = auth.slave_proof(m.settings.secret, server_nonce, client_nonce,
                                                 hello.SerializeToString())  # fmt: skip
                        outbox.put(hpb.SlaveMessage(auth=hpb.Auth(proof=proof)))
                    elif kind == "handshake":
                        if not self._handshake(msg.handshake, client_nonce, server_nonce, target):
                            return
                        self.connected_to = target
                        outbox.ack(store.max_phys_offset(), store.commit_log.flushed_offset, m.metadata_version())
                    elif kind == "chunk":
                        self._chunk(msg.chunk)
                        outbox.ack(store.max_phys_offset(), store.commit_log.flushed_offset, m.metadata_version())
                    elif kind == "metadata":
                        m.apply_metadata(msg.metadata.version, dict(msg.metadata.files))
                        outbox.ack(store.max_phys_offset(), store.commit_log.flushed_offset, m.metadata_version())
                    elif kind == "heartbeat":
                        hb = msg.heartbeat
                        self._fence(hb.master_epoch)
                        self.master_max_offset, self.in_sync = hb.master_max_offset, hb.in_sync
                        m.slave_progress(hb.confirmed_offset)
                        # a replica at the master's end stays caught up while nothing is written (Kafka's
                        # followers fetch on; here each heartbeat is answered)
                        outbox.ack(store.max_phys_offset(), store.commit_log.flushed_offset, m.metadata_version())
            finally:
                outbox.close()
                call.cancel()

    def _await_ready(self, channel: grpc.Channel, target: str) -> None:
        """Wait for the connection, giving up early when the master changes meanwhile (a dead master's endpoint
        would otherwise hold the follower for the whole timeout while the new master waits for it)."""
        ready = grpc.channel_ready_future(channel)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            try:
                ready.result(timeout=CONNECT_POLL_S)
                return
            except grpc.FutureTimeoutError:
                pass
            if self._stop.is_set() or self.manager.master_ha_address() != target or time.monotonic() > deadline:
                ready.cancel()
                raise BrokerError(f"master's replication endpoint {target} does not answer",
                                  ResponseCode.SERVICE_NOT_AVAILABLE)  # fmt: skip

    def _fence(self, master_epoch: int) -> None:
        known = self.manager.known_epoch()
        if master_epoch < known:
            raise NotMasterError(f"the master sends under epoch {master_epoch}, older than epoch {known}: refused")

    def _handshake(self, hs: hpb.Handshake, client_nonce: bytes, server_nonce: bytes, target: str) -> bool:
        """True: follow from here; False: the stream ends (a truncation was requested)."""
        m = self.manager
        secret = m.settings.secret
        if secret and not auth.same(auth.master_proof(secret, client_nonce, server_nonce), hs.proof):
            raise BrokerError(f"{target} failed to prove it knows the group's secret: not following it",
                              ResponseCode.NO_PERMISSION)  # fmt: skip
        self._fence(hs.master_epoch)
        m.learned_epoch(hs.master_epoch)
        if hs.reset or hs.truncate_to >= 0:
            what = Truncation(hs.start_offset, True) if hs.reset else Truncation(hs.truncate_to, False)
            m.request_truncation(what)
            self._stop.set()
            return False
        end = m.store.max_phys_offset()
        if hs.start_offset != end:
            raise InvalidArgumentError(f"master {target} continues at {hs.start_offset}, this log ends at {end}")
        self.master_max_offset = hs.master_max_offset
        log.info("following %s (epoch %d) from commit-log offset %d", target, hs.master_epoch, end)
        return True

    def _chunk(self, c: hpb.Chunk) -> None:
        m = self.manager
        store = m.store
        self._fence(c.master_epoch)
        self.master_max_offset, self.in_sync = c.master_max_offset, c.in_sync
        offset, data = c.offset, c.data
        if offset < self._skip_until:  # the rest of a file whose end-of-file blank is written already
            if offset + len(data) > self._skip_until:
                raise CorruptionError(f"replicated bytes at {offset} run past the end-of-file blank's file")
            m.slave_progress(c.confirmed_offset)
            return
        if self._carry:
            if offset != self._carry_at + len(self._carry):
                raise InvalidArgumentError(f"chunk at {offset} does not follow the kept tail at {self._carry_at}")
            data, offset = self._carry + data, self._carry_at
        elif offset != store.max_phys_offset():
            raise InvalidArgumentError(f"chunk at {offset}; this log ends at {store.max_phys_offset()}")
        if c.epoch > m.epochs.last_epoch:
            m.epochs.append(c.epoch, offset)
        file_size = store.config.mapped_file_size_commit_log
        checked = chunk.check(data, offset, file_size, store.commit_log.max_entry_size)
        if checked.length:
            store.commit_log.append_replicated(offset, memoryview(data)[: checked.length],
                                               checked.last_store_timestamp, checked.fills_file)  # fmt: skip
        if checked.fills_file:
            self._skip_until = (offset // file_size + 1) * file_size
            self._carry = b""
        else:
            self._carry, self._carry_at = data[checked.length :], offset + checked.length
        m.slave_progress(c.confirmed_offset)
