"""Retry and dead letters through a real broker and a PushConsumer whose listener keeps failing."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

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
from broker.client.outgoing_message import encode_message
from broker.errors import BrokerError, InvalidArgumentError, MessageIllegalError, QueryNotFoundError, ResponseCode
from broker.format.message import Prop, StoredMessage, SysFlag, parse_msg_id
from broker.proto import sluice_pb2 as pb
from broker.semantics.retry import DLQ_ORIGIN_MESSAGE_ID, DLQ_ORIGIN_TOPIC
from broker.server.broker_controller import BrokerController
from broker.store import GetStatus
from tests.support.waiting import wait_until

FAST = {"heartbeat_interval_ms": 200, "rebalance_interval_ms": 300, "persist_interval_ms": 200, "long_poll_ms": 1000}


def dead_letters(broker: BrokerController, group: str) -> list[ReceivedMessage]:
    assert broker.store is not None
    r = broker.store.get_message("inspector", f"%DLQ%{group}", 0, 0, 64)
    return r.messages() if r.status is GetStatus.FOUND else []


def test_message_failing_17_times_ends_in_the_dlq_with_its_history(broker: BrokerController, endpoint: str) -> None:
    calls: Counter[str] = Counter()
    seen_reconsume: list[int] = []
    lock = threading.Lock()

    def always_fails(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        with lock:
            for m in msgs:
                calls[m.properties.get(Prop.ORIGIN_MESSAGE_ID, m.msg_id)] += 1
                seen_reconsume.append(m.reconsume_times)
                assert m.topic == "Fragile"  # retried messages are shown under their own topic
        return ConsumeStatus.RECONSUME_LATER

    with Producer(endpoint) as producer:
        sent = producer.send(Message("Fragile", b"poison", keys=["p1"], properties={"n": "1"}))
    with PushConsumer(endpoint, "fragile-group", {"Fragile": "*"}, always_fails, consume_from=FIRST, **FAST):
        wait_until(lambda: dead_letters(broker, "fragile-group") != [], "dead letter", timeout_s=60)
    assert calls == {sent.msg_id: 17}
    assert seen_reconsume == list(range(17))
    (dead,) = dead_letters(broker, "fragile-group")
    assert dead.body == b"poison" and dead.reconsume_times == 17 and dead.properties["n"] == "1"
    assert dead.properties[Prop.RETRY_TOPIC] == "Fragile" and dead.properties[DLQ_ORIGIN_TOPIC] == "Fragile"
    assert dead.properties[Prop.ORIGIN_MESSAGE_ID] == sent.msg_id == dead.properties[DLQ_ORIGIN_MESSAGE_ID]
    with PullConsumer(endpoint, "fragile-group") as consumer:  # a DLQ is never redelivered
        with pytest.raises(BrokerError) as refused:
            consumer.pull("%DLQ%fragile-group", 0, 0)
        assert refused.value.code is ResponseCode.NO_PERMISSION and "dead-letter" in refused.value.message


def test_group_settings_retry_max_times_and_consume_enable(broker: BrokerController, endpoint: str) -> None:
    with Admin(endpoint) as admin:
        cfg = admin.update_subscription_group("short-fuse", retry_max_times=2)
        assert cfg.retry_max_times == 2 and cfg.consume_enable and cfg.retry_queue_nums == 1
    calls: list[int] = []

    def fails(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        calls.extend(m.reconsume_times for m in msgs)
        raise RuntimeError("simulated failure")

    with Producer(endpoint) as producer:
        producer.send(Message("Short", b"x"))
    with PushConsumer(endpoint, "short-fuse", {"Short": "*"}, fails, consume_from=FIRST, **FAST):
        wait_until(lambda: dead_letters(broker, "short-fuse") != [], "dead letter", timeout_s=30)
    assert calls == [0, 1, 2]
    with Admin(endpoint) as admin:
        assert admin.update_subscription_group("short-fuse", consume_enable=False).consume_enable is False
    with PullConsumer(endpoint, "short-fuse") as consumer, pytest.raises(BrokerError, match="consumeEnable=false"):
        consumer.pull("Short", 0, 0)
    assert broker.config.config_dir.joinpath("subscriptionGroup.json").read_text().count('"consumeEnable": false') == 1


def test_success_after_retries_and_max_reconsume_from_the_client(broker: BrokerController, endpoint: str) -> None:
    attempts: Counter[bytes] = Counter()
    done: list[bytes] = []

    def flaky(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        for m in msgs:
            attempts[m.body] += 1
            if m.body == b"3" and attempts[m.body] < 3:
                return ConsumeStatus.RECONSUME_LATER
        done.extend(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    with Producer(endpoint) as producer:
        producer.send_batch([Message("Flaky2", f"{i}".encode()) for i in range(8)])
    with PushConsumer(endpoint, "flaky2", {"Flaky2": "*"}, flaky, consume_from=FIRST, max_reconsume_times=5, **FAST):
        wait_until(lambda: len(done) == 8, "all consumed", timeout_s=30)
    assert sorted(done, key=int) == [f"{i}".encode() for i in range(8)] and attempts[b"3"] == 3
    assert dead_letters(broker, "flaky2") == []


def test_broadcasting_refused_when_the_group_disables_it(broker: BrokerController, endpoint: str) -> None:
    with Admin(endpoint) as admin:
        admin.update_subscription_group("no-bc", consume_broadcast_enable=False)
    consumer = PushConsumer(endpoint, "no-bc", {"Bc": "*"}, lambda msgs: None, model=BROADCASTING, **FAST)
    with pytest.raises(BrokerError, match="consumeBroadcastEnable=false"):
        consumer.start()
    with pytest.raises(ValueError, match="closed channel"):  # the failed start closed its connection
        consumer.conn.stub.GetBrokerStats(pb.GetBrokerStatsRequest())


def _raw_send_back(endpoint: str, group: str, msg_id: str = "", commitlog_offset: int = 0) -> None:
    with PullConsumer(endpoint, group) as consumer:
        request = (pb.ConsumerSendMsgBackRequest(consumer_group=group, msg_id=msg_id) if msg_id else
                   pb.ConsumerSendMsgBackRequest(consumer_group=group, commitlog_offset=commitlog_offset))
        consumer.conn.call(consumer.conn.stub.ConsumerSendMsgBack, request)


def test_send_back_refuses_what_was_never_delivered(broker: BrokerController, endpoint: str) -> None:
    """An open or rolled-back half, or a pending delayed message, copied to %RETRY% would reach consumers."""
    with Producer(endpoint) as producer, Admin(endpoint) as admin:
        entry = encode_message(Message("Secret", b"uncommitted"), 0)
        (half,) = producer.send_encoded(entry, 1, transaction_id="secret:1", as_halves=True)
        (rolled,) = producer.send_encoded(entry, 1, transaction_id="secret:2", as_halves=True)
        assert admin.end_transaction("secret:2", commit=False) == "ROLLED_BACK"
        delayed = producer.send(Message("Later", b"in 5 s", properties={Prop.DELAY: "2"}))
        for msg_id in (half.msg_id, rolled.msg_id, delayed.msg_id):
            with pytest.raises(InvalidArgumentError, match="never delivered"):
                _raw_send_back(endpoint, "snoop", msg_id)
        # written in place: open or rolled back, no reader can name it (nor look it up)
        (open_row,) = producer.send_encoded(entry, 1, transaction_id="secret:3")
        (rolled_row,) = producer.send_encoded(entry, 1, transaction_id="secret:4")
        assert admin.end_transaction("secret:4", commit=False) == "ROLLED_BACK"
        for msg_id in (open_row.msg_id, rolled_row.msg_id):
            with pytest.raises(QueryNotFoundError, match="no message"):
                _raw_send_back(endpoint, "snoop", msg_id)
        with pytest.raises(InvalidArgumentError, match="never delivered"):  # by offset too
            _raw_send_back(endpoint, "snoop", commitlog_offset=parse_msg_id(half.msg_id).commitlog_offset)
        with pytest.raises(QueryNotFoundError):
            _raw_send_back(endpoint, "snoop2", commitlog_offset=10**9)
        names = {t.topic for t in admin.list_topics()}
        assert not {"%RETRY%snoop", "%DLQ%snoop", "%RETRY%snoop2"} & names, names
        assert admin.end_transaction("secret:1", commit=False) == "ROLLED_BACK"


def test_raising_retry_queue_nums_grows_the_retry_topic(broker: BrokerController, endpoint: str) -> None:
    """Send-back picks among retryQueueNums queues; a retry topic made with fewer must grow, or the others strand."""
    with Producer(endpoint) as producer, Admin(endpoint) as admin:
        sent = producer.send(Message("Grow", b"again"), queue_id=0)
        with PullConsumer(endpoint, "grower") as consumer:
            (msg,) = consumer.pull("Grow", 0, 0).messages
            consumer.send_back(msg)  # makes %RETRY%grower with 1 queue
            assert admin.topic_info("%RETRY%grower").write_queue_nums == 1
            admin.update_subscription_group("grower", retry_queue_nums=8)
            for _ in range(20):
                consumer.send_back(msg)
        info = admin.topic_info("%RETRY%grower")
        assert info.read_queue_nums == info.write_queue_nums == 8
        wait_until(lambda: sum(h for _, h in admin.queue_offsets("%RETRY%grower").values()) == 21,
                   "every retry delivered to a readable queue", timeout_s=20)
    assert sent.msg_id


def test_a_new_consumer_from_last_still_gets_waiting_retries(broker: BrokerController, endpoint: str) -> None:
    """RocketMQ starts %RETRY% queues at 0 for CONSUME_FROM_LAST_OFFSET: the retries wait for this group."""
    with Producer(endpoint) as producer:
        producer.send(Message("Late", b"retry me"), queue_id=0)
    with PullConsumer(endpoint, "latecomer") as consumer:
        (msg,) = consumer.pull("Late", 0, 0).messages
        consumer.send_back(msg)
        wait_until(lambda: consumer.queue_offsets("%RETRY%latecomer")[0][1] == 1, "retry due", timeout_s=20)
        consumer.commit_offsets({("Late", 0): 1})
    got: list[bytes] = []
    with PushConsumer(endpoint, "latecomer", {"Late": "*"}, lambda ms: got.extend(m.body for m in ms)
                      or ConsumeStatus.CONSUME_SUCCESS, **FAST):
        wait_until(lambda: got == [b"retry me"], "the waiting retry", timeout_s=20)


def test_a_raw_send_back_without_max_reconsume_times_retries(broker: BrokerController, endpoint: str) -> None:
    """proto3's default 0 does not mean "no retries" (the message would go straight to the DLQ)."""
    with Producer(endpoint) as producer:
        sent = producer.send(Message("RawBack", b"once more"), queue_id=0)
    _raw_send_back(endpoint, "raw-back", sent.msg_id)
    with PullConsumer(endpoint, "raw-back") as consumer:
        wait_until(lambda: consumer.queue_offsets("%RETRY%raw-back")[0][1] == 1, "the retry", timeout_s=20)
    assert dead_letters(broker, "raw-back") == []
    zero = pb.ConsumerSendMsgBackRequest(consumer_group="raw-back", msg_id=sent.msg_id, max_reconsume_times=0)
    with PullConsumer(endpoint, "raw-back") as consumer:  # an explicit 0 still means no retry
        assert consumer.conn.call(consumer.conn.stub.ConsumerSendMsgBack, zero).dead_letter


def test_a_group_name_too_long_for_its_retry_topic_is_refused(broker: BrokerController, endpoint: str) -> None:
    """Topic names stop at 127 characters, so a group of 121..127 could never have its %RETRY% topic: every
    heartbeat and send-back failed naming a topic the user never chose, after recording the group."""
    assert broker.groups is not None
    with Producer(endpoint) as producer:
        sent = producer.send(Message("T", b"x"), queue_id=0)
    offset = int(sent.msg_id[-16:], 16)
    too_long, longest = "g" * 121, "g" * 120  # heartbeats below are CLUSTERING (the default): they make %RETRY%
    with Admin(endpoint) as admin:
        for call, request in (
            (admin.conn.stub.Heartbeat, pb.HeartbeatRequest(consumer_group=too_long, client_id="c1")),
            (admin.conn.stub.ConsumerSendMsgBack,
             pb.ConsumerSendMsgBackRequest(consumer_group=too_long, commitlog_offset=offset)),
        ):
            with pytest.raises(InvalidArgumentError, match=r"at most 120 characters.*%RETRY%"):
                admin.conn.call(call, request)
        assert too_long not in {g.group_name for g in broker.groups.groups()}  # nothing recorded
        assert broker.topics.get("%RETRY%" + too_long) is None
        admin.conn.call(admin.conn.stub.Heartbeat, pb.HeartbeatRequest(consumer_group=longest, client_id="c1"))
        request = pb.ConsumerSendMsgBackRequest(consumer_group=longest, commitlog_offset=offset)
        back = admin.conn.call(admin.conn.stub.ConsumerSendMsgBack, request)
    assert back.topic == "%RETRY%" + longest and broker.topics.get(back.topic) is not None


def test_reconsume_times_from_a_client_are_checked(broker: BrokerController, endpoint: str) -> None:
    """A negative count sent by a client made its send-back skip the retry delay and retry more times before the
    DLQ; the highest count could not be increased, and its send-back failed with 'the consumer should retry'."""
    with Admin(endpoint) as admin:
        request = pb.SendMessageRequest(producer_group="P", topic="T", queue_id=0, body=b"x", reconsume_times=-5)
        with pytest.raises(MessageIllegalError, match="reconsume_times=-5 is negative"):
            admin.conn.call(admin.conn.stub.SendMessage, request)
        request = pb.SendMessageRequest(producer_group="P", topic="T", queue_id=0, body=b"x",
                                        reconsume_times=2**31 - 1)
        offset = admin.conn.call(admin.conn.stub.SendMessage, request).commitlog_offsets[0]
        request = pb.ConsumerSendMsgBackRequest(consumer_group="G", commitlog_offset=offset)
        back = admin.conn.call(admin.conn.stub.ConsumerSendMsgBack, request)
    assert back.dead_letter and back.topic == "%DLQ%G" and back.reconsume_times == 2**31 - 1


def test_a_committed_row_written_in_place_goes_back_as_a_committed_message(
    broker: BrokerController, endpoint: str
) -> None:
    """A delivered row of a transaction that wrote in place carries PREPARED in its SYSFLAG (with its slice's
    handle); its retry copy is a committed message, which its queue takes and readers see."""
    assert broker.store is not None
    with Producer(endpoint) as producer, Admin(endpoint) as admin:
        (row,) = producer.send_encoded(encode_message(Message("Shown", b"row"), 0), 1, transaction_id="shown:1")
        assert admin.end_transaction("shown:1", commit=True) == "COMMITTED"
    _raw_send_back(endpoint, "again", row.msg_id)
    (copy,) = [m for m in _schedule_messages(broker) if m.body == b"row"]
    assert SysFlag.transaction_type(copy.sys_flag) == SysFlag.TRANSACTION_COMMIT_TYPE, copy.sys_flag


def _schedule_messages(broker: BrokerController) -> list[StoredMessage]:
    assert broker.store is not None and broker.store.wait_dispatched()
    out: list[StoredMessage] = []
    for qid in broker.store.queue_ids("SCHEDULE_TOPIC_XXXX"):
        res = broker.store.get_message("t", "SCHEDULE_TOPIC_XXXX", qid, 0, 100)
        out += res.messages()
    return out
