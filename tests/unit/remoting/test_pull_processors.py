"""PULL_MESSAGE and CONSUMER_SEND_MSG_BACK through the remoting processors of an in-process broker: long polling
without a thread, offsets moved, tag and SQL92 filters, commit offsets, send-backs into %RETRY% and %DLQ%."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest
from message_wire_helpers import (
    COMMIT_OFFSET,
    CONSUMER_SEND_MSG_BACK,
    PULL_MESSAGE,
    SUBSCRIPTION,
    SUSPEND,
    answered,
    auth_broker,
    call,
    pull_header,
    remoting,
    send,
)

from broker.client import Admin
from broker.errors import ResponseCode
from broker.remoting.message_entry import iter_stored
from broker.remoting.message_processors import MessageProcessors, message_processors
from broker.server.broker_controller import BrokerController
from tests.support.waiting import wait_until

__all__ = ["remoting"]  # the fixture


def pull(table: MessageProcessors, topic: str, offset: int, **kw: Any) -> Any:
    return answered(call(table, PULL_MESSAGE, pull_header("g", topic, 0, offset, **kw)))


def fill(broker: BrokerController, table: MessageProcessors, topic: str, bodies: list[tuple[bytes, dict[str, str]]]
         ) -> None:
    for body, props in bodies:
        assert send(table, topic, body, props).code == ResponseCode.SUCCESS
    assert broker.store is not None and broker.store.wait_dispatched()


def test_a_held_pull_is_answered_when_a_message_arrives(broker: BrokerController, endpoint: str,
                                                        remoting: MessageProcessors) -> None:
    with Admin(endpoint) as admin:
        admin.create_topic("LP", 1)
    threads = threading.active_count()
    held = call(remoting, PULL_MESSAGE, pull_header("g", "LP", 0, 0, sys_flag=SUSPEND | SUBSCRIPTION,
                                                    suspend_ms=4000))
    assert isinstance(held, Future)
    time.sleep(0.2)
    assert not held.done() and remoting.suspender.held_count() == 1
    assert threading.active_count() == threads  # held without a thread of its own
    started = time.monotonic()
    fill(broker, remoting, "LP", [(b"arrived", {"UNIQ_KEY": "A"})])
    r = answered(held, 2.0)
    assert time.monotonic() - started < 2.0
    assert r.code == ResponseCode.SUCCESS and [m.body for m in iter_stored(r.body)] == [b"arrived"]
    assert r.ext_fields["nextBeginOffset"] == "1" and remoting.suspender.held_count() == 0


def test_a_held_pull_ends_not_found_at_its_suspend_time(broker: BrokerController, endpoint: str,
                                                       remoting: MessageProcessors) -> None:
    with Admin(endpoint) as admin:
        admin.create_topic("LP2", 1)
    started = time.monotonic()
    held = call(remoting, PULL_MESSAGE, pull_header("g", "LP2", 0, 0, sys_flag=SUSPEND, suspend_ms=300))
    r = answered(held, 3.0)
    assert 0.25 < time.monotonic() - started < 2.0
    assert (r.code, r.ext_fields["nextBeginOffset"], r.ext_fields["maxOffset"]) == (ResponseCode.PULL_NOT_FOUND,
                                                                                     "0", "0")
    # without SUSPEND: answered at once, the same
    assert pull(remoting, "LP2", 0).code == ResponseCode.PULL_NOT_FOUND


def test_held_pulls_are_answered_at_shutdown(broker: BrokerController, endpoint: str) -> None:
    with Admin(endpoint) as admin:
        admin.create_topic("LP3", 1)
    table = message_processors(broker)
    held = call(table, PULL_MESSAGE, pull_header("g", "LP3", 0, 0, sys_flag=SUSPEND, suspend_ms=30_000))
    table.shutdown()
    assert answered(held, 1.0).code == ResponseCode.PULL_NOT_FOUND


def test_an_offset_out_of_range_is_moved(broker: BrokerController, remoting: MessageProcessors) -> None:
    fill(broker, remoting, "OM", [(f"m{i}".encode(), {}) for i in range(3)])
    for offset in (4, 1_000_000):
        r = pull(remoting, "OM", offset, sys_flag=SUSPEND | SUBSCRIPTION, suspend_ms=5000)  # never held
        assert (r.code, r.ext_fields["nextBeginOffset"], r.ext_fields["minOffset"], r.ext_fields["maxOffset"]) == (
            ResponseCode.PULL_OFFSET_MOVED, "3", "0", "3")
    r = pull(remoting, "OM", 1, max_msgs=1)
    assert (r.code, r.ext_fields["nextBeginOffset"], [m.body for m in iter_stored(r.body)]) == (0, "2", [b"m1"])


def test_tag_filters(broker: BrokerController, remoting: MessageProcessors) -> None:
    fill(broker, remoting, "TF", [(b"b0", {"TAGS": "TagB"}), (b"b1", {"TAGS": "TagB"}), (b"a2", {"TAGS": "TagA"}),
                                  (b"c3", {"TAGS": "TagC"}), (b"a4", {"TAGS": "TagA"})])
    r = pull(remoting, "TF", 0, max_msgs=2, subscription="TagA || TagC")
    assert (r.code, r.ext_fields["nextBeginOffset"], r.body) == (ResponseCode.PULL_RETRY_IMMEDIATELY, "2", b"")
    r = pull(remoting, "TF", 2, subscription="TagA || TagC")
    assert [m.body for m in iter_stored(r.body)] == [b"a2", b"c3", b"a4"]
    r = pull(remoting, "TF", 0, subscription="*")
    assert len(list(iter_stored(r.body))) == 5


def test_sql92_filters(broker: BrokerController, remoting: MessageProcessors) -> None:
    fill(broker, remoting, "SQ", [(f"m{i}".encode(), {"a": str(i), "TAGS": "T"}) for i in range(6)])
    r = pull(remoting, "SQ", 0, subscription="a > 3 AND TAGS = 'T'", expression_type="SQL92")
    assert r.code == ResponseCode.SUCCESS and [m.body for m in iter_stored(r.body)] == [b"m4", b"m5"]
    r = pull(remoting, "SQ", 0, subscription="a >>> 3", expression_type="SQL92")
    assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and r.remark


def test_a_pull_commits_the_offset_it_carries(broker: BrokerController, remoting: MessageProcessors) -> None:
    fill(broker, remoting, "CO", [(f"m{i}".encode(), {}) for i in range(4)])
    pull(remoting, "CO", 3, sys_flag=COMMIT_OFFSET | SUBSCRIPTION, commit_offset=3)
    assert broker.offsets.query("g", "CO") == {0: 3}
    pull(remoting, "CO", 3, sys_flag=SUBSCRIPTION, commit_offset=1)  # the flag clear: not committed
    assert broker.offsets.query("g", "CO") == {0: 3}


def test_refused_pulls_answer_their_code(broker: BrokerController, remoting: MessageProcessors) -> None:
    fill(broker, remoting, "RP", [(b"x", {})])
    cases = [
        (pull_header("g", "RMQ_SYS_TRANS_HALF_TOPIC", 0, 0), ResponseCode.NO_PERMISSION),
        ({k: v for k, v in pull_header("g", "RP", 0, 0).items() if k != "queueOffset"}, ResponseCode.SYSTEM_ERROR),
        (pull_header("g", "RP", 0, 0, sys_flag=0x8), ResponseCode.SYSTEM_ERROR),  # class filter
        (pull_header("g", "RP", 0, 0, expression_type="XPATH"), ResponseCode.SYSTEM_ERROR),
        (pull_header("g", "NoSuchTopic", 0, 0), ResponseCode.TOPIC_NOT_EXIST),
    ]
    for header, code in cases:
        r = answered(call(remoting, PULL_MESSAGE, header))
        assert r.code == code, (header, r.code, r.remark)


def _retry_offsets(broker: BrokerController, topic: str) -> int:
    assert broker.store is not None
    return sum(broker.store.max_offset(topic, q) for q in range(4))


@pytest.fixture
def fast_retries(broker_factory: Callable[..., BrokerController]) -> BrokerController:
    return broker_factory(message_delay_level="100ms 100ms 100ms 100ms 100ms")


def test_a_send_back_lands_in_the_retry_topic(fast_retries: BrokerController) -> None:
    table = message_processors(fast_retries)
    try:
        fill(fast_retries, table, "SB", [(b"again", {"UNIQ_KEY": "U", "TAGS": "T"})])
        [m] = iter_stored(pull(table, "SB", 0).body)
        back = {"offset": str(m.commitlog_offset), "group": "g", "delayLevel": "0", "originMsgId": "U",
                "maxReconsumeTimes": "16"}
        r = answered(call(table, CONSUMER_SEND_MSG_BACK, back))
        assert r.code == ResponseCode.SUCCESS, r.remark
        wait_until(lambda: _retry_offsets(fast_retries, "%RETRY%g") == 1, "the copy in %RETRY%g", timeout_s=4.0)
        assert fast_retries.store is not None
        queue = next(q for q in range(4) if fast_retries.store.max_offset("%RETRY%g", q))
        r = answered(call(table, PULL_MESSAGE, pull_header("g", "%RETRY%g", queue, 0)))
        [copy] = iter_stored(r.body)
        assert (copy.body, copy.reconsume_times, copy.properties["RETRY_TOPIC"]) == (b"again", 1, "SB")
        # past maxReconsumeTimes: straight to the dead letters
        r = answered(call(table, CONSUMER_SEND_MSG_BACK, {**back, "offset": str(copy.commitlog_offset),
                                                          "maxReconsumeTimes": "1"}))
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert fast_retries.store.wait_dispatched() and fast_retries.store.max_offset("%DLQ%g", 0) == 1
        # an offset where no message starts: refused, nothing sent
        r = answered(call(table, CONSUMER_SEND_MSG_BACK, {**back, "offset": "3"}))
        assert r.code == ResponseCode.QUERY_NOT_FOUND
    finally:
        table.shutdown()


def test_pulls_and_send_backs_need_sub_with_auth(broker_factory: Callable[..., BrokerController]) -> None:
    broker = auth_broker(broker_factory)
    table = message_processors(broker)
    try:
        assert send(table, "PA", b"x", {"UNIQ_KEY": "U"}, user="root").code == ResponseCode.SUCCESS
        assert broker.store is not None and broker.store.wait_dispatched()
        header = pull_header("g", "PA", 0, 0)
        assert answered(call(table, PULL_MESSAGE, header, user="u")).code == ResponseCode.NO_PERMISSION
        broker.accounts.grant("u", "Topic:PA", ["Sub"])
        assert answered(call(table, PULL_MESSAGE, header, user="u")).code == ResponseCode.NO_PERMISSION  # group
        broker.accounts.grant("u", "Group:g", ["Sub"])
        r = answered(call(table, PULL_MESSAGE, header, user="u"))
        assert r.code == ResponseCode.SUCCESS
        [m] = iter_stored(r.body)
        back = {"offset": str(m.commitlog_offset), "group": "g2", "delayLevel": "0"}
        r = answered(call(table, CONSUMER_SEND_MSG_BACK, back, user="u"))
        assert r.code == ResponseCode.NO_PERMISSION  # no right on group g2
        broker.accounts.grant("u", "Group:g2", ["Sub"])
        r = answered(call(table, CONSUMER_SEND_MSG_BACK, back, user="u"))
        assert r.code == ResponseCode.SUCCESS, r.remark
    finally:
        table.shutdown()
