"""CONSUMER_SEND_MSG_BACK (36): a consumer gives a message back for a later retry, translated into the broker's
send-back (``broker.server.retry_processor.RetryProcessor``, what gRPC's ConsumerSendMsgBack calls).

Header (``ConsumerSendMsgBackRequestHeader``): ``offset`` the message's commit-log offset, ``group``,
``delayLevel`` (0: the broker picks 3 + reconsume times; < 0: straight to the dead letters), ``originMsgId``,
``maxReconsumeTimes`` (absent: the group's setting). The copy goes to ``%RETRY%<group>`` after its delay, or to
``%DLQ%<group>`` once the message was reconsumed ``maxReconsumeTimes`` times, as RocketMQ names them. The answer
is SUCCESS with no fields; a refusal answers its code (a message not found: QUERY_NOT_FOUND), and a 4.x client
then sends the copy to the retry topic itself (its fallback on any failure).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.errors import BrokerError
from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_outcomes import INT64, Access, failure, int_field, refusal, text_field
from broker.remoting.message_replication import GroupReplication
from broker.remoting.processor import Answer, RequestContext
from broker.server.consumer_offsets import validate_group
from broker.server.retry_processor import RetryProcessor, SendBack

CONSUMER_SEND_MSG_BACK = RequestCode.CONSUMER_SEND_MSG_BACK


@dataclass(frozen=True)
class SendBackRequest:
    consumer_group: str
    commitlog_offset: int
    delay_level: int
    origin_msg_id: str
    max_reconsume_times: int | None


def parse_send_back(ext: dict[str, str]) -> SendBackRequest:
    max_times = int_field(ext, "maxReconsumeTimes", -1)
    return SendBackRequest(
        consumer_group=text_field(ext, "group"),
        commitlog_offset=int_field(ext, "offset", bounds=INT64),
        delay_level=int_field(ext, "delayLevel"),
        origin_msg_id=ext.get("originMsgId") or "",
        max_reconsume_times=max_times if max_times >= 0 else None,
    )


class SendBackProcessor:
    def __init__(self, retries: RetryProcessor, access: Access, replication: GroupReplication | None = None) -> None:
        self.retries, self.access = retries, access
        self.replication = replication or GroupReplication(None)

    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        try:
            req = parse_send_back(request.ext_fields)
            validate_group(req.consumer_group)
            with self.access.as_caller(context):
                target = self.replication.before_write("CONSUMER_SEND_MSG_BACK")
                self.retries.send_back(SendBack(
                    req.consumer_group, commitlog_offset=req.commitlog_offset, delay_level=req.delay_level,
                    max_reconsume_times=req.max_reconsume_times, origin_msg_id=req.origin_msg_id,
                ))
            self.replication.after_write(target, "CONSUMER_SEND_MSG_BACK")
            return request.response(0)
        except BrokerError as e:
            return refusal(request, e)
        except Exception as e:  # noqa: BLE001 - the last line of defence: answered, and the broker serves on
            return failure(request, e)
