"""Subscription group settings: RocketMQ's JSON shape, defaults, validation, atomic persistence."""

from __future__ import annotations

import json
import os

import pytest

from broker.errors import CorruptionError, InvalidArgumentError, SubscriptionGroupNotExistError
from broker.semantics.subscription_group import SubscriptionGroupConfig, SubscriptionGroupManager


def test_defaults_are_rocketmq_s(tmp_path: str) -> None:
    groups = SubscriptionGroupManager(str(tmp_path))
    cfg = groups.get("G")
    assert (cfg.consume_enable, cfg.consume_from_min_enable, cfg.consume_broadcast_enable) == (True, True, True)
    assert (cfg.retry_queue_nums, cfg.retry_max_times) == (1, 16)


def test_persisted_in_rocketmq_shape_and_reloaded(tmp_path: str) -> None:
    groups = SubscriptionGroupManager(str(tmp_path))
    groups.update(SubscriptionGroupConfig("orders", retry_max_times=3, retry_queue_nums=2, consume_enable=False))
    groups.update_fields("billing", consume_broadcast_enable=False)
    with open(os.path.join(tmp_path, "subscriptionGroup.json")) as f:
        data = json.load(f)
    entry = data["subscriptionGroupTable"]["orders"]
    assert entry["groupName"] == "orders"
    assert entry["retryMaxTimes"] == 3 and entry["retryQueueNums"] == 2 and entry["consumeEnable"] is False
    assert data["dataVersion"]["counter"] == 2
    again = SubscriptionGroupManager(str(tmp_path), auto_create=False)
    assert again.get("orders") == groups.get("orders")
    assert again.get("billing").consume_broadcast_enable is False
    with pytest.raises(SubscriptionGroupNotExistError):
        again.get("unknown")
    assert again.delete("orders") and not again.delete("orders")
    assert [g.group_name for g in SubscriptionGroupManager(str(tmp_path)).groups()] == ["billing"]


def test_reads_a_rocketmq_file_with_extra_fields(tmp_path: str) -> None:
    path = os.path.join(tmp_path, "subscriptionGroup.json")
    with open(path, "w") as f:
        json.dump({"subscriptionGroupTable": {"G": {"groupName": "G", "retryMaxTimes": 5, "groupRetryPolicy": {},
                                                     "consumeMessageOrderly": False}},
                   "dataVersion": {"counter": 7, "timestamp": 1}}, f)
    groups = SubscriptionGroupManager(str(tmp_path))
    assert groups.get("G").retry_max_times == 5
    assert groups.data_version["counter"] == 7


def test_bad_values_are_refused_and_nothing_changes(tmp_path: str) -> None:
    groups = SubscriptionGroupManager(str(tmp_path))
    groups.update(SubscriptionGroupConfig("G", retry_max_times=4))
    for bad in (SubscriptionGroupConfig("G", retry_queue_nums=0), SubscriptionGroupConfig("G", retry_max_times=-1),
                SubscriptionGroupConfig("")):
        with pytest.raises(InvalidArgumentError):
            groups.update(bad)
    assert SubscriptionGroupManager(str(tmp_path)).get("G").retry_max_times == 4


def test_torn_file_is_reported_with_its_path(tmp_path: str) -> None:
    path = os.path.join(tmp_path, "subscriptionGroup.json")
    with open(path, "w") as f:
        f.write('{"subscriptionGroupTable": {"G": ')
    with pytest.raises(CorruptionError, match=r"subscriptionGroup\.json"):
        SubscriptionGroupManager(str(tmp_path))
