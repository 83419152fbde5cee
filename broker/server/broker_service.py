"""The gRPC servicer: turns requests into processor calls and results into responses, nothing more.

Every method runs under ``_answer``, which maps a BrokerError to its gRPC status, puts the RocketMQ-style response
code in the trailing metadata and counts it; anything unexpected is logged with its traceback and answered as
INTERNAL (SYSTEM_ERROR) rather than leaking a stack trace to the client. INTERNAL means a broker bug: every bad
request is refused with its own code (a request that is not even a valid protobuf message too, see request_guard).
Status details are cut to a size every receiver accepts (status.capped_details).
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NoReturn, TypeVar

import grpc

from broker.auth.accounts_admin import AccountsAdmin
from broker.auth.operations import Operation, authorize
from broker.errors import BrokerError, InvalidArgumentError, ResponseCode, ServiceNotAvailableError
from broker.format.message import Prop, validate_topic
from broker.format.system_topics import refuse_system_topic
from broker.proto import sluice_pb2 as pb
from broker.proto import sluice_pb2_grpc as pb_grpc
from broker.proto.status import RESPONSE_CODE_KEY, capped_details, grpc_code_for
from broker.semantics import EndResult, QueueLockManager, SubscriptionGroupConfig, TransactionSummary
from broker.semantics.pop import PopRequest
from broker.server.admin_processor import AdminProcessor, encode_stored, pack_entries
from broker.server.call_streams import CallStreams, UnaryBehavior
from broker.server.check_streams import CheckHub, open_check_stream
from broker.server.consumer_manager import BROADCASTING, CLUSTERING, ConsumerManager
from broker.server.consumer_offsets import validate_group
from broker.server.metrics import BrokerMetrics
from broker.server.pop_processor import PopProcessor
from broker.server.pull_processor import PullProcessor, PullRequestArgs
from broker.server.request_guard import refuse_if_malformed
from broker.server.retry_processor import GROUP_SETTINGS, RetryProcessor, SendBack
from broker.server.send_dedup import SendDeduplicator, SendKey, batch_key, entry_keys
from broker.server.send_processor import SendOutcome, SendProcessor
from broker.server.topic_config import TopicConfig
from broker.server.transaction_processor import EndTransaction, TransactionProcessor
from broker.store.store_results import PutResult

log = logging.getLogger(__name__)

R = TypeVar("R")
Handler = Callable[[Any, Any, grpc.ServicerContext], R]


def _answer(method: Handler[R]) -> Handler[R]:
    @functools.wraps(method)
    def wrapper(self: BrokerService, request: Any, context: grpc.ServicerContext) -> R:
        try:
            refuse_if_malformed(request)
            return method(self, request, context)
        except BrokerError as e:
            self._refuse(method.__name__, e, context)
        except OSError as e:  # the disk, not the request nor the broker's logic: the caller may retry later
            log.exception("%s failed on an I/O error", method.__name__)
            self._refuse(method.__name__, ServiceNotAvailableError.files_failed(e), context)
        except Exception as e:  # the last line of defence: log it, answer INTERNAL, keep serving
            if isinstance(e, grpc.RpcError):  # context.abort's own exception
                raise
            self.metrics.errors.inc(labels=(("code", ResponseCode.SYSTEM_ERROR.name),))
            log.exception("%s failed unexpectedly", method.__name__)
            context.set_trailing_metadata(((RESPONSE_CODE_KEY, str(int(ResponseCode.SYSTEM_ERROR))),))
            context.abort(
                grpc.StatusCode.INTERNAL,
                capped_details(f"internal broker error ({type(e).__name__}: {e}); see broker log"),
            )
        raise AssertionError("unreachable: context.abort raises")

    return wrapper


def _topic_info(t: TopicConfig, identity: tuple[str, str] = ("", "")) -> pb.TopicInfo:
    return pb.TopicInfo(
        topic=t.topic, read_queue_nums=t.read_queue_nums, write_queue_nums=t.write_queue_nums, perm=t.perm,
        cluster=identity[0], broker_name=identity[1],
    )


def _send_response(outcome: SendOutcome) -> pb.SendResponse:
    r = outcome.result
    prefix = r.msg_id_prefix if r.commitlog_offsets else ""
    return pb.SendResponse(
        status=pb.SendStatus.Value(outcome.status), commitlog_offsets=r.commitlog_offsets, queue_ids=r.queue_ids,
        queue_offsets=r.queue_offsets, msg_id_prefix=prefix, store_timestamp=r.store_timestamp,
        transaction_id=outcome.transaction_id,
    )


MAX_CLIENT_ID_CHARS = 255
MAX_LOCK_QUEUES = 4096  # queues one LockBatchMQ / UnlockBatchMQ call may name (a consumer's share of its topics)
MAX_SUBSCRIPTIONS = 1024  # topics one consumer subscribes to: the broker keeps them per consumer until it expires
MAX_SUBSCRIPTION_EXPRESSION_CHARS = 16 * 1024  # the longest expression a pull takes (SQL92's bound; tags: 4096)
# All of a consumer's subscriptions together (topics and expressions), so that what the broker keeps for its
# consumers is bounded: ConsumerManager's max_consumers times this.
MAX_SUBSCRIPTION_CHARS = 256 * 1024


def _check_client_id(client_id: str) -> None:
    if not client_id or len(client_id) > MAX_CLIENT_ID_CHARS:
        raise InvalidArgumentError(
            f"client_id {client_id[:40]!r} must be 1..{MAX_CLIENT_ID_CHARS} characters: it names the consumer "
            "in its group (the client library sets it)"
        )


def _check_heartbeat(request: pb.HeartbeatRequest) -> None:
    """A consumer's model and subscriptions, before anything is recorded: the topics must be names a client may
    read (a system topic is refused as a pull of it is), the expressions bounded (they are kept per consumer)."""
    if request.model not in (pb.CLUSTERING, pb.BROADCASTING):
        raise InvalidArgumentError(
            f"message model {request.model} is not CLUSTERING ({pb.CLUSTERING}) or BROADCASTING ({pb.BROADCASTING})"
        )
    if len(request.subscriptions) > MAX_SUBSCRIPTIONS:
        raise InvalidArgumentError(
            f"{len(request.subscriptions)} subscriptions in one heartbeat; a consumer may subscribe to at most "
            f"{MAX_SUBSCRIPTIONS} topics"
        )
    total = sum(len(t) + len(e) for t, e in request.subscriptions.items())
    if total > MAX_SUBSCRIPTION_CHARS:
        raise InvalidArgumentError(
            f"the subscriptions of one consumer take {total} characters; at most {MAX_SUBSCRIPTION_CHARS}"
        )
    for topic, expression in request.subscriptions.items():
        validate_topic(topic)
        refuse_system_topic(topic, "subscribe to")
        if len(expression) > MAX_SUBSCRIPTION_EXPRESSION_CHARS:
            raise InvalidArgumentError(
                f"the subscription expression of {topic!r} is {len(expression)} characters; at most "
                f"{MAX_SUBSCRIPTION_EXPRESSION_CHARS} (tag or SQL92 expression)"
            )


def _group(cfg: SubscriptionGroupConfig) -> pb.SubscriptionGroup:
    return pb.SubscriptionGroup(
        group_name=cfg.group_name, consume_enable=cfg.consume_enable,
        consume_from_min_enable=cfg.consume_from_min_enable, consume_broadcast_enable=cfg.consume_broadcast_enable,
        retry_queue_nums=cfg.retry_queue_nums, retry_max_times=cfg.retry_max_times,
        consume_message_orderly=cfg.consume_message_orderly,
    )


def end_transaction_of(request: pb.EndTransactionRequest) -> EndTransaction:
    """sluice.v1's EndTransaction as the operation's request (the remoting front's END_TRANSACTION too)."""
    target = request.WhichOneof("target")
    return EndTransaction(
        request.commit,
        transaction_id=request.transaction_id if target == "transaction_id" else "",
        half_commitlog_offset=request.half_commitlog_offset if target == "half_commitlog_offset" else None,
        from_check=request.from_check,
        committed_attempts=list(request.committed_attempts) if request.restrict_attempts else None,
        producer_group=request.producer_group,
        expected_messages=request.expected_messages if request.HasField("expected_messages") else None,
        record_unknown=request.record_unknown,
    )


def _end_response(r: EndResult) -> pb.EndTransactionResponse:
    return pb.EndTransactionResponse(transaction_id=r.txn_id, status=r.status.value, already_ended=r.already_ended,
                                     half_count=r.half_count, complete=r.complete)


def _info(t: TransactionSummary) -> pb.TransactionInfo:
    return pb.TransactionInfo(
        transaction_id=t.txn_id, producer_group=t.producer_group, status=t.status.value, half_count=t.half_count,
        first_store_ms=t.first_store_ms, last_activity_ms=t.last_activity_ms, check_times=t.check_times,
        ended_ms=t.ended_ms, complete=t.complete, held_queues=list(t.held_queues),
    )


class BrokerService(pb_grpc.BrokerServicer):
    def __init__(
        self, sends: SendProcessor, pulls: PullProcessor, admin: AdminProcessor, consumers: ConsumerManager,
        metrics: BrokerMetrics, broker_stats: Callable[[], dict[str, float]],
    ) -> None:
        self.sends, self.pulls, self.admin, self.consumers = sends, pulls, admin, consumers
        self.metrics = metrics
        self.broker_stats = broker_stats
        # Broker semantics (set by the controller once its services run; see broker.semantics)
        self.transactions: TransactionProcessor | None = None
        self.check_hub = CheckHub()  # the controller's own, with its stream limit, once transactions run
        self.retries: RetryProcessor | None = None
        self.locks: QueueLockManager | None = None
        self.dedup: SendDeduplicator | None = None  # retried sends stored at most once (send_dedup.py)
        self.identity: tuple[str, str] = ("", "")  # (cluster, broker name) reported in TopicInfo
        self.pops: PopProcessor | None = None  # pop consumption (broker/semantics/pop.py)
        self.accounts: AccountsAdmin | None = None  # users and access control (broker/auth)
        # How each request of a SendStream and a PullStream is served: SendMessage and PullMessage as the server's
        # interceptors wrap them (set by the controller; call_streams.py), and the limit of open streams.
        self.send_one: UnaryBehavior = self.SendMessage
        self.pull_one: UnaryBehavior = self.PullMessage
        self.call_streams = CallStreams(max_streams=1 << 30)

    def _dedup(
        self, key: SendKey | None, retry: bool, keys: Callable[[], list[SendKey | None]]
    ) -> AbstractContextManager[PutResult | None]:
        if key is None or self.dedup is None:
            return nullcontext(None)
        return self.dedup.attempt(key, retry, keys)

    def _refuse(self, what: str, e: BrokerError, context: grpc.ServicerContext) -> NoReturn:
        """Answer a refused call: its RocketMQ code in the trailers, the matching gRPC status, the reason."""
        self.metrics.errors.inc(labels=(("code", e.code.name),))
        details = capped_details(e.message)
        log.info("%s refused: %s (%s)", what, details, e.code.name)
        context.set_trailing_metadata(((RESPONSE_CODE_KEY, str(int(e.code))),))
        context.abort(grpc_code_for(e.code), details)
        raise AssertionError("unreachable: context.abort raises")

    # ---------------------------------------------------------------------------------------------- send / pull
    @_answer
    def SendMessage(self, request: pb.SendMessageRequest, context: grpc.ServicerContext) -> pb.SendResponse:
        properties = dict(request.properties)
        uniq = properties.get(Prop.UNIQ_KEY)
        plain = not (request.transactional or request.transaction_id)
        key = SendKey(request.topic, uniq) if uniq and plain and self.dedup is not None else None
        if key is not None:  # before the key is held and a retry looked up among what is stored (it may wait)
            self.sends.authorize_deduplicated_send(request.topic)
        with self._dedup(key, request.retry, lambda: [key]) as stored:
            if stored is not None:
                return _send_response(SendOutcome("SEND_OK", stored))
            outcome = self.sends.send_message(
                request.topic, request.queue_id, request.body, properties, flag=request.flag,
                sys_flag=request.sys_flag, born_timestamp=request.born_timestamp,
                reconsume_times=request.reconsume_times, producer_group=request.producer_group,
                transactional=request.transactional, transaction_id=request.transaction_id,
            )
        return _send_response(outcome)

    def SendStream(
        self, requests: Iterator[pb.SendMessageRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.SendStreamAnswer]:
        return self._streamed("SendStream", self.call_streams.serve(requests, context, self.send_one,
                                                                    pb.SendStreamAnswer), context)

    def PullStream(
        self, requests: Iterator[pb.PullRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.PullStreamAnswer]:
        return self._streamed("PullStream", self.call_streams.serve(requests, context, self.pull_one,
                                                                    pb.PullStreamAnswer), context)

    def _streamed(self, method: str, answers: Iterator[R], context: grpc.ServicerContext) -> Iterator[R]:
        try:
            first = next(answers, None)
        except BrokerError as e:  # refused when it opens (the limit, a stopping broker), as a unary call is
            self._refuse(method, e, context)
        if first is not None:
            yield first
            yield from answers

    @_answer
    def SendBatch(self, request: pb.SendBatchRequest, context: grpc.ServicerContext) -> pb.SendResponse:
        entries = request.entries
        key = batch_key(entries) if self.dedup is not None and not request.transaction_id else None
        if key is not None and request.retry:  # before a retry is looked up among what is stored (it may wait)
            self.sends.authorize_deduplicated_batch(entries, request.count)
        with self._dedup(key, request.retry, lambda: entry_keys(entries)) as stored:
            if stored is not None:
                return _send_response(SendOutcome("SEND_OK", stored))
            outcome = self.sends.send_batch(entries, request.count, request.transaction_id, request.producer_group,
                                            attempt=request.attempt, coordinator=request.coordinator)
        return _send_response(outcome)

    @_answer
    def PullMessage(self, request: pb.PullRequest, context: grpc.ServicerContext) -> pb.PullResponse:
        args = PullRequestArgs(
            request.consumer_group, request.topic, request.queue_id, request.queue_offset, request.max_msgs,
            request.max_bytes, request.suspend_timeout_ms, request.tag_expression,
            request.commit_offset if request.HasField("commit_offset") else -1, request.expression_type,
        )
        out = self.pulls.pull(args, context.time_remaining(), context.add_callback)
        return pb.PullResponse(
            status=pb.PullStatus.Value(out.status), next_begin_offset=out.next_begin_offset,
            min_offset=out.min_offset, max_offset=out.max_offset, entries=out.buffer,
            entry_positions=out.entry_positions,
        )

    # ---------------------------------------------------------------------------------------------- offsets
    @_answer
    def QueryConsumerOffset(
        self, request: pb.QueryConsumerOffsetRequest, context: grpc.ServicerContext
    ) -> pb.QueryConsumerOffsetResponse:
        found = self.admin.query_consumer_offsets(request.consumer_group, request.topic, request.queue_id)
        return pb.QueryConsumerOffsetResponse(
            offsets=[pb.QueueOffset(topic=request.topic, queue_id=q, offset=o) for q, o in sorted(found.items())]
        )

    @_answer
    def UpdateConsumerOffsets(
        self, request: pb.UpdateConsumerOffsetsRequest, context: grpc.ServicerContext
    ) -> pb.UpdateConsumerOffsetsResponse:
        offsets = {(o.topic, o.queue_id): o.offset for o in request.offsets}
        return pb.UpdateConsumerOffsetsResponse(
            updated=self.admin.update_consumer_offsets(request.consumer_group, offsets)
        )

    @_answer
    def GetQueueOffsets(
        self, request: pb.GetQueueOffsetsRequest, context: grpc.ServicerContext
    ) -> pb.GetQueueOffsetsResponse:
        ranges = self.admin.queue_offsets(request.topic)
        return pb.GetQueueOffsetsResponse(
            queues=[pb.QueueRange(queue_id=q, min_offset=lo, max_offset=hi) for q, lo, hi in ranges]
        )

    @_answer
    def SearchOffsetByTimestamp(
        self, request: pb.SearchOffsetByTimestampRequest, context: grpc.ServicerContext
    ) -> pb.SearchOffsetByTimestampResponse:
        offset = self.admin.search_offset(request.topic, request.queue_id, request.timestamp_ms)
        return pb.SearchOffsetByTimestampResponse(offset=offset)

    # ---------------------------------------------------------------------------------------------- queries
    @_answer
    def QueryMessageByKey(
        self, request: pb.QueryMessageByKeyRequest, context: grpc.ServicerContext
    ) -> pb.MessagesResponse:
        found = self.admin.query_by_key(
            request.topic, request.key, request.max_num, request.begin_timestamp_ms, request.end_timestamp_ms
        )
        buffer, positions = pack_entries(found)  # as stored, byte for byte (as pulls)
        return pb.MessagesResponse(entries=buffer, entry_positions=positions)

    @_answer
    def ViewMessageById(self, request: pb.ViewMessageByIdRequest, context: grpc.ServicerContext) -> pb.MessagesResponse:
        buffer, positions = pack_entries([self.admin.view_by_id(request.msg_id)])
        return pb.MessagesResponse(entries=buffer, entry_positions=positions)

    # ---------------------------------------------------------------------------------------------- topics
    @_answer
    def CreateTopic(self, request: pb.CreateTopicRequest, context: grpc.ServicerContext) -> pb.TopicInfo:
        return _topic_info(self.admin.create_topic(request.topic, request.queue_nums, request.if_not_exists),
                           self.identity)

    @_answer
    def DeleteTopic(self, request: pb.DeleteTopicRequest, context: grpc.ServicerContext) -> pb.DeleteTopicResponse:
        self.admin.delete_topic(request.topic)
        return pb.DeleteTopicResponse()

    @_answer
    def ListTopics(self, request: pb.ListTopicsRequest, context: grpc.ServicerContext) -> pb.ListTopicsResponse:
        return pb.ListTopicsResponse(topics=[_topic_info(t, self.identity) for t in self.admin.list_topics()])

    @_answer
    def GetTopicRoute(self, request: pb.GetTopicRouteRequest, context: grpc.ServicerContext) -> pb.TopicInfo:
        return _topic_info(self.admin.topic_route(request.topic, request.auto_create), self.identity)

    # ---------------------------------------------------------------------------------------------- consumers
    @_answer
    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.HeartbeatResponse:
        return pb.HeartbeatResponse(group_version=self.heartbeat(request))

    def heartbeat(self, request: pb.HeartbeatRequest, expression_types: Mapping[str, str] | None = None) -> int:
        """A consumer's heartbeat, or its leave (``unregister``), as sluice.v1 and the remoting front's HEART_BEAT send
        them: the group's version after it; 0 for a producer's, which records nothing yet. ``expression_types``:
        topic -> SQL92 for the subscriptions that are not tag expressions (a RocketMQ 4 heartbeat's; gRPC's are all
        tags)."""
        self.authorize_heartbeat(request)
        return self._record_heartbeat(request, expression_types)

    @staticmethod
    def authorize_heartbeat(request: pb.HeartbeatRequest) -> None:
        """A heartbeat's rights: Sub on its group and on each topic it subscribes (its group then reports them).
        The remoting front asks them of every group a heartbeat carries before it records any."""
        authorize(Operation.HEARTBEAT, group=request.consumer_group, topics=list(request.subscriptions))

    def leave(self, group: str, client_id: str) -> int:
        """A client leaves ``group`` (the remoting front's UNREGISTER_CLIENT, and a closed connection's clients):
        Sub on the group, as joining it took."""
        authorize(Operation.LEAVE_GROUP, group=group)
        return self._record_heartbeat(pb.HeartbeatRequest(client_id=client_id, consumer_group=group, unregister=True))

    def _record_heartbeat(self, request: pb.HeartbeatRequest, expression_types: Mapping[str, str] | None = None
                          ) -> int:
        if not request.consumer_group:  # a producer: nothing to track yet
            return 0
        validate_group(request.consumer_group)
        _check_client_id(request.client_id)
        _check_heartbeat(request)
        if request.unregister:
            version = self.consumers.unregister(request.consumer_group, request.client_id)
            if self.locks is not None:
                self.locks.unlock_client(request.consumer_group, request.client_id)
        else:
            model = BROADCASTING if request.model == pb.BROADCASTING else CLUSTERING
            if model == CLUSTERING and self.retries is not None:
                self.retries.ensure_retry_topic(request.consumer_group)
            elif self.retries is not None:
                self.retries.admit_broadcast(request.consumer_group)
            version = self.consumers.heartbeat(
                request.consumer_group, request.client_id, dict(request.subscriptions), model, expression_types
            )
        return version

    @_answer
    def GetConsumerList(
        self, request: pb.GetConsumerListRequest, context: grpc.ServicerContext
    ) -> pb.GetConsumerListResponse:
        ids, version = self.admin.consumer_ids(request.consumer_group)
        return pb.GetConsumerListResponse(client_ids=ids, group_version=version)

    @_answer
    def GetConsumerLag(
        self, request: pb.GetConsumerLagRequest, context: grpc.ServicerContext
    ) -> pb.GetConsumerLagResponse:
        lags = self.admin.consumer_lag(request.consumer_group, request.topic)
        return pb.GetConsumerLagResponse(
            queues=[
                pb.QueueLag(
                    topic=x.topic,
                    queue_id=x.queue_id,
                    broker_offset=x.broker_offset,
                    consumer_offset=x.consumer_offset,
                    lag=x.lag,
                )
                for x in lags
            ],
            total_lag=sum(x.lag for x in lags),
        )

    @_answer
    def GetBrokerStats(
        self, request: pb.GetBrokerStatsRequest, context: grpc.ServicerContext
    ) -> pb.GetBrokerStatsResponse:
        return pb.GetBrokerStatsResponse(values=self.broker_stats())

    # ---------------------------------------------------------------------------------------------- semantics
    def _tx(self) -> TransactionProcessor:
        if self.transactions is None:
            raise ServiceNotAvailableError("transactions are not enabled on this broker")
        return self.transactions

    def _retry(self) -> RetryProcessor:
        if self.retries is None:
            raise ServiceNotAvailableError("retry / subscription groups are not enabled on this broker")
        return self.retries

    def _lock_queues(self, request: pb.LockBatchRequest, *, existing: bool = True) -> list[tuple[str, int]]:
        """The request's queues; to lock, each of an existing topic (the lock table holds only real queues); to
        unlock, any well-formed one (a deleted topic's locks may still be released)."""
        if len(request.queues) > MAX_LOCK_QUEUES:
            raise InvalidArgumentError(f"{len(request.queues)} queues in one lock call; at most {MAX_LOCK_QUEUES}")
        for q in request.queues:
            if existing:
                validate_topic(q.topic)
                refuse_system_topic(q.topic, "lock queues of")
                self.admin.topics.check_queue(q.topic, q.queue_id)
            elif q.queue_id < 0:
                raise InvalidArgumentError(f"queue id {q.queue_id} of {q.topic!r} is negative")
            else:
                validate_topic(q.topic)
        return [(q.topic, q.queue_id) for q in request.queues]

    def _locks(self) -> QueueLockManager:
        if self.locks is None:
            raise ServiceNotAvailableError("queue locks are not enabled on this broker")
        return self.locks

    @_answer
    def EndTransaction(
        self, request: pb.EndTransactionRequest, context: grpc.ServicerContext
    ) -> pb.EndTransactionResponse:
        return _end_response(self._tx().end(end_transaction_of(request)))

    @_answer
    def ListTransactions(
        self, request: pb.ListTransactionsRequest, context: grpc.ServicerContext
    ) -> pb.ListTransactionsResponse:
        found = self._tx().list_transactions(request.prefix, request.status)
        return pb.ListTransactionsResponse(transactions=[_info(t) for t in found])

    @_answer
    def EndTransactions(
        self, request: pb.EndTransactionsRequest, context: grpc.ServicerContext
    ) -> pb.EndTransactionsResponse:
        results = self._tx().end_many(request.commit, request.prefix, list(request.transaction_ids))
        return pb.EndTransactionsResponse(results=[_end_response(r) for r in results])

    def TransactionCheckStream(
        self, request: pb.TransactionCheckSubscribe, context: grpc.ServicerContext
    ) -> Iterator[pb.TransactionCheckRequest]:
        try:
            refuse_if_malformed(request)
            self._tx()  # refused as EndTransaction is where transactions are not enabled
            return open_check_stream(self.check_hub, request, context)
        except BrokerError as e:  # refused before streaming (bad request, the stream limit): as a unary call is
            self._refuse("TransactionCheckStream", e, context)

    @_answer
    def ConsumerSendMsgBack(
        self, request: pb.ConsumerSendMsgBackRequest, context: grpc.ServicerContext
    ) -> pb.ConsumerSendMsgBackResponse:
        validate_group(request.consumer_group)
        target = request.WhichOneof("target")
        result = self._retry().send_back(SendBack(
            request.consumer_group,
            commitlog_offset=request.commitlog_offset if target == "commitlog_offset" else None,
            msg_id=request.msg_id if target == "msg_id" else None,
            delay_level=request.delay_level,
            # unset (a raw call) or < 0: the group's retryMaxTimes, not "no retries"
            max_reconsume_times=(request.max_reconsume_times
                                 if request.HasField("max_reconsume_times") and request.max_reconsume_times >= 0
                                 else None),
            origin_msg_id=request.origin_msg_id,
        ))
        return pb.ConsumerSendMsgBackResponse(topic=result.topic, queue_id=result.queue_id,
                                              dead_letter=result.dead_letter, delay_level=result.delay_level,
                                              reconsume_times=result.reconsume_times)

    @_answer
    def LockBatchMQ(self, request: pb.LockBatchRequest, context: grpc.ServicerContext) -> pb.LockBatchResponse:
        return self.lock_batch(request)

    @_answer
    def UnlockBatchMQ(self, request: pb.LockBatchRequest, context: grpc.ServicerContext) -> pb.LockBatchResponse:
        return self.unlock_batch(request)

    def lock_batch(self, request: pb.LockBatchRequest) -> pb.LockBatchResponse:
        """LockBatchMQ's work, for every front (the remoting port's LOCK_BATCH_MQ too)."""
        authorize(Operation.CONSUME, group=request.consumer_group, topics=[q.topic for q in request.queues])
        validate_group(request.consumer_group)
        _check_client_id(request.client_id)
        held = self._locks().lock_batch(request.consumer_group, self._lock_queues(request), request.client_id)
        return pb.LockBatchResponse(queues=[pb.MessageQueue(topic=t, queue_id=q) for t, q in sorted(held)])

    def unlock_batch(self, request: pb.LockBatchRequest) -> pb.LockBatchResponse:
        """UnlockBatchMQ's work, for every front."""
        authorize(Operation.CONSUME, group=request.consumer_group, topics=[q.topic for q in request.queues])
        validate_group(request.consumer_group)
        _check_client_id(request.client_id)
        queues = self._lock_queues(request, existing=False)
        freed = self._locks().unlock_batch(request.consumer_group, queues, request.client_id)
        return pb.LockBatchResponse(queues=[pb.MessageQueue(topic=t, queue_id=q) for t, q in sorted(freed)])

    @_answer
    def GetSubscriptionGroup(
        self, request: pb.GetSubscriptionGroupRequest, context: grpc.ServicerContext
    ) -> pb.SubscriptionGroup:
        validate_group(request.consumer_group)
        return _group(self._retry().get_group(request.consumer_group))

    @_answer
    def ListGroups(self, request: pb.ListGroupsRequest, context: grpc.ServicerContext) -> pb.ListGroupsResponse:
        configured = [g.group_name for g in self.retries.groups.groups()] if self.retries is not None else []
        groups = self.admin.list_groups(configured)
        return pb.ListGroupsResponse(
            groups=[
                pb.GroupSummary(consumer_group=g.group, online_consumers=g.online_consumers, topics=g.topics)
                for g in groups
            ]
        )

    @_answer
    def ResetConsumerOffsets(
        self, request: pb.ResetConsumerOffsetsRequest, context: grpc.ServicerContext
    ) -> pb.ResetConsumerOffsetsResponse:
        offsets = {(o.topic, o.queue_id): o.offset for o in request.offsets}
        if len(offsets) != len(request.offsets):
            raise InvalidArgumentError("ResetConsumerOffsets names a queue twice; name each queue once")
        previous = self.admin.reset_consumer_offsets(request.consumer_group, offsets)
        return pb.ResetConsumerOffsetsResponse(
            previous=[pb.QueueOffset(topic=t, queue_id=q, offset=previous[(t, q)]) for t, q in offsets]
        )

    @_answer
    def UpdateSubscriptionGroup(
        self, request: pb.UpdateSubscriptionGroupRequest, context: grpc.ServicerContext
    ) -> pb.SubscriptionGroup:
        validate_group(request.consumer_group)
        changes = {name: getattr(request, name) for name in GROUP_SETTINGS if request.HasField(name)}
        return _group(self._retry().update_group(request.consumer_group, changes))

    # ---------------------------------------------------------------------------------------------- pop
    def _pop(self) -> PopProcessor:
        if self.pops is None:
            raise ServiceNotAvailableError("pop consumption is not enabled on this broker")
        return self.pops

    @_answer
    def PopMessage(self, request: pb.PopRequest, context: grpc.ServicerContext) -> pb.PopResponse:
        popped = self._pop().pop(
            PopRequest(
                request.consumer_group, request.topic, request.queue_id if request.HasField("queue_id") else -1,
                request.max_msgs, request.invisible_time_ms, request.expression_type or "TAG", request.expression,
                request.poll_time_ms,
            ),
            context.time_remaining(),
        )
        # popped messages travel as commit-log entries (store fields included), back to back, as pulls answer
        raw = [p.entry if p.entry is not None else encode_stored(p.message) for p in popped]
        positions = list(itertools.accumulate((len(e) for e in raw[:-1]), initial=0)) if raw else []
        return pb.PopResponse(
            entries=b"".join(raw), entry_positions=positions, receipt_handles=[p.handle for p in popped],
            delivery_attempts=[p.attempt for p in popped], invisible_until_ms=[p.invisible_until_ms for p in popped],
        )

    @_answer
    def AckMessage(self, request: pb.AckMessageRequest, context: grpc.ServicerContext) -> pb.AckMessageResponse:
        results = self._pop().ack(request.consumer_group, request.topic, list(request.receipt_handles))
        return pb.AckMessageResponse(errors=["" if e is None else f"{e.code.name}: {e.message}" for e in results])

    @_answer
    def ChangeInvisibleTime(
        self, request: pb.ChangeInvisibleTimeRequest, context: grpc.ServicerContext
    ) -> pb.ChangeInvisibleTimeResponse:
        p = self._pop().change(request.consumer_group, request.topic, request.receipt_handle,
                               request.invisible_time_ms)
        return pb.ChangeInvisibleTimeResponse(receipt_handle=p.handle, invisible_until_ms=p.invisible_until_ms)

    # ---------------------------------------------------------------------------------------------- users and ACLs
    def _accounts(self) -> AccountsAdmin:
        if self.accounts is None:
            raise ServiceNotAvailableError("users and access control are not available until the broker has started")
        return self.accounts

    @_answer
    def CreateUser(self, request: pb.UserRequest, context: grpc.ServicerContext) -> pb.UserInfo:
        return self._accounts().create_user(request)

    @_answer
    def UpdateUser(self, request: pb.UserRequest, context: grpc.ServicerContext) -> pb.UserInfo:
        return self._accounts().update_user(request)

    @_answer
    def DeleteUser(self, request: pb.DeleteUserRequest, context: grpc.ServicerContext) -> pb.DeleteUserResponse:
        return self._accounts().delete_user(request)

    @_answer
    def ListUsers(self, request: pb.ListUsersRequest, context: grpc.ServicerContext) -> pb.ListUsersResponse:
        return self._accounts().list_users(request)

    @_answer
    def GrantAcl(self, request: pb.GrantAclRequest, context: grpc.ServicerContext) -> pb.AclEntries:
        return self._accounts().grant(request)

    @_answer
    def RevokeAcl(self, request: pb.RevokeAclRequest, context: grpc.ServicerContext) -> pb.AclEntries:
        return self._accounts().revoke(request)

    @_answer
    def ListAcls(self, request: pb.ListAclsRequest, context: grpc.ServicerContext) -> pb.AclEntries:
        return self._accounts().list_acls(request)
