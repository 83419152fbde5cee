"""The Python client: producers, pull and push consumers, and admin operations over gRPC."""

from broker.allocator import tune_malloc
from broker.client.admin import Admin, GroupInfo
from broker.client.admin_results import (
    BrokerInfo,
    BrokerLag,
    BrokerQueueLag,
    BrokerQueues,
    BrokerTopicInfo,
    BrokerTransactionInfo,
    ClusterInfo,
    ClusterTopicInfo,
    GroupLag,
    QueueLag,
    QueueRange,
    SubscriptionGroup,
    TopicDescription,
    TopicInfo,
    TransactionInfo,
)
from broker.client.allocation import AVERAGELY, CIRCLE
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
from broker.client.offset_reset import OffsetReset, ResetTo
from broker.client.outgoing_message import Message, decode_entries, encode_message, user_properties
from broker.client.pop_consumer import PopConsumer, PoppedMessage
from broker.client.producer import PartialSendError, Producer
from broker.client.pull_consumer import PullConsumer
from broker.client.push_consumer import PushConsumer
from broker.client.results import PullResult, PullStatus, RawPullResult, ReceivedMessage, SendResult, SendStatus
from broker.client.transaction_producer import LocalTransactionState, TransactionProducer, TransactionSendResult

__all__ = [
    "AVERAGELY", "BROADCASTING", "CIRCLE", "CLUSTERING", "FIRST", "LAST", "TIMESTAMP", "Admin", "ConsumeFrom",
    "ConsumeStatus", "GroupInfo", "Message", "MessageModel", "OffsetReset", "PartialSendError", "PopConsumer",
    "PoppedMessage", "Producer", "PullConsumer", "PullResult", "PullStatus", "PushConsumer", "QueueLag",
    "RawPullResult", "ReceivedMessage", "ResetTo", "SendResult", "SendStatus", "TopicInfo", "decode_entries",
    "encode_message", "LocalTransactionState", "SubscriptionGroup", "TransactionInfo", "TransactionProducer",
    "TransactionSendResult", "user_properties", "BrokerInfo", "BrokerLag", "BrokerQueueLag", "BrokerQueues",
    "BrokerTopicInfo", "BrokerTransactionInfo", "ClusterInfo", "ClusterTopicInfo", "GroupLag", "QueueRange",
    "TopicDescription", "tune_malloc",
]
