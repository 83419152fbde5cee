"""The header of PULL_MESSAGE (11, ``PullMessageRequestHeader``) and its sysFlag bits (``PullSysFlag``).

| bit  | name          | meaning                                                                    |
|------|---------------|----------------------------------------------------------------------------|
| 0x1  | COMMIT_OFFSET | ``commitOffset`` is the group's consumed offset of this queue: commit it   |
| 0x2  | SUSPEND       | hold the pull up to ``suspendTimeoutMillis`` while nothing is new          |
| 0x4  | SUBSCRIPTION  | ``subscription`` (with ``expressionType`` TAG or SQL92) filters the pull   |
| 0x8  | CLASS_FILTER  | a filter class (RocketMQ's filter servers, gone in 5.x): not served        |
| 0x10 | LITE_PULL     | sent by lite pull consumers; changes nothing here                          |

A push consumer sends no subscription (SUBSCRIPTION clear): the broker filters with the expression its group's
heartbeat registered for the topic (``subscription_of``), as RocketMQ's broker does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from broker.errors import InvalidArgumentError
from broker.remoting.codes import RequestCode
from broker.remoting.message_outcomes import INT64, int_field, text_field
from broker.server.pull_processor import PullRequestArgs

PULL_MESSAGE = RequestCode.PULL_MESSAGE
FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4
FLAG_CLASS_FILTER = 0x8
FLAG_LITE_PULL = 0x10
EVERYTHING = "*"  # SubscriptionData.SUB_ALL
TAG = "TAG"  # ExpressionType.TAG, what an absent expressionType means

# (group, topic) -> (expression, expression type) the group's heartbeat registered, None when it registered none.
SubscriptionOf = Callable[[str, str], tuple[str, str] | None]


@dataclass(frozen=True)
class PullRequest:
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msgs: int
    sys_flag: int
    commit_offset: int
    suspend_timeout_ms: int
    subscription: str
    expression_type: str
    max_bytes: int = 0

    @property
    def suspend_ms(self) -> int:
        return self.suspend_timeout_ms if self.sys_flag & FLAG_SUSPEND else 0


def parse_pull(ext: Mapping[str, str]) -> PullRequest:
    """InvalidArgumentError for a missing required field, a number that is not one, or a class filter."""
    sys_flag = int_field(ext, "sysFlag")
    if sys_flag & FLAG_CLASS_FILTER:
        raise InvalidArgumentError("class filters (PullSysFlag CLASS_FILTER) are not served; use TAG or SQL92")
    return PullRequest(
        consumer_group=text_field(ext, "consumerGroup"),
        topic=text_field(ext, "topic"),
        queue_id=int_field(ext, "queueId"),
        queue_offset=int_field(ext, "queueOffset", bounds=INT64),
        max_msgs=int_field(ext, "maxMsgNums"),
        sys_flag=sys_flag,
        commit_offset=int_field(ext, "commitOffset", 0, bounds=INT64),
        suspend_timeout_ms=int_field(ext, "suspendTimeoutMillis", 0, bounds=INT64),
        subscription=ext.get("subscription") or "",
        expression_type=(ext.get("expressionType") or TAG).upper(),
        max_bytes=int_field(ext, "maxMsgBytes", 0),
    )


def pull_args(req: PullRequest, subscription_of: SubscriptionOf | None) -> PullRequestArgs:
    """The broker's pull of this request, not held (the remoting processor holds it without a thread)."""
    if req.sys_flag & FLAG_SUBSCRIPTION:
        expression, kind = req.subscription or EVERYTHING, req.expression_type
    else:
        found = subscription_of(req.consumer_group, req.topic) if subscription_of is not None else None
        expression, kind = found if found is not None else (EVERYTHING, TAG)
    if kind == TAG and expression.strip() == EVERYTHING:
        expression = ""
    commit = req.commit_offset if req.sys_flag & FLAG_COMMIT_OFFSET and req.commit_offset >= 0 else -1
    return PullRequestArgs(
        req.consumer_group, req.topic, req.queue_id, req.queue_offset, max(req.max_msgs, 0), max(req.max_bytes, 0),
        0, expression, commit, kind,
    )
