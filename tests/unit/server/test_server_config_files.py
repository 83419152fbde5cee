"""Broker config loading, topic config and consumer offsets files: atomic writes, .bak fallback, validation."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from broker.config import BrokerConfig, parse_host_port
from broker.errors import InvalidArgumentError, MessageIllegalError, TopicExistsError, TopicNotExistError
from broker.format.message import encode_entry
from broker.json_file import read_json, write_json_atomic
from broker.server.consumer_offsets import ConsumerOffsetManager
from broker.server.metrics import BrokerMetrics
from broker.server.send_processor import SendProcessor
from broker.server.topic_config import TopicConfigManager
from broker.store import MessageStore, StoreConfig


def test_config_defaults_are_rocketmq_defaults() -> None:
    c = BrokerConfig()
    assert c.listen_address == ("0.0.0.0", 10911)
    assert c.flush_disk_type == "ASYNC_FLUSH"
    assert c.default_topic_queue_nums == 8
    assert c.store_dir == Path("~/store").expanduser()


def test_config_from_toml_and_json(tmp_path: Path) -> None:
    toml = tmp_path / "b.toml"
    toml.write_text(
        'listen = "127.0.0.1:0"\nflush_disk_type = "sync"\n[store]\nmapped_file_size_commit_log = 1048576\n'
        "max_message_size = 65536\n"  # the store table is validated at load: a message must fit a file
    )
    c = BrokerConfig.from_file(toml, store_path=str(tmp_path / "s"))
    assert c.flush_disk_type == "SYNC_FLUSH" and c.store["mapped_file_size_commit_log"] == 1 << 20
    assert c.store_path == str(tmp_path / "s")
    js = tmp_path / "b.json"
    js.write_text(json.dumps({"default_topic_queue_nums": 4}))
    assert BrokerConfig.from_file(js).default_topic_queue_nums == 4


@pytest.mark.parametrize(
    ("data", "needle"),
    [({"no_such_setting": 1}, "unknown setting"), ({"flush_disk_type": "fast"}, "flush type"),
     ({"default_topic_queue_nums": 0}, "default_topic_queue_nums"), ({"listen": "host:port"}, "non-numeric port")],
)
def test_config_rejects_bad_values_with_a_reason(data: dict[str, object], needle: str) -> None:
    with pytest.raises(InvalidArgumentError, match=needle):
        BrokerConfig.from_dict(data)


def test_bad_config_file_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(InvalidArgumentError, match=r"bad\.json"):
        BrokerConfig.from_file(bad)


def test_parse_host_port() -> None:
    assert parse_host_port("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_host_port(":99") == ("0.0.0.0", 99)
    with pytest.raises(InvalidArgumentError):
        parse_host_port("h:70000")


def test_atomic_json_keeps_previous_as_bak_and_falls_back(tmp_path: Path) -> None:
    path = tmp_path / "config" / "x.json"
    write_json_atomic(path, {"v": 1})
    write_json_atomic(path, {"v": 2})
    assert read_json(path) == {"v": 2}
    assert json.loads(path.with_name("x.json.bak").read_text()) == {"v": 1}
    path.write_text("{torn")  # a corrupted main file: the backup is read instead
    assert read_json(path) == {"v": 1}
    assert not path.with_name("x.json.tmp").exists()


def test_topic_config_create_validate_persist(tmp_path: Path) -> None:
    topics = TopicConfigManager(tmp_path)
    assert topics.create("Orders", 4).read_queue_nums == 4
    assert topics.get_or_create("Auto").write_queue_nums == 8
    with pytest.raises(TopicExistsError, match="already exists"):
        topics.create("Orders")
    assert topics.create("Orders", if_not_exists=True).read_queue_nums == 4
    with pytest.raises(MessageIllegalError, match="characters outside"):
        topics.create("bad topic!")
    with pytest.raises(InvalidArgumentError, match="queue count"):
        topics.create("Huge", 100_000)
    with pytest.raises(InvalidArgumentError, match=r"queues 0\.\.3"):
        topics.check_queue("Orders", 4)
    reloaded = TopicConfigManager(tmp_path)
    reloaded.load()
    assert [t.topic for t in reloaded.topics()] == ["Auto", "Orders"]
    raw = json.loads((tmp_path / "topics.json").read_text())
    assert raw["topicConfigTable"]["Orders"]["readQueueNums"] == 4
    reloaded.delete("Auto")
    with pytest.raises(TopicNotExistError):
        reloaded.delete("Auto")


def test_topic_auto_create_can_be_disabled(tmp_path: Path) -> None:
    topics = TopicConfigManager(tmp_path, auto_create=False)
    with pytest.raises(TopicNotExistError, match="sluice topic create"):
        topics.get_or_create("Nope")


def test_consumer_offsets_all_or_nothing_and_persisted(tmp_path: Path) -> None:
    offsets = ConsumerOffsetManager(tmp_path)
    offsets.commit("g1", {("T", 0): 5, ("T", 1): 7})

    def refuse_queue_3(topic: str, queue_id: int, offset: int) -> None:
        if queue_id == 3:
            raise InvalidArgumentError("queue 3 does not exist")

    with pytest.raises(InvalidArgumentError):
        offsets.commit("g1", {("T", 0): 6, ("T", 3): 1}, refuse_queue_3)
    with pytest.raises(InvalidArgumentError, match="negative"):
        offsets.commit("g1", {("T", 0): 9, ("T", 1): -1})
    assert offsets.query("g1", "T") == {0: 5, 1: 7}  # neither refused update changed anything
    with pytest.raises(InvalidArgumentError, match="group"):
        offsets.commit("bad group", {("T", 0): 1})
    offsets.persist()
    raw = json.loads((tmp_path / "consumerOffset.json").read_text())
    assert raw == {"offsetTable": {"T@g1": {"0": 5, "1": 7}}}
    again = ConsumerOffsetManager(tmp_path)
    again.load()
    assert again.query("g1", "T") == {0: 5, 1: 7}
    assert again.has_group("g1") and not again.has_group("g2")


def test_concurrent_topic_creation_persists_every_topic(tmp_path: Path) -> None:
    topics = TopicConfigManager(tmp_path)
    threads = [threading.Thread(target=topics.create, args=(f"T{i}",)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reloaded = TopicConfigManager(tmp_path)
    reloaded.load()
    assert sorted(t.topic for t in reloaded.topics()) == sorted(f"T{i}" for i in range(16))


def test_a_send_racing_topic_create_keeps_its_queue_readable(tmp_path: Path) -> None:
    """A first send is checked against the default queue count (8); an explicit `topic create` with fewer queues
    could land between that check and the send's registration, leaving the stored message in a queue the topic
    did not have. Registration now grows the topic to cover it."""
    store = MessageStore(StoreConfig(store_path=str(tmp_path / "store"), mapped_file_size_commit_log=8 << 20))
    store.start()
    topics = TopicConfigManager(tmp_path / "config")
    sends = SendProcessor(store, topics, BrokerMetrics())
    real_put, real_batch = store.put_message, store.put_batch

    def put_after_create(*args: Any, **kwargs: Any) -> Any:
        topics.create(args[0], 4)  # the admin's create, inside the race window
        return real_put(*args, **kwargs)

    def batch_after_create(*args: Any, **kwargs: Any) -> Any:
        topics.create("RacedBatch", 2)
        return real_batch(*args, **kwargs)

    try:
        store.put_message = put_after_create  # type: ignore[method-assign]
        outcome = sends.send_message("Raced", 7, b"x", {})
        assert outcome.result.queue_offsets == [0]
        assert topics.check_queue("Raced", 7).read_queue_nums == 8
        store.put_batch = batch_after_create  # type: ignore[method-assign]
        sends.send_batch(encode_entry(b"RacedBatch", 5, b"y"), 1)
        assert topics.check_queue("RacedBatch", 5).write_queue_nums == 6
        store.put_message = real_put  # type: ignore[method-assign]
        sends.send_message("Raced", 2, b"z", {})  # an ordinary send changes nothing
        assert topics.require("Raced").read_queue_nums == 8
    finally:
        store.shutdown()
