"""GET_ROUTEINFO_BY_TOPIC (105) answered by a broker for itself: the topic's queues on this broker.

RocketMQ's brokers leave routes to the name servers; RocketMQ 5's proxy answers this code on its own remoting
port, and so does a Sluice broker, so that a client given one broker's remoting address (Sluice's Python client,
``remoting://host:port``) learns the topic's queue counts without a name server, as its gRPC clients do with
GetTopicRoute. The body is ``TopicRouteData`` with this broker alone (``brokerAddrs`` empty: the caller already
holds the address it asked). ``autoCreate=true`` (Sluice's field) creates the topic first when the broker allows
auto-creation, as a gRPC GetTopicRoute with ``auto_create`` does; without it a missing topic is TOPIC_NOT_EXIST.
Route reads need no credentials (as on the name server), so a broker with ``--auth`` ignores ``autoCreate``: a
topic is made there by a caller whose rights were checked (UPDATE_AND_CREATE_TOPIC, or a gRPC call). For the same
reason it answers no route of a system topic: those are super users' (broker/auth/operations.py), read over gRPC.
"""

from __future__ import annotations

from broker.errors import NoPermissionError
from broker.format.system_topics import is_system_topic
from broker.remoting import fastjson
from broker.remoting import header_fields as f
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.handler import Handler
from broker.remoting.processor import Processor
from broker.server.broker_service import BrokerService

AUTO_CREATE = "autoCreate"


class BrokerRouteProcessor:
    def __init__(self, service: BrokerService, *, auto_create: bool = True, system_topics: bool = True) -> None:
        self.service = service
        self.auto_create = auto_create  # False under --auth (module docstring)
        self.system_topics = system_topics  # False under --auth (module docstring)

    def processors(self) -> dict[int, Processor]:
        return {RequestCode.GET_ROUTEINFO_BY_TOPIC: Handler(self.route)}

    def route(self, request: RemotingCommand) -> RemotingCommand:
        topic = f.text(request, "topic")
        if not self.system_topics and is_system_topic(topic):
            raise NoPermissionError(f"the route of system topic {topic!r} is for super users: ask over gRPC")
        config = self.service.admin.topic_route(topic, self.auto_create and f.boolean(request, AUTO_CREATE))
        cluster, name = self.service.identity
        body = {
            "brokerDatas": [{"cluster": cluster, "brokerName": name, "brokerAddrs": {}}],
            "queueDatas": [{"brokerName": name, "readQueueNums": config.read_queue_nums,
                            "writeQueueNums": config.write_queue_nums, "perm": config.perm, "topicSysFlag": 0}],
            "filterServerTable": {},
        }
        return request.response(WireCode.SUCCESS, body=fastjson.dumps(body, standard=True))
