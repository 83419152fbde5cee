"""Transactional messages through a real broker: commit, rollback, and check-back over the producer's stream."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from conftest import wait_until
from e2e_util import read_topic, visible_count

from broker.client import Admin, LocalTransactionState, Message, ReceivedMessage, TransactionProducer
from broker.server.broker_controller import BrokerController
from broker.store.message import Prop

COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)  # fmt: skip


class Checker:
    def __init__(self, answer: LocalTransactionState) -> None:
        self.answer = answer
        self.asked: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, txn_id: str, half: ReceivedMessage) -> LocalTransactionState:
        assert half.properties[Prop.TRANSACTION_ID] == txn_id and half.properties[Prop.REAL_TOPIC] == "Tx"
        with self.lock:
            self.asked[txn_id] += 1
        return self.answer


def status(endpoint: str, txn_id: str) -> str:
    with Admin(endpoint) as admin:
        (info,) = [t for t in admin.list_transactions(txn_id) if t.transaction_id == txn_id]
        return info.status


def test_commit_and_rollback_by_the_local_transaction(broker: BrokerController, endpoint: str) -> None:
    checker = Checker(UNKNOW)
    with TransactionProducer(endpoint, "tx-group", checker) as producer:
        ran: list[str] = []

        def local_commit(msg: Message, txn_id: str) -> LocalTransactionState:
            assert visible_count(endpoint, "Tx") == 0  # the half is invisible while the local transaction runs
            ran.append(txn_id)
            return COMMIT

        committed = producer.send_in_transaction(Message("Tx", b"order-1", keys=["o1"]), local_commit)
        assert ran == [committed.transaction_id] and committed.local_state is COMMIT
        rolled = producer.send_in_transaction(Message("Tx", b"order-2"), lambda m, t: ROLLBACK)
    got = read_topic(endpoint, "Tx")
    assert [m.body for m in got] == [b"order-1"] and got[0].keys == ["o1"]
    half_offset = int(committed.send_result.msg_id[16:], 16)
    assert got[0].prepared_transaction_offset == half_offset  # re-stored from its half, which it names
    assert status(endpoint, committed.transaction_id) == "COMMITTED"
    assert status(endpoint, rolled.transaction_id) == "ROLLED_BACK"
    with Admin(endpoint) as admin:  # ending again is a no-op reporting the first outcome
        assert admin.end_transaction(rolled.transaction_id, commit=True) == "ROLLED_BACK"
    assert visible_count(endpoint, "Tx") == 1 and sum(checker.asked.values()) == 0


@pytest.mark.parametrize("answer", [COMMIT, ROLLBACK])
def test_check_back_decides_an_unknown_transaction(
    broker: BrokerController, endpoint: str, answer: LocalTransactionState
) -> None:
    checker = Checker(answer)
    with TransactionProducer(endpoint, "tx-group", checker) as producer:
        sent = producer.send_in_transaction(Message("Tx", b"maybe"), lambda m, t: UNKNOW)
        assert status(endpoint, sent.transaction_id) == "OPEN"
        want = "COMMITTED" if answer is COMMIT else "ROLLED_BACK"
        wait_until(lambda: status(endpoint, sent.transaction_id) == want, timeout_s=20, what=want)
    assert checker.asked[sent.transaction_id] == 1
    assert visible_count(endpoint, "Tx") == (1 if answer is COMMIT else 0)


def test_unknown_until_the_15th_check_then_rolled_back(broker: BrokerController, endpoint: str) -> None:
    checker = Checker(UNKNOW)
    with TransactionProducer(endpoint, "tx-group", checker) as producer:
        sent = producer.send_in_transaction(Message("Tx", b"never decided"), lambda m, t: None)
        wait_until(lambda: status(endpoint, sent.transaction_id) == "ROLLED_BACK", timeout_s=30, what="rollback")
    assert checker.asked[sent.transaction_id] == 15
    assert visible_count(endpoint, "Tx") == 0
    with Admin(endpoint) as admin:
        (info,) = admin.list_transactions(sent.transaction_id)
        assert info.check_times == 15 and info.half_count == 1


def test_a_raising_local_transaction_is_left_to_the_check_back(broker: BrokerController, endpoint: str) -> None:
    def broken(msg: Message, txn_id: str) -> LocalTransactionState:
        raise RuntimeError("simulated crash of the local transaction")

    checker = Checker(COMMIT)
    with TransactionProducer(endpoint, "tx-group", checker) as producer:
        sent = producer.send_in_transaction(Message("Tx", b"recovered"), broken)
        assert sent.local_state is UNKNOW
        wait_until(lambda: visible_count(endpoint, "Tx") == 1, timeout_s=20, what="commit by check-back")
    assert [m.body for m in read_topic(endpoint, "Tx")] == [b"recovered"]
