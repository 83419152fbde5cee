"""Transactional messages through a real broker: commit, rollback, and check-back over the producer's stream."""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter
from collections.abc import Callable

import grpc
import pytest
from e2e_brokers import SEMANTICS
from e2e_util import read_topic, visible_count

from broker.client import (
    Admin,
    LocalTransactionState,
    Message,
    Producer,
    PullConsumer,
    PullStatus,
    ReceivedMessage,
    SendStatus,
    TransactionProducer,
)
from broker.errors import SystemBusyError
from broker.format.message import Prop
from broker.proto import sluice_pb2 as pb
from broker.proto.status import error_from_rpc
from broker.server.broker_controller import BrokerController
from broker.server.check_streams import open_check_stream
from tests.support.waiting import wait_until

COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)


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
        wait_until(lambda: status(endpoint, sent.transaction_id) == want, want, timeout_s=20)
    assert checker.asked[sent.transaction_id] == 1
    assert visible_count(endpoint, "Tx") == (1 if answer is COMMIT else 0)


def test_unknown_until_the_15th_check_then_rolled_back(broker: BrokerController, endpoint: str) -> None:
    checker = Checker(UNKNOW)
    with TransactionProducer(endpoint, "tx-group", checker) as producer:
        sent = producer.send_in_transaction(Message("Tx", b"never decided"), lambda m, t: None)
        wait_until(lambda: status(endpoint, sent.transaction_id) == "ROLLED_BACK", "rollback", timeout_s=30)
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
        wait_until(lambda: visible_count(endpoint, "Tx") == 1, "commit by check-back", timeout_s=20)
    assert [m.body for m in read_topic(endpoint, "Tx")] == [b"recovered"]


def test_a_slow_producer_is_checked_once_per_transaction_timeout(broker: BrokerController, endpoint: str) -> None:
    """Check passes come every 100 ms and the transaction timeout is 300 ms. A producer stuck on its first answer
    is sent each transaction's check at most once per timeout (RocketMQ's defaults, a pass a minute, never
    showed the difference): after it resumes every transaction is committed, each asked no more often."""
    release, first_ask = threading.Event(), []
    checker = Checker(COMMIT)

    def slow(txn_id: str, half: ReceivedMessage) -> LocalTransactionState:
        first_ask.append(time.monotonic())
        release.wait(10)
        return checker(txn_id, half)

    with TransactionProducer(endpoint, "slow-group", slow) as producer:
        ids = {producer.send_in_transaction(Message("Tx", f"m{i}".encode()), lambda m, t: UNKNOW).transaction_id
               for i in range(20)}
        with Admin(endpoint) as admin:

            def counted(least: int) -> bool:
                return all(t.check_times >= least for t in admin.list_transactions() if t.transaction_id in ids)

            wait_until(lambda: counted(6), "six checks while the producer is stuck", timeout_s=20)
            release.set()
            wait_until(lambda: visible_count(endpoint, "Tx") == 20, "every transaction committed", timeout_s=20)
            stuck_s = time.monotonic() - first_ask[0]
            assert {t.transaction_id: t.status for t in admin.list_transactions()} == dict.fromkeys(ids, "COMMITTED")
    # Checks of one transaction are a timeout apart: over stuck_s, at most stuck_s / timeout + 1 of them, and one
    # more for the slack between the broker sending the first and the producer receiving it. A check at every
    # pass (the old behaviour) asks three times as often.
    most = stuck_s / (SEMANTICS["transaction_timeout_ms"] / 1000) + 2
    assert set(checker.asked) == ids and max(checker.asked.values()) <= most, (stuck_s, checker.asked)


def test_check_streams_and_held_pulls_share_the_worker_budget(broker_factory: Callable[..., BrokerController]) -> None:
    """Each check stream holds a gRPC worker for its producer's life: streams take at most half of the held-call
    budget, a stream past that is refused (its producer opens it again later), and held pulls count the open
    streams, so sends always find a worker."""
    broker = broker_factory(grpc_max_workers=10, grpc_reserved_workers=2)  # 8 held calls: at most 4 streams
    ep = f"127.0.0.1:{broker.port}"
    hub = broker.check_hub
    producers: list[TransactionProducer] = []
    try:
        for i in range(5):  # one at a time, so the fifth (g4) is the one past the limit
            producers.append(TransactionProducer(ep, f"g{i}", Checker(UNKNOW)))
            wait_until(lambda: hub.open_count() == min(len(producers), 4),
                       "check streams opened one by one", timeout_s=10)
        time.sleep(0.5)
        assert hub.open_count() == 4 and hub.live("g4") == 0  # the fifth is refused, not queued on a worker
        with Admin(ep) as admin, PullConsumer(ep, "g") as consumer:
            admin.create_topic("Busy", 1)
            subscribe = pb.TransactionCheckSubscribe(producer_group="g9", client_id="raw")
            with pytest.raises(grpc.RpcError) as refused:
                next(iter(producers[0].conn.stub.TransactionCheckStream(subscribe)))
            error = error_from_rpc(refused.value)  # what the client's code sees: SYSTEM_BUSY, and why
            assert isinstance(error, SystemBusyError) and "check streams are open, this broker's limit" in error.message
            holders = [threading.Thread(target=consumer.pull, args=("Busy", 0, 0), kwargs={"timeout_ms": 10_000})
                       for _ in range(4)]
            for t in holders:
                t.start()
            wait_until(lambda: broker.hold.held_count() == 4, "4 held pulls", timeout_s=10)
            started = time.monotonic()
            assert consumer.pull("Busy", 0, 0, timeout_ms=10_000).status is PullStatus.NO_NEW_MSG
            assert time.monotonic() - started < 3.0  # 4 streams + 4 pulls: the budget is spent, answered at once
            with Producer(ep) as producer:
                sent = producer.send(Message("Busy", b"a worker was free"))  # and wakes the held pulls
                assert sent.status is SendStatus.SEND_OK
            for t in holders:
                t.join(5)
        producers.pop(0).close()
        wait_until(lambda: hub.open_count() == 4 and hub.live("g4") == 1, "the refused producer's stream", timeout_s=10)
    finally:
        for p in producers:
            p.close()


def test_a_check_stream_never_iterated_is_closed_when_dropped(broker: BrokerController) -> None:
    """gRPC may drop a cancelled call's response stream before it first iterates it, so its ``finally`` never
    runs: the stream still leaves the hub (else the stream budget would leak)."""
    assert broker.transactions is not None
    before = broker.check_hub.open_count()
    stream = open_check_stream(broker.check_hub, pb.TransactionCheckSubscribe(producer_group="gone", client_id="c"),
                               None)  # type: ignore[arg-type]
    assert broker.check_hub.open_count() == before + 1 and broker.check_hub.live("gone") == 1
    del stream
    gc.collect()
    assert broker.check_hub.open_count() == before and broker.check_hub.live("gone") == 0
