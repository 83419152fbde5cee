"""The header of SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320), read into one request.

SEND_MESSAGE names its fields in full (``SendMessageRequestHeader``); V2 and the batch use one letter each
(``SendMessageRequestHeaderV2``), ``V2_NAMES`` maps them. Both read into ``SendRequest``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker.format.message import SysFlag
from broker.remoting.codes import RequestCode
from broker.remoting.message_outcomes import INT64, bool_field, int_field, text_field

SEND_MESSAGE = RequestCode.SEND_MESSAGE
SEND_MESSAGE_V2 = RequestCode.SEND_MESSAGE_V2
SEND_BATCH_MESSAGE = RequestCode.SEND_BATCH_MESSAGE

# SendMessageRequestHeaderV2's one-letter names -> SendMessageRequestHeader's.
V2_NAMES = {
    "a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums", "e": "queueId",
    "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes", "k": "unitMode",
    "l": "maxReconsumeTimes", "m": "batch", "n": "brokerName",
}
DEFAULT_TOPIC = "TBW102"  # MixAll.AUTO_CREATE_TOPIC_KEY_TOPIC: what a producer names when the topic has no route yet


@dataclass(frozen=True)
class SendRequest:
    producer_group: str
    topic: str
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str
    reconsume_times: int = 0
    max_reconsume_times: int = -1
    default_topic: str = DEFAULT_TOPIC
    batch: bool = False

    @property
    def transactional(self) -> bool:
        """A half message: a 4.x transactional producer marks it PREPARED in sysFlag (and TRAN_MSG=true)."""
        return SysFlag.transaction_type(self.sys_flag) == SysFlag.TRANSACTION_PREPARED_TYPE


def long_names(code: int, ext: Mapping[str, str]) -> Mapping[str, str]:
    """The header's fields by their SEND_MESSAGE names, whichever form the code uses."""
    if code == SEND_MESSAGE:
        return ext
    return {V2_NAMES.get(k, k): v for k, v in ext.items()}


def parse_send(code: int, ext: Mapping[str, str]) -> SendRequest:
    """InvalidArgumentError for a missing required field or a number that is not one."""
    f = long_names(code, ext)
    return SendRequest(
        producer_group=text_field(f, "producerGroup"),
        topic=text_field(f, "topic"),
        queue_id=int_field(f, "queueId"),
        sys_flag=int_field(f, "sysFlag"),
        born_timestamp=int_field(f, "bornTimestamp", bounds=INT64),
        flag=int_field(f, "flag"),
        properties=f.get("properties") or "",
        reconsume_times=int_field(f, "reconsumeTimes", 0),
        max_reconsume_times=int_field(f, "maxReconsumeTimes", -1),
        default_topic=text_field(f, "defaultTopic", DEFAULT_TOPIC),
        batch=code == SEND_BATCH_MESSAGE or bool_field(f, "batch"),
    )
