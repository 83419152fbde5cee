"""The remoting transport: a broker's RocketMQ remoting port (broker/remoting) in place of its gRPC port, for the
Producer and the PullConsumer, selected by the endpoint ``remoting://host:port``.

``RemotingConnection`` stands where ``Connection`` (gRPC) stands: the clients call ``conn.call(conn.stub.X,
request)`` with the same protobuf requests and get the same protobuf answers, so every result object they build
(SendResult, SendResults, PullResult with its messages) is the one a gRPC call gives. Each stub method translates:

============================ ============================================ ===========================================
stub method                  remoting request                             answer rebuilt from
============================ ============================================ ===========================================
GetTopicRoute                GET_ROUTEINFO_BY_TOPIC (to the broker)       ``queueDatas``
SendMessage                  SEND_MESSAGE_V2                              ``msgId``, ``queueId``, ``queueOffset``
SendBatch                    SEND_BATCH_MESSAGE, one per run of a queue   the same, one offset id per message
PullMessage                  PULL_MESSAGE                                 the body: the stored entries, unchanged
UpdateConsumerOffsets        UPDATE_CONSUMER_OFFSET, one per queue        nothing
QueryConsumerOffset          QUERY_CONSUMER_OFFSET, one per queue         ``offset`` (QUERY_NOT_FOUND: none)
GetQueueOffsets              GET_MIN_OFFSET and GET_MAX_OFFSET per queue  ``offset``
============================ ============================================ ===========================================

A refusal raises the BrokerError subclass of its response code, as over gRPC (``broker.proto.status.error_for``).
Where the remoting front renames a Sluice code for 4.x clients (``broker/remoting/message_outcomes.py``), the
class is that code's: a send gRPC refuses INVALID_ARGUMENT is MESSAGE_ILLEGAL here.

What differs from gRPC, because RocketMQ's requests carry less:

* a batch spread over several queues goes as one SEND_BATCH_MESSAGE per queue (a remoting batch names one queue),
  each stored all or nothing; a commit of several queues' offsets is one request per queue;
* a send repeated after an unknown outcome carries no ``retry`` mark (SEND_MESSAGE has no such field), so the
  broker's deduplication by UNIQ_KEY does not answer it: a send whose answer was lost may be stored twice, as with
  a RocketMQ 4 client;
* transactions, TLS and signed requests are not offered over this transport yet: use the gRPC endpoint.

One TCP connection per broker carries every call, matched by ``opaque``, its answers read by the calling threads
themselves (remoting_wire.py: a synchronous sender switches no thread); a connection that broke is opened again
at the next call.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from broker.client.remoting_wire import RemotingWire
from broker.errors import BrokerError, BrokerUnreachableError, InvalidArgumentError, ResponseCode
from broker.format.batch import walk
from broker.format.message import BODY_START, ENTRY_HEADER, PROPS_LEN, TOPIC_LEN, EntryHeader
from broker.proto import sluice_pb2 as pb
from broker.proto.status import error_for
from broker.proto.wire import Framed
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_batch import ITEM_HEAD, MIN_ITEM_SIZE
from broker.remoting.message_properties import format_properties

SCHEME = "remoting://"
ID_OFFSET_CHARS = 16  # an offset message id ends with the commit-log offset: 8 bytes, 16 hex characters
# Send answers that say the message is stored, with its status (the rest are refusals).
_STORED = {
    WireCode.SUCCESS: pb.SEND_OK, WireCode.FLUSH_DISK_TIMEOUT: pb.FLUSH_DISK_TIMEOUT,
    WireCode.FLUSH_SLAVE_TIMEOUT: pb.FLUSH_SLAVE_TIMEOUT, WireCode.SLAVE_NOT_AVAILABLE: pb.SLAVE_NOT_AVAILABLE,
}
_PULLED = {WireCode.SUCCESS: pb.FOUND, WireCode.PULL_NOT_FOUND: pb.NO_NEW_MSG,
           WireCode.PULL_RETRY_IMMEDIATELY: pb.NO_MATCHED_MSG, WireCode.PULL_OFFSET_MOVED: pb.OFFSET_ILLEGAL}
PULL_FLAG_COMMIT_OFFSET, PULL_FLAG_SUSPEND, PULL_FLAG_SUBSCRIPTION = 0x1, 0x2, 0x4  # PullSysFlag
_I32 = struct.Struct(">i")
_H_QUEUE_ID, _H_FLAG, _H_SYS_FLAG, _H_BORN, _H_BODY_LEN = (
    EntryHeader._fields.index(n) for n in ("queue_id", "flag", "sys_flag", "born_timestamp", "body_length")
)


def is_remoting(endpoint: str | None) -> bool:
    return bool(endpoint) and endpoint.strip().lower().startswith(SCHEME)  # type: ignore[union-attr]


def _refused(answer: RemotingCommand) -> BrokerError:
    return error_for(answer.code, answer.remark or f"refused with remoting code {answer.code}")


# ---------------------------------------------------------------------------------------------------- batches


def batch_runs(entries: bytes) -> list[tuple[str, int, int, int, bytes, int]]:
    """Sluice entries (encode_entry, back to back) as RocketMQ batch bodies: one per run of entries with the same
    topic, queue, sysFlag and born timestamp (what a remoting batch header names once): (topic, queue id, sysFlag,
    born timestamp, body, message count). The bodies and properties are copied as they are: both encodings share
    RocketMQ's property string."""
    runs: list[tuple[str, int, int, int, bytes, int]] = []
    key: tuple[bytes, int, int, int] | None = None
    parts: list[bytes | memoryview] = []
    count, pos, end = 0, 0, len(entries)
    view = memoryview(entries)
    head, item_head = ENTRY_HEADER.unpack_from, ITEM_HEAD.pack
    while pos < end:
        total = _I32.unpack_from(entries, pos)[0] if pos + 4 <= end else 0
        if total < BODY_START or pos + total > end:
            raise InvalidArgumentError(f"entry at byte {pos}: TOTALSIZE {total} does not fit the batch buffer")
        h = head(entries, pos)
        body_len = h[_H_BODY_LEN]
        topic_at = pos + BODY_START + body_len
        if body_len < 0 or topic_at >= pos + total:
            raise InvalidArgumentError(f"entry at byte {pos}: body length {body_len} does not fit TOTALSIZE {total}")
        props_len_at = topic_at + TOPIC_LEN.size + entries[topic_at]
        here = (entries[topic_at + 1 : props_len_at], h[_H_QUEUE_ID], h[_H_SYS_FLAG], h[_H_BORN])
        if here != key:
            if key is not None:
                runs.append((key[0].decode("utf-8"), *key[1:], b"".join(parts), count))
            key, parts, count = here, [], 0
        props_end = pos + total
        props_len = props_end - props_len_at - PROPS_LEN.size
        if props_len < 0 or PROPS_LEN.unpack_from(entries, props_len_at)[0] != props_len:
            raise InvalidArgumentError(f"entry at byte {pos}: its lengths do not end at TOTALSIZE {total}")
        parts += (item_head(MIN_ITEM_SIZE + body_len + props_len, 0, 0, h[_H_FLAG], body_len),
                  view[pos + BODY_START : topic_at], view[props_len_at:props_end])
        count += 1
        pos += total
    if key is not None:
        runs.append((key[0].decode("utf-8"), *key[1:], b"".join(parts), count))
    return runs


def entry_positions(body: bytes) -> list[int]:
    """Where each stored entry of a pull's body starts (the broker's own walk of TOTALSIZE, in numpy)."""
    positions, _, stopped = walk(body, 0, len(body))
    if stopped:
        raise BrokerError(f"the broker answered a pull with a body that is no run of entries ({stopped})")
    result: list[int] = positions.tolist()
    return result


class PullAnswer(NamedTuple):
    """A pull's answer with a gRPC PullResponse's fields (the body is not copied into a protobuf message)."""

    status: int
    entries: bytes
    entry_positions: list[int]
    next_begin_offset: int
    min_offset: int
    max_offset: int


def _send_response(answer: RemotingCommand, count: int) -> pb.SendResponse:
    status = _STORED.get(WireCode(answer.code)) if answer.code in WireCode._value2member_map_ else None
    if status is None:
        raise _refused(answer)
    ids = answer.ext_fields.get("msgId", "").split(",")
    if len(ids) != count or any(len(i) <= ID_OFFSET_CHARS for i in ids):
        raise BrokerError(f"the broker answered {len(ids)} message ids for {count} messages; this is a broker bug")
    first = int(answer.ext_fields.get("queueOffset", "0"))
    queue_id = int(answer.ext_fields.get("queueId", "0"))
    return pb.SendResponse(
        status=status, msg_id_prefix=ids[0][:-ID_OFFSET_CHARS], commitlog_offsets=[int(i[-16:], 16) for i in ids],
        queue_ids=[queue_id] * count, queue_offsets=range(first, first + count),
    )


# ---------------------------------------------------------------------------------------------------- connection


class RemotingConnection:
    """One broker's remoting port, with a Connection's interface (module docstring)."""

    def __init__(self, endpoint: str, timeout_s: float = 30.0) -> None:
        address = endpoint.strip()[len(SCHEME) :] if is_remoting(endpoint) else endpoint.strip()
        if not address or "," in address or ":" not in address:
            raise InvalidArgumentError(f"endpoint {endpoint!r}: write remoting://HOST:PORT (one broker)")
        self.endpoint = SCHEME + address
        self.address = address
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._client: RemotingWire | None = None
        self.stub = _Stub(self)

    # ------------------------------------------------------------------------------------------------ calls
    def _open(self) -> RemotingWire:
        client = self._client
        if client is not None and not client.closed:
            return client
        with self._lock:
            if self._client is None or self._client.closed:
                if self._client is not None:
                    self._client.close()
                self._client = RemotingWire(self.address)
            return self._client

    def invoke(self, code: int, ext: dict[str, str], body: bytes = b"", timeout_s: float | None = None
               ) -> RemotingCommand:
        return self._open().invoke(RemotingCommand(code, ext_fields=ext, body=body), timeout_s or self.timeout_s)

    def call(self, method: Callable[..., Any], request: Any, timeout_s: float | None = None) -> Any:
        """A stub method's translation; a refusal raises the broker's BrokerError subclass."""
        return method(request, timeout=timeout_s or self.timeout_s)

    def send_message(self, request: pb.SendMessageRequest, timeout_s: float | None = None) -> pb.SendResponse:
        return self.stub.SendMessage(request, timeout=timeout_s or self.timeout_s)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


class _Stub:
    """The gRPC stub's methods the Producer and PullConsumer use, over remoting; the others say to use gRPC."""

    def __init__(self, conn: RemotingConnection) -> None:
        self._conn = conn

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def unsupported(request: Any, timeout: float | None = None) -> Any:
            raise InvalidArgumentError(
                f"{name} is not offered over the remoting transport ({self._conn.endpoint}); use the broker's gRPC "
                "endpoint for it"
            )

        return unsupported

    def GetTopicRoute(self, request: pb.GetTopicRouteRequest, timeout: float | None = None) -> pb.TopicInfo:
        ext = {"topic": request.topic, "autoCreate": "true" if request.auto_create else "false"}
        answer = self._conn.invoke(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext, timeout_s=timeout)
        if answer.code != WireCode.SUCCESS:
            raise _refused(answer)
        data = json.loads(answer.body)
        queue = data["queueDatas"][0]
        broker = data["brokerDatas"][0]
        return pb.TopicInfo(topic=request.topic, read_queue_nums=queue["readQueueNums"],
                            write_queue_nums=queue["writeQueueNums"], perm=queue["perm"],
                            cluster=broker.get("cluster", ""), broker_name=broker.get("brokerName", ""))

    def SendMessage(self, request: pb.SendMessageRequest, timeout: float | None = None) -> pb.SendResponse:
        if request.transactional or request.transaction_id:
            raise InvalidArgumentError("transactional sends are not offered over the remoting transport; use gRPC")
        ext = {
            "a": "DEFAULT_PRODUCER" if not request.producer_group else request.producer_group, "b": request.topic,
            "c": "TBW102", "d": "4", "e": str(request.queue_id), "f": str(request.sys_flag),
            "g": str(request.born_timestamp), "h": str(request.flag), "i": format_properties(request.properties),
            "j": str(request.reconsume_times), "k": "false", "m": "false",
        }
        answer = self._conn.invoke(RequestCode.SEND_MESSAGE_V2, ext, request.body, timeout)
        return _send_response(answer, 1)

    def SendBatch(self, request: Framed | pb.SendBatchRequest, timeout: float | None = None) -> pb.SendResponse:
        if isinstance(request, Framed):
            head: pb.SendBatchRequest = request.head
            entries: bytes = request.entries
        else:
            head, entries = request, request.entries
        if head.transaction_id:
            raise InvalidArgumentError("batch transactions are not offered over the remoting transport; use gRPC")
        out = pb.SendResponse(status=pb.SEND_OK)
        for topic, queue_id, sys_flag, born, body, count in batch_runs(bytes(entries)):
            ext = {"a": head.producer_group or "DEFAULT_PRODUCER", "b": topic, "c": "TBW102", "d": "4",
                   "e": str(queue_id), "f": str(sys_flag), "g": str(born), "h": "0", "i": "", "j": "0", "k": "false",
                   "m": "true"}
            part = _send_response(self._conn.invoke(RequestCode.SEND_BATCH_MESSAGE, ext, body, timeout), count)
            if part.status != pb.SEND_OK:
                out.status = part.status
            out.msg_id_prefix = part.msg_id_prefix
            out.commitlog_offsets.extend(part.commitlog_offsets)
            out.queue_ids.extend(part.queue_ids)
            out.queue_offsets.extend(part.queue_offsets)
        return out

    def PullMessage(self, request: pb.PullRequest, timeout: float | None = None) -> PullAnswer:
        flags = PULL_FLAG_SUBSCRIPTION | (PULL_FLAG_SUSPEND if request.suspend_timeout_ms > 0 else 0)
        commit = request.commit_offset if request.HasField("commit_offset") and request.commit_offset >= 0 else -1
        if commit >= 0:
            flags |= PULL_FLAG_COMMIT_OFFSET
        ext = {
            "consumerGroup": request.consumer_group, "topic": request.topic, "queueId": str(request.queue_id),
            "queueOffset": str(request.queue_offset), "maxMsgNums": str(request.max_msgs or 32),
            "sysFlag": str(flags), "commitOffset": str(max(commit, 0)),
            "suspendTimeoutMillis": str(request.suspend_timeout_ms), "subscription": request.tag_expression or "*",
            "expressionType": request.expression_type or "TAG", "subVersion": "0",
        }
        if request.max_bytes:
            ext["maxMsgBytes"] = str(request.max_bytes)
        answer = self._conn.invoke(RequestCode.PULL_MESSAGE, ext, timeout_s=timeout)
        status = _PULLED.get(WireCode(answer.code)) if answer.code in WireCode._value2member_map_ else None
        if status is None:
            raise _refused(answer)
        f = answer.ext_fields
        body = answer.body if status == pb.FOUND else b""
        return PullAnswer(
            status, body, entry_positions(body) if body else [], int(f.get("nextBeginOffset", "0")),
            int(f.get("minOffset", "0")), int(f.get("maxOffset", "0")),
        )

    def UpdateConsumerOffsets(self, request: pb.UpdateConsumerOffsetsRequest, timeout: float | None = None
                              ) -> pb.UpdateConsumerOffsetsResponse:
        for o in request.offsets:
            ext = {"consumerGroup": request.consumer_group, "topic": o.topic, "queueId": str(o.queue_id),
                   "commitOffset": str(o.offset)}
            answer = self._conn.invoke(RequestCode.UPDATE_CONSUMER_OFFSET, ext, timeout_s=timeout)
            if answer.code != WireCode.SUCCESS:
                raise _refused(answer)
        return pb.UpdateConsumerOffsetsResponse()

    def _queue_count(self, topic: str, timeout: float | None) -> int:
        return self.GetTopicRoute(pb.GetTopicRouteRequest(topic=topic), timeout).read_queue_nums

    def QueryConsumerOffset(self, request: pb.QueryConsumerOffsetRequest, timeout: float | None = None
                            ) -> pb.QueryConsumerOffsetResponse:
        queues: Sequence[int] = (
            range(self._queue_count(request.topic, timeout)) if request.queue_id < 0 else [request.queue_id]
        )
        out = pb.QueryConsumerOffsetResponse()
        for q in queues:
            ext = {"consumerGroup": request.consumer_group, "topic": request.topic, "queueId": str(q)}
            answer = self._conn.invoke(RequestCode.QUERY_CONSUMER_OFFSET, ext, timeout_s=timeout)
            if answer.code == WireCode.SUCCESS:
                out.offsets.add(topic=request.topic, queue_id=q, offset=int(answer.ext_fields["offset"]))
            elif answer.code != WireCode.QUERY_NOT_FOUND:
                raise _refused(answer)
        return out

    def GetQueueOffsets(self, request: pb.GetQueueOffsetsRequest, timeout: float | None = None
                        ) -> pb.GetQueueOffsetsResponse:
        out = pb.GetQueueOffsetsResponse()
        for q in range(self._queue_count(request.topic, timeout)):
            ext = {"topic": request.topic, "queueId": str(q)}
            lo = self._conn.invoke(RequestCode.GET_MIN_OFFSET, ext, timeout_s=timeout)
            hi = self._conn.invoke(RequestCode.GET_MAX_OFFSET, ext, timeout_s=timeout)
            for answer in (lo, hi):
                if answer.code != WireCode.SUCCESS:
                    raise _refused(answer)
            out.queues.add(queue_id=q, min_offset=int(lo.ext_fields["offset"]), max_offset=int(hi.ext_fields["offset"]))
        return out


assert ENTRY_HEADER.size == BODY_START and ResponseCode.TOPIC_NOT_EXIST == WireCode.TOPIC_NOT_EXIST
__all__ = ["RemotingConnection", "is_remoting", "BrokerUnreachableError"]
