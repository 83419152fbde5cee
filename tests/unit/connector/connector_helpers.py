"""Helpers for the connector tests: brokers and clusters in subprocesses, topics, deterministic message bodies."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from broker.client import Admin, Message, Producer, PullConsumer
from broker.client.results import ReceivedMessage
from broker.client.route import MessageQueue
from broker.errors import TopicNotExistError
from broker.namesrv.local_cluster import LocalCluster
from tests.support.waiting import wait_until

# Small files so that expiry tests have several commit-log and consume-queue files to delete.
EXPIRING_STORE: dict[str, Any] = {
    "mapped_file_size_commit_log": 64 * 1024,
    "mapped_file_size_consume_queue": 50 * 20,
    "max_message_size": 16 * 1024,
    "file_reserved_time_hours": 1 / 3600,  # one second
    "delete_when": ";".join(f"{h:02d}" for h in range(24)),  # every hour is a deletion hour
    "clean_resource_interval_ms": 200,
    "max_hash_slot_num": 4096,
    "max_index_num": 16384,
}


def new_topic(endpoint: str, queues: int = 8, prefix: str = "t") -> str:
    topic = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with Admin(endpoint) as admin:
        admin.create_topic(topic, queues)
    return topic


def body_of(topic: str, queue_id: int, i: int) -> bytes:
    return f"{topic}|{queue_id}|{i}".encode()


def fill(
    endpoint: str,
    topic: str,
    per_queue: int,
    queues: range | list[int],
    *,
    first: int = 0,
    tags: Callable[[int], str | None] = lambda i: None,
    chunk: int = 5000,
) -> None:
    """Send ``per_queue`` messages to each queue; message i of queue q has body ``topic|q|i`` (i from ``first``)."""
    with Producer(endpoint) as producer:
        for q in queues:
            for lo in range(first, first + per_queue, chunk):
                hi = min(lo + chunk, first + per_queue)
                msgs = [Message(topic, body_of(topic, q, i), tags=tags(i), keys=(f"k{i}",)) for i in range(lo, hi)]
                results = producer.send_batch(msgs, queue_id=q)
                assert len(results) == hi - lo


def load_sluice(reader: Any, endpoint: str, topic: str, **options: str) -> Any:
    """``topic`` of the broker at ``endpoint`` through ``reader`` (``spark.read`` or ``spark.readStream``) with
    ``options``: the DataFrame."""
    return reader.format("sluice").option("endpoints", endpoint).option("topic", topic).options(**options).load()


def read_queues(endpoint: str, topic: str, *, timeout_s: float = 30.0) -> dict[int, list[ReceivedMessage]]:
    """Every message a reader sees, each queue read from its first offset to its end, in queue order. Not the
    queues' offset ranges: rolled-back rows of an exactly-once attempt keep their offsets, and reads skip them."""
    out: dict[int, list[ReceivedMessage]] = {}
    with Admin(endpoint, timeout_s=timeout_s) as admin, PullConsumer(endpoint, "test-reader", timeout_s=timeout_s) as c:
        for qid, (lo, hi) in admin.queue_offsets(topic).items():
            offset, msgs = lo, []
            while offset < hi:
                result = c.pull(topic, qid, offset, max_msgs=1000)
                msgs.extend(result.messages)
                offset = result.next_begin_offset
            out[qid] = msgs
    return out


def cluster_topic(cluster: LocalCluster, topic: str, queues: int, brokers: list[str] | None = None) -> None:
    """Create ``topic`` on each of ``brokers`` (default all) and wait until the name servers route it there."""
    names = brokers or list(cluster.brokers)
    for name in names:
        with Admin(cluster.endpoint(name)) as admin:
            admin.create_topic(topic, queues, if_not_exists=True)
    with PullConsumer(namesrv=cluster.namesrv) as consumer:

        def routed() -> bool:
            consumer.router.refresh(topic)
            try:
                return set(names) <= set(consumer.router.route(topic).broker_names)
            except TopicNotExistError:
                return False

        wait_until(routed, f"the route of {topic} to list {names}", timeout_s=30, interval_s=0.2)


def cluster_fill(namesrv: str, topic: str, per_queue: int, queues: list[MessageQueue], *, first: int = 0) -> None:
    """``per_queue`` messages to each of ``queues``; message i of broker b's queue q has body ``topic|b:q|i``."""
    with Producer(namesrv=namesrv) as producer:
        for mq in queues:
            for lo in range(first, first + per_queue, 5000):
                hi = min(lo + 5000, first + per_queue)
                msgs = [Message(topic, cluster_body(mq, i)) for i in range(lo, hi)]
                assert len(producer.send_batch(msgs, queue=mq)) == hi - lo


def cluster_body(mq: MessageQueue, i: int) -> bytes:
    return f"{mq.topic}|{mq.broker_name}:{mq.queue_id}|{i}".encode()
