"""Attacks of the classes issue 43 lists, made on other paths than its own tests (test_auth_resolved.py): a user
holding rights on its own topic and group only, raw calls signed by it against one broker process with auth. Each
asserts the refusal and that nothing changed where it matters (the victim's topic holds nothing forged, the
attacker's retry and dead-letter topics hold nothing copied, the victim's pop still in flight)."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as v2s

from broker.client import Message, encode_message
from broker.client.credentials import Credentials
from broker.client.half_batch import to_half_batch
from broker.errors import (
    BrokerError,
    InvalidReceiptHandleError,
    MessageIllegalError,
    NoPermissionError,
    QueryNotFoundError,
    ResponseCode,
)
from broker.format.message import Prop, msg_id_at
from broker.format.system_topics import SCHEDULE_TOPIC, TIMER_TOPIC
from broker.private_file import write_private
from broker.proto import sluice_pb2 as pb
from broker.proto import sluice_pb2_grpc as pb_grpc
from broker.server.process import BrokerProcess
from tests.support.auth_process import ROOT, SETTINGS, Secured, secured_broker, unique, v2_refused
from tests.support.waiting import wait_until

# The first delay level is 1 s (message_delay_level's default): a forged delivery would land within that.
FIRST_LEVEL_S = 1.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    with secured_broker(tmp_path_factory.mktemp("auth-redteam")) as broker:
        yield broker


def send_props(broker: Secured, topic: str, properties: dict[str, str], creds: Credentials) -> pb.SendResponse:
    return broker.call("SendMessage", pb.SendMessageRequest(topic=topic, queue_id=0, body=b"forged",
                                                            properties=properties), creds)


def _wait_stored(broker: Secured, topic: str, count: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while broker.max_offset(topic) < count:
        assert time.monotonic() < deadline, f"{topic} holds {broker.max_offset(topic)} of {count}"
        time.sleep(0.05)


# ------------------------------------------------------------------------------------------------ forged delivery
def test_a_delayed_or_timed_send_cannot_name_where_the_broker_delivers_it(broker: Secured) -> None:
    """RocketMQ's classic forgery: a plain send to one's own topic carrying REAL_TOPIC/REAL_QID of another topic and
    a delay (or a timer): the broker must deliver it into the topic the sender had Pub on, never the named one."""
    victim, own = broker.topic(unique("VictimT")), broker.topic(unique("AttT"))
    attacker = broker.user((f"Topic:{own}", "Pub"))
    forged = {Prop.REAL_TOPIC: victim, Prop.REAL_QID: "0"}
    send_props(broker, own, {**forged, Prop.DELAY: "1"}, attacker)
    send_props(broker, own, {**forged, Prop.TIMER_DELAY_MS: "200"}, attacker)
    batch = b"".join(
        encode_message(Message(own, b"forged %d" % i, properties=p), 0)
        for i, p in enumerate(({**forged, Prop.DELAY: "1"}, {**forged, Prop.TIMER_DELAY_MS: "200"}))
    )
    broker.call("SendBatch", pb.SendBatchRequest(entries=batch, count=2), attacker)
    _wait_stored(broker, own, 4, timeout_s=10 * FIRST_LEVEL_S)  # all four delivered, into the sender's topic
    assert broker.max_offset(victim) == 0


def test_no_send_path_writes_into_a_system_topic(broker: Secured) -> None:
    """A message written straight into the schedule or timer queue would be delivered to its REAL_TOPIC by the
    broker: such writes are refused on every send path, even to a user with Pub on every topic."""
    victim = broker.topic(unique("VictimT"))
    attacker = broker.user(("Topic:*", "Pub"))
    forged = {Prop.REAL_TOPIC: victim, Prop.REAL_QID: "0", Prop.DELAY: "1", Prop.TIMER_DELIVER_MS: "1"}
    before = {t: broker.max_offset(t) for t in (SCHEDULE_TOPIC, TIMER_TOPIC)}
    for system in (SCHEDULE_TOPIC, TIMER_TOPIC):
        with pytest.raises(MessageIllegalError):
            send_props(broker, system, forged, attacker)
        entry = encode_message(Message(system, b"forged", properties=forged), 0)
        with pytest.raises(BrokerError):
            broker.call("SendBatch", pb.SendBatchRequest(entries=entry, count=1), attacker)
    # nor, with Pub on every topic, into another group's retry or dead-letter topic (decided as that group)
    group = unique("VictimG")
    for name in (f"%RETRY%{group}", f"%DLQ%{group}"):
        with pytest.raises(NoPermissionError, match=f"lacks Pub on Topic:{name}"):
            send_props(broker, name, {}, attacker)
        assert broker.max_offset(name) == 0
    time.sleep(FIRST_LEVEL_S * 1.5)
    assert {t: broker.max_offset(t) for t in before} == before
    assert broker.max_offset(victim) == 0


def test_a_retry_is_answered_only_with_messages_the_caller_may_publish_to(broker: Secured) -> None:
    """A retried send is answered with where its first attempt was stored (broker/server/send_dedup.py): a batch
    replayed under another user's UNIQ_KEYs is refused on that user's topic, and a send to one's own topic under the
    UNIQ_KEY of another topic's delayed message (it waits in the schedule topic) is stored as a new message."""
    victim, own = broker.topic(unique("VictimT")), broker.topic(unique("AttT"))
    attacker = broker.user((f"Topic:{own}", "Pub"))
    keys = [secrets.token_hex(16).upper() for _ in range(2)]
    batch = b"".join(
        encode_message(Message(victim, b"victim %d" % i, properties={Prop.UNIQ_KEY: k}), 0) for i, k in enumerate(keys)
    )
    broker.call("SendBatch", pb.SendBatchRequest(entries=batch, count=2))
    with pytest.raises(NoPermissionError, match=f"lacks Pub on Topic:{victim}"):
        broker.call("SendBatch", pb.SendBatchRequest(entries=batch, count=2, retry=True), attacker)
    later = secrets.token_hex(16).upper()
    delayed = {Prop.UNIQ_KEY: later, Prop.DELAY: "3"}  # the third level: 10 s in the schedule topic
    stored = broker.call("SendMessage", pb.SendMessageRequest(topic=victim, queue_id=0, body=b"later",
                                                              properties=delayed))
    answer = broker.call("SendMessage", pb.SendMessageRequest(topic=own, queue_id=0, body=b"mine",
                                                              properties={Prop.UNIQ_KEY: later}, retry=True), attacker)
    assert list(answer.commitlog_offsets) != list(stored.commitlog_offsets)
    # a queue counts a message once the dispatcher has passed it, moments after the answer on a loaded machine
    wait_until(lambda: broker.max_offset(own) >= 1, "the attacker's message in its own topic", timeout_s=10)
    assert broker.max_offset(own) == 1, "the attacker's send was answered with the victim's delayed message"
    assert broker.max_offset(victim) == 2


def test_a_transaction_cannot_commit_into_a_topic_its_producer_may_not_publish_to(broker: Secured) -> None:
    """Halves carry their real topic: a half naming another topic (a SendMessage half with REAL_TOPIC, a SendBatch
    already in half form, a SendBatch stored in place) is refused at the send, so no commit can deliver it."""
    victim, own, group = broker.topic(unique("VictimT")), broker.topic(unique("AttT")), unique("AttP")
    attacker = broker.user((f"Topic:{own}", "Pub"), (f"Group:{group}", "Pub"))
    txn = unique("att-txn-")
    with pytest.raises(MessageIllegalError):
        broker.call("SendMessage", pb.SendMessageRequest(
            topic=own, queue_id=0, body=b"forged", producer_group=group, transactional=True, transaction_id=txn,
            properties={Prop.REAL_TOPIC: victim, Prop.REAL_QID: "0"}), attacker)
    plain = encode_message(Message(victim, b"forged half"), 0)
    for entries in (to_half_batch(plain, group, txn), plain):  # half form; for its real topic (stored in place)
        with pytest.raises(NoPermissionError, match=f"lacks Pub on Topic:{victim}"):
            broker.call("SendBatch", pb.SendBatchRequest(entries=entries, count=1, producer_group=group,
                                                         transaction_id=txn), attacker)
    assert broker.transaction(txn) is None
    assert broker.max_offset(victim) == 0


# ------------------------------------------------------------------------------------------------ receipt handles
def test_a_receipt_handle_of_another_groups_pop_moves_nothing(broker: Secured) -> None:
    """Pop handles are signed with their group and topic: naming one's own group and topic with the victim's
    handle neither acks the victim's message nor copies it into one's own dead-letter topic."""
    victim_topic, victim_group = broker.topic(unique("VictimT")), unique("VictimG")
    own_topic, own_group = broker.topic(unique("AttT")), unique("AttG")
    broker.send(victim_topic, b"the victim's secret body")
    popped = broker.call("PopMessage", pb.PopRequest(consumer_group=victim_group, topic=victim_topic, max_msgs=1,
                                                     invisible_time_ms=60_000))
    handle = popped.receipt_handles[0]
    attacker = broker.user((f"Topic:{own_topic}", "Sub"), (f"Group:{own_group}", "Sub"))
    acked = broker.call("AckMessage", pb.AckMessageRequest(consumer_group=own_group, topic=own_topic,
                                                           receipt_handles=[handle]), attacker)
    assert acked.errors[0]  # refused, not acked
    change = pb.ChangeInvisibleTimeRequest(consumer_group=own_group, topic=own_topic, receipt_handle=handle,
                                           invisible_time_ms=0)
    with pytest.raises(InvalidReceiptHandleError):
        broker.call("ChangeInvisibleTime", change, attacker)
    forward = v2s.ForwardMessageToDeadLetterQueueRequest(
        group=v2.Resource(name=own_group), topic=v2.Resource(name=own_topic), receipt_handle=handle,
        message_id="x", delivery_attempt=1, max_delivery_attempts=1)
    answer = broker.v2("ForwardMessageToDeadLetterQueue", forward, attacker)
    assert answer.status.code == v2.Code.INVALID_RECEIPT_HANDLE, answer
    for named_group, named_topic in ((victim_group, own_topic), (own_group, victim_topic)):
        forward.group.name, forward.topic.name = named_group, named_topic
        assert v2_refused(lambda: broker.v2("ForwardMessageToDeadLetterQueue", forward, attacker))
    assert broker.max_offset(f"%DLQ%{own_group}") == 0
    # the victim's delivery is still its own: its handle acks it
    mine = broker.call("AckMessage", pb.AckMessageRequest(consumer_group=victim_group, topic=victim_topic,
                                                          receipt_handles=[handle]), ROOT)
    assert list(mine.errors) == [""]


# ---------------------------------------------------------------------------------------- a group's view of topics
def _lagged_topics(broker: Secured, group: str, creds: Credentials) -> set[str]:
    answer = broker.call("GetConsumerLag", pb.GetConsumerLagRequest(consumer_group=group), creds)
    return {q.topic for q in answer.queues}


def test_a_groups_right_does_not_show_the_offsets_of_a_topic_the_caller_may_not_read(broker: Secured) -> None:
    """A right on one's own group is no right on the topics it names: a heartbeat subscribing another topic, a
    reset of the group's offsets on it, and the lag of "every topic of the group" would each tell (or set) what a
    read of that topic's offsets needs a right on the topic for (Kafka asks Read on the topic for each)."""
    victim, own, group = broker.topic(unique("VictimT")), broker.topic(unique("AttT")), unique("AttG")
    for i in range(3):
        broker.send(victim, b"victim %d" % i)
    attacker = broker.user((f"Group:{group}", "Sub,Update"), (f"Topic:{own}", "Sub"))
    with pytest.raises(NoPermissionError, match=f"lacks Sub on Topic:{victim}"):
        broker.call("Heartbeat", pb.HeartbeatRequest(client_id="att-1", consumer_group=group,
                                                     subscriptions={own: "*", victim: "*"}), attacker)
    assert broker.call("GetConsumerList", pb.GetConsumerListRequest(consumer_group=group)).client_ids == []
    reset = pb.ResetConsumerOffsetsRequest(consumer_group=group, offsets=[pb.QueueOffset(topic=victim, offset=1)])
    with pytest.raises(NoPermissionError, match=f"lacks .* on Topic:{victim}"):
        broker.call("ResetConsumerOffsets", reset, attacker)
    committed = broker.call("QueryConsumerOffset", pb.QueryConsumerOffsetRequest(consumer_group=group, topic=victim,
                                                                                 queue_id=-1))
    assert list(committed.offsets) == []
    # the group has offsets on both (another member of it reads the victim's topic): the attacker's lag of the
    # whole group shows its own topic only; the super user's shows both
    broker.call("UpdateConsumerOffsets", pb.UpdateConsumerOffsetsRequest(consumer_group=group, offsets=[
        pb.QueueOffset(topic=victim, offset=1), pb.QueueOffset(topic=own, offset=0)]))
    assert _lagged_topics(broker, group, attacker) == {own}
    assert _lagged_topics(broker, group, ROOT) == {own, victim}
    # the rights on the topic too: what a consumer of both holds
    consumer = broker.user((f"Group:{group}", "Sub,Update"), (f"Topic:{own}", "Sub"), (f"Topic:{victim}", "Sub"))
    broker.call("ResetConsumerOffsets", reset, consumer)  # (refused while the group has live consumers)
    broker.call("Heartbeat", pb.HeartbeatRequest(client_id="att-2", consumer_group=group,
                                                 subscriptions={own: "*", victim: "*"}), consumer)
    assert _lagged_topics(broker, group, consumer) == {own, victim}


# ------------------------------------------------------------------------------------------------ check-backs
def _checks(broker: Secured, group: str, creds: Credentials, listen_s: float) -> list[str]:
    """The transaction ids a producer's check stream receives in ``listen_s``."""
    ids = []
    with grpc.insecure_channel(broker.endpoint) as channel:
        stream = pb_grpc.BrokerStub(channel).TransactionCheckStream(
            pb.TransactionCheckSubscribe(producer_group=group, client_id=f"checks-{creds.access_key}"),
            metadata=creds.metadata(), timeout=listen_s)
        try:
            for check in stream:
                ids.append(check.transaction_id)
        except grpc.RpcError as e:
            assert e.code() is grpc.StatusCode.DEADLINE_EXCEEDED, e  # type: ignore[attr-defined]
    return ids


def test_a_check_back_goes_only_to_a_producer_that_may_publish_to_the_halfs_topic(tmp_path: Path) -> None:
    """A check-back carries the half's body: a right on a producer group that several producers share is no right
    to the topics the others write. (A RocketMQ 5 producer's Telemetry stream is held to the same rule.)"""
    config = tmp_path / "broker.json"
    # checked back every 0.2 s once idle 0.2 s, never rolled back during the test
    quick = {**SETTINGS, "transaction_timeout_ms": 200, "transaction_check_interval_ms": 200,
             "transaction_check_max": 10_000}
    write_private(config, json.dumps(quick).encode())
    proc = BrokerProcess(tmp_path / "store", config=config, log_level="WARNING").start()
    try:
        broker = Secured(proc)
        topic, txn_id = broker.topic(unique("VictimT")), unique("victim-txn-")
        broker.open_transaction(topic, "SharedP", txn_id)
        attacker = broker.user(("Group:SharedP", "Pub"), (f"Topic:{unique('AttT')}", "Pub"))
        assert txn_id not in _checks(broker, "SharedP", attacker, listen_s=2.0)  # about ten checks went by
        producer = broker.user(("Group:SharedP", "Pub"), (f"Topic:{topic}", "Pub"))
        assert txn_id in _checks(broker, "SharedP", producer, listen_s=2.0)
        info = broker.transaction(txn_id)
        assert info is not None and info.status == "OPEN"
    finally:
        assert proc.stop() == 0, "\n".join(proc.output)


# ------------------------------------------------------------------------------------------------ administration
def test_rights_on_every_topic_and_group_do_not_reach_system_topics_or_another_groups_retry_topics(
    broker: Secured,
) -> None:
    """Create and Delete on ``Topic:*`` are rights on the users' topics: a system topic is the broker's (deleting
    the schedule topic would drop every pending delay) and a group's retry topic is decided as that group."""
    admin = broker.user(("Topic:*", "Create,Delete"))
    pending = broker.max_offset(SCHEDULE_TOPIC)
    for system in (SCHEDULE_TOPIC, TIMER_TOPIC, "RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_made_up"):
        with pytest.raises(BrokerError, match="system topic"):
            broker.call("DeleteTopic", pb.DeleteTopicRequest(topic=system), admin)
        with pytest.raises(BrokerError, match="system topic"):
            broker.call("CreateTopic", pb.CreateTopicRequest(topic=system, queue_nums=1), admin)
    group = unique("VictimG")
    broker.call("Heartbeat", pb.HeartbeatRequest(client_id="victim-1", consumer_group=group))  # makes %RETRY%G
    for name in (f"%RETRY%{group}", f"%DLQ%{group}"):
        with pytest.raises(NoPermissionError, match=f"lacks Delete on Topic:{name}"):
            broker.call("DeleteTopic", pb.DeleteTopicRequest(topic=name), admin)
    still = broker.call("GetQueueOffsets", pb.GetQueueOffsetsRequest(topic=f"%RETRY%{group}"))
    assert len(still.queues) > 0
    assert broker.max_offset(SCHEDULE_TOPIC) == pending
    assert broker.max_offset("rmq_sys_made_up") == 0


# ------------------------------------------------------------------------------------------------ streams
def test_a_pull_stream_switching_to_another_topic_is_refused_for_that_request(broker: Secured) -> None:
    """A PullStream is authenticated once; each request is the PullMessage call it stands for, decided with the
    stream's caller: a request naming another topic (with the caller's own group) or another group is refused,
    and commits nothing, while the stream serves the caller's own."""
    victim, own, group = broker.topic(unique("VictimT")), broker.topic(unique("AttT")), unique("AttG")
    broker.send(victim, b"the victim's secret body")
    broker.send(own, b"mine")
    attacker = broker.user((f"Topic:{own}", "Sub"), (f"Group:{group}", "Sub"))
    requests = [pb.PullRequest(consumer_group=group, topic=own, queue_id=0, max_msgs=8),
                pb.PullRequest(consumer_group=group, topic=victim, queue_id=0, max_msgs=8, commit_offset=1),
                pb.PullRequest(consumer_group=unique("VictimG"), topic=own, queue_id=0, max_msgs=8),
                pb.PullRequest(consumer_group=group, topic=f"%RETRY%{unique('VictimG')}", queue_id=0),
                pb.PullRequest(consumer_group=group, topic=own, queue_id=0, max_msgs=8)]
    with grpc.insecure_channel(broker.endpoint) as channel:
        answers = list(pb_grpc.BrokerStub(channel).PullStream(iter(requests), metadata=attacker.metadata(),
                                                             timeout=10))
    assert [a.code for a in answers] == [0, ResponseCode.NO_PERMISSION, ResponseCode.NO_PERMISSION,
                                         ResponseCode.NO_PERMISSION, 0]
    assert len(answers[0].response.entry_positions) == 1 and len(answers[4].response.entry_positions) == 1
    committed = broker.call("QueryConsumerOffset", pb.QueryConsumerOffsetRequest(consumer_group=group, topic=victim,
                                                                                 queue_id=-1))
    assert list(committed.offsets) == []


def test_a_half_whose_id_comes_from_its_uniq_key_joins_no_one_elses_transaction(broker: Secured) -> None:
    """A transactional send with no transaction id takes its UNIQ_KEY as the id (RocketMQ): a key naming another
    producer's open transaction is a join, decided on that transaction's group."""
    victim_topic, own = broker.topic(unique("VictimT")), broker.topic(unique("AttT"))
    txn_id = unique("victim-txn-")
    broker.open_transaction(victim_topic, "VictimP", txn_id)
    attacker = broker.user((f"Topic:{own}", "Pub"), ("Group:AttackerP", "Pub"))
    with pytest.raises(NoPermissionError, match="lacks Pub on Group:VictimP"):
        broker.call("SendMessage", pb.SendMessageRequest(topic=own, queue_id=0, body=b"x", producer_group="AttackerP",
                                                         transactional=True,
                                                         properties={Prop.UNIQ_KEY: txn_id}), attacker)
    info = broker.transaction(txn_id)
    assert info is not None and info.status == "OPEN" and info.half_count == 1


# ------------------------------------------------------------------------------------------------ deleted topics
def test_a_topic_made_again_under_a_deleted_ones_name_does_not_open_the_deleted_messages(broker: Secured) -> None:
    """A deleted topic's messages stay in the commit log until it expires: a right on a new topic of the same name
    (given to someone else, later) is no right to them, by id or by a send-back of their offset, as a query by
    key already skips them."""
    name, group = unique("ReusedT"), unique("NewG")
    broker.topic(name)
    old = broker.send(name, b"the deleted topic's secret body")
    broker.call("DeleteTopic", pb.DeleteTopicRequest(topic=name))
    broker.topic(name)
    newcomer = broker.user((f"Topic:{name}", "Sub"), (f"Group:{group}", "Sub"))
    offset = old.commitlog_offsets[0]
    with pytest.raises(QueryNotFoundError):
        broker.call("ViewMessageById", pb.ViewMessageByIdRequest(msg_id=msg_id_at(old.msg_id_prefix, offset)),
                    newcomer)
    for target in ({"commitlog_offset": offset}, {"msg_id": msg_id_at(old.msg_id_prefix, offset)}):
        with pytest.raises(QueryNotFoundError):
            broker.call("ConsumerSendMsgBack", pb.ConsumerSendMsgBackRequest(consumer_group=group, delay_level=-1,
                                                                             **target), newcomer)
    assert broker.max_offset(f"%DLQ%{group}") == 0 and broker.max_offset(f"%RETRY%{group}") == 0


def test_a_deleted_topics_pending_delayed_messages_are_not_delivered_into_a_topic_made_again(broker: Secured) -> None:
    """Messages delayed (by level or by time) for a topic that is then deleted went with it: they are not delivered
    into a topic made again under its name, where its new readers would get them."""
    name = unique("ReusedT")
    broker.topic(name)
    for delay in ({Prop.DELAY: "1"}, {Prop.TIMER_DELAY_MS: "300"}):
        send_props(broker, name, delay, ROOT)
    broker.call("DeleteTopic", pb.DeleteTopicRequest(topic=name))
    broker.topic(name)
    control = broker.topic(unique("ControlT"))  # delayed after the first two: delivered once they are due
    for delay in ({Prop.DELAY: "1"}, {Prop.TIMER_DELAY_MS: "300"}):
        send_props(broker, control, delay, ROOT)
    _wait_stored(broker, control, 2, timeout_s=10 * FIRST_LEVEL_S)
    assert broker.max_offset(name) == 0


def test_a_groups_lag_and_reset_do_not_reach_a_system_topics_offsets(broker: Secured) -> None:
    """A system topic's offsets count what the broker owes (pending delays, open transactions): a user holding every
    right on every topic and group neither reads them through a group's lag nor sets a group's offsets there."""
    delayed = broker.topic(unique("DelayedT"))
    send_props(broker, delayed, {Prop.DELAY: "18"}, ROOT)  # pending for 2 h: the schedule topic's offsets count it
    assert broker.max_offset(SCHEDULE_TOPIC) > 0  # (the super user's look registers it in the topic table)
    group = unique("AttG")
    broker.call("UpdateConsumerOffsets", pb.UpdateConsumerOffsetsRequest(
        consumer_group=group, offsets=[pb.QueueOffset(topic=delayed, offset=0)]))
    reader = broker.user(("Topic:*", "Sub,Get"), ("Group:*", "Sub,Get,Update"))
    for system in (SCHEDULE_TOPIC, TIMER_TOPIC):
        with pytest.raises(NoPermissionError, match="lacks All on Cluster"):
            broker.call("GetConsumerLag", pb.GetConsumerLagRequest(consumer_group=group, topic=system), reader)
        reset = pb.ResetConsumerOffsetsRequest(
            consumer_group=group, offsets=[pb.QueueOffset(topic=system, queue_id=17, offset=1)]
        )
        with pytest.raises(NoPermissionError, match="lacks All on Cluster"):
            broker.call("ResetConsumerOffsets", reset, reader)
        committed = broker.call("QueryConsumerOffset", pb.QueryConsumerOffsetRequest(
            consumer_group=group, topic=system, queue_id=-1))
        assert list(committed.offsets) == []
