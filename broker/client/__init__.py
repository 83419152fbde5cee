"""The Python client: producers, pull and push consumers, and admin operations over gRPC."""

from broker.client.admin import Admin, GroupInfo, QueueLag, SubscriptionGroup, TopicInfo, TransactionInfo
from broker.client.consumer_options import (
    BROADCASTING,
    CLUSTERING,
    FIRST,
    LAST,
    TIMESTAMP,
    ConsumeFrom,
    ConsumeStatus,
    MessageModel,
)
from broker.client.message import Message, decode_entries, encode_message, user_properties
from broker.client.offset_reset import OffsetReset, ResetTo
from broker.client.producer import PartialSendError, Producer
from broker.client.pull_consumer import PullConsumer
from broker.client.push_consumer import PushConsumer
from broker.client.rebalance import AVERAGELY, CIRCLE
from broker.client.results import PullResult, PullStatus, RawPullResult, ReceivedMessage, SendResult, SendStatus
from broker.client.transaction_producer import LocalTransactionState, TransactionProducer, TransactionSendResult

__all__ = [
    "AVERAGELY", "BROADCASTING", "CIRCLE", "CLUSTERING", "FIRST", "LAST", "TIMESTAMP", "Admin", "ConsumeFrom",
    "ConsumeStatus", "GroupInfo", "Message", "MessageModel", "OffsetReset", "PartialSendError", "Producer",
    "PullConsumer", "PullResult", "PullStatus", "PushConsumer", "QueueLag", "RawPullResult", "ReceivedMessage",
    "ResetTo", "SendResult", "SendStatus", "TopicInfo", "decode_entries", "encode_message", "LocalTransactionState",
    "SubscriptionGroup", "TransactionInfo", "TransactionProducer", "TransactionSendResult", "user_properties",
]  # fmt: skip
