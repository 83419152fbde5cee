"""``mqadmin``'s topic and broker codes over remoting, translated to the broker's ``AdminProcessor`` and topic config
(what the gRPC front's CreateTopic, DeleteTopic, GetQueueOffsets and GetBrokerStats call).

======================== ==== ===================================================== ===================================
code                      no.  request                                               answer
======================== ==== ===================================================== ===================================
UPDATE_AND_CREATE_TOPIC   17   topic, readQueueNums, writeQueueNums, perm (and       nothing; the topic exists with that
                               defaultTopic, topicFilterType, topicSysFlag, order)   many queues
DELETE_TOPIC_IN_BROKER    215  topic                                                 nothing
GET_TOPIC_STATS_INFO      202  topic                                                 TopicStatsTable
GET_BROKER_RUNTIME_INFO   28   nothing                                               KVTable
======================== ==== ===================================================== ===================================

What differs from RocketMQ (docs/remoting.md):

* A Sluice topic has one queue count, read and write: ``updateTopic`` makes it ``max(readQueueNums,
  writeQueueNums)``, creating the topic or raising its count. A lower count than the topic has is refused
  (INVALID_PARAMETER: queues that hold messages stay readable), and so is a ``perm`` other than read-write (6):
  Sluice topics are always both, and a silently ignored read-only request would mislead. ``order`` and the filter
  type change nothing (any Sluice topic can be consumed in order with queue locks).
* Deleting a topic the broker does not hold answers SUCCESS, as RocketMQ's broker does (``mqadmin deleteTopic``
  asks every master of the cluster).
* TopicStatsTable's ``lastUpdateTimestamp`` is 0: Sluice keeps no per-queue last-write time.
* The runtime table carries RocketMQ's names that ``clusterList`` and ``brokerStatus`` read (``putTps`` and
  ``getTransferedTps`` as three rates, here all the average since the broker started; the ``msgPut/GetTotal*``
  day counters count since the start, so "today" and "yesterday" read as everything so far), and every figure of
  Sluice's own stats under its own name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from broker.errors import InvalidArgumentError, TopicNotExistError
from broker.remoting import header_fields as f
from broker.remoting.admin_bodies import Queue, kv_table, topic_stats_table
from broker.remoting.admin_handler import Guarded
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_outcomes import Access
from broker.remoting.processor import Processor
from broker.server.admin_processor import AdminProcessor
from broker.server.topic_config import PERM_READ_WRITE

BROKER_VERSION = 401  # MQVersion.V4_9_4: the protocol level this front speaks (standard JSON, the 4.9 codes)


@dataclass(frozen=True)
class TopicRequest:
    topic: str
    queue_nums: int = 0
    perm: int = PERM_READ_WRITE


@dataclass(frozen=True)
class NoRequest:
    pass


def parse_update(request: RemotingCommand) -> TopicRequest:
    read, write = f.int32(request, "readQueueNums"), f.int32(request, "writeQueueNums")
    perm = f.int32(request, "perm") if request.ext_fields.get("perm") else PERM_READ_WRITE
    return TopicRequest(f.text(request, "topic"), max(read, write), perm)


def parse_nothing(request: RemotingCommand) -> NoRequest:
    return NoRequest()


def parse_topic(request: RemotingCommand) -> TopicRequest:
    return TopicRequest(f.text(request, "topic"))


def _sluice_version() -> str:
    try:
        return version("sluice")
    except PackageNotFoundError:
        return "unknown"


class TopicAdminProcessors:
    def __init__(self, admin: AdminProcessor, access: Access, broker_name: str,
                 stats: Callable[[], Mapping[str, float]]) -> None:
        self.admin, self.access, self.broker_name, self.stats = admin, access, broker_name, stats
        self.started_ms = int(time.time() * 1000)

    def processors(self) -> dict[int, Processor]:
        a = self.access
        return {
            RequestCode.UPDATE_AND_CREATE_TOPIC: Guarded(a, "UPDATE_AND_CREATE_TOPIC", parse_update, self.update),
            RequestCode.DELETE_TOPIC_IN_BROKER: Guarded(a, "DELETE_TOPIC_IN_BROKER", parse_topic, self.delete),
            RequestCode.GET_TOPIC_STATS_INFO: Guarded(a, "GET_TOPIC_STATS_INFO", parse_topic, self.topic_stats),
            RequestCode.GET_BROKER_RUNTIME_INFO: Guarded(
                a, "GET_BROKER_RUNTIME_INFO", parse_nothing, self.runtime_info
            ),
        }

    def update(self, request: RemotingCommand, req: TopicRequest) -> RemotingCommand:
        if req.perm != PERM_READ_WRITE:
            raise InvalidArgumentError(
                f"perm {req.perm}: Sluice topics are readable and writable (perm 6); no other permission is kept"
            )
        self.admin.create_or_grow_topic(req.topic, req.queue_nums)
        return request.response(WireCode.SUCCESS)

    def delete(self, request: RemotingCommand, req: TopicRequest) -> RemotingCommand:
        try:
            self.admin.delete_topic(req.topic)
        except TopicNotExistError:
            pass  # gone already: what the administrator asked for holds
        return request.response(WireCode.SUCCESS)

    def topic_stats(self, request: RemotingCommand, req: TopicRequest) -> RemotingCommand:
        ranges = self.admin.queue_offsets(req.topic)
        body = topic_stats_table((Queue(req.topic, self.broker_name, q), lo, hi, 0) for q, lo, hi in ranges)
        return request.response(WireCode.SUCCESS, body=body)

    def runtime_info(self, request: RemotingCommand, req: NoRequest) -> RemotingCommand:
        return request.response(WireCode.SUCCESS, body=kv_table(self.runtime_table()))

    def runtime_table(self) -> dict[str, str]:
        stats = dict(self.stats())
        now_ms = int(time.time() * 1000)
        uptime_s = max(stats.get("broker_uptime_s", (now_ms - self.started_ms) / 1000), 1e-3)
        puts, gets = int(stats.get("broker_put_messages", 0)), int(stats.get("broker_get_messages", 0))
        put_tps, get_tps = puts / uptime_s, gets / uptime_s
        lo, hi = int(stats.get("store_commit_log_min_offset", 0)), int(stats.get("store_commit_log_max_offset", 0))
        flushed = int(stats.get("store_commit_log_flushed_offset", hi))
        dispatched = int(stats.get("store_dispatched_offset", hi))
        boot_ms = now_ms - int(uptime_s * 1000)
        earliest = self.admin.store.lookup_message(lo) if hi > lo else None
        seconds = int(uptime_s)
        table = {k: _number(v) for k, v in stats.items()}
        table.update({
            "brokerVersionDesc": f"Sluice {_sluice_version()}",
            "brokerVersion": str(BROKER_VERSION),
            "putTps": f"{put_tps:.2f} {put_tps:.2f} {put_tps:.2f}",
            "getTransferedTps": f"{get_tps:.2f} {get_tps:.2f} {get_tps:.2f}",
            "getTotalTps": f"{get_tps:.2f} {get_tps:.2f} {get_tps:.2f}",
            "msgPutTotalTodayNow": str(puts),
            "msgGetTotalTodayNow": str(gets),
            "msgPutTotalTodayMorning": "0",
            "msgGetTotalTodayMorning": "0",
            "msgPutTotalYesterdayMorning": "0",
            "msgGetTotalYesterdayMorning": "0",
            "commitLogMinOffset": str(lo),
            "commitLogMaxOffset": str(hi),
            "commitLogDiskRatio": str(float(stats.get("store_disk_usage_ratio", 0.0))),
            "dispatchBehindBytes": str(max(hi - dispatched, 0)),
            "remainHowManyDataToFlush": str(max(hi - flushed, 0)),
            "earliestMessageTimeStamp": str(earliest.store_timestamp if earliest is not None else now_ms),
            "pageCacheLockTimeMills": "0",
            "bootTimestamp": str(boot_ms),
            "runtime": f"[ {seconds // 86400} days, {seconds // 3600 % 24} hours, {seconds // 60 % 60} minutes, "
                       f"{seconds % 60} seconds ]",
            "timerReadBehind": "0",
            "timerOffsetBehind": "0",
            "timerCongestNum": "0",
            "timerEnqueueTps": "0.0",
            "timerDequeueTps": "0.0",
        })
        return table


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
