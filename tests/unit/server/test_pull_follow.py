"""A PullStream that follows its queue (broker/proto/follow.py), on a running broker: one request, then an answer
for each message as it comes, in order; what the broker does not follow (no ``follow``, no hold, an early
NO_NEW_MSG, a refusal); a followed pull checked as a requested one; a stopping broker ends a following stream;
the client's side (``CallStream``): nothing sent for the followed pull, a new stream for any other; a push
consumer that follows still commits its offsets."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from broker.client import FIRST, Admin, Message, Producer, PushConsumer, ReceivedMessage
from broker.client.call_stream import CallStream
from broker.client.message import decode_entries
from broker.errors import ResponseCode
from broker.proto import sluice_pb2 as pb
from broker.proto.follow import continues, followed_pull, may_follow
from broker.server.broker_controller import BrokerController

TOPIC = "FollowT"
HOLD_MS = 5_000


class RawPullStream:
    """A PullStream driven by hand: requests written when the test says, answers read one at a time."""

    def __init__(self, endpoint: str) -> None:
        self.channel = grpc.insecure_channel(endpoint)
        self.requests: queue.SimpleQueue[pb.PullRequest | None] = queue.SimpleQueue()
        method = self.channel.stream_stream("/sluice.v1.Broker/PullStream",
                                            request_serializer=pb.PullRequest.SerializeToString,
                                            response_deserializer=pb.PullStreamAnswer.FromString)  # fmt: skip
        self.answers: Iterator[pb.PullStreamAnswer] = method(iter(self.requests.get, None))
        self.sent = 0

    def ask(self, request: pb.PullRequest) -> None:
        self.requests.put(request)
        self.sent += 1

    def answer(self, timeout_s: float = 10.0) -> pb.PullStreamAnswer:
        """The next answer, or a failed test after ``timeout_s`` (a thread reads it: next() has no timeout)."""
        box: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threading.Thread(target=lambda: box.put(next(self.answers)), daemon=True).start()
        try:
            answer: pb.PullStreamAnswer = box.get(timeout=timeout_s)
        except queue.Empty:
            pytest.fail(f"no answer on the pull stream within {timeout_s} s")
        return answer

    def close(self) -> None:
        self.requests.put(None)
        self.channel.close()


def pull(offset: int, *, follow: bool = True, hold_ms: int = HOLD_MS, max_msgs: int = 32) -> pb.PullRequest:
    return pb.PullRequest(consumer_group="fg", topic=TOPIC, queue_id=0, queue_offset=offset, max_msgs=max_msgs,
                          suspend_timeout_ms=hold_ms, tag_expression="*", follow=follow)  # fmt: skip


def bodies(response: pb.PullResponse) -> list[bytes]:
    return [m.body for m in decode_entries(response.entries, response.entry_positions)]


@pytest.fixture
def topic(endpoint: str) -> str:
    with Admin(endpoint) as admin:
        admin.create_topic(TOPIC, 1)
    return TOPIC


def test_one_request_brings_every_message_as_it_comes_in_order(endpoint: str, topic: str) -> None:
    stream = RawPullStream(endpoint)
    try:
        with Producer(endpoint) as p:
            p.send(Message(topic, b"m0"), queue_id=0)
            stream.ask(pull(0))
            got = bodies(stream.answer().response)
            for i in range(1, 30):
                p.send(Message(topic, f"m{i}".encode()), queue_id=0)
                answer = stream.answer()
                assert answer.following and answer.response.status == pb.FOUND
                assert answer.response.next_begin_offset == i + 1
                got += bodies(answer.response)
        assert got == [f"m{i}".encode() for i in range(30)]
        assert stream.sent == 1
    finally:
        stream.close()


def test_a_pull_without_follow_is_answered_once_and_the_next_request_is_read(endpoint: str, topic: str) -> None:
    stream = RawPullStream(endpoint)
    try:
        with Producer(endpoint) as p:
            p.send(Message(topic, b"a"), queue_id=0)
            p.send(Message(topic, b"b"), queue_id=0)
        stream.ask(pull(0, follow=False, max_msgs=1))
        first = stream.answer()
        assert not first.following and bodies(first.response) == [b"a"]
        stream.ask(pull(1, follow=False, max_msgs=1))  # read: the broker was not following
        second = stream.answer()
        assert not second.following and bodies(second.response) == [b"b"]
    finally:
        stream.close()


def test_no_hold_and_an_early_no_new_msg_are_not_followed(endpoint: str, topic: str) -> None:
    """A pull that may not hold would make a following broker spin: it answers once, and reads again."""
    stream = RawPullStream(endpoint)
    try:
        stream.ask(pull(0, hold_ms=0))
        nothing = stream.answer()
        assert nothing.response.status == pb.NO_NEW_MSG and not nothing.following
        stream.ask(pull(0, hold_ms=300))
        held = stream.answer()  # held its 300 ms, found nothing: followed (another hold of 300 ms)
        assert held.response.status == pb.NO_NEW_MSG and held.following
        assert stream.answer().following  # and again, without a request
    finally:
        stream.close()
    request = pull(0, hold_ms=10_000)
    no_news = pb.PullResponse(status=pb.NO_NEW_MSG, next_begin_offset=0)
    assert not may_follow(request, no_news, 0.05, 60_000)  # answered early: the held-pull budget was used up
    assert may_follow(request, no_news, 2.0, 3_000)  # the broker's cap (3 s) was the hold
    assert not may_follow(request, pb.PullResponse(status=pb.OFFSET_ILLEGAL), 9.0, 60_000)


def test_a_followed_pull_is_checked_as_a_requested_one_and_a_refusal_ends_following(
    broker: BrokerController, endpoint: str, topic: str
) -> None:
    stream = RawPullStream(endpoint)
    try:
        stream.ask(pull(0, hold_ms=300))
        assert stream.answer().following
        with Admin(endpoint) as admin:
            admin.delete_topic(topic)
        deadline = time.monotonic() + 10
        answer = stream.answer()
        while answer.following and time.monotonic() < deadline:  # a hold under way when the topic went
            answer = stream.answer()
        assert answer.code == ResponseCode.TOPIC_NOT_EXIST and not answer.following
        stream.ask(pull(0, hold_ms=0))  # the stream goes on, reading requests again
        assert stream.answer().code == ResponseCode.TOPIC_NOT_EXIST
    finally:
        stream.close()


def test_a_stopping_broker_ends_a_following_stream(broker_factory: Any) -> None:
    broker = broker_factory(shutdown_grace_s=30)
    endpoint = f"127.0.0.1:{broker.port}"
    with Admin(endpoint) as admin:
        admin.create_topic(TOPIC, 1)
    stream = RawPullStream(endpoint)
    try:
        stream.ask(pull(0, hold_ms=30_000))
        time.sleep(0.3)  # held
        started = time.monotonic()
        broker.shutdown()
        assert time.monotonic() - started < 10, "the stop waited for the following stream's 30 s hold"
        assert broker.call_streams.open_count() == 0
    finally:
        stream.close()


def test_the_client_sends_nothing_for_the_followed_pull_and_a_new_stream_for_another(
    broker: BrokerController, endpoint: str, topic: str
) -> None:
    with Producer(endpoint) as p:
        for i in range(5):
            p.send(Message(topic, f"c{i}".encode()), queue_id=0)
    channel = grpc.insecure_channel(endpoint)
    stub_stream = channel.stream_stream("/sluice.v1.Broker/PullStream",
                                        request_serializer=pb.PullRequest.SerializeToString,
                                        response_deserializer=pb.PullStreamAnswer.FromString)  # fmt: skip
    stream = CallStream(stub_stream, follow=(followed_pull, continues))
    try:
        offset, got = 0, []
        for _ in range(5):
            request = pull(offset, max_msgs=1)
            response = stream.call(request, timeout_s=10)
            got += bodies(response)
            offset = response.next_begin_offset
            assert stream.follows(pull(offset, max_msgs=1))
        assert got == [f"c{i}".encode() for i in range(5)]
        assert (stream.sent, stream.answers) == (1, 5)
        with_commit = pull(offset, max_msgs=1)
        with_commit.commit_offset = 3
        assert continues(with_commit, followed_pull(pull(offset - 1, max_msgs=1),
                                                     pb.PullResponse(next_begin_offset=offset)))  # fmt: skip
        back = stream.call(pull(1, max_msgs=2), timeout_s=10)  # another pull: a new stream, the request sent
        assert bodies(back) == [b"c1", b"c2"] and stream.sent == 2
        deadline = time.monotonic() + 5
        while broker.call_streams.open_count() != 1 and time.monotonic() < deadline:
            time.sleep(0.02)  # the first stream, cancelled, ends on the broker
        assert broker.call_streams.open_count() == 1
    finally:
        stream.close()
        channel.close()


def test_a_following_push_consumer_gets_each_message_once_and_commits_its_offset(
    broker: BrokerController, endpoint: str, topic: str
) -> None:
    got: list[bytes] = []
    lock = threading.Lock()

    def listener(messages: list[ReceivedMessage]) -> None:  # returns nothing: consumed
        with lock:
            got.extend(m.body for m in messages)

    consumer = PushConsumer(endpoint, "fpg", {topic: "*"}, listener, consume_from=FIRST, long_poll_ms=30_000,
                            persist_interval_ms=200, heartbeat_interval_ms=100,
                            rebalance_interval_ms=200).start()  # fmt: skip
    try:
        with Producer(endpoint) as p:
            for i in range(40):
                p.send(Message(topic, f"f{i}".encode()), queue_id=0)
                time.sleep(0.003)  # one at a time into the followed pull
        deadline = time.monotonic() + 20
        while len(got) < 40 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert got == [f"f{i}".encode() for i in range(40)]
        worker = next(w for w in consumer._workers.values() if w.key.topic == topic)
        assert worker._stream is not None
        stream = worker._stream[1]
        assert stream.sent < 5 < stream.answers  # the broker followed: no request a message
        deadline = time.monotonic() + 10
        committed: dict[int, int] = {}
        while committed.get(0) != 40 and time.monotonic() < deadline:
            with Admin(endpoint) as admin:
                committed = admin.committed_offsets("fpg", topic)
            time.sleep(0.1)
        assert committed.get(0) == 40  # taken by the periodic commit, not by a pull
    finally:
        consumer.shutdown()
