"""connector/failover.py on a real replicated group (etcd, name server and replica processes): a lookup waits out a
failover and answers from the new master; a topic that does not exist is said at once; with no master coming back
the wait ends in a clear error."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Admin, Message, Producer, PullConsumer
from broker.client.route import DIRECT_BROKER, MessageQueue
from broker.errors import ServiceNotAvailableError, TopicNotExistError
from broker.ha.local_group import ReplicaGroup
from connector.failover import group_without_master, until_master
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

SETTINGS = {"ha_lease_ttl_s": 2, "min_insync_replicas": 2, "ha_max_lag_ms": 3000, "ha_ack_timeout_ms": 3000}
TOPIC = "failover_wait"
SHORT_WAIT_S = 4.0  # the wait given where no master comes back (the default is a minute)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[ReplicaGroup]:
    with ReplicaGroup(tmp_path / "group", 3, settings=SETTINGS) as g:
        yield g


def _master_address(producer: Producer) -> str | None:
    """The group's master in the topic's route, as the name servers give it now."""
    producer.router.refresh(TOPIC)
    groups = producer.router.route(TOPIC).groups
    return groups["broker-a"].master if "broker-a" in groups else None


def test_lookups_wait_out_a_failover_then_say_no_master_came_back(group: ReplicaGroup) -> None:
    master = group.wait_master()
    with Admin(group.endpoint(master)) as admin:
        admin.create_topic(TOPIC, 2)
    with Producer(namesrv=group.namesrv) as producer:
        router = producer.router
        wait_until(lambda: _master_address(producer) == group.endpoint(master), "the route to the master", timeout_s=30)
        assert not group_without_master(router)

        started = time.monotonic()
        with pytest.raises(TopicNotExistError):  # every group has its master: the topic really is missing
            until_master(lambda: router.route("no_such_topic"), router, "the route of no_such_topic")
        assert time.monotonic() - started < 2.0, "a missing topic was waited on"

        group.kill(master)  # at once a send: the old master refuses connections, then the group has none
        queue = MessageQueue(TOPIC, "broker-a", 0)
        sent = until_master(lambda: producer.send(Message(TOPIC, b"after the kill"), queue=queue), router,
                            "a send to queue 0", topic=TOPIC)
        new = group.wait_master(other_than=master, timeout_s=60)
        assert sent.queue_offset == 0
        queues = until_master(lambda: producer.queues(TOPIC), router, "the writable queues", topic=TOPIC)
        assert [q.queue_id for q in queues] == [0, 1]
        wait_until(lambda: _master_address(producer) == group.endpoint(new), "the route to the new master",
                   timeout_s=60)
        with PullConsumer(endpoint=group.endpoint(new), group="failover-wait") as consumer:
            stored = consumer.pull(MessageQueue(TOPIC, DIRECT_BROKER, 0), 0).messages
        assert [m.body for m in stored] == [b"after the kill"]  # stored once, on the new master

        for rid in group.ids:
            if group.running(rid):
                group.kill(rid)
        wait_until(lambda: group_without_master(router), "the name server to drop the dead master", timeout_s=30)
        router.refresh(TOPIC)
        started = time.monotonic()
        with pytest.raises(ServiceNotAvailableError, match=f"no master came back within {SHORT_WAIT_S:.0f} s"):
            until_master(lambda: producer.queues(TOPIC), router, "the writable queues", topic=TOPIC,
                         wait_s=SHORT_WAIT_S)
        assert SHORT_WAIT_S <= time.monotonic() - started < SHORT_WAIT_S + 10
