"""LOCK_BATCH_MQ (41) and UNLOCK_BATCH_MQ (42): an orderly 4.x consumer's queue locks, translated into the broker's
lock table through ``BrokerService.lock_batch`` / ``unlock_batch`` (what the gRPC LockBatchMQ and UnlockBatchMQ
call: the same table, the same checks, the same expiry), so a queue a gRPC consumer holds is refused to a remoting
one and the other way round.

Request body ``LockBatchRequestBody``: ``{"consumerGroup", "clientId", "mqSet": [{"topic", "brokerName",
"queueId"}]}`` (5.x adds ``onlyThisBroker``, which changes nothing for one broker). LOCK_BATCH_MQ answers
``{"lockOKMQSet": [...]}``, the queues the client holds now (locked or renewed), each as it named it; queues held
by another live client of the group are left out, as RocketMQ leaves them. UNLOCK_BATCH_MQ answers SUCCESS with
no body (usually sent one-way). A malformed body or a queue of a topic the broker does not have is refused with its
code (codes.py) and nothing locked. Rights: the gRPC calls' rows (consume on the group and the queues' topics).
"""

from __future__ import annotations

from typing import Any

from broker.errors import BrokerError, InvalidArgumentError
from broker.proto import sluice_pb2 as pb
from broker.remoting import fastjson
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_outcomes import INT32, Access, failure
from broker.remoting.message_replication import GroupReplication
from broker.remoting.processor import Answer, RequestContext
from broker.remoting.transaction_processor import master_only, refused
from broker.server.broker_service import BrokerService

LOCK_BATCH_MQ, UNLOCK_BATCH_MQ = RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ
LOCK_CODES = (LOCK_BATCH_MQ, UNLOCK_BATCH_MQ)


def _queue(entry: Any) -> tuple[str, str, int]:
    if not isinstance(entry, dict):
        raise InvalidArgumentError("LockBatchRequestBody: an mqSet entry is not an object")
    topic, broker_name, queue_id = entry.get("topic"), entry.get("brokerName") or "", entry.get("queueId")
    if not isinstance(topic, str) or not topic:
        raise InvalidArgumentError("LockBatchRequestBody: an mqSet entry has no topic")
    if isinstance(queue_id, str) and queue_id.lstrip("-").isdigit():
        queue_id = int(queue_id)
    if not isinstance(queue_id, int) or isinstance(queue_id, bool) or not INT32[0] <= queue_id <= INT32[1]:
        raise InvalidArgumentError(f"LockBatchRequestBody: queueId {queue_id!r} of {topic!r} is not an int32")
    return topic, str(broker_name), queue_id


def parse_lock_body(body: bytes) -> tuple[pb.LockBatchRequest, dict[tuple[str, int], str]]:
    """The gRPC request of the same work, and the broker name each queue was named with (echoed back)."""
    try:
        data = fastjson.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InvalidArgumentError("the body is not LockBatchRequestBody JSON") from None
    if not isinstance(data, dict):
        raise InvalidArgumentError("the body is not a LockBatchRequestBody object")
    mq_set = data.get("mqSet")
    mq_set = [] if mq_set is None else mq_set
    if not isinstance(mq_set, list):
        raise InvalidArgumentError("LockBatchRequestBody: mqSet is not a list")
    queues = [_queue(e) for e in mq_set]
    names = {(t, q): b for t, b, q in queues}
    request = pb.LockBatchRequest(
        consumer_group=str(data.get("consumerGroup") or ""), client_id=str(data.get("clientId") or ""),
        queues=[pb.MessageQueue(topic=t, queue_id=q) for t, q in names],
    )
    return request, names


class LockProcessor:
    """Both codes, by the request's code."""

    def __init__(self, service: BrokerService, access: Access, replication: GroupReplication | None = None) -> None:
        self.service, self.access = service, access
        self.replication = replication or GroupReplication(None)

    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        try:
            lock = request.code == LOCK_BATCH_MQ
            call, names = parse_lock_body(request.body)
            name = "LOCK_BATCH_MQ" if lock else "UNLOCK_BATCH_MQ"
            with self.access.as_caller(context):
                master_only(self.replication, name)
                if not lock:
                    self.service.unlock_batch(call)
                    return request.response(int(WireCode.SUCCESS))
                held = self.service.lock_batch(call)
            ok = [{"brokerName": names.get((q.topic, q.queue_id), ""), "queueId": q.queue_id, "topic": q.topic}
                  for q in held.queues]
            return request.response(int(WireCode.SUCCESS), body=fastjson.dumps({"lockOKMQSet": ok}, standard=True))
        except BrokerError as e:
            return refused(request, e)
        except Exception as e:  # noqa: BLE001 - the last line of defence: answered, and the broker serves on
            return failure(request, e)
