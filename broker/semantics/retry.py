"""Retry and dead letters: RocketMQ's CONSUMER_SEND_MSG_BACK.

A consumer that failed to process a message sends it back. The broker looks it up (by commit-log offset or msgId)
and stores a copy:

- in ``%RETRY%{group}`` (queue = random among the group's ``retryQueueNums``) with delay level
  ``3 + reconsume times`` when the caller gives 0 (so the first retry waits 10 s, then 30 s, 1 m, 2 m, ...),
  ``RETRY_TOPIC`` = the original topic (kept from the first send-back on), ``ORIGIN_MESSAGE_ID`` = the first
  message's id, RECONSUMETIMES + 1; the delay service delivers it to the retry topic when due;
- in ``%DLQ%{group}`` queue 0, with no delay, when the message was already reconsumed ``maxReconsumeTimes`` times
  (the group's ``retryMaxTimes``, 16 by default, unless the caller gives its own) or the caller asks with a
  negative delay level. Nothing moves messages out of a DLQ: they wait there for a person (``DLQ_ORIGIN_TOPIC``
  and ``DLQ_ORIGIN_MESSAGE_ID`` say where they came from).

Server wiring::

    retry = RetryService(store, groups, schedule)
    result = retry.consumer_send_back(group, commitlog_offset=off, delay_level=0, max_reconsume_times=None)
    # or msg_id="..." instead of commitlog_offset; result.topic / result.put.status for the reply
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass

from broker.errors import BrokerError, InvalidArgumentError, QueryNotFoundError, ResponseCode
from broker.format.message import Prop, StoredMessage, SysFlag, delivered_sys_flag
from broker.format.system_topics import dlq_topic, is_system_topic, retry_topic
from broker.semantics.delay import ScheduleMessageService, _host_tuple
from broker.semantics.subscription_group import SubscriptionGroupManager
from broker.store import MessageStore, PutResult

log = logging.getLogger(__name__)

FIRST_RETRY_DELAY_LEVEL = 3  # RocketMQ: delay level = 3 + reconsume times when the client gives 0
DLQ_QUEUE_NUMS = 1  # RocketMQ's DLQ_NUMS_PER_GROUP
MAX_RECONSUME_TIMES = (1 << 31) - 1  # RECONSUMETIMES is an int32 field
DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"  # RocketMQ 5 MessageConst names
DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
_NEVER_DELIVERED = (SysFlag.TRANSACTION_PREPARED_TYPE, SysFlag.TRANSACTION_ROLLBACK_TYPE)


@dataclass(frozen=True)
class SendBackResult:
    topic: str  # %RETRY%{group} or %DLQ%{group}
    queue_id: int
    dead_letter: bool
    delay_level: int  # 0 for a dead letter
    reconsume_times: int  # of the stored copy
    put: PutResult  # the store's answer (for a retry: the put into SCHEDULE_TOPIC_XXXX)


class RetryService:
    """Thread-safe: every call is one lookup and one put."""

    def __init__(self, store: MessageStore, groups: SubscriptionGroupManager, schedule: ScheduleMessageService) -> None:
        self.store = store
        self.groups = groups
        self.schedule = schedule
        self._random = random.Random()
        self._random_lock = threading.Lock()

    def lookup(self, *, commitlog_offset: int | None = None, msg_id: str | None = None) -> StoredMessage:
        """The message a send-back names, with every check consumer_send_back makes of it (nothing stored)."""
        if (commitlog_offset is None) == (msg_id is None):
            raise InvalidArgumentError("consumer_send_back: give exactly one of commitlog_offset and msg_id")
        msg = (
            self.store.lookup_message(commitlog_offset)
            if commitlog_offset is not None
            else self.store.view_by_msg_id(msg_id)  # type: ignore[arg-type]
        )
        where = f"commit-log offset {commitlog_offset}" if commitlog_offset is not None else f"msgId {msg_id}"
        if msg is None or self.store.deleted_generation(msg.topic, msg.commitlog_offset):  # (by id: checked there)
            raise QueryNotFoundError(f"no message at {where} (expired, or a wrong id); nothing was sent back")
        # Only what consumers were given may come back: a half message (open or rolled back), a pending delayed
        # one or a transaction decision copied to %RETRY% would deliver what was never delivered.
        tx_type = SysFlag.transaction_type(delivered_sys_flag(msg.sys_flag, msg.prepared_transaction_offset))
        if is_system_topic(msg.topic) or tx_type in _NEVER_DELIVERED or not self.store.decided(msg):
            raise InvalidArgumentError(
                f"the message at {where} is in {msg.topic!r} (SYSFLAG {msg.sys_flag:#x}): it was never delivered "
                "to consumers, so it cannot be sent back; nothing was sent back"
            )
        return msg

    def consumer_send_back(
        self,
        group: str,
        *,
        commitlog_offset: int | None = None,
        msg_id: str | None = None,
        message: StoredMessage | None = None,
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
        origin_msg_id: str | None = None,
    ) -> SendBackResult:
        """``message``: the one lookup() already returned, instead of naming it by offset or msgId."""
        cfg = self.groups.get(group)
        if not cfg.consume_enable:
            raise BrokerError(
                f"subscription group {group!r} has consumeEnable=false; enable it to send messages back",
                ResponseCode.NO_PERMISSION,
            )
        msg = message if message is not None else self.lookup(commitlog_offset=commitlog_offset, msg_id=msg_id)
        max_times = cfg.retry_max_times
        if max_reconsume_times is not None and max_reconsume_times >= 0:
            max_times = max_reconsume_times
        props = dict(msg.properties)
        props.setdefault(Prop.RETRY_TOPIC, msg.topic)
        props[Prop.ORIGIN_MESSAGE_ID] = origin_msg_id or props.get(Prop.ORIGIN_MESSAGE_ID) or msg.msg_id
        props.pop(Prop.DELAY, None)
        # Sends refuse negative counts; one stored anyway (before that check) is a first failure, not extra retries
        # with no delay. A count at the field's limit cannot be counted again: such a message is a dead letter.
        times = max(msg.reconsume_times, 0)
        at_limit = times >= MAX_RECONSUME_TIMES
        reconsume_times = times if at_limit else times + 1
        dead = times >= max_times or delay_level < 0 or at_limit
        if dead:
            topic, queue_id, level = dlq_topic(group), 0, 0
            props[DLQ_ORIGIN_TOPIC] = props[Prop.RETRY_TOPIC]
            props[DLQ_ORIGIN_MESSAGE_ID] = props[Prop.ORIGIN_MESSAGE_ID]
            put_topic, put_qid = topic, queue_id
        else:
            topic = retry_topic(group)
            with self._random_lock:
                queue_id = self._random.randrange(cfg.retry_queue_nums)
            level = self.schedule.levels.clamp(delay_level or FIRST_RETRY_DELAY_LEVEL + times)
            props[Prop.DELAY] = str(level)
            put_topic, put_qid, props = self.schedule.rewrite_for_delay(topic, queue_id, props)
        put = self.store.put_message(
            put_topic,
            put_qid,
            msg.body,
            props,
            flag=msg.flag,
            sys_flag=delivered_sys_flag(msg.sys_flag, msg.prepared_transaction_offset),
            born_timestamp=msg.born_timestamp,
            born_host=_host_tuple(msg.born_host),
            reconsume_times=reconsume_times,
            wait_store_ok=None,  # SYNC_FLUSH: durable before the consumer is told, as any send (it then moves on)
        )
        if dead:
            log.info("message %s of group %s reconsumed %d times: moved to %s", msg.msg_id, group, times,
                     topic)
        return SendBackResult(topic, queue_id, dead, level, reconsume_times, put)
