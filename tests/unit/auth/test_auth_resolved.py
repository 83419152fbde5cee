"""Rights decided on what an operation touches, not on the names its request carries (broker/auth/operations.py):
each attack made as a client would (raw calls on Sluice's and RocketMQ 5's stubs, signed by a user holding only
the rights named) against one broker process with auth, asserting the refusal and that nothing changed: the
victim's transaction still open (what the super user lists) and its message invisible, nothing in the attacker's
retry topic, no outcome recorded."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as v2s

from broker.client import Message, encode_message
from broker.errors import BrokerError, NoPermissionError, QueryNotFoundError, ResponseCode, TopicNotExistError
from broker.format.message import msg_id_at
from broker.format.system_topics import SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from broker.proto import sluice_pb2 as pb
from broker.proto import sluice_pb2_grpc as pb_grpc
from tests.support.auth_process import (
    ROOT,
    Secured,
    secured_broker,
    start_secured,
    unique,
    v2_end,
    v2_refused,
    v2_status,
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    with secured_broker(tmp_path_factory.mktemp("auth-resolved")) as broker:
        yield broker


def assert_open(broker: Secured, txn_id: str, halves: int, topic: str) -> None:
    info = broker.transaction(txn_id)
    assert info is not None and info.status == "OPEN" and info.half_count == halves, info
    assert broker.visible(topic) == 0  # no half became a message


# ------------------------------------------------------------------------------------------------ send-back
@pytest.mark.parametrize("by", ["commitlog_offset", "msg_id"])
def test_a_send_back_is_decided_on_the_stored_messages_own_topic(broker: Secured, by: str) -> None:
    """ConsumerSendMsgBack of another user's message into %RETRY%<own group>: the copy would land where the
    attacker pulls; the group's right is not a right to the message's topic."""
    victim_topic, group = broker.topic(unique("VictimT")), unique("AttG")
    sent = broker.send(victim_topic, b"the victim's secret body")
    offset = sent.commitlog_offsets[0]
    request = pb.ConsumerSendMsgBackRequest(consumer_group=group, delay_level=-1)  # -1: straight to %DLQ%, no wait
    if by == "msg_id":
        request.msg_id = msg_id_at(sent.msg_id_prefix, offset)
    else:
        request.commitlog_offset = offset
    attacker = broker.user((f"Group:{group}", "Sub"))
    with pytest.raises(NoPermissionError, match=f"lacks Sub on Topic:{victim_topic}"):
        broker.call("ConsumerSendMsgBack", request, attacker)
    request.delay_level = 0
    with pytest.raises(NoPermissionError, match=f"lacks Sub on Topic:{victim_topic}"):
        broker.call("ConsumerSendMsgBack", request, attacker)
    for copy in (f"%RETRY%{group}", f"%DLQ%{group}", SCHEDULE_TOPIC):
        assert broker.max_offset(copy) == 0, copy  # no copy anywhere the attacker could read it from
    # with Sub on the message's topic too, the same consumer may send it back (what a consumer of it does)
    consumer = broker.user((f"Group:{group}", "Sub"), (f"Topic:{victim_topic}", "Sub"))
    answer = broker.call("ConsumerSendMsgBack", pb.ConsumerSendMsgBackRequest(
        consumer_group=group, commitlog_offset=offset, delay_level=-1), consumer)
    assert answer.dead_letter and broker.max_offset(f"%DLQ%{group}") == 1


def test_a_send_back_without_the_groups_right_tells_nothing(broker: Secured) -> None:
    attacker = broker.user()
    for target in ({"commitlog_offset": 0}, {"commitlog_offset": 1 << 40}):
        with pytest.raises(NoPermissionError, match="lacks Sub on Group:G"):
            broker.call("ConsumerSendMsgBack", pb.ConsumerSendMsgBackRequest(consumer_group="G", **target), attacker)
    assert broker.max_offset("%RETRY%G") == 0


# ------------------------------------------------------------------------------------------------ transactions
def test_ending_another_producers_transaction_by_id_naming_ones_own_group_is_refused(broker: Secured) -> None:
    topic, txn_id = broker.topic(unique("VictimT")), unique("victim-txn-")
    broker.open_transaction(topic, "VictimP", txn_id)
    attacker = broker.user(("Group:AttackerP", "Pub"))
    for commit in (True, False):
        request = pb.EndTransactionRequest(transaction_id=txn_id, producer_group="AttackerP", commit=commit)
        with pytest.raises(NoPermissionError, match="lacks Pub on Group:VictimP"):
            broker.call("EndTransaction", request, attacker)
    assert_open(broker, txn_id, 1, topic)
    # the victim's producer ends it: its group's right is the one that counts, whatever the request names
    producer = broker.user(("Group:VictimP", "Pub"))
    ended = broker.call("EndTransaction", pb.EndTransactionRequest(transaction_id=txn_id, producer_group="Other",
                                                                   commit=True), producer)
    assert ended.status == "COMMITTED" and broker.visible(topic) == 1


def test_an_unknown_transaction_is_recorded_only_with_pub_on_the_named_group(broker: Secured) -> None:
    """The exactly-once sink skips a batch whose id is recorded committed: a stranger must not record one."""
    txn_id = f"spark:{unique('q')}:7:attempt"
    nobody = broker.user()
    stranger = broker.user(("Group:AttackerP", "Pub"))
    for creds, group in ((nobody, ""), (nobody, "SinkP"), (stranger, "SinkP"), (stranger, "")):
        request = pb.EndTransactionRequest(transaction_id=txn_id, commit=True, record_unknown=True,
                                           producer_group=group)
        with pytest.raises(NoPermissionError, match="lacks Pub on"):
            broker.call("EndTransaction", request, creds)
        assert broker.transaction(txn_id) is None  # nothing recorded
    # without record_unknown: the same refusal (no answer tells a stranger which ids exist)
    with pytest.raises(NoPermissionError):
        broker.call("EndTransaction", pb.EndTransactionRequest(transaction_id=txn_id, commit=True), nobody)
    sink = broker.user(("Group:SinkP", "Pub"))
    with pytest.raises(QueryNotFoundError):
        broker.call("EndTransaction", pb.EndTransactionRequest(transaction_id=txn_id, commit=True,
                                                               producer_group="SinkP"), sink)
    recorded = broker.call("EndTransaction", pb.EndTransactionRequest(
        transaction_id=txn_id, commit=True, record_unknown=True, producer_group="SinkP"), sink)
    assert recorded.status == "COMMITTED"
    info = broker.transaction(txn_id)
    assert info is not None and info.producer_group == "SinkP"  # the group is recorded with the outcome
    # a later lookup by id resolves that group: another group's right does not reach it
    with pytest.raises(NoPermissionError, match="lacks Pub on Group:SinkP"):
        broker.call("EndTransaction", pb.EndTransactionRequest(transaction_id=txn_id, commit=False,
                                                               producer_group="AttackerP"), stranger)


def test_a_transaction_not_indexed_by_offset_cannot_be_ended_by_offset_without_its_group(broker: Secured) -> None:
    """A batch's halves have no per-half index: the end by offset finds the half in the store, and is decided on
    the transaction that half belongs to."""
    topic, txn_id = broker.topic(unique("VictimT")), unique("victim-batch-")
    sent = broker.open_batch_transaction(topic, "VictimP", txn_id)
    nobody, stranger = broker.user(), broker.user(("Group:AttackerP", "Pub"))
    for creds in (nobody, stranger):
        for offset in sent.commitlog_offsets:
            request = pb.EndTransactionRequest(half_commitlog_offset=offset, commit=True, producer_group="AttackerP")
            with pytest.raises(NoPermissionError, match="lacks Pub on Group:VictimP"):
                broker.call("EndTransaction", request, creds)
    # an offset where no half lies answers the stranger as an existing one does: no probing of the log
    with pytest.raises(NoPermissionError):
        broker.call("EndTransaction", pb.EndTransactionRequest(half_commitlog_offset=1 << 40, commit=True), nobody)
    assert_open(broker, txn_id, 2, topic)


def test_rocketmq5_end_transaction_is_decided_on_the_transactions_group(broker: Secured) -> None:
    """RocketMQ 5's EndTransaction names a topic; the right to that topic is no right to the transaction."""
    topic, txn_id = broker.topic(unique("VictimT")), unique("victim-txn-")
    broker.open_transaction(topic, "VictimP", txn_id)
    named_topic = broker.user((f"Topic:{topic}", "Pub"))
    topics_group = broker.user((f"Topic:{topic}", "Pub"), (f"Group:{topic}", "Pub"))
    for attacker in (named_topic, topics_group):
        assert v2_refused(lambda a=attacker: broker.v2("EndTransaction", v2_end(topic, txn_id), a))  # type: ignore[misc]
    assert_open(broker, txn_id, 1, topic)


def test_the_coordinator_needs_its_cluster_right(broker: Secured) -> None:
    from broker.proto import coordinator_pb2 as cpb

    txn_id = unique("spark:q:1:")
    decision = cpb.TransactionDecision(transaction_id=txn_id, outcome="ABORT")
    for creds in (broker.user(), broker.user(("Group:VictimP", "Pub"))):
        with pytest.raises(grpc.RpcError) as info:
            broker.coordinator("RecordDecision", cpb.RecordDecisionRequest(decision=decision), creds)
        assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
        assert "lacks Pub on Cluster" in info.value.details()  # type: ignore[attr-defined]
    found = broker.coordinator("QueryDecisions", cpb.QueryDecisionsRequest(transaction_ids=[txn_id]), ROOT)
    assert list(found.decisions) == []  # nothing recorded


def test_a_query_that_aborts_undecided_transactions_needs_the_right_to_record_decisions(broker: Secured) -> None:
    """Reading decisions takes Get on the Cluster; a query that aborts the undecided ids it names records
    decisions, which the participants of those transactions then follow: Pub on the Cluster, as RecordDecision."""
    from broker.proto import coordinator_pb2 as cpb

    txn_id = unique("spark:q:2:")
    reader = broker.user(("Cluster", "Get"))
    assert list(broker.coordinator("QueryDecisions", cpb.QueryDecisionsRequest(transaction_ids=[txn_id]),
                                   reader).decisions) == []
    with pytest.raises(grpc.RpcError) as info:
        broker.coordinator("QueryDecisions", cpb.QueryDecisionsRequest(transaction_ids=[txn_id], abort_undecided=True),
                           reader)
    assert "lacks Pub on Cluster" in info.value.details()  # type: ignore[attr-defined]
    found = broker.coordinator("QueryDecisions", cpb.QueryDecisionsRequest(transaction_ids=[txn_id]), ROOT)
    assert list(found.decisions) == []  # nothing decided
    decided = broker.coordinator("QueryDecisions", cpb.QueryDecisionsRequest(
        transaction_ids=[txn_id], abort_undecided=True), broker.user(("Cluster", "Pub")))
    assert [d.outcome for d in decided.decisions] == ["ABORT"]


def test_a_decision_on_a_transaction_this_broker_holds_is_an_end_of_it(broker: Secured) -> None:
    """The coordinator's right is the Cluster's; where the transaction lies here, an entry denying its group
    stands against a decision too, as against every other way of ending it."""
    from broker.proto import coordinator_pb2 as cpb

    topic, txn_id = broker.topic(unique("VictimT")), unique("victim-txn-")
    broker.open_transaction(topic, "VictimP", txn_id)
    fenced = broker.user(("Cluster", "Pub,Get"), ("Group:VictimP", "Pub", "Deny"))
    decision = cpb.TransactionDecision(transaction_id=txn_id, outcome="ABORT")
    for method, request in (("RecordDecision", cpb.RecordDecisionRequest(decision=decision)),
                            ("QueryDecisions", cpb.QueryDecisionsRequest(transaction_ids=[txn_id],
                                                                         abort_undecided=True))):
        with pytest.raises(grpc.RpcError) as info:
            broker.coordinator(method, request, fenced)
        assert "lacks Pub on Group:VictimP" in info.value.details()  # type: ignore[attr-defined]
    found = broker.coordinator("QueryDecisions", cpb.QueryDecisionsRequest(transaction_ids=[txn_id]), ROOT)
    assert list(found.decisions) == []
    with pytest.raises(NoPermissionError):  # nor through the Sluice service
        broker.call("EndTransaction", pb.EndTransactionRequest(transaction_id=txn_id, commit=False), fenced)
    assert_open(broker, txn_id, 1, topic)
    sink = broker.user(("Cluster", "Pub"))  # the exactly-once sink's right: every group's transactions
    recorded = broker.coordinator("RecordDecision", cpb.RecordDecisionRequest(decision=decision), sink)
    assert recorded.outcome == "ABORT"


def _v2_transactional(topic: str, message_id: str) -> v2s.SendMessageRequest:
    message = v2.Message(topic=v2.Resource(name=topic), body=b"attacker's half", system_properties=v2.SystemProperties(
        message_id=message_id, message_type=v2.TRANSACTION, body_encoding=v2.IDENTITY))
    return v2s.SendMessageRequest(messages=[message])


def test_a_half_cannot_join_another_producers_open_transaction(broker: Secured) -> None:
    """A half naming an open transaction's id joins it: decided on that transaction's recorded group, through
    SendMessage, SendBatch and RocketMQ 5's SendMessage (whose transaction id is the message id it chooses)."""
    victim_topic, own = broker.topic(unique("VictimT")), broker.topic(unique("AttT"))
    txn_id = unique("victim-txn-")
    broker.open_transaction(victim_topic, "VictimP", txn_id)
    attacker = broker.user((f"Topic:{own}", "Pub"), ("Group:AttackerP", "Pub"), (f"Group:{own}", "Pub"))
    with pytest.raises(NoPermissionError, match="lacks Pub on Group:VictimP"):
        broker.call("SendMessage", pb.SendMessageRequest(topic=own, queue_id=0, body=b"x", producer_group="AttackerP",
                                                         transactional=True, transaction_id=txn_id), attacker)
    entries = encode_message(Message(own, b"x"), 0)
    with pytest.raises(NoPermissionError, match="lacks Pub on Group:VictimP"):
        broker.call("SendBatch", pb.SendBatchRequest(entries=entries, count=1, producer_group="AttackerP",
                                                     transaction_id=txn_id), attacker)
    assert v2_refused(lambda: broker.v2("SendMessage", _v2_transactional(own, txn_id), attacker))
    assert_open(broker, txn_id, 1, victim_topic)  # still the victim's one half
    assert broker.max_offset(TRANS_HALF_TOPIC) >= 1 and broker.visible(own) == 0


def test_a_rocketmq5_transactional_send_needs_pub_on_its_topics_group(broker: Secured) -> None:
    """RocketMQ 5 clients name no producer group: their transactions are recorded under the topic's name, and
    opening one is Pub on that group, as any transactional send's."""
    topic = broker.topic(unique("V2T"))
    halves = broker.max_offset(TRANS_HALF_TOPIC)
    publisher = broker.user((f"Topic:{topic}", "Pub"))
    assert v2_refused(lambda: broker.v2("SendMessage", _v2_transactional(topic, unique("v2-txn-")), publisher))
    assert broker.max_offset(TRANS_HALF_TOPIC) == halves
    producer = broker.user((f"Topic:{topic}", "Pub"), (f"Group:{topic}", "Pub"))
    txn_id = unique("v2-txn-")
    answer = broker.v2("SendMessage", _v2_transactional(topic, txn_id), producer)
    assert answer.entries[0].status.code == v2.Code.OK, answer
    assert v2_status(broker.v2("EndTransaction", v2_end(topic, txn_id), producer)) == v2.Code.OK
    assert broker.visible(topic) == 1


# ------------------------------------------------------------------------------------------------ system topics
@pytest.mark.parametrize("system_topic", [TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, SCHEDULE_TOPIC])
def test_system_topics_are_read_by_no_one(broker: Secured, system_topic: str) -> None:
    """An open transaction's half lies in the half topic: no read path gives it back, to anyone."""
    topic, txn_id = broker.topic(unique("VictimT")), unique("victim-txn-")
    half = broker.open_transaction(topic, "VictimP", txn_id)
    reader = broker.user(("Topic:*", "Sub,Get"), ("Group:*", "Sub"))
    for creds in (reader, ROOT):
        with pytest.raises(NoPermissionError):
            broker.call("PopMessage", pb.PopRequest(consumer_group="AttG", topic=system_topic, max_msgs=32,
                                                    invisible_time_ms=60_000), creds)
        with pytest.raises(NoPermissionError):
            broker.call("PullMessage", pb.PullRequest(consumer_group="AttG", topic=system_topic, queue_id=0), creds)
        with pytest.raises(NoPermissionError):
            broker.call("QueryMessageByKey", pb.QueryMessageByKeyRequest(topic=system_topic, key=txn_id), creds)
        if system_topic == TRANS_HALF_TOPIC:
            msg_id = msg_id_at(half.msg_id_prefix, half.commitlog_offsets[0])
            with pytest.raises(NoPermissionError):
                broker.call("ViewMessageById", pb.ViewMessageByIdRequest(msg_id=msg_id), creds)
        receive = v2s.ReceiveMessageRequest(group=v2.Resource(name="AttG"), message_queue=v2.MessageQueue(
            topic=v2.Resource(name=system_topic), id=-1), batch_size=32, auto_renew=False)
        receive.invisible_duration.FromSeconds(60)
        assert v2_status(broker.v2("ReceiveMessage", receive, creds)) == v2.Code.ILLEGAL_TOPIC
    # offsets of a system topic: not for a user holding Topic:*, which is no right to what the broker keeps
    for method, request in (("GetQueueOffsets", pb.GetQueueOffsetsRequest(topic=system_topic)),
                            ("SearchOffsetByTimestamp", pb.SearchOffsetByTimestampRequest(topic=system_topic)),
                            ("GetTopicRoute", pb.GetTopicRouteRequest(topic=system_topic))):
        with pytest.raises(NoPermissionError, match="lacks All on Cluster"):
            broker.call(method, request, reader)
    assert_open(broker, txn_id, 1, topic)


def test_no_lookup_creates_a_system_topic(broker: Secured) -> None:
    reader = broker.user(("Topic:*", "Pub,Sub,Get"), ("Group:*", "Sub"))
    name = unique("rmq_sys_made_up_")
    with pytest.raises(NoPermissionError):
        broker.call("GetTopicRoute", pb.GetTopicRouteRequest(topic=name, auto_create=True), reader)
    with pytest.raises(TopicNotExistError):
        broker.call("GetTopicRoute", pb.GetTopicRouteRequest(topic=name, auto_create=True), ROOT)
    for creds in (reader, ROOT):
        with pytest.raises(NoPermissionError):
            broker.call("PopMessage", pb.PopRequest(consumer_group="AttG", topic=name), creds)
    listed = {t.topic for t in broker.call("ListTopics", pb.ListTopicsRequest()).topics}
    assert name not in listed


def test_after_a_restart_an_end_by_offset_is_decided_on_the_recovered_transaction(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A restart forgets which half lies at which offset (the table is not persisted): the end by offset finds the
    half in the store, and the transaction recovered from it keeps its producer group."""
    root = tmp_path_factory.mktemp("auth-restart")
    broker = Secured(start_secured(root))
    topic, txn_id = broker.topic("VictimT"), "victim-txn-restart"
    offset = broker.open_transaction(topic, "VictimP", txn_id).commitlog_offsets[0]
    assert broker.proc.stop() == 0
    broker = Secured(start_secured(root))
    try:
        for creds in (broker.user(), broker.user(("Group:AttackerP", "Pub"))):
            request = pb.EndTransactionRequest(half_commitlog_offset=offset, commit=True, producer_group="AttackerP")
            with pytest.raises(NoPermissionError, match="lacks Pub on Group:VictimP"):
                broker.call("EndTransaction", request, creds)
        assert_open(broker, txn_id, 1, topic)
        producer = broker.user(("Group:VictimP", "Pub"))
        ended = broker.call("EndTransaction", pb.EndTransactionRequest(half_commitlog_offset=offset, commit=True),
                            producer)
        assert ended.status == "COMMITTED" and broker.visible(topic) == 1
    finally:
        assert broker.proc.stop() == 0, "\n".join(broker.proc.output)


def test_a_send_stream_request_joining_another_producers_transaction_is_refused(broker: Secured) -> None:
    """Each request of a SendStream is its unary call's, with the stream's caller: the join is decided the same."""
    victim_topic, own = broker.topic(unique("VictimT")), broker.topic(unique("AttT"))
    txn_id = unique("victim-txn-")
    broker.open_transaction(victim_topic, "VictimP", txn_id)
    attacker = broker.user((f"Topic:{own}", "Pub"), ("Group:AttackerP", "Pub"))
    requests = [pb.SendMessageRequest(topic=own, queue_id=0, body=b"x", producer_group="AttackerP",
                                      transactional=True, transaction_id=txn_id),
                pb.SendMessageRequest(topic=own, queue_id=0, body=b"plain")]
    with grpc.insecure_channel(broker.endpoint) as channel:
        answers = list(pb_grpc.BrokerStub(channel).SendStream(iter(requests), metadata=attacker.metadata(),
                                                             timeout=10))
    assert answers[0].code == ResponseCode.NO_PERMISSION and "lacks Pub on Group:VictimP" in answers[0].error
    assert answers[1].code == 0 and answers[1].response.commitlog_offsets  # the stream goes on
    assert_open(broker, txn_id, 1, victim_topic)
    assert broker.visible(own) == 1


def test_an_id_recorded_by_another_group_does_not_pass_for_the_writers_own_outcome(broker: Secured) -> None:
    """The sink's ids are predictable: a user with Pub on a group of its own records one first. The sink names
    its group when it records its outcome; the id recorded under another group is refused, not taken as its own
    commit (the batch fails loudly instead of being skipped)."""
    txn_id = f"spark:{unique('q')}:9:attempt"
    squatter = broker.user(("Group:AttackerP", "Pub"))
    broker.call("EndTransaction", pb.EndTransactionRequest(transaction_id=txn_id, commit=True, record_unknown=True,
                                                           producer_group="AttackerP"), squatter)
    sink = broker.user(("Group:SinkP", "Pub"), ("Cluster", "Pub"))
    with pytest.raises(BrokerError, match="recorded under another producer group") as refused:
        broker.call("EndTransaction", pb.EndTransactionRequest(transaction_id=txn_id, commit=True,
                                                               record_unknown=True, producer_group="SinkP"), sink)
    assert refused.value.code is ResponseCode.TRANSACTION_FAILED
    info = broker.transaction(txn_id)
    assert info is not None and info.producer_group == "AttackerP" and info.status == "COMMITTED"
