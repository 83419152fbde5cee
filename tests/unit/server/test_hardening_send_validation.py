"""One validation for every send path: SendMessage and SendBatch, plain or in a transaction, plain entries or half
entries, refuse the same things (with MESSAGE_ILLEGAL or INVALID_ARGUMENT) and store nothing when they do; numbers
in properties are ASCII digits; what is accepted reads back as it was sent."""

from __future__ import annotations

import struct

import grpc
import pytest

from broker.client import Admin, Message, Producer, PullConsumer
from broker.client.half_batch import half_suffix
from broker.client.outgoing_message import encode_message
from broker.errors import BrokerError, ResponseCode
from broker.format.message import POS_BODY_CRC, POS_SYS_FLAG, SysFlag, encode_entry, encode_properties
from broker.format.system_topics import TRANS_HALF_TOPIC
from broker.format.transaction_codec import HALF_TOPIC_BYTES, encode_half_entry
from broker.proto import sluice_pb2 as pb
from broker.server.broker_controller import BrokerController
from tests.unit.server.hardening_rpc import Answer, answer, stub

TOPIC = "HardT"
GROUP = "hard-producers"
BAD_ENTRY_FIELDS = {
    "body CRC": {},  # patched after encoding
    "negative reconsume_times": {"reconsume_times": -1},
    "transaction type bits": {"sys_flag": SysFlag.TRANSACTION_PREPARED_TYPE},
}
BAD_PROPERTIES = {
    "invalid UTF-8": b"a\x01\xff\xfe\x02",
    "ending in NUL": b"a\x01b\x00",
    "a pair without \\x01": b"garbage\x02",
    "no closing \\x02": b"garbage",
    "an empty pair": b"\x02",
    "a repeated name": b"a\x011\x02a\x012\x02",
    "\\x01 in a value": b"\x01" * 500 + b"\x02",
    "an empty name": b"\x01v\x02",
}


def plain_entry(props: bytes = b"", body: bytes = b"body", **fields: int) -> bytes:
    return encode_entry(TOPIC.encode(), 1, body, props, **fields)


def half_entry(txn_id: str, props: bytes = b"", body: bytes = b"body", **fields: int) -> bytes:
    """A half entry built by hand (encode_half_entry would refuse these properties), as a client might send it."""
    return encode_entry(HALF_TOPIC_BYTES, 0, body, props + half_suffix(TOPIC.encode(), 1, GROUP, txn_id), **fields)


def bad_crc(entry: bytes) -> bytes:
    out = bytearray(entry)
    struct.pack_into(">i", out, POS_BODY_CRC, (struct.unpack_from(">i", entry, POS_BODY_CRC)[0] + 1) & 0x7FFFFFFF)
    return bytes(out)


def bad_entries() -> dict[str, tuple[bytes, bytes]]:
    """case -> (plain entry, half entry of transaction "tx-half")."""
    cases: dict[str, tuple[bytes, bytes]] = {}
    for name, fields in BAD_ENTRY_FIELDS.items():
        plain, half = plain_entry(**fields), half_entry("tx-half", **fields)
        if name == "body CRC":
            plain, half = bad_crc(plain), bad_crc(half)
        cases[name] = (plain, half)
    for name, props in BAD_PROPERTIES.items():
        cases[f"properties with {name}"] = (plain_entry(props), half_entry("tx-half", props))
    return cases


def assert_nothing_stored(broker: BrokerController) -> None:
    store = broker.store
    assert store is not None and store.wait_dispatched()
    assert store.max_offset(TRANS_HALF_TOPIC, 0) == 0, "a half was stored"
    assert all(store.max_offset(TOPIC, q) == 0 for q in range(8)), "a message was stored"
    assert broker.transactions is not None and broker.transactions.list_transactions() == []


def refused_as_illegal(a: Answer) -> bool:
    return a.status == grpc.StatusCode.INVALID_ARGUMENT and a.code in (
        ResponseCode.MESSAGE_ILLEGAL, ResponseCode.INVALID_ARGUMENT
    )


@pytest.mark.parametrize("batch_entries", [1, 40], ids=["small batch", "numpy-checked batch"])
def test_a_transactional_batch_is_refused_where_a_plain_one_is(
    broker: BrokerController, endpoint: str, batch_entries: int
) -> None:
    """A transactional batch used to skip the plain path's checks: a wrong BODYCRC was re-encoded fresh, negative
    reconsume times and transaction bits passed, invalid UTF-8 became U+FFFD, a NUL ending was "fixed up".
    Properties a plain SendMessage could never produce are refused on every path alike."""
    good = plain_entry(b"k\x01v\x02")
    with stub(endpoint) as s:
        for name, (plain, half) in bad_entries().items():
            good_half = half_entry("tx-half", b"k\x01v\x02")
            sends = {
                "plain": pb.SendBatchRequest(entries=good * (batch_entries - 1) + plain),
                "transactional": pb.SendBatchRequest(
                    entries=good * (batch_entries - 1) + plain, transaction_id="tx-plain", producer_group=GROUP
                ),
                "transactional, half form": pb.SendBatchRequest(
                    entries=good_half * (batch_entries - 1) + half, transaction_id="tx-half", producer_group=GROUP
                ),
            }
            for how, request in sends.items():
                a = answer(s.SendBatch, request)
                assert refused_as_illegal(a), f"{name} / {how}: {a}"
    assert_nothing_stored(broker)


def test_a_transactional_send_message_is_checked_as_a_plain_one(broker: BrokerController, endpoint: str) -> None:
    """A transactional SendMessage accepted negative reconsume times, transaction bits and an empty producer group,
    and silently overwrote the client's own __transactionId__, REAL_TOPIC and REAL_QID."""

    def half(**fields: object) -> pb.SendMessageRequest:
        base: dict[str, object] = {"topic": TOPIC, "queue_id": 1, "body": b"x", "transactional": True,
                                   "producer_group": GROUP}
        return pb.SendMessageRequest(**{**base, **fields})  # type: ignore[arg-type]

    refused = {
        "negative reconsume_times": half(reconsume_times=-1),
        "transaction bits": half(sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE),
        "no producer group": half(producer_group=""),
        "a producer group that is no name": half(producer_group="bad group!"),
        "another REAL_QID": half(properties={"REAL_QID": "5"}),
        "another REAL_TOPIC": half(properties={"REAL_TOPIC": "Elsewhere"}),
        "another PGROUP": half(properties={"PGROUP": "someone-else"}),
        "another transaction's id": half(transaction_id="tx-1", properties={"__transactionId__": "tx-2"}),
        "a DELAY": half(properties={"DELAY": "2"}),
        "a DELAY that is no number": half(properties={"DELAY": "\u0663"}),
        "an empty property name": half(properties={"": "v"}),
        "a separator in a property name": half(properties={"a\x01b": "v"}),
        "an empty property name, plain": half(transactional=False, producer_group="", properties={"": "v"}),
    }
    with stub(endpoint) as s:
        for name, request in refused.items():
            a = answer(s.SendMessage, request)
            assert refused_as_illegal(a), f"{name}: {a}"
        assert_nothing_stored(broker)
        same = half(transaction_id="tx-3", properties={"__transactionId__": "tx-3", "REAL_QID": "1", "k": "v"})
        assert answer(s.SendMessage, same).ok  # the values the broker writes itself are no conflict


@pytest.mark.parametrize("real_qid", ["\u0663", "\uff13", "\u00b2", "+3", " 3", "3 ", "", "9" * 5000, "65536"])
def test_a_real_qid_that_is_no_number_is_refused_at_send(
    broker: BrokerController, endpoint: str, real_qid: str
) -> None:
    """REAL_QID="\\u0663" (or a full-width digit) was acknowledged at send (str.isdigit, int) and refused at commit
    (bytes.isdigit): every earlier half of that transaction could never be committed and it stayed OPEN across
    restarts. REAL_QID="\\u00b2" answered INTERNAL with a ValueError traceback. Now the send is refused, and the
    transaction commits what it holds."""
    txn = "tx-qid"
    with stub(endpoint) as s:
        good = encode_half_entry(TOPIC, 1, b"kept", {"k": "v"}, GROUP, txn)
        assert answer(s.SendBatch, pb.SendBatchRequest(entries=good, transaction_id=txn, producer_group=GROUP)).ok
        props = {"REAL_TOPIC": TOPIC, "REAL_QID": real_qid, "TRAN_MSG": "true", "PGROUP": GROUP,
                 "__transactionId__": txn}
        poisoned = encode_entry(HALF_TOPIC_BYTES, 0, b"poison", encode_properties(props))
        a = answer(s.SendBatch, pb.SendBatchRequest(entries=poisoned, transaction_id=txn, producer_group=GROUP))
        assert refused_as_illegal(a), a
        assert len(a.details) < 1024, "the value is cut in the message"
        end = answer(s.EndTransaction, pb.EndTransactionRequest(transaction_id=txn, commit=True))
        assert end.ok and end.response.status == "COMMITTED" and end.response.half_count == 1, end
    with PullConsumer(endpoint, "readers") as c:
        assert [m.body for m in c.pull(TOPIC, 1, 0).messages] == [b"kept"]


@pytest.mark.parametrize("delay", ["-5", " 3", "3 ", "+3", "\u0663", "\uff13", "\u00b2", "", "1.5", "9" * 10_000])
def test_a_delay_that_is_no_number_is_refused(broker: BrokerController, endpoint: str, delay: str) -> None:
    """DELAY="-5" was stored as no delay, " 3" was taken as 3, and a 10,000-digit one was echoed whole. Every send
    path refuses them (a delayed batch entry too); nothing is stored."""
    with stub(endpoint) as s:
        request = pb.SendMessageRequest(topic=TOPIC, queue_id=1, body=b"x", properties={"DELAY": delay})
        one = answer(s.SendMessage, request)
        entry = encode_entry(TOPIC.encode(), 1, b"x", b"DELAY\x01" + delay.encode() + b"\x02")
        batch = answer(s.SendBatch, pb.SendBatchRequest(entries=entry))
        big = answer(s.SendBatch, pb.SendBatchRequest(entries=plain_entry() * 40 + entry))
    for a in (one, batch, big):
        assert refused_as_illegal(a) and "DELAY" in a.details and len(a.details) < 1024, a
    assert_nothing_stored(broker)


def test_delays_that_are_numbers_still_work(broker: BrokerController, endpoint: str) -> None:
    with Producer(endpoint) as p, Admin(endpoint) as admin:
        p.send(Message(TOPIC, b"now", properties={"DELAY": "0"}), queue_id=2)
        p.send(Message(TOPIC, b"later", properties={"DELAY": "0003"}), queue_id=2)  # level 3, as RocketMQ reads it
        assert admin.queue_offsets(TOPIC)[2] == (0, 1)
    with stub(endpoint) as s:
        assert answer(s.SendMessage, pb.SendMessageRequest(topic=TOPIC, queue_id=2, body=b"x",
                                                           properties={"DELAY": "2147483647"})).ok
        big = answer(s.SendMessage, pb.SendMessageRequest(topic=TOPIC, queue_id=2, body=b"x",
                                                          properties={"DELAY": "2147483648"}))
        assert refused_as_illegal(big), big


CANONICAL_PROPERTIES = [
    b"",
    b"k\x01v\x02",
    b"keys\x01key-1 key-2\x02TAGS\x01T\x02empty\x01\x02",
    "caf\u00e9\x01\u65e5\u672c\U0001f600\x02".encode(),
    b"nul\x01a\x00b\x02sp ace\x01 x \x02",
]


def test_views_and_key_queries_return_the_stored_bytes(broker: BrokerController, endpoint: str) -> None:
    """ViewMessageById and QueryMessageByKey re-encoded decoded fields: they now answer the entry exactly as stored,
    as a pull does, and every message a send accepted can be viewed and sent back."""
    entries = [encode_entry(TOPIC.encode(), 3, f"b{i}".encode(), p + b"KEYS\x01find-me\x02")
               for i, p in enumerate(CANONICAL_PROPERTIES)]
    with stub(endpoint) as s:
        sent = answer(s.SendBatch, pb.SendBatchRequest(entries=b"".join(entries)))
        assert sent.ok, sent
        assert broker.store is not None and broker.store.wait_dispatched()
        pulled = answer(s.PullMessage, pb.PullRequest(consumer_group="viewers", topic=TOPIC, queue_id=3, max_msgs=99))
        ends = [*pulled.response.entry_positions[1:], len(pulled.response.entries)]
        stored = [pulled.response.entries[a:b] for a, b in zip(pulled.response.entry_positions, ends, strict=True)]
        assert len(stored) == len(entries)
        for offset, raw in zip(sent.response.commitlog_offsets, stored, strict=True):
            msg_id = f"{sent.response.msg_id_prefix}{offset:016X}"
            view = answer(s.ViewMessageById, pb.ViewMessageByIdRequest(msg_id=msg_id))
            assert view.ok and view.response.entries == raw, view
            back = answer(s.ConsumerSendMsgBack, pb.ConsumerSendMsgBackRequest(consumer_group="viewers",
                                                                               commitlog_offset=offset))
            assert back.ok, back
        found = answer(s.QueryMessageByKey, pb.QueryMessageByKeyRequest(topic=TOPIC, key="find-me", max_num=64))
        assert found.ok and found.response.entries == b"".join(stored), found


def test_a_stored_message_with_malformed_properties_is_viewed_as_stored(
    broker: BrokerController, endpoint: str
) -> None:
    """Data stored before sends checked properties (or by another writer) may hold any bytes there: a view answers
    them as they are (it answered INVALID_ARGUMENT for \\x01 x 500 + \\x02), and a send-back of such a message is
    refused with a clear code instead of INTERNAL "should retry" for ever."""
    assert broker.store is not None
    raw_props = b"\x01" * 500 + b"\x02"
    put = broker.store.put_batch(encode_entry(TOPIC.encode(), 0, b"old", raw_props))  # under the server's checks
    assert put.ok
    msg_id = put.msg_ids[0]
    with stub(endpoint) as s:
        view = answer(s.ViewMessageById, pb.ViewMessageByIdRequest(msg_id=msg_id))
        assert view.ok and raw_props in view.response.entries, view
        back = answer(s.ConsumerSendMsgBack, pb.ConsumerSendMsgBackRequest(consumer_group="g", msg_id=msg_id))
        assert back.ok or refused_as_illegal(back), back


def test_a_message_id_names_its_host_too(broker: BrokerController, endpoint: str) -> None:
    """ViewMessageById read whatever lay at the id's offset, whichever broker the id named."""
    with Producer(endpoint) as p:
        sent = p.send(Message(TOPIC, b"here"), queue_id=0)
    elsewhere = "0A0000FE" + "00002A9F" + sent.msg_id[16:]  # 10.0.0.254:10911, same offset
    with stub(endpoint) as s:
        assert answer(s.ViewMessageById, pb.ViewMessageByIdRequest(msg_id=sent.msg_id)).ok
        a = answer(s.ViewMessageById, pb.ViewMessageByIdRequest(msg_id=elsewhere))
        assert a.refused_with(grpc.StatusCode.NOT_FOUND, ResponseCode.QUERY_NOT_FOUND), a
        back = answer(s.ConsumerSendMsgBack, pb.ConsumerSendMsgBackRequest(consumer_group="g", msg_id=elsewhere))
        assert back.refused_with(grpc.StatusCode.NOT_FOUND, ResponseCode.QUERY_NOT_FOUND), back


def test_the_client_refuses_what_the_broker_would(endpoint: str) -> None:
    """The client's half rewrite used to fix up what the broker refuses (a transaction bit cleared, properties
    re-encoded): a transactional send_encoded is refused the same way, nothing stored."""
    good = encode_message(Message(TOPIC, b"x"), 0)
    marked = bytearray(good)
    struct.pack_into(">i", marked, POS_SYS_FLAG, SysFlag.TRANSACTION_PREPARED_TYPE)
    utf8 = encode_entry(TOPIC.encode(), 0, b"x", b"a\x01\xff\x02")
    with Producer(endpoint, group=GROUP) as p, Admin(endpoint) as admin:
        for buffer, count in ((bytes(marked), 1), (utf8, 1), (good + utf8, 2)):
            with pytest.raises(BrokerError) as info:
                p.send_encoded(buffer, count, transaction_id="tx-client")
            assert info.value.code in (ResponseCode.MESSAGE_ILLEGAL, ResponseCode.INVALID_ARGUMENT), info.value
        assert admin.list_transactions() == []
