"""The soak's checker, in the manner of Jepsen's queue checkers and OpenMessaging Chaos: after healing, every topic is
read back from every broker that serves it, and what the clients were told is held against it, feature by feature.

Per feature, ``checked`` counts the operations held against the promise, and each list names what broke it:

* ``lost``: an acknowledged send not stored (or, for consumers, a stored message never delivered to them);
* ``misplaced``: stored elsewhere than the queue and offset the acknowledgement named;
* ``duplicated``: stored twice (a send acknowledged or of unknown outcome), or refused yet stored;
* ``reordered``: ordered queues: one writer's messages stored or delivered out of their order;
* ``early`` / ``twice``: delay and timer messages made readable before they were due, or made readable twice;
* ``half_visible``: a transaction rolled back (or never committed) whose message is readable, or a committed one
  readable twice;
* ``redelivered_after_ack``: pop: a message delivered again after its acknowledgement was answered;
* ``offsets_backwards``: a committed consumer offset read back lower than one committed before;
* ``unexpected``: the Spark job's output holds a message that is not one of its input's.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from broker.client.connection import Connection
from broker.client.outgoing_message import decode_entries
from broker.format.message import StoredMessage
from broker.proto import sluice_pb2 as pb
from tests.soak.workload import History, Sent

LISTED = 10  # examples kept per violation list in the report (the counts are complete)
KINDS = ("lost", "misplaced", "duplicated", "reordered", "early", "twice", "half_visible", "redelivered_after_ack",
         "offsets_backwards", "unexpected")


@dataclass
class FeatureReport:
    checked: int = 0
    violations: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    notes: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, what: str) -> None:
        self.violations[kind].append(what)

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.violations.values())

    def as_json(self) -> dict[str, object]:
        return {"checked": self.checked, "violations": self.count, **self.notes,
                **{k: {"count": len(v), "examples": v[:LISTED]} for k, v in self.violations.items() if v}}


def read_topic(endpoint: str, topic: str, broker: str) -> list[tuple[str, StoredMessage]]:
    """(broker, message) for every message readable in every queue of ``topic`` at ``endpoint``."""
    out: list[tuple[str, StoredMessage]] = []
    conn = Connection(endpoint, timeout_s=30)
    try:
        ranges = conn.call(conn.stub.GetQueueOffsets, pb.GetQueueOffsetsRequest(topic=topic))
        for q in sorted(r.queue_id for r in ranges.queues):
            offset = 0
            while True:
                request = pb.PullRequest(consumer_group="soak-checker", topic=topic, queue_id=q, queue_offset=offset,
                                         max_msgs=512)
                r = conn.call(conn.stub.PullMessage, request)
                if r.status != pb.FOUND:
                    break
                out += [(broker, m) for m in decode_entries(r.entries, r.entry_positions)]
                offset = r.next_begin_offset
    finally:
        conn.close()
    return out


def where(stored: list[tuple[str, StoredMessage]]) -> dict[str, list[tuple[str, StoredMessage]]]:
    by_body: dict[str, list[tuple[str, StoredMessage]]] = defaultdict(list)
    for broker, m in stored:
        by_body[m.body.decode()].append((broker, m))
    return by_body


def check_sends(report: FeatureReport, sent: list[Sent], by_body: dict[str, list[tuple[str, StoredMessage]]],
                *, positions: bool = True) -> None:
    """Acknowledged sends stored once where acknowledged; unknown ones at most once; refused ones nowhere."""
    for s in sent:
        copies = by_body.get(s.body, [])
        report.checked += 1
        if s.status == "ok":
            if not copies:
                report.add("lost", f"{s.body} acknowledged at {s.broker}/{s.queue}/{s.offset}")
            elif positions and not any(b == s.broker and m.queue_id == s.queue and m.queue_offset == s.offset
                                       for b, m in copies):
                report.add("misplaced", f"{s.body} acknowledged at {s.broker}/{s.queue}/{s.offset}, stored at "
                                        f"{[(b, m.queue_id, m.queue_offset) for b, m in copies]}")
        elif s.status == "failed" and copies:
            report.add("duplicated", f"{s.body} refused but stored at {[(b, m.queue_id) for b, m in copies]}")
        if len(copies) > 1:
            report.add("duplicated", f"{s.body} ({s.status}) stored {len(copies)} times")
    report.notes["acknowledged"] = sum(s.status == "ok" for s in sent)
    report.notes["unknown"] = sum(s.status == "unknown" for s in sent)
    report.notes["refused"] = sum(s.status == "failed" for s in sent)


def check_timed(report: FeatureReport, sent: list[Sent], by_body: dict[str, list[tuple[str, StoredMessage]]]) -> None:
    for s in sent:
        copies = by_body.get(s.body, [])
        report.checked += 1
        if s.status == "ok" and not copies:
            report.add("lost", f"{s.body} acknowledged, due at {s.due_ms}")
        if len(copies) > 1:
            where = [(m.queue_id, m.queue_offset, m.commitlog_offset, m.store_timestamp) for _, m in copies]
            report.add("twice", f"{s.body} due at {s.due_ms} readable {len(copies)} times: {where}")
        for _b, m in copies:
            if m.store_timestamp < s.due_ms:
                report.add("early", f"{s.body} readable at {m.store_timestamp}, {s.due_ms - m.store_timestamp} ms "
                                    "before it was due")
    report.notes["acknowledged"] = sum(s.status == "ok" for s in sent)


def check_txn(report: FeatureReport, sent: list[Sent], by_body: dict[str, list[tuple[str, StoredMessage]]]) -> None:
    for s in sent:
        copies = by_body.get(s.body, [])
        report.checked += 1
        if s.intent == "rollback" and copies:
            report.add("half_visible", f"{s.body} rolled back, readable")
        elif s.status == "failed" and copies:
            report.add("half_visible", f"{s.body}: its half was refused, yet it is readable")
        elif s.intent == "commit" and s.status == "ok" and not copies:
            report.add("lost", f"{s.body}: half acknowledged, committed, not readable")
        if len(copies) > 1:
            report.add("duplicated", f"{s.body} readable {len(copies)} times")
    report.notes["committed"] = sum(s.intent == "commit" and s.status == "ok" for s in sent)
    report.notes["rolled_back"] = sum(s.intent == "rollback" and s.status == "ok" for s in sent)


def check_delivered(report: FeatureReport, history: History, consumer: str, stored: set[str]) -> None:
    """Every message stored in the topic reached the consumer (at least once)."""
    got = history.delivered_bodies(consumer)
    report.checked += len(stored)
    for body in sorted(stored - got):
        report.add("lost", f"{body} stored, never delivered to {consumer}")
    report.notes[f"{consumer}_deliveries"] = len(history.delivered.get(consumer, []))


def check_order(report: FeatureReport, history: History, consumer: str) -> None:
    """Per writer, a message delivered for the first time after a later one of the same writer: order broken
    (a redelivery of a message already delivered is allowed: delivery is at least once)."""
    seen: set[str] = set()
    highest: dict[str, int] = {}
    with history.lock:
        deliveries = list(history.delivered.get(consumer, []))
    for body, _ms in deliveries:
        if body in seen:
            continue
        seen.add(body)
        writer, seq = body.rsplit("-", 1)
        if int(seq) < highest.get(writer, 0):
            report.add("reordered", f"{body} delivered first after {writer}-{highest[writer]}")
        highest[writer] = max(highest.get(writer, 0), int(seq))


def check_copied(report: FeatureReport, source: set[str], copies: list[str]) -> None:
    """An exactly-once copy: every message of ``source`` in ``copies`` once, and nothing else there."""
    seen: dict[str, int] = defaultdict(int)
    for body in copies:
        seen[body] += 1
    report.checked += len(source)
    for body in sorted(source - set(seen)):
        report.add("lost", f"{body} in the input, not in the output")
    for body, n in sorted(seen.items()):
        if n > 1:
            report.add("duplicated", f"{body} in the output {n} times")
        if body not in source:
            report.add("unexpected", f"{body} in the output, not in the input")
    report.notes["output"] = len(copies)
