"""RocketMQ 5 clients against a cluster: every broker serves apache.rocketmq.v2 and answers QueryRoute with the
cluster's route from the name servers, so an official client given one broker's address reaches them all."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as v2s
from rocketmq.grpc_protocol import service_pb2_grpc as v2g

from broker.client import Admin
from broker.client.namesrv_client import NameServerClient
from tests.support.cluster import create_everywhere, make_cluster, route_brokers
from tests.support.waiting import wait_until


def test_query_route_answers_the_clusters_route_and_clients_use_every_broker(tmp_path: Path) -> None:
    with make_cluster(tmp_path, brokers=2) as cluster:
        topic = "Spread"
        create_everywhere(cluster, topic, queues=2)
        ns = NameServerClient([cluster.namesrv])
        wait_until(lambda: route_brokers(ns, topic) == {"broker-a", "broker-b"}, "both brokers in the route")
        entry = cluster.endpoint("broker-a")
        with grpc.insecure_channel(entry) as channel:
            r = v2g.MessagingServiceStub(channel).QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name=topic)),
                                                             metadata=(("x-mq-client-id", "c1"),), timeout=10)
        assert r.status.code == v2.OK
        by_broker: dict[str, set[str]] = {}
        for q in r.message_queues:
            a = q.broker.endpoints.addresses[0]
            by_broker.setdefault(q.broker.name, set()).add(f"{a.host}:{a.port}")
        assert by_broker == {"broker-a": {cluster.endpoint("broker-a")}, "broker-b": {cluster.endpoint("broker-b")}}
        config = ClientConfiguration(entry, Credentials(), request_timeout=10)  # one broker's address only
        producer = Producer(config, (topic,))
        producer.startup()
        try:
            ids = set()
            for i in range(20):
                m = Message()
                m.topic, m.body = topic, f"c{i}".encode()
                ids.add(producer.send(m).message_id)
        finally:
            producer.shutdown()
        for name in ("broker-a", "broker-b"):  # round-robin over the route: both brokers stored some
            with Admin(cluster.endpoint(name)) as admin:
                assert sum(hi for _, hi in admin.queue_offsets(topic).values()) > 0, name
        consumer = SimpleConsumer(config, "cluster-g", {topic: FilterExpression()}, await_duration=1)
        consumer.startup()
        got: set[str] = set()
        try:
            deadline = time.monotonic() + 60
            while got != ids and time.monotonic() < deadline:
                for m in consumer.receive(32, 20):
                    consumer.ack(m)
                    got.add(m.message_id)
        finally:
            consumer.shutdown()
        assert got == ids
