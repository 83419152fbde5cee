"""A transaction over two brokers, its decision on a third (the coordinator), on real processes: the committer dies
after committing one participant, the coordinator is SIGKILLed and restarted, and the other participant still
commits its part by itself, asking the coordinator through the name servers. An undecided one is aborted on both
participants, and a committer that comes back late cannot commit it any more."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Admin, PullConsumer
from broker.client.coordinator import CoordinatorClient
from broker.client.producer import Producer
from broker.errors import BrokerError, ResponseCode
from broker.format.message import encode_entry, encode_properties
from broker.format.transaction_codec import ATTEMPT
from broker.format.txn_decision import Share, make_decision
from broker.namesrv.local_cluster import LocalCluster
from broker.semantics.participant_resolver import COORDINATOR_PROPERTY
from tests.support.cluster import make_cluster
from tests.support.waiting import wait_until

TOPIC = "X"
# Participants look at open halves every 200 ms once idle 300 ms, and fence after 5 checks: a few seconds, where
# the defaults (6 s, 60 s, 15) take a quarter of an hour.
BROKER_CONFIG = {"transaction_timeout_ms": 300, "transaction_check_interval_ms": 200, "transaction_check_max": 5}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    config = tmp_path / "broker.json"
    config.write_text(json.dumps(BROKER_CONFIG))
    with make_cluster(tmp_path, config=config) as c:
        yield c


def halves(producer: Producer, txn_id: str, broker: str, bodies: list[bytes], in_place: bool = False) -> None:
    """Rows of attempt att1 decided by broker-c: in place (the call names both), or as halves (each row does)."""
    props = encode_properties({} if in_place else {ATTEMPT: "att1", COORDINATOR_PROPERTY: "broker-c"})
    buffer = b"".join(encode_entry(TOPIC.encode(), i % 2, b, props) for i, b in enumerate(bodies))
    if in_place:
        producer.send_encoded(buffer, len(bodies), txn_id, attempt="att1", coordinator="broker-c", broker_name=broker,
                              topic=TOPIC)
    else:
        producer.send_encoded(buffer, len(bodies), txn_id, broker_name=broker, topic=TOPIC)


def visible(consumer: PullConsumer, broker: str) -> list[bytes]:
    out: list[bytes] = []
    for mq, (lo, hi) in sorted(consumer.queue_ranges(TOPIC).items()):
        if mq.broker_name == broker and hi > lo:
            out += [m.body for m in consumer.pull(mq, lo, max_msgs=hi - lo).messages]
    return out


@pytest.mark.parametrize("in_place", [True, False])
def test_a_participant_commits_its_part_after_the_committer_and_the_coordinator_died(
    cluster: LocalCluster, in_place: bool
) -> None:
    for name in ("broker-a", "broker-b"):
        with Admin(cluster.endpoint(name)) as admin:
            admin.create_topic(TOPIC, 2)
    with Producer(namesrv=cluster.namesrv, group="spark") as producer:
        router = producer.router
        wait_until(lambda: (router.refresh(TOPIC), router.route(TOPIC).broker_names)[1] == ["broker-a", "broker-b"],
                   "both participants in the route", timeout_s=60, interval_s=0.1)
        client = CoordinatorClient(router)
        consumer = PullConsumer(namesrv=cluster.namesrv, group="reader", router=router)
        a_rows, b_rows = [b"a0", b"a1", b"a2"], [b"b0", b"b1"]
        halves(producer, "T1", "broker-a", a_rows, in_place)
        halves(producer, "T1", "broker-b", b_rows, in_place)
        shares = [Share("broker-a", ("att1",), 3), Share("broker-b", ("att1",), 2)]
        assert client.record("broker-c", make_decision("T1", True, shares)).commit  # the commit point
        assert client.end("broker-a", "T1", True, ["att1"], expected_messages=3) == "COMMITTED"
        # The committer dies here. The coordinator crashes too, and comes back on its store.
        cluster.kill("broker-c")
        cluster.restart("broker-c")
        wait_until(lambda: sorted(visible(consumer, "broker-b")) == b_rows,
                   "broker-b committing its part by itself", timeout_s=60, interval_s=0.1)
        assert sorted(visible(consumer, "broker-a")) == a_rows
        assert client.transactions("broker-b", "T1") == {"T1": "COMMITTED"}

        # Undecided: both participants wait, then fence ABORT at the coordinator and roll back.
        halves(producer, "T2", "broker-a", [b"never"], in_place)
        halves(producer, "T2", "broker-b", [b"never"], in_place)
        for name in ("broker-a", "broker-b"):
            wait_until(lambda name=name: client.transactions(name, "T2") == {"T2": "ROLLED_BACK"},  # type: ignore[misc]
                       f"{name} rolling T2 back", timeout_s=60, interval_s=0.1)
        late = client.record("broker-c", make_decision("T2", True, [Share("broker-a", ("att1",), 1)]))
        assert not late.commit  # a committer back late learns that the transaction was aborted
        assert sorted(visible(consumer, "broker-a")) == a_rows and sorted(visible(consumer, "broker-b")) == b_rows


@pytest.mark.parametrize("in_place", [True, False])
def test_a_transaction_naming_a_coordinator_the_name_servers_do_not_list_is_refused(
    cluster: LocalCluster, in_place: bool
) -> None:
    """It could never be decided: open for ever, it would hold its queues' readers for ever."""
    with Admin(cluster.endpoint("broker-a")) as admin:
        admin.create_topic(TOPIC, 2)
        end = admin.stats()["store_commit_log_max_offset"]
    with Producer(namesrv=cluster.namesrv, group="spark") as producer:
        router = producer.router
        wait_until(lambda: "broker-a" in (router.refresh(TOPIC), router.route(TOPIC).broker_names)[1],
                   "broker-a in the route", timeout_s=60, interval_s=0.1)
        props = encode_properties({} if in_place else {ATTEMPT: "att1", COORDINATOR_PROPERTY: "broker-typo"})
        buffer = encode_entry(TOPIC.encode(), 0, b"row", props)
        with pytest.raises(BrokerError) as refused:
            if in_place:
                producer.send_encoded(buffer, 1, "T9", attempt="att1", coordinator="broker-typo",
                                      broker_name="broker-a", topic=TOPIC)
            else:
                producer.send_encoded(buffer, 1, "T9", broker_name="broker-a", topic=TOPIC)
        assert refused.value.code is ResponseCode.INVALID_ARGUMENT
        assert "'broker-typo'" in refused.value.message and "broker-c" in refused.value.message
        with Admin(cluster.endpoint("broker-a")) as admin:
            assert admin.stats()["store_commit_log_max_offset"] == end  # nothing stored, not even a slice record
            assert admin.list_transactions("T9") == []
        halves(producer, "T10", "broker-a", [b"ok"], in_place)  # a coordinator the name servers list is taken
        with Admin(cluster.endpoint("broker-a")) as admin:
            assert [t.transaction_id for t in admin.list_transactions("T10")] == ["T10"]
