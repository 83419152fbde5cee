"""The fuzz suite's broker and its oracle: a real broker process, every call's outcome judged, every acknowledged
message remembered and read back after each family of requests.

Rules (the standards' on bad input): a call is answered OK or refused with a Sluice response code in the
trailing metadata and a status that is not INTERNAL, with details any receiver accepts; every message the broker
acknowledged reads back byte for byte (by msgId and by pull, the same bytes); the store passes ``check()``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from broker.config import BrokerConfig
from broker.format.message import POS_QUEUE_OFFSET, POS_STORE_TIMESTAMP, decode_entry, parse_layout
from broker.format.system_topics import DLQ_GROUP_TOPIC_PREFIX
from broker.proto import sluice_pb2 as pb
from broker.proto import sluice_pb2_grpc as pb_grpc
from broker.server.process import BrokerProcess
from broker.store import MessageStore
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
        with self._lock:
            self.calls += 1
            if not a.ok:
                self.refused += 1
                if not clear_refusal(a):
                    self.problems.append(f"{what}: {a}")
        return a

    def call(self, method: str, request: Any, timeout_s: float = CALL_TIMEOUT_S) -> Answer:
        assert self.stub is not None
        return self.judge(method, answer(getattr(self.stub, method), request, timeout_s))

    def call_raw(self, method: str, data: bytes, *, streaming: bool = False) -> Answer:
        """Bytes as they are, to any method (a streaming one: its first answer, a deadline meaning it is open)."""
        assert self.channel is not None
        path = f"/sluice.v1.Broker/{method}"
        if streaming:
            stream = self.channel.unary_stream(path, request_serializer=lambda b: b, response_deserializer=lambda b: b)

            def first(request: bytes, timeout: float) -> object:
                return next(iter(stream(request, timeout=timeout)), None)

            a = answer(first, data, 1.0)
            if a.status == grpc.StatusCode.DEADLINE_EXCEEDED:  # opened, and nothing to check back yet
                return self.judge(method, Answer(grpc.StatusCode.OK, None, ""))
            return self.judge(method, a)
        unary = self.channel.unary_unary(path, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        return self.judge(method, answer(unary, data, CALL_TIMEOUT_S))

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
                f"back byte for byte; check() clean (stop {t1 - t0:.1f} s, check {t2 - t1:.1f} s, start "
                f"{t3 - t2:.1f} s)")  # fmt: skip

    def _commit_transactions(self) -> None:
        for txn_id, halves in sorted(self.transactions.items()):
            a = self.call("EndTransaction", pb.EndTransactionRequest(transaction_id=txn_id, commit=True,
                                                                     expected_messages=len(halves)))  # fmt: skip
            assert a.ok and a.response.status == "COMMITTED", f"commit of {txn_id}: {a}"
        # Looked for once every transaction has ended: a queue shows nothing past the first message of a transaction
        # still open (its readable limit), so a commit's messages may wait for another transaction's end
        for txn_id, halves in sorted(self.transactions.items()):
            for h in halves:
                found = self._find_committed(h)
                assert found, f"{txn_id}: committed message {h.body[:40]!r} of {h.topic}/{h.queue_id} not found"
        self.transactions.clear()

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
        for m in self.acked:
            view = self.call("ViewMessageById", pb.ViewMessageByIdRequest(msg_id=m.msg_id))
            assert view.ok, f"{when}: acknowledged {m.msg_id} cannot be viewed: {view}"
            raw = view.response.entries
            if not m.topic.startswith(DLQ_GROUP_TOPIC_PREFIX):  # dead letters are viewed, never pulled
                pull = self.call("PullMessage", pb.PullRequest(consumer_group="fuzz-oracle", topic=m.topic,
                                                               queue_id=m.queue_id, queue_offset=m.queue_offset,
                                                               max_msgs=1))  # fmt: skip
                assert pull.ok and pull.response.status == pb.FOUND, f"{when}: {m.msg_id} cannot be pulled: {pull}"
                assert pull.response.entries == raw, f"{when}: {m.msg_id} pulls other bytes than it views"
            if m.entry is not None:
                assert masked(raw) == masked(m.entry), f"{when}: {m.msg_id} does not read back as sent"
            else:
                assert m.fields is not None
                got = decode_entry(raw)
                read = {"topic": got.topic, "body": got.body, "properties": got.properties, "flag": got.flag,
                        "sys_flag": got.sys_flag, "reconsume_times": got.reconsume_times}  # fmt: skip
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


def family(fuzzer: Fuzzer, name: str, run: Callable[[], None]) -> str:
    run()
    return fuzzer.end_family(name)
