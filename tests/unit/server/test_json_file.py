"""The broker's JSON config files (broker/json_file.py): the backup stands in for a damaged file, and a file that
neither it nor its backup can stand for stops the broker with one error naming it (not a start with the table
empty, nor a traceback on content that is JSON but not the expected shape)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker.errors import CorruptionError
from broker.json_file import load_json, read_json, write_json_atomic
from broker.semantics.delay import DelayLevels, ScheduleMessageService
from broker.semantics.subscription_group import SubscriptionGroupManager
from broker.server.consumer_offsets import ConsumerOffsetManager
from broker.server.topic_config import TopicConfigManager
from broker.store import MessageStore, StoreConfig


def test_missing_or_empty_files_are_empty_tables(tmp_path: Path) -> None:
    assert read_json(tmp_path / "none.json") is None
    (tmp_path / "empty.json").write_text("  \n")  # as RocketMQ: an empty file is no file
    assert read_json(tmp_path / "empty.json") is None


@pytest.mark.parametrize(
    ("content", "needle"),
    [("{torn", "not valid JSON"), ("[1, 2]", "JSON list, not an object"), (b"\xff\xfe", "not valid JSON")],
)
def test_an_unreadable_file_without_a_backup_is_refused_naming_it(
    tmp_path: Path, content: str | bytes, needle: str
) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(CorruptionError, match=needle) as e:
        read_json(path)
    assert e.value.path == str(path) and "x.json.bak" in e.value.message and "restore" in e.value.message


def test_the_backup_stands_in_for_a_file_whose_content_is_malformed(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    write_json_atomic(path, {"n": 1})
    write_json_atomic(path, {"n": 2})
    path.write_text('{"n": "two"}')  # JSON, but not what the parser expects

    def parse(d: dict[str, object]) -> int:
        return int(str(d["n"]))

    assert load_json(path, parse) == 1  # from x.json.bak
    path.with_name("x.json.bak").write_text('{"m": 1}')
    with pytest.raises(CorruptionError, match=r"does not hold what it should \(ValueError") as e:
        load_json(path, parse)
    assert e.value.path == str(path)  # the first problem is the one named
    path.unlink()  # the main file gone, the backup unusable: still refused, not an empty table
    with pytest.raises(CorruptionError, match="KeyError"):
        load_json(path, parse)


def test_consumer_offsets_come_back_from_the_backup(tmp_path: Path) -> None:
    offsets = ConsumerOffsetManager(tmp_path)
    offsets.commit("g", {("T", 0): 5})
    offsets.persist()
    offsets.commit("g", {("T", 0): 9})
    offsets.persist()
    (tmp_path / "consumerOffset.json").write_text('{"offsetTable": []}')  # damaged outside the broker
    reloaded = ConsumerOffsetManager(tmp_path)
    reloaded.load()
    assert reloaded.query("g", "T") == {0: 5}  # the previous version: a re-delivery, not a skip
    (tmp_path / "consumerOffset.json.bak").write_text('{"offsetTable": {"T@g": {"0": "x"}}}')
    with pytest.raises(CorruptionError, match=r"consumerOffset\.json"):
        ConsumerOffsetManager(tmp_path).load()


def test_other_tables_refuse_malformed_content(tmp_path: Path) -> None:
    (tmp_path / "topics.json").write_text('{"topicConfigTable": {"A": {}}}')
    with pytest.raises(CorruptionError, match="KeyError"):
        TopicConfigManager(tmp_path).load()
    (tmp_path / "subscriptionGroup.json").write_text('{"subscriptionGroupTable": {"G": {"retryQueueNums": -1}}}')
    with pytest.raises(CorruptionError, match="retryQueueNums"):
        SubscriptionGroupManager(str(tmp_path))


def test_a_rocketmq_topics_file_is_read(tmp_path: Path) -> None:
    """RocketMQ writes dataVersion as an object; Sluice wrote a number. Both load."""
    table = {"O": {"topicName": "O", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}}
    (tmp_path / "topics.json").write_text(
        json.dumps({"topicConfigTable": table, "dataVersion": {"counter": 7, "timestamp": 1}})
    )
    topics = TopicConfigManager(tmp_path)
    topics.load()
    assert topics.require("O").read_queue_nums == 4


def test_delay_offsets_keep_levels_they_do_not_know_and_refuse_garbage(tmp_path: Path) -> None:
    store = MessageStore(StoreConfig(store_path=str(tmp_path / "store")))  # not started: only its files are read
    path = tmp_path / "delayOffset.json"
    path.write_text('{"offsetTable": {"1": 3, "99": 4}}')
    sched = ScheduleMessageService(store, str(tmp_path), DelayLevels("1s 5s"))
    assert sched.offsets() == {1: 3}
    sched.persist()
    assert json.loads(path.read_text())["offsetTable"] == {"1": 3, "99": 4}
    path.write_text('{"offsetTable": {"one": 3}}')
    path.with_name("delayOffset.json.bak").unlink()
    with pytest.raises(CorruptionError, match=r"delayOffset\.json"):
        ScheduleMessageService(store, str(tmp_path), DelayLevels("1s 5s"))


def test_the_broker_stops_with_one_error_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "config").mkdir(parents=True)
    (store / "config" / "consumerOffset.json").write_text('{"offsetTable": {"T@g": {"0": "x"}}}')
    out = subprocess.run(
        [sys.executable, "-m", "broker", "broker", "--store", str(store), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert "consumerOffset.json" in out.stderr and "STORE_CORRUPTED" in out.stderr


def test_offsets_that_failed_to_persist_are_persisted_next_time(tmp_path: Path) -> None:
    """persist() marked the table clean before writing it: a failed write was never tried again until the next
    commit changed something."""
    offsets = ConsumerOffsetManager(tmp_path)
    offsets.commit("g", {("T", 0): 3})
    blocker = tmp_path / "consumerOffset.json.tmp"
    blocker.mkdir()  # the temp file cannot be created: the write fails
    with pytest.raises(OSError):
        offsets.persist_if_dirty()
    blocker.rmdir()
    offsets.persist_if_dirty()
    assert json.loads((tmp_path / "consumerOffset.json").read_text()) == {"offsetTable": {"T@g": {"0": 3}}}
