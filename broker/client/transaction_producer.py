"""TransactionProducer: RocketMQ's transactional send, and answers to the broker's check-backs.

``send_in_transaction(msg, local_fn)``: the message is stored as a half message (invisible), ``local_fn(msg,
transaction_id)`` runs the application's local transaction and says COMMIT_MESSAGE, ROLLBACK_MESSAGE or UNKNOW
(raising counts as UNKNOW), and the producer ends the transaction accordingly; UNKNOW leaves it open. An open
transaction idle for the broker's transactionTimeOut is checked back: the producer keeps one
``TransactionCheckStream`` call open, runs ``checker(transaction_id, half_message)`` for each check and answers
with ``EndTransaction(from_check=true)``; UNKNOW (or None) answers nothing, and after transactionCheckMax checks
the broker rolls the transaction back.
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

from broker.client.message import Message
from broker.client.producer import Producer, SendResults
from broker.client.results import ReceivedMessage, SendResult
from broker.errors import BrokerError, MessageIllegalError
from broker.proto import sluice_pb2 as pb
from broker.store.message import decode_entry

log = logging.getLogger(__name__)

RECONNECT_BACKOFF_S = 1.0  # after the check stream broke (broker restart...), before opening it again


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
        client_id: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(endpoint, group, timeout_s=timeout_s)
        self.checker = checker
        self.client_id = client_id or f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"
        self.checks_answered = 0
        self._stop = threading.Event()
        self._call: grpc.Future | None = None
        self._call_lock = threading.Lock()
        self._thread = threading.Thread(target=self._check_loop, name=f"tx-check-{group}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------------------------ send
    def send_in_transaction(
        self, msg: Message, local_fn: LocalTransaction, *, queue_id: int | None = None, sharding_key: str | None = None
    ) -> TransactionSendResult:
        if not isinstance(msg.body, bytes | bytearray | memoryview):
            raise MessageIllegalError(f"message body must be bytes, got {type(msg.body).__name__}; encode text first")
        qid = queue_id if queue_id is not None else self.select_queue(msg.topic, sharding_key)
        txn_id = uuid.uuid4().hex.upper()
        request = pb.SendMessageRequest(
            producer_group=self.group, topic=msg.topic, queue_id=qid, body=bytes(msg.body),
            properties=msg.all_properties(), flag=msg.flag, born_timestamp=int(time.time() * 1000),
            transactional=True, transaction_id=txn_id,
        )  # fmt: skip
        sent = SendResults(self.conn.call(self.conn.stub.SendMessage, request))[0]
        try:
            state = local_fn(msg, txn_id) or LocalTransactionState.UNKNOW
        except Exception:  # the application's code: its transaction's fate is unknown, the check-back decides
            log.exception("local transaction %s raised; left open for the broker's check-back", txn_id)
            state = LocalTransactionState.UNKNOW
        if state is not LocalTransactionState.UNKNOW:
            self.end_transaction(txn_id, state is LocalTransactionState.COMMIT_MESSAGE)
        return TransactionSendResult(sent, txn_id, state)

    def end_transaction(self, txn_id: str, commit: bool, *, from_check: bool = False) -> str:
        request = pb.EndTransactionRequest(transaction_id=txn_id, commit=commit, from_check=from_check,
                                           producer_group=self.group)  # fmt: skip
        return self.conn.call(self.conn.stub.EndTransaction, request).status

    # ------------------------------------------------------------------------------------------------ check-back
    def _check_loop(self) -> None:
        subscribe = pb.TransactionCheckSubscribe(producer_group=self.group, client_id=self.client_id)
        while not self._stop.is_set():
            with self._call_lock:
                if self._stop.is_set():
                    return
                call = self.conn.stub.TransactionCheckStream(subscribe)
                self._call = call
            try:
                for check in call:
                    self._answer(check)
            except grpc.RpcError as e:
                if self._stop.is_set():
                    return
                log.warning("transaction check stream of %s broke (%s); reopening", self.group, e.code())
            self._stop.wait(RECONNECT_BACKOFF_S)

    def _answer(self, check: pb.TransactionCheckRequest) -> None:
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
            self.end_transaction(check.transaction_id, state is LocalTransactionState.COMMIT_MESSAGE, from_check=True)
        except BrokerError as e:
            log.warning("answer to the check of %s failed: %s; the broker will ask again", check.transaction_id,
                        e.message)  # fmt: skip

    def close(self) -> None:
        self._stop.set()
        with self._call_lock:
            if self._call is not None:
                self._call.cancel()
        self._thread.join(timeout=10)
        super().close()

    def __enter__(self) -> TransactionProducer:
        return self
