"""TransactionProducer: RocketMQ's transactional send, and answers to the broker's check-backs.

``send_in_transaction(msg, local_fn)``: the message is stored as a half message (invisible), ``local_fn(msg,
transaction_id)`` runs the application's local transaction and says COMMIT_MESSAGE, ROLLBACK_MESSAGE or UNKNOW
(raising counts as UNKNOW), and the producer ends the transaction accordingly; UNKNOW leaves it open. An open
transaction idle for the broker's transactionTimeOut is checked back: the producer keeps one
``TransactionCheckStream`` call open, runs ``checker(transaction_id, half_message)`` for each check and answers
with ``EndTransaction(from_check=true)``; UNKNOW (or None) answers nothing, and after transactionCheckMax checks
the broker rolls the transaction back.

In a cluster (``namesrv=``) the half goes to the chosen queue's broker and the transaction is ended there; the
producer keeps a check stream open to every master of the cluster, since any of them may hold halves of its group
(RocketMQ's brokers check back with any producer of the group connected to them).
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from broker.client.connection import Connection
from broker.client.outgoing_message import Message, body_bytes
from broker.client.producer import Producer, SendResults
from broker.client.results import ReceivedMessage, SendResult, SendStatus
from broker.errors import BrokerError, FlushDiskTimeoutError, FlushSlaveTimeoutError, NotMasterError
from broker.format.message import decode_entry
from broker.proto import sluice_pb2 as pb
from broker.proto.status import error_from_rpc

log = logging.getLogger(__name__)

RECONNECT_BACKOFF_S = 1.0  # after the check stream broke (broker restart...), before opening it again
MAX_REMEMBERED_TRANSACTIONS = 100_000  # open transactions whose broker a cluster producer remembers for its end
BROKER_WATCH_INTERVAL_S = 30.0  # cluster mode: how often the masters are listed again for check streams


class LocalTransactionState(enum.Enum):
    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"  # RocketMQ's spelling


@dataclass(frozen=True)
class TransactionSendResult:
    send_result: SendResult  # where the half message is stored
    transaction_id: str
    local_state: LocalTransactionState


LocalTransaction = Callable[[Message, str], "LocalTransactionState | None"]
Checker = Callable[[str, ReceivedMessage], "LocalTransactionState | None"]


class TransactionProducer(Producer):
    def __init__(
        self, endpoint: str | None, group: str, checker: Checker, *, timeout_s: float = 30.0,
        client_id: str | None = None, namesrv: str | None = None,
        tls_ca: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
        access_key: str | None = None, secret_key: str | None = None,
    ) -> None:
        super().__init__(endpoint, group, timeout_s=timeout_s, namesrv=namesrv, tls_ca=tls_ca, tls_cert=tls_cert,
                         tls_key=tls_key, access_key=access_key, secret_key=secret_key)
        self.checker = checker
        self.client_id = client_id or f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"
        self.checks_answered = 0
        self._stop = threading.Event()
        self._calls: dict[str, grpc.Future] = {}  # broker address -> its open check stream
        self._call_lock = threading.Lock()
        self._txn_brokers: dict[str, str] = {}  # transaction id -> address of the broker holding its half
        self._threads: dict[str, threading.Thread] = {}
        self._relist = threading.Event()  # a check stream broke: list the masters again now, not at the next tick
        self._watcher = threading.Thread(target=self._watch_brokers, name=f"tx-brokers-{group}", daemon=True)
        self._watcher.start()

    # ------------------------------------------------------------------------------------------------ send
    def send_in_transaction(
        self, msg: Message, local_fn: LocalTransaction, *, queue_id: int | None = None, sharding_key: str | None = None
    ) -> TransactionSendResult:
        body = body_bytes(msg)
        mq = self._resolve_queue(msg.topic, None, queue_id) or self.select_queue(msg.topic, sharding_key)
        txn_id = uuid.uuid4().hex.upper()
        request = pb.SendMessageRequest(
            producer_group=self.group, topic=msg.topic, queue_id=mq.queue_id, body=body,
            properties=msg.all_properties(), flag=msg.flag, born_timestamp=int(time.time() * 1000),
            transactional=True, transaction_id=txn_id,
        )
        conn = self.router.queue_connection(mq, write=True)
        sent = SendResults(conn.call(conn.stub.SendMessage, request), mq.broker_name)[0]
        if self.router.cluster_mode:
            with self._call_lock:
                if len(self._txn_brokers) >= MAX_REMEMBERED_TRANSACTIONS:  # UNKNOW ones this producer never ends
                    self._txn_brokers.pop(next(iter(self._txn_brokers)))
                self._txn_brokers[txn_id] = conn.endpoint
        if sent.status is not SendStatus.SEND_OK:
            self._refuse_unconfirmed_half(txn_id, sent)
        try:
            state = local_fn(msg, txn_id) or LocalTransactionState.UNKNOW
        except Exception:  # the application's code: its transaction's fate is unknown, the check-back decides
            log.exception("local transaction %s raised; left open for the broker's check-back", txn_id)
            state = LocalTransactionState.UNKNOW
        if state is not LocalTransactionState.UNKNOW:
            self.end_transaction(txn_id, state is LocalTransactionState.COMMIT_MESSAGE)
        return TransactionSendResult(sent, txn_id, state)

    def _refuse_unconfirmed_half(self, txn_id: str, sent: SendResult) -> None:
        """A half stored but not confirmed (its replicas or its disk did not confirm it in time) may be gone after a
        failover or a crash: the local transaction must not run on it, as RocketMQ's producer runs it only on
        SEND_OK. The half is rolled back where it is (best effort: that master may be gone), and the caller hears
        that the send's outcome is unknown; a check-back of the half, if it survived, is answered by the checker."""
        try:
            self.end_transaction(txn_id, False)
        except BrokerError as e:
            log.info("transaction %s: rolling back its unconfirmed half failed (%s); a check-back may still ask",
                     txn_id, e.message)
        error = FlushDiskTimeoutError if sent.status is SendStatus.FLUSH_DISK_TIMEOUT else FlushSlaveTimeoutError
        raise error(
            f"the half message of transaction {txn_id} was stored but answered {sent.status.value}: it may not "
            "survive a failover or a crash, so the local transaction was not run and the half was rolled back where "
            "possible; send it again under a new transaction"
        )

    def end_transaction(self, txn_id: str, commit: bool, *, from_check: bool = False, address: str | None = None
                        ) -> str:
        """End ``txn_id`` on the broker holding its half (``address``: that broker; by default the one this
        producer sent it to)."""
        request = pb.EndTransactionRequest(transaction_id=txn_id, commit=commit, from_check=from_check,
                                           producer_group=self.group)
        with self._call_lock:
            address = address or self._txn_brokers.pop(txn_id, None)
        conn = self.router.connection(address) if address and self.router.cluster_mode else self._default_conn()
        return str(conn.call(conn.stub.EndTransaction, request).status)

    def _default_conn(self) -> Connection:
        if not self.router.cluster_mode:
            return self.router.direct
        raise BrokerError("this producer does not know which broker holds the transaction; pass address=")

    def _masters(self) -> list[str]:
        if not self.router.cluster_mode:
            return [self.router.direct.endpoint]
        return sorted({b.address for b in self.router.cluster_brokers() if b.broker_id == 0})

    def _watch_brokers(self) -> None:
        """Open a check stream to every master, and to new ones as they join (checked every route refresh)."""
        while not self._stop.is_set():
            try:
                masters = self._masters()
            except BrokerError as e:
                log.warning("cannot list the cluster's brokers for transaction checks (%s)", e.message)
                masters = []
            for address in masters:
                thread = self._threads.get(address)
                if thread is None or not thread.is_alive():
                    thread = threading.Thread(target=self._check_loop, args=(address,), daemon=True,
                                              name=f"tx-check-{self.group}-{address}")
                    self._threads[address] = thread
                    thread.start()
            self._relist.wait(BROKER_WATCH_INTERVAL_S if self.router.cluster_mode else 3600)
            self._relist.clear()

    # ------------------------------------------------------------------------------------------------ check-back
    def _check_loop(self, address: str) -> None:
        subscribe = pb.TransactionCheckSubscribe(producer_group=self.group, client_id=self.client_id)
        conn = self.router.connection(address) if self.router.cluster_mode else self.router.direct
        while not self._stop.is_set():
            with self._call_lock:
                if self._stop.is_set():
                    return
                call = conn.stub.TransactionCheckStream(subscribe)
                self._calls[address] = call
            try:
                for check in call:
                    self._answer(check, address)
            except grpc.RpcError as e:
                if self._stop.is_set():
                    return
                if self.router.cluster_mode:
                    self._relist.set()  # a master failed over, or died: its successor needs a stream at once
                    if isinstance(error_from_rpc(e), NotMasterError):  # no longer a master: no halves to check
                        log.info("%s is no longer a master; its transaction check stream ends", address)
                        return
                log.warning("transaction check stream of %s broke (%s); reopening", self.group, e.code())
            self._stop.wait(RECONNECT_BACKOFF_S)

    def _answer(self, check: pb.TransactionCheckRequest, address: str) -> None:
        half = decode_entry(check.half_entry, 0, len(check.half_entry))
        try:
            state = self.checker(check.transaction_id, half) or LocalTransactionState.UNKNOW
        except Exception:  # the application's checker: no answer this time, the broker asks again
            log.exception("checker of %s raised for transaction %s", self.group, check.transaction_id)
            return
        self.checks_answered += 1
        if state is LocalTransactionState.UNKNOW:
            return
        try:
            self.end_transaction(check.transaction_id, state is LocalTransactionState.COMMIT_MESSAGE, from_check=True,
                                 address=address)
        except BrokerError as e:
            log.warning("answer to the check of %s failed: %s; the broker will ask again", check.transaction_id,
                        e.message)

    def close(self) -> None:
        self._stop.set()
        self._relist.set()
        with self._call_lock:
            for call in self._calls.values():
                call.cancel()
        self._watcher.join(timeout=10)
        for thread in list(self._threads.values()):
            thread.join(timeout=10)
        super().close()
