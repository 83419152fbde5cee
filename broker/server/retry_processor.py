"""Consumer-side operations every front calls: send-back (retry / dead letters), subscription groups, pull
admission. Protocol-neutral: the fronts translate their requests into SendBack and group changes, and back.

* ``%RETRY%{group}`` is created (with the group's retryQueueNums) when a clustering consumer of the group sends a
  heartbeat, as RocketMQ's broker does, so a PushConsumer can subscribe to it before anything failed.
* ``admit_pull``: a group with consumeEnable=false may not pull; ``%DLQ%`` topics are never redelivered, so pulls
  on them are refused unless the broker runs with ``dlq_pull_enable`` (an administrator's choice).
* SQL92 selectors are compiled (cached) at pull time; a bad one is refused with the column of the error.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from broker.auth.operations import Operation, authorize
from broker.errors import BrokerError, InvalidArgumentError, ResponseCode, shown
from broker.filter.sql92 import SqlFilter, compile_sql92
from broker.format.system_topics import DLQ_GROUP_TOPIC_PREFIX, retry_topic
from broker.semantics import RetryService, SubscriptionGroupConfig, SubscriptionGroupManager
from broker.semantics.retry import SendBackResult
from broker.server.consumer_offsets import validate_group
from broker.server.send_processor import raise_for_put
from broker.server.topic_config import TopicConfigManager

log = logging.getLogger(__name__)

TAG, SQL92 = "TAG", "SQL92"
# ORIGIN_MESSAGE_ID is kept in the copy's properties: the id of the first message (RocketMQ's are 32 hex
# characters; a producer may have set its own value, which the client passes on).
MAX_ORIGIN_MSG_ID_CHARS = 1024


def _check_origin_msg_id(origin: str) -> None:
    """A send-back's origin_msg_id becomes a property value: no separator bytes, bounded. Such a request was
    answered INTERNAL "should retry" (its copy could not be stored), for ever."""
    if len(origin) > MAX_ORIGIN_MSG_ID_CHARS or "\x01" in origin or "\x02" in origin:
        raise InvalidArgumentError(
            f"origin_msg_id {shown(origin)}: give the first message's id, at most {MAX_ORIGIN_MSG_ID_CHARS} "
            "characters without \\x01 or \\x02 (or leave it empty)"
        )


# The settings of a subscription group a request may change (each front passes those its request sets).
GroupSetting = Literal["consume_enable", "consume_from_min_enable", "consume_broadcast_enable", "retry_queue_nums",
                       "retry_max_times", "consume_message_orderly"]
GROUP_SETTINGS: tuple[GroupSetting, ...] = get_args(GroupSetting)


@dataclass(frozen=True)
class SendBack:
    """A consumer's message sent back to its group: named by commit-log offset or by message id (exactly one)."""

    group: str
    commitlog_offset: int | None = None
    msg_id: str | None = None
    delay_level: int = 0  # 0: the broker picks the level from the message's reconsume times
    max_reconsume_times: int | None = None  # None: the group's retryMaxTimes
    origin_msg_id: str = ""


class RetryProcessor:
    def __init__(
        self, retry: RetryService, groups: SubscriptionGroupManager, topics: TopicConfigManager, *,
        dlq_pull_enable: bool = False,
    ) -> None:
        self.retry, self.groups, self.topics = retry, groups, topics
        self.dlq_pull_enable = dlq_pull_enable

    def ensure_retry_topic(self, group: str) -> None:
        """%RETRY%{group} with at least the group's retryQueueNums queues: grown when the group's setting was
        raised after the topic was made (send-back picks among retryQueueNums queues, which must all exist)."""
        validate_group(group)  # before the group is recorded: a name no retry topic can take records nothing
        cfg = self.groups.get(group)
        try:
            self.topics.create(retry_topic(group), cfg.retry_queue_nums, if_not_exists=True)
            self.topics.grow(retry_topic(group), cfg.retry_queue_nums)
        except OSError as e:
            # A consumer's heartbeat must not fail because a full disk cannot take topics.json: the topic exists in
            # memory, is saved once the disk takes it, and a restart before that creates it again.
            log.warning("retry topic of group %s created but not saved (%s); saved once the disk takes it", group, e)

    def send_back(self, request: SendBack) -> SendBackResult:
        if (request.commitlog_offset is None) == (request.msg_id is None):
            raise InvalidArgumentError("ConsumerSendMsgBack names no message: give commitlog_offset or msg_id")
        _check_origin_msg_id(request.origin_msg_id)
        # The group's right first (what tells a stranger whether a message lies there is the group's own right),
        # then the copied message's own topic, once found: never a topic the request names (operations.py).
        authorize(Operation.SEND_BACK, group=request.group, topic="")
        message = self.retry.lookup(  # before the group or its retry topic is made: a refused call makes neither
            commitlog_offset=request.commitlog_offset, msg_id=request.msg_id,
        )
        authorize(Operation.SEND_BACK, group=request.group, topic=message.topic)
        self.ensure_retry_topic(request.group)
        result = self.retry.consumer_send_back(
            request.group,
            message=message,
            delay_level=request.delay_level,
            max_reconsume_times=request.max_reconsume_times,
            origin_msg_id=request.origin_msg_id or None,
        )
        raise_for_put(result.put, f"send-back of group {request.group}")
        if result.dead_letter:
            self.topics.create(result.topic, 1, if_not_exists=True, charged=True)  # stored already: registered as data
        return result

    def get_group(self, group: str) -> SubscriptionGroupConfig:
        authorize(Operation.READ_GROUP_SETTINGS, name=group)  # before the lookup, which makes a group it lacks
        return self.groups.get(group)

    def update_group(self, group: str, changes: Mapping[GroupSetting, object]) -> SubscriptionGroupConfig:
        """``changes``: some of GROUP_SETTINGS, validated before anything is made."""
        authorize(Operation.UPDATE_GROUP_SETTINGS, name=group)
        unknown = set(changes) - set(GROUP_SETTINGS)
        if unknown:
            raise InvalidArgumentError(f"not a subscription group setting: {', '.join(sorted(unknown))}")
        settings = {str(name): value for name, value in changes.items()}
        return self.groups.update_fields(group, **settings)

    def admit_pull(self, group: str, topic: str) -> None:
        if topic.startswith(DLQ_GROUP_TOPIC_PREFIX) and not self.dlq_pull_enable:
            raise BrokerError(
                f"{topic} is a dead-letter queue: its messages are never redelivered to consumers; inspect them "
                "with `sluice query`, or start the broker with dlq_pull_enable=true to read them",
                ResponseCode.NO_PERMISSION,
            )
        cfg = self.groups.get(group)  # unknown and not auto-created: SUBSCRIPTION_GROUP_NOT_EXIST, as RocketMQ
        if not cfg.consume_enable:
            raise BrokerError(
                f"subscription group {group!r} has consumeEnable=false; pulls are refused until an admin enables "
                "it (UpdateSubscriptionGroup consume_enable=true)",
                ResponseCode.NO_PERMISSION,
            )

    def admit_commit(self, group: str) -> None:
        """Offsets are committed for known groups only (created here when auto-creation is on, as pulls do)."""
        self.groups.get(group)

    def admit_broadcast(self, group: str) -> None:
        cfg = self.groups.find(group)
        if cfg is not None and not cfg.consume_broadcast_enable:
            raise BrokerError(
                f"subscription group {group!r} has consumeBroadcastEnable=false; consume in CLUSTERING mode or "
                "enable broadcasting for the group",
                ResponseCode.NO_PERMISSION,
            )

    @staticmethod
    def message_filter(expression_type: str, expression: str) -> SqlFilter | None:
        kind = (expression_type or TAG).upper()
        if kind == TAG:
            return None
        if kind != SQL92:
            raise InvalidArgumentError(f"expression type {shown(expression_type)} is not TAG or SQL92")
        return compile_sql92(expression)
