"""``mqadmin``'s consumer-group codes over remoting, translated to the broker's own: the subscription groups of the
retry processor, the consumer table, consumer lag and offset resets of ``AdminProcessor`` (what the gRPC front's
UpdateSubscriptionGroup, GetConsumerList, GetConsumerLag and ResetConsumerOffsets call).

=================================== ==== =========================================== ===============================
code                                 no.  request                                     answer
=================================== ==== =========================================== ===============================
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP  200  body SubscriptionGroupConfig                nothing
GET_CONSUMER_CONNECTION_LIST         203  consumerGroup                               ConsumerConnection;
                                                                                      CONSUMER_NOT_ONLINE if none
GET_CONSUME_STATS                    208  consumerGroup, topic (optional)             ConsumeStats
INVOKE_BROKER_TO_RESET_OFFSET        222  topic, group, timestamp (-1: the end),      ResetOffsetBody
                                          isForce
=================================== ==== =========================================== ===============================

What differs from RocketMQ (docs/remoting.md):

* SubscriptionGroupConfig: ``consumeEnable``, ``consumeFromMinEnable``, ``consumeBroadcastEnable``,
  ``retryQueueNums``, ``retryMaxTimes`` and ``consumeMessageOrderly`` are applied (those present in the body);
  ``brokerId``, ``whichBrokerWhenConsumeSlowly``, ``notifyConsumerIdsChangedEnable`` and the rest are ignored.
* ConsumerConnection: Sluice's consumer table keeps each consumer's client id, subscriptions and message model, not
  its connection: ``clientAddr`` is the address part of the client id (a 4.x client id is ``ip@instance``),
  ``language`` OTHER, ``version`` 0, ``consumeType`` CONSUME_PASSIVELY and ``consumeFromWhere``
  CONSUME_FROM_LAST_OFFSET (their defaults), ``subVersion`` 0. A group whose consumers have different models shows
  the first one's.
* ConsumeStats: a queue without a committed offset shows ``consumerOffset`` 0 (as RocketMQ), ``lastTimestamp`` and
  ``consumeTps`` are 0 (not tracked). A group the broker knows nothing of is SUBSCRIPTION_GROUP_NOT_EXIST.
* Resetting by time sets the group's committed offsets in the broker, all queues of the topic at once, and only
  while the group has no live consumer (NO_PERMISSION otherwise, nothing changed): Sluice's consumers, gRPC or
  remoting, keep their offsets in memory and would commit over a reset, and the broker does not call
  RESET_CONSUMER_CLIENT_OFFSET on clients. Stop the group's consumers, reset, start them. ``isForce`` false keeps a
  queue's committed offset where it is already before the time's offset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.errors import BrokerError, InvalidArgumentError, ResponseCode, ServiceNotAvailableError
from broker.proto import sluice_pb2 as pb
from broker.remoting import fastjson
from broker.remoting import header_fields as f
from broker.remoting.admin_bodies import ClientConnection, Queue, consume_stats, consumer_connection, reset_offset_body
from broker.remoting.admin_handler import Guarded
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_outcomes import Access
from broker.remoting.processor import Processor
from broker.server.broker_service import BrokerService
from broker.server.retry_processor import GROUP_SETTINGS

# SubscriptionGroupConfig's fields Sluice keeps -> UpdateSubscriptionGroupRequest's (bool or int)
GROUP_FIELDS = {
    "consumeEnable": ("consume_enable", bool),
    "consumeFromMinEnable": ("consume_from_min_enable", bool),
    "consumeBroadcastEnable": ("consume_broadcast_enable", bool),
    "retryQueueNums": ("retry_queue_nums", int),
    "retryMaxTimes": ("retry_max_times", int),
    "consumeMessageOrderly": ("consume_message_orderly", bool),
}
LAST_TIME = -1  # ResetOffsetRequestHeader.timestamp meaning "the end of each queue" (RocketMQ's reset to latest)


@dataclass(frozen=True)
class GroupRequest:
    consumer_group: str
    topic: str = ""


@dataclass(frozen=True)
class ResetRequest:
    consumer_group: str
    topic: str
    timestamp: int
    force: bool


def parse_group(request: RemotingCommand) -> GroupRequest:
    return GroupRequest(f.text(request, "consumerGroup"), f.optional_text(request, "topic"))


def parse_reset(request: RemotingCommand) -> ResetRequest:
    return ResetRequest(f.text(request, "group"), f.text(request, "topic"), f.int64(request, "timestamp"),
                        f.boolean(request, "isForce"))


def parse_group_config(request: RemotingCommand) -> pb.UpdateSubscriptionGroupRequest:
    try:
        data = fastjson.loads(request.body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InvalidArgumentError("the body is not SubscriptionGroupConfig JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("groupName"), str) or not data["groupName"]:
        raise InvalidArgumentError("the body is not a SubscriptionGroupConfig with a groupName")
    changes: dict[str, Any] = {}
    for name, (field, kind) in GROUP_FIELDS.items():
        value = data.get(name)
        if value is None:
            continue
        if kind is bool and not isinstance(value, bool):
            raise InvalidArgumentError(f"SubscriptionGroupConfig.{name} is not a boolean")
        if kind is int and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31):
            raise InvalidArgumentError(f"SubscriptionGroupConfig.{name} is not an int")
        changes[field] = value
    return pb.UpdateSubscriptionGroupRequest(consumer_group=data["groupName"], **changes)


def _client_addr(client_id: str) -> str:
    return client_id.partition("@")[0] if "@" in client_id else ""


class GroupAdminProcessors:
    def __init__(self, service: BrokerService, access: Access, broker_name: str) -> None:
        self.service, self.access, self.broker_name = service, access, broker_name
        self.admin = service.admin

    def processors(self) -> dict[int, Processor]:
        a = self.access
        return {
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: Guarded(
                a, "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP", parse_group_config, self.update_group
            ),
            RequestCode.GET_CONSUMER_CONNECTION_LIST: Guarded(
                a, "GET_CONSUMER_CONNECTION_LIST", parse_group, self.connections
            ),
            RequestCode.GET_CONSUME_STATS: Guarded(a, "GET_CONSUME_STATS", parse_group, self.consume_stats),
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: Guarded(
                a, "INVOKE_BROKER_TO_RESET_OFFSET", parse_reset, self.reset_offset
            ),
        }

    def update_group(self, request: RemotingCommand, req: pb.UpdateSubscriptionGroupRequest) -> RemotingCommand:
        if self.service.retries is None:
            raise ServiceNotAvailableError("subscription groups are not enabled on this broker")
        changes = {name: getattr(req, name) for name in GROUP_SETTINGS if req.HasField(name)}
        self.service.retries.update_group(req.consumer_group, changes)
        return request.response(WireCode.SUCCESS)

    def connections(self, request: RemotingCommand, req: GroupRequest) -> RemotingCommand:
        members = self.admin.group_members(req.consumer_group)
        if not members:
            raise BrokerError(f"the consumer group {req.consumer_group} is not online",
                              ResponseCode.CONSUMER_NOT_ONLINE)
        subscriptions: dict[str, str] = {}
        for m in members:
            for topic, expression in m.subscriptions.items():
                subscriptions.setdefault(topic, expression)
        body = consumer_connection(
            [ClientConnection(m.client_id, _client_addr(m.client_id)) for m in members], subscriptions,
            model=members[0].model, consume_type="CONSUME_PASSIVELY", consume_from_where="CONSUME_FROM_LAST_OFFSET",
        )
        return request.response(WireCode.SUCCESS, body=body)

    def consume_stats(self, request: RemotingCommand, req: GroupRequest) -> RemotingCommand:
        lags = self.admin.consumer_lag(req.consumer_group, req.topic)
        body = consume_stats((Queue(x.topic, self.broker_name, x.queue_id), x.broker_offset,
                              max(x.consumer_offset, 0), 0) for x in lags)
        return request.response(WireCode.SUCCESS, body=body)

    def reset_offset(self, request: RemotingCommand, req: ResetRequest) -> RemotingCommand:
        offsets = self.admin.reset_to_time(req.consumer_group, req.topic,
                                           None if req.timestamp == LAST_TIME else req.timestamp, req.force)
        body = reset_offset_body((Queue(t, self.broker_name, q), o) for (t, q), o in offsets.items())
        return request.response(WireCode.SUCCESS, body=body)
