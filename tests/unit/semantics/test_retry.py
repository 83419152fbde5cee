"""CONSUMER_SEND_MSG_BACK on a real store: retry topic with growing delay levels, then the DLQ."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from broker.errors import BrokerError, InvalidArgumentError, QueryNotFoundError, ResponseCode
from broker.format.message import Prop
from broker.format.system_topics import SCHEDULE_TOPIC
from broker.semantics.delay import ScheduleMessageService
from broker.semantics.retry import DLQ_ORIGIN_MESSAGE_ID, DLQ_ORIGIN_TOPIC, RetryService
from broker.semantics.subscription_group import SubscriptionGroupConfig, SubscriptionGroupManager
from tests.support.waiting import wait_until

if TYPE_CHECKING:
    from store_box import StoreBox

# 18 short levels so that a message can fail 17 times within a test
FAST_LEVELS = " ".join(f"{10 + 5 * i}ms" for i in range(18))


def services(box: StoreBox) -> tuple[ScheduleMessageService, SubscriptionGroupManager, RetryService]:
    config_dir = os.path.join(box.path, "config")
    sched = ScheduleMessageService(box.s, config_dir, FAST_LEVELS)
    groups = SubscriptionGroupManager(config_dir)
    return sched, groups, RetryService(box.s, groups, sched)


def test_first_send_back_goes_to_retry_topic_with_level_3(box: StoreBox) -> None:
    sched, _groups, retry = services(box)
    put = box.s.put_message("Orders", 2, b"payload", {Prop.KEYS: "order-1", Prop.TAGS: "paid"})
    original = box.s.lookup_message(put.commitlog_offsets[0])
    assert original is not None
    res = retry.consumer_send_back("G", commitlog_offset=original.commitlog_offset)
    assert (res.topic, res.queue_id, res.dead_letter, res.delay_level, res.reconsume_times) == ("%RETRY%G", 0, False,
                                                                                               3, 1)
    scheduled = box.read_queue(SCHEDULE_TOPIC, 2)  # level 3 -> schedule queue 2
    assert len(scheduled) == 1
    assert scheduled[0].properties[Prop.REAL_TOPIC] == "%RETRY%G"
    sched.start()
    try:
        wait_until(lambda: len(box.read_topic("%RETRY%G")) == 1, "the retry message", timeout_s=5, interval_s=0.005)
    finally:
        sched.shutdown()
    m = box.read_topic("%RETRY%G")[0]
    assert m.body == b"payload" and m.keys == ["order-1"] and m.tags == "paid"
    assert m.properties[Prop.RETRY_TOPIC] == "Orders"
    assert m.properties[Prop.ORIGIN_MESSAGE_ID] == original.msg_id
    assert m.reconsume_times == 1
    assert Prop.DELAY not in m.properties


def test_a_message_failing_17_times_ends_in_the_dlq_with_its_history(box: StoreBox) -> None:
    sched, _groups, retry = services(box)
    put = box.s.put_message("Orders", 0, b"poison", {Prop.KEYS: "k"})
    origin_id = put.msg_ids[0]
    current = box.s.lookup_message(put.commitlog_offsets[0])
    sched.start()
    levels = []
    try:
        for failure in range(1, 17):
            assert current is not None
            res = retry.consumer_send_back("G", msg_id=current.msg_id)
            assert not res.dead_letter and res.reconsume_times == failure
            levels.append(res.delay_level)
            wait_until(lambda n=failure: len(box.read_topic("%RETRY%G")) == n,
                       f"retry {failure}", timeout_s=5, interval_s=0.005)
            current = box.read_topic("%RETRY%G")[-1]
            assert current.reconsume_times == failure
        assert current is not None
        res = retry.consumer_send_back("G", msg_id=current.msg_id)  # the 17th failure
    finally:
        sched.shutdown()
    assert levels == [min(3 + i, 18) for i in range(16)]
    assert res.dead_letter and res.topic == "%DLQ%G" and res.reconsume_times == 17
    dlq = box.read_topic("%DLQ%G")
    assert len(dlq) == 1
    dead = dlq[0]
    assert dead.body == b"poison" and dead.reconsume_times == 17
    assert dead.properties[Prop.ORIGIN_MESSAGE_ID] == origin_id
    assert dead.properties[Prop.RETRY_TOPIC] == "Orders"
    assert dead.properties[DLQ_ORIGIN_TOPIC] == "Orders"
    assert dead.properties[DLQ_ORIGIN_MESSAGE_ID] == origin_id
    assert Prop.DELAY not in dead.properties
    assert len(box.read_topic("%RETRY%G")) == 16  # never redelivered from the DLQ


def test_group_and_caller_limits(box: StoreBox) -> None:
    _sched, groups, retry = services(box)
    groups.update(SubscriptionGroupConfig("G2", retry_max_times=0, retry_queue_nums=4))
    put = box.s.put_message("T", 0, b"x")
    assert retry.consumer_send_back("G2", commitlog_offset=put.commitlog_offsets[0]).dead_letter
    # the caller's maxReconsumeTimes wins over the group's
    res = retry.consumer_send_back("G2", commitlog_offset=put.commitlog_offsets[0], max_reconsume_times=5)
    assert not res.dead_letter and 0 <= res.queue_id < 4
    # a negative delay level sends straight to the DLQ; an explicit level is used as given
    assert retry.consumer_send_back("G", commitlog_offset=put.commitlog_offsets[0], delay_level=-1).dead_letter
    assert retry.consumer_send_back("G", commitlog_offset=put.commitlog_offsets[0], delay_level=7).delay_level == 7


def test_bad_requests(box: StoreBox) -> None:
    _sched, groups, retry = services(box)
    with pytest.raises(QueryNotFoundError):
        retry.consumer_send_back("G", commitlog_offset=10**9)
    with pytest.raises(InvalidArgumentError):
        retry.consumer_send_back("G")
    groups.update(SubscriptionGroupConfig("Off", consume_enable=False))
    put = box.s.put_message("T", 0, b"x")
    with pytest.raises(BrokerError) as info:
        retry.consumer_send_back("Off", commitlog_offset=put.commitlog_offsets[0])
    assert info.value.code is ResponseCode.NO_PERMISSION
    assert box.s.max_offset("%RETRY%Off", 0) == 0


def test_a_count_that_cannot_grow_goes_to_the_dlq(box: StoreBox) -> None:
    """A message already at the highest reconsume count (INT32 max) cannot be counted once more: its copy used to
    overflow the field, and the send-back failed every time. It is a dead letter, its count kept."""
    _sched, _groups, retry = services(box)
    put = box.s.put_message("T", 0, b"x", reconsume_times=2**31 - 1)
    for limit in (None, 2**31 - 1):
        res = retry.consumer_send_back("G", commitlog_offset=put.commitlog_offsets[0], max_reconsume_times=limit)
        assert res.put.ok and res.dead_letter and res.reconsume_times == 2**31 - 1
    assert [m.reconsume_times for m in box.read_topic("%DLQ%G")] == [2**31 - 1] * 2


def test_a_negative_stored_count_counts_as_zero(box: StoreBox) -> None:
    """Sends now refuse negative counts; one stored before (or by another path) is a first failure: level 3,
    count 1, not an immediate redelivery with extra attempts before the DLQ."""
    _sched, _groups, retry = services(box)
    put = box.s.put_message("T", 0, b"x", reconsume_times=-5)
    res = retry.consumer_send_back("G", commitlog_offset=put.commitlog_offsets[0])
    assert (res.dead_letter, res.delay_level, res.reconsume_times) == (False, 3, 1)
