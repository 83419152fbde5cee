"""A cluster in containers (``broker.testing.SluiceCluster``): a name server and two brokers on one Docker network.
Producers, a consumer and a Spark Structured Streaming job on this machine find the brokers through the name server.
Sends spread over both brokers; the Spark job reads every message once; one broker container is killed under
producer load, sends go on at the other broker, and after its restart every acknowledged message is read exactly
once. One cluster and one SparkSession for the module; each test has its own topic.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import docker
import pytest
from sluice_containers import LABEL, SESSION

from broker.client import Admin, Message, Producer, PullConsumer, SendStatus
from broker.client.namesrv_client import NameServerClient
from broker.client.results import ReceivedMessage, SendResult
from broker.errors import BrokerError, SendOutcomeUnknownError, TopicNotExistError
from broker.testing import SluiceCluster
from streaming_jobs.common import spark_session
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(300)]

QUEUES = 4  # per broker: a topic has 8 queues over the two
BROKERS = (SluiceCluster.broker_name(0), SluiceCluster.broker_name(1))
WAIT_S = 60.0  # any condition polled here: a route, dispatched messages, sends after a kill (busy 2-core machine)
PRODUCERS = 2  # threads under load, one Producer each: at most one send each is in flight when a broker dies
SEND_TIMEOUT_S = 20.0  # a send in flight at the kill is retried at the dead broker this long, then "unknown"
LOAD_SENDS = 200  # acknowledged sends in each phase of the kill test: before, while down, after the restart
# Small store files: each broker allocates ~100 MB instead of ~1.5 GB (commit log, key index) of the shared disk.
SMALL_STORE = {"store": {"mapped_file_size_commit_log": 64 << 20, "mapped_file_size_consume_queue": 30_000 * 20,
                         "max_hash_slot_num": 16_384, "max_index_num": 65_536}}


@pytest.fixture(scope="module")
def cluster(docker_client: docker.DockerClient, broker_image: str) -> Iterator[SluiceCluster]:
    with SluiceCluster(brokers=2, image=broker_image, broker_config=SMALL_STORE, labels={LABEL: SESSION}) as c:
        yield c


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    # Spark's Python workers must be this interpreter: set before the session (and its workers) start.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = spark_session("sluice-cluster-integration", shuffle_partitions=2, driver_memory="1g",
                            conf={"spark.default.parallelism": "2"})
    yield session
    session.stop()


def create_topic(namesrv: str, topic: str) -> None:
    """On both brokers; returns once the name server's route lists both."""
    with Admin(namesrv=namesrv) as admin:
        admin.create_topic(topic, QUEUES)
    ns = NameServerClient([namesrv])

    def routed() -> bool:
        try:
            return {q.broker_name for q in ns.route(topic).queue_datas} == set(BROKERS)
        except TopicNotExistError:
            return False

    try:
        wait_until(routed, f"{topic} on both brokers in the route", timeout_s=WAIT_S, interval_s=0.1)
    finally:
        ns.close()


Located = tuple[str, int, int]  # (broker name, queue id, queue offset): where a message is stored


def where(r: SendResult) -> Located:
    assert r.status is SendStatus.SEND_OK, r
    return (r.broker_name, r.queue_id, r.queue_offset)


def read_all(namesrv: str, topic: str, at_least: int) -> list[tuple[Located, ReceivedMessage]]:
    """Every message of every queue of the topic on every broker, with where it is stored. Polls until there are
    ``at_least``: pulls see a message once the broker's dispatcher has indexed it, just after its send returned."""
    found: list[tuple[Located, ReceivedMessage]] = []

    def read() -> bool:
        found.clear()
        with PullConsumer(namesrv=namesrv, group="it-cluster-verify") as consumer:
            for mq, (lo, hi) in sorted(consumer.queue_ranges(topic).items()):
                offset = lo
                while offset < hi:
                    result = consumer.pull(mq, offset, max_msgs=500)
                    assert result.next_begin_offset > offset, f"{mq}: no progress at {offset}"
                    found.extend(((mq.broker_name, mq.queue_id, m.queue_offset), m) for m in result.messages)
                    offset = result.next_begin_offset
        return len(found) >= at_least

    wait_until(read, f"{at_least} messages of {topic} readable", timeout_s=WAIT_S, interval_s=0.1)
    return found


def test_sends_through_the_name_server_spread_over_both_brokers(cluster: SluiceCluster) -> None:
    namesrv = cluster.namesrv_address()
    create_topic(namesrv, "spread")
    n = 8 * QUEUES * 20
    with Producer(namesrv=namesrv) as producer:
        stored = {f"k{i}": where(producer.send(Message("spread", f"m{i}".encode(), keys=f"k{i}"))) for i in range(n)}
    # Round-robin over the 8 queues of the route: each queue, so each broker, takes its exact share.
    assert Counter(b for b, _q, _o in stored.values()) == {b: n // 2 for b in BROKERS}
    assert Counter((b, q) for b, q, _o in stored.values()) == {(b, q): n // 8 for b in BROKERS for q in range(QUEUES)}
    read = read_all(namesrv, "spread", n)
    assert len(read) == n
    assert {m.keys[0]: at for at, m in read} == stored
    assert all(m.body == f"m{m.keys[0][1:]}".encode() for _at, m in read)


def test_spark_reads_the_cluster_through_the_name_server_exactly_once(
    cluster: SluiceCluster, spark: Any, tmp_path: Any
) -> None:
    namesrv = cluster.namesrv_address()
    create_topic(namesrv, "spark_in")
    n, batch = 1200, 100
    sent: dict[Located, bytes] = {}
    with Producer(namesrv=namesrv) as producer:
        for lo in range(0, n, batch):  # each batch is cut into runs over the queues of both brokers
            msgs = [Message("spark_in", f"row-{i:05d}".encode(), keys=f"s{i}") for i in range(lo, lo + batch)]
            for m, r in zip(msgs, producer.send_batch(msgs), strict=True):
                sent[where(r)] = m.body
    assert len(sent) == n and {b for b, _q, _o in sent} == set(BROKERS)
    read_all(namesrv, "spark_in", n)  # every message dispatched: the query's end offsets cover them all

    reader = (
        spark.readStream.format("sluice").option("namesrv", namesrv).option("topic", "spark_in")
        .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "500")
    )
    query = (
        reader.load().writeStream.format("memory").queryName("it_cluster_read")
        .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start()
    )
    query.awaitTermination(timeout=180)
    assert not query.isActive, "the availableNow query did not finish within 180 s"
    assert query.exception() is None, query.exception()
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]
    assert sum(batches) == n and len(batches) >= n // 500 and max(batches) <= 500, batches

    rows = spark.sql("select broker, queue_id, queue_offset, keys, body from it_cluster_read").collect()
    got = Counter((r.broker, r.queue_id, r.queue_offset) for r in rows)
    assert len(rows) == n and set(got.values()) == {1}, "a row twice"
    assert {(r.broker, r.queue_id, r.queue_offset): bytes(r.body) for r in rows} == sent
    assert sorted(r.keys[0] for r in rows) == sorted(f"s{i}" for i in range(n))


@dataclass
class Load:
    """Producer threads sending one message at a time, each with a unique key, until stopped."""

    namesrv: str
    topic: str
    acked: dict[str, tuple[float, Located]] = field(default_factory=dict)  # key -> (send start, where stored)
    unknown: dict[str, float] = field(default_factory=dict)  # key -> send start, for outcomes unknown (may be stored)
    failed: list[tuple[str, BrokerError]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, producer_index: int) -> None:
        with Producer(namesrv=self.namesrv, timeout_s=SEND_TIMEOUT_S) as producer:
            for i in range(1_000_000):
                if self.stop.is_set():
                    return
                key = f"p{producer_index}-{i}"
                started = time.monotonic()
                try:
                    r = producer.send(Message(self.topic, key.encode(), keys=key))
                except SendOutcomeUnknownError:
                    with self.lock:
                        self.unknown[key] = started
                except BrokerError as e:  # any other refusal is the test's finding, reported by the main thread
                    with self.lock:
                        self.failed.append((key, e))
                    return
                else:
                    with self.lock:
                        self.acked[key] = (started, where(r))

    def acked_since(self, t: float) -> list[Located]:
        with self.lock:
            return [at for started, at in self.acked.values() if started > t]


def test_a_killed_broker_container_loses_no_acknowledged_message(cluster: SluiceCluster) -> None:
    namesrv = cluster.namesrv_address()
    create_topic(namesrv, "failover")
    load = Load(namesrv, "failover")
    threads = [threading.Thread(target=load.run, args=(p,), name=f"load-{p}", daemon=True) for p in range(PRODUCERS)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(load.acked_since(0)) >= LOAD_SENDS or bool(load.failed),
                   "sends before the kill", timeout_s=WAIT_S, interval_s=0.1)
        cluster.kill_broker(0)  # docker kill: SIGKILL, the container exits
        killed = time.monotonic()
        # A producer that starts now takes its turns at broker-a's queues too, while this machine still has the dead
        # container's address in its ARP cache (connects to it get no answer): each such send goes to broker-b.
        with Producer(namesrv=namesrv, timeout_s=SEND_TIMEOUT_S) as fresh:
            late = [where(fresh.send(Message("failover", f"late-{i}".encode(), keys=f"late-{i}"))) for i in range(8)]
        wait_until(lambda: len(load.acked_since(killed)) >= LOAD_SENDS or bool(load.failed),
                   "sends while one is down", timeout_s=WAIT_S, interval_s=0.1)
        down = load.acked_since(killed)
        cluster.restart_broker(0)  # the same container and store, registered again
        restarted = time.monotonic()
        wait_until(lambda: len(load.acked_since(restarted)) >= LOAD_SENDS or bool(load.failed),
                   "sends after it", timeout_s=WAIT_S, interval_s=0.1)
    finally:
        load.stop.set()
        for t in threads:
            t.join(timeout=SEND_TIMEOUT_S + 10)
    assert not any(t.is_alive() for t in threads), "a producer thread is stuck"
    assert not load.failed, f"sends failed: {load.failed[:5]}"

    # While broker-a was down, every send started then was stored by broker-b, those that tried broker-a first
    # included; only a send in flight at the kill may have an unknown outcome (one per producer at most).
    assert len(down) >= LOAD_SENDS and {b for b, _q, _o in [*down, *late]} == {BROKERS[1]}
    assert len(load.unknown) <= PRODUCERS and all(s < killed for s in load.unknown.values()), load.unknown
    before = [at for started, at in load.acked.values() if started < killed]
    assert {b for b, _q, _o in before} == set(BROKERS)  # broker-a acknowledged messages before it was killed

    # After the restart every acknowledged message is read exactly once, where its send said it was stored;
    # a message whose send's outcome was unknown is read once or not at all.
    read = read_all(namesrv, "failover", len(load.acked) + len(late))
    keys = Counter(m.keys[0] for _at, m in read)
    assert set(keys.values()) == {1}, [k for k, c in keys.items() if c > 1]
    stored = {m.keys[0]: at for at, m in read}
    acked = {k: at for k, (_s, at) in load.acked.items()} | {f"late-{i}": at for i, at in enumerate(late)}
    assert acked == {k: stored[k] for k in acked}
    extra = set(stored) - set(acked)
    assert extra <= set(load.unknown), sorted(extra - set(load.unknown))
    assert len(read) == len(acked) + len(extra)
    assert all(m.body == m.keys[0].encode() for _at, m in read)
