"""Broker semantics on top of the message store: delay levels, retry and dead letters, transactions, queue locks.

Each service operates on a started ``MessageStore`` through its public API and keeps its own state in the store's
``config/`` directory; every service is thread-safe. The gRPC server wires them in (see each module's docstring).
"""

from broker.semantics.delay import DEFAULT_DELAY_LEVELS, DelayLevels, ScheduleMessageService
from broker.semantics.queue_lock import QueueLockManager
from broker.semantics.retry import RetryService, SendBackResult
from broker.semantics.subscription_group import SubscriptionGroupConfig, SubscriptionGroupManager
from broker.semantics.transaction import (
    EndResult,
    TransactionError,
    TransactionService,
    TransactionSummary,
    TxState,
    TxStatus,
)

__all__ = [
    "DEFAULT_DELAY_LEVELS",
    "DelayLevels",
    "EndResult",
    "QueueLockManager",
    "RetryService",
    "ScheduleMessageService",
    "SendBackResult",
    "SubscriptionGroupConfig",
    "SubscriptionGroupManager",
    "TransactionError",
    "TransactionSummary",
    "TransactionService",
    "TxState",
    "TxStatus",
]
