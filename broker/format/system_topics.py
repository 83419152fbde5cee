"""System topic and group names, spelled as RocketMQ's ``TopicValidator`` / ``MixAll`` so data reads the same.

System topics hold what the broker still owes or keeps for itself: pending delayed messages, open and rolled-back
transaction halves, transaction decisions. Only the broker's own services write and read them (through the store,
never through the request handlers): a client may not send to them, create, delete or pull them, look their
messages up by key or id, or commit offsets on them (RocketMQ refuses sends there with NO_PERMISSION; Sluice also
refuses reads, which bypassed transactional visibility and showed delayed messages early). RocketMQ's other
internal topics and its ``rmq_sys_`` prefix are reserved the same way, so a store shared with its tools keeps
their meaning.
"""

from __future__ import annotations

from broker.errors import NoPermissionError
from broker.format.message import MAX_TOPIC_BYTES

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"  # delayed messages; queue id = delay level - 1
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"  # transactional half (prepared) messages
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"  # one op message per ended transaction
TIMER_TOPIC = "rmq_sys_wheel_timer"  # timer messages (TIMER_DELIVER_MS) until they are due; queue 0
# Sluice's own (RocketMQ has no transactions over several brokers): the decisions a coordinator broker keeps
TRANS_DECISION_TOPIC = "SLUICE_SYS_TRANS_DECISION_TOPIC"
# The commit and rollback markers of transactions that write their messages in place (their entry format is in
# broker/store/txn_visibility.py)
TRANS_MARKER_TOPIC = "SLUICE_SYS_TRANS_MARKER_TOPIC"
# The pop bookkeeping of a replicated group, one record per change (broker/semantics/pop_log.py)
POP_JOURNAL_TOPIC = "SLUICE_SYS_POP_JOURNAL_TOPIC"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
# A group becomes part of its %RETRY% and %DLQ% topic names, which must fit the topic limit: the longer prefix
# decides. (A longer name was accepted once, and every heartbeat and send-back then failed naming its retry topic.)
MAX_GROUP_CHARS = MAX_TOPIC_BYTES - len(RETRY_GROUP_TOPIC_PREFIX)  # 120
# RocketMQ's internal topics that Sluice does not write, reserved all the same (TopicValidator's
# NOT_ALLOWED_SEND_TOPIC_SET), and the prefix of its newer system topics (TopicValidator.SYSTEM_TOPIC_PREFIX).
ROCKETMQ_RESERVED_TOPICS = frozenset(
    {"SCHEDULE_TOPIC_XXXX_V2", "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"}
)
SYSTEM_TOPIC_PREFIX = "rmq_sys_"

# Internal reader groups (RocketMQ: ScheduleMessageService reads without a group; the transaction service uses
# CID_SYS_RMQ_TRANS). They only name the reader in get_message; no offsets are committed under them.
SCHEDULE_READER_GROUP = "SCHEDULE_CONSUMER"
TRANS_READER_GROUP = "CID_SYS_RMQ_TRANS"
TIMER_READER_GROUP = "CID_SYS_RMQ_TIMER"

SYSTEM_TOPICS = (
    frozenset(
        {SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, TIMER_TOPIC, TRANS_DECISION_TOPIC, TRANS_MARKER_TOPIC,
         POP_JOURNAL_TOPIC}
    )
    | ROCKETMQ_RESERVED_TOPICS
)


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_system_topic(topic: str) -> bool:
    """Topics only the broker writes and reads (module docstring); %RETRY%/%DLQ% are group topics."""
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX)


def refuse_system_topic(topic: str, what: str) -> None:
    """NoPermissionError when a client's request would ``what`` (pull, query, commit offsets of...) a system
    topic; the broker's services use the store directly and never come here."""
    if is_system_topic(topic):
        raise NoPermissionError(
            f"topic {topic!r} is a system topic the broker keeps for itself (pending delayed messages, open "
            f"transactions); a client may not {what} it"
        )
