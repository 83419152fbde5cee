"""``apache.rocketmq.v2.MessagingService``: each RPC translated to Sluice's processors (see the package docstring).

Every answer carries a ``Status`` (codes.py); a refused request changes nothing. Every call must carry the client
id header (``x-mq-client-id``), as the RocketMQ proxy requires. Credentials are checked before any of this runs, by
the broker's AuthGate interceptor (broker/auth/gate.py), as for every other service; rights are asked by the
operations each call is translated to (the send, pull, pop, offset and transaction processors), for the caller the
gate admitted (broker/auth/caller.py), and answered FORBIDDEN. What only this protocol does asks here, through the
same table (broker/auth/operations.py): routes and assignments, a client's heartbeat and its leaving, a recall, and
a Telemetry stream's settings as each arrives. A client id is its first user's (clients.py).
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import timestamp_pb2
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as v2s
from rocketmq.grpc_protocol import service_pb2_grpc as v2g

from broker.auth.caller import Caller, current_caller
from broker.auth.operations import Operation, authorize, needs_of
from broker.config import BrokerConfig
from broker.errors import BrokerError, MessageIllegalError, SystemBusyError
from broker.format.message import Prop, decode_entry, java_string_hash, validate_topic
from broker.format.system_topics import is_system_topic
from broker.rmqv2.clients import ClientRegistry
from broker.rmqv2.codes import Code, ProtocolError, status, status_of
from broker.rmqv2.convert import Outgoing, message_id, millis, to_sluice, to_v2
from broker.rmqv2.route_answers import RouteSource, assignments, message_queues, request_address
from broker.semantics import SubscriptionGroupManager
from broker.semantics.pop import PopRequest
from broker.semantics.subscription_group import SubscriptionGroupConfig
from broker.semantics.timer import TimerService
from broker.server.admin_processor import AdminProcessor
from broker.server.consumer_manager import CLUSTERING, ConsumerManager
from broker.server.consumer_offsets import validate_group
from broker.server.pop_processor import PopProcessor
from broker.server.pull_processor import FOUND, PullProcessor, PullRequestArgs
from broker.server.request_guard import MalformedRequest
from broker.server.send_processor import SendProcessor
from broker.server.transaction_processor import EndTransaction, TransactionProcessor

log = logging.getLogger(__name__)

CLIENT_ID_HEADER = "x-mq-client-id"
MAX_SEND_MESSAGES = 1024  # messages one SendMessage may carry (the official clients send one)
MAX_RECEIVE_BATCH = 32  # RocketMQ's pop batch limit
MAX_ACK_ENTRIES = 1024
STREAM_POLL_S = 1.0  # how often an idle Telemetry stream looks whether its client went away
DEADLINE_MARGIN_MS = 200
# The proxy's default producer retry policy: 3 attempts, exponential 10 ms .. 1 s.
PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF_INITIAL_MS, PRODUCER_BACKOFF_MAX_MS, PRODUCER_BACKOFF_MULTIPLIER = 10, 1000, 2.0
RECEIVE_BATCH_SIZE = 32  # told to PushConsumers (the proxy's grpcClientConsumerLongPollingBatchSize)
# A Telemetry settings message is kept for its client's life and walked on each check-back and heartbeat: a
# producer's topics or a consumer's subscriptions, at most this many (applications list a few), and at most this
# size (the topics at their longest name, 255 characters, with room for filter expressions).
MAX_SETTINGS_TOPICS = 256
MAX_SETTINGS_BYTES = 128 << 10

R = TypeVar("R")


@dataclass
class Backend:
    """The broker parts the protocol is translated to."""

    config: BrokerConfig
    sends: SendProcessor
    pulls: PullProcessor
    admin: AdminProcessor
    groups: SubscriptionGroupManager
    consumers: ConsumerManager
    routes: RouteSource
    # The operations every front calls (broker/server/*_processor.py)
    pop_ops: PopProcessor
    transaction_ops: TransactionProcessor
    max_body_bytes: int
    retry_delays_ms: list[int]  # the group backoff told to consumers (the broker's delay levels)
    advertised_address: Callable[[], str]  # this broker's HOST:PORT, for a route request that names no endpoint
    timers: TimerService | None = None


def _metadata(context: grpc.ServicerContext) -> dict[str, str]:
    return {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}


def _unary(response: type[Any]) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Answer a refusal as ``response(status=...)``; anything unexpected as INTERNAL_SERVER_ERROR, logged."""

    def wrap(method: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(method)
        def wrapper(self: MessagingService, request: Any, context: grpc.ServicerContext) -> R:
            try:
                client_id = self._admit(context, method.__name__)
                _well_formed(request)
                return method(self, request, context, client_id)
            except BrokerError as e:
                log.info("%s refused: %s", method.__name__, e.message)
                return response(status=status_of(e))
            except Exception as e:  # the last line of defence: log it, answer INTERNAL_SERVER_ERROR, keep serving
                log.exception("%s failed unexpectedly", method.__name__)
                return response(status=status(Code.INTERNAL_SERVER_ERROR, f"{type(e).__name__}: {e}"))

        return wrapper

    return wrap


def _now_timestamp() -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.GetCurrentTime()
    return ts


class MessagingService(v2g.MessagingServiceServicer):
    def __init__(self, backend: Backend, clients: ClientRegistry) -> None:
        self.b = backend
        self.clients = clients

    def _admit(self, context: grpc.ServicerContext, method: str) -> str:
        """The call's client id, seen now; refused when another user owns it or the client table is full."""
        client_id = self._client_id(context)
        self.clients.seen(client_id, current_caller())
        return client_id

    @staticmethod
    def _client_id(context: grpc.ServicerContext) -> str:
        client_id = _metadata(context).get(CLIENT_ID_HEADER, "")
        if not client_id or len(client_id) > 255:
            raise ProtocolError(Code.CLIENT_ID_REQUIRED, f"header {CLIENT_ID_HEADER} is required (1..255 characters)")
        return client_id

    @staticmethod
    def _topic(name: str) -> str:
        try:
            validate_topic(name)
        except MessageIllegalError as e:
            raise ProtocolError(Code.ILLEGAL_TOPIC, e.message) from None
        if is_system_topic(name):
            raise ProtocolError(Code.ILLEGAL_TOPIC, f"{name!r} is a system topic; clients cannot use it")
        return name

    @staticmethod
    def _group(name: str) -> str:
        try:
            validate_group(name)
        except BrokerError as e:
            raise ProtocolError(Code.ILLEGAL_CONSUMER_GROUP, e.message) from None
        return name

    # ------------------------------------------------------------------------------------------ route, clients
    @_unary(v2s.QueryRouteResponse)
    def QueryRoute(self, request: Any, context: grpc.ServicerContext, client_id: str) -> Any:
        topic = self._topic(request.topic.name)
        authorize(Operation.READ_TOPIC, topics=[topic])
        brokers = self.b.routes.brokers(topic, request_address(request.endpoints) or self.b.advertised_address())
        return v2s.QueryRouteResponse(status=status(), message_queues=message_queues(topic, brokers))

    @_unary(v2s.QueryAssignmentResponse)
    def QueryAssignment(self, request: Any, context: grpc.ServicerContext, client_id: str) -> Any:
        topic, group = self._topic(request.topic.name), self._group(request.group.name)
        authorize(Operation.CONSUME, group=group, topics=[topic])  # before the lookup, which makes a group it lacks
        fifo = self.b.groups.get(group).consume_message_orderly
        brokers = self.b.routes.brokers(topic, request_address(request.endpoints) or self.b.advertised_address())
        found = assignments(topic, brokers, fifo)
        if not found:
            return v2s.QueryAssignmentResponse(status=status(Code.FORBIDDEN, "no readable queue"))
        return v2s.QueryAssignmentResponse(status=status(), assignments=found)

    @staticmethod
    def _client_host(context: grpc.ServicerContext) -> str:
        """The client's address as gRPC saw it (``ipv4:127.0.0.1:54321`` -> ``127.0.0.1``): its born host."""
        peer = context.peer() or ""
        return peer.split(":", 1)[-1].rsplit(":", 1)[0] if ":" in peer else ""

    @_unary(v2s.HeartbeatResponse)
    def Heartbeat(self, request: Any, context: grpc.ServicerContext, client_id: str) -> Any:
        authorize(Operation.HEARTBEAT, group=request.group.name)  # its subscriptions: decided as its settings came
        if request.client_type in (v2.PUSH_CONSUMER, v2.SIMPLE_CONSUMER) and request.HasField("group"):
            group = self._group(request.group.name)
            settings = self.clients.settings(client_id)
            subs = {}
            if settings is not None and settings.HasField("subscription"):
                subs = {s.topic.name: s.expression.expression or "*" for s in settings.subscription.subscriptions}
            self.b.consumers.heartbeat(group, client_id, subs, CLUSTERING)
        return v2s.HeartbeatResponse(status=status())

    @_unary(v2s.NotifyClientTerminationResponse)
    def NotifyClientTermination(self, request: Any, context: grpc.ServicerContext, client_id: str) -> Any:
        """Only the client's own user gets here (``_admit`` refuses another user's call naming the id); a group it
        leaves needs Sub on it, as joining it did (operations.py's LEAVE_GROUP)."""
        if request.HasField("group") and request.group.name:
            group = self._group(request.group.name)
            authorize(Operation.LEAVE_GROUP, group=group)
            self.b.consumers.unregister(group, client_id)
        self.clients.terminate(client_id)
        self.b.pop_ops.release_client(client_id)
        return v2s.NotifyClientTerminationResponse(status=status())

    def _check_settings(self, settings: Any, caller: Caller | None) -> None:
        """Refuse settings past the limits, or naming what the caller may not use: Pub on each topic a producer
        lists (it is sent those topics' check-backs), Sub on a consumer's group and each topic it subscribes."""
        size = settings.ByteSize()
        if size > MAX_SETTINGS_BYTES:
            raise ProtocolError(Code.PAYLOAD_TOO_LARGE, f"settings of {size} bytes; at most {MAX_SETTINGS_BYTES}")
        if settings.HasField("publishing"):
            topics = [self._topic(t.name) for t in settings.publishing.topics]
            needs = needs_of(Operation.PUBLISHER_SETTINGS, topics=topics)
        elif settings.HasField("subscription"):
            group = self._group(settings.subscription.group.name)
            topics = [self._topic(e.topic.name) for e in settings.subscription.subscriptions]
            needs = needs_of(Operation.SUBSCRIBER_SETTINGS, group=group, topics=topics)
        else:
            raise ProtocolError(Code.BAD_REQUEST, "settings carry neither publishing nor subscription")
        if len(topics) > MAX_SETTINGS_TOPICS:
            raise ProtocolError(Code.PAYLOAD_TOO_LARGE, f"settings list {len(topics)} topics; at most "
                                                        f"{MAX_SETTINGS_TOPICS}")
        if caller is not None:
            caller.require(*needs)

    def _settings_answer(self, settings: Any) -> Any:
        """The client's settings merged with the broker's (RocketMQ proxy's GrpcClientSettingsManager). A group the
        settings name is not created here: the consumer's first receive or heartbeat does that, as in RocketMQ, on
        a call that needs the right to consume it; until then the defaults a new group would get are told."""
        out = v2.Settings()
        out.CopyFrom(settings)
        if settings.HasField("publishing"):
            out.publishing.max_body_size = self.b.max_body_bytes
            out.publishing.validate_message_type = True
            out.backoff_policy.Clear()
            out.backoff_policy.max_attempts = PRODUCER_MAX_ATTEMPTS
            exp = out.backoff_policy.exponential_backoff
            exp.initial.FromMilliseconds(PRODUCER_BACKOFF_INITIAL_MS)
            exp.max.FromMilliseconds(PRODUCER_BACKOFF_MAX_MS)
            exp.multiplier = PRODUCER_BACKOFF_MULTIPLIER
        elif settings.HasField("subscription"):
            group = self._group(settings.subscription.group.name)
            cfg = self.b.groups.peek(group) or SubscriptionGroupConfig(group)
            out.subscription.fifo = cfg.consume_message_orderly
            out.subscription.receive_batch_size = RECEIVE_BATCH_SIZE
            out.subscription.long_polling_timeout.FromMilliseconds(self.b.config.rmqv2_max_long_polling_ms)
            out.backoff_policy.Clear()
            out.backoff_policy.max_attempts = cfg.retry_max_times + 1
            for delay_ms in self.b.retry_delays_ms:
                out.backoff_policy.customized_backoff.next.add().FromMilliseconds(delay_ms)
        else:
            raise ProtocolError(Code.BAD_REQUEST, "settings carry neither publishing nor subscription")
        out.metric.on = False  # a PushConsumer stalls without a metric setting (rocketmq-clients 1168)
        return out

    def Telemetry(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        caller = current_caller()  # the reader thread below does not see this thread's context: passed along
        try:
            client_id = self._client_id(context)
            outbox = self.clients.open_stream(client_id, caller)
        except BrokerError as e:
            yield v2s.TelemetryCommand(status=status_of(e))
            return
        reader = threading.Thread(target=self._read_telemetry, args=(client_id, request_iterator, outbox, caller),
                                  name="rmqv2-telemetry", daemon=True)
        reader.start()
        try:
            while context.is_active():
                try:
                    item = outbox.get(timeout=STREAM_POLL_S)
                except queue.Empty:  # look whether the client is still there
                    continue
                if item is None:
                    return
                yield item
        finally:
            self.clients.close_stream(client_id, outbox)

    def _read_telemetry(self, client_id: str, commands: Iterator[Any], outbox: Any, caller: Caller | None) -> None:
        try:
            for command in commands:
                if not isinstance(command, MalformedRequest) and command.WhichOneof("command") != "settings":
                    continue  # thread stack traces, verification results: nothing asked them of this broker
                try:
                    _well_formed(command)
                    self._check_settings(command.settings, caller)  # refused: the previous settings stay
                    answer = self._settings_answer(command.settings)
                    self.clients.update_settings(client_id, command.settings, caller)
                    reply = v2s.TelemetryCommand(status=status(), settings=answer)
                except BrokerError as e:
                    reply = v2s.TelemetryCommand(status=status_of(e))
                try:
                    outbox.put_nowait(reply)
                except queue.Full:  # the client does not read its stream; it sends its settings again later
                    log.warning("Telemetry of %s: outbox full; settings answer dropped", client_id)
        except grpc.RpcError:
            pass  # the client closed or cancelled its stream
        except Exception:  # this thread's last line of defence: log it, end the stream
            log.exception("Telemetry of %s: reading the stream failed", client_id)
        finally:
            try:
                outbox.put_nowait(None)
            except queue.Full:  # the writer notices the call ending on its own
                pass

    # ------------------------------------------------------------------------------------------ send
    @_unary(v2s.SendMessageResponse)
    def SendMessage(self, request: Any, context: grpc.ServicerContext, client_id: str) -> Any:
        if not request.messages:
            raise ProtocolError(Code.MESSAGE_CORRUPTED, "no message to send")
        if len(request.messages) > MAX_SEND_MESSAGES:
            raise ProtocolError(Code.BAD_REQUEST, f"{len(request.messages)} messages; at most {MAX_SEND_MESSAGES}")
        topic = self._topic(request.messages[0].topic.name)
        authorize(Operation.PUBLISH, topics=[topic])  # before this protocol's checks of the messages, as the proxy
        born_host = self._client_host(context)
        outgoing: list[Outgoing] = []
        for m in request.messages:
            if m.topic.name != topic:
                raise ProtocolError(Code.MESSAGE_CORRUPTED, "every message of one request must have the same topic")
            if not m.body:
                raise ProtocolError(Code.MESSAGE_BODY_EMPTY, "message body is empty")
            if len(m.body) > self.b.max_body_bytes:
                raise ProtocolError(Code.MESSAGE_BODY_TOO_LARGE,
                                    f"body is {len(m.body)} bytes; the maximum is {self.b.max_body_bytes}")
            try:
                outgoing.append(to_sluice(m, born_host))
            except MessageIllegalError as e:
                raise ProtocolError(_illegal_code(e.message), e.message) from None
        entries = [self._send_one(o) for o in outgoing]
        codes = {e.status.code for e in entries}
        overall = status() if codes == {Code.OK} else status(Code.MULTIPLE_RESULTS) if len(codes) > 1 else \
            entries[0].status
        return v2s.SendMessageResponse(status=overall, entries=entries)

    def _send_one(self, o: Outgoing) -> Any:
        try:
            queue_id = -1
            if o.message_group:  # FIFO: one queue per message group, so the group's order is kept
                queue_id = abs(java_string_hash(o.message_group)) % self.b.sends.topics.writable_queue_nums(o.topic)
            transactional = o.message_type == v2.TRANSACTION
            outcome = self.b.sends.send_message(
                o.topic, queue_id, o.body, o.properties, sys_flag=o.sys_flag, born_timestamp=o.born_timestamp_ms,
                producer_group=o.topic if transactional else "", transactional=transactional,
                transaction_id=o.message_id if transactional else "",
            )
        except BrokerError as e:
            return v2s.SendResultEntry(status=status_of(e))
        if outcome.status != "SEND_OK":
            return v2s.SendResultEntry(status=status(Code.MASTER_PERSISTENCE_TIMEOUT, f"stored; {outcome.status}"))
        r = outcome.result
        entry = v2s.SendResultEntry(status=status(), message_id=o.message_id, transaction_id=outcome.transaction_id,
                                    offset=r.queue_offsets[0] if r.queue_offsets else 0)
        deliver = o.properties.get(Prop.TIMER_DELIVER_MS, "")
        if self.b.timers is not None and deliver.isdigit() and int(deliver) > _wall_ms() and r.queue_offsets:
            # stored in the timer queue (a time still ahead): the offset there is what a recall names
            entry.recall_handle = self.b.timers.recall_handle(o.topic, r.queue_offsets[0], int(deliver))
        return entry

    @_unary(v2s.EndTransactionResponse)
    def EndTransaction(self, request: Any, context: grpc.ServicerContext, client_id: str) -> Any:
        topic = self._topic(request.topic.name)
        if not request.transaction_id:
            raise ProtocolError(Code.INVALID_TRANSACTION_ID, "transaction id is empty")
        if request.resolution not in (v2.COMMIT, v2.ROLLBACK):
            raise ProtocolError(Code.BAD_REQUEST, "resolution must be COMMIT or ROLLBACK")
        self.b.transaction_ops.end(EndTransaction(
            request.resolution == v2.COMMIT, transaction_id=request.transaction_id,
            from_check=request.source == v2.SOURCE_SERVER_CHECK, producer_group=topic,
        ))
        return v2s.EndTransactionResponse(status=status())

    # ------------------------------------------------------------------------------------------ pop
    def _polling_ms(self, request: Any, context: grpc.ServicerContext) -> int:
        """The RocketMQ proxy's rule: the asked time (else the deadline less half the request timeout), clamped to
        min..max, and within the deadline."""
        cfg = self.b.config
        remaining = context.time_remaining()
        remaining_ms = int(remaining * 1000) - DEADLINE_MARGIN_MS if remaining is not None else 1 << 40
        polling = request.long_polling_timeout.ToMilliseconds() if request.HasField("long_polling_timeout") else \
            remaining_ms - 1500
        polling = min(max(polling, cfg.rmqv2_min_long_polling_ms), cfg.rmqv2_max_long_polling_ms)
        if polling > remaining_ms:
            if remaining_ms < cfg.rmqv2_min_long_polling_ms:
                raise ProtocolError(Code.ILLEGAL_POLLING_TIME,
                                    "the deadline leaves too little time for long polling")
            polling = remaining_ms
        return polling

    def ReceiveMessage(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            client_id = self._admit(context, "ReceiveMessage")
            _well_formed(request)
            topic, group = self._topic(request.message_queue.topic.name), self._group(request.group.name)
            authorize(Operation.CONSUME, group=group, topics=[topic])  # before the polling time is checked
            expression = request.filter_expression
            kind = "SQL92" if expression.type == v2.SQL else "TAG"
            pop = PopRequest(
                group, topic, -1, max(1, min(request.batch_size or RECEIVE_BATCH_SIZE, MAX_RECEIVE_BATCH)),
                request.invisible_duration.ToMilliseconds(), kind, expression.expression or "*",
                self._polling_ms(request, context), client_id if request.auto_renew else "",
                request.attempt_id if request.HasField("attempt_id") else "",
            )
            popped = self.b.pop_ops.pop(pop, context.time_remaining())
        except BrokerError as e:
            yield v2s.ReceiveMessageResponse(status=_receive_status(e))
            yield v2s.ReceiveMessageResponse(delivery_timestamp=_now_timestamp())
            return
        except Exception as e:  # the last line of defence: log it, answer INTERNAL_SERVER_ERROR, keep serving
            log.exception("ReceiveMessage failed unexpectedly")
            yield v2s.ReceiveMessageResponse(status=status(Code.INTERNAL_SERVER_ERROR, f"{type(e).__name__}: {e}"))
            yield v2s.ReceiveMessageResponse(delivery_timestamp=_now_timestamp())
            return
        if not popped:
            yield v2s.ReceiveMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
            yield v2s.ReceiveMessageResponse(delivery_timestamp=_now_timestamp())
            return
        sent = 0
        try:
            yield v2s.ReceiveMessageResponse(status=status())
            for p in popped:
                invisible_ms = max(p.invisible_until_ms - _wall_ms(), 0)
                yield v2s.ReceiveMessageResponse(message=to_v2(p.message, receipt_handle=p.handle, attempt=p.attempt,
                                                               invisible_ms=invisible_ms))
                sent += 1
            yield v2s.ReceiveMessageResponse(delivery_timestamp=_now_timestamp())
        finally:
            if sent < len(popped):  # the call ended before the client had them: visible again soon, as the proxy does
                self.b.pop_ops.release(popped[sent:], group, topic)

    @_unary(v2s.AckMessageResponse)
    def AckMessage(self, request: Any, context: grpc.ServicerContext, client_id: str) -> Any:
        topic, group = self._topic(request.topic.name), self._group(request.group.name)
        if len(request.entries) > MAX_ACK_ENTRIES:
            raise ProtocolError(Code.BAD_REQUEST, f"{len(request.entries)} entries; at most {MAX_ACK_ENTRIES}")
        outcomes = self.b.pop_ops.ack(group, topic, [e.receipt_handle for e in request.entries])
        results = [v2s.AckMessageResultEntry(message_id=entry.message_id, receipt_handle=entry.receipt_handle,
                                             status=status() if e is None else status_of(e))
                   for entry, e in zip(request.entries, outcomes, strict=True)]
        codes = {r.status.code for r in results}
        overall = status() if codes <= {Code.OK} else results[0].status if len(codes) == 1 else \
            status(Code.MULTIPLE_RESULTS)
        return v2s.AckMessageResponse(status=overall, entries=results)

    @_unary(v2s.ChangeInvisibleDurationResponse)
    def ChangeInvisibleDuration(self, request: Any, context: grpc.ServicerContext, client_id: str) -> Any:
        topic, group = self._topic(request.topic.name), self._group(request.group.name)
        p = self.b.pop_ops.change(group, topic, request.receipt_handle, request.invisible_duration.ToMilliseconds())
        return v2s.ChangeInvisibleDurationResponse(status=status(), receipt_handle=p.handle)

    @_unary(v2s.ForwardMessageToDeadLetterQueueResponse)
    def ForwardMessageToDeadLetterQueue(self, request: Any, context: grpc.ServicerContext, client_id: str) -> Any:
        topic, group = self._topic(request.topic.name), self._group(request.group.name)
        self.b.pop_ops.forward_to_dlq(group, topic, request.receipt_handle)
        return v2s.ForwardMessageToDeadLetterQueueResponse(status=status())

    # ------------------------------------------------------------------------------------------ pull, offsets
    def PullMessage(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            self._admit(context, "PullMessage")
            _well_formed(request)
            topic, group = self._topic(request.message_queue.topic.name), self._group(request.group.name)
            expression = request.filter_expression
            hold_ms = request.long_polling_timeout.ToMilliseconds() if request.HasField("long_polling_timeout") else 0
            args = PullRequestArgs(group, topic, request.message_queue.id, request.offset,
                                   max(0, min(request.batch_size, MAX_RECEIVE_BATCH * 32)), 0, hold_ms,
                                   expression.expression or "*", -1, "SQL92" if expression.type == v2.SQL else "TAG")
            out = self.b.pulls.pull(args, context.time_remaining(), context.add_callback)
        except BrokerError as e:
            yield v2s.PullMessageResponse(status=status_of(e))
            return
        if out.status == FOUND:
            yield v2s.PullMessageResponse(status=status())
            ends = [*out.entry_positions[1:], len(out.buffer)]
            for start, end in zip(out.entry_positions, ends, strict=True):
                yield v2s.PullMessageResponse(message=to_v2(decode_entry(out.buffer, start, end)))
        else:
            yield v2s.PullMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, out.status))
        yield v2s.PullMessageResponse(next_offset=out.next_begin_offset)

    @_unary(v2s.UpdateOffsetResponse)
    def UpdateOffset(self, request: Any, context: grpc.ServicerContext, client_id: str) -> Any:
        topic, group = self._topic(request.message_queue.topic.name), self._group(request.group.name)
        self.b.admin.update_consumer_offsets(group, {(topic, request.message_queue.id): request.offset})
        return v2s.UpdateOffsetResponse(status=status())

    @_unary(v2s.GetOffsetResponse)
    def GetOffset(self, request: Any, context: grpc.ServicerContext, client_id: str) -> Any:
        topic, group = self._topic(request.message_queue.topic.name), self._group(request.group.name)
        found = self.b.admin.query_consumer_offsets(group, topic, request.message_queue.id)
        if request.message_queue.id not in found:
            return v2s.GetOffsetResponse(status=status(Code.OFFSET_NOT_FOUND, "the group has no offset for the queue"))
        return v2s.GetOffsetResponse(status=status(), offset=found[request.message_queue.id])

    @_unary(v2s.QueryOffsetResponse)
    def QueryOffset(self, request: Any, context: grpc.ServicerContext, client_id: str) -> Any:
        topic, queue_id = self._topic(request.message_queue.topic.name), request.message_queue.id
        if request.query_offset_policy == v2.TIMESTAMP:
            offset = self.b.admin.search_offset(topic, queue_id, _ms(request.timestamp, Code.BAD_REQUEST, "timestamp"))
        else:
            ranges = {q: (lo, hi) for q, lo, hi in self.b.admin.queue_offsets(topic)}
            if queue_id not in ranges:
                raise ProtocolError(Code.BAD_REQUEST, f"queue {queue_id} of {topic!r} does not exist")
            offset = ranges[queue_id][0 if request.query_offset_policy == v2.BEGINNING else 1]
        return v2s.QueryOffsetResponse(status=status(), offset=offset)

    # ------------------------------------------------------------------------------------------ not offered
    @_unary(v2s.RecallMessageResponse)
    def RecallMessage(self, request: Any, context: grpc.ServicerContext, client_id: str) -> Any:
        topic = self._topic(request.topic.name)
        authorize(Operation.PUBLISH, topics=[topic])
        if self.b.timers is None:
            return v2s.RecallMessageResponse(status=status(Code.UNSUPPORTED, "timer messages are not enabled"))
        return v2s.RecallMessageResponse(status=status(), message_id=self.b.timers.recall(topic, request.recall_handle))

    @_unary(v2s.SyncLiteSubscriptionResponse)
    def SyncLiteSubscription(self, request: Any, context: grpc.ServicerContext, client_id: str) -> Any:
        authorize(Operation.CONSUME, group=request.group.name, topics=[request.topic.name])
        return v2s.SyncLiteSubscriptionResponse(status=status(Code.UNSUPPORTED, "lite topics are not supported"))


def _well_formed(request: Any) -> None:
    """BAD_REQUEST for bytes that were no request of the method (the broker's request guard marks them)."""
    if isinstance(request, MalformedRequest):
        raise ProtocolError(Code.BAD_REQUEST, f"{request.method}: the request is not a valid protobuf message of its "
                                              f"type ({request.reason})")


def _ms(value: Any, code: int, what: str) -> int:
    """A request's Timestamp in milliseconds; refused with ``code`` outside Timestamp's range."""
    try:
        return millis(value, what)
    except MessageIllegalError as e:
        raise ProtocolError(code, e.message) from None


def _receive_status(e: BrokerError) -> Any:
    if isinstance(e, SystemBusyError):
        return status(Code.TOO_MANY_REQUESTS, e.message)
    return status_of(e)


def _illegal_code(text: str) -> int:
    """The proxy's code for a message it refuses, by what the refusal names."""
    lowered = text.lower()
    for word, code in (("tag", Code.ILLEGAL_MESSAGE_TAG), ("key ", Code.ILLEGAL_MESSAGE_KEY),
                       ("delivery timestamp", Code.ILLEGAL_DELIVERY_TIME),
                       ("message group", Code.ILLEGAL_MESSAGE_GROUP), ("message id", Code.ILLEGAL_MESSAGE_ID),
                       ("user propert", Code.ILLEGAL_MESSAGE_PROPERTY_KEY)):
        if word in lowered:
            return code
    return Code.MESSAGE_CORRUPTED


def _wall_ms() -> int:
    return int(time.time() * 1000)


__all__ = ["Backend", "MessagingService", "message_id"]
