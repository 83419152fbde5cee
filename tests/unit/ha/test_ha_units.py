"""Unit tests of replication's pure parts: divergence points, the epoch file, checks of replicated bytes, the
challenge, the settings rules, and the store's crash-safe truncation."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.errors import CorruptionError, InvalidArgumentError
from broker.format.message import encode_entry
from broker.ha import auth, chunk, divergence
from broker.ha.epoch_file import EpochEntry, EpochFile
from broker.ha.in_sync import InSyncSet
from broker.ha.metadata_sync import LOG_END_KEY, MetadataSink, MetadataSource
from broker.ha.slave_fetcher import SLAVE_FETCHER_THREAD_NAME, SlaveFetcher
from broker.namesrv.route_table import Registration, RegistrationRefused, RouteTable
from broker.private_file import write_private
from broker.store import MessageStore
from broker.store.store_config import StoreConfig
from broker.store.truncation import Truncation, intent_path, request

E = EpochEntry


@pytest.mark.parametrize(
    ("master", "master_end", "slave", "slave_end", "expected"),
    [
        ([E(1, 0)], 500, [E(1, 0)], 300, divergence.Plan(300, -1, False)),  # behind: continue
        ([E(1, 0), E(2, 400)], 900, [E(1, 0)], 450, divergence.Plan(400, 400, False)),  # epoch 1 ended at 400
        ([E(1, 0), E(2, 400)], 900, [E(1, 0)], 400, divergence.Plan(400, -1, False)),  # ends where epoch 2 starts
        ([E(1, 0), E(2, 100), E(4, 300)], 900, [E(1, 0), E(2, 100), E(3, 250)], 280,
         divergence.Plan(250, 250, False)),  # epoch 3 never reached this master: cut where it began
        ([E(1, 0)], 200, [E(1, 0)], 350, divergence.Plan(200, 200, False)),  # ahead within an epoch (a lost tail)
        ([], 0, [], 0, divergence.Plan(0, -1, False)),
    ],
)
def test_divergence_point(
    master: list[EpochEntry], master_end: int, slave: list[EpochEntry], slave_end: int, expected: divergence.Plan
) -> None:
    assert divergence.plan(master, 0, master_end, slave, slave_end) == expected


def test_a_slave_older_than_the_masters_first_byte_starts_again() -> None:
    assert divergence.plan([E(1, 0)], 4096, 9000, [E(1, 0)], 1000) == divergence.Plan(4096, -1, True)
    assert divergence.plan([E(1, 0)], 4096, 9000, [], 0) == divergence.Plan(4096, -1, False)  # empty: no reset


def test_epoch_file(tmp_path: Path) -> None:
    f = EpochFile(str(tmp_path))
    f.append(1, 0)
    f.append(1, 50)  # the same epoch again: nothing new
    f.append(3, 100)
    assert f.entries == [E(1, 0), E(3, 100)]
    assert f.end_offset_for(2, 300) == (1, 100) and f.end_offset_for(3, 300) == (3, 300)
    assert f.epoch_at(99) == 1 and f.epoch_at(100) == 3 and f.next_start_after(0) == 100
    with pytest.raises(ValueError):
        f.append(2, 200)  # older than the last: a stale master's bytes
    assert EpochFile(str(tmp_path)).entries == f.entries  # on disk
    f.truncate_from(100)
    assert EpochFile(str(tmp_path)).entries == [E(1, 0)]


def _entries(n: int, at: int) -> bytes:
    out = bytearray()
    for i in range(n):
        e = bytearray(encode_entry(b"T", 0, f"m{i}".encode(), b"", store_ip=b"\x7f\0\0\x01", store_port=1))
        e[28:36] = (at + len(out)).to_bytes(8, "big")  # PHYSICALOFFSET: where the master stored it
        out += e
    return bytes(out)


def test_replicated_bytes_are_checked_before_they_are_written() -> None:
    data = _entries(5, 1000)
    assert chunk.check(data, 1000, 1 << 20, 4096) == chunk.Checked(len(data), 5, 0, False)
    assert chunk.check(data[:-10], 1000, 1 << 20, 4096).entries == 4  # a tail completed by the next chunk
    damaged = bytearray(data)
    damaged[len(data) - 3] ^= 0xFF  # the last body's byte: its CRC fails
    with pytest.raises(CorruptionError, match="commit-log offset"):
        chunk.check(bytes(damaged), 1000, 1 << 20, 4096)
    with pytest.raises(CorruptionError, match="belongs at 1000"):  # the bytes of another offset
        chunk.check(data, 2000, 1 << 20, 4096)


def test_proofs() -> None:
    secret, other = b"s" * 32, b"o" * 32
    proof = auth.slave_proof(secret, b"n1", b"n2", b"hello")
    assert auth.same(proof, auth.slave_proof(secret, b"n1", b"n2", b"hello"))
    assert not auth.same(proof, auth.slave_proof(other, b"n1", b"n2", b"hello"))
    assert not auth.same(proof, auth.slave_proof(secret, b"n1", b"n2", b"hellO"))  # the Hello is covered
    assert not auth.same(auth.master_proof(secret, b"n2", b"n1"), proof)


def test_a_replication_endpoint_off_loopback_needs_a_secret(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="ha_secret_file"):
        BrokerConfig.from_dict({"role": "SYNC_MASTER", "listen": "0.0.0.0:10911"})
    secret = tmp_path / "secret"
    write_private(secret, b"a" * 32)
    assert BrokerConfig.from_dict({"role": "SYNC_MASTER", "listen": "0.0.0.0:10911",
                                   "ha_secret_file": str(secret)}).replication() is not None
    write_private(secret, b"short")
    with pytest.raises(InvalidArgumentError, match="at least"):
        BrokerConfig.from_dict({"role": "SYNC_MASTER", "ha_secret_file": str(secret)})
    with pytest.raises(InvalidArgumentError, match="broker-id"):
        BrokerConfig.from_dict({"controller": "etcd://127.0.0.1:2379", "broker_id": 0})
    with pytest.raises(InvalidArgumentError, match="classic mode"):
        BrokerConfig.from_dict({"controller": "etcd://127.0.0.1:2379", "broker_id": 1, "role": "SLAVE"})


def test_controller_endpoints_are_read_with_etcds_default_port() -> None:
    settings = BrokerConfig.from_dict({"controller": "etcd://127.0.0.1:23790,[::1],etcd-2", "broker_id": 1,
                                       "listen": "127.0.0.1:10911"}).replication()
    assert settings is not None
    assert settings.controller == (("127.0.0.1", 23790), ("::1", 2379), ("etcd-2", 2379))
    with pytest.raises(InvalidArgumentError, match="other than 0"):
        BrokerConfig.from_dict({"controller": "etcd://127.0.0.1:0", "broker_id": 1, "listen": "127.0.0.1:10911"})


def test_in_sync_set_shrinks_only_once_recorded_and_acknowledges_when_every_member_holds() -> None:
    end = [1000]
    recorded: list[frozenset[int]] = []
    allow = [False]
    clock = [0]

    def record(members: frozenset[int]) -> bool:
        recorded.append(members)
        return allow[0]

    s = InSyncSet(0, lambda: end[0], min_insync=2, max_lag_ms=100, members=frozenset({1, 2}),
                  record_shrink=record, clock_ms=lambda: clock[0])
    one, two = s.connect(1, "a", "x"), s.connect(2, "b", "y")
    s.report(1, one, 1000, 0, 0)
    assert s.confirmed == 0  # replica 2 has not said
    s.report(2, two, 900, 0, 0)
    assert s.confirmed == 900 and not s.wait_confirmed(1000, 0.01)
    clock[0] = 500  # replica 2 has not caught up for longer than max_lag_ms
    s.report(1, one, 1000, 0, 0)
    s.review()
    assert s.members == {0, 1, 2}  # the shrink could not be recorded: acknowledgements still wait for it
    allow[0] = True
    s.review()
    assert s.members == {0, 1} and s.confirmed == 1000 and s.wait_confirmed(1000, 0.01)


def test_a_replica_a_few_fetches_behind_stays_in_sync_and_one_falling_behind_leaves() -> None:
    """SYNC writers keep several fetches of bytes unconfirmed: a replica always three reports behind the log end
    (never at the end of its previous report) keeps pace, and stays; one whose backlog grows leaves."""
    clock, end = [0], [0]
    s = InSyncSet(0, lambda: end[0], min_insync=2, max_lag_ms=100, members=frozenset({1, 2}),
                  clock_ms=lambda: clock[0])
    steady, slow = s.connect(1, "a", "x"), s.connect(2, "b", "y")
    for tick in range(1, 60):  # 590 ms, more than five times max_lag_ms
        clock[0], end[0] = tick * 10, tick * 4 << 20  # 4 MiB a fetch, one fetch every 10 ms
        s.report(1, steady, max(0, end[0] - (12 << 20)), 0, 0)  # 12 MiB behind: three fetches
        s.report(2, slow, tick * 3 << 20, 0, 0)  # 3 MiB a fetch: further behind each time
        s.review()
        if tick * 10 <= 100:
            assert s.members == {0, 1, 2}
    assert s.members == {0, 1}
    assert s.confirmed == end[0] - (12 << 20)


def test_truncation_is_finished_by_the_next_start_after_a_crash(tmp_path: Path) -> None:
    cfg = StoreConfig(str(tmp_path), mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=3000 * 20,
                      max_hash_slot_num=1024, max_index_num=4096, max_message_size=64 * 1024)
    store = MessageStore(cfg)
    store.start()
    offsets = [store.put_message("T", 0, f"m{i}".encode(), {"KEYS": f"k{i}"}).commitlog_offsets[0] for i in range(20)]
    cut = offsets[12]
    store.flush()
    store.abandon()  # a crash right after the intent was written, before any cut
    request(str(tmp_path), Truncation(cut, False))
    store = MessageStore(cfg)
    store.start()
    try:
        assert store.max_phys_offset() == cut and store.max_offset("T", 0) == 12
        assert store.query_by_key("T", "k12") == [] and len(store.query_by_key("T", "k11")) == 1
        assert not Path(intent_path(str(tmp_path))).exists()
        assert store.checkpoint is not None and store.checkpoint.data.physic_offset <= cut
        r = store.put_message("T", 0, b"next")
        assert r.commitlog_offsets == [cut] and r.queue_offsets == [12]
        assert store.check() == []
    finally:
        store.shutdown()


def _reg(store_id: str, address: str, epoch: int, broker_id: int = 0) -> Registration:
    return Registration("C", "g", broker_id, address, store_id, 1, {}, role="MASTER", epoch=epoch)


def test_a_new_masters_registration_replaces_a_stale_one_at_once() -> None:
    table = RouteTable()
    assert table.register(_reg("old", "h1:1", 1), 0)
    assert table.register(_reg("new", "h2:1", 2), 10)  # epoch 2: replaces the live master of epoch 1
    master = table.master_of("g", 10)
    assert master is not None and master.address == "h2:1" and master.epoch == 2
    with pytest.raises(RegistrationRefused, match="stale"):  # the old master, not yet aware, registers again
        table.register(_reg("old", "h1:1", 1), 20)
    with pytest.raises(RegistrationRefused):  # another broker of the same epoch: refused as before
        table.register(_reg("third", "h3:1", 2), 30)


def test_a_slave_applies_progress_files_only_once_its_log_holds_what_they_name(tmp_path: Path) -> None:
    """Delay progress (and the transaction checker's state, timer progress) carry the master's log end when saved;
    a slave whose log is shorter keeps the copy in memory, writes it once its log reaches that end, and a newer
    copy replaces one still waiting. Files without a log end are written at once."""
    log_end = 1000
    written: list[str] = []

    def replace(name: str, data: dict[str, object]) -> bool:
        written.append(name)
        return False  # no running manager owns the file: the sink writes it

    sink = MetadataSink(str(tmp_path), replace, lambda: log_end)

    def on_disk(name: str) -> object:
        path = tmp_path / name
        return json.loads(path.read_text()) if path.exists() else None

    ahead = {"offsetTable": {"1": 7}, LOG_END_KEY: 1500}
    sink.apply(3, {"delayOffset.json": json.dumps(ahead).encode(), "consumerOffset.json": b'{"offsetTable": {}}'})
    assert on_disk("delayOffset.json") is None and on_disk("consumerOffset.json") == {"offsetTable": {}}
    assert sink.version == 3  # nothing on the master waits for progress files
    sink.catch_up()
    assert on_disk("delayOffset.json") is None
    newer = {"offsetTable": {"1": 9}, LOG_END_KEY: 1800}
    sink.apply(4, {"delayOffset.json": json.dumps(newer).encode()})
    log_end = 1600  # past the first copy's end, short of the newer one's: the newer one still waits
    sink.catch_up()
    assert on_disk("delayOffset.json") is None
    log_end = 1800
    sink.catch_up()
    assert on_disk("delayOffset.json") == newer and not sink.waiting
    within = {"halfScanFrom": 2, "opScanFrom": 1, "checkTimes": {}, LOG_END_KEY: 900}
    sink.apply(5, {"transactionState.json": json.dumps(within).encode()})
    assert on_disk("transactionState.json") == within and written == [
        "consumerOffset.json", "delayOffset.json", "transactionState.json"]


def test_progress_files_name_the_log_end_they_were_saved_at(tmp_path: Path) -> None:
    """The delay service's and the transaction checker's files carry the commit log's end when they were saved."""
    from broker.semantics.delay import ScheduleMessageService
    from broker.semantics.transaction import TransactionService

    store = MessageStore(StoreConfig(store_path=str(tmp_path / "store")))
    store.start()
    try:
        store.put_message("T", 0, b"x" * 100)
        schedule = ScheduleMessageService(store, str(tmp_path / "config"))
        schedule.persist()
        tx = TransactionService(store, str(tmp_path / "config"))
        tx.persist()
        for name in ("delayOffset.json", "transactionState.json"):
            assert json.loads((tmp_path / "config" / name).read_text())[LOG_END_KEY] == store.max_phys_offset() > 0
    finally:
        store.shutdown()


class _NoMaster:
    """What a slave fetcher asks its manager before connecting: no master known yet, so its loop only waits."""

    def master_ha_address(self) -> str:
        return ""


def test_a_fetcher_stopped_while_it_starts_neither_fails_nor_keeps_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller's thread starts the slave fetcher when the broker becomes a replica while a shutdown (a restart
    in place after fencing) stops it: stop() used to join a thread made but not started yet and raise, which
    killed the restart and left the broker down. Here the fetcher's thread is held just before it starts while
    the main thread stops the fetcher."""
    starting, stopped = threading.Event(), threading.Event()
    real_start = threading.Thread.start

    def held_start(thread: threading.Thread) -> None:
        if thread.name == SLAVE_FETCHER_THREAD_NAME and not starting.is_set():
            starting.set()
            stopped.wait(0.5)  # a stop() that does not wait for start() returns meanwhile
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", held_start)
    fetcher = SlaveFetcher(_NoMaster())  # type: ignore[arg-type]
    errors: list[BaseException] = []

    def start() -> None:
        try:
            fetcher.start()
        except BaseException as e:  # noqa: BLE001 -- reported by the assertion below
            errors.append(e)

    starter = threading.Thread(target=start)
    starter.start()
    assert starting.wait(10)
    fetcher.stop()
    stopped.set()
    starter.join()
    assert errors == []
    assert not any(t.name == SLAVE_FETCHER_THREAD_NAME and t.is_alive() for t in threading.enumerate())
    fetcher.start()  # a stopped fetcher stays stopped
    assert not any(t.name == SLAVE_FETCHER_THREAD_NAME and t.is_alive() for t in threading.enumerate())


def test_a_joining_replica_is_electable_once_it_holds_the_config_acknowledged_before_it_joined() -> None:
    """Offset commits acknowledged before a replica joined did not wait for it: it is recorded in the in-sync set
    (electable) only once it applied the master's metadata version of its joining, though acknowledgements wait
    for it at once."""
    end, version = [1000], [7]
    recorded: list[frozenset[int]] = []

    def record(members: frozenset[int]) -> bool:
        recorded.append(members)
        return True

    s = InSyncSet(0, lambda: end[0], min_insync=1, max_lag_ms=100, record_shrink=record, record_expand=record,
                  metadata_version=lambda: version[0])
    one = s.connect(1, "a", "x")
    s.report(1, one, 1000, 0, 3)  # holds the log, not the config of version 7
    assert s.members == {0, 1} and recorded == []
    version[0] = 8
    assert not s.wait_metadata(8, 0.01)  # a commit after the join waits for it
    s.report(1, one, 1000, 0, 7)
    s.review()
    assert recorded == [frozenset({0, 1})]


def test_a_config_file_rewritten_within_one_tick_of_the_file_clock_gets_a_new_version(tmp_path: Path) -> None:
    """Two offset commits' files of one size written within one tick of the coarse file clock share size, time
    (and here inode): the second is still seen, its bytes compared, and the slaves sent it."""
    path = tmp_path / "consumerOffset.json"
    path.write_bytes(b'{"offsetTable": {"T@g": {"0": 94}}}')
    source = MetadataSource(str(tmp_path))
    first = source.refresh()
    st = os.stat(path)
    with open(path, "r+b") as f:  # same size, same inode
        f.write(b'{"offsetTable": {"T@g": {"0": 95}}}')
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same tick
    assert source.refresh() == first + 1
    assert source.changes_since(first)[1] == {"consumerOffset.json": path.read_bytes()}
    assert source.refresh() == first + 1  # unchanged: no new version
