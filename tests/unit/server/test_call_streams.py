"""SendStream and PullStream on a running broker: each message answered as SendMessage would answer it, in order,
refusals included, with the stream going on; the producer's use of it (and its fallbacks: a busy stream, the
broker's limit, a broker without the method); a send whose answer is late retried under its UNIQ_KEY and stored
once; idle streams closed, a stopping broker's ended; a push consumer's pulls on streams, its holds ended with
them."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from broker.client import FIRST, Admin, Message, Producer, PullConsumer, PullStatus, PushConsumer, ReceivedMessage
from broker.client import call_stream as client_stream
from broker.errors import BrokerUnreachableError, MessageIllegalError, ResponseCode
from broker.proto import sluice_pb2 as pb
from broker.proto import sluice_pb2_grpc as pb_grpc
from broker.server.broker_controller import BrokerController

TOPIC = "StreamT"


def stored_bodies(endpoint: str, topic: str = TOPIC) -> list[bytes]:
    """Queue 0's bodies, in queue order (the tests send to queue 0)."""
    bodies: list[bytes] = []
    with PullConsumer(endpoint, "verify") as c:
        offset = 0
        while True:
            r = c.pull(topic, 0, offset, max_msgs=1000)
            if r.status is not PullStatus.FOUND:
                return bodies
            bodies += [m.body for m in r.messages]
            offset = r.next_begin_offset


class RawStream:
    """A SendStream driven request by request, with raw bytes allowed (a request no stub would build)."""

    def __init__(self, endpoint: str) -> None:
        self.channel = grpc.insecure_channel(endpoint)
        self.requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        method = self.channel.stream_stream("/sluice.v1.Broker/SendStream", request_serializer=lambda b: b,
                                            response_deserializer=pb.SendStreamAnswer.FromString)
        self.answers: Iterator[pb.SendStreamAnswer] = method(iter(self.requests.get, None))

    def send(self, request: pb.SendMessageRequest | bytes) -> pb.SendStreamAnswer:
        self.requests.put(request if isinstance(request, bytes) else request.SerializeToString())
        return next(self.answers)

    def close(self) -> None:
        self.requests.put(None)
        self.channel.close()


def good(body: bytes) -> pb.SendMessageRequest:
    return pb.SendMessageRequest(producer_group="g", topic=TOPIC, queue_id=0, body=body)


def test_each_message_is_answered_in_order_and_a_refusal_does_not_end_the_stream(
    broker: BrokerController, endpoint: str
) -> None:
    stream = RawStream(endpoint)
    try:
        first = stream.send(good(b"one"))
        assert first.code == 0 and first.response.status == pb.SEND_OK and first.response.queue_offsets == [0]
        bad_topic = stream.send(pb.SendMessageRequest(topic="bad topic!", queue_id=0, body=b"x"))
        assert bad_topic.code == ResponseCode.MESSAGE_ILLEGAL and "bad topic!" in bad_topic.error
        not_protobuf = stream.send(b"\xff\xff\xff")  # not a SendMessageRequest at all
        assert not_protobuf.code == ResponseCode.INVALID_ARGUMENT and "not a valid protobuf" in not_protobuf.error
        too_big = stream.send(good(b"x" * (broker.store.config.max_message_size + 1)))
        assert too_big.code == ResponseCode.MESSAGE_ILLEGAL, too_big
        system = stream.send(pb.SendMessageRequest(topic="SCHEDULE_TOPIC_XXXX", queue_id=0, body=b"x"))
        assert system.code != 0 and not system.HasField("response")
        last = stream.send(good(b"two"))
        assert last.code == 0 and last.response.queue_offsets == [1]
    finally:
        stream.close()
    assert stored_bodies(endpoint) == [b"one", b"two"]  # the refused messages changed nothing


def test_producer_sends_on_one_stream_and_reads_back(broker: BrokerController, endpoint: str) -> None:
    with Producer(endpoint) as p:
        results = [p.send(Message(TOPIC, f"m{i}".encode()), queue_id=0) for i in range(50)]
        assert broker.call_streams.open_count() == 1
        assert p.conn.send_stream.answers == 50
        with pytest.raises(MessageIllegalError):
            p.send(Message(TOPIC, b"x" * (broker.store.config.max_message_size + 1)), queue_id=0)
        assert p.send(Message(TOPIC, b"after"), queue_id=0).queue_offset == 50
        assert p.conn.send_stream.answers == 52  # the refusal was an answer on the same stream
    assert [r.queue_offset for r in results] == list(range(50))
    assert stored_bodies(endpoint) == [f"m{i}".encode() for i in range(50)] + [b"after"]
    deadline = time.monotonic() + 10
    while broker.call_streams.open_count() and time.monotonic() < deadline:  # the producer's close ends it
        time.sleep(0.02)
    assert broker.call_streams.open_count() == 0


def test_concurrent_senders_on_one_producer_are_all_stored_once(endpoint: str) -> None:
    threads, per_thread = 6, 150
    errors: list[BaseException] = []
    with Producer(endpoint) as p:

        def send(t: int) -> None:
            try:
                for i in range(per_thread):
                    p.send(Message(TOPIC, f"{t}-{i}".encode()), queue_id=0)
            except BaseException as e:  # noqa: BLE001  (reported by the assertion below)
                errors.append(e)

        workers = [threading.Thread(target=send, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        stream_answers = p.conn.send_stream.answers
    assert not errors, errors[:3]
    bodies = stored_bodies(endpoint)
    assert sorted(bodies) == sorted(f"{t}-{i}".encode() for t in range(threads) for i in range(per_thread))
    assert 0 < stream_answers < threads * per_thread  # some on the stream, the rest as calls meanwhile


def test_broker_limit_refuses_a_stream_and_the_producer_sends_unary(broker: BrokerController, endpoint: str) -> None:
    broker.call_streams.max_streams = 1
    with Producer(endpoint) as first, Producer(endpoint) as second:
        first.send(Message(TOPIC, b"a"), queue_id=0)
        assert second.send(Message(TOPIC, b"b"), queue_id=0).queue_offset == 1  # refused stream: sent as a call
        assert second.conn.send_stream.answers == 0
        assert broker.call_streams.open_count() == 1
        assert broker.metrics.errors.value(labels=(("code", "SYSTEM_BUSY"),)) >= 1
    assert stored_bodies(endpoint) == [b"a", b"b"]


def test_broker_without_send_stream_is_sent_to_with_calls(tmp_path: Any) -> None:
    """A broker of an older version answers UNIMPLEMENTED; the producer sends with SendMessage."""
    seen: list[bytes] = []

    class OldBroker(pb_grpc.BrokerServicer):
        def SendMessage(self, request: pb.SendMessageRequest, context: grpc.ServicerContext) -> pb.SendResponse:
            seen.append(request.body)
            return pb.SendResponse(status=pb.SEND_OK, commitlog_offsets=[0], queue_ids=[0], queue_offsets=[0])

    server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(4))
    pb_grpc.add_BrokerServicer_to_server(OldBroker(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with Producer(f"127.0.0.1:{port}") as p:
            p.send(Message(TOPIC, b"old"), queue_id=0)
            assert p.conn.send_stream.answers == 0
            assert p.conn.send_stream.falling_back()
        assert seen == [b"old"]
    finally:
        server.stop(None)


def test_a_late_answer_is_retried_under_its_uniq_key_and_stored_once(broker: BrokerController, endpoint: str) -> None:
    """The first answer comes after the attempt's timeout (the message stored, the answer held back): the producer
    cancels the stream, sends again on a new one marked retry, and the broker answers from the stored copy."""
    gated = broker.service.send_one
    held = threading.Event()

    def slow_answer(request: pb.SendMessageRequest, context: Any) -> pb.SendResponse:
        response = gated(request, context)
        if not held.is_set():
            held.set()
            time.sleep(1.0)  # stored; the answer is late
        return response

    broker.service.send_one = slow_answer
    with Producer(endpoint, attempt_timeout_s=0.3, timeout_s=20) as p:
        r = p.send(Message(TOPIC, b"once"), queue_id=0)
    assert held.is_set() and r.queue_offset == 0
    assert broker.service.dedup is not None and broker.service.dedup.deduplicated == 1
    assert stored_bodies(endpoint) == [b"once"]


def test_idle_stream_is_closed_and_opened_again(monkeypatch: pytest.MonkeyPatch, broker: BrokerController,
                                                endpoint: str) -> None:
    monkeypatch.setattr(client_stream, "IDLE_CLOSE_S", 0.2)
    with Producer(endpoint) as p:
        p.send(Message(TOPIC, b"1"), queue_id=0)
        deadline = time.monotonic() + 10
        while broker.call_streams.open_count() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert broker.call_streams.open_count() == 0  # the broker's worker thread is free again
        p.send(Message(TOPIC, b"2"), queue_id=0)
        assert p.conn.send_stream.answers == 2 and broker.call_streams.open_count() == 1
    assert stored_bodies(endpoint) == [b"1", b"2"]


def test_a_stopping_broker_ends_idle_streams_at_once(broker_factory: Any) -> None:
    """An idle producer's stream would hold the server's stop for its whole grace period; it is ended instead, and
    the producer's next send is known never to have reached the stopped broker."""
    broker = broker_factory(shutdown_grace_s=30)
    with Producer(f"127.0.0.1:{broker.port}", timeout_s=3) as p:
        p.send(Message(TOPIC, b"before"), queue_id=0)
        assert broker.call_streams.open_count() == 1
        started = time.monotonic()
        broker.shutdown()
        assert time.monotonic() - started < 10, "the stop waited for the idle send stream"
        assert broker.call_streams.open_count() == 0
        with pytest.raises(BrokerUnreachableError) as refused:
            p.send(Message(TOPIC, b"after"), queue_id=0)
        assert refused.value.request_sent is False


def test_a_push_consumer_pulls_each_queue_on_a_stream_and_its_drop_ends_the_hold(
    broker: BrokerController, endpoint: str
) -> None:
    """Each queue's held pull goes on a PullStream; delivery goes on, and the consumer's shutdown ends the streams
    and their held pulls at once (not when the hold would have timed out)."""
    with Admin(endpoint) as admin:
        admin.create_topic(TOPIC, 2)
    got: list[bytes] = []
    lock = threading.Lock()

    def listener(messages: list[ReceivedMessage]) -> None:  # returns nothing: consumed
        with lock:
            got.extend(m.body for m in messages)

    consumer = PushConsumer(endpoint, "pg", {TOPIC: "*"}, listener, consume_from=FIRST, long_poll_ms=30_000,
                            heartbeat_interval_ms=100, rebalance_interval_ms=200).start()
    try:
        with Producer(endpoint) as p:
            for i in range(20):
                p.send(Message(TOPIC, f"p{i}".encode()), queue_id=i % 2)
                time.sleep(0.005)  # each one reaches a held pull
        deadline = time.monotonic() + 20
        while len(got) < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(got) == sorted(f"p{i}".encode() for i in range(20))
        pulled = len(consumer.assigned_message_queues(include_retry=True))  # the topic's 2, the group's retry queue
        deadline = time.monotonic() + 10
        while broker.call_streams.open_count() != pulled and time.monotonic() < deadline:
            time.sleep(0.02)  # the producer's stream ends with its close
        assert broker.call_streams.open_count() == pulled == 3  # one pull stream a queue
        assert broker.hold.held_count() == pulled
    finally:
        started = time.monotonic()
        consumer.shutdown()
    deadline = time.monotonic() + 5
    while (broker.hold.held_count() or broker.call_streams.open_count()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert broker.hold.held_count() == 0 and broker.call_streams.open_count() == 0
    assert time.monotonic() - started < 10  # the 30 s holds ended with their streams

