"""The Producer and PullConsumer over the remoting transport (``remoting://host:port``) against a real broker
process serving both ports: the same results and messages as over gRPC, field for field, and the same error
classes for refusals."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.client import Admin, Message, Producer, PullConsumer
from broker.client.remoting_transport import RemotingConnection, batch_runs
from broker.client.results import PullStatus, SendResult, SendStatus
from broker.errors import BrokerError, BrokerUnreachableError, InvalidArgumentError, TopicNotExistError
from broker.format.message import Prop, encode_entry
from broker.remoting.message_batch import decode_batch
from tests.support.cluster import small_store_config
from tests.support.remoting_wire import remoting_broker

TOPIC = "RemoClient"
QUEUES = 4


@dataclass
class Ends:
    grpc: str
    remoting: str


@pytest.fixture(scope="module")
def ends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ends]:
    root: Path = tmp_path_factory.mktemp("remoting-client")
    with remoting_broker(root, config=small_store_config(root)) as broker:
        with Admin(broker.endpoint) as admin:
            admin.create_topic(TOPIC, QUEUES)
        yield Ends(broker.endpoint, "remoting://" + broker.remoting_endpoint)


def fields(m: object) -> dict[str, object]:
    names = ("topic", "queue_id", "queue_offset", "commitlog_offset", "body", "tags", "keys", "properties", "flag",
             "sys_flag", "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times", "msg_id",
             "prepared_transaction_offset", "store_size")
    return {n: getattr(m, n) for n in names}


def test_a_send_over_remoting_reads_back_the_same_over_both_transports(ends: Ends) -> None:
    msg = Message(TOPIC, b"every field", tags="TagA", keys="k1 k2", properties={"color": "red", "n": "1"}, flag=7)
    with Producer(ends.remoting) as p:
        assert isinstance(p.conn, RemotingConnection)
        sent = p.send(msg, queue_id=2)
    assert isinstance(sent, SendResult) and sent.status is SendStatus.SEND_OK and sent.queue_id == 2
    assert len(sent.msg_id) == 32 and len(sent.uniq_key) == 32 and sent.broker_name == ""
    with PullConsumer(ends.remoting, "rc-fields") as rc, PullConsumer(ends.grpc, "rc-fields") as gc:
        over_remoting = rc.pull(TOPIC, 2, sent.queue_offset, max_msgs=1)
        over_grpc = gc.pull(TOPIC, 2, sent.queue_offset, max_msgs=1)
    assert over_remoting.status is PullStatus.FOUND
    assert over_remoting[2:] == over_grpc[2:]  # next_begin_offset, min_offset, max_offset
    (got,), (want,) = over_remoting.messages, over_grpc.messages
    # Field for field, but for the address in the ids: over remoting they lead to the remoting port (this broker's
    # is port 0, so its store writes the gRPC address; docs/remoting.md, "Message ids").
    ids = ("store_host", "msg_id")
    assert {k: v for k, v in fields(got).items() if k not in ids} == {
        k: v for k, v in fields(want).items() if k not in ids
    }
    assert got.store_host == ends.remoting.removeprefix("remoting://") and got.msg_id[-16:] == want.msg_id[-16:]
    assert got.body == b"every field" and got.tags == "TagA" and got.keys == ["k1", "k2"] and got.flag == 7
    assert got.properties["color"] == "red" and got.properties[Prop.UNIQ_KEY] == sent.uniq_key
    assert got.msg_id == sent.msg_id and got.queue_offset == sent.queue_offset


def test_a_spread_batch_answers_as_over_grpc(ends: Ends) -> None:
    msgs = [Message(TOPIC, b"batch-%d" % i, tags="B") for i in range(4 * QUEUES)]
    with Producer(ends.remoting) as p, Producer(ends.grpc) as g:
        results = list(p.send_batch(msgs))
        reference = list(g.send_batch(msgs))
        pinned = list(p.send_batch(msgs[:5], queue_id=1))
    assert [type(r) for r in results] == [type(r) for r in reference] == [SendResult] * len(msgs)
    assert sorted(r.queue_id for r in results) == sorted(r.queue_id for r in reference)  # 4 per queue, runs
    assert {r.queue_id for r in pinned} == {1} and [r.queue_offset for r in pinned] == list(
        range(pinned[0].queue_offset, pinned[0].queue_offset + 5)
    )
    with PullConsumer(ends.grpc, "rc-batch") as gc:
        for msg, r in zip(msgs + msgs[:5], results + pinned, strict=True):
            (stored,) = gc.pull(TOPIC, r.queue_id, r.queue_offset, max_msgs=1).messages
            assert (stored.body, stored.tags, stored.msg_id[-16:]) == (msg.body, "B", r.msg_id[-16:])  # offsets
            assert stored.properties[Prop.UNIQ_KEY] == r.uniq_key


def test_pull_commit_and_offsets_match_grpc(ends: Ends) -> None:
    with Producer(ends.grpc) as g:
        for i in range(6):
            g.send(Message(TOPIC, b"q3-%d" % i, tags="Odd" if i % 2 else "Even"), queue_id=3)
    with PullConsumer(ends.remoting, "rc-offsets") as rc, PullConsumer(ends.grpc, "rc-offsets") as gc:
        lo, hi = gc.queue_offsets(TOPIC)[3]
        assert rc.queue_offsets(TOPIC) == gc.queue_offsets(TOPIC)
        odd = rc.pull(TOPIC, 3, lo, max_msgs=32, tags="Odd")
        assert [m.body for m in odd.messages] == [m.body for m in gc.pull(TOPIC, 3, lo, tags="Odd").messages]
        assert {m.tags for m in odd.messages} == {"Odd"}
        rc.pull(TOPIC, 3, lo, max_msgs=1, commit_offset=lo + 1)  # the commit a pull carries
        assert gc.committed_offsets(TOPIC) == {3: lo + 1}
        rc.commit_offsets({(TOPIC, 0): 0, (TOPIC, 3): hi})
        assert rc.committed_offsets(TOPIC) == gc.committed_offsets(TOPIC) == {0: 0, 3: hi}
        assert rc.pull(TOPIC, 3, hi).status is PullStatus.NO_NEW_MSG
        assert rc.pull(TOPIC, 3, hi + 100).status is gc.pull(TOPIC, 3, hi + 100).status


def test_a_held_pull_answers_when_a_message_arrives(ends: Ends) -> None:
    with PullConsumer(ends.remoting, "rc-held") as rc, Producer(ends.grpc) as g:
        hi = rc.queue_offsets(TOPIC)[0][1]
        sender = threading.Timer(0.3, lambda: g.send(Message(TOPIC, b"late"), queue_id=0))
        sender.start()
        started = time.monotonic()
        result = rc.pull(TOPIC, 0, hi, timeout_ms=5000)
        sender.join()
    assert result.status is PullStatus.FOUND and result.messages[0].body == b"late"
    assert time.monotonic() - started < 4.0


def test_refusals_raise_the_same_error_classes(ends: Ends) -> None:
    with PullConsumer(ends.remoting, "rc-err") as rc, PullConsumer(ends.grpc, "rc-err") as gc:
        for consumer in (rc, gc):
            with pytest.raises(TopicNotExistError):
                consumer.pull("NoSuchRemoTopic", 0, 0)
            with pytest.raises(TopicNotExistError):
                consumer.queue_offsets("NoSuchRemoTopic")
    with Producer(ends.remoting) as p, Producer(ends.grpc) as g:
        too_big = Message(TOPIC, b"x" * (5 * 1024 * 1024))
        for producer in (p, g):
            with pytest.raises(BrokerError) as refused:
                producer.send(too_big, queue_id=0)
            assert refused.value.code is not None
        with pytest.raises(InvalidArgumentError, match="not offered over the remoting"):
            p.conn.call(p.conn.stub.EndTransaction, None)
    with pytest.raises(BrokerUnreachableError) as unreachable, Producer("remoting://127.0.0.1:1") as nowhere:
        nowhere.send(Message(TOPIC, b"x"), queue_id=0)
    assert unreachable.value.request_sent is False


def test_batch_runs_copy_bodies_and_properties_as_rocketmq_batches() -> None:
    props = b"TAGS\x01T\x02UNIQ_KEY\x01ABC\x02"
    entries = b"".join(
        encode_entry(b"Topic", q, b"body-%d" % i, props, flag=i, born_timestamp=42) for i, q in enumerate([1, 1, 2])
    )
    runs = batch_runs(entries)
    assert [(t, q, born, n) for t, q, _, born, _, n in runs] == [("Topic", 1, 42, 2), ("Topic", 2, 42, 1)]
    items = decode_batch(runs[0][4])
    assert [(i.body, i.flag, i.properties) for i in items] == [
        (b"body-0", 0, {"TAGS": "T", "UNIQ_KEY": "ABC"}),
        (b"body-1", 1, {"TAGS": "T", "UNIQ_KEY": "ABC"}),
    ]
    with pytest.raises(InvalidArgumentError):
        batch_runs(entries[:-1])


def test_one_connection_serves_threads_at_once_and_a_held_pull_blocks_no_one(ends: Ends) -> None:
    """The callers read their own answers (remoting_wire.py): a held pull on the connection leaves the others'
    calls answered at once, and sends from several threads each get their own answer."""
    with PullConsumer(ends.remoting, "rc-threads") as rc, Producer(ends.remoting) as p:
        hi = rc.queue_offsets(TOPIC)[1][1]
        held: list[object] = []
        holder = threading.Thread(target=lambda: held.append(rc.pull(TOPIC, 1, hi, timeout_ms=8000)))
        holder.start()
        time.sleep(0.2)  # the held pull is waiting on the broker, its caller reading the connection
        started = time.monotonic()
        for _ in range(5):
            assert rc.pull(TOPIC, 0, 0, max_msgs=1).status in (PullStatus.FOUND, PullStatus.NO_NEW_MSG)
        assert time.monotonic() - started < 4.0  # not behind the held pull
        results: list[SendResult] = []
        lock = threading.Lock()

        def send_many(n: int) -> None:
            for i in range(n):
                r = p.send(Message(TOPIC, b"t%d" % i), queue_id=3)
                with lock:
                    results.append(r)

        senders = [threading.Thread(target=send_many, args=(20,)) for _ in range(4)]
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        assert len({r.queue_offset for r in results}) == 80 and len({r.msg_id for r in results}) == 80
        p.send(Message(TOPIC, b"for the held pull"), queue_id=1)
        holder.join(timeout=10)
    (result,) = held
    assert result.status is PullStatus.FOUND and result.messages[0].body == b"for the held pull"  # type: ignore[attr-defined]
