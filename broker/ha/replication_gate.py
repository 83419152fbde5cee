"""The broker's requests as replication sees them: a gRPC server interceptor in front of the Broker service.

* Writes go to the group's master only. A slave (or a master fenced by a newer epoch) refuses every request that
  would change what the group holds with NOT_MASTER before anything is done: sends, transaction ends, send-backs,
  topic and group changes, offset commits, queue locks and the transaction check stream. A pull's piggy-backed
  offset commit is dropped on a slave (RocketMQ's PullMessageProcessor stores it on masters only), and a route
  lookup does not auto-create topics there.
* Before a write that stores messages, a master that waits for replicas refuses it, nothing written, while its
  in-sync set is smaller than min_insync_replicas (NOT_ENOUGH_REPLICAS).
* After it, the master wakes its replication streams and, when it waits for replicas (SYNC_MASTER, controller
  mode), holds the answer until every in-sync replica holds the written bytes (the send's own entries; for other
  writes, the log as it was when the handler returned). A wait that runs out after ``ha_ack_timeout_ms``, or that
  a fencing cuts short, answers FLUSH_SLAVE_TIMEOUT: the bytes are on the master and may or may not survive a
  failover, so the client reports the outcome as unknown and retries under the same UNIQ_KEY (the retry is
  answered from the stored copy once it is replicated, or stored once by the new master).
* Offset commits, topic and group changes wait the same way for the in-sync replicas to hold the changed config
  files (metadata_sync.py), so an acknowledged commit survives a failover.
* The same rules hold for the broker's other services, named here with a prefix: the transaction coordinator's
  (``Coordinator.``; a decision is a message in the log) and RocketMQ 5's MessagingService (``v2.``). Pop
  consumption (PopMessage, AckMessage, ChangeInvisibleTime and their v2 forms) is served by the master only; its
  records are messages in the log, and the pop service itself refuses and waits by these rules (semantics/pop_log.py).
* DeleteTopic is refused on a replicated group: a slave rebuilds its consume queues from the log and cannot tell
  the deleted generation's queue offsets from the next one's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from broker.errors import BrokerError, FlushSlaveTimeoutError, InvalidArgumentError, NotMasterError
from broker.format.message import I32
from broker.proto import sluice_pb2 as pb
from broker.proto.status import RESPONSE_CODE_KEY, grpc_code_for
from broker.server.handler_cache import WrappedHandlers

log = logging.getLogger(__name__)

# gRPC service path -> the prefix its method names take below (the Broker service's have none)
SERVICES = {"/sluice.v1.Broker/": "", "/sluice.v1.TransactionCoordinator/": "Coordinator.",
            "/apache.rocketmq.v2.MessagingService/": "v2."}
DATA_WRITES = frozenset({"SendMessage", "SendBatch", "EndTransaction", "EndTransactions", "ConsumerSendMsgBack",
                         "Coordinator.RecordDecision", "v2.SendMessage", "v2.EndTransaction",
                         "v2.ForwardMessageToDeadLetterQueue", "v2.RecallMessage"})
METADATA_WRITES = frozenset({"CreateTopic", "UpdateConsumerOffsets", "UpdateSubscriptionGroup", "ResetConsumerOffsets",
                             "v2.UpdateOffset", "CreateUser", "UpdateUser", "DeleteUser", "GrantAcl",
                             "RevokeAcl"})
POP = frozenset({"PopMessage", "AckMessage", "ChangeInvisibleTime", "v2.ReceiveMessage", "v2.AckMessage",
                 "v2.ChangeInvisibleDuration"})
MASTER_ONLY = DATA_WRITES | METADATA_WRITES | POP | frozenset({"DeleteTopic", "LockBatchMQ", "UnlockBatchMQ",
                                                                "TransactionCheckStream",
                                                                "Coordinator.QueryDecisions"})
SEND_METHODS = frozenset({"SendMessage", "SendBatch"})


class GateTarget(Protocol):
    """What the gate asks of the replication manager."""

    def is_master(self) -> bool: ...
    def identity_text(self) -> str: ...
    def admit_write(self) -> None: ...
    def log_end(self) -> int: ...
    def entry_end(self, commitlog_offset: int) -> int: ...
    def wrote(self, end_offset: int) -> bool: ...
    def metadata_changed(self) -> bool: ...


def _refuse(context: grpc.ServicerContext, e: BrokerError) -> None:
    log.info("refused by replication: %s (%s)", e.message, e.code.name)
    context.set_trailing_metadata(((RESPONSE_CODE_KEY, str(int(e.code))),))
    context.abort(grpc_code_for(e.code), e.message)


class ReplicationGate(grpc.ServerInterceptor):
    def __init__(self) -> None:
        self.target: GateTarget | None = None  # set once the replication manager runs (None: everything passes)
        self._wrapped = WrappedHandlers()

    def intercept_service(self, continuation: Callable[[Any], Any], details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        service, _, method = details.method.rpartition("/")
        prefix = SERVICES.get(service + "/")
        if handler is None or prefix is None:
            return handler
        name = prefix + method
        if name not in MASTER_ONLY and name not in ("PullMessage", "GetTopicRoute"):
            return handler
        return self._wrapped.get(details.method, handler, lambda h: self._wrap(name, h))

    def _wrap(self, name: str, handler: Any) -> Any:
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(name, handler.unary_unary), request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(name, handler.unary_stream), request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _streaming(self, name: str, inner: Callable[[Any, grpc.ServicerContext], Any]) -> Callable[..., Any]:
        def behavior(request: Any, context: grpc.ServicerContext) -> Any:
            target = self.target
            if target is not None and not target.is_master():
                _refuse(context, NotMasterError(f"{target.identity_text()} is not its group's master; {name} is "
                                                "served by the master"))
            yield from inner(request, context)

        return behavior

    def _unary(self, name: str, inner: Callable[[Any, grpc.ServicerContext], Any]) -> Callable[..., Any]:
        def behavior(request: Any, context: grpc.ServicerContext) -> Any:
            target = self.target
            if target is None:
                return inner(request, context)
            master = target.is_master()
            if name == "PullMessage":
                if not master and request.HasField("commit_offset"):
                    request.ClearField("commit_offset")  # a slave keeps no offsets of its own
                return inner(request, context)
            if name == "GetTopicRoute":
                if not master:
                    request.auto_create = False
                return inner(request, context)
            try:
                if not master:
                    raise NotMasterError(f"{target.identity_text()} is not its group's master; send {name} to the "
                                         "master (clients find it through the name servers)")
                if name == "DeleteTopic":
                    raise InvalidArgumentError(
                        "DeleteTopic is not available on a replicated broker group: its slaves rebuild consume "
                        "queues from the log and could not follow a topic's restarted queue offsets"
                    )
                if name in DATA_WRITES:
                    target.admit_write()
            except BrokerError as e:
                _refuse(context, e)
            response = inner(request, context)
            if name in DATA_WRITES:
                end = target.log_end()
                if name in SEND_METHODS and response.commitlog_offsets:
                    end = target.entry_end(max(response.commitlog_offsets))
                if not target.wrote(end):
                    if name in SEND_METHODS:
                        response.status = pb.FLUSH_SLAVE_TIMEOUT
                        return response
                    _refuse(context, FlushSlaveTimeoutError(
                        f"{name} was done on the master, but its in-sync replicas did not confirm it in time"
                    ))
            elif name in METADATA_WRITES and not target.metadata_changed():
                _refuse(context, FlushSlaveTimeoutError(
                    f"{name} was done on the master, but its in-sync replicas did not confirm it in time"
                ))
            return response

        return behavior


def entry_end(read: Callable[[int, int], bytes | None], commitlog_offset: int, fallback: int) -> int:
    """The commit-log offset after the entry at ``commitlog_offset`` (its TOTALSIZE), ``fallback`` if unreadable."""
    head = read(commitlog_offset, 4)
    return commitlog_offset + I32.unpack(head)[0] if head else fallback
