"""SIGKILL of a broker process at random moments, for each of its write paths: after a restart nothing the broker
acknowledged is lost and the store is consistent.

Sends (`--flush sync` and `--flush async`: SIGKILL leaves the page cache, so an acknowledged send survives a process
kill with either; single sends on the producer's send stream, batches as SendBatch calls), topic creation and
consumer-offset commits, topic deletion, subscription-group updates. Kill moments come from a seeded RNG; the seed
is SLUICE_CRASH_SEED when set, else the clock, and is printed.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.client import Admin, Message, Producer, PullConsumer, PullStatus, SendStatus
from broker.errors import BrokerError
from broker.server.process import BrokerProcess
from broker.store import MessageStore, StoreConfig
from tests.support.crash import crash_rng

CYCLES = 3
QUEUES = 4
OFFSET_ROOM = 20_000  # messages per queue under the offset-commit crash test
STORE = {"mapped_file_size_commit_log": 1048576, "max_message_size": 65536}


def write_config(path: Path, **settings: object) -> Path:
    path.write_text(json.dumps({**settings, "store": STORE}))
    return path


def store_problems(store_dir: Path) -> list[str]:
    """check() of a stopped broker's store, opened as the broker opens it (recovering it if it did not stop)."""
    store = MessageStore(StoreConfig(store_path=str(store_dir), **STORE))  # type: ignore[arg-type]
    store.start()
    try:
        return store.check()
    finally:
        store.shutdown()


@dataclass
class Acked:
    """Messages the broker acknowledged SEND_OK: (queue id, queue offset) -> body."""

    at: dict[tuple[int, int], bytes] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    interrupted: int = 0  # writers the kill stopped in the middle of their loop
    streamed: int = 0  # single sends answered on a send stream (broker/client/call_stream.py)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, qid: int, offset: int, body: bytes) -> None:
        with self.lock:
            if (qid, offset) in self.at:
                self.problems.append(f"queue {qid} offset {offset} acknowledged twice")
            self.at[(qid, offset)] = body


def producer_loop(endpoint: str, name: str, queue_id: int, acked: Acked, stop: threading.Event,
                  topic: str = "Crash") -> None:
    """Send single messages and batches until the broker dies; record where each SEND_OK message was stored."""
    with Producer(endpoint, timeout_s=5) as p:
        try:
            _send_until_stopped(p, name, queue_id, acked, stop, topic)
        finally:
            with acked.lock:
                acked.streamed += p.conn.send_stream.answers


def _send_until_stopped(p: Producer, name: str, queue_id: int, acked: Acked, stop: threading.Event,
                        topic: str) -> None:
    i = 0
    while not stop.is_set():
        n = 1 if i % 3 == 0 else 5
        batch = [Message(topic, f"{name}-{i + k}".encode()) for k in range(n)]
        try:
            results = p.send_batch(batch, queue_id=queue_id) if n > 1 else [p.send(batch[0], queue_id=queue_id)]
        except BrokerError:
            with acked.lock:
                acked.interrupted += 1
            return
        for m, r in zip(batch, results, strict=True):
            if r.status is SendStatus.SEND_OK:
                acked.add(r.queue_id, r.queue_offset, m.body)
        i += n


def kill_while_running(broker: BrokerProcess, workers: list[threading.Thread], stop: threading.Event,
                       after_s: float) -> float:
    """Start the writers, SIGKILL the broker ``after_s`` later, then stop and collect the writers. Returns the
    monotonic time just before the kill."""
    for w in workers:
        w.start()
    time.sleep(after_s)  # the random kill moment itself: nothing to poll for
    killed_at = time.monotonic()
    broker.kill()
    stop.set()
    for w in workers:
        w.join(10)
        assert not w.is_alive(), f"{w.name} still running 10 s after the kill"
    return killed_at


def read_all(endpoint: str, topic: str = "Crash", queues: int = QUEUES) -> dict[int, list[bytes]]:
    """Every queue's bodies from offset 0, checking that queue offsets are dense."""
    out: dict[int, list[bytes]] = {}
    with PullConsumer(endpoint, "verify") as c:
        for qid in range(queues):
            offset, bodies = 0, []
            while True:
                r = c.pull(topic, qid, offset, max_msgs=1000)
                if r.status is not PullStatus.FOUND:
                    assert r.status is PullStatus.NO_NEW_MSG, r.status
                    break
                assert [m.queue_offset for m in r.messages] == list(range(offset, r.next_begin_offset))
                bodies += [m.body for m in r.messages]
                offset = r.next_begin_offset
            out[qid] = bodies
    return out


@pytest.mark.slow
@pytest.mark.parametrize("flush", ["sync", "async"])
def test_sigkill_broker_loses_no_acknowledged_message(tmp_path: Path, flush: str) -> None:
    """Single sends and batches from three writers, SIGKILL at a random moment, CYCLES times on one store: every
    acknowledged message is at the queue offset it was acknowledged with, queue offsets are dense, each writer's
    messages keep their order, and check() of the store is clean at the end."""
    store = tmp_path / "crash"
    config = write_config(tmp_path / "broker.json")
    rng = crash_rng(f"send/{flush}")
    acked = Acked()
    for cycle in range(CYCLES):
        broker = BrokerProcess(store, flush=flush, config=config).start()
        try:
            with Producer(broker.endpoint) as p:
                r = p.send(Message("Crash", f"warmup{cycle}".encode()), queue_id=0)  # creates the topic's queues
                acked.add(r.queue_id, r.queue_offset, f"warmup{cycle}".encode())
            before, interrupted_before = len(acked.at), acked.interrupted
            stop = threading.Event()
            workers = [
                threading.Thread(
                    target=producer_loop, args=(broker.endpoint, f"c{cycle}w{w}", w % QUEUES, acked, stop), daemon=True
                )
                for w in range(3)
            ]
            kill_while_running(broker, workers, stop, rng.uniform(0.3, 1.2))
        finally:
            if broker.proc and broker.proc.poll() is None:
                broker.kill()
        assert len(acked.at) > before, f"cycle {cycle}: nothing was acknowledged before the kill"
        assert acked.interrupted > interrupted_before, f"cycle {cycle}: the kill interrupted no writer"
    assert not acked.problems, acked.problems
    assert acked.streamed > 0, "no single send went on a send stream"
    with BrokerProcess(store, flush=flush, config=config) as broker:
        stored = read_all(broker.endpoint)  # asserts dense offsets from 0
        wrong = {
            at: (body, stored[at[0]][at[1]] if at[1] < len(stored[at[0]]) else None)
            for at, body in acked.at.items()
            if at[1] >= len(stored[at[0]]) or stored[at[0]][at[1]] != body
        }
        assert not wrong, f"{len(wrong)} of {len(acked.at)} acknowledged messages lost or moved, e.g. " + str(
            sorted(wrong.items())[:5]
        )
        for bodies in stored.values():  # per writer, order within its queue is kept
            by_worker: dict[str, list[int]] = {}
            for b in bodies:
                if not b.startswith(b"warmup"):
                    w, n = b.decode().split("-")
                    by_worker.setdefault(w, []).append(int(n))
            assert all(seq == sorted(seq) for seq in by_worker.values())
        assert broker.stop() == 0
    assert store_problems(store) == []


def config_writer(endpoint: str, cycle: int, acked: dict[str, int], stop: threading.Event) -> None:
    """Create topics until the broker dies; record the ones it acknowledged, with their queue counts."""
    with Admin(endpoint, timeout_s=5) as admin:
        i = 0
        while not stop.is_set():
            name, queues = f"Cfg{cycle}x{i}", 1 + i % 4
            try:
                admin.create_topic(name, queues)
            except BrokerError:
                return
            acked[name] = queues
            i += 1


@dataclass
class Commits:
    """Offsets of group `g` the broker acknowledged, with the monotonic time of each acknowledgement."""

    acked: list[tuple[int, float]]
    attempted: int  # the highest offset sent, acknowledged or not (one may be in flight at the kill)


def offset_writer(endpoint: str, commits: Commits, stop: threading.Event) -> None:
    """Commit ever larger offsets of group `g` until the broker dies; record each acknowledged one."""
    with PullConsumer(endpoint, "g", timeout_s=5) as c:
        while not stop.is_set():
            offset = commits.acked[-1][0] + 1
            if offset > OFFSET_ROOM:
                return
            commits.attempted = offset
            try:
                c.commit_offsets({("Crash", q): offset for q in range(QUEUES)})
            except BrokerError:
                return
            commits.acked.append((offset, time.monotonic()))


@pytest.mark.slow
def test_sigkill_during_topic_and_offset_writes_keeps_the_config_files_whole(tmp_path: Path) -> None:
    """The broker's other write paths: topic creation (acknowledged once topics.json is replaced and synced) and
    consumer-offset commits (persisted every consumer_offset_persist_interval_ms, as RocketMQ's, so a crash can
    take an offset back to its last persist: a re-delivery, never a skip). After each SIGKILL the files load,
    every acknowledged topic is there with its queues, no offset is ahead of what was sent, and every offset
    acknowledged more than the persist interval (plus a 1 s margin) before the kill is there."""
    store = tmp_path / "cfg"
    interval_ms = 50
    config = write_config(tmp_path / "broker.json", consumer_offset_persist_interval_ms=interval_ms)
    margin_s = interval_ms / 1000 + 1.0
    rng = crash_rng("topics+offsets")
    topics: dict[str, int] = {}
    low, high = 0, 0  # after the last kill: the committed offset must be in low..high
    for cycle in range(CYCLES + 1):
        broker = BrokerProcess(store, flush="sync", config=config).start()
        try:
            with Admin(broker.endpoint) as admin:
                if cycle == 0:  # room for the offsets: a commit may not pass a queue's max offset
                    admin.create_topic("Crash", QUEUES)
                    with Producer(broker.endpoint) as p:
                        for q in range(QUEUES):
                            for _ in range(OFFSET_ROOM // 1000):
                                p.send_batch([Message("Crash", b"o")] * 1000, queue_id=q)
                listed = {t.topic: t.read_queue_nums for t in admin.list_topics()}
                lost = {name: q for name, q in topics.items() if listed.get(name) != q}
                assert not lost, f"cycle {cycle}: {len(lost)} of {len(topics)} acknowledged topics lost: {lost}"
                committed = admin.committed_offsets("g", "Crash")
                if cycle:
                    assert set(committed) == set(range(QUEUES)), committed
                    assert all(low <= off <= high for off in committed.values()), (
                        f"cycle {cycle}: committed {committed}, acknowledged >= {low} more than {margin_s} s before "
                        f"the kill, none sent above {high}"
                    )
            if cycle == CYCLES:
                assert broker.stop() == 0
                break
            start = max(committed.values(), default=0)
            stop, commits = threading.Event(), Commits([(start, 0.0)], start)
            before = len(topics)
            workers = [
                threading.Thread(target=config_writer, args=(broker.endpoint, cycle, topics, stop), daemon=True),
                threading.Thread(target=offset_writer, args=(broker.endpoint, commits, stop), daemon=True),
            ]
            # late enough that some commits are older than the persist interval plus the margin when it lands
            killed_at = kill_while_running(broker, workers, stop, rng.uniform(margin_s + 0.5, margin_s + 1.5))
        finally:
            if broker.proc and broker.proc.poll() is None:
                broker.kill()
        assert len(topics) > before, f"cycle {cycle}: no topic creation was acknowledged before the kill"
        old = [off for off, at in commits.acked[1:] if at <= killed_at - margin_s]
        recent = [off for off, at in commits.acked[1:] if at > killed_at - margin_s]
        assert old and recent, f"cycle {cycle}: no commit acknowledged both long before and shortly before the kill"
        low, high = old[-1], commits.attempted
    assert store_problems(store) == []


@dataclass
class Deletions:
    deleted: list[str] = field(default_factory=list)  # deletions the broker acknowledged
    sent: dict[str, set[bytes]] = field(default_factory=dict)  # every body sent to a Del topic, acknowledged or not
    interrupted: bool = False


def delete_loop(endpoint: str, cycle: int, out: Deletions, stop: threading.Event) -> None:
    """Create a topic, send to it, delete it; again and again until the broker dies."""
    with Admin(endpoint, timeout_s=5) as admin, Producer(endpoint, timeout_s=5) as p:
        i = 0
        while not stop.is_set():
            name = f"Del{cycle}x{i}"
            out.sent[name] = {f"{name}-{k}".encode() for k in range(4)}
            try:
                admin.create_topic(name, 2)
                p.send_batch([Message(name, f"{name}-{k}".encode()) for k in range(3)], queue_id=0)
                p.send(Message(name, f"{name}-3".encode()), queue_id=1)
                admin.delete_topic(name)
            except BrokerError:
                out.interrupted = True
                return
            out.deleted.append(name)
            i += 1


@pytest.mark.slow
def test_sigkill_during_topic_deletion_keeps_acknowledged_deletions(tmp_path: Path) -> None:
    """Topics created, written and deleted while another topic is written, SIGKILL at a random moment: after the
    restart no topic whose deletion was acknowledged is listed, and the other topic lost no acknowledged message.
    A deleted topic created again after the restart starts at offset 0 with none of its deleted generation's
    messages (RocketMQ's re-dispatch brings them back; Sluice keeps the deletion point on disk)."""
    store = tmp_path / "del"
    config = write_config(tmp_path / "broker.json")
    rng = crash_rng("delete")
    keep = Acked()
    deleted: list[str] = []
    undeleted: list[str] = []  # acknowledged deletions listed again after a restart
    failures: list[str] = []
    for cycle in range(CYCLES):
        broker = BrokerProcess(store, flush="sync", config=config).start()
        try:
            with Admin(broker.endpoint) as admin:
                admin.create_topic("Keep", QUEUES, if_not_exists=True)
            stop, out = threading.Event(), Deletions()
            before = len(keep.at)
            workers = [
                threading.Thread(target=delete_loop, args=(broker.endpoint, cycle, out, stop), daemon=True),
                threading.Thread(
                    target=producer_loop,
                    args=(broker.endpoint, f"k{cycle}", cycle % QUEUES, keep, stop, "Keep"),
                    daemon=True,
                ),
            ]
            kill_while_running(broker, workers, stop, rng.uniform(0.5, 1.5))
        finally:
            if broker.proc and broker.proc.poll() is None:
                broker.kill()
        assert out.deleted and out.interrupted, f"cycle {cycle}: the kill did not land among acknowledged deletions"
        assert len(keep.at) > before, f"cycle {cycle}: no send to Keep acknowledged before the kill"
        deleted += out.deleted
        with BrokerProcess(store, flush="sync", config=config) as broker, Admin(broker.endpoint) as admin:
            listed = {t.topic for t in admin.list_topics()}
            undeleted += [name for name in out.deleted if name in listed]
            stored = read_all(broker.endpoint, "Keep")
            lost = sorted(at for at, body in keep.at.items() if stored[at[0]][at[1] : at[1] + 1] != [body])
            if lost:  # reported with the deletions at the end, so that one run shows both
                failures.append(f"cycle {cycle}: {len(lost)} acknowledged messages of Keep lost, e.g. {lost[:5]}")
            for name in rng.sample(out.deleted, min(3, len(out.deleted))):  # created again: new messages only
                admin.create_topic(name, 2, if_not_exists=True)
                with Producer(broker.endpoint) as p:
                    new = {q: p.send(Message(name, f"{name}-new{q}".encode()), queue_id=q) for q in range(2)}
                got = read_all(broker.endpoint, name, 2)
                for q, r in new.items():  # the new generation alone, from offset 0
                    assert (r.queue_offset, got[q]) == (0, [f"{name}-new{q}".encode()]), (name, q, got[q][:5])
            assert broker.stop() == 0
    if keep.problems:
        failures.append(f"{len(keep.problems)} queue offsets of Keep acknowledged twice, e.g. {keep.problems[:3]}")
    if undeleted:
        failures.append(f"{len(undeleted)} of {len(deleted)} acknowledged topic deletions undone by a SIGKILL restart"
                        f" (listed again): {undeleted}")
    problems = store_problems(store)
    assert not failures and not problems, "\n".join(failures + problems[:10])


GROUPS = 6  # groups each writer updates in turn: most are updated several times before the kill


def group_settings(i: int) -> dict[str, object]:
    """The i-th update's values: every field changes from one update of a group to its next."""
    return {"consume_enable": i % 2 == 0, "consume_from_min_enable": i % 3 != 0, "consume_broadcast_enable": i % 2 == 1,
            "retry_queue_nums": 1 + i % 7, "retry_max_times": i % 23}


@dataclass
class GroupUpdates:
    acked: dict[str, dict[str, object]] = field(default_factory=dict)  # group -> values of its last acknowledged
    in_flight: dict[str, dict[str, object]] = field(default_factory=dict)  # group -> values sent, not acknowledged
    count: int = 0
    interrupted: bool = False


def group_writer(endpoint: str, prefix: str, out: GroupUpdates, stop: threading.Event) -> None:
    with Admin(endpoint, timeout_s=5) as admin:
        i = 0
        while not stop.is_set():
            group, values = f"{prefix}{i % GROUPS}", group_settings(i)
            out.in_flight[group] = values
            try:
                got = admin.update_subscription_group(group, **values)  # type: ignore[arg-type]
            except BrokerError:
                out.interrupted = True
                return
            assert {k: getattr(got, k) for k in values} == values, (group, got, values)
            out.acked[group] = values
            del out.in_flight[group]
            out.count += 1
            i += 1


@pytest.mark.slow
def test_sigkill_during_subscription_group_updates_keeps_acknowledged_values(tmp_path: Path) -> None:
    """Two writers update subscription groups (every field, each group several times) until SIGKILL: after the
    restart every group holds the values of its last acknowledged update (or those of the one in flight at the
    kill), across CYCLES kills on one store."""
    store = tmp_path / "groups"
    config = write_config(tmp_path / "broker.json")
    rng = crash_rng("groups")
    expected: dict[str, list[dict[str, object]]] = {}  # group -> values it may hold after the last restart
    for cycle in range(CYCLES + 1):
        broker = BrokerProcess(store, flush="sync", config=config).start()
        try:
            with Admin(broker.endpoint) as admin:
                for group, allowed in expected.items():
                    got = admin.subscription_group(group)
                    values = {k: getattr(got, k) for k in allowed[0]}
                    assert values in allowed, f"cycle {cycle}: group {group} holds {values}, acknowledged {allowed[0]}"
                    expected[group] = [values]  # whichever it holds now is what the next cycles must keep
            if cycle == CYCLES:
                assert broker.stop() == 0
                break
            stop = threading.Event()
            outs = [GroupUpdates(), GroupUpdates()]
            workers = [
                threading.Thread(target=group_writer, args=(broker.endpoint, f"G{w}x", outs[w], stop), daemon=True)
                for w in range(2)
            ]
            kill_while_running(broker, workers, stop, rng.uniform(0.3, 1.2))
        finally:
            if broker.proc and broker.proc.poll() is None:
                broker.kill()
        assert all(o.count > GROUPS for o in outs), f"cycle {cycle}: too few updates acknowledged before the kill"
        assert any(o.interrupted for o in outs), f"cycle {cycle}: the kill interrupted no update"
        for o in outs:
            for group, values in o.acked.items():
                expected[group] = [values] + ([o.in_flight[group]] if group in o.in_flight else [])
    assert store_problems(store) == []
