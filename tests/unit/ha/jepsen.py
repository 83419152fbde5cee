"""A Jepsen-style workload and checker for replicated broker groups (the shape of Jepsen's Kafka and OpenChaos
queue tests): writers send unique messages and record each send as acknowledged (with the queue and offset the
broker answered), failed (refused: certainly not stored) or unknown (no answer, or not confirmed by the replicas);
faults are injected meanwhile; after healing, every replica's log is read back and checked:

* lost: an acknowledged message is not read at the queue and offset it was acknowledged at;
* conflicting: one (queue, offset) holds two different messages (across replicas, or against an acknowledgement);
* duplicated: an acknowledged message stored twice; unknown outcomes stored more than once count too;
* reordered: one writer's messages (each writer keeps to one queue) read out of the order they were acknowledged in.

``Report.table()`` prints the counts. Every message body is ``w<writer>-<seq>``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from broker.client import Message, Producer
from broker.client.connection import Connection
from broker.client.outgoing_message import decode_entries
from broker.errors import BrokerError, BrokerUnreachableError, SendOutcomeUnknownError
from broker.proto import sluice_pb2 as pb

TOPIC = "JepsenTopic"
QUEUES = 4


@dataclass
class Outcome:
    body: str
    writer: int
    seq: int
    status: str  # ok | failed | unknown
    queue_id: int = -1
    queue_offset: int = -1


@dataclass
class Workload:
    namesrv: str
    writers: int = 4
    send_timeout_s: float = 20.0
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    pause_s: float = 0.0  # between sends of one writer

    def start(self) -> Workload:
        for w in range(self.writers):
            t = threading.Thread(target=self._write, args=(w,), name=f"writer-{w}", daemon=True)
            self._threads.append(t)
            t.start()
        return self

    def _write(self, writer: int, once: bool = False) -> None:
        producer = Producer(namesrv=self.namesrv, timeout_s=self.send_timeout_s, attempt_timeout_s=3.0)
        seq = 0
        try:
            while not self._stop.is_set() and not (once and seq):
                seq += 1
                body = f"w{writer}-{seq}"
                out = Outcome(body, writer, seq, "unknown")
                try:
                    # one queue per writer (a sharding key), so the queue keeps its order
                    r = producer.send(Message(TOPIC, body.encode()), sharding_key=f"writer-{writer}")
                    out.status, out.queue_id, out.queue_offset = "ok", r.queue_id, r.queue_offset
                except SendOutcomeUnknownError:
                    out.status = "unknown"
                except BrokerUnreachableError as e:
                    out.status = "unknown" if e.request_sent else "failed"
                except BrokerError:
                    out.status = "failed"  # refused: nothing stored by any attempt of this send
                with self._lock:
                    self.outcomes.append(out)
                if out.status != "ok":
                    time.sleep(0.1)
                elif self.pause_s:
                    time.sleep(self.pause_s)
        finally:
            producer.close()

    def burst(self, count: int, first_writer: int = 1000) -> list[threading.Thread]:
        """``count`` one-message writers at once (each its own writer id): while the replicas cannot confirm, each
        appends to the master's log and waits, so the master's log runs ahead of every replica's."""
        threads = [threading.Thread(target=self._write_one, args=(first_writer + i,), daemon=True)
                   for i in range(count)]
        for t in threads:
            t.start()
        self._threads += threads
        return threads

    def _write_one(self, writer: int) -> None:
        self._write(writer, once=True)

    def acknowledged(self) -> int:
        with self._lock:
            return sum(1 for o in self.outcomes if o.status == "ok")

    def wait_acknowledged(self, more: int, timeout_s: float = 60.0) -> float:
        """Block until ``more`` sends beyond now were acknowledged; the seconds it took."""
        target = self.acknowledged() + more
        started = time.monotonic()
        while self.acknowledged() < target:
            if time.monotonic() - started > timeout_s:
                raise AssertionError(f"no {more} acknowledged sends within {timeout_s} s ({self.summary()})")
            time.sleep(0.02)
        return time.monotonic() - started

    def summary(self) -> str:
        with self._lock:
            c = Counter(o.status for o in self.outcomes)
        return ", ".join(f"{k} {v}" for k, v in sorted(c.items()))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.send_timeout_s + 10)


def read_log(endpoint: str) -> dict[tuple[int, int], str]:
    """(queue, offset) -> body of every message of the topic one replica serves (every queue it has)."""
    out: dict[tuple[int, int], str] = {}
    conn = Connection(endpoint, timeout_s=10)
    try:
        ranges = conn.call(conn.stub.GetQueueOffsets, pb.GetQueueOffsetsRequest(topic=TOPIC))
        for q in sorted(r.queue_id for r in ranges.queues):
            offset = 0
            while True:
                request = pb.PullRequest(consumer_group="jepsen-checker", topic=TOPIC, queue_id=q,
                                         queue_offset=offset, max_msgs=512)
                r = conn.call(conn.stub.PullMessage, request)
                if r.status != pb.FOUND:
                    break
                for m in decode_entries(r.entries, r.entry_positions):
                    out[(q, m.queue_offset)] = m.body.decode()
                offset = r.next_begin_offset
    finally:
        conn.close()
    return out


@dataclass
class Report:
    name: str
    acknowledged: int = 0
    read: int = 0
    lost: list[str] = field(default_factory=list)
    conflicting: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    reordered: list[str] = field(default_factory=list)
    unknown: int = 0
    unknown_stored: int = 0
    failed: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.conflicting or self.duplicated or self.reordered)

    def table(self) -> str:
        headers = ["run", "acknowledged", "read", "lost", "conflicting", "duplicated", "reordered", "unknown",
                   "unknown stored", "failed", *self.extra]
        row = [self.name, self.acknowledged, self.read, len(self.lost), len(self.conflicting), len(self.duplicated),
               len(self.reordered), self.unknown, self.unknown_stored, self.failed,
               *(f"{v:.2f}" for v in self.extra.values())]
        widths = [max(len(str(h)), len(str(v))) for h, v in zip(headers, row, strict=True)]
        line = "  ".join(str(h).ljust(w) for h, w in zip(headers, widths, strict=True))
        values = "  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True))
        return f"{line}\n{'  '.join('-' * w for w in widths)}\n{values}"

    def details(self) -> str:
        return (f"lost {self.lost[:10]} conflicting {self.conflicting[:10]} duplicated {self.duplicated[:10]} "
                f"reordered {self.reordered[:10]}")


def check(name: str, outcomes: list[Outcome], logs: dict[str, dict[tuple[int, int], str]]) -> Report:
    """Check what the writers were told against what every replica holds (``logs``: replica -> its log)."""
    report = Report(name)
    merged: dict[tuple[int, int], str] = {}
    for replica, log in logs.items():
        for pos, body in log.items():
            if merged.setdefault(pos, body) != body:
                report.conflicting.append(f"{pos}: {merged[pos]} on one replica, {body} on {replica}")
    report.read = len(merged)
    where: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for pos, body in merged.items():
        where[body].append(pos)
    for o in outcomes:
        if o.status == "ok":
            report.acknowledged += 1
            held = merged.get((o.queue_id, o.queue_offset))
            if held is None:
                report.lost.append(f"{o.body} at {o.queue_id}/{o.queue_offset}")
            elif held != o.body:
                report.conflicting.append(f"{o.body} acknowledged at {o.queue_id}/{o.queue_offset}, which holds {held}")
            if len(where.get(o.body, [])) > 1:
                report.duplicated.append(f"{o.body} at {where[o.body]}")
        elif o.status == "unknown":
            report.unknown += 1
            n = len(where.get(o.body, []))
            report.unknown_stored += n > 0
            if n > 1:
                report.duplicated.append(f"{o.body} (unknown outcome) at {where[o.body]}")
        else:
            report.failed += 1
            if o.body in where:  # a refusal said nothing was stored
                report.duplicated.append(f"{o.body} was refused but is stored at {where[o.body]}")
    last: dict[int, tuple[int, int, str]] = {}  # writer -> (queue, offset, body) of its last message read
    for (q, off), body in sorted(merged.items()):
        writer, seq = body[1:].split("-")
        prev = last.get(int(writer))
        if prev is not None and prev[0] == q and int(prev[2].split("-")[1]) > int(seq):
            report.reordered.append(f"{body} at {q}/{off} after {prev[2]} at {prev[0]}/{prev[1]}")
        last[int(writer)] = (q, off, body)
    return report


