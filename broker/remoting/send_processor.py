"""SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE: translated into the broker's send processor.

The message is stored by ``broker.server.send_processor.SendProcessor`` exactly as a gRPC send's: the same checks,
topics auto-created the same way, delays, timers and transactions the same. What is translated:

* the properties string (RocketMQ's reading, ``message_properties``), stored canonical;
* a half message (sysFlag PREPARED) becomes a transactional send under its producer group; the broker writes the
  transaction bits itself, so they are cleared from the sysFlag sent;
* a batch body (``message_batch``) becomes the commit-log entries SendBatch validates and stores whole.

The answer (``SendMessageResponseHeader``): ``msgId`` the offset message id, naming the remoting address
(message_ids.py) (comma-joined for a batch; the client
keeps its UNIQ_KEY as the message id users see and this as ``offsetMsgId``), ``queueId``, ``queueOffset`` (the
first of a batch), ``transactionId`` for a half, and ``MSG_REGION``/``TRACE_ON``, which a 4.x client reads from
every send answer. A stored message whose flush timed out is answered FLUSH_DISK_TIMEOUT with the same fields (it
is stored); every refusal is answered with its code and nothing stored.
"""

from __future__ import annotations

from broker.errors import BrokerError, ResponseCode
from broker.format.message import SysFlag, msg_id_at
from broker.remoting.command import RemotingCommand
from broker.remoting.message_batch import decode_batch, sluice_batch
from broker.remoting.message_ids import RemotingIds
from broker.remoting.message_outcomes import Access, failure, refusal
from broker.remoting.message_properties import parse_properties
from broker.remoting.message_replication import GroupReplication
from broker.remoting.processor import Answer, RequestContext
from broker.remoting.send_request import SEND_BATCH_MESSAGE, SEND_MESSAGE, SEND_MESSAGE_V2, SendRequest, parse_send
from broker.server.send_processor import SendOutcome, SendProcessor

MSG_REGION, TRACE_ON = "MSG_REGION", "TRACE_ON"  # MessageConst.PROPERTY_MSG_REGION, PROPERTY_TRACE_SWITCH
DEFAULT_REGION = "DefaultRegion"  # MixAll.DEFAULT_TRACE_REGION_ID, what a RocketMQ broker answers
STATUS_CODES = {"SEND_OK": ResponseCode.SUCCESS, "FLUSH_DISK_TIMEOUT": ResponseCode.FLUSH_DISK_TIMEOUT}


def send_answer(request: RemotingCommand, outcome: SendOutcome, replicated: bool = True,
                msg_ids: RemotingIds | None = None) -> RemotingCommand:
    """``msg_ids``: the remoting address the ids name (broker/remoting/message_ids.py); None: the store's host."""
    r = outcome.result
    prefix = msg_ids.prefix if msg_ids is not None else r.msg_id_prefix
    ids = ",".join(msg_id_at(prefix, offset) for offset in r.commitlog_offsets)
    ext = {
        "msgId": ids,
        "queueId": str(r.queue_ids[0] if r.queue_ids else 0),
        "queueOffset": str(r.queue_offsets[0] if r.queue_offsets else 0),
        MSG_REGION: DEFAULT_REGION,
        TRACE_ON: "true",
    }
    if outcome.transaction_id:
        ext["transactionId"] = outcome.transaction_id
    code = STATUS_CODES[outcome.status] if replicated else ResponseCode.FLUSH_SLAVE_TIMEOUT
    return request.response(int(code), ext_fields=ext)


class SendMessageProcessor:
    """One message (codes 10 and 310) or a batch (320), by the request's code."""

    def __init__(self, sends: SendProcessor, access: Access, replication: GroupReplication | None = None,
                 msg_ids: RemotingIds | None = None) -> None:
        self.sends, self.access = sends, access
        self.replication = replication or GroupReplication(None)
        self.msg_ids = msg_ids

    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        try:
            req = parse_send(request.code, request.ext_fields)
            name = "SEND_BATCH_MESSAGE" if req.batch else "SEND_MESSAGE"
            with self.access.as_caller(context):
                target = self.replication.before_write(name)
                outcome = self._batch(request, req, context) if req.batch else self._one(request, req)
            replicated = self.replication.replicated(target, outcome.result.commitlog_offsets)
            return send_answer(request, outcome, replicated, self.msg_ids)
        except BrokerError as e:
            return refusal(request, e, ResponseCode.MESSAGE_ILLEGAL)
        except Exception as e:  # noqa: BLE001 - the last line of defence: answered, and the broker serves on
            return failure(request, e)

    def _one(self, request: RemotingCommand, req: SendRequest) -> SendOutcome:
        sys_flag = req.sys_flag & ~SysFlag.TRANSACTION_MASK if req.transactional else req.sys_flag
        return self.sends.send_message(
            req.topic, req.queue_id, request.body, parse_properties(req.properties), flag=req.flag,
            sys_flag=sys_flag, born_timestamp=req.born_timestamp, reconsume_times=req.reconsume_times,
            producer_group=req.producer_group, transactional=req.transactional,
        )

    def _batch(self, request: RemotingCommand, req: SendRequest, context: RequestContext) -> SendOutcome:
        items = decode_batch(request.body)
        buffer = sluice_batch(items, req.topic, req.queue_id, sys_flag=req.sys_flag,
                              born_timestamp=req.born_timestamp, born_host=context.peer.address,
                              reconsume_times=req.reconsume_times)
        return self.sends.send_batch(buffer, len(items))


# The codes this processor answers.
SEND_CODES = (SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE)
