"""Auto-created topics are bounded (per request and in total) and cost disk only as they fill: a 38 KB SendBatch of
400 empty entries addressed to 50 new topics x 8 queues was accepted in a second and grew the consume-queue
directory by 2.3 GB."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import grpc

from broker.client import Admin, Message, Producer, PullConsumer
from broker.errors import LimitExceededError, ResponseCode
from broker.format.message import encode_entry
from broker.proto import sluice_pb2 as pb
from broker.server.process import BrokerProcess
from broker.store import MessageStore, StoreConfig
from broker.store.mapped_file import RESERVE_FIRST_BYTES
from tests.unit.conftest import BrokerFactory
from tests.unit.server.hardening_rpc import Answer, answer, clear_refusal, stub


def limited(a: Answer) -> bool:
    return a.refused_with(grpc.StatusCode.RESOURCE_EXHAUSTED, ResponseCode.LIMIT_EXCEEDED)


def batch_to_new_topics(prefix: str, topics: int, queues: int = 8) -> bytes:
    return b"".join(encode_entry(f"{prefix}{t}".encode(), q, b"") for t in range(topics) for q in range(queues))


def test_one_request_auto_creates_a_bounded_number_of_topics(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(max_auto_create_topics_per_request=4)
    endpoint = f"127.0.0.1:{broker.port}"
    with stub(endpoint) as s:
        for txn in ("", "tx-wide"):
            a = answer(s.SendBatch, pb.SendBatchRequest(entries=batch_to_new_topics("Wide", 5), transaction_id=txn,
                                                        producer_group="pg"))
            assert limited(a) and "max_auto_create_topics_per_request=4" in a.details, a
        assert not [t for t in broker.topics.topics() if t.topic.startswith("Wide")]
        assert broker.store is not None and broker.store.wait_dispatched()
        assert not [t for t in broker.store.topics() if t.startswith("Wide")], "nothing stored"
        assert answer(s.SendBatch, pb.SendBatchRequest(entries=batch_to_new_topics("Wide", 4))).ok
        with Admin(endpoint) as admin:
            admin.create_topic("Made", 2)
        known = batch_to_new_topics("Wide", 4) + encode_entry(b"Made", 1, b"")
        assert answer(s.SendBatch, pb.SendBatchRequest(entries=known + batch_to_new_topics("More", 4))).ok


def test_the_queues_of_all_topics_are_bounded(broker_factory: BrokerFactory) -> None:
    """max_total_queue_nums bounds every way a topic is made (auto-created by a send or a route lookup, created,
    grown, a group's retry topic); a refusal stores and creates nothing, and deleting a topic frees its queues."""
    broker = broker_factory(max_total_queue_nums=40, default_topic_queue_nums=8)
    endpoint = f"127.0.0.1:{broker.port}"
    held = sum(t.read_queue_nums for t in broker.topics.topics())
    with stub(endpoint) as s, Producer(endpoint) as p, Admin(endpoint) as admin:
        made = 0
        while held + 8 * (made + 1) <= 40:
            p.send(Message(f"Auto{made}", b"x"), queue_id=0)
            made += 1
        refusals = {
            "SendMessage": answer(s.SendMessage, pb.SendMessageRequest(topic="OneMore", queue_id=0, body=b"x")),
            "SendBatch": answer(s.SendBatch, pb.SendBatchRequest(entries=batch_to_new_topics("OneMore", 1, 1))),
            "transactional SendBatch": answer(s.SendBatch, pb.SendBatchRequest(
                entries=batch_to_new_topics("OneMore", 1, 1), transaction_id="tx-more", producer_group="pg")),
            "GetTopicRoute": answer(s.GetTopicRoute, pb.GetTopicRouteRequest(topic="OneMore", auto_create=True)),
            "CreateTopic": answer(s.CreateTopic, pb.CreateTopicRequest(topic="OneMore", queue_nums=8)),
            "a retry topic": answer(s.Heartbeat, pb.HeartbeatRequest(consumer_group="late", client_id="c")),
        }
        for name, a in refusals.items():
            assert limited(a) and "max_total_queue_nums=40" in a.details, f"{name}: {a}"
        assert broker.topics.get("OneMore") is None and broker.store is not None
        assert broker.store.wait_dispatched() and "OneMore" not in broker.store.topics()
        p.send(Message("Auto0", b"still writable"), queue_id=1)  # known topics take messages as before
        admin.delete_topic("Auto0")
        p.send(Message("OneMore", b"room again"), queue_id=0)
    try:
        with Producer(endpoint) as p:
            p.send(Message("TwoMore", b"x"), queue_id=0)
        raise AssertionError("the client did not see the limit")
    except LimitExceededError as e:
        assert e.code is ResponseCode.LIMIT_EXCEEDED


def test_a_flood_of_auto_creating_sends_stays_within_the_disk_it_may_use(tmp_path: Path) -> None:
    """Resource test: a broker process with the default consume-queue file size (6 MB) and a queue budget, flooded
    by four writers that each name new topics in every batch. Every send is stored or refused with LIMIT_EXCEEDED,
    and the consume queues hold no more disk than the budget allows (a page per queue) where preallocation took a
    whole file per queue."""
    budget, per_request = 128, 8
    config = tmp_path / "broker.json"
    config.write_text(json.dumps({"max_total_queue_nums": budget, "max_auto_create_topics_per_request": per_request}))
    store_dir = tmp_path / "store"
    broker = BrokerProcess(store_dir, config=config).start()
    stored: dict[str, list[int]] = {}
    answers: list[Answer] = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        with stub(broker.endpoint) as s:
            for b in range(12):
                prefix = f"Flood{w}x{b}t"
                a = answer(s.SendBatch, pb.SendBatchRequest(entries=batch_to_new_topics(prefix, per_request)))
                with lock:
                    answers.append(a)
                    if a.ok:
                        stored[prefix] = list(a.response.queue_ids)

    try:
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(answers) == 48 and stored, [str(a) for a in answers if not a.ok][:3]
        assert all(a.ok or (limited(a) and clear_refusal(a)) for a in answers), [str(a) for a in answers if not a.ok]
        with PullConsumer(broker.endpoint, "flood-readers") as c:
            for prefix in stored:
                for t in range(per_request):
                    assert sum(len(c.pull(f"{prefix}{t}", q, 0).messages) for q in range(8)) == 8
        queues = [p for p in (store_dir / "consumequeue").glob("*/*") if p.is_dir()]
        assert len(queues) <= budget
        allocated = sum(p.stat().st_blocks * 512 for p in (store_dir / "consumequeue").rglob("*") if p.is_file())
        assert allocated <= budget * RESERVE_FIRST_BYTES, allocated  # preallocated: budget * 6 MB
    finally:
        assert broker.stop() == 0
    store = MessageStore(StoreConfig(store_path=str(store_dir)))
    store.start()
    try:
        assert store.check() == []
    finally:
        store.shutdown()
