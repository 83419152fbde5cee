"""More of the same kinds: what a flood of made-up names can grow is bounded (subscription groups, consumers, ids
per call), numbers read from names are ASCII digits, and a store that cannot write is no broker bug (not
INTERNAL)."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from broker.errors import InvalidArgumentError, ResponseCode, ServiceNotAvailableError
from broker.proto import sluice_pb2 as pb
from broker.server.send_processor import raise_for_put
from broker.store import MessageStore, PutResult, PutStatus, StoreConfig
from tests.unit.conftest import BrokerFactory
from tests.unit.server.hardening_rpc import Answer, answer, clear_refusal, stub


def test_subscription_groups_are_bounded(broker_factory: BrokerFactory) -> None:
    """Every pull or heartbeat naming a new group created it for good, rewriting subscriptionGroup.json each time."""
    broker = broker_factory(max_subscription_groups=4)
    with stub(f"127.0.0.1:{broker.port}") as s:
        assert answer(s.CreateTopic, pb.CreateTopicRequest(topic="T", queue_nums=1)).ok
        for i in range(4):
            assert answer(s.GetSubscriptionGroup, pb.GetSubscriptionGroupRequest(consumer_group=f"g{i}")).ok
        for request, method in (
            (pb.GetSubscriptionGroupRequest(consumer_group="g4"), s.GetSubscriptionGroup),
            (pb.PullRequest(consumer_group="g5", topic="T"), s.PullMessage),
            (pb.UpdateSubscriptionGroupRequest(consumer_group="g6", retry_max_times=3), s.UpdateSubscriptionGroup),
            (pb.HeartbeatRequest(consumer_group="g7", client_id="c"), s.Heartbeat),
        ):
            a = answer(method, request)
            assert a.refused_with(grpc.StatusCode.RESOURCE_EXHAUSTED, ResponseCode.LIMIT_EXCEEDED), a
            assert "max_subscription_groups=4" in a.details
        update = pb.UpdateSubscriptionGroupRequest(consumer_group="g1", retry_max_times=3)
        assert answer(s.UpdateSubscriptionGroup, update).ok  # known groups as before
    assert broker.groups is not None and len(broker.groups.groups()) == 4


def test_consumers_are_bounded(broker_factory: BrokerFactory) -> None:
    """Heartbeats under made-up client ids were each kept until they expired, however many."""
    broker = broker_factory(max_consumers=3)
    with stub(f"127.0.0.1:{broker.port}") as s:
        for i in range(3):
            assert answer(s.Heartbeat, pb.HeartbeatRequest(consumer_group=f"cg{i % 2}", client_id=f"c{i}")).ok
        a = answer(s.Heartbeat, pb.HeartbeatRequest(consumer_group="cg0", client_id="c3"))
        assert a.refused_with(grpc.StatusCode.RESOURCE_EXHAUSTED, ResponseCode.LIMIT_EXCEEDED), a
        assert answer(s.Heartbeat, pb.HeartbeatRequest(consumer_group="cg0", client_id="c0")).ok  # a known one
        bye = pb.HeartbeatRequest(consumer_group="cg1", client_id="c1", unregister=True)
        assert answer(s.Heartbeat, bye).ok
        assert answer(s.Heartbeat, pb.HeartbeatRequest(consumer_group="cg0", client_id="c3")).ok


def test_calls_naming_many_things_are_bounded(endpoint: str) -> None:
    with stub(endpoint) as s:
        many = pb.EndTransactionsRequest(transaction_ids=[f"t{i}" for i in range(10_001)], commit=False)
        a = answer(s.EndTransactions, many)
        assert a.refused_with(grpc.StatusCode.INVALID_ARGUMENT, ResponseCode.INVALID_ARGUMENT), a
        offsets = [pb.QueueOffset(topic="T", queue_id=i, offset=0) for i in range(65_537)]
        a = answer(s.UpdateConsumerOffsets, pb.UpdateConsumerOffsetsRequest(consumer_group="g", offsets=offsets))
        assert a.refused_with(grpc.StatusCode.INVALID_ARGUMENT, ResponseCode.INVALID_ARGUMENT), a
        key = pb.QueryMessageByKeyRequest(topic="T", key="k" * 40_000)
        assert clear_refusal(answer(s.QueryMessageByKey, key))


@pytest.mark.parametrize("hours", ["\u00b2", "\u0663", "\uff14", "4 ;", "+4", "1" * 5000])
def test_delete_hours_are_ascii_numbers(tmp_path: Path, hours: str) -> None:
    """delete_when="\\u00b2" passed str.isdigit and made int() raise a ValueError at start-up; "\\u0663" was hour 3."""
    with pytest.raises(InvalidArgumentError, match="delete_when"):
        StoreConfig(store_path=str(tmp_path), delete_when=hours).validate()


def test_names_in_the_store_directory_are_ascii_numbers(tmp_path: Path) -> None:
    """A queue directory or a file whose name is digits of another script ("\\u0663", "\\u00b2") was read as a
    queue or a file offset (int() reads the first, raises on the second): start-up failed or loaded the wrong
    queue. Such names are not the store's and are passed over."""
    config = StoreConfig(store_path=str(tmp_path / "store"), mapped_file_size_commit_log=1 << 20,
                         max_message_size=65536, mapped_file_size_consume_queue=200)
    store = MessageStore(config)
    store.start()
    assert store.put_message("T", 1, b"kept").ok and store.wait_dispatched()
    store.shutdown()
    root = Path(config.consume_queue_dir) / "T"
    for name in ("\u0663", "\u00b2", "01", "9" * 12):
        os.makedirs(root / name)
        (root / name / f"{0:020d}").write_bytes(bytes(200))
    (Path(config.commit_log_dir) / ("\u0663" * 20)).write_bytes(b"")
    (Path(config.index_dir) / "\u00b2").write_bytes(b"")
    store = MessageStore(config)
    store.start()
    try:
        assert store.queue_ids("T") == [1]
        assert [m.body for m in store.get_message("g", "T", 1, 0).messages()] == [b"kept"]
        assert store.check() == []
    finally:
        store.shutdown()


@pytest.mark.parametrize("status", [PutStatus.CREATE_MAPPED_FILE_FAILED, PutStatus.UNKNOWN_ERROR])
def test_a_store_that_cannot_write_is_service_not_available(status: PutStatus) -> None:
    """A file the store could not create or an I/O error answered INTERNAL, which must mean a broker bug."""
    with pytest.raises(ServiceNotAvailableError):
        raise_for_put(PutResult(status, error="injected"), "SendBatch")


def test_committed_offsets_are_bounded(broker_factory: BrokerFactory) -> None:
    """Commits under made-up group names each added offsets to a table written whole every few seconds."""
    broker = broker_factory()
    broker.offsets.max_offsets = 3  # the bound (MAX_OFFSETS) made small
    endpoint = f"127.0.0.1:{broker.port}"
    with stub(endpoint) as s:
        assert answer(s.CreateTopic, pb.CreateTopicRequest(topic="T", queue_nums=4)).ok

        def commit(group: str, *queues: int) -> Answer:
            offsets = [pb.QueueOffset(topic="T", queue_id=q, offset=0) for q in queues]
            request = pb.UpdateConsumerOffsetsRequest(consumer_group=group, offsets=offsets)
            return answer(s.UpdateConsumerOffsets, request)

        assert commit("g1", 0, 1).ok and commit("g2", 0).ok
        a = commit("g3", 0)
        assert a.refused_with(grpc.StatusCode.RESOURCE_EXHAUSTED, ResponseCode.LIMIT_EXCEEDED), a
        pull = answer(s.PullMessage, pb.PullRequest(consumer_group="g3", topic="T", queue_id=1, commit_offset=0))
        assert pull.refused_with(grpc.StatusCode.RESOURCE_EXHAUSTED, ResponseCode.LIMIT_EXCEEDED), pull
        assert commit("g1", 0, 1).ok  # offsets already held are updated as ever
        assert answer(s.DeleteTopic, pb.DeleteTopicRequest(topic="T")).ok
        assert answer(s.CreateTopic, pb.CreateTopicRequest(topic="T", queue_nums=4)).ok
        assert commit("g3", 0, 1, 2).ok


def test_an_io_error_is_unavailable_not_internal(
    broker_factory: BrokerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeleteTopic answered INTERNAL when the store could not write its deletion point (a full disk)."""
    broker = broker_factory()
    assert broker.store is not None

    def disk_full() -> None:
        raise OSError(28, "No space left on device")

    with stub(f"127.0.0.1:{broker.port}") as s:
        assert answer(s.CreateTopic, pb.CreateTopicRequest(topic="T", queue_nums=1)).ok
        monkeypatch.setattr(broker.store.topic_deletions, "save", disk_full)
        a = answer(s.DeleteTopic, pb.DeleteTopicRequest(topic="T"))
        assert a.refused_with(grpc.StatusCode.UNAVAILABLE, ResponseCode.SERVICE_NOT_AVAILABLE), a
        assert "No space left" in a.details
