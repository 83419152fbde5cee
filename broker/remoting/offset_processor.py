"""Queue and consumer offsets over remoting: what RocketMQ 4 consumers and ``mqadmin`` ask a broker about offsets,
translated to the broker's ``AdminProcessor`` (broker/server/admin_processor.py), which the gRPC front uses too.

========================== ==== ================================================ =================================
code                        no.  request header                                  answer
========================== ==== ================================================ =================================
GET_MAX_OFFSET              30   topic, queueId                                  ``offset``: the queue's end
GET_MIN_OFFSET              31   topic, queueId                                  ``offset``: its first kept
GET_EARLIEST_MSG_STORETIME  32   topic, queueId                                  ``timestamp`` (ms; -1: empty)
SEARCH_OFFSET_BY_TIMESTAMP  29   topic, queueId, timestamp                       ``offset``
QUERY_CONSUMER_OFFSET       14   consumerGroup, topic, queueId                   ``offset``; QUERY_NOT_FOUND
UPDATE_CONSUMER_OFFSET      15   consumerGroup, topic, queueId, commitOffset     nothing (usually one-way)
========================== ==== ================================================ =================================

A queue id the topic does not have reads as an empty queue (offset 0), as RocketMQ answers; a topic the broker
does not hold is ``TOPIC_NOT_EXIST``. A group without a committed offset is ``QUERY_NOT_FOUND`` (the client then
starts where its ``consumeFromWhere`` says); RocketMQ answers 0 instead when the queue still starts at offset 0
and its first message is in memory, a heuristic Sluice does not copy: the client's own rule decides.

Rights (with auth on), as the gRPC calls of the same reads and writes: a queue's offsets need Pub, Sub or Get on
the topic; a group's committed offset, read or written, Sub on the group and on the topic (broker/auth/
operations.py, asked by AdminProcessor's operations before anything is read or stored).
"""

from __future__ import annotations

from broker.remoting import header_fields as f
from broker.remoting.admission import AsCaller
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.handler import Handler
from broker.remoting.message_outcomes import Access
from broker.remoting.processor import Processor
from broker.server.admin_processor import AdminProcessor


class OffsetProcessors:
    def __init__(self, admin: AdminProcessor, access: Access | None = None) -> None:
        self.admin = admin
        self.access = access or Access(None)

    def processors(self) -> dict[int, Processor]:
        handlers = {
            RequestCode.GET_MAX_OFFSET: Handler(self.max_offset),
            RequestCode.GET_MIN_OFFSET: Handler(self.min_offset),
            RequestCode.GET_EARLIEST_MSG_STORETIME: Handler(self.earliest_time),
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: Handler(self.search),
            RequestCode.QUERY_CONSUMER_OFFSET: Handler(self.query_consumer_offset),
            RequestCode.UPDATE_CONSUMER_OFFSET: Handler(self.update_consumer_offset),
        }
        return {code: AsCaller(handler, self.access) for code, handler in handlers.items()}

    def _range(self, request: RemotingCommand) -> tuple[int, int]:
        topic, queue_id = f.text(request, "topic"), f.int32(request, "queueId")
        for q, lo, hi in self.admin.queue_offsets(topic):
            if q == queue_id:
                return lo, hi
        return 0, 0

    @staticmethod
    def _offset(request: RemotingCommand, value: int, name: str = "offset") -> RemotingCommand:
        return request.response(WireCode.SUCCESS, ext_fields={name: str(value)})

    def max_offset(self, request: RemotingCommand) -> RemotingCommand:
        return self._offset(request, self._range(request)[1])

    def min_offset(self, request: RemotingCommand) -> RemotingCommand:
        return self._offset(request, self._range(request)[0])

    def earliest_time(self, request: RemotingCommand) -> RemotingCommand:
        topic, queue_id = f.text(request, "topic"), f.int32(request, "queueId")
        return self._offset(request, self.admin.earliest_time(topic, queue_id), "timestamp")

    def search(self, request: RemotingCommand) -> RemotingCommand:
        topic, queue_id, ts = f.text(request, "topic"), f.int32(request, "queueId"), f.int64(request, "timestamp")
        return self._offset(request, self.admin.search_offset(topic, queue_id, ts))

    def query_consumer_offset(self, request: RemotingCommand) -> RemotingCommand:
        group, topic, queue_id = f.text(request, "consumerGroup"), f.text(request, "topic"), f.int32(request, "queueId")
        found = self.admin.query_consumer_offsets(group, topic, queue_id)
        if queue_id not in found:
            return request.response(WireCode.QUERY_NOT_FOUND, remark="no committed offset for this group and queue")
        return self._offset(request, found[queue_id])

    def update_consumer_offset(self, request: RemotingCommand) -> RemotingCommand:
        group, topic, queue_id = f.text(request, "consumerGroup"), f.text(request, "topic"), f.int32(request, "queueId")
        self.admin.update_consumer_offsets(group, {(topic, queue_id): f.int64(request, "commitOffset")})
        return request.response(WireCode.SUCCESS)
