"""What the soak's clients do and what they were told: every send recorded with its outcome (acknowledged with the
place the broker answered, refused, or unknown), every delivery to a consumer recorded with the time it came.

Bodies are ``<feature>-<writer>-<seq>``: unique, so the checker matches what it reads back to what was sent."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.client import (
    BROADCASTING,
    FIRST,
    LocalTransactionState,
    Message,
    PopConsumer,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    ReceivedMessage,
    TransactionProducer,
)
from broker.client.producer import PartialSendError
from broker.client.route import MessageQueue
from broker.errors import BrokerError, BrokerUnreachableError, FlushSlaveTimeoutError, SendOutcomeUnknownError
from broker.format.message import Prop

log = logging.getLogger(__name__)

PLAIN, BATCH, TXN, TIMED = "SoakPlain", "SoakPop", "SoakTxn", "SoakTimed"
BATCH_SIZE = 8
DELAY_LEVELS_MS = {1: 1000, 2: 5000}  # the broker's default message_delay_level: 1s 5s ...
TIMER_MAX_S = 8.0  # timer messages are due 1..8 s after their send: most come due while a fault is on
POP_INVISIBLE_MS = 10_000  # longer than a failover takes, so an in-flight message is not redelivered by one
FAILED_PAUSE_S = 0.2  # a writer's pause after a send that was not acknowledged (a fault is on)


@dataclass
class Sent:
    feature: str
    body: str
    status: str  # ok | failed | unknown
    broker: str = ""
    queue: int = -1
    offset: int = -1
    due_ms: int = 0  # delay and timer: not readable before
    intent: str = ""  # transactions: commit | rollback


@dataclass
class History:
    sent: list[Sent] = field(default_factory=list)
    delivered: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # consumer -> (body, ms)
    acked_pops: dict[str, int] = field(default_factory=dict)  # body -> when its ack was answered
    ack_unknown: set[str] = field(default_factory=set)  # acks sent and not answered: maybe done, maybe not
    acks_refused: dict[str, int] = field(default_factory=dict)  # response code -> acks refused with it
    redelivered_after_ack: list[str] = field(default_factory=list)
    offsets_backwards: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, *items: Sent) -> None:
        with self.lock:
            self.sent.extend(items)

    def deliver(self, consumer: str, body: str) -> None:
        now = int(time.time() * 1000)
        with self.lock:
            self.delivered.setdefault(consumer, []).append((body, now))

    def delivered_bodies(self, consumer: str) -> set[str]:
        with self.lock:
            return {b for b, _ in self.delivered.get(consumer, [])}

    def counts(self) -> dict[str, int]:
        with self.lock:
            out: dict[str, int] = {}
            for s in self.sent:
                out[f"{s.feature}:{s.status}"] = out.get(f"{s.feature}:{s.status}", 0) + 1
            return out


def outcome_of(e: BrokerError) -> str:
    """``failed`` only for a refusal that stored nothing; ``unknown`` when the request may have been carried out."""
    if isinstance(e, SendOutcomeUnknownError):
        return "unknown"
    if isinstance(e, FlushSlaveTimeoutError):  # done on the master; a new master may or may not hold it
        return "unknown"
    if isinstance(e, BrokerUnreachableError):
        return "unknown" if e.request_sent else "failed"
    return "failed"


class Writer:
    """One producer thread: ``step(seq)`` sends and returns what it was told."""

    def __init__(self, name: str, history: History, step: Callable[[int], list[Sent]], pause_s: float) -> None:
        self.name, self.history, self.step, self.pause_s = name, history, step, pause_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"soak-{name}", daemon=True)

    def _run(self) -> None:
        seq = 0
        while not self.stop.is_set():
            seq += 1
            sent = self.step(seq)
            self.history.record(*sent)
            self.stop.wait(self.pause_s if all(s.status == "ok" for s in sent) else FAILED_PAUSE_S)


def plain_step(producer: Producer, writer: int, topic: str = PLAIN, feature: str = "plain"
               ) -> Callable[[int], list[Sent]]:
    def step(seq: int) -> list[Sent]:
        body = f"{feature}-{writer}-{seq}"
        try:
            r = producer.send(Message(topic, body.encode()))
            return [Sent(feature, body, "ok", r.broker_name, r.queue_id, r.queue_offset)]
        except BrokerError as e:
            return [Sent(feature, body, outcome_of(e))]

    return step


def batch_step(producer: Producer, writer: int) -> Callable[[int], list[Sent]]:
    def step(seq: int) -> list[Sent]:
        bodies = [f"batch-{writer}-{seq * BATCH_SIZE + i}" for i in range(BATCH_SIZE)]
        try:
            results = list(producer.send_batch([Message(BATCH, b.encode()) for b in bodies]))
            return [Sent("batch", b, "ok", r.broker_name, r.queue_id, r.queue_offset)
                    for b, r in zip(bodies, results, strict=True)]
        except PartialSendError as e:
            return [Sent("batch", b, "ok", r.broker_name, r.queue_id, r.queue_offset) if r is not None
                    else Sent("batch", b, outcome_of(e.cause)) for b, r in zip(bodies, e.results, strict=True)]
        except BrokerError as e:
            return [Sent("batch", b, outcome_of(e)) for b in bodies]

    return step


def timed_step(producer: Producer, writer: int, rng: random.Random) -> Callable[[int], list[Sent]]:
    """Delayed (a delay level) and timer (an absolute delivery time) messages, in turn."""

    def step(seq: int) -> list[Sent]:
        now = int(time.time() * 1000)
        if seq % 2:
            level = 1 + seq // 2 % 2
            feature, body, due = "delay", f"delay-{writer}-{seq}", now + DELAY_LEVELS_MS[level]
            props = {Prop.DELAY: str(level)}
        else:
            feature, body = "timer", f"timer-{writer}-{seq}"
            due = now + int(rng.uniform(1.0, TIMER_MAX_S) * 1000)
            props = {Prop.TIMER_DELIVER_MS: str(due)}
        try:
            r = producer.send(Message(TIMED, body.encode(), properties=props))
            return [Sent(feature, body, "ok", r.broker_name, r.queue_id, r.queue_offset, due_ms=due)]
        except BrokerError as e:
            return [Sent(feature, body, outcome_of(e), due_ms=due)]

    return step


def txn_intent(body: str) -> str:
    """Even sequence numbers commit, odd ones roll back; every fourth is left to the check-back to decide."""
    return "commit" if int(body.rsplit("-", 1)[1]) % 2 == 0 else "rollback"


def _decision(body: str) -> LocalTransactionState:
    commit = txn_intent(body) == "commit"
    return LocalTransactionState.COMMIT_MESSAGE if commit else LocalTransactionState.ROLLBACK_MESSAGE


def txn_checker(_txn_id: str, half: ReceivedMessage) -> LocalTransactionState:
    return _decision(half.body.decode())


def txn_step(producer: TransactionProducer, writer: int) -> Callable[[int], list[Sent]]:
    def step(seq: int) -> list[Sent]:
        body = f"txn-{writer}-{seq}"
        half_stored = False

        def local(_msg: Message, _txn: str) -> LocalTransactionState:
            nonlocal half_stored
            half_stored = True  # the local transaction runs once the half is acknowledged
            return LocalTransactionState.UNKNOW if seq % 4 == 0 else _decision(body)

        try:
            r = producer.send_in_transaction(Message(TXN, body.encode()), local)
            s = r.send_result
            return [Sent("txn", body, "ok", s.broker_name, s.queue_id, s.queue_offset, intent=txn_intent(body))]
        except BrokerError as e:  # after the half was stored, only its end failed: the check-back decides it
            return [Sent("txn", body, "ok" if half_stored else outcome_of(e), intent=txn_intent(body))]

    return step


def push_consumer(namesrv: str, group: str, topic: str, history: History, name: str, *, orderly: bool = False,
                  broadcast: bool = False) -> PushConsumer:
    def listener(msgs: list[ReceivedMessage]) -> None:
        for m in msgs:
            history.deliver(name, m.body.decode())

    kwargs: dict[str, object] = {"model": BROADCASTING} if broadcast else {}
    return PushConsumer(None, group, {topic: "*"}, listener, namesrv=namesrv, consume_from=FIRST, orderly=orderly,
                        long_poll_ms=2000, pull_backoff_ms=500, rebalance_interval_ms=3000,
                        heartbeat_interval_ms=2000, persist_interval_ms=1000, timeout_s=10,
                        route_poll_interval_ms=2000, client_id=name, **kwargs)  # type: ignore[arg-type]


class PullLoop:
    """A pull consumer that starts each round at the group's committed offsets (as a restarted consumer would) and
    commits after each pull. An offset the broker answers below one it acknowledged committing has gone back."""

    def __init__(self, namesrv: str, topic: str, history: History) -> None:
        self.consumer = PullConsumer(namesrv=namesrv, group="soak-pull", timeout_s=10)
        self.topic, self.history = topic, history
        self.committed: dict[MessageQueue, int] = {}
        self.regressed: dict[MessageQueue, int] = {}  # the offset each queue went back to, recorded once
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="soak-pull", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self._round()
            except BrokerError as e:
                log.debug("pull round: %s", e)
                self.stop.wait(0.5)

    def _round(self) -> None:
        stored = self.consumer.committed_offsets(self.topic, by_queue=True)
        for mq, offset in stored.items():
            if offset < self.committed.get(mq, 0) and self.regressed.get(mq) != offset:
                self.regressed[mq] = offset  # the next rounds read on from here: one regression, recorded once
                went = f"{mq.broker_name}/{mq.queue_id}: {self.committed[mq]} -> {offset}"
                self.history.offsets_backwards.append(went)
        for mq in self.consumer.fetch_queues(self.topic):
            offset = stored.get(mq, 0)
            r = self.consumer.pull(mq, offset, max_msgs=64, timeout_ms=0)
            if r.status is PullStatus.FOUND:
                for m in r.messages:
                    self.history.deliver("pull", m.body.decode())
            if r.next_begin_offset > offset:
                self.consumer.commit_offsets({mq: r.next_begin_offset})
                self.committed[mq] = max(self.committed.get(mq, 0), r.next_begin_offset)
        self.stop.wait(0.3)


class PopLoop:
    """Receive and acknowledge from the replicated group's master (a receipt handle stays valid at a master promoted
    since); a message delivered again after its acknowledgement was answered is a violation of the pop promise."""

    def __init__(self, master_endpoint: Callable[[], str], topic: str, history: History) -> None:
        self.master_endpoint, self.topic, self.history = master_endpoint, topic, history
        self.stop = threading.Event()
        self.hold = threading.Event()  # set: receive nothing (another consumer of the group takes the messages)
        self.thread = threading.Thread(target=self._run, name="soak-pop", daemon=True)

    def _run(self) -> None:
        consumer: PopConsumer | None = None
        while not self.stop.is_set():
            if self.hold.is_set():
                self.stop.wait(0.2)
                continue
            try:
                if consumer is None:
                    consumer = PopConsumer(self.master_endpoint(), "soak-pop", timeout_s=10)
                popped = consumer.receive(self.topic, max_msgs=16, invisible_ms=POP_INVISIBLE_MS, wait_ms=1000)
                for p in popped:
                    body = p.message.body.decode()
                    with self.history.lock:
                        if body in self.history.acked_pops:
                            self.history.redelivered_after_ack.append(f"{body} (attempt {p.delivery_attempt})")
                    self.history.deliver("pop", body)
                for p in popped:  # one by one: each answered ack is a promise the checker holds the broker to
                    try:
                        consumer.ack(p)
                    except BrokerError as e:
                        with self.history.lock:
                            if outcome_of(e) == "unknown":  # the broker may have taken it: it need not come back
                                self.history.ack_unknown.add(p.message.body.decode())
                            else:
                                code = e.code.name
                                self.history.acks_refused[code] = self.history.acks_refused.get(code, 0) + 1
                        continue
                    with self.history.lock:
                        self.history.acked_pops[p.message.body.decode()] = int(time.time() * 1000)
            except (BrokerError, AssertionError) as e:
                log.debug("pop: %s", e)
                if consumer is not None:
                    consumer.close()
                    consumer = None
                self.stop.wait(0.5)
        if consumer is not None:
            consumer.close()
