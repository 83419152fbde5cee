"""Client membership over remoting: RocketMQ 4 clients' heartbeats, their leaving, and the consumer list a
rebalance reads, translated to the broker's own heartbeat path (``BrokerService.heartbeat``, which the gRPC front
calls too: the same checks, the same retry topic made for a clustering group, the same consumer table).

* ``HEART_BEAT`` (34): body ``HeartbeatData`` (``clientID``, ``consumerDataSet`` of ``groupName``,
  ``messageModel``, ``subscriptionDataSet`` of ``topic``, ``subString`` and ``expressionType``). Each consumer group
  is one heartbeat of that client; producers' groups (``producerDataSet``) record nothing yet. A subscription keeps
  its expression type (TAG, or SQL92), which filters the pulls of push consumers (they send no expression). A
  subscription to a group's own ``%RETRY%`` topic, which Java consumers list in every heartbeat, is the broker's to
  keep: it is not recorded as a subscription (the heartbeat of a clustering group makes the retry topic).
* ``UNREGISTER_CLIENT`` (35): ``clientID`` leaves ``consumerGroup`` (producers: nothing to forget).
* ``GET_CONSUMER_LIST_BY_GROUP`` (38): ``{"consumerIdList": [...]}``; a group with no live consumer is
  ``SYSTEM_ERROR``, as RocketMQ 4 brokers answer (clients then keep their current assignment).

Rights (with auth on): a heartbeat needs, for each consumer group it carries, what a gRPC heartbeat needs (Sub on
the group and each topic subscribed), all checked before any is recorded; leaving needs Sub on the group;
the consumer list Sub or Get on it (broker/auth/operations.py, asked by the operations this translates to). The
connection each heartbeat came on is recorded (consumer_channels.py) so that the group's clients are told when its
membership changes.
"""

from __future__ import annotations

from typing import Any

from broker.errors import InvalidArgumentError
from broker.format.system_topics import RETRY_GROUP_TOPIC_PREFIX
from broker.proto import sluice_pb2 as pb
from broker.remoting import fastjson
from broker.remoting import header_fields as f
from broker.remoting.admission import AsCaller
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.consumer_channels import ConsumerChannels
from broker.remoting.handler import ContextHandler, Handler
from broker.remoting.message_outcomes import Access
from broker.remoting.processor import Processor, RequestContext
from broker.server.broker_service import BrokerService

MODELS = {"CLUSTERING": pb.CLUSTERING, "BROADCASTING": pb.BROADCASTING}
EXPRESSION_TYPES = ("TAG", "SQL92")  # ExpressionType; an absent one is TAG


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidArgumentError(f"heartbeat: {what} is not a list")
    return value


class ClientProcessors:
    def __init__(self, service: BrokerService, access: Access | None = None) -> None:
        self.service = service
        self.access = access or Access(None)
        # Told of the group's changes by the consumer table once wired (BrokerController: add_listener).
        self.channels = ConsumerChannels(lambda group: service.consumers.consumer_ids(group)[0], self._leave)

    def processors(self) -> dict[int, Processor]:
        return {
            RequestCode.HEART_BEAT: AsCaller(ContextHandler(self.heartbeat), self.access),
            RequestCode.UNREGISTER_CLIENT: AsCaller(ContextHandler(self.unregister), self.access),
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: AsCaller(Handler(self.consumer_list), self.access),
        }

    def _leave(self, group: str, client_id: str) -> None:
        self.service.leave(group, client_id)

    def heartbeat(self, request: RemotingCommand, context: RequestContext) -> RemotingCommand:
        try:
            data = fastjson.loads(request.body)
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise InvalidArgumentError("heartbeat: the body is not HeartbeatData JSON") from None
        if not isinstance(data, dict):
            raise InvalidArgumentError("heartbeat: the body is not a HeartbeatData object")
        client_id = str(data.get("clientID") or "")
        beats: list[tuple[pb.HeartbeatRequest, dict[str, str]]] = []
        for consumer in _list(data.get("consumerDataSet"), "consumerDataSet"):
            if not isinstance(consumer, dict):
                raise InvalidArgumentError("heartbeat: a consumerDataSet entry is not an object")
            group = str(consumer.get("groupName") or "")
            model = MODELS.get(str(consumer.get("messageModel") or "CLUSTERING"))
            if model is None:
                raise InvalidArgumentError(f"heartbeat: messageModel {consumer.get('messageModel')!r} is unknown")
            subscriptions: dict[str, str] = {}
            types: dict[str, str] = {}
            for sub in _list(consumer.get("subscriptionDataSet"), "subscriptionDataSet"):
                if not isinstance(sub, dict):
                    raise InvalidArgumentError("heartbeat: a subscriptionDataSet entry is not an object")
                topic = str(sub.get("topic") or "")
                if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                    continue
                subscriptions[topic] = str(sub.get("subString") or "*")
                kind = str(sub.get("expressionType") or "TAG").upper()
                if kind not in EXPRESSION_TYPES:
                    raise InvalidArgumentError(f"heartbeat: expressionType {sub.get('expressionType')!r} is unknown")
                types[topic] = kind
            beats.append((pb.HeartbeatRequest(client_id=client_id, consumer_group=group, subscriptions=subscriptions,
                                              model=model), types))
        for beat, _ in beats:  # every group's rights, before any is recorded
            self.service.authorize_heartbeat(beat)
        for beat, types in beats:
            if beat.consumer_group:
                self.channels.joined(beat.consumer_group, client_id, context.peer)
            self.service.heartbeat(beat, types)
            if beat.consumer_group:
                self.channels.joined(beat.consumer_group, client_id, context.peer)  # again: a concurrent change
                # of the group may have dropped it before the table recorded it
        return request.response(WireCode.SUCCESS)

    def unregister(self, request: RemotingCommand, context: RequestContext) -> RemotingCommand:
        client_id = f.text(request, "clientID")
        group = f.optional_text(request, "consumerGroup")
        if group:
            self._leave(group, client_id)
        return request.response(WireCode.SUCCESS)

    def consumer_list(self, request: RemotingCommand) -> RemotingCommand:
        group = f.text(request, "consumerGroup")
        ids, _version = self.service.admin.consumer_ids(group)
        if not ids:
            return request.response(WireCode.SYSTEM_ERROR, remark=f"no consumer for this group, {group}")
        return request.response(WireCode.SUCCESS, body=fastjson.dumps({"consumerIdList": ids}, standard=True))
