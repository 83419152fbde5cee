"""Hypothesis strategies of the fuzz suite: SendBatch buffers (well made, lying and damaged) and a request of every
RPC of a service (Broker, TransactionCoordinator, RocketMQ 5's MessagingService), derived from the service's own
descriptors (an RPC added later is generated too)."""

from __future__ import annotations

import struct
import zlib
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor, ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as v2s

from broker.format.message import ENTRY_HEADER, MESSAGE_MAGIC, PROPS_LEN, SysFlag, encode_properties
from broker.proto import coordinator_pb2 as cpb
from broker.proto import sluice_pb2 as pb

BROKER = pb.DESCRIPTOR.services_by_name["Broker"]
# The oracle reads these and the FzNew* topics the sends create: requests other than sends never name them (a
# topic deleted and made again starts its queue offsets over, and pulls then read the new messages).
KEPT_TOPICS = ["FzKept0", "FzKept1", "FzKept2"]
GROUP = "fz-producers"
BAD_TOPICS = ["", "a b", "\u00e9t\u00e9", "x" * 200, "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
              "RMQ_SYS_TRANS_OP_HALF_TOPIC", "rmq_sys_x", "%DLQ%fz", "../config", "T\x00"]
INT32_EDGES = [-1, 0, 1, 7, 8, 65535, 65536, 2**31 - 1, -(2**31)]
INT64_EDGES = [*INT32_EDGES, 2**63 - 1, -(2**63), 2**40]
HUGE_TEXT = ["t" * 20_000 + " ", "x\x01" * 3_000, "\u00e9" * 6_000, "9" * 10_000]


# ------------------------------------------------------------------------------------------------ entries

names = st.text(st.characters(exclude_characters="\x01\x02", codec="utf-8"), min_size=1, max_size=12)
values = st.text(st.characters(exclude_characters="\x01\x02", codec="utf-8"), max_size=40)
special = st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "REAL_TOPIC", "REAL_QID", "TRAN_MSG", "PGROUP",
                           "__transactionId__", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID"])
numbers = st.sampled_from(["0", "1", "-5", " 3", "\u0663", "\uff13", "\u00b2", "", "00", "9" * 30, "2147483648"])
canonical_properties = st.dictionaries(st.one_of(names, special), values, max_size=5).map(encode_properties)
delay_properties = st.tuples(canonical_properties, numbers).map(lambda p: p[0] + f"DELAY\x01{p[1]}\x02".encode())
pieces = st.sampled_from([b"\x00", b"\x01", b"\x02", b"a", b"bc", b"\xff", b"\xc3\xa9", b"\xed\xa0\x80", b"\xe0\x80",
                          b"KEYS", b"DELAY", b"REAL_QID", b"TAGS"])
raw_properties = st.lists(pieces, max_size=24).map(b"".join)
properties = st.one_of(canonical_properties, canonical_properties, delay_properties, raw_properties)


def pack_entry(topic: bytes, queue_id: int, body: bytes, props: bytes, flag: int = 0, sys_flag: int = 0,
               born: int = 0, reconsume: int = 0) -> bytes:
    """An entry as a client encodes it, with no check of what it holds (encode_entry would refuse some)."""
    total = ENTRY_HEADER.size + len(body) + 1 + len(topic) + 2 + len(props)
    head = ENTRY_HEADER.pack(total, MESSAGE_MAGIC, zlib.crc32(body) & 0x7FFFFFFF, queue_id, flag, 0, 0, sys_flag, born,
                             b"\x7f\x00\x00\x01", 0, 0, b"\x00" * 4, 0, reconsume, 0, len(body))
    return b"".join((head, body, bytes([len(topic) & 0xFF]), topic, PROPS_LEN.pack(len(props)), props))


@st.composite
def clean_entries(draw: st.DrawFn) -> dict[str, Any]:
    """The fields of an entry the broker takes."""
    topic = draw(st.one_of(st.sampled_from(KEPT_TOPICS), st.integers(0, 400).map(lambda n: f"FzNew{n}")))
    return {
        "topic": topic.encode(), "queue_id": draw(st.integers(0, 7)), "body": draw(st.binary(max_size=200)),
        "props": draw(canonical_properties), "flag": draw(st.integers(-(2**31), 2**31 - 1)), "sys_flag": 0,
        "born": draw(st.integers(0, 2**62)), "reconsume": draw(st.integers(0, 16)),
    }


@st.composite
def entries(draw: st.DrawFn) -> dict[str, Any]:
    """The fields of one entry: mostly ones the broker takes, sometimes each kind of bad value."""
    topic = draw(st.one_of(st.sampled_from(KEPT_TOPICS), st.sampled_from(KEPT_TOPICS),
                           st.integers(0, 400).map(lambda n: f"FzNew{n}"), st.sampled_from(BAD_TOPICS)))
    return {
        "topic": topic.encode("utf-8")[:127],
        "queue_id": draw(st.one_of(st.integers(0, 7), st.integers(0, 7), st.sampled_from(INT32_EDGES))),
        "body": draw(st.binary(max_size=200)),
        "props": draw(properties),
        "flag": draw(st.one_of(st.just(0), st.integers(-(2**31), 2**31 - 1))),
        "sys_flag": draw(st.one_of(st.just(0), st.just(0), st.sampled_from(
            [SysFlag.TRANSACTION_PREPARED_TYPE, SysFlag.TRANSACTION_COMMIT_TYPE, SysFlag.TRANSACTION_ROLLBACK_TYPE,
             SysFlag.BORNHOST_V6, 1, -1]))),
        "born": draw(st.one_of(st.just(1_700_000_000_000), st.sampled_from(INT64_EDGES))),
        "reconsume": draw(st.one_of(st.just(0), st.just(0), st.sampled_from(INT32_EDGES))),
    }


MUTATIONS = ["none", "none", "none", "flip a byte", "cut short", "trailing garbage", "lying TOTALSIZE", "bad CRC",
             "lying count"]


@st.composite
def batches(draw: st.DrawFn) -> dict[str, Any]:
    """A SendBatch: its entries' fields, a damage to do to the buffer, and a transaction (none, plain entries, or
    entries in half form). Half of them are clean (every entry one the broker takes, no damage): most of a
    hostile batch is refused, and acknowledged messages are what the oracle reads back."""
    clean = draw(st.booleans())
    size = draw(st.sampled_from([3, 3, 60]))
    return {
        "entries": draw(st.lists(clean_entries() if clean else entries(), min_size=1, max_size=size)),
        "mutation": "none" if clean else draw(st.sampled_from(MUTATIONS)),
        "where": draw(st.floats(0, 1)),
        "garbage": draw(st.binary(min_size=1, max_size=40)),
        "transaction": draw(st.sampled_from(["", "", "plain", "half"])),
    }


def mutate(buffer: bytes, first_entry: int, mutation: str, where: float, garbage: bytes) -> bytes:
    at = min(int(where * len(buffer)), len(buffer) - 1)
    if mutation == "flip a byte":
        return buffer[:at] + bytes([buffer[at] ^ 0xFF]) + buffer[at + 1 :]
    if mutation == "cut short":
        return buffer[: max(at, 1)]
    if mutation == "trailing garbage":
        return buffer + garbage
    if mutation == "lying TOTALSIZE":
        return buffer[:first_entry] + struct.pack(">i", int(where * (2**31 - 1))) + buffer[first_entry + 4 :]
    if mutation == "bad CRC":
        return buffer[: first_entry + 8] + struct.pack(">i", int(where * (2**31 - 1))) + buffer[first_entry + 12 :]
    return buffer


# ------------------------------------------------------------------------------------------------ any request

text = st.one_of(
    st.sampled_from(["FzRpc1", "FzOther", "fz-group", "T", "*", "TagA || TagB", "SQL92", "TAG", "a > 1", "OPEN",
                     "COMMITTED", "fz-tx-1", "7F0000010000A09F0000000000000000", GROUP]),
    st.sampled_from(BAD_TOPICS),
    st.text(max_size=30),
    st.sampled_from(HUGE_TEXT),
)
# Bounded where a valid value would only make the call slow (a long poll) or use up the broker's budgets at once.
BOUNDED = {
    "suspend_timeout_ms": st.integers(0, 300),
    "queue_nums": st.sampled_from([0, 1, 4, 8, -1, 1025, 2**31 - 1]),
    "retry_queue_nums": st.sampled_from([1, 2, 0, -1, 65, 2**31 - 1]),
    "max_msgs": st.sampled_from([0, 1, 32, -1, 2**31 - 1]),
}
# RocketMQ 5 names topics and groups in one message type: often a topic that exists or a valid group, so that
# calls get past the name checks (a pop of FzKept0 reads what the send family stored).
NAMED = {"apache.rocketmq.v2.Resource.name": st.one_of(
    st.sampled_from(["FzKept0", "FzKept1", "FzRpc1", "fz-group", "fz-group", "%RETRY%fz-group"]), text)}
# Durations a call waits for (RocketMQ 5's long polling): short, or past every bound (the broker's clamps).
WAITED_DURATIONS = {"long_polling_timeout"}
durations = st.one_of(st.tuples(st.just(0), st.integers(0, 300_000_000)),
                      st.sampled_from([(-1, 0), (0, -5), (2**40, 0), (315_576_000_001, 0), (0, 10**9)]))


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.full_name in NAMED:
        return NAMED[field.full_name]
    if field.name in BOUNDED:
        return BOUNDED[field.name]
    if field.type == FieldDescriptor.TYPE_STRING:
        return text
    if field.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=300)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([0, 1, 2, 3, 99])
    if field.type == FieldDescriptor.TYPE_DOUBLE:
        return st.floats(allow_nan=False)
    if field.type in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32):
        return st.one_of(st.integers(0, 10), st.sampled_from(INT32_EDGES))
    return st.one_of(st.integers(0, 10), st.sampled_from(INT64_EDGES))


def messages(descriptor: Descriptor, depth: int = 0, dense: bool = False) -> st.SearchStrategy[Any]:
    """A message of any type of the service: each field set or left out, oneofs at most one of theirs. ``dense``:
    three fields in four set (RocketMQ 5's requests name their topic three messages deep)."""
    present = st.sampled_from([True, True, True, False]) if dense else st.booleans()
    cls = GetMessageClass(descriptor)

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        message = cls()
        chosen = {o.name: draw(st.sampled_from([None, *[f.name for f in o.fields]])) for o in descriptor.oneofs}
        for field in descriptor.fields:
            oneof = field.containing_oneof
            if oneof is not None and chosen[oneof.name] != field.name:
                continue
            if oneof is None and not draw(present):
                continue
            _set(draw, message, field, depth, dense)
        return message

    return build()


def _set(draw: st.DrawFn, message: Any, field: FieldDescriptor, depth: int, dense: bool) -> None:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key_field = field.message_type.fields_by_name["key"]
        value_field = field.message_type.fields_by_name["value"]
        container = getattr(message, field.name)
        for key, value in draw(st.dictionaries(_scalar(key_field), _scalar(value_field), max_size=3)).items():
            container[key] = value
    elif field.name in WAITED_DURATIONS and not field.is_repeated:
        seconds, nanos = draw(durations)
        sub = getattr(message, field.name)
        sub.seconds, sub.nanos = seconds, nanos
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        if depth >= 2:
            return
        sub = messages(field.message_type, depth + 1, dense)
        if field.is_repeated:
            getattr(message, field.name).extend(draw(st.lists(sub, max_size=3)))
        else:
            getattr(message, field.name).CopyFrom(draw(sub))
    elif field.is_repeated:
        getattr(message, field.name).extend(draw(st.lists(_scalar(field), max_size=3)))
    else:
        setattr(message, field.name, draw(_scalar(field)))


def requests(service: ServiceDescriptor = BROKER) -> st.SearchStrategy[tuple[str, bool, Any]]:
    """(method, server streaming, request) for any method of the service."""
    return st.sampled_from(list(service.methods)).flatmap(
        lambda m: messages(m.input_type).map(lambda r: (m.name, m.server_streaming, r))
    )


def method_requests(service: ServiceDescriptor, dense: bool = False) -> st.SearchStrategy[tuple[MethodDescriptor, Any]]:
    """(method, request) for any method of the service."""
    return st.sampled_from(list(service.methods)).flatmap(
        lambda m: messages(m.input_type, dense=dense).map(lambda r: (m, r))
    )


def not_requests() -> st.SearchStrategy[bytes]:
    """Bytes that are no request: anything, or a length-delimited field whose bytes are not UTF-8."""
    return st.one_of(st.binary(max_size=200), st.binary(min_size=1, max_size=8).map(
        lambda b: b"\x0a" + bytes([len(b)]) + b.replace(b"a", b"\xff")))


# ------------------------------------------------------------------------------------------------ coordinator

# A few ids again and again, so that decisions meet ones recorded before; and ids the coordinator refuses.
transaction_ids = st.one_of(
    st.sampled_from([f"fz-co-{i}" for i in range(40)]),  # as pool_ids
    st.sampled_from(["", "a\x01b", "t\x02", "x" * 300, "\u00e9t\u00e9", "fz-co-"]),
    text,
)
shares = st.builds(
    lambda name, attempts, count: cpb.ParticipantShare(broker_name=name, committed_attempts=attempts,
                                                       expected_messages=count),
    st.one_of(st.sampled_from(["broker-a", "broker-b", "broker-c"]), st.sampled_from(["", "b\n", "x" * 200]), text),
    st.lists(st.one_of(st.sampled_from(["w1", "w2", "w3"]), st.sampled_from(["", "a,b", "\x01", "z" * 5000])),
             max_size=3),
    st.one_of(st.integers(0, 10), st.sampled_from(INT64_EDGES)),
)
decisions = st.builds(
    lambda txn, outcome, participants, decided: cpb.TransactionDecision(
        transaction_id=txn, outcome=outcome, participants=participants, decided_ms=decided),
    transaction_ids, st.sampled_from(["COMMIT", "COMMIT", "ABORT", "ABORT", "", "commit", "MAYBE"]),
    st.lists(shares, max_size=3), st.sampled_from(INT64_EDGES),
)
pool_ids = st.sampled_from([f"fz-co-{i}" for i in range(40)])
clean_shares = st.lists(st.sampled_from(["broker-a", "broker-b", "broker-c"]), min_size=1, max_size=3, unique=True).map(
    lambda brokers: [cpb.ParticipantShare(broker_name=b, committed_attempts=["w1"], expected_messages=i)
                     for i, b in enumerate(brokers)])
# A decision a participant would ask for: COMMIT with its shares, or ABORT with none.
clean_decisions = st.one_of(
    st.builds(lambda txn, p: cpb.TransactionDecision(transaction_id=txn, outcome="COMMIT", participants=p),
              pool_ids, clean_shares),
    pool_ids.map(lambda txn: cpb.TransactionDecision(transaction_id=txn, outcome="ABORT")),
)
coordinator_calls = st.one_of(
    clean_decisions.map(lambda d: ("RecordDecision", cpb.RecordDecisionRequest(decision=d))),
    decisions.map(lambda d: ("RecordDecision", cpb.RecordDecisionRequest(decision=d))),
    st.builds(lambda ids, prefix, abort: ("QueryDecisions", cpb.QueryDecisionsRequest(
        transaction_ids=ids, prefix=prefix, abort_undecided=abort)),
        st.lists(transaction_ids, max_size=4), st.sampled_from(["", "", "fz-co-", "fz-co-1", "f", "\x01", "x" * 300]),
        st.booleans()),
)


# ------------------------------------------------------------------------------------------------ RocketMQ 5

V2_TOPICS = [*KEPT_TOPICS, *(f"FzV2New{i}" for i in range(6))]
TIMESTAMPS_S = [1_600_000_000, 4_000_000_000, -5, 2**40, 0]  # past, years ahead, before 1970, past Timestamp's range
# The metadata a call carries: the client id header RocketMQ 5 requires, mostly; none, empty, too long.
v2_metadata = st.one_of(
    st.sampled_from([[("x-mq-client-id", "fz-v2-client")], [("x-mq-client-id", "fz-other")]]),
    st.sampled_from([[("x-mq-client-id", "fz-v2-client")], [], [("x-mq-client-id", "")],
                     [("x-mq-client-id", "c" * 300)]]),
)


safe_names = st.text(st.characters(min_codepoint=ord("a"), max_codepoint=ord("z")), min_size=1, max_size=8)
# A clean message's id: the oracle (fuzz_rmqv2.py) makes each one unique, as a client does; others repeat ids.
FRESH_ID = "<fresh>"


@st.composite
def v2_messages(draw: st.DrawFn, topic: str, clean: bool) -> v2.Message:
    """A RocketMQ 5 message as a client would send it (``clean``), or with each kind of bad value."""
    m = v2.Message(body=draw(st.binary(max_size=200)))
    m.topic.name = topic
    sp = m.system_properties
    if clean:
        sp.message_id = FRESH_ID
        sp.message_type = draw(st.sampled_from([v2.NORMAL, v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION]))
        tag = draw(st.sampled_from([None, "TagA", "TagB"]))
        sp.keys.extend(draw(st.lists(st.sampled_from(["k1", "k2"]), max_size=2)))
        if sp.message_type == v2.FIFO:
            sp.message_group = draw(st.sampled_from(["g1", "g2"]))
        if sp.message_type == v2.DELAY:
            sp.delivery_timestamp.seconds = draw(st.sampled_from(TIMESTAMPS_S[:2]))
        properties = draw(st.dictionaries(safe_names, safe_names, max_size=3))
    else:
        sp.message_id = draw(st.sampled_from([FRESH_ID, FRESH_ID, "", "FZDUP", "7F0000010000A09F0000000000000000"]))
        sp.message_type = draw(st.sampled_from([v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION,
                                                v2.MESSAGE_TYPE_UNSPECIFIED, 99]))
        sp.body_encoding = draw(st.sampled_from([v2.IDENTITY, v2.GZIP, 99]))
        tag = draw(st.one_of(st.none(), st.sampled_from(["TagA", "", " ", "a|b", "t\x01"])))
        sp.keys.extend(draw(st.lists(st.sampled_from(["k1", "", "k 3", "k\x02"]), max_size=3)))
        if sp.message_type == v2.FIFO or draw(st.booleans()):
            sp.message_group = draw(st.sampled_from(["g1", "", "g" * 64, "g\n"]))
        if sp.message_type == v2.DELAY or draw(st.booleans()):
            sp.delivery_timestamp.seconds = draw(st.sampled_from(TIMESTAMPS_S))
        if draw(st.booleans()):
            sp.born_timestamp.seconds = draw(st.sampled_from(TIMESTAMPS_S))
        sp.delivery_attempt = draw(st.sampled_from([0, 1, -1, 2**31 - 1]))
        properties = draw(st.dictionaries(st.one_of(names, st.sampled_from(["TAGS", "UNIQ_KEY", "DELAY", "a\x01"])),
                                          values, max_size=3))
    if tag is not None:
        sp.tag = tag
    for k, v in properties.items():
        m.user_properties[k] = v
    return m


@st.composite
def v2_sends(draw: st.DrawFn) -> v2s.SendMessageRequest:
    """A SendMessage: half of them clean (messages a client would send, of a kept or a new topic), the others of
    any topic with each kind of bad value, sometimes naming two topics."""
    clean = draw(st.booleans())
    topic = draw(st.sampled_from(V2_TOPICS) if clean else st.one_of(st.sampled_from(V2_TOPICS),
                                                                    st.sampled_from(BAD_TOPICS)))
    count = draw(st.sampled_from([1, 1, 1, 2, 5]))
    messages = [draw(v2_messages(topic, clean)) for _ in range(count)]
    if count > 1 and not clean and draw(st.booleans()):
        messages[-1].topic.name = draw(st.sampled_from(V2_TOPICS))
    return v2s.SendMessageRequest(messages=messages)
