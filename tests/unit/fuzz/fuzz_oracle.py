"""The fuzz suite's broker and its oracle: a real broker process, every call's outcome judged, every acknowledged
message remembered and read back after each family of requests.

Rules (the standards' on bad input): a call is answered OK or refused with a Sluice response code in the
trailing metadata and a status that is not INTERNAL, with details any receiver accepts; a stream ends by itself
within the call's deadline (a deadline reached is a failure), except a subscription the broker keeps open by
design, and then only for a request it accepts; every message the broker acknowledged reads back byte for byte (by
msgId and by pull, the same bytes); the store passes ``check()``. A service's own oracle (fuzz_coordinator.py,
fuzz_rmqv2.py) adds its checks to ``Fuzzer.checks``: they run with the read-back, before and after each restart.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from hypothesis import HealthCheck, settings

from broker.config import BrokerConfig
from broker.errors import BrokerError
from broker.format.message import POS_QUEUE_OFFSET, POS_STORE_TIMESTAMP, decode_entry, parse_layout
from broker.format.send_checks import validate_producer_group
from broker.format.system_topics import DLQ_GROUP_TOPIC_PREFIX
from broker.proto import sluice_pb2 as pb
from broker.proto import sluice_pb2_grpc as pb_grpc
from broker.server.check_streams import MAX_CLIENT_ID_CHARS
from broker.server.process import BrokerProcess
from broker.store import MessageStore
from tests.unit.fuzz.fuzz_strategies import KEPT_TOPICS
from tests.unit.server.hardening_rpc import Answer, answer, clear_refusal

# The store fields the broker fills in (QUEUEOFFSET + PHYSICALOFFSET, STORETIMESTAMP + STOREHOST): an acknowledged
# entry reads back as it was sent except there.
STORE_FIELDS = ((POS_QUEUE_OFFSET, POS_QUEUE_OFFSET + 16), (POS_STORE_TIMESTAMP, POS_STORE_TIMESTAMP + 16))
STORE_SETTINGS = {"mapped_file_size_commit_log": 64 << 20}
CALL_TIMEOUT_S = 60.0  # generous: a busy 2-core CI machine can take seconds over an fsync
# A clean stop syncs every consume queue with unsynced units (thousands after the long run's families): on a
# loaded machine that took longer than BrokerProcess's default half minute.
STOP_TIMEOUT_S = 300.0
# FUZZ_LONG (make fuzz): many more examples per family, and a SIGKILL instead of a clean stop between families.
LONG = os.environ.get("SLUICE_FUZZ_LONG", "") not in ("", "0")
SCALE = 15 if LONG else 1  # each family's examples: the default run's count times this
FUZZ_SETTINGS = settings(
    deadline=None, database=None, derandomize=not LONG, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
# How long a subscription stream the broker keeps open by design is watched: long enough for a refusal to arrive.
SUBSCRIPTION_WAIT_S = 1.0
PULL_MAX_MSGS = 256  # a queue read whole after a family: messages a pull
Metadata = Sequence[tuple[str, str]]


def _kept_open_check_stream(data: bytes) -> bool:
    """Whether the broker keeps this TransactionCheckStream open (its own checks of the subscription pass): there
    a deadline is the expected outcome, for any other request it is a hung call."""
    request = pb.TransactionCheckSubscribe()
    try:
        request.ParseFromString(data)
        validate_producer_group(request.producer_group)
    except (ValueError, BrokerError):  # DecodeError is a ValueError
        return False
    return len(request.client_id) <= MAX_CLIENT_ID_CHARS


# Streams that stay open until the client ends them, by their method's path: whether a request keeps one open.
SUBSCRIPTIONS: dict[str, Callable[[bytes], bool]] = {
    "/sluice.v1.Broker/TransactionCheckStream": _kept_open_check_stream,
}


def masked(entry: bytes) -> bytes:
    out = bytearray(entry)
    for a, b in STORE_FIELDS:
        out[a:b] = bytes(b - a)
    return bytes(out)


@dataclass
class Acked:
    """A message the broker acknowledged, and what it must read back as."""

    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    entry: bytes | None = None  # a SendBatch entry as sent: it reads back equal but for the store fields
    fields: dict[str, Any] | None = None  # a SendMessage's fields: they read back equal


@dataclass
class Committed:
    """A half of a fuzz transaction: once committed, a message of its real queue with this body (unique) whose
    properties begin with the ones it was sent with."""

    topic: str
    queue_id: int
    body: bytes
    properties: bytes


@dataclass
class Fuzzer:
    store_dir: Path
    config: Path
    broker: BrokerProcess | None = None
    channel: grpc.Channel | None = None
    stub: pb_grpc.BrokerStub | None = None
    acked: list[Acked] = field(default_factory=list)
    transactions: dict[str, list[Committed]] = field(default_factory=dict)
    calls: int = 0
    refused: int = 0
    problems: list[str] = field(default_factory=list)
    families: int = 0
    _mark: tuple[int, int] = (0, 0)  # (calls, refused) when the family began
    _checked: list[str] = field(default_factory=list)  # what the services' checks found at the last read-back
    # A service's own oracle, run with every read-back: its argument says when, it returns what it checked
    checks: list[Callable[[str], str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ------------------------------------------------------------------------------------------ broker
    def start(self) -> None:
        self.broker = BrokerProcess(self.store_dir, config=self.config).start()
        self.channel = grpc.insecure_channel(
            self.broker.endpoint,
            options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)],
        )
        self.stub = pb_grpc.BrokerStub(self.channel)

    def stop(self, kill: bool = False) -> None:
        assert self.broker is not None and self.channel is not None
        self.channel.close()
        if kill:
            self.broker.kill()
        else:
            code = self.broker.stop(STOP_TIMEOUT_S)
            assert code == 0, f"broker exited {code}:\n" + "\n".join(self.broker.output)
        self.broker = None

    @property
    def endpoint(self) -> str:
        assert self.broker is not None
        return self.broker.endpoint

    # ------------------------------------------------------------------------------------------ calls
    def judge(self, what: str, a: Answer) -> Answer:
        """Record a call's outcome; a refusal that is not clear is a problem (reported at the family's end)."""
        self.record(what, refused=not a.ok, problem="" if a.ok or clear_refusal(a) else str(a))
        return a

    def record(self, what: str, *, refused: bool, problem: str = "") -> None:
        """Count a call (refused or not); ``problem``: what was wrong with its answer (reported at the family's
        end)."""
        with self._lock:
            self.calls += 1
            self.refused += refused
            if problem:
                self.problems.append(f"{what}: {problem}")

    def call(self, method: str, request: Any, timeout_s: float = CALL_TIMEOUT_S) -> Answer:
        assert self.stub is not None
        return self.judge(method, answer(getattr(self.stub, method), request, timeout_s))

    def call_raw(self, method: str, data: bytes, *, streaming: bool = False) -> Answer:
        """Bytes as they are, to any method of the Broker service; the answer's bytes as they are (a stream's: the
        list of them), judged."""
        a = self.judge(method, self.send_raw(f"/sluice.v1.Broker/{method}", data, streaming=streaming))
        if method == "DeleteTopic" and a.ok:
            self.forget_topic(pb.DeleteTopicRequest.FromString(data).topic)
        return a

    def forget_topic(self, topic: str) -> None:
        """A topic deleted by a request the broker accepted: its messages belong to no topic any more and are read
        by no id, offset or key (a topic made again under the name is another one), so none is owed back."""
        self.acked = [m for m in self.acked if m.topic != topic]
        self.transactions = {t: [h for h in halves if h.topic != topic] for t, halves in self.transactions.items()}

    def send_raw(self, path: str, data: bytes | list[bytes], *, streaming: bool = False,
                 client_streaming: bool = False, metadata: Metadata = ()) -> Answer:
        """A call of any method with bytes as they are, not judged. A stream is read to its end: one still open at
        its deadline is a deadline answer (a failure), unless it is a subscription the broker keeps open for this
        request (SUBSCRIPTIONS), which is answered OK with no response."""
        assert self.channel is not None
        raw: dict[str, Any] = {"request_serializer": lambda b: b, "response_deserializer": lambda b: b}
        if client_streaming:
            assert isinstance(data, list)
            both = self.channel.stream_stream(path, **raw)
            return answer(lambda d, timeout: list(both(iter(d), timeout=timeout, metadata=metadata)), data,
                          CALL_TIMEOUT_S)
        assert isinstance(data, bytes)
        if streaming:
            stream = self.channel.unary_stream(path, **raw)
            kept_open = SUBSCRIPTIONS.get(path)
            a = answer(lambda d, timeout: list(stream(d, timeout=timeout, metadata=metadata)), data,
                       SUBSCRIPTION_WAIT_S if kept_open is not None else CALL_TIMEOUT_S)
            if a.status == grpc.StatusCode.DEADLINE_EXCEEDED and a.code is None and kept_open and kept_open(data):
                return Answer(grpc.StatusCode.OK, None, "")  # open, as the broker keeps this subscription
            return a
        unary = self.channel.unary_unary(path, **raw)
        return answer(lambda d, timeout: unary(d, timeout=timeout, metadata=metadata), data, CALL_TIMEOUT_S)

    # ------------------------------------------------------------------------------------------ acknowledged
    def sent_batch(self, request: pb.SendBatchRequest, a: Answer, entries: list[bytes], plain: list[bool]) -> None:
        """Remember what an acknowledged SendBatch stored. ``plain``: per entry, stored as sent (no transaction)."""
        if not a.ok:
            return
        r = a.response
        assert len(r.commitlog_offsets) == len(entries), (len(r.commitlog_offsets), len(entries))
        for i, entry in enumerate(entries):
            msg = decode_entry(entry)
            if request.transaction_id:
                topic, qid = msg.topic, msg.queue_id
                raw_props = _raw_properties(entry)
                if topic == "RMQ_SYS_TRANS_HALF_TOPIC":  # half form: the real queue is in its properties
                    topic, qid = msg.properties["REAL_TOPIC"], int(msg.properties["REAL_QID"])
                    raw_props = raw_props[: (b"\x02" + raw_props).find(b"\x02REAL_TOPIC\x01")]
                with self._lock:
                    self.transactions.setdefault(request.transaction_id, []).append(
                        Committed(topic, qid, msg.body, raw_props)
                    )
            elif plain[i]:
                msg_id = f"{r.msg_id_prefix}{r.commitlog_offsets[i]:016X}"
                with self._lock:
                    self.acked.append(Acked(msg_id, msg.topic, r.queue_ids[i], r.queue_offsets[i], entry=entry))

    def sent_half(self, txn_id: str, topic: str, queue_id: int, body: bytes) -> None:
        """An acknowledged transactional SendMessage: its commit must show the body (its properties come from a
        map, in no fixed order)."""
        with self._lock:
            self.transactions.setdefault(txn_id, []).append(Committed(topic, queue_id, body, b""))

    def sent_message(self, request: pb.SendMessageRequest, a: Answer) -> None:
        if not a.ok or request.transactional or request.transaction_id or request.properties.get("DELAY", "0") != "0":
            return
        r = a.response
        fields = {"topic": request.topic, "body": request.body, "properties": dict(request.properties),
                  "flag": request.flag, "sys_flag": request.sys_flag, "reconsume_times": request.reconsume_times}
        msg_id = f"{r.msg_id_prefix}{r.commitlog_offsets[0]:016X}"
        with self._lock:
            self.acked.append(Acked(msg_id, request.topic, r.queue_ids[0], r.queue_offsets[0], fields=fields))

    # ------------------------------------------------------------------------------------------ after a family
    def end_family(self, name: str) -> str:
        """Commit the family's transactions, check everything, restart the broker; a summary line."""
        calls, refused = self.calls - self._mark[0], self.refused - self._mark[1]
        problems, self.problems = self.problems, []
        assert not problems, f"{name}: {len(problems)} unclear refusals, first ones:\n" + "\n".join(problems[:10])
        self._commit_transactions()
        self._read_back(name)
        self.families += 1
        kill = LONG and self.families % 2 == 0
        t0 = time.monotonic()
        self.stop(kill=kill)
        t1 = time.monotonic()
        found = store_problems(self.store_dir, self.config)
        assert found == [], f"{name}: check() after the family: {found[:10]}"
        t2 = time.monotonic()
        self.start()
        t3 = time.monotonic()
        self._read_back(f"{name}, after {'SIGKILL' if kill else 'SIGTERM'} and restart")
        self._mark = (self.calls, self.refused)
        return (f"{name}: {calls} requests, {refused} refused clearly; {len(self.acked)} acknowledged messages read "
                f"back byte for byte; {''.join(c + '; ' for c in self._checked)}check() clean (stop {t1 - t0:.1f} s, "
                f"check {t2 - t1:.1f} s, start {t3 - t2:.1f} s)")

    def _commit_transactions(self) -> None:
        for txn_id, halves in sorted(self.transactions.items()):
            a = self.call("EndTransaction", pb.EndTransactionRequest(transaction_id=txn_id, commit=True,
                                                                     expected_messages=len(halves)))
            assert a.ok and a.response.status == "COMMITTED", f"commit of {txn_id}: {a}"
        # Looked for once every transaction has ended: a queue shows nothing past the first message of a transaction
        # still open (its readable limit), so a commit's messages may wait for another transaction's end
        for txn_id, halves in sorted(self.transactions.items()):
            for h in halves:
                found = self._find_committed(h)
                assert found, f"{txn_id}: committed message {h.body[:40]!r} of {h.topic}/{h.queue_id} not found"
        self.transactions.clear()

    def bodies(self, topic: str, prefix: bytes, when: str) -> set[bytes]:
        """The bodies starting with ``prefix`` (those a service's oracle made unique) of every message of ``topic``,
        its queues read whole by pull (none: no such topic)."""
        offsets = self.call("GetQueueOffsets", pb.GetQueueOffsetsRequest(topic=topic))
        if not offsets.ok:
            return set()
        out: set[bytes] = set()
        for q in offsets.response.queues:
            offset = q.min_offset
            while offset < q.max_offset:
                a = self.call("PullMessage", pb.PullRequest(consumer_group="fuzz-oracle", topic=topic,
                                                            queue_id=q.queue_id, queue_offset=offset,
                                                            max_msgs=PULL_MAX_MSGS))
                assert a.ok, f"{when}: pull of {topic}/{q.queue_id} at {offset}: {a}"
                out |= {decode_entry(e).body for e in _entries(a.response)}
                if a.response.next_begin_offset <= offset:
                    break
                offset = a.response.next_begin_offset
        return {b for b in out if b.startswith(prefix)}

    def _find_committed(self, h: Committed) -> bool:
        """Whether a committed message with the half's body (and properties, as sent, first) is in its queue (any
        of the topic's first eight when the send let the broker pick: queue_id < 0). A dead-letter queue cannot
        be pulled: there the queue must merely hold messages."""
        if h.topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
            a = self.call("GetQueueOffsets", pb.GetQueueOffsetsRequest(topic=h.topic))
            return a.ok and any(q.max_offset > 0 for q in a.response.queues)
        for queue_id in [h.queue_id] if h.queue_id >= 0 else range(8):
            offset = 0
            while True:
                a = self.call("PullMessage", pb.PullRequest(consumer_group="fuzz-oracle", topic=h.topic,
                                                            queue_id=queue_id, queue_offset=offset, max_msgs=256))
                if a.ok and a.response.status == pb.NO_MATCHED_MSG:  # only rolled-back messages: past them
                    offset = a.response.next_begin_offset
                    continue
                if not a.ok or a.response.status != pb.FOUND:
                    break
                for m in _entries(a.response):
                    if decode_entry(m).body == h.body:
                        return _raw_properties(m).startswith(h.properties)
                offset = a.response.next_begin_offset
        return False

    def _read_back(self, when: str) -> None:
        assert self.call("GetBrokerStats", pb.GetBrokerStatsRequest()).ok, f"{when}: the broker does not answer"
        self._checked = [check(when) for check in self.checks]
        for m in self.acked:
            view = self.call("ViewMessageById", pb.ViewMessageByIdRequest(msg_id=m.msg_id))
            assert view.ok, f"{when}: acknowledged {m.msg_id} cannot be viewed: {view}"
            raw = view.response.entries
            if not m.topic.startswith(DLQ_GROUP_TOPIC_PREFIX):  # dead letters are viewed, never pulled
                pull = self.call("PullMessage", pb.PullRequest(consumer_group="fuzz-oracle", topic=m.topic,
                                                               queue_id=m.queue_id, queue_offset=m.queue_offset,
                                                               max_msgs=1))
                assert pull.ok and pull.response.status == pb.FOUND, f"{when}: {m.msg_id} cannot be pulled: {pull}"
                assert pull.response.entries == raw, f"{when}: {m.msg_id} pulls other bytes than it views"
            if m.entry is not None:
                assert masked(raw) == masked(m.entry), f"{when}: {m.msg_id} does not read back as sent"
            else:
                assert m.fields is not None
                got = decode_entry(raw)
                read = {"topic": got.topic, "body": got.body, "properties": got.properties, "flag": got.flag,
                        "sys_flag": got.sys_flag, "reconsume_times": got.reconsume_times}
                assert read == m.fields, f"{when}: {m.msg_id} reads back {read} for {m.fields}"


def _entries(r: Any) -> list[bytes]:
    ends = [*r.entry_positions[1:], len(r.entries)]
    return [r.entries[a:b] for a, b in zip(r.entry_positions, ends, strict=True)]


def _raw_properties(entry: bytes) -> bytes:
    lay = parse_layout(entry, 0, len(entry))
    return entry[lay.props_start : lay.props_start + lay.props_len]


def store_problems(store_dir: Path, config: Path) -> list[str]:
    """check() of the stopped broker's store, opened with the broker's own store settings (delay levels included:
    the schedule topic's units hold due times) and recovered as it would be (after a SIGKILL)."""
    settings = BrokerConfig.from_file(config, store_path=str(store_dir))
    store = MessageStore(settings.store_config())
    store.start()
    try:
        return store.check()
    finally:
        store.shutdown()


@contextmanager
def started_fuzzer(root: Path, broker_settings: dict[str, Any]) -> Iterator[Fuzzer]:
    """A fuzzer whose broker runs with ``broker_settings`` in ``root`` and serves KEPT_TOPICS (eight queues each);
    afterwards the broker is stopped and ``root`` removed: the store is preallocated, and pytest's
    tmp_path_retention_policy only removes function-scoped directories."""
    config = root / "broker.json"
    config.write_text(json.dumps(broker_settings))
    f = Fuzzer(root / "store", config)
    f.start()
    for topic in KEPT_TOPICS:
        assert f.call("CreateTopic", pb.CreateTopicRequest(topic=topic, queue_nums=8)).ok
    try:
        yield f
    finally:
        if f.broker is not None:
            f.stop()
        shutil.rmtree(root)


def family(fuzzer: Fuzzer, name: str, run: Callable[[], None]) -> str:
    run()
    return fuzzer.end_family(name)
