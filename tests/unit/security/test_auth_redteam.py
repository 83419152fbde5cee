"""Attacks of the classes issue 43 lists, made on other paths than its own tests (test_auth_resolved.py): a user
holding rights on its own topic and group only, raw calls signed by it against one broker process with auth. Each
asserts the refusal and that nothing changed where it matters (the victim's topic holds nothing forged, the
attacker's retry and dead-letter topics hold nothing copied, the victim's pop still in flight)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from auth_process import ROOT, Secured, start_secured, v2_refused
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as v2s

from broker.client import Message, encode_message
from broker.client.credentials import Credentials
from broker.client.half_batch import to_half_batch
from broker.errors import BrokerError, InvalidReceiptHandleError, MessageIllegalError, NoPermissionError
from broker.proto import sluice_pb2 as pb
from broker.semantics.system_topics import SCHEDULE_TOPIC, TIMER_TOPIC
from broker.store.message import Prop

# The first delay level is 1 s (message_delay_level's default): a forged delivery would land within that.
FIRST_LEVEL_S = 1.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    proc = start_secured(tmp_path_factory.mktemp("auth-redteam"))
    yield Secured(proc)
    assert proc.stop() == 0, "\n".join(proc.output)


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def send_props(broker: Secured, topic: str, properties: dict[str, str], creds: Credentials) -> pb.SendResponse:
    return broker.call("SendMessage", pb.SendMessageRequest(topic=topic, queue_id=0, body=b"forged",
                                                            properties=properties), creds)  # fmt: skip


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
    batch = b"".join(encode_message(Message(own, b"forged %d" % i, properties=p), 0)
                     for i, p in enumerate(({**forged, Prop.DELAY: "1"}, {**forged, Prop.TIMER_DELAY_MS: "200"})))
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
    time.sleep(FIRST_LEVEL_S * 1.5)
    assert {t: broker.max_offset(t) for t in before} == before
    assert broker.max_offset(victim) == 0


def test_a_transaction_cannot_commit_into_a_topic_its_producer_may_not_publish_to(broker: Secured) -> None:
    """Halves carry their real topic: a half naming another topic (a SendMessage half with REAL_TOPIC, a SendBatch
    already in half form, a SendBatch stored in place) is refused at the send, so no commit can deliver it."""
    victim, own, group = broker.topic(unique("VictimT")), broker.topic(unique("AttT")), unique("AttP")
    attacker = broker.user((f"Topic:{own}", "Pub"), (f"Group:{group}", "Pub"))
    txn = unique("att-txn-")
    with pytest.raises(MessageIllegalError):
        broker.call("SendMessage", pb.SendMessageRequest(
            topic=own, queue_id=0, body=b"forged", producer_group=group, transactional=True, transaction_id=txn,
            properties={Prop.REAL_TOPIC: victim, Prop.REAL_QID: "0"}), attacker)  # fmt: skip
    plain = encode_message(Message(victim, b"forged half"), 0)
    for entries in (to_half_batch(plain, group, txn), plain):  # half form; for its real topic (stored in place)
        with pytest.raises(NoPermissionError, match=f"lacks Pub on Topic:{victim}"):
            broker.call("SendBatch", pb.SendBatchRequest(entries=entries, count=1, producer_group=group,
                                                         transaction_id=txn), attacker)  # fmt: skip
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
                                                     invisible_time_ms=60_000))  # fmt: skip
    handle = popped.receipt_handles[0]
    attacker = broker.user((f"Topic:{own_topic}", "Sub"), (f"Group:{own_group}", "Sub"))
    acked = broker.call("AckMessage", pb.AckMessageRequest(consumer_group=own_group, topic=own_topic,
                                                           receipt_handles=[handle]), attacker)  # fmt: skip
    assert acked.errors[0]  # refused, not acked
    with pytest.raises(InvalidReceiptHandleError):
        broker.call("ChangeInvisibleTime", pb.ChangeInvisibleTimeRequest(
            consumer_group=own_group, topic=own_topic, receipt_handle=handle, invisible_time_ms=0), attacker)  # fmt: skip
    forward = v2s.ForwardMessageToDeadLetterQueueRequest(
        group=v2.Resource(name=own_group), topic=v2.Resource(name=own_topic), receipt_handle=handle,
        message_id="x", delivery_attempt=1, max_delivery_attempts=1)  # fmt: skip
    answer = broker.v2("ForwardMessageToDeadLetterQueue", forward, attacker)
    assert answer.status.code == v2.Code.INVALID_RECEIPT_HANDLE, answer
    for named_group, named_topic in ((victim_group, own_topic), (own_group, victim_topic)):
        forward.group.name, forward.topic.name = named_group, named_topic
        assert v2_refused(lambda: broker.v2("ForwardMessageToDeadLetterQueue", forward, attacker))
    assert broker.max_offset(f"%DLQ%{own_group}") == 0
    # the victim's delivery is still its own: its handle acks it
    mine = broker.call("AckMessage", pb.AckMessageRequest(consumer_group=victim_group, topic=victim_topic,
                                                          receipt_handles=[handle]), ROOT)  # fmt: skip
    assert list(mine.errors) == [""]

