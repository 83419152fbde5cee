"""A slave's side of the Replication service: follow the master's log, byte for byte, at the master's offsets.

One thread per slave (``SlaveFetcher``). It finds its master (controller mode: etcd; classic: ``ha_master_address`` or
the name servers), opens a session with its Hello (its group, id, store id, log range, epoch history and the
newest epoch it knows), answers the challenge when the group has a secret, and checks the master's proof before it
writes anything.

* The Handshake may ask it to cut its log back to the divergence point, or to start again from the master's first
  file: the fetcher records that intent (store/truncation.py, on disk at once) and has the broker restart in place;
  start-up carries the cut out crash-safely and the fetcher opens a new session.
* Then it fetches, as Kafka's followers do: each Fetch reports what it holds and asks for bytes from where its log
  (and any kept tail of an entry) ends. Bytes from an older master than the newest epoch it knows are refused
  (fencing); the rest are checked (chunk.py) and written at their own offsets (CommitLog.append_replicated); the
  slave's dispatcher builds its consume queues and index from them, as the master's did. Bytes of a newer epoch add
  that epoch to the epoch file before they are written. An end-of-file blank completes its file, and the next fetch
  asks for the next file.
* Every answer carries the confirmed offset: consumers of this slave read below it only (read_limit.py).

Any error ends the session; the fetcher opens another after a short pause (doubling up to RECONNECT_MAX_S).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import grpc

from broker.client.tls import TlsSettings, explain, open_channel
from broker.errors import BrokerError, InvalidArgumentError, NotMasterError, ResponseCode
from broker.ha import auth, chunk
from broker.ha.master_endpoint import PROTOCOL_VERSION
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
CALL_TIMEOUT_S = 3.0  # Open and Join; a master that does not answer this fast is taken for gone
FETCH_WAIT_MS = 200  # how long the master may hold a fetch: also how soon a change of master is noticed
# sluice broker runs this thread apart from the other Python threads (thread_placement.py)
SLAVE_FETCHER_THREAD_NAME = "ha-slave-fetch"


class SlaveFetcher:
    def __init__(self, manager: ReplicationManager) -> None:
        self.manager = manager
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # start() and stop() come from different threads (the controller's follow, a shutdown): stop() must never
        # see a thread that is assigned but not started yet (join() would raise), and a stopped fetcher stays
        # stopped.
        self._life = threading.Lock()
        self._reconnect = threading.Event()  # the master changed: leave the current session
        self.connected_to = ""  # the master's replication endpoint while a stream is up
        self.master_max_offset = 0
        self.in_sync = False
        self._carry = b""  # an entry's beginning, completed by the next chunk
        self._carry_at = 0
        self._start = 0

    def start(self) -> None:
        with self._life:
            if self._stop.is_set():
                return
            thread = threading.Thread(target=self._run, name=SLAVE_FETCHER_THREAD_NAME, daemon=True)
            thread.start()
            self._thread = thread

    def stop(self) -> None:
        with self._life:
            self._stop.set()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    def reconnect(self) -> None:
        """Leave the session (the master changed): the loop connects to whoever is master now."""
        self._reconnect.set()

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
                err = explain(error_from_rpc(e), target, self._tls())
                if not self._stop.is_set() and err.message != last_error:
                    log.warning("replication from %s stopped: %s", target, err.message)
                last_error = err.message
            finally:
                self.connected_to = ""
                self._carry = b""
            self._stop.wait(pause)
            pause = min(pause * 2, RECONNECT_MAX_S)

    def _tls(self) -> TlsSettings | None:
        """A replica connects with the broker's own TLS settings, presenting its certificate."""
        tls = self.manager.settings.tls
        return tls.client_settings() if tls is not None else None

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
        )
        options = [("grpc.max_receive_message_length", CHANNEL_MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", CHANNEL_MAX_MESSAGE_BYTES), ("grpc.enable_retries", 0)]
        with open_channel(target, options, self._tls()) as channel:
            stub = hpb_grpc.ReplicationStub(channel)
            opened = stub.Open(hello, timeout=CALL_TIMEOUT_S)
            secret, nonce = m.settings.secret, opened.server_nonce
            proof = auth.slave_proof(secret, nonce, client_nonce, hello.SerializeToString()) if secret else b""
            hs = stub.Join(hpb.JoinRequest(session=opened.session, proof=proof), timeout=CALL_TIMEOUT_S)
            if not self._handshake(hs, client_nonce, opened.server_nonce, target):
                return
            self.connected_to = target
            self._reconnect.clear()
            m.sink.new_session()
            while not self._stop.is_set() and not self._reconnect.is_set():
                fetch_offset = self._carry_at + len(self._carry) if self._carry else store.max_phys_offset()
                if not store.commit_log.files.files and not self._carry:
                    fetch_offset = self._start
                request = hpb.FetchRequest(
                    session=opened.session, fetch_offset=fetch_offset, written_offset=store.max_phys_offset(),
                    flushed_offset=store.commit_log.flushed_offset, metadata_version=m.metadata_version(),
                    max_wait_ms=FETCH_WAIT_MS,
                )
                answer = stub.Fetch(request, timeout=CALL_TIMEOUT_S + FETCH_WAIT_MS / 1000)
                self._fence(answer.master_epoch)
                self.master_max_offset, self.in_sync = answer.master_max_offset, answer.in_sync
                if answer.files:
                    m.apply_metadata(answer.metadata_version, dict(answer.files))
                if answer.data:
                    if answer.offset != fetch_offset:
                        raise InvalidArgumentError(f"asked for bytes at {fetch_offset}, got {answer.offset}")
                    self._bytes(answer.offset, answer.data, answer.epoch)
                m.slave_progress(answer.confirmed_offset)

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
                              ResponseCode.UNAUTHENTICATED)
        self._fence(hs.master_epoch)
        m.learned_epoch(hs.master_epoch)
        if hs.reset:
            m.save_queue_starts(dict(hs.queue_starts))
        if hs.reset or hs.truncate_to >= 0:
            what = Truncation(hs.start_offset, True) if hs.reset else Truncation(hs.truncate_to, False)
            m.request_truncation(what)
            self._stop.set()
            return False
        end = m.store.max_phys_offset()
        empty = not m.store.commit_log.files.files
        file_size = m.store.config.mapped_file_size_commit_log
        if (empty and hs.start_offset % file_size) or (not empty and hs.start_offset != end):
            raise InvalidArgumentError(f"master {target} continues at {hs.start_offset}, this log ends at {end}")
        self._start = hs.start_offset  # an empty log starts at the master's first file
        self.master_max_offset = hs.master_max_offset
        log.info("following %s (epoch %d) from commit-log offset %d", target, hs.master_epoch, end)
        return True

    def _bytes(self, offset: int, data: bytes, epoch: int) -> None:
        m = self.manager
        store = m.store
        if self._carry:
            data, offset = self._carry + data, self._carry_at
        if epoch > m.epochs.last_epoch:
            m.epochs.append(epoch, offset)
        file_size = store.config.mapped_file_size_commit_log
        checked = chunk.check(data, offset, file_size, store.commit_log.max_entry_size)
        if checked.length:
            store.commit_log.append_replicated(offset, memoryview(data)[: checked.length],
                                               checked.last_store_timestamp, checked.fills_file)
            store.notify_appended()
        if checked.fills_file:  # the rest of the file is the blank's: the next fetch asks for the next file
            self._carry = b""
        else:
            self._carry, self._carry_at = data[checked.length :], offset + checked.length
