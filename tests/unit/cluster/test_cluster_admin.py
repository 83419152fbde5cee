"""Admin over a cluster of real processes (a name server and three brokers on port 0): cluster list, topic create on
a cluster and on one broker, delete across brokers, lag summed over brokers, transactions, queries and stats per
broker, metrics labels, and bad input (unknown names, topics without a route, a name server that is down)."""

from __future__ import annotations

import json
import shutil
import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest
from cluster_util import FAST, Sink, route_brokers, shared_cluster

from broker.client import (
    Admin,
    BrokerQueueLag,
    BrokerTopicInfo,
    BrokerTransactionInfo,
    ClusterTopicInfo,
    Message,
    Producer,
    PullConsumer,
    PushConsumer,
    encode_message,
)
from broker.client.route import MessageQueue
from broker.errors import (
    BrokerUnreachableError,
    InvalidArgumentError,
    QueryNotFoundError,
    ResponseCode,
    SubscriptionGroupNotExistError,
    TopicExistsError,
    TopicNotExistError,
)
from broker.namesrv.local_cluster import LocalCluster
from tests.support.waiting import wait_until

BROKERS = ["broker-a", "broker-b", "broker-c"]
ALL = set(BROKERS)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One cluster for the module (every test uses topics and groups of its own), each broker serving metrics."""
    root = tmp_path_factory.mktemp("admin")
    with shared_cluster(root, extra_broker_args=["--metrics-port", "0"]) as c:
        yield c
    shutil.rmtree(root)  # three preallocated stores: tmp_path_retention_policy only removes function-scoped dirs


def holds(cluster: LocalCluster, broker: str, topic: str) -> int | None:
    """The read queue count ``broker`` itself reports for ``topic`` (None: it does not hold it)."""
    with Admin(cluster.endpoint(broker)) as one:
        try:
            return one.topic_info(topic).read_queue_nums
        except TopicNotExistError:
            return None


def test_cluster_info_lists_every_broker_with_address_role_and_put_rate(shared: LocalCluster) -> None:
    with Admin(namesrv=shared.namesrv) as admin, Producer(namesrv=shared.namesrv) as p:
        info = admin.cluster_info()
        by_name = {b.broker_name: b for b in info.brokers}
        assert sorted(by_name) == BROKERS
        now_ms = time.time() * 1000
        for name, b in by_name.items():
            assert (b.cluster, b.broker_id, b.role) == ("DefaultCluster", 0, "MASTER")
            assert b.address == f"127.0.0.1:{shared.brokers[name].port}"
            assert now_ms - 60_000 < b.last_update_ms <= now_ms + 1000  # a registration within the last minute
        data = json.loads(json.dumps(info.as_json()))
        assert list(data) == ["brokers"] and len(data["brokers"]) == 3
        assert {"cluster", "broker_name", "broker_id", "address", "role", "last_update_ms", "put_messages_per_s",
                "topic_count"} <= set(data["brokers"][0])
        admin.create_topic("AdmRate", 1, broker="broker-b")
        wait_until(lambda: route_brokers(shared.namesrv, "AdmRate") == {"broker-b"}, "AdmRate routed")
        busy = MessageQueue("AdmRate", "broker-b", 0)

        def b_reports_puts() -> bool:
            p.send_batch([Message("AdmRate", b"x")] * 20, queue=busy)  # puts in every registration interval
            rates = {b.broker_name: b.put_messages_per_s for b in admin.cluster_info().brokers}
            return rates["broker-b"] > 0

        wait_until(b_reports_puts, "broker-b's put rate in its registration")


def test_create_on_a_cluster_or_on_one_broker(shared: LocalCluster) -> None:
    with Admin(namesrv=shared.namesrv) as admin:
        everywhere = admin.create_topic("AdmAll", 4, cluster="DefaultCluster")
        assert isinstance(everywhere, ClusterTopicInfo)
        assert (everywhere.read_queue_nums, everywhere.write_queue_nums, everywhere.perm) == (12, 12, 6)
        assert [(b.broker_name, b.cluster, b.read_queue_nums) for b in everywhere.brokers] == [
            (name, "DefaultCluster", 4) for name in BROKERS
        ]
        assert all(holds(shared, name, "AdmAll") == 4 for name in BROKERS)
        one = admin.create_topic("AdmOne", 2, broker="broker-b")
        assert isinstance(one, BrokerTopicInfo) and (one.broker_name, one.read_queue_nums) == ("broker-b", 2)
        assert [holds(shared, name, "AdmOne") for name in BROKERS] == [None, 2, None]
        defaulted = admin.create_topic("AdmOnly", 1)  # one cluster known: that one
        assert [b.broker_name for b in defaulted.brokers] == BROKERS  # type: ignore[attr-defined]
        wait_until(lambda: route_brokers(shared.namesrv, "AdmAll") == ALL, "AdmAll routed on every broker")
        wait_until(lambda: route_brokers(shared.namesrv, "AdmOne") == {"broker-b"}, "AdmOne routed on b")

        with pytest.raises(TopicExistsError, match="already exists on broker-a, broker-b, broker-c") as exists:
            admin.create_topic("AdmAll", 8, cluster="DefaultCluster")
        assert exists.value.code is ResponseCode.TOPIC_EXIST_ALREADY
        with pytest.raises(TopicExistsError, match="broker-b; nothing was created"):
            admin.create_topic("AdmOne", 3, cluster="DefaultCluster")
        assert [holds(shared, name, "AdmOne") for name in BROKERS] == [None, 2, None]  # a and c untouched
        grown = admin.create_topic("AdmOne", 3, cluster="DefaultCluster", if_not_exists=True)
        assert [(b.broker_name, b.read_queue_nums) for b in grown.brokers] == [  # type: ignore[attr-defined]
            ("broker-a", 3), ("broker-b", 2), ("broker-c", 3)
        ]
        assert grown.read_queue_nums == 8
        wait_until(lambda: route_brokers(shared.namesrv, "AdmOne") == ALL, "AdmOne routed on every broker")
        info = admin.topic_info("AdmOne")
        assert isinstance(info, ClusterTopicInfo) and info.read_queue_nums == 8
        listed = [t for t in admin.list_topics() if t.topic == "AdmOne"]
        assert [(t.broker_name, t.read_queue_nums) for t in listed if isinstance(t, BrokerTopicInfo)] == [
            ("broker-a", 3), ("broker-b", 2), ("broker-c", 3)
        ]


def test_unknown_names_and_missing_routes_are_clear_errors_that_change_nothing(shared: LocalCluster) -> None:
    with Admin(namesrv=shared.namesrv) as admin:
        with pytest.raises(InvalidArgumentError, match=r"cluster 'Nope' has no live master.*\['DefaultCluster'\]") as e:
            admin.create_topic("AdmBad", 4, cluster="Nope")
        assert e.value.code is ResponseCode.INVALID_ARGUMENT
        with pytest.raises(InvalidArgumentError, match=r"broker 'broker-z' is not a live master.*'broker-a'"):
            admin.create_topic("AdmBad", 4, broker="broker-z")
        with pytest.raises(InvalidArgumentError, match="not both"):
            admin.create_topic("AdmBad", 4, cluster="DefaultCluster", broker="broker-a")
        with pytest.raises(InvalidArgumentError, match="broker 'broker-z'"):
            admin.update_subscription_group("adm-bad", retry_max_times=3, broker="broker-z")
        assert [holds(shared, name, "AdmBad") for name in BROKERS] == [None, None, None]

        for call in (lambda: admin.topic_info("NoRoute"), lambda: admin.describe_topic("NoRoute"),
                     lambda: admin.delete_topic("NoRoute"), lambda: admin.queue_offsets("NoRoute")):
            with pytest.raises(TopicNotExistError, match="NoRoute") as missing:
                call()
            assert missing.value.code is ResponseCode.TOPIC_NOT_EXIST
    with PullConsumer(namesrv=shared.namesrv) as consumer, pytest.raises(TopicNotExistError, match="NoRoute"):
        consumer.fetch_queues("NoRoute")
    with Admin(shared.endpoint("broker-a")) as one, pytest.raises(InvalidArgumentError, match="namesrv="):
        one.create_topic("AdmBad", 4, cluster="DefaultCluster")


def test_delete_removes_the_topic_from_every_broker_that_holds_it(shared: LocalCluster) -> None:
    with Admin(namesrv=shared.namesrv) as admin, Producer(namesrv=shared.namesrv) as p:
        admin.create_topic("AdmDel", 2, cluster="DefaultCluster")
        admin.create_topic("AdmDelOne", 2, broker="broker-c")
        wait_until(lambda: route_brokers(shared.namesrv, "AdmDel") == ALL, "AdmDel routed")
        for name in BROKERS:
            p.send(Message("AdmDel", name.encode()), queue=MessageQueue("AdmDel", name, 0))
        assert admin.delete_topic("AdmDel") == BROKERS
        assert [holds(shared, name, "AdmDel") for name in BROKERS] == [None, None, None]
        wait_until(lambda: route_brokers(shared.namesrv, "AdmDel") == set(), "AdmDel's route gone")
        with pytest.raises(TopicNotExistError, match="AdmDel"):
            admin.delete_topic("AdmDel")
        with pytest.raises(TopicNotExistError, match="broker-a"):
            admin.delete_topic("AdmDelOne", broker="broker-a")
        assert admin.delete_topic("AdmDelOne") == ["broker-c"]
        assert holds(shared, "broker-c", "AdmDelOne") is None


def test_lag_offsets_and_describe_span_the_brokers(shared: LocalCluster) -> None:
    sent = {("broker-a", 0): 5, ("broker-b", 1): 7, ("broker-c", 0): 3}
    committed = {("broker-a", 0): 2, ("broker-b", 1): 7, ("broker-c", 0): 0}
    with Admin(namesrv=shared.namesrv) as admin, Producer(namesrv=shared.namesrv) as p:
        admin.create_topic("AdmLag", 2, cluster="DefaultCluster")
        wait_until(lambda: route_brokers(shared.namesrv, "AdmLag") == ALL, "AdmLag routed")
        for (name, q), n in sent.items():
            p.send_batch([Message("AdmLag", f"{name}-{i}".encode()) for i in range(n)],
                         queue=MessageQueue("AdmLag", name, q))
        expected_ranges = {(name, q): (0, sent.get((name, q), 0)) for name in BROKERS for q in (0, 1)}
        wait_until(lambda: admin.queue_offsets("AdmLag") == expected_ranges, "every send dispatched")
        with PullConsumer(namesrv=shared.namesrv, group="adm-lag") as consumer:
            consumer.commit_offsets({MessageQueue("AdmLag", name, q): o for (name, q), o in committed.items()})
        assert admin.committed_offsets("adm-lag", "AdmLag") == committed

        lag = admin.group_lag("adm-lag", "AdmLag")
        assert lag.total_lag == 3 + 0 + 3 and lag.complete
        assert {b.broker_name: b.lag for b in lag.brokers} == {"broker-a": 3, "broker-b": 0, "broker-c": 3}
        rows = admin.consumer_lag("adm-lag", "AdmLag")
        assert all(isinstance(r, BrokerQueueLag) for r in rows) and len(rows) == 6
        assert {(r.broker_name, r.queue_id): r.lag for r in rows if isinstance(r, BrokerQueueLag) and r.lag} == {
            ("broker-a", 0): 3, ("broker-c", 0): 3
        }
        assert admin.group_lag("adm-lag").total_lag == 6  # every topic of the group, from every master
        shown = json.loads(json.dumps(lag.as_json()))
        assert shown["total_lag"] == 6 and [b["broker_name"] for b in shown["brokers"]] == BROKERS
        assert shown["brokers"][0]["queues"][0] == {
            "topic": "AdmLag", "queue_id": 0, "broker_offset": 5, "consumer_offset": 2, "lag": 3,
            "broker_name": "broker-a",
        }
        described = admin.describe_topic("AdmLag").as_json()
        assert [(b["broker_name"], b["read_queue_nums"], b["error"]) for b in described["brokers"]] == [
            (name, 2, "") for name in BROKERS
        ]
        assert described["brokers"][1]["queues"][1] == {"queue_id": 1, "min_offset": 0, "max_offset": 7}
        with pytest.raises(SubscriptionGroupNotExistError, match=r"adm-lag-nobody.*any broker"):
            admin.group_lag("adm-lag-nobody", "AdmLag")


def test_transactions_are_listed_and_ended_on_every_broker_holding_halves(shared: LocalCluster) -> None:
    with Admin(namesrv=shared.namesrv) as admin, Producer(namesrv=shared.namesrv) as p:
        admin.create_topic("AdmTx", 1, cluster="DefaultCluster")
        wait_until(lambda: route_brokers(shared.namesrv, "AdmTx") == ALL, "AdmTx routed")
        entry = encode_message(Message("AdmTx", b"half"), 0)
        for txn, brokers in (("ADMTX-1", ["broker-a", "broker-c"]), ("ADMTX-2", ["broker-b"])):
            for name in brokers:
                p.send_encoded(entry, 1, txn, broker_name=name, topic="AdmTx")
        listed = admin.list_transactions("ADMTX-")
        assert [(t.transaction_id, t.broker_name, t.status) for t in listed if isinstance(t, BrokerTransactionInfo)
                ] == [("ADMTX-1", "broker-a", "OPEN"), ("ADMTX-1", "broker-c", "OPEN"),
                      ("ADMTX-2", "broker-b", "OPEN")]
        with pytest.raises(InvalidArgumentError, match="halves on 2 brokers"):
            admin.end_transaction("ADMTX-1", True, expected_messages=2)
        assert admin.end_transaction("ADMTX-1", True) == "COMMITTED"
        assert admin.end_transactions("ADMTX-", False) == {"ADMTX-2": "ROLLED_BACK"}
        # broker-b's rolled-back row keeps its offset, and readers skip it
        offsets = {("broker-a", 0): (0, 1), ("broker-b", 0): (0, 1), ("broker-c", 0): (0, 1)}
        wait_until(lambda: admin.queue_offsets("AdmTx") == offsets, "the transactions ended")
        with PullConsumer(namesrv=shared.namesrv, group="admtx-reader") as consumer:
            shown = {mq.broker_name: len(consumer.pull(mq, 0).messages) for mq in consumer.queue_ranges("AdmTx")}
        assert shown == {"broker-a": 1, "broker-b": 0, "broker-c": 1}, "the commit visible on a and c only"
        with pytest.raises(QueryNotFoundError, match="ADMTX-3"):
            admin.end_transaction("ADMTX-3", True)


def test_queries_and_stats_reach_every_broker(shared: LocalCluster) -> None:
    with Admin(namesrv=shared.namesrv) as admin, Producer(namesrv=shared.namesrv) as p:
        admin.create_topic("AdmQuery", 1, cluster="DefaultCluster")
        wait_until(lambda: route_brokers(shared.namesrv, "AdmQuery") == ALL, "AdmQuery routed")
        results = {name: p.send(Message("AdmQuery", name.encode(), keys="k"), queue=MessageQueue("AdmQuery", name, 0))
                   for name in BROKERS}
        wait_until(lambda: len(admin.query_by_key("AdmQuery", "k")) == 3, "the key indexed on every broker")
        assert sorted(m.body for m in admin.query_by_key("AdmQuery", "k")) == [b.encode() for b in BROKERS]
        for name, result in results.items():
            assert admin.view_message(result.msg_id).body == name.encode()
        with pytest.raises(QueryNotFoundError):
            admin.view_message(results["broker-a"].msg_id[:-4] + "FFFF")
        stats = admin.stats_by_broker()
        assert sorted(stats) == BROKERS and all(s["broker_put_messages"] >= 1 for s in stats.values())
        assert admin.stats(broker="broker-b")["topics"] >= 1
        with pytest.raises(InvalidArgumentError, match="name the broker"):
            admin.stats()


def scrape(port: int | None) -> str:
    assert port is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def test_every_metric_series_names_its_cluster_and_broker(shared: LocalCluster) -> None:
    with Producer(namesrv=shared.namesrv) as p, Admin(namesrv=shared.namesrv) as admin:
        admin.create_topic("AdmMetrics", 1, cluster="DefaultCluster")
        wait_until(lambda: route_brokers(shared.namesrv, "AdmMetrics") == ALL, "AdmMetrics routed")
        p.send_batch([Message("AdmMetrics", b"m")] * 3, queue=MessageQueue("AdmMetrics", "broker-c", 0))
    for name in BROKERS:
        text = scrape(shared.brokers[name].metrics_port)
        ours = f'cluster="DefaultCluster",broker="{name}"'
        series = [line for line in text.splitlines() if line and not line.startswith("#")]
        unlabelled = [line for line in series if not line.split("{", 1)[-1].startswith(ours)]
        assert series and not unlabelled, f"{name}: series without its cluster and broker: {unlabelled[:3]}"
        max_offset = 3 if name == "broker-c" else 0
        assert f'sluice_queue_max_offset{{{ours},topic="AdmMetrics",queue="0"}} {max_offset}' in text
        puts = next(line for line in series if line.startswith(f"sluice_put_messages_total{{{ours}}} "))
        assert float(puts.rsplit(" ", 1)[1]) >= max_offset


def dead_address() -> str:
    """HOST:PORT where nothing listens (a name server that is down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_name_server_that_is_down_is_a_clear_error() -> None:
    down = dead_address()
    with Admin(namesrv=down) as admin:
        for call in (admin.cluster_info, lambda: admin.create_topic("T", 1), lambda: admin.topic_info("T")):
            with pytest.raises(BrokerUnreachableError, match=f"no name server answered.*{down}") as e:
                call()
            assert e.value.code is ResponseCode.SERVICE_NOT_AVAILABLE
    with PullConsumer(namesrv=down) as consumer, pytest.raises(BrokerUnreachableError, match="no name server"):
        consumer.fetch_queues("T")
    consumer_ = PushConsumer(None, "down-g", {"T": "*"}, Sink(), namesrv=down, **FAST)
    with pytest.raises(BrokerUnreachableError, match="check --namesrv"):
        consumer_.start()
