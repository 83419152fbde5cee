"""System topic and group names, spelled as RocketMQ's ``TopicValidator`` / ``MixAll`` so data reads the same."""

from __future__ import annotations

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"  # delayed messages; queue id = delay level - 1
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"  # transactional half (prepared) messages
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"  # one op message per ended transaction
# Sluice's own (RocketMQ has no transactions over several brokers): the decisions a coordinator broker keeps
TRANS_DECISION_TOPIC = "SLUICE_SYS_TRANS_DECISION_TOPIC"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"

# Internal reader groups (RocketMQ: ScheduleMessageService reads without a group; the transaction service uses
# CID_SYS_RMQ_TRANS). They only name the reader in get_message; no offsets are committed under them.
SCHEDULE_READER_GROUP = "SCHEDULE_CONSUMER"
TRANS_READER_GROUP = "CID_SYS_RMQ_TRANS"

SYSTEM_TOPICS = frozenset({SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, TRANS_DECISION_TOPIC})


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_system_topic(topic: str) -> bool:
    """Topics a client may not send to directly (the broker writes them); %RETRY%/%DLQ% are group topics."""
    return topic in SYSTEM_TOPICS
