"""Component tests of classic replication on in-process brokers: byte-identical logs, catch-up, resynchronisation,
the SYNC_MASTER acknowledgement rules and the confirmed-offset rule on reads."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from broker.client import Admin, Message, Producer, PullConsumer
from broker.errors import BrokerError, NotEnoughReplicasError, SendOutcomeUnknownError
from broker.format.message import Prop
from broker.proto import sluice_pb2 as pb
from broker.semantics import timer_progress
from broker.server.broker_controller import BrokerController
from tests.support.replicas import broker, brokers, caught_up, commit_log_bytes, in_sync_pair, slave_of
from tests.support.waiting import wait_until


def _same_logs(master: BrokerController, *slaves: BrokerController) -> None:
    for s in slaves:
        wait_until(lambda s=s: caught_up(master, s), "the slave to catch up")
        assert commit_log_bytes(s) == commit_log_bytes(master)
        assert s.store is not None and master.store is not None
        assert s.store.min_phys_offset() == master.store.min_phys_offset()
        assert s.store.wait_dispatched()
        for topic in master.store.topics():
            live = [r for r in master.store.queue_ranges(topic, master.store.queue_ids(topic)) if r[1] < r[2]]
            # readers of the slave see up to the confirmed offset, which reaches it one answer after the bytes
            wait_until(lambda s=s, t=topic, live=live: s.store.queue_ranges(t, [q for q, _, _ in live]) == live,  # type: ignore[misc, union-attr]
                       f"the slave's queues of {topic} to be readable as the master's")
    for b in (master, *slaves):
        assert b.store is not None
        assert b.store.check() == []


def test_every_kind_of_entry_is_replicated_byte_for_byte(tmp_path: Path) -> None:
    with brokers() as bs:
        m, s = in_sync_pair(bs, tmp_path, master={"message_delay_level": "1s 2s"})
        with Producer(endpoint=m.address) as p, Admin(m.address) as admin:
            p.send(Message("Single", b"one", tags="A", keys="k1"), queue_id=0)  # a single message
            p.send_batch([Message("Batch", f"b{i}".encode(), keys=f"bk{i}") for i in range(300)])  # a batch
            p.send(Message("Delayed", b"later", properties={"DELAY": "1"}), queue_id=0)  # via the schedule topic
            tx = "tx-replicated"
            p.send_encoded(b"".join(_entries("Tx", 5)), 5, transaction_id=tx)  # transactional halves
            assert admin.end_transaction(tx, commit=True) == "COMMITTED"  # the op message and the commits
            p.send_encoded(b"".join(_entries("Tx", 2)), 2, transaction_id="tx-rolled-back")
            assert admin.end_transaction("tx-rolled-back", commit=False) == "ROLLED_BACK"
            with PullConsumer(endpoint=m.address, group="G") as c:
                msg = c.pull("Single", 0, 0).messages[0]
                c.send_back(msg, delay_level=1)  # a retry: %RETRY%G by way of the schedule topic
            assert m.store is not None
            wait_until(lambda: m.store.max_offset("Delayed", 0) == 1,  # type: ignore[union-attr]
                       "the delayed message to be delivered")
            wait_until(lambda: m.store.max_offset("%RETRY%G", 0) == 1,  # type: ignore[union-attr]
                       "the retry to be delivered")
        _same_logs(m, s)
        assert s.store is not None
        assert {"Single", "Batch", "Delayed", "Tx", "%RETRY%G", "SCHEDULE_TOPIC_XXXX"} <= set(s.store.topics())


def _shown(b: BrokerController, topic: str, queue_id: int) -> list[bytes]:
    """The bodies a reader of ``b``'s store gets from a queue, from its start."""
    assert b.store is not None
    out: list[bytes] = []
    offset = 0
    while True:
        res = b.store.get_message("check", topic, queue_id, offset, 256)
        if res.status.name not in ("FOUND", "NO_MATCHED_MESSAGE"):
            return out
        out += [m.body for m in res.messages()]
        offset = res.next_begin_offset


def test_a_slave_shows_what_its_master_shows_of_transactions_written_in_place(tmp_path: Path) -> None:
    """The readable limit and the rolled-back ranges follow the log: a slave, reading the bytes its master wrote,
    holds back the same open transaction and skips the same rolled-back rows."""
    from broker.client.outgoing_message import encode_message

    with brokers() as bs:
        m, s = in_sync_pair(bs, tmp_path)
        with Producer(endpoint=m.address) as p, Admin(m.address) as admin:
            for qid, txn in ((0, "ip-open"), (1, "ip-commit"), (2, "ip-rollback")):
                rows = b"".join(encode_message(Message("Ip", f"{txn}-{i}".encode()), qid) for i in range(3))
                p.send_encoded(rows, 3, transaction_id=txn, attempt="a")
                p.send_batch([Message("Ip", f"plain-{qid}".encode())], queue_id=qid)
            assert admin.end_transaction("ip-commit", commit=True) == "COMMITTED"
            assert admin.end_transaction("ip-rollback", commit=False) == "ROLLED_BACK"
            _same_logs(m, s)
            for b in (m, s):
                assert [_shown(b, "Ip", q) for q in range(3)] == [
                    [], [b"ip-commit-0", b"ip-commit-1", b"ip-commit-2", b"plain-1"], [b"plain-2"]
                ]
            assert admin.end_transaction("ip-open", commit=True) == "COMMITTED"
            _same_logs(m, s)
            for b in (m, s):
                assert _shown(b, "Ip", 0) == [b"ip-open-0", b"ip-open-1", b"ip-open-2", b"plain-0"]


def _entries(topic: str, n: int) -> list[bytes]:
    from broker.client.outgoing_message import encode_message

    return [encode_message(Message(topic, f"{topic}-{i}".encode()), 0, int(time.time() * 1000)) for i in range(n)]


def test_a_slave_catches_up_from_far_behind_after_a_restart(tmp_path: Path) -> None:
    with brokers() as bs:
        m = broker(tmp_path / "m", role="ASYNC_MASTER")
        bs.append(m)
        s = slave_of(m, tmp_path / "s")
        with Producer(endpoint=m.address) as p:
            p.send_batch([Message("T", b"x" * 200) for _ in range(500)])
            wait_until(lambda: caught_up(m, s), "the first catch-up")
            s.shutdown()
            for _ in range(40):  # several 1 MiB files the slave has none of
                p.send_batch([Message("T", b"y" * 900) for _ in range(100)])
        assert m.store is not None and m.store.max_phys_offset() > 3 << 20
        s = slave_of(m, tmp_path / "s")
        bs.append(s)
        _same_logs(m, s)


def test_a_slave_older_than_the_masters_first_file_starts_again_from_it(tmp_path: Path) -> None:
    """RocketMQ issue 3388: such a slave stayed behind for ever. Here the master tells it, and it resynchronises."""
    with brokers() as bs:
        m = broker(tmp_path / "m", role="ASYNC_MASTER", store={"file_reserved_time_hours": 0})
        bs.append(m)
        s = slave_of(m, tmp_path / "s")
        with Producer(endpoint=m.address) as p:
            p.send_batch([Message("T", b"x" * 500) for _ in range(100)])
            wait_until(lambda: caught_up(m, s), "the first catch-up")
            s.shutdown()
            for _ in range(40):
                p.send_batch([Message("T", b"y" * 900) for _ in range(100)])
        assert m.store is not None and m.store.cleanup is not None
        m.store.cleanup.clean_once(manual=True)  # every file but the last expires
        assert m.store.min_phys_offset() > 0
        s = slave_of(m, tmp_path / "s")
        bs.append(s)
        _same_logs(m, s)
        assert s.store is not None and s.store.min_phys_offset() == m.store.min_phys_offset()


def test_sync_master_acknowledges_once_its_in_sync_replicas_hold_the_message(tmp_path: Path) -> None:
    with brokers() as bs:
        m = broker(tmp_path / "m", role="SYNC_MASTER", min_insync_replicas=2)
        bs.append(m)
        assert m.store is not None and m.replication is not None
        with Producer(endpoint=m.address, timeout_s=3, attempt_timeout_s=1) as p:
            before = m.store.max_phys_offset()
            with pytest.raises(NotEnoughReplicasError):  # alone: refused, and nothing written
                p.send(Message("T", b"refused"))
            assert m.store.max_phys_offset() == before
            s = slave_of(m, tmp_path / "s")
            bs.append(s)
            assert s.store is not None
            wait_until(lambda: len(m.replication.in_sync.members) == 2, "the slave in sync")  # type: ignore[union-attr]
            for i in range(20):
                r = p.send(Message("T", f"m{i}".encode()))
                entry_end = int(r.msg_id[16:], 16) + 1
                assert s.store.max_phys_offset() >= entry_end  # acknowledged: the slave holds it already
            assert p.conn.send_stream.answers == 21  # the refusal and the sends: each an answer on one send stream
            s.replication.slave_fetcher.stop()  # type: ignore[union-attr]  # the slave stops confirming
            with pytest.raises(SendOutcomeUnknownError):  # stored on the master, never confirmed: unknown
                p.send(Message("T", b"unconfirmed"))
            wait_until(lambda: len(m.replication.in_sync.members) == 1,  # type: ignore[union-attr]
                       "the slave out of the in-sync set")
            before = m.store.max_phys_offset()
            with pytest.raises(NotEnoughReplicasError):
                p.send(Message("T", b"refused again"))
            assert m.store.max_phys_offset() == before


def test_reads_stop_at_the_confirmed_offset(tmp_path: Path) -> None:
    with brokers() as bs:
        m = broker(tmp_path / "m", role="SYNC_MASTER", ha_max_lag_ms=60_000)
        bs.append(m)
        s = slave_of(m, tmp_path / "s")
        assert m.store is not None and m.replication is not None
        wait_until(lambda: len(m.replication.in_sync.members) == 2, "the slave in sync")  # type: ignore[union-attr]
        with Producer(endpoint=m.address, timeout_s=2, attempt_timeout_s=1) as p, Admin(m.address) as admin:
            p.send(Message("T", b"confirmed", keys="seen"), queue_id=0)
            s.replication.slave_fetcher.stop()  # type: ignore[union-attr]
            with pytest.raises(SendOutcomeUnknownError):
                p.send(Message("T", b"unconfirmed", keys="hidden"), queue_id=0)
            assert m.store.max_offset("T", 0) == 1  # the queue holds 2 units, readers see 1
            assert admin.queue_offsets("T")[0] == (0, 1)
            assert admin.query_by_key("T", "hidden") == []
            with PullConsumer(endpoint=m.address, group="G") as c:
                r = c.pull("T", 0, 1)
                assert r.status.name in ("NO_NEW_MSG", "OFFSET_ILLEGAL") and not r.messages
            s.shutdown()
            s = slave_of(m, tmp_path / "s")  # back: it catches up and confirms
            bs.append(s)
            wait_until(lambda: m.store.max_offset("T", 0) == 2,  # type: ignore[union-attr]
                       "the unconfirmed message to become visible")
            with PullConsumer(endpoint=m.address, group="G") as c:
                assert [x.body for x in c.pull("T", 0, 0).messages] == [b"confirmed", b"unconfirmed"]
            with PullConsumer(endpoint=s.address, group="G") as c:  # the slave serves reads up to it too
                wait_until(lambda: len(c.pull("T", 0, 0).messages) == 2, "the slave to show both")


def test_a_slave_refuses_writes_and_keeps_no_offsets_of_its_own(tmp_path: Path) -> None:
    with brokers() as bs:
        m = broker(tmp_path / "m", role="ASYNC_MASTER")
        bs.append(m)
        s = slave_of(m, tmp_path / "s")
        bs.append(s)
        with Admin(m.address) as admin:
            admin.create_topic("T", 2)
        with Producer(endpoint=m.address) as p:
            p.send(Message("T", b"x"), queue_id=0)
        wait_until(lambda: s.topics.get("T") is not None and caught_up(m, s), "the topic on the slave")
        with Producer(endpoint=s.address, timeout_s=2) as p:
            with pytest.raises(BrokerError, match="not its group's master"):
                p.send(Message("T", b"x"))
            assert p.conn.send_stream.answers == 1  # refused on the send stream, message by message
        with Admin(s.address) as admin, pytest.raises(BrokerError, match="not its group's master"):
            admin.create_topic("NewTopic", 4)
        with PullConsumer(endpoint=s.address, group="G") as c:
            wait_until(lambda: len(c.pull("T", 0, 0).messages) == 1, "the message readable on the slave")
            c.pull("T", 0, 1, commit_offset=1)  # a pull's piggy-backed commit: dropped on a slave
            assert c.committed_offsets("T") == {}
            with pytest.raises(BrokerError, match="not its group's master"):
                c.commit_offsets({("T", 0): 1})
        assert pb.FLUSH_SLAVE_TIMEOUT == 2  # the status the producer reads as an unknown outcome


def test_offsets_topics_and_groups_reach_the_slave_before_they_are_acknowledged(tmp_path: Path) -> None:
    """An acknowledged offset commit survives a failover: the master answers once every in-sync replica holds the
    changed file, so a promoted slave serves the group from the same offsets (never backwards)."""
    with brokers() as bs:
        m, s = in_sync_pair(bs, tmp_path)
        with Admin(m.address) as admin:
            admin.create_topic("Offsets", 4)
            assert s.topics.get("Offsets") is not None  # acknowledged: on the slave already
            admin.update_subscription_group("GroupX", retry_max_times=3)
        assert s.groups is not None and s.groups.find("GroupX") is not None
        with Producer(endpoint=m.address) as p:
            p.send_batch([Message("Offsets", b"x") for _ in range(10)], queue_id=1)
        with PullConsumer(endpoint=m.address, group="GroupX") as c:
            c.commit_offsets({("Offsets", 1): 7})
        assert s.offsets.query("GroupX", "Offsets") == {1: 7}


def test_a_promoted_slave_delivers_timer_messages_once(tmp_path: Path) -> None:
    """Timer progress follows the master (timerProgress.json, metadata sync): a slave started as master on its copy
    of the log delivers the timer messages still pending, and none that the old master delivered a second time
    (without the copy it would read the timer queue from its start and deliver all of them again)."""
    with brokers() as bs:
        m, s = in_sync_pair(bs, tmp_path)
        now = int(time.time() * 1000)
        early = [f"early-{i}".encode() for i in range(20)]
        late = [f"late-{i}".encode() for i in range(5)]
        with Producer(endpoint=m.address) as p:
            for body in early:
                p.send(Message("Timed", body, properties={Prop.TIMER_DELIVER_MS: str(now + 200)}), queue_id=0)
            for body in late:
                p.send(Message("Timed", body, properties={Prop.TIMER_DELIVER_MS: str(now + 8000)}), queue_id=0)
        assert m.store is not None and s.store is not None
        wait_until(lambda: m.store.max_offset("Timed", 0) == len(early),  # type: ignore[union-attr]
                   "the early ones delivered")
        copy = timer_progress.path_in(str(s.store.config.config_dir))
        wait_until(lambda: (timer_progress.load(copy) or (0, set()))[0] >= len(early), "the slave's copy of it")
        assert m.store.max_offset("Timed", 0) == len(early), "the late ones came due before the failover"
        for b in (m, s):  # the master is gone; the slave's store is started as the new master
            b.shutdown()
        bs.clear()
        promoted = broker(tmp_path / "s", role="ASYNC_MASTER")
        bs.append(promoted)
        assert promoted.store is not None
        wait_until(lambda: promoted.store.max_offset("Timed", 0) >= len(early) + len(late),  # type: ignore[union-attr]
                   "the late ones delivered by the new master", timeout_s=20)
        time.sleep(0.5)  # anything delivered a second time would be there by now
        with PullConsumer(endpoint=promoted.address, group="Reader") as c:
            bodies = [msg.body for msg in c.pull("Timed", 0, 0, max_msgs=100).messages]
        assert sorted(bodies) == sorted(early + late)


def test_a_lone_master_shows_what_it_writes_itself(tmp_path: Path) -> None:
    """With no replica to wait for, the confirmed offset is the log's end, also after writes no request made: a
    timer message delivered by the broker itself became visible only at the next client send."""
    with brokers() as bs:
        m = broker(tmp_path / "m", role="ASYNC_MASTER")
        bs.append(m)
        with Producer(endpoint=m.address) as p:
            due = int(time.time() * 1000) + 300
            p.send(Message("Later", b"timed", properties={Prop.TIMER_DELIVER_MS: str(due)}), queue_id=0)
        assert m.store is not None
        wait_until(lambda: m.store.max_offset("Later", 0) == 1,  # type: ignore[union-attr]
                   "the timer message visible, no send after it", timeout_s=10)
