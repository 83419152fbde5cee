"""SIGKILL of a broker process while consumers send messages back (retry and dead letters) and producers send,
roll back and leave open transactional messages: after a restart every acknowledged send-back is in its retry or
dead-letter topic, every acknowledged half is still there, and no acknowledged rollback ever becomes visible.

Kill moments come from a seeded RNG; the seed is SLUICE_CRASH_SEED when set, else the clock, and is printed.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from e2e_brokers import SEMANTICS, SMALL_STORE, final_check
from e2e_util import read_topic

from broker.client import (
    Admin,
    LocalTransactionState,
    Message,
    Producer,
    PullConsumer,
    PullStatus,
    ReceivedMessage,
    TransactionProducer,
)
from broker.errors import BrokerError
from broker.format.message import Prop
from broker.server.process import BrokerProcess
from tests.support.crash import crash_rng
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

CYCLES = 3
GROUP = "crash-group"
RETRY, DLQ = f"%RETRY%{GROUP}", f"%DLQ%{GROUP}"
RETRY_LEVEL = 3  # 200 ms with the suite's delay levels


def write_config(path: Path, **settings: Any) -> Path:
    path.write_text(json.dumps({**SEMANTICS, **settings, "store": SMALL_STORE}))
    return path


def kill_at(broker: BrokerProcess, workers: list[threading.Thread], stop: threading.Event, after_s: float) -> None:
    for w in workers:
        w.start()
    time.sleep(after_s)  # the random kill moment itself: nothing to poll for
    broker.kill()
    stop.set()
    for w in workers:
        w.join(15)
        assert not w.is_alive(), f"{w.name} still running 15 s after the kill"


def read_queue(consumer: PullConsumer, topic: str, queue_id: int = 0) -> list[ReceivedMessage]:
    out: list[ReceivedMessage] = []
    offset = 0
    while True:
        r = consumer.pull(topic, queue_id, offset, max_msgs=1000)
        if r.status is not PullStatus.FOUND:
            assert r.status is PullStatus.NO_NEW_MSG, (topic, queue_id, offset, r.status)
            return out
        assert [m.queue_offset for m in r.messages] == list(range(offset, r.next_begin_offset))
        out += r.messages
        offset = r.next_begin_offset


# ---------------------------------------------------------------------------------------------- retry and DLQ
@dataclass(frozen=True)
class SentBack:
    body: bytes
    origin_msg_id: str
    dead_letter: bool
    reconsume_times: int


@dataclass
class SendBacks:
    acked: list[SentBack] = field(default_factory=list)
    retry_offset: int = 0  # how far the retry topic was consumed (its messages are sent back again, to the DLQ)
    interrupted: bool = False


def send_back_loop(endpoint: str, topic: str, out: SendBacks, stop: threading.Event) -> None:
    """Consume ``topic`` and fail every message: one in three straight to the DLQ (max reconsume times 0), the
    others to the retry topic; messages that came back through the retry topic go to the DLQ (max 1)."""
    with PullConsumer(endpoint, GROUP, timeout_s=5) as c:
        offset, i = 0, 0
        try:
            while not stop.is_set():
                r = c.pull(topic, 0, offset, max_msgs=16)
                if r.status is not PullStatus.FOUND:
                    return  # all consumed before the kill: the test says so
                for m in r.messages:
                    dead = i % 3 == 0
                    resp = c.send_back(m, delay_level=RETRY_LEVEL, max_reconsume_times=0 if dead else 16)
                    assert resp.dead_letter == dead and resp.reconsume_times == 1, resp
                    out.acked.append(SentBack(m.body, m.msg_id, dead, 1))
                    i += 1
                offset = r.next_begin_offset
                if i % 4 == 0:  # now and then, the retries that came back: to the DLQ with their second count
                    r = c.pull(RETRY, 0, out.retry_offset, max_msgs=4)
                    for m in r.messages if r.status is PullStatus.FOUND else []:
                        resp = c.send_back(m, delay_level=RETRY_LEVEL, max_reconsume_times=1)
                        assert resp.dead_letter and resp.reconsume_times == 2, resp
                        origin = m.properties[Prop.ORIGIN_MESSAGE_ID]
                        out.acked.append(SentBack(m.body, origin, True, 2))
                        out.retry_offset = m.queue_offset + 1
        except BrokerError:
            out.interrupted = True


def verify_send_backs(endpoint: str, acked: list[SentBack]) -> None:
    """Every acknowledged send-back is in %DLQ% (dead letters) or, once its delay passed, in %RETRY%: same body,
    the origin message id and the reconsume count the broker answered with."""

    if not acked:
        return

    def found(m: ReceivedMessage) -> tuple[bytes, str, int]:
        return m.body, m.properties[Prop.ORIGIN_MESSAGE_ID], m.reconsume_times

    want_dead = {(s.body, s.origin_msg_id, s.reconsume_times) for s in acked if s.dead_letter}
    want_retry = {(s.body, s.origin_msg_id, s.reconsume_times) for s in acked if not s.dead_letter}
    with PullConsumer(endpoint, "crash-verify") as c:
        dead = {found(m) for m in read_queue(c, DLQ)}
        missing = want_dead - dead
        assert not missing, f"{len(missing)} of {len(want_dead)} acknowledged dead letters lost: {sorted(missing)[:5]}"
        retried: set[tuple[bytes, str, int]] = set()

        def all_retried() -> bool:  # a send-back waits RETRY_LEVEL's delay in the schedule topic first
            retried.update(found(m) for m in read_queue(c, RETRY))
            return want_retry <= retried

        wait_until(all_retried, f"{len(want_retry - retried)} acknowledged retries in {RETRY}", timeout_s=20)


def test_sigkill_during_send_back_keeps_retries_and_dead_letters(tmp_path: Path) -> None:
    config = write_config(tmp_path / "broker.json", dlq_pull_enable=True)
    store = tmp_path / "store"
    rng = crash_rng("send-back")
    acked: list[SentBack] = []
    retry_offset = 0
    for cycle in range(CYCLES):
        topic = f"Fragile{cycle}"
        with BrokerProcess(store, config=config) as broker:
            verify_send_backs(broker.endpoint, acked)  # what earlier cycles' send-backs left
            with Admin(broker.endpoint) as admin, Producer(broker.endpoint) as producer:
                admin.create_topic(topic, 1)
                for start in range(0, 3000, 500):
                    producer.send_batch([Message(topic, f"{topic}-{i}".encode()) for i in range(start, start + 500)])
            stop, out = threading.Event(), SendBacks(retry_offset=retry_offset)
            worker = threading.Thread(target=send_back_loop, args=(broker.endpoint, topic, out, stop), daemon=True)
            kill_at(broker, [worker], stop, rng.uniform(0.5, 1.5))
        assert out.acked and out.interrupted, f"cycle {cycle}: the kill did not land among acknowledged send-backs"
        assert cycle == 0 or any(s.reconsume_times == 2 for s in out.acked), f"cycle {cycle}: no retry sent back"
        acked += out.acked
        retry_offset = out.retry_offset
    with BrokerProcess(store, config=config) as broker:
        verify_send_backs(broker.endpoint, acked)
        assert broker.stop() == 0
    print(f"{len(acked)} acknowledged send-backs, {sum(s.dead_letter for s in acked)} of them dead letters")
    final_check(store, dlq_pull_enable=True)


# ---------------------------------------------------------------------------------------------- transactions
COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)
NO_CHECKS = 600_000  # transaction_timeout_ms while killing: an open transaction stays open until the test ends it


@dataclass
class Transactions:
    prepared: dict[str, bytes] = field(default_factory=dict)  # every half acknowledged (its local transaction ran)
    open: dict[str, bytes] = field(default_factory=dict)  # acknowledged, left open (UNKNOW)
    rolled_back: dict[str, bytes] = field(default_factory=dict)  # rollback acknowledged
    committed: dict[str, bytes] = field(default_factory=dict)  # commit acknowledged
    interrupted: bool = False


def transaction_loop(endpoint: str, cycle: int, out: Transactions, stop: threading.Event) -> None:
    """Single-message transactions until the broker dies: left open, rolled back and committed in turn."""
    with TransactionProducer(endpoint, "crash-tx", lambda txn_id, half: UNKNOW, timeout_s=5) as producer:
        i = 0
        while not stop.is_set():
            body, state = f"c{cycle}-{i}".encode(), (UNKNOW, ROLLBACK, COMMIT)[i % 3]

            def local(msg: Message, txn_id: str, state: LocalTransactionState = state) -> LocalTransactionState:
                out.prepared[txn_id] = msg.body  # called once the half was acknowledged
                return state

            try:
                sent = producer.send_in_transaction(Message("Tx", body), local, queue_id=i % 4)
            except BrokerError:
                out.interrupted = True
                return
            {UNKNOW: out.open, ROLLBACK: out.rolled_back, COMMIT: out.committed}[state][sent.transaction_id] = body
            i += 1


def verify_transactions(endpoint: str, tx: Transactions) -> None:
    with Admin(endpoint) as admin:
        status = {t.transaction_id: (t.status, t.half_count) for t in admin.list_transactions()}
    not_open = {t: status.get(t) for t in tx.open if status.get(t) != ("OPEN", 1)}
    assert not not_open, f"{len(not_open)} of {len(tx.open)} acknowledged open transactions not open: {not_open}"
    unknown = set(tx.prepared) - set(status)
    assert not unknown, f"{len(unknown)} of {len(tx.prepared)} acknowledged halves forgotten: {sorted(unknown)[:5]}"
    undone = {t: status[t] for t in tx.rolled_back if status[t][0] != "ROLLED_BACK"}
    assert not undone, f"acknowledged rollbacks undone: {undone}"
    uncommitted = {t: status[t] for t in tx.committed if status[t][0] != "COMMITTED"}
    assert not uncommitted, f"acknowledged commits undone: {uncommitted}"
    visible = {m.body for m in read_topic(endpoint, "Tx")}
    assert not visible & set(tx.rolled_back.values()), "a transaction whose rollback was acknowledged is visible"
    assert not visible & set(tx.open.values()), "an open transaction is visible"
    assert set(tx.committed.values()) <= visible, "an acknowledged commit is not visible"


def test_sigkill_during_transactions_keeps_halves_and_rollbacks(tmp_path: Path) -> None:
    """Transactional sends left open, rolled back and committed until SIGKILL, CYCLES times (no check-back while
    killing): after each restart every acknowledged half is known, the open ones still open, the rolled-back ones
    rolled back and invisible, the committed ones visible. Then a broker with quick check-backs asks the producer
    about the open ones, which commits whatever it is asked: each becomes visible, and no rolled-back one is ever
    asked about or shown."""
    config = write_config(tmp_path / "broker.json", transaction_timeout_ms=NO_CHECKS)
    store = tmp_path / "store"
    rng = crash_rng("transactions")
    tx = Transactions()
    for cycle in range(CYCLES):
        with BrokerProcess(store, config=config) as broker:
            with Admin(broker.endpoint) as admin:
                admin.create_topic("Tx", 4, if_not_exists=True)
            verify_transactions(broker.endpoint, tx)
            stop, out = threading.Event(), Transactions()
            worker = threading.Thread(target=transaction_loop, args=(broker.endpoint, cycle, out, stop), daemon=True)
            kill_at(broker, [worker], stop, rng.uniform(0.5, 1.5))
        assert out.open and out.rolled_back and out.interrupted, f"cycle {cycle}: the kill landed outside the sends"
        for name in ("prepared", "open", "rolled_back", "committed"):
            getattr(tx, name).update(getattr(out, name))
    with BrokerProcess(store, config=config) as broker:
        verify_transactions(broker.endpoint, tx)
        assert broker.stop() == 0
    # The suite's check-back (300 ms idle, passes every 100 ms) with room for 100+ answers: what is tested here is
    # that check-back commits what a crash left open, not how many checks a slow producer is given.
    quick = write_config(tmp_path / "quick.json", transaction_check_max=1000)
    asked: set[str] = set()

    def commit_all(txn_id: str, half: ReceivedMessage) -> LocalTransactionState:
        asked.add(txn_id)
        return COMMIT

    with BrokerProcess(store, config=quick) as broker:
        with TransactionProducer(broker.endpoint, "crash-tx", commit_all):
            wait_until(lambda: set(tx.open) <= asked, "check-back of the open transactions", timeout_s=20)
            status: dict[str, tuple[str, bool]] = {}  # (status, complete): a commit's re-store may still run
            with Admin(broker.endpoint) as admin:

                def ended() -> bool:
                    status.update((t.transaction_id, (t.status, t.complete)) for t in admin.list_transactions())
                    return all(status.get(t) in (("COMMITTED", True), ("ROLLED_BACK", True)) for t in tx.open)

                wait_until(ended, "the open transactions ended", timeout_s=20)
        bad = {t: status[t] for t in tx.open if status[t] != ("COMMITTED", True)}  # e.g. rolled back: out of checks
        assert not bad, f"{len(bad)} of {len(tx.open)} checked-back open transactions not committed: {bad}"
        assert not asked & set(tx.rolled_back), "the broker asked about a transaction whose rollback was acknowledged"
        visible = {m.body for m in read_topic(broker.endpoint, "Tx")}
        assert set(tx.open.values()) | set(tx.committed.values()) <= visible
        assert not visible & set(tx.rolled_back.values()), "a transaction whose rollback was acknowledged is visible"
        assert broker.stop() == 0
    print(f"transactions: {len(tx.open)} open, {len(tx.rolled_back)} rolled back, {len(tx.committed)} committed")
    final_check(store)
