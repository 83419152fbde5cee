"""Send and pull through gRPC against an in-process broker: byte-exact round trips, queries, queue offsets."""

from __future__ import annotations

import random
import time
from collections import defaultdict

from broker.client import Admin, Message, Producer, PullConsumer, PullStatus, SendStatus
from broker.client.outgoing_message import encode_message
from broker.format.message import parse_msg_id
from broker.server.broker_controller import BrokerController

SIZES = [0, 1, 7, 100, 1000, 4096, 20_000, 100_000]
WEIGHTS = [2, 4, 6, 30, 30, 15, 10, 3]


def make_messages(topic: str, n: int, seed: int = 7) -> list[Message]:
    rng = random.Random(seed)
    msgs = []
    for i in range(n):
        size = rng.choices(SIZES, WEIGHTS)[0]
        body = rng.randbytes(size)
        tags = rng.choice([None, "TagA", "TagB", "Tag-ü"])
        keys = [f"k{i}"] + ([f"shared{i % 10}"] if i % 3 == 0 else [])
        props = {"seq": str(i), "unicode": "Grüße ✓", "empty": ""} if i % 2 else {"seq": str(i)}
        msgs.append(Message(topic, body, tags=tags, keys=keys, properties=props))
    return msgs


def drain(consumer: PullConsumer, topic: str, queues: int) -> dict[int, list]:  # type: ignore[type-arg]
    got: dict[int, list] = defaultdict(list)  # type: ignore[type-arg]
    for qid in range(queues):
        offset = 0
        while True:
            r = consumer.pull(topic, qid, offset, max_msgs=500)
            if r.status is PullStatus.NO_NEW_MSG:
                break
            assert r.status is PullStatus.FOUND, r.status
            got[qid] += r.messages
            offset = r.next_begin_offset
    return got


def test_ten_thousand_mixed_messages_round_trip_byte_exact(broker: BrokerController, endpoint: str) -> None:
    topic = "RoundTrip"
    msgs = make_messages(topic, 10_000)
    sent: dict[str, Message] = {}
    uniq: dict[str, str] = {}  # msg id -> the UNIQ_KEY the producer gave the message
    with Producer(endpoint) as producer:
        for m in msgs[:50]:  # single sends, round-robin
            r = producer.send(m)
            assert r.status is SendStatus.SEND_OK
            sent[r.msg_id], uniq[r.msg_id] = m, r.uniq_key
        for start in range(50, len(msgs), 700):  # batches, split by the producer below the batch limit
            chunk = msgs[start : start + 700]
            results = producer.send_batch(chunk)
            assert len(results) == len(chunk)
            sent.update({r.msg_id: m for r, m in zip(results, chunk, strict=True)})
            uniq.update({r.msg_id: r.uniq_key for r in results})
    assert len(set(uniq.values())) == 10_000  # every message its own UNIQ_KEY
    assert len(sent) == 10_000
    assert broker.store is not None and broker.store.wait_dispatched()
    with PullConsumer(endpoint, "rt") as consumer:
        got = drain(consumer, topic, 8)
    received = [m for q in got.values() for m in q]
    assert len(received) == 10_000
    for qid, queue_msgs in got.items():
        assert [m.queue_offset for m in queue_msgs] == list(range(len(queue_msgs))), f"gap in queue {qid}"
        assert all(m.queue_id == qid and m.topic == topic for m in queue_msgs)
    for m in received:
        original = sent[m.msg_id]
        assert m.body == original.body
        assert m.tags == original.tags
        assert m.keys == list(original.keys)
        assert m.properties["UNIQ_KEY"] == uniq[m.msg_id]
        assert {k: v for k, v in m.properties.items() if k not in ("TAGS", "KEYS", "UNIQ_KEY")} == original.properties
        assert parse_msg_id(m.msg_id).commitlog_offset == m.commitlog_offset
        assert m.store_timestamp >= m.born_timestamp > 0
        assert m.reconsume_times == 0


def test_queries_by_key_and_id_and_offsets(broker: BrokerController, endpoint: str) -> None:
    topic = "Queries"
    with Producer(endpoint) as producer, Admin(endpoint) as admin:
        results = producer.send_batch([Message(topic, f"body{i}".encode(), keys=[f"id-{i}", "all"]) for i in range(20)])
        deadline = time.monotonic() + 5  # the index is built by the dispatcher, just after the send returns
        while len(admin.query_by_key(topic, "all", max_num=64)) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(admin.query_by_key(topic, "all", max_num=64)) == 20
        by_key = admin.query_by_key(topic, "id-3")
        assert [m.body for m in by_key] == [b"body3"]
        assert admin.query_by_key(topic, "no-such-key") == []
        viewed = admin.view_message(results[5].msg_id)
        assert viewed.body == b"body5" and viewed.msg_id == results[5].msg_id
        offsets = admin.queue_offsets(topic)
        assert len(offsets) == 8 and sum(hi - lo for lo, hi in offsets.values()) == 20
        qid = results[0].queue_id
        assert admin.search_offset_by_timestamp(topic, qid, 0) == 0
        stats = admin.stats()
        assert stats["broker_put_messages"] >= 20


def test_send_encoded_and_sharding_key(broker: BrokerController, endpoint: str) -> None:
    with Producer(endpoint) as producer:
        buf = b"".join(encode_message(Message("Enc", f"m{i}".encode()), 3) for i in range(100))
        results = producer.send_encoded(buf, 100)
        assert [r.queue_offset for r in results] == list(range(100))
        assert {r.queue_id for r in results} == {3}
        sharded = [producer.send(Message("Shard", b"x"), sharding_key="order-42").queue_id for _ in range(10)]
        assert len(set(sharded)) == 1
        spread = {producer.send(Message("Spread", b"x")).queue_id for _ in range(16)}
        assert spread == set(range(8))
