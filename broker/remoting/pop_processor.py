"""POP_MESSAGE (200050), ACK_MESSAGE (200051) and CHANGE_MESSAGE_INVISIBLETIME (200053): RocketMQ 5's pop
consumption over remoting, translated into the broker's pop processor (broker/server/pop_processor.py, what the
gRPC PopMessage, AckMessage and ChangeInvisibleTime call: the same pop records, so a message popped and acked over
one front is not delivered again over another). The codes do not fit the binary header's int16, so these requests
come with JSON headers only.

**POP_MESSAGE** header: ``consumerGroup``, ``topic``, ``queueId`` (-1: any queue), ``maxMsgNums``,
``invisibleTime`` (ms), ``pollTime`` (ms, how long to wait for a message), ``expType``/``exp`` (TAG or SQL92), and
fields read by nothing here (``bornTime``, ``initMode``: a group's first pop starts where Sluice's pops start,
``order``, ``attemptId``). Answer, SUCCESS with the messages in the stored layout back to back (message_entry.py), or
PULL_NOT_FOUND with none (a 5.x client reads both 19 and POLLING_TIMEOUT as "no message"); POLLING_FULL when
``MAX_HELD_POPS`` pops are waiting already. Header ``PopMessageResponseHeader``: ``popTime``, ``invisibleTime``,
``reviveQid`` (0: Sluice has no revive queues), ``restNum`` (0: not counted), ``startOffsetInfo`` and
``msgOffsetInfo`` (per queue, ``;``-joined ``retryFlag queueId startOffset`` and ``retryFlag queueId off1,off2``;
retryFlag 0, Sluice redelivers from the topic itself), ``orderCountInfo`` (empty).

**Receipts.** RocketMQ's receipt (``extraInfo``, written by the client from the answer's header into each message's
``POP_CK`` property) names a checkpoint of its broker's revive queues; Sluice's pops have no such checkpoint: a
delivery is named by a signed receipt handle (broker/semantics/receipt_handle.py), which no RocketMQ string can
carry. So each message comes with ``POP_CK`` set to Sluice's receipt handle (a 5.x client keeps a ``POP_CK`` the
broker set when the answer carries ``startOffsetInfo``, as this one always does), and ``extraInfo`` of ACK_MESSAGE
and CHANGE_MESSAGE_INVISIBLETIME must be that handle; a RocketMQ-built ``extraInfo`` is refused INVALID_PARAMETER.
CHANGE_MESSAGE_INVISIBLETIME's answer adds ``extraInfo``, the new handle (a change starts a new delivery; the old
handle no longer acks), beside RocketMQ's ``popTime``, ``invisibleTime`` and ``reviveQid``.

**ACK_MESSAGE** header: ``consumerGroup``, ``topic``, ``queueId``, ``offset`` (read by nothing here), ``extraInfo``.
SUCCESS, or the refusal's code (codes.py: a stale, foreign or forged handle is INVALID_PARAMETER).

Rights: the gRPC calls' rows (consume on the group and the topic).
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

from broker.errors import BrokerError, ServiceNotAvailableError
from broker.format.message import StoredMessage
from broker.format.system_topics import RETRY_GROUP_TOPIC_PREFIX
from broker.proto import sluice_pb2 as pb
from broker.remoting import header_fields as f
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_entry import decode_stored, encode_stored
from broker.remoting.message_outcomes import Access, failure
from broker.remoting.message_replication import GroupReplication
from broker.remoting.processor import Answer, RequestContext
from broker.remoting.transaction_processor import master_only, refused
from broker.server.admin_processor import encode_stored as stored_entry
from broker.server.consumer_offsets import validate_group
from broker.server.pop_processor import PopProcessor, PopRequest

POP_MESSAGE = RequestCode.POP_MESSAGE
ACK_MESSAGE = RequestCode.ACK_MESSAGE
CHANGE_MESSAGE_INVISIBLETIME = RequestCode.CHANGE_MESSAGE_INVISIBLETIME
POP_CODES = (POP_MESSAGE, ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME)
POP_CK = "POP_CK"  # MessageConst.PROPERTY_POP_CK: the receipt a client acks with
# Pops waiting for messages (pollTime > 0) at once: each holds a thread of its own pool (the pop service waits on
# it), so the transport's workers stay free for everything else; past this a pop is answered POLLING_FULL, as a
# RocketMQ broker answers when its polling queue is full, and the client pops again later.
MAX_HELD_POPS = 64


def _pop_request(request: RemotingCommand) -> pb.PopRequest:
    call = pb.PopRequest(
        consumer_group=f.text(request, "consumerGroup"), topic=f.text(request, "topic"),
        max_msgs=f.int32(request, "maxMsgNums"), invisible_time_ms=f.int64(request, "invisibleTime"),
        poll_time_ms=f.int64(request, "pollTime") if request.ext_fields.get("pollTime") else 0,
        expression_type=f.optional_text(request, "expType", "TAG"), expression=f.optional_text(request, "exp", "*"),
    )
    queue_id = f.int32(request, "queueId")
    if queue_id >= 0:
        call.queue_id = queue_id
    return call


def offset_info(messages: list[StoredMessage]) -> tuple[str, str]:
    """(startOffsetInfo, msgOffsetInfo) of the popped messages, per queue in the order first popped."""
    by_queue: dict[tuple[int, int], list[int]] = defaultdict(list)
    for m in messages:
        retry = 1 if m.topic.startswith(RETRY_GROUP_TOPIC_PREFIX) else 0
        by_queue[(retry, m.queue_id)].append(m.queue_offset)
    start = ";".join(f"{r} {q} {min(offs)}" for (r, q), offs in by_queue.items())
    each = ";".join(f"{r} {q} {','.join(map(str, offs))}" for (r, q), offs in by_queue.items())
    return start, each


class PopMessageProcessors:
    """The three codes, by the request's code."""

    def __init__(self, pops: PopProcessor, access: Access, replication: GroupReplication | None = None,
                 max_held: int = MAX_HELD_POPS) -> None:
        self.pops, self.access = pops, access
        self.replication = replication or GroupReplication(None)
        self._held = threading.BoundedSemaphore(max_held)
        self._waiting = ThreadPoolExecutor(max_held, thread_name_prefix="remoting-pop")

    def shutdown(self) -> None:
        """Held pops end with the pop service's own shutdown (which answers them); no new one is started."""
        self._waiting.shutdown(wait=False, cancel_futures=True)

    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        try:
            master_only(self.replication, RequestCode(request.code).name)
            if request.code == POP_MESSAGE:
                return self._pop(request, context)
            if request.code == ACK_MESSAGE:
                return self._ack(request, context)
            return self._change(request, context)
        except BrokerError as e:
            return refused(request, e)
        except Exception as e:  # noqa: BLE001 - the last line of defence: answered, and the broker serves on
            return failure(request, e)

    # ------------------------------------------------------------------------------------------------ pop
    def _pop(self, request: RemotingCommand, context: RequestContext) -> Answer:
        call = _pop_request(request)
        with self.access.as_caller(context):
            if call.poll_time_ms <= 0:
                return self._popped(request, call)
            caller_context = contextvars.copy_context()  # the held pop runs as this request's caller too
        if not self._held.acquire(blocking=False):
            return request.response(
                int(WireCode.POLLING_FULL),
                remark=f"{MAX_HELD_POPS} pops are waiting for messages already; pop again later",
            )
        answer: Future[RemotingCommand] = Future()

        def run() -> None:
            try:
                answer.set_result(self._popped(request, call))
            except BrokerError as e:
                answer.set_result(refused(request, e))
            except Exception as e:  # noqa: BLE001 - answered, as process() does
                answer.set_result(failure(request, e))
            finally:
                self._held.release()

        try:
            self._waiting.submit(caller_context.run, run)
        except RuntimeError:  # the broker is stopping
            self._held.release()
            raise ServiceNotAvailableError("the broker is stopping; pop from another broker") from None
        return answer

    def _popped(self, request: RemotingCommand, call: pb.PopRequest) -> RemotingCommand:
        pop_time = int(time.time() * 1000)
        got = self.pops.pop(
            PopRequest(call.consumer_group, call.topic, call.queue_id if call.HasField("queue_id") else -1,
                       call.max_msgs, call.invisible_time_ms, call.expression_type or "TAG", call.expression,
                       call.poll_time_ms),
            None,
        )
        messages = []
        for p in got:
            m, _ = decode_stored(p.entry if p.entry is not None else stored_entry(p.message), 0)
            messages.append(replace(m, properties={**m.properties, POP_CK: p.handle},
                                    reconsume_times=max(m.reconsume_times, p.attempt - 1)))
        start, each = offset_info(messages)
        ext = {"popTime": str(pop_time), "invisibleTime": str(call.invisible_time_ms), "reviveQid": "0",
               "restNum": "0", "startOffsetInfo": start, "msgOffsetInfo": each, "orderCountInfo": ""}
        if not messages:
            return request.response(int(WireCode.PULL_NOT_FOUND), remark="no new message", ext_fields=ext)
        return request.response(int(WireCode.SUCCESS), ext_fields=ext,
                                body=b"".join(encode_stored(m) for m in messages))

    # ------------------------------------------------------------------------------------------------ ack, change
    def _ack(self, request: RemotingCommand, context: RequestContext) -> RemotingCommand:
        group, topic, handle = f.text(request, "consumerGroup"), f.text(request, "topic"), f.text(request, "extraInfo")
        validate_group(group)
        with self.access.as_caller(context):
            [refusal] = self.pops.ack(group, topic, [handle])
        if refusal is not None:
            raise refusal
        return request.response(int(WireCode.SUCCESS))

    def _change(self, request: RemotingCommand, context: RequestContext) -> RemotingCommand:
        call = pb.ChangeInvisibleTimeRequest(
            consumer_group=f.text(request, "consumerGroup"), topic=f.text(request, "topic"),
            receipt_handle=f.text(request, "extraInfo"), invisible_time_ms=f.int64(request, "invisibleTime"),
        )
        with self.access.as_caller(context):
            changed = self.pops.change(call.consumer_group, call.topic, call.receipt_handle, call.invisible_time_ms)
        ext = {"popTime": str(changed.invisible_until_ms - call.invisible_time_ms),
               "invisibleTime": str(call.invisible_time_ms), "reviveQid": "0",
               "extraInfo": changed.handle}
        return request.response(int(WireCode.SUCCESS), ext_fields=ext)
