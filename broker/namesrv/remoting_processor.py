"""The name server's answers over RocketMQ's remoting protocol (broker/remoting), for RocketMQ 4 clients and
``mqadmin``: the same route table the gRPC servicer reads.

* ``GET_ROUTEINFO_BY_TOPIC`` (105): ``TopicRouteData`` as RocketMQ writes it: ``brokerDatas`` (``cluster``,
  ``brokerName``, ``brokerAddrs`` by broker id), ``queueDatas`` (``brokerName``, ``perm``, ``readQueueNums``,
  ``writeQueueNums``, ``topicSysFlag``) and an empty ``filterServerTable``; integer keys bare or quoted by the
  request's version (broker/remoting/fastjson.py); ``TOPIC_NOT_EXIST`` when no live broker holds the topic.
  Addresses are the brokers' *remoting* addresses (what a remoting client can talk to): a broker that registered
  none is left out, and a topic only such brokers hold is ``TOPIC_NOT_EXIST`` here.
* ``GET_BROKER_CLUSTER_INFO`` (106): ``brokerAddrTable`` and ``clusterAddrTable`` of the brokers with a remoting
  address.
* ``GET_ALL_TOPIC_LIST_FROM_NAMESERVER`` (206): ``{"topicList": [...]}``.
* ``DELETE_TOPIC_IN_NAMESRV`` (216): ``mqadmin deleteTopic`` sends it after deleting the topic in the brokers, whose
  deletion already re-registered them without it (a topic change wakes the registrar at once). A name server that
  takes anonymous registrations (no root user) drops the topic from every route, as RocketMQ's does; one that
  authenticates registrations changes nothing, since this port checks no credentials and a route write from it
  would let anyone hide a topic its brokers still hold. SUCCESS either way, as RocketMQ answers.
* ``GET_KV_CONFIG`` (101): Sluice keeps no name-server KV configuration, so every key is RocketMQ's "not found"
  (``QUERY_NOT_FOUND``), which clients take as "no value".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.namesrv.route_table import RouteTable
from broker.remoting import fastjson
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.handler import Handler
from broker.remoting.processor import Processor


def _broker_data(cluster: str, name: str, addrs: dict[int, str]) -> dict[str, Any]:
    return {"cluster": cluster, "brokerName": name, "brokerAddrs": dict(addrs)}


def _json(body: dict[str, Any], request: RemotingCommand) -> bytes:
    """Integer keys bare or quoted, as the request's version asks (broker/remoting/fastjson.py)."""
    return fastjson.dumps(body, standard=fastjson.wants_standard_json(request))


class NameServerRemoting:
    def __init__(self, table: RouteTable, clock_ms: Callable[[], int], *, open_routes: bool = False) -> None:
        """``open_routes``: registrations are not authenticated, so a route change from this port opens nothing."""
        self.table = table
        self.clock_ms = clock_ms
        self.open_routes = open_routes

    def processors(self) -> dict[int, Processor]:
        return {
            RequestCode.GET_ROUTEINFO_BY_TOPIC: Handler(self.route),
            RequestCode.GET_BROKER_CLUSTER_INFO: Handler(self.cluster_info),
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: Handler(self.topic_list),
            RequestCode.GET_KV_CONFIG: Handler(self.kv_config),
            RequestCode.DELETE_TOPIC_IN_NAMESRV: Handler(self.delete_topic),
        }

    def route(self, request: RemotingCommand) -> RemotingCommand:
        topic = request.ext_fields.get("topic", "")
        route = self.table.route(topic, self.clock_ms())
        names = sorted(name for name in route.queues if name in route.remoting)
        if not names:
            return request.response(WireCode.TOPIC_NOT_EXIST,
                                    remark=f"No topic route info in name server for the topic: {topic}")
        body = {
            "brokerDatas": [_broker_data(route.brokers[n][0], n, route.remoting[n]) for n in names],
            "queueDatas": [
                {"brokerName": n, "readQueueNums": route.queues[n].read_queue_nums,
                 "writeQueueNums": route.queues[n].write_queue_nums, "perm": route.queues[n].perm, "topicSysFlag": 0}
                for n in names
            ],
            "filterServerTable": {},
        }
        return request.response(WireCode.SUCCESS, body=_json(body, request))

    def cluster_info(self, request: RemotingCommand) -> RemotingCommand:
        groups: dict[str, dict[str, Any]] = {}
        clusters: dict[str, list[str]] = {}
        for summary in self.table.brokers(self.clock_ms()):
            b = summary.live
            if not b.remoting_address:
                continue
            data = groups.setdefault(b.broker_name, _broker_data(b.cluster, b.broker_name, {}))
            data["brokerAddrs"][b.broker_id] = b.remoting_address
            members = clusters.setdefault(b.cluster, [])
            if b.broker_name not in members:
                members.append(b.broker_name)
        body = {"brokerAddrTable": groups, "clusterAddrTable": clusters}
        return request.response(WireCode.SUCCESS, body=_json(body, request))

    def topic_list(self, request: RemotingCommand) -> RemotingCommand:
        body = {"topicList": self.table.topic_names(self.clock_ms())}
        return request.response(WireCode.SUCCESS, body=fastjson.dumps(body, standard=True))

    def delete_topic(self, request: RemotingCommand) -> RemotingCommand:
        if self.open_routes:
            self.table.delete_topic(request.ext_fields.get("topic", ""))
        return request.response(WireCode.SUCCESS)

    def kv_config(self, request: RemotingCommand) -> RemotingCommand:
        namespace, key = request.ext_fields.get("namespace", ""), request.ext_fields.get("key", "")
        return request.response(WireCode.QUERY_NOT_FOUND,
                                remark=f"No config item, Namespace: {namespace} Key: {key}")
