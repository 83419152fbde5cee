"""Message lookups over remoting: ``mqadmin queryMsgById`` / ``queryMsgByKey`` / ``queryMsgByUniqueKey`` and a 4.x
client's ``viewMessage`` / ``queryMessage``, translated to the broker's ``AdminProcessor`` lookups (the ones the
gRPC front's ViewMessageById and QueryMessageByKey call: the same visibility and rights rules).

====================== ==== ===================================================== ================================
code                    no.  request header                                        answer
====================== ==== ===================================================== ================================
VIEW_MESSAGE_BY_ID      33   offset (the commit-log offset of an offset id)        body: the stored entry
QUERY_MESSAGE           12   topic, key, maxNum, beginTimestamp, endTimestamp      body: the stored entries, back
                             (and ``_UNIQUE_KEY_QUERY``)                           to back; ``indexLastUpdate-
                                                                                   Timestamp``, ``...Phyoffset``
====================== ==== ===================================================== ================================

A key matches a message's ``KEYS`` (any of them) or its ``UNIQ_KEY``, so the unique-key form needs nothing more;
the client keeps the messages whose key or id equals what it asked. ``maxNum`` 0 means the broker's default (64)
and it is capped at 4096. Nothing found is ``QUERY_NOT_FOUND`` (22), as RocketMQ answers both. Answered entries name
the remoting address as their store host (broker/remoting/message_ids.py), so the offset ids a client decodes
from them lead back to this port. ``indexLastUpdatePhyoffset`` is the commit-log offset the broker's indexes have
reached, ``indexLastUpdateTimestamp`` the time of the answer (Sluice keeps no index-file end time; clients only
report the two).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from broker.errors import InvalidArgumentError
from broker.remoting import header_fields as f
from broker.remoting.admin_handler import Guarded
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_ids import RemotingIds
from broker.remoting.message_outcomes import Access
from broker.remoting.processor import Processor
from broker.server.admin_processor import AdminProcessor


@dataclass(frozen=True)
class ViewRequest:
    offset: int


@dataclass(frozen=True)
class QueryRequest:
    topic: str
    key: str
    max_num: int
    begin_ms: int
    end_ms: int


def parse_view(request: RemotingCommand) -> ViewRequest:
    offset = f.int64(request, "offset")
    if offset < 0:
        raise InvalidArgumentError(f"VIEW_MESSAGE_BY_ID: commit-log offset {offset} is negative")
    return ViewRequest(offset)


def parse_query(request: RemotingCommand) -> QueryRequest:
    return QueryRequest(f.text(request, "topic"), f.text(request, "key"), f.int32(request, "maxNum"),
                        f.int64(request, "beginTimestamp"), f.int64(request, "endTimestamp"))


class QueryProcessors:
    def __init__(self, admin: AdminProcessor, access: Access, msg_ids: RemotingIds) -> None:
        self.admin, self.access, self.msg_ids = admin, access, msg_ids

    def processors(self) -> dict[int, Processor]:
        return {
            RequestCode.VIEW_MESSAGE_BY_ID: Guarded(self.access, "VIEW_MESSAGE_BY_ID", parse_view, self.view),
            RequestCode.QUERY_MESSAGE: Guarded(self.access, "QUERY_MESSAGE", parse_query, self.query),
        }

    def view(self, request: RemotingCommand, req: ViewRequest) -> RemotingCommand:
        # The store's own id for the offset: the lookup checks the entry there is this store's, visible and readable
        entry = self.admin.view_by_id(self.msg_ids.store_prefix + f"{req.offset:016X}")
        return request.response(WireCode.SUCCESS, body=self.msg_ids.served(entry))

    def query(self, request: RemotingCommand, req: QueryRequest) -> RemotingCommand:
        found = self.admin.query_by_key(req.topic, req.key, req.max_num, req.begin_ms, req.end_ms)
        ext = {
            "indexLastUpdateTimestamp": str(int(time.time() * 1000)),
            "indexLastUpdatePhyoffset": str(self.admin.store.dispatched_offset()),
        }
        if not found:
            return request.response(WireCode.QUERY_NOT_FOUND, ext_fields=ext,
                                    remark="can not find message, maybe time range not correct")
        body = b"".join(self.msg_ids.served(entry) for entry in found)
        return request.response(WireCode.SUCCESS, ext_fields=ext, body=body)
