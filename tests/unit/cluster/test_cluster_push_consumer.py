"""PushConsumer over a cluster of real processes (a name server and three brokers on port 0): a group splits the
union of every broker's queues, failed messages come back through the retry topic of the broker that held them,
orderly locks are taken on each queue's broker, a broker that leaves the route takes its queues with it and brings
them back when it returns, and committed offsets live on each broker across its restarts. The SIGKILL-and-restart
run while producing and consuming is the slow test at the end."""

from __future__ import annotations

import itertools
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cluster_util import FAST, Sink, route_brokers, shared_cluster

from broker.client import (
    BROADCASTING,
    FIRST,
    Admin,
    ConsumeStatus,
    Message,
    Producer,
    PullConsumer,
    PushConsumer,
    ReceivedMessage,
)
from broker.client.connection import Connection
from broker.client.route import MessageQueue
from broker.errors import BrokerError, BrokerUnreachableError
from broker.namesrv.local_cluster import LocalCluster
from broker.proto import sluice_pb2 as pb
from tests.support.waiting import wait_until

BROKERS = ["broker-a", "broker-b", "broker-c"]
ALL = set(BROKERS)
# Retries due in 200 ms instead of 10 s and more; offsets saved by the brokers every 200 ms (a SIGKILL loses less).
BROKER_SETTINGS = {"message_delay_level": " ".join(["200ms"] * 18), "consumer_offset_persist_interval_ms": 200}


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One cluster for the module; every test uses topics and groups of its own and leaves every broker running."""
    root = tmp_path_factory.mktemp("push")
    config = root / "broker.json"
    config.write_text(json.dumps(BROKER_SETTINGS))
    with shared_cluster(root, config=config) as c:
        yield c
    shutil.rmtree(root)  # three preallocated stores: tmp_path_retention_policy only removes function-scoped dirs


def create_everywhere(cluster: LocalCluster, topic: str, queues: int) -> list[MessageQueue]:
    """The topic on every broker, once the name servers route it there; its queues in route order."""
    with Admin(namesrv=cluster.namesrv) as admin:
        admin.create_topic(topic, queues, cluster="DefaultCluster")
    wait_until(lambda: route_brokers(cluster.namesrv, topic) == ALL, f"{topic} routed on every broker")
    return [MessageQueue(topic, name, q) for name in BROKERS for q in range(queues)]


def send_to_each(producer: Producer, queues: list[MessageQueue], prefix: str, per_queue: int) -> set[bytes]:
    sent: set[bytes] = set()
    for mq in queues:
        bodies = [f"{prefix}-{mq.broker_name}-{mq.queue_id}-{i}".encode() for i in range(per_queue)]
        producer.send_batch([Message(mq.topic, b) for b in bodies], queue=mq)
        sent.update(bodies)
    return sent


def send_when_reachable(producer: Producer, queues: list[MessageQueue], prefix: str, per_queue: int) -> set[bytes]:
    """``send_to_each`` once each queue's broker takes sends: a restarted broker is reached again within a second."""
    sent: set[bytes] = set()
    pending = list(queues)

    def sends() -> bool:
        while pending:
            try:
                sent.update(send_to_each(producer, pending[:1], prefix, per_queue))
            except BrokerUnreachableError as e:
                assert not e.request_sent  # refused before anything was sent: nothing stored, so sent again
                return False
            pending.pop(0)
        return True

    wait_until(sends, "every broker reachable")
    return sent


def split(consumers: list[PushConsumer]) -> list[set[MessageQueue]]:
    return [c.assigned_message_queues() for c in consumers]


def shared_out(consumers: list[PushConsumer], queues: list[MessageQueue]) -> bool:
    """Every queue with exactly one consumer (a consumer that joins takes its part while the others still hold
    theirs until their next rebalance: a message consumed then may come twice, as in RocketMQ)."""
    shares = split(consumers)
    return sum(map(len, shares)) == len(queues) and set.union(*shares) == set(queues)


def test_two_consumers_split_the_union_of_every_brokers_queues(shared: LocalCluster) -> None:
    queues = create_everywhere(shared, "PcSplit", 4)
    sink = Sink()
    failed_once: set[bytes] = set()
    lock = threading.Lock()

    def listener(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        with lock:  # every tenth message fails once: sent back to its broker, it comes again through %RETRY%
            if msgs[0].body.endswith(b"-0") and msgs[0].body not in failed_once:
                failed_once.add(msgs[0].body)
                return ConsumeStatus.RECONSUME_LATER
        return sink(msgs)

    consumers = [PushConsumer(None, "pc-split", {"PcSplit": "*"}, listener, namesrv=shared.namesrv, client_id=f"c{i}",
                              consume_from=FIRST, **FAST).start() for i in (1, 2)]
    try:

        def halves() -> bool:
            a, b = split(consumers)
            return not a & b and a | b == set(queues) and len(a) == len(b) == 6

        wait_until(halves, "the 12 queues of three brokers split 6/6")
        assert all(isinstance(mq, MessageQueue) for mq in consumers[0].assigned_queues())
        # AVERAGELY over the union in route order: c1 holds a's 4 queues and 2 of b's, c2 the rest
        assert {mq.broker_name for mq in consumers[0].assigned_message_queues()} == {"broker-a", "broker-b"}

        def retry_brokers() -> set[str]:  # %RETRY%pc-split lives on every broker the group heartbeats
            held = {mq for c in consumers for mq in c.assigned_message_queues(include_retry=True)} - set(queues)
            return {mq.broker_name for mq in held}

        wait_until(lambda: retry_brokers() == ALL, "the retry topic's queues of every broker assigned")
        with Producer(namesrv=shared.namesrv) as p:
            sent = send_to_each(p, queues, "s", 10)
        wait_until(lambda: sink.bodies() == sent, "every message consumed")
        assert len(failed_once) == 12 and sink.duplicates() == {}  # each failed one came back exactly once
        with Admin(namesrv=shared.namesrv) as admin:
            assert admin.consumer_list("pc-split") == ["c1", "c2"]
            retried = admin.queue_offsets("%RETRY%pc-split")
            assert {name: hi for (name, _), (_, hi) in retried.items()} == dict.fromkeys(BROKERS, 4)  # 4 queues each
            consumers[0].shutdown()
            wait_until(lambda: consumers[1].assigned_message_queues() == set(queues), "c2 takes every queue")
            with Producer(namesrv=shared.namesrv) as p:
                more = send_to_each(p, queues, "t", 2)
            wait_until(lambda: sink.bodies() >= more, "c2 consumes every broker's queues")
            consumers[1].shutdown()
            assert admin.consumer_list("pc-split") == []
            lag = admin.group_lag("pc-split", "PcSplit")
            assert lag.total_lag == 0 and {b.broker_name for b in lag.brokers} == ALL  # committed on each broker
        assert sink.duplicates() == {}
    finally:
        for c in consumers:
            c.shutdown()


def test_broadcasting_consumers_each_read_every_brokers_queues(shared: LocalCluster, tmp_path: Path) -> None:
    queues = create_everywhere(shared, "PcBroadcast", 2)
    sinks = [Sink(), Sink()]
    paths = [tmp_path / f"offsets{i}.json" for i in (0, 1)]
    consumers = [PushConsumer(None, "pc-bc", {"PcBroadcast": "*"}, sink, namesrv=shared.namesrv, model=BROADCASTING,
                              consume_from=FIRST, offset_store_path=path, **FAST).start()
                 for sink, path in zip(sinks, paths, strict=True)]
    try:
        wait_until(lambda: all(share == set(queues) for share in split(consumers)), "every queue to each")
        with Producer(namesrv=shared.namesrv) as p:
            sent = send_to_each(p, queues, "bc", 3)
        wait_until(lambda: all(s.bodies() == sent for s in sinks), "every message to each consumer")
    finally:
        for c in consumers:
            c.shutdown()
    saved = json.loads(paths[0].read_text())["offsetTable"]  # progress kept per broker's queue, on the client
    assert saved == {f"PcBroadcast#{mq.broker_name}#{mq.queue_id}": 3 for mq in queues}


def test_a_topic_without_a_route_is_reported_and_consumed_once_created(
    shared: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="broker.client.push_consumer")
    sink = Sink()
    with PushConsumer(None, "pc-later", {"PcLater": "*"}, sink, namesrv=shared.namesrv, consume_from=FIRST,
                      **FAST) as consumer:
        assert consumer.assigned_message_queues() == set()
        assert any("no live broker holds topic 'PcLater'" in r.getMessage() for r in caplog.records)
        queues = create_everywhere(shared, "PcLater", 1)
        wait_until(lambda: consumer.assigned_message_queues() == set(queues), "the new topic's queues")
        with Producer(namesrv=shared.namesrv) as p:
            sent = send_to_each(p, queues, "later", 2)
        wait_until(lambda: sink.bodies() == sent, "the new topic consumed")


def intruder_gets(cluster: LocalCluster, group: str, mq: MessageQueue) -> bool:
    """Whether another client of ``group`` would be granted ``mq``'s lock on the queue's broker."""
    conn = Connection(cluster.endpoint(mq.broker_name))
    request = pb.LockBatchRequest(consumer_group=group, client_id="intruder",
                                  queues=[pb.MessageQueue(topic=mq.topic, queue_id=mq.queue_id)])
    try:
        granted = bool(conn.call(conn.stub.LockBatchMQ, request).queues)
        if granted:
            conn.call(conn.stub.UnlockBatchMQ, request)
        return granted
    finally:
        conn.close()


def test_orderly_consumers_lock_each_queue_on_its_broker(shared: LocalCluster) -> None:
    queues = create_everywhere(shared, "PcOrder", 2)
    seen: dict[str, list[int]] = {}
    lock = threading.Lock()

    def listener(msgs: list[ReceivedMessage]) -> None:
        with lock:
            for m in msgs:
                key, n = m.body.decode().rsplit(":", 1)
                seen.setdefault(key, []).append(int(n))

    opts = {**FAST, "orderly": True, "consume_from": FIRST}
    consumers = [PushConsumer(None, "pc-order", {"PcOrder": "*"}, listener, namesrv=shared.namesrv,
                              client_id=f"o{i}", **opts).start() for i in (1, 2)]
    try:
        wait_until(lambda: set.union(*split(consumers)) == set(queues), "every queue assigned")
        for c in consumers:  # each queue is locked on the broker that holds it, for its consumer only
            for mq in c.assigned_message_queues():
                wait_until(lambda mq=mq: not intruder_gets(shared, "pc-order", mq), f"{mq} locked")
        with Producer(namesrv=shared.namesrv) as p:
            for n in range(20):
                for key in ("k1", "k2", "k3", "k4", "k5"):
                    p.send(Message("PcOrder", f"{key}:{n}".encode()), sharding_key=key)
        wait_until(lambda: sum(map(len, seen.values())) == 100, "every ordered message consumed")
        assert seen == {key: list(range(20)) for key in ("k1", "k2", "k3", "k4", "k5")}
    finally:
        for c in consumers:
            c.shutdown()


def test_a_broker_leaving_the_route_drops_its_queues_and_they_come_back(shared: LocalCluster) -> None:
    queues = create_everywhere(shared, "PcRoute", 2)
    c_queues = {mq for mq in queues if mq.broker_name == "broker-c"}
    sink = Sink()
    consumer = PushConsumer(None, "pc-route", {"PcRoute": "*"}, sink, namesrv=shared.namesrv, consume_from=FIRST,
                            **FAST).start()
    try:
        wait_until(lambda: consumer.assigned_message_queues() == set(queues), "all six queues")
        with Producer(namesrv=shared.namesrv) as p:
            before = send_to_each(p, queues, "before", 5)
            wait_until(lambda: sink.bodies() >= before, "the first messages consumed")
            shared.kill("broker-c")  # gone without unregistering: the name server expires it after 3 s
            wait_until(lambda: consumer.assigned_message_queues() == set(queues) - c_queues, "c's queues dropped")
            during = send_to_each(p, [mq for mq in queues if mq not in c_queues], "during", 5)
            wait_until(lambda: sink.bodies() >= during, "a's and b's queues consumed while c is away")
            shared.restart("broker-c")
            wait_until(lambda: consumer.assigned_message_queues() == set(queues), "c's queues back")
            after = send_when_reachable(p, queues, "after", 5)
        wait_until(lambda: sink.bodies() >= after, "every broker's queues consumed again")
        assert sink.bodies() == before | during | after
        # c's queues restart at the offsets c had saved: messages consumed after its last save come again (at least
        # once), and only messages of c's queues
        assert all(b.startswith(b"before-broker-c-") for b in sink.duplicates())
    finally:
        consumer.shutdown()


def offsets_saved(cluster: LocalCluster, broker: str, key: str, offsets: dict[str, int]) -> bool:
    """True once ``broker`` has written ``offsets`` under ``key`` (topic@group) to its store (its periodic save)."""
    path = Path(cluster.root) / broker / "config" / "consumerOffset.json"
    try:
        return bool(json.loads(path.read_text()).get("offsetTable", {}).get(key) == offsets)
    except (OSError, ValueError):
        return False


def test_committed_offsets_live_on_each_broker_across_its_restarts(shared: LocalCluster) -> None:
    queues = create_everywhere(shared, "PcOffsets", 2)
    sink = Sink()
    with Producer(namesrv=shared.namesrv) as p:
        first = send_to_each(p, queues, "first", 4)
    with PushConsumer(None, "pc-off", {"PcOffsets": "*"}, sink, namesrv=shared.namesrv, consume_from=FIRST, **FAST):
        wait_until(lambda: sink.bodies() == first, "the first messages consumed")
    with PullConsumer(namesrv=shared.namesrv, group="pc-off") as reader:
        committed = reader.committed_by_queue("PcOffsets")
        assert committed == dict.fromkeys(queues, 4)  # each queue's offset, on the broker that owns it
        saved = {"0": 4, "1": 4}
        wait_until(lambda: offsets_saved(shared, "broker-a", "PcOffsets@pc-off", saved), "broker-a saved them")
        shared.kill("broker-a")  # a crash, after its periodic save
        shared.restart("broker-a")
        assert shared.stop("broker-b") == 0  # a clean stop saves them on the way out
        shared.restart("broker-b")
        wait_until(lambda: route_brokers(shared.namesrv, "PcOffsets") == ALL, "a and b routed again")

        def read_back() -> dict[MessageQueue, int] | None:
            try:
                return reader.committed_by_queue("PcOffsets")
            except BrokerError:  # a restarted broker still coming up
                reader.router.refresh("PcOffsets")
                return None

        wait_until(lambda: read_back() == committed, "every broker's offsets read back")
    with Producer(namesrv=shared.namesrv) as p:
        second = send_to_each(p, queues, "second", 3)
    with PushConsumer(None, "pc-off", {"PcOffsets": "*"}, sink, namesrv=shared.namesrv, consume_from=FIRST, **FAST):
        wait_until(lambda: sink.bodies() == first | second, "the new messages consumed")
    assert sink.duplicates() == {}  # nothing consumed before the restarts came again


@pytest.mark.slow
def test_consuming_goes_on_while_a_broker_is_killed_and_restarted(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    """Two consumers of a group, a producer sending all along, and broker-b SIGKILLed then restarted: every
    acknowledged message is consumed. The name servers keep b in the routes while it is away (as with their 120 s
    default), so b's queues stay with their consumers, whose workers wait for it while a's and c's queues go on."""
    with shared_cluster(tmp_path, broker_expire_ms=60_000) as cluster:
        queues = create_everywhere(cluster, "PcKill", 4)
        b_queues = {mq for mq in queues if mq.broker_name == "broker-b"}
        sink = Sink()
        consumers = [PushConsumer(None, "pc-kill", {"PcKill": "*"}, sink, namesrv=cluster.namesrv,
                                  client_id=f"k{i}", consume_from=FIRST, **FAST).start() for i in (1, 2)]
        acked: dict[bytes, str] = {}  # body -> the broker that stored it, in the order of the acknowledgements
        unknown: list[bytes] = []  # sends whose outcome never came (in flight when b died): stored or not
        stop = threading.Event()

        def produce() -> None:
            with Producer(namesrv=cluster.namesrv, timeout_s=3.0) as p:
                for i in itertools.count():
                    if stop.is_set():
                        return
                    body = f"m{i}".encode()
                    try:
                        acked[body] = p.send(Message("PcKill", body)).broker_name
                    except BrokerError:
                        unknown.append(body)
                    time.sleep(0.002)

        producer = threading.Thread(target=produce, name="producer")
        try:
            wait_until(lambda: shared_out(consumers, queues), "the 12 queues shared out")
            producer.start()
            wait_until(lambda: set(acked.values()) == ALL and len(sink.bodies()) >= 300, "traffic on every broker")
            cluster.kill("broker-b")
            killed_at = len(acked)
            wait_until(lambda: len(acked) >= killed_at + 300, "sends going on to a and c")
            while_away = set(list(acked)[killed_at:])
            assert {acked[b] for b in while_away} <= {"broker-a", "broker-c"}
            wait_until(lambda: sink.bodies() >= while_away, "a's and c's messages consumed while b is away")
            assert set.union(*split(consumers)) >= b_queues  # still assigned, their workers waiting for b
            cluster.restart("broker-b")
            with Producer(namesrv=cluster.namesrv) as p:  # the sending producer avoids b for 30 s after its failure
                back = send_when_reachable(p, sorted(b_queues), "back", 5)
            wait_until(lambda: sink.bodies() >= back, "b's queues consumed again")
            stop.set()
            producer.join()
            wait_until(lambda: sink.bodies() >= set(acked), "every acknowledged message consumed")
        finally:
            stop.set()
            if producer.is_alive():
                producer.join()
            for c in consumers:
                c.shutdown()
        assert sink.bodies() <= set(acked) | set(unknown) | back  # nothing that was never sent
        duplicates = sink.duplicates()
        record_property("duplicates", len(duplicates))
        record_property("acknowledged", len(acked))
        # at least once: a message may come twice only if its queue's progress was lost with b
        assert all(acked.get(body) == "broker-b" for body in duplicates), duplicates
