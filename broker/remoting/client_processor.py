"""Client membership over remoting: RocketMQ 4 clients' heartbeats, their leaving, and the consumer list a
rebalance reads, translated to the broker's own heartbeat path (``BrokerService.heartbeat``, which the gRPC front
calls too: the same checks, the same retry topic made for a clustering group, the same consumer table).

* ``HEART_BEAT`` (34): body ``HeartbeatData`` (``clientID``, ``consumerDataSet`` of ``groupName``,
  ``messageModel``, ``subscriptionDataSet`` of ``topic`` and ``subString``). Each consumer group is one heartbeat
  of that client; producers' groups (``producerDataSet``) record nothing yet. A subscription to a group's own
  ``%RETRY%`` topic, which Java consumers list in every heartbeat, is the broker's to keep: it is not recorded as a
  subscription (the heartbeat of a clustering group makes the retry topic).
* ``UNREGISTER_CLIENT`` (35): ``clientID`` leaves ``consumerGroup`` (producers: nothing to forget).
* ``GET_CONSUMER_LIST_BY_GROUP`` (38): ``{"consumerIdList": [...]}``; a group with no live consumer is
  ``SYSTEM_ERROR``, as RocketMQ 4 brokers answer (clients then keep their current assignment).
"""

from __future__ import annotations

from typing import Any

from broker.errors import InvalidArgumentError
from broker.format.system_topics import RETRY_GROUP_TOPIC_PREFIX
from broker.proto import sluice_pb2 as pb
from broker.remoting import fastjson
from broker.remoting import header_fields as f
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.handler import Handler
from broker.remoting.processor import Processor
from broker.server.service import BrokerService

MODELS = {"CLUSTERING": pb.CLUSTERING, "BROADCASTING": pb.BROADCASTING}


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidArgumentError(f"heartbeat: {what} is not a list")
    return value


class ClientProcessors:
    def __init__(self, service: BrokerService) -> None:
        self.service = service

    def processors(self) -> dict[int, Processor]:
        return {
            RequestCode.HEART_BEAT: Handler(self.heartbeat),
            RequestCode.UNREGISTER_CLIENT: Handler(self.unregister),
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: Handler(self.consumer_list),
        }

    def heartbeat(self, request: RemotingCommand) -> RemotingCommand:
        try:
            data = fastjson.loads(request.body)
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise InvalidArgumentError("heartbeat: the body is not HeartbeatData JSON") from None
        if not isinstance(data, dict):
            raise InvalidArgumentError("heartbeat: the body is not a HeartbeatData object")
        client_id = str(data.get("clientID") or "")
        beats = []
        for consumer in _list(data.get("consumerDataSet"), "consumerDataSet"):
            if not isinstance(consumer, dict):
                raise InvalidArgumentError("heartbeat: a consumerDataSet entry is not an object")
            group = str(consumer.get("groupName") or "")
            model = MODELS.get(str(consumer.get("messageModel") or "CLUSTERING"))
            if model is None:
                raise InvalidArgumentError(f"heartbeat: messageModel {consumer.get('messageModel')!r} is unknown")
            subscriptions: dict[str, str] = {}
            for sub in _list(consumer.get("subscriptionDataSet"), "subscriptionDataSet"):
                if not isinstance(sub, dict):
                    raise InvalidArgumentError("heartbeat: a subscriptionDataSet entry is not an object")
                topic = str(sub.get("topic") or "")
                if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                    continue
                subscriptions[topic] = str(sub.get("subString") or "*")
            beats.append(pb.HeartbeatRequest(client_id=client_id, consumer_group=group, subscriptions=subscriptions,
                                             model=model))  # fmt: skip
        for beat in beats:
            self.service.heartbeat(beat)
        return request.response(ResponseCode.SUCCESS)

    def unregister(self, request: RemotingCommand) -> RemotingCommand:
        client_id = f.text(request, "clientID")
        group = f.optional_text(request, "consumerGroup")
        if group:
            self.service.heartbeat(pb.HeartbeatRequest(client_id=client_id, consumer_group=group, unregister=True))
        return request.response(ResponseCode.SUCCESS)

    def consumer_list(self, request: RemotingCommand) -> RemotingCommand:
        group = f.text(request, "consumerGroup")
        ids, _version = self.service.consumers.consumer_ids(group)
        if not ids:
            return request.response(ResponseCode.SYSTEM_ERROR, remark=f"no consumer for this group, {group}")
        return request.response(ResponseCode.SUCCESS, body=fastjson.dumps({"consumerIdList": ids}, standard=True))
