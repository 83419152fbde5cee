"""Delay levels on a real store: rewriting onto SCHEDULE_TOPIC_XXXX, delivery when due, restart, progress file."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

import pytest

from broker.errors import InvalidArgumentError, MessageIllegalError
from broker.format.message import Prop, encode_entry, encode_properties
from broker.format.system_topics import SCHEDULE_TOPIC
from broker.semantics.delay import DEFAULT_DELAY_LEVELS, DelayLevels, ScheduleMessageService, due_time_ms
from tests.support.waiting import wait_until

if TYPE_CHECKING:
    from store_box import StoreBox

FAST_LEVELS = "300ms 600ms 900ms"
LATE_TOLERANCE_MS = 1000


def test_level_table_parsing() -> None:
    levels = DelayLevels(DEFAULT_DELAY_LEVELS)
    assert levels.max_level == 18
    assert levels.delay_ms(1) == 1000 and levels.delay_ms(5) == 60_000 and levels.delay_ms(18) == 7_200_000
    assert levels.clamp(40) == 18
    assert DelayLevels("250ms 1d").delays_ms == [250, 86_400_000]
    for bad in ("", "5", "5x", "0s", "-1s", "1.5s"):
        with pytest.raises(InvalidArgumentError):
            DelayLevels(bad)


def test_due_time_corrects_a_clock_that_went_back() -> None:
    assert due_time_ms(1000, 500, now_ms=1200) == 1500
    assert due_time_ms(10_000, 500, now_ms=1200) == 1200  # stored "in the future": deliver now


def test_rewrite_for_delay(box: StoreBox) -> None:
    sched = ScheduleMessageService(box.s, os.path.join(box.path, "config"))
    assert sched.rewrite_for_delay("T", 3, {"a": "b"}) == ("T", 3, {"a": "b"})
    assert sched.rewrite_for_delay("T", 3, {Prop.DELAY: "0"}).topic == "T"
    topic, qid, props = sched.rewrite_for_delay("T", 3, {Prop.DELAY: "2", "a": "b"})
    assert (topic, qid) == (SCHEDULE_TOPIC, 1)
    assert props == {Prop.DELAY: "2", "a": "b", Prop.REAL_TOPIC: "T", Prop.REAL_QID: "3"}
    topic, qid, props = sched.rewrite_for_delay("T", 0, {Prop.DELAY: "99"})
    assert (qid, props[Prop.DELAY]) == (17, "18")  # clamped to the highest level
    with pytest.raises(MessageIllegalError, match="DELAY"):
        sched.rewrite_for_delay("T", 0, {Prop.DELAY: "soon"})


def test_messages_are_delivered_when_due_not_before(box: StoreBox) -> None:
    sched = ScheduleMessageService(box.s, os.path.join(box.path, "config"), FAST_LEVELS)
    sched.start()
    try:
        sent = {}
        for i, level in enumerate([1, 2, 3, 1, 7]):  # 7 is clamped to 3
            props = {Prop.DELAY: str(level), Prop.KEYS: f"k{i}", Prop.TAGS: "TagA", "n": str(i)}
            res = sched.put_message("Orders", i % 2, f"body-{i}".encode(), props, reconsume_times=2)
            assert res.ok
            sent[str(i)] = (res.store_timestamp, min(level, 3), res.msg_ids[0])
        assert box.s.max_offset("Orders", 0) == 0  # nothing visible yet
        wait_until(lambda: len(box.read_topic("Orders")) == 5, "5 delayed messages", timeout_s=5, interval_s=0.005)
        got = box.read_topic("Orders")
    finally:
        sched.shutdown()
    for m in got:
        stored_at, level, old_id = sent[m.properties["n"]]
        delay_ms = [300, 600, 900][level - 1]
        assert m.store_timestamp >= stored_at + delay_ms, (m.properties, m.store_timestamp - stored_at)
        assert m.store_timestamp <= stored_at + delay_ms + LATE_TOLERANCE_MS
        assert m.body == f"body-{m.properties['n']}".encode()
        assert m.keys == [f"k{m.properties['n']}"] and m.tags == "TagA"
        assert Prop.DELAY not in m.properties
        assert m.properties[Prop.REAL_TOPIC] == "Orders"
        assert m.queue_id == int(m.properties["n"]) % 2
        assert m.reconsume_times == 2
        assert m.msg_id != old_id
    assert sched.delivered_count == 5
    with open(os.path.join(box.path, "config", "delayOffset.json")) as f:
        table = json.load(f)["offsetTable"]
    assert table == {"1": 2, "2": 1, "3": 2}


def test_pending_delay_survives_restart_and_is_delivered_once(box: StoreBox) -> None:
    config_dir = os.path.join(box.path, "config")
    sched = ScheduleMessageService(box.s, config_dir, FAST_LEVELS)
    sched.start()
    assert sched.put_message("T", 0, b"early", {Prop.DELAY: "1"}).ok
    wait_until(lambda: len(box.read_topic("T")) == 1, "first delivery", timeout_s=5, interval_s=0.005)
    res = sched.put_message("T", 0, b"late", {Prop.DELAY: "3"})
    sched.shutdown()
    box.crash()  # the broker dies while the message waits
    time.sleep(1.0)  # it becomes due while the broker is down
    box.open()
    sched = ScheduleMessageService(box.s, config_dir, FAST_LEVELS)
    assert sched.offsets() == {1: 1}
    sched.start()
    try:
        wait_until(lambda: len(box.read_topic("T")) == 2, "delivery after restart", timeout_s=5, interval_s=0.005)
        time.sleep(0.3)  # would a second copy come?
        bodies = [m.body for m in box.read_topic("T")]
    finally:
        sched.shutdown()
    assert bodies == [b"early", b"late"]
    assert box.read_topic("T")[1].store_timestamp >= res.store_timestamp + 900


def test_unknown_levels_in_the_file_are_kept(box: StoreBox) -> None:
    config_dir = os.path.join(box.path, "config")
    os.makedirs(config_dir, exist_ok=True)
    with open(os.path.join(config_dir, "delayOffset.json"), "w") as f:
        json.dump({"offsetTable": {"1": 0, "17": 5}}, f)
    sched = ScheduleMessageService(box.s, config_dir, FAST_LEVELS)
    sched.persist()
    with open(os.path.join(config_dir, "delayOffset.json")) as f:
        assert json.load(f)["offsetTable"] == {"1": 0, "17": 5}


def test_bad_real_topic_is_skipped_not_stuck(box: StoreBox) -> None:
    # A hand-made schedule entry whose REAL_TOPIC is invalid must not block the level forever.
    props = {Prop.DELAY: "1", Prop.REAL_TOPIC: "bad topic!", Prop.REAL_QID: "0"}
    assert box.s.put_message(SCHEDULE_TOPIC, 0, b"x", props).ok
    sched = ScheduleMessageService(box.s, os.path.join(box.path, "config"), FAST_LEVELS)
    sched.start()
    try:
        assert sched.put_message("T", 0, b"good", {Prop.DELAY: "1"}).ok
        wait_until(lambda: len(box.read_topic("T")) == 1, "the good message", timeout_s=5, interval_s=0.005)
    finally:
        sched.shutdown()
    assert sched.offsets()[1] == 2


def test_restart_of_the_service_on_one_store(box: StoreBox) -> None:
    sched = ScheduleMessageService(box.s, os.path.join(box.path, "config"), FAST_LEVELS)
    assert sched.deliver_tag_code({Prop.DELAY: "2"}, 1_000) == 1_600
    assert sched.deliver_tag_code({Prop.DELAY: "9"}, 1_000) == 1_900  # clamped like the message
    for _ in range(2):  # stop and start again: one listener, timers running
        sched.start()
        assert sched.put_message("T", 0, b"x", {Prop.DELAY: "1"}).ok
        sched.shutdown()
    assert len(box.s.dispatcher.listeners) == 1
    sched.start()
    try:
        wait_until(lambda: len(box.read_topic("T")) == 2, "both deliveries", timeout_s=5, interval_s=0.005)
    finally:
        sched.shutdown()


def test_batches_with_delayed_entries_are_rewritten_one_by_one(box: StoreBox) -> None:
    sched = ScheduleMessageService(box.s, os.path.join(box.path, "config"), FAST_LEVELS)
    plain = encode_entry(b"T", 1, b"now", encode_properties({"k": "v"}))
    assert sched.rewrite_batch_for_delay(plain * 3) == plain * 3
    delayed = encode_entry(b"T", 2, b"later", encode_properties({Prop.DELAY: "2", "k": "v"}), flag=5)
    zero = encode_entry(b"T", 0, b"zero", encode_properties({"a": "1", Prop.DELAY: "0"}))
    out = sched.rewrite_batch_for_delay(plain + delayed + zero)
    assert box.s.put_batch(out).ok
    assert [m.body for m in box.read_topic("T")] == [b"zero", b"now"]
    [m] = box.read_queue(SCHEDULE_TOPIC, 1)
    assert m.body == b"later" and m.flag == 5
    assert m.properties[Prop.REAL_TOPIC] == "T" and m.properties[Prop.REAL_QID] == "2"
    with pytest.raises(MessageIllegalError):
        sched.rewrite_batch_for_delay(delayed + b"\x00" * 12)


def test_progress_saved_before_the_log_was_cut_back_moves_back_to_the_queue_ends(box: StoreBox) -> None:
    """A replica truncated after an election (or a log that lost its unflushed tail) starts with a progress file
    saved when its log was longer: deliveries it counts past a queue's end were of entries cut away, and new
    entries will take those offsets, so each offset comes down to its queue's end at start-up."""
    config_dir = os.path.join(box.path, "config")
    os.makedirs(config_dir, exist_ok=True)
    for i in range(3):
        assert box.s.put_message(SCHEDULE_TOPIC, 0, b"%d" % i, {Prop.DELAY: "1"}).ok
    assert box.s.wait_dispatched()
    log_now = box.s.max_phys_offset()
    path = os.path.join(config_dir, "delayOffset.json")
    with open(path, "w") as f:  # saved when the log (and level 1's queue) was longer; level 2's queue is empty
        json.dump({"offsetTable": {"1": 5, "2": 4, "3": 0}, "log_end": log_now + 10_000}, f)
    sched = ScheduleMessageService(box.s, config_dir, FAST_LEVELS)
    assert sched.offsets() == {1: 3, 2: 0, 3: 0}
    with open(path) as f:
        assert json.load(f) == {"offsetTable": {"1": 3, "2": 0, "3": 0}, "log_end": log_now}
    with open(path, "w") as f:  # saved at or below the log's end: kept as it is
        json.dump({"offsetTable": {"1": 2}, "log_end": log_now}, f)
    sched.reload()
    assert sched.offsets() == {1: 2}


def test_a_delivery_the_progress_file_missed_is_not_made_again(box: StoreBox) -> None:
    """The progress file behind the log (a failover: the new master's copy came by the metadata sync, before the
    old master's last deliveries): the level finds the delivered copies by their UNIQ_KEY and delivers only the rest,
    each once (the soak found a delay message readable twice after a master SIGKILL)."""
    config_dir = os.path.join(box.path, "config")
    sched = ScheduleMessageService(box.s, config_dir, FAST_LEVELS)
    sched.start()
    for i in range(3):
        assert sched.put_message("T", 0, b"done-%d" % i, {Prop.DELAY: "1", Prop.UNIQ_KEY: f"U{i}"}).ok
    wait_until(lambda: len(box.read_topic("T")) == 3, "three deliveries", timeout_s=5, interval_s=0.005)
    sched.shutdown()
    with open(os.path.join(config_dir, "delayOffset.json")) as f:
        progress = json.load(f)
    progress["offsetTable"]["1"] = 0  # as the old master's file was before those deliveries
    with open(os.path.join(config_dir, "delayOffset.json"), "w") as f:
        json.dump(progress, f)
    sched = ScheduleMessageService(box.s, config_dir, FAST_LEVELS)
    assert sched.offsets()[1] == 0
    assert sched.put_message("T", 0, b"new", {Prop.DELAY: "1", Prop.UNIQ_KEY: "U-new"}).ok
    sched.start()
    try:
        wait_until(lambda: sched.offsets()[1] == 4, "the level past all four", timeout_s=5, interval_s=0.005)
        time.sleep(0.3)  # would a second copy come?
        bodies = sorted(m.body for m in box.read_topic("T"))
    finally:
        sched.shutdown()
    assert bodies == [b"done-0", b"done-1", b"done-2", b"new"]
